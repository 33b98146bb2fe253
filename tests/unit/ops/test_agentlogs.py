"""`rlctl logs -f` logic over a fake site file: the last lines, then new lines as they are written, the
agent's last lines after its backend says it ended, partial lines held back, a truncated log reread."""

from __future__ import annotations

from pathlib import Path

from rlctl.config.inventory import Site
from rlctl.launch.backends import write_sites
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.sitefs import FileState, HostFiles, Survey
from rlctl.launch.stage import write_staged
from rlctl.ops.agentlogs import ENDED_CHECK_S, AgentLog, follow, locate, tail


class FakeFiles(HostFiles):
    """One file in memory, as a site would serve it; records how it was read."""

    where = "fake"

    def __init__(self, text: bytes | None) -> None:
        self.data = text
        self.reads: list[tuple[int, int]] = []
        self.closed = False

    def read_from(self, path: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        self.reads.append((offset, limit))
        if self.data is None:
            return None
        return self.data[offset : offset + limit], len(self.data)

    def read_text(self, path: str) -> str | None:
        return None if self.data is None else self.data.decode()

    def make_dirs(self, paths: list[str]) -> list[str]:
        raise NotImplementedError

    def states(self, root: str, names: list[str]) -> dict[str, FileState]:
        raise NotImplementedError

    def survey(self, root: str, dirs: list[str], *, read: str) -> Survey:
        raise NotImplementedError

    def remove(self, root: str, names: list[str]) -> None:
        raise NotImplementedError

    def chmod(self, root: str, modes: dict[str, int]) -> None:
        raise NotImplementedError

    def put(self, local: Path, path: str) -> None:
        raise NotImplementedError

    def get(self, path: str, local: Path) -> None:
        raise NotImplementedError

    def get_range(self, path: str, local: Path, start: int, end: int) -> None:
        raise NotImplementedError

    def list_files(self, root: str) -> list[str]:
        raise NotImplementedError

    def append(self, path: str, text: str) -> None:
        raise NotImplementedError

    def move(self, path: str, to: str) -> bool:
        raise NotImplementedError

    def link(self, target: str, path: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


class Script:
    """The world between two polls: each sleep runs the next step (writes to the file, time passes)."""

    def __init__(self, files: FakeFiles, steps: list[bytes | None]) -> None:
        self.files, self.steps = files, list(steps)
        self.now = 0.0
        self.exited = False
        self.asked = 0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        assert self.now < 1000, "the follower never stopped"
        step = self.steps.pop(0) if self.steps else None
        if step == b"<exit>":
            self.exited = True
        elif step == b"<truncate>":
            self.files.data = b""
        elif step is not None:
            assert self.files.data is not None
            self.files.data += step

    def ended(self) -> bool:
        self.asked += 1
        return self.exited


def _follow(files: FakeFiles, steps: list[bytes | None], lines: int = 2) -> tuple[list[str], Script, bool]:
    out: list[str] = []
    world = Script(files, steps)
    found = follow(
        AgentLog("rollout-0", files, "/site/logs/rollout-0.log", None),
        lines,
        ended=world.ended,
        write=out.append,
        sleep=world.sleep,
        clock=lambda: world.now,
    )
    return "".join(out).splitlines(), world, found


def test_last_lines_then_new_lines_then_the_lines_written_before_the_exit():
    files = FakeFiles(b"a\nb\nc\n")
    steps: list[bytes | None] = [b"d\n", None, b"e\nf", b"\n", b"<exit>"]
    shown, world, found = _follow(files, steps)
    assert found and shown == ["b", "c", "d", "e", "f"]
    assert world.exited and not world.steps


def test_the_last_words_of_an_agent_are_read_after_its_backend_says_it_ended():
    """It writes its last line and exits between two polls: the follower still prints that line."""
    files = FakeFiles(b"start\n")
    world_steps: list[bytes | None] = [None] * 3
    out: list[str] = []
    world = Script(files, world_steps)

    def ended() -> bool:  # the agent wrote "bye" and exited just before the backend was asked
        assert files.data is not None
        files.data += b"bye\n"
        world.exited = True
        return True

    follow(
        AgentLog("rollout-0", files, "/x", None),
        5,
        ended=ended,
        write=out.append,
        sleep=world.sleep,
        clock=lambda: world.now,
    )
    assert "".join(out).splitlines() == ["start", "bye"]


def test_the_backend_is_asked_at_most_every_ENDED_CHECK_S():
    files = FakeFiles(b"x\n")
    steps: list[bytes | None] = [None] * 40 + [b"<exit>"]
    _, world, _ = _follow(files, steps)
    # 40 idle polls of 0.5 s = 20 s: about one question per ENDED_CHECK_S, not one per poll
    assert world.asked <= 20 / ENDED_CHECK_S + 2
    assert world.asked >= 20 / ENDED_CHECK_S - 1


def test_an_unfinished_last_line_waits_for_its_end_and_is_flushed_at_exit():
    files = FakeFiles(b"one\ntw")
    shown, _, _ = _follow(files, [b"o\nthr", b"<exit>"], lines=5)
    assert shown == ["one", "two", "thr"]


def test_a_truncated_log_is_read_again_from_its_start():
    files = FakeFiles(b"old-1\nold-2\n")
    shown, _, _ = _follow(files, [b"<truncate>", b"new-1\n", b"<exit>"], lines=1)
    assert shown == ["old-2", "new-1"]


def test_last_lines_of_a_long_log_read_only_a_window_from_its_end():
    body = b"".join(b"line %06d\n" % i for i in range(50_000))  # 600 kB
    files = FakeFiles(body)
    shown, _, _ = _follow(files, [b"<exit>"], lines=3)
    assert shown == ["line 049997", "line 049998", "line 049999"]
    first_window = files.reads[1]
    assert first_window[0] > 0 and first_window[1] < len(body) // 4  # not the whole file over the link


def test_no_file_is_no_log():
    shown, world, found = _follow(FakeFiles(None), [])
    assert (shown, found, world.asked) == ([], False, 0)


def test_locate_reads_here_when_the_file_is_here_else_on_the_agents_site(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "trainer-0.log").write_text("t1\nt2\n")
    assert tail(tmp_path, {}, "trainer-0", 1) == ["t2"]
    remote = AgentSpec("rollout", 0, "gen", [], log_path=Path("/site/jobs/run/logs/rollout-0.log"))
    handles = {"rollout-0": AgentHandle(remote, {"host": "h"}, "ssh")}
    write_sites(tmp_path, {})
    assert locate(tmp_path, handles, "rollout-0") is None  # the site is not in this job's sites.json
    assert locate(tmp_path, {}, "rollout-1") is None


def test_every_agents_log_is_read_one_connection_per_host_hosts_at_once(tmp_path, monkeypatch):
    """`rlctl logs JOB` read each agent's log over its own SSH connection, one after another: 64 units on SSH hosts
    took 64 connections in turn. Two hosts with two units each: two views, read at once (each host's first read
    waits at a barrier for the other's, which a read one host after the other never reaches), output in order."""
    import threading

    from rlctl.config.inventory import Site
    from rlctl.ops import agentlogs

    site = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "nodes": [{"host": "h[1-2]", "gpus": 8}]}
    )
    write_sites(tmp_path, {"gen": site})
    handles = {
        f"rollout-{i}": AgentHandle(
            AgentSpec("rollout", i, "gen", [], log_path=Path(f"/site/logs/rollout-{i}.log")), {"host": host}, "ssh"
        )
        for i, host in enumerate(["h1", "h2", "h1", "h2"])
    }
    both = threading.Barrier(2, timeout=10)
    opened: list[FakeFiles] = []

    class HostLogs(FakeFiles):
        def __init__(self, host: str) -> None:
            super().__init__(None)
            self.host, self.first = host, True

        def tail(self, path: str, lines: int) -> list[str] | None:
            if self.first:
                self.first = False
                both.wait()
            return [f"{Path(path).stem} on {self.host}"]

    def host_files(site: Site, host: str) -> HostFiles:
        opened.append(HostLogs(host))
        return opened[-1]

    monkeypatch.setattr(agentlogs, "host_files", host_files)
    names = sorted(handles)
    got = agentlogs.tail_all(tmp_path, handles, [*names, "trainer-0"], 5)
    assert got == [[f"rollout-{i} on h{i % 2 + 1}"] for i in range(4)] + [["(no log)"]]
    assert sorted(f.host for f in opened) == ["h1", "h2"] and all(f.closed for f in opened)


def test_a_moved_job_dir_of_a_local_site_reads_its_agents_logs_where_they_are_now(tmp_path):
    # agents.jsonl names each log under the dir the job was launched in: after `mv runs/x archive/x`, `rlctl logs x
    # trainer` said "trainer-0 has no log at runs/x/logs/trainer-0.log (removed?)"
    now = tmp_path / "archive" / "x"
    (now / "logs").mkdir(parents=True)
    (now / "logs" / "trainer-0.log").write_text("t1\nt2\n")
    site = Site.model_validate(
        {"datacenter": "d", "gpu": "CPU", "scheduler": {"kind": "local"}, "nodes": [{"host": "localhost", "gpus": 2}]}
    )
    write_sites(now, {"local": site})
    write_staged(now, {"local": {"roots": {"localhost": str(tmp_path / "runs" / "x")}}})
    spec = AgentSpec("trainer", 0, "local", [], log_path=tmp_path / "runs" / "x" / "logs" / "trainer-0.log")
    assert tail(now, {"trainer-0": AgentHandle(spec, {"pid": 1}, "local")}, "trainer-0", 1) == ["t2"]


def test_a_copied_job_dir_of_a_local_site_reads_its_own_logs_not_its_originals(tmp_path):
    # `cp -r runs/x backup/x`, the original kept (resumed, its logs growing): `rlctl logs backup/x trainer` read the
    # original's log, which agents.jsonl names and which is still there
    site = Site.model_validate(
        {"datacenter": "d", "gpu": "CPU", "scheduler": {"kind": "local"}, "nodes": [{"host": "localhost", "gpus": 2}]}
    )
    original, copy = tmp_path / "runs" / "x", tmp_path / "backup" / "x"
    for d, text in ((original, "original 1\noriginal 2\n"), (copy, "copy 1\ncopy 2\n")):
        (d / "logs").mkdir(parents=True)
        (d / "logs" / "trainer-0.log").write_text(text)
        write_sites(d, {"local": site})
        write_staged(d, {"local": {"roots": {"localhost": str(original)}}})
    spec = AgentSpec("trainer", 0, "local", [], log_path=original / "logs" / "trainer-0.log")
    handles = {"trainer-0": AgentHandle(spec, {"pid": 1}, "local")}
    assert tail(copy, handles, "trainer-0", 1) == ["copy 2"]
    assert tail(original, handles, "trainer-0", 1) == ["original 2"]
    found = locate(copy, handles, "trainer-0")
    assert found is not None and found.path == str(copy / "logs" / "trainer-0.log")


def test_a_copied_job_dir_without_an_agents_log_has_none_not_its_originals(tmp_path):
    # `cp -r runs/x backup/x`, then the copy's logs/ cleaned (or that one log removed), the original resumed: `rlctl
    # logs backup/x trainer/0` (and `rlctl logs backup/x`) printed the original's log, growing, under the copy's name
    from rlctl.ops import agentlogs

    site = Site.model_validate(
        {"datacenter": "d", "gpu": "CPU", "scheduler": {"kind": "local"}, "nodes": [{"host": "localhost", "gpus": 2}]}
    )
    original, copy = tmp_path / "runs" / "x", tmp_path / "backup" / "x"
    (original / "logs").mkdir(parents=True)
    (original / "logs" / "trainer-0.log").write_text("original 1\noriginal 2\n")
    copy.mkdir(parents=True)
    for d in (original, copy):
        write_sites(d, {"local": site})
        write_staged(d, {"local": {"roots": {"localhost": str(original)}}})
    spec = AgentSpec("trainer", 0, "local", [], log_path=original / "logs" / "trainer-0.log")
    handles = {"trainer-0": AgentHandle(spec, {"pid": 1}, "local")}
    assert tail(copy, handles, "trainer-0", 1) is None
    assert agentlogs.tail_all(copy, handles, ["trainer-0"], 1) == [["(no log)"]]
    assert agentlogs.looked_for_at(copy, handles["trainer-0"]) == copy / "logs" / "trainer-0.log"  # the CLI's line
    assert tail(original, handles, "trainer-0", 1) == ["original 2"]


def test_the_every_agent_view_of_no_lines_shows_none_and_an_empty_log_says_so(tmp_path):
    # `rlctl logs JOB -n 0` said "(no log)" under every agent's name, of logs that are there (an empty list read as
    # none), and so did an agent's log still empty
    from rlctl.ops import agentlogs

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "trainer-0.log").write_text("t1\nt2\n")
    (tmp_path / "logs" / "rollout-0.log").write_text("")
    names = ["trainer-0", "rollout-0", "rollout-1"]
    assert agentlogs.tail_all(tmp_path, {}, names, 0) == [[], [], ["(no log)"]]
    assert agentlogs.tail_all(tmp_path, {}, names, 1) == [["t2"], ["(empty)"], ["(no log)"]]


def test_the_logs_of_every_agent_and_the_known_ones_are_in_replica_order(tmp_path, monkeypatch):
    # a job scaled past 10 units: `==> rollout-10 <==` and `rollout-11` came between rollout-1 and rollout-2, as text
    from rlctl.launch.jobdir import JobDir
    from tests.conftest import run_cli
    from tests.unit.job_rows import indexed_row

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("many", explicit=tmp_path / "many-1")
    indexed_row("many-1", jd.path, job="many")
    names = ["controller-0", "launcher", "rollout-0", "rollout-1", "rollout-2", "rollout-10", "rollout-11", "trainer-0"]
    for name in names:
        (jd.path / "logs" / f"{name}.log").write_text(f"{name} ran\n")
    r = run_cli("logs", "many-1", "-n", "0")
    assert r.exit_code == 0 and r.stdout == "".join(f"==> {n} <==\n" for n in names), r.stdout
    r = run_cli("logs", "many-1", "rollout/3")
    assert r.exit_code == 2 and r.stderr.rstrip().endswith(f"no log for rollout-3; known: {', '.join(names)}"), r.stderr


def test_the_logs_of_a_detached_launch_leave_out_its_hidden_start_log(tmp_path, monkeypatch):
    # `rlctl logs JOB` while a `launch -d` prepared it showed `==> .launcher.start-12367-60407749078471 <==` beside
    # `==> launcher <==`, the same lines twice, and named it among the known logs
    from rlctl.launch.jobdir import JobDir
    from tests.conftest import run_cli
    from tests.unit.job_rows import indexed_row

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("prep", explicit=tmp_path / "prep-1")
    indexed_row("prep-1", jd.path, job="prep")
    (jd.path / "logs" / "launcher.log").write_text("SFT warm-up: 500 steps\n")
    (jd.path / "logs" / ".launcher.start-12-34.log").write_text("SFT warm-up: 500 steps\n")
    r = run_cli("logs", "prep-1")
    assert r.exit_code == 0 and r.stdout == "==> launcher <==\nSFT warm-up: 500 steps\n", r.stdout
    r = run_cli("logs", "prep-1", "rollout/0")
    assert r.exit_code == 2 and r.stderr.rstrip().endswith("no log for rollout-0; known: launcher"), r.stderr
