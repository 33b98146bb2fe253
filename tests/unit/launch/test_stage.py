"""Staging a job dir to a site's work root (the local-filesystem view; the SSH view runs in the
cross-site integration test): what is copied, verified, recorded, and what fails with one line."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import agentrecords, record, sitefs, stage, stagecopy, stagefanout
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.record import fetch_record
from rlctl.launch.remote import CommandResult
from rlctl.launch.sitefs import FileState, LocalFiles, agent_view, site_root
from rlctl.launch.stage import ensure_staged, files_to_stage, stage_all, staging_plan


def local_site(workdir: Path | None = None) -> Site:
    sched: dict[str, object] = {"kind": "local"} | ({"workdir": str(workdir)} if workdir else {})
    return Site.model_validate({"datacenter": "a", "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}],
                                "scheduler": sched})  # fmt: skip


def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "op" / "job-1"
    (d / "model" / "init").mkdir(parents=True)
    for name in ("job.json", "plan.json", "sites.json"):
        (d / name).write_text(json.dumps({"name": name}))
    fd = os.open(d / "secret", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"ab" * 32)
    os.close(fd)
    (d / "model" / "init" / "model.safetensors").write_bytes(os.urandom(4096))
    (d / "model" / "init" / "config.json").write_text("{}")
    (d / "agents.jsonl").write_text("")  # the operator's record: never staged
    return d


def _controller_site(tmp_path: Path) -> tuple[Path, Site, Path]:
    """The operator's job dir, a local site with a workdir of its own, and the job's root there (made)."""
    src = job_dir(tmp_path)
    site = local_site(tmp_path / "w")
    root = Path(site_root(site, "job-1", here=src))
    root.mkdir(parents=True)
    return src, site, root


def test_stages_what_agents_read_verifies_and_records_it(tmp_path: Path) -> None:
    src = job_dir(tmp_path)
    site = local_site(tmp_path / "site-root")
    assert files_to_stage(src) == [
        "job.json", "plan.json", "sites.json", "secret", "model/init/config.json", "model/init/model.safetensors",
    ]  # fmt: skip
    staged = stage_all(src, {"far": site, "here": local_site()}, job_id="job-1")
    root = tmp_path / "site-root" / "jobs" / "job-1"
    assert staged["far"]["roots"] == {"localhost": str(root)} and staged["far"]["copied"] == {"localhost": 6}
    assert staged["here"]["roots"] == {"localhost": str(src)}  # the operator's own job dir: nothing copied
    assert (root / "model" / "init" / "model.safetensors").read_bytes() == (
        src / "model" / "init" / "model.safetensors"
    ).read_bytes()
    assert (root / "secret").stat().st_mode & 0o777 == 0o600 and not (root / "agents.jsonl").exists()
    assert json.loads((src / "staged.json").read_text())["far"]["roots"] == staged["far"]["roots"]
    again = stage_all(src, {"far": site}, job_id="job-1")  # identical files there: verified, not copied
    assert again["far"]["copied"] == {"localhost": 0}
    assert ensure_staged(src, "far", site, job_id="job-1") == {"localhost": str(root)}


def test_a_reward_modules_bytecode_is_not_staged(tmp_path: Path) -> None:
    src = job_dir(tmp_path)
    (src / "reward" / "helpers" / "__pycache__").mkdir(parents=True)
    (src / "reward" / "r.py").write_text("X = 1\n")
    (src / "reward" / "helpers" / "__init__.py").write_text("")
    (src / "reward" / "helpers" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\x00")
    assert [n for n in files_to_stage(src) if n.startswith("reward/")] == ["reward/r.py", "reward/helpers/__init__.py"]


def test_a_copy_that_differs_names_site_file_and_what(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = job_dir(tmp_path)
    real = LocalFiles.states

    def corrupt(self: LocalFiles, root: str, names: list[str], *, stop: threading.Event | None) -> dict[str, FileState]:
        out = real(self, root, names, stop=stop)
        if "job.json" in out and Path(root) != src:
            out["job.json"] = FileState(out["job.json"].size, "0" * 64, out["job.json"].mode)
        return out

    monkeypatch.setattr(LocalFiles, "states", corrupt)
    with pytest.raises(LaunchError, match=r"site far: localhost:.*/jobs/job-1/job.json: SHA-256 000000000000… after"):
        stage.stage_site("far", local_site(tmp_path / "w"), src, job_id="job-1")


def test_plan_and_record_fetch(tmp_path: Path) -> None:
    src = job_dir(tmp_path)
    plan = staging_plan({"far": local_site(tmp_path / "w"), "here": local_site()}, job_id="job-1", here=src)
    assert [(p["site"], p["job_dir"], bool(p["files"])) for p in plan] == [
        ("far", str(tmp_path / "w" / "jobs" / "job-1"), True),
        ("here", str(src), False),
    ]
    site = local_site(tmp_path / "w")
    root = Path(site_root(site, "job-1", here=src))
    root.mkdir(parents=True)
    (root / "summary.json").write_text('{"state": "done"}')
    (root / "events.jsonl").write_text('{"t": 2, "event": "job_end"}\n')
    (src / "events.jsonl").write_text('{"t": 1, "event": "agent_started"}\n')
    (root / "samples.jsonl").write_text('{"sample_id": "p0-0"}\n')
    assert fetch_record(src, site, "localhost", str(root)) == ["summary.json", "events.jsonl", "samples.jsonl"]
    fetch_record(src, site, "localhost", str(root))  # twice: each event once, each sample once
    assert [json.loads(line)["event"] for line in (src / "events.jsonl").read_text().splitlines()] == [
        "agent_started", "job_end",
    ]  # fmt: skip
    assert (src / "samples.jsonl").read_text() == '{"sample_id": "p0-0"}\n'
    assert fetch_record(src, local_site(), "localhost", str(src)) == []  # the record is already here


class RangeFiles(LocalFiles):
    """The local view, recording the byte ranges copied."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def get_range(self, path: str, local: Path, start: int, end: int) -> None:
        self.ranges.append((start, end))
        super().get_range(path, local, start, end)


def test_the_sample_log_is_fetched_by_what_it_grew_whole_lines_only_and_from_the_lines_kept_after_a_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record, "TAIL_MATCH_BYTES", 16)  # a small window, so the prefix check compares a line's end
    there, here = tmp_path / "site.jsonl", tmp_path / "here.jsonl"
    fs = RangeFiles()
    lines = [json.dumps({"sample_id": f"s{i}", "reward": i / 10}) + "\n" for i in range(8)]
    assert not record.fetch_appended(fs, str(there), here) and not here.exists()  # nothing there yet
    there.write_text("".join(lines[:3]) + lines[3][:7])  # the controller is writing its fourth line
    assert record.fetch_appended(fs, str(there), here)
    assert here.read_text() == "".join(lines[:3])  # whole lines only
    with there.open("a") as f:
        f.write(lines[3][7:] + lines[4])
    assert record.fetch_appended(fs, str(there), here) and here.read_text() == "".join(lines[:5])
    n3 = len("".join(lines[:3]))
    assert fs.ranges == [(0, n3 + 7), (n3, there.stat().st_size)]  # the second fetch copied what it lacked
    assert not record.fetch_appended(fs, str(there), here) and len(fs.ranges) == 2  # nothing new: nothing copied
    # a resume cut the log back to two lines and the run wrote others past them: the copy here is no prefix, but
    # begins with those two lines: cut to them, and only what follows them copied
    there.write_text("".join(lines[:2]) + lines[6] + lines[7] + lines[5])
    assert record.fetch_appended(fs, str(there), here) and here.read_text() == there.read_text()
    assert fs.ranges[-1] == (len("".join(lines[:2])), there.stat().st_size)
    there.write_text(lines[7] + lines[6])  # a log that begins with none of the lines here: copied whole
    assert record.fetch_appended(fs, str(there), here) and here.read_text() == there.read_text()
    assert fs.ranges[-1] == (0, there.stat().st_size)
    there.write_text(lines[0])  # cut shorter than the copy here
    assert record.fetch_appended(fs, str(there), here) and here.read_text() == lines[0]
    assert not list(tmp_path.glob("*.part"))


def test_an_ssh_site_is_staged_per_host_unless_its_hosts_share_the_work_root(tmp_path: Path) -> None:
    def ssh_site(**sched: object) -> Site:
        return Site.model_validate({"datacenter": "b", "gpu": "CPU", "nodes": [{"host": "h20-[01-03]", "gpus": 8}],
                                    "scheduler": {"kind": "ssh", **sched}})  # fmt: skip

    src = job_dir(tmp_path)
    apart, shared = ssh_site(), ssh_site(shared_workdir=True)
    [p] = staging_plan({"h20": apart}, job_id="job-1", here=src)
    assert p["hosts"] == ["h20-01", "h20-02", "h20-03"]  # no shared filesystem: each host gets its copy
    [p] = staging_plan({"h20": shared}, job_id="job-1", here=src)
    assert p["hosts"] == ["h20-01"]  # one filesystem inside the site: one copy crosses the inter-DC link
    assert agent_view(apart, "h20-02") == "h20-02" and agent_view(shared, "h20-02") == "h20-01"


class _ShellRunner:
    """An SshRunner (invoke) whose commands run with bash here, the same script the SSH host runs: `stdin` written,
    then held open until `hold_stdin` is set or the command ends; each line of stdout to `on_line` as it comes; each
    command's deadline recorded. Copies as SFTP does: into `.part`, renamed once whole."""

    def __init__(self, target: object = None) -> None:
        self.where = "test-host"
        self.deadlines: list[float | None] = []

    def run(  # type: ignore[no-untyped-def]
        self, script: str, *, timeout_s: float | None, stdin: str | None = None, on_line=None, hold_stdin=None
    ) -> CommandResult:
        import subprocess
        import tempfile

        self.deadlines.append(timeout_s)
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    text=True)  # fmt: skip
            assert proc.stdin is not None and proc.stdout is not None
            lines: list[str] = []

            def read() -> None:
                for line in proc.stdout:  # type: ignore[union-attr]
                    lines.append(line)
                    if on_line is not None:
                        on_line(line.rstrip("\n"))

            reader = threading.Thread(target=read)
            reader.start()
            proc.stdin.write(stdin or "")
            proc.stdin.flush()
            while hold_stdin is not None and proc.poll() is None and not hold_stdin.wait(0.01):
                pass
            proc.stdin.close()
            try:
                proc.wait(timeout_s)
            finally:
                proc.kill()
            reader.join()
            err.seek(0)
            return CommandResult(proc.returncode, "".join(lines), err.read().decode())

    def put(self, local: Path, remote: str, *, progress=None, resume: bool = False) -> int:  # type: ignore[no-untyped-def]
        os.replace(shutil.copy(local, remote + ".part"), remote)
        if progress is not None:
            progress(local.stat().st_size)
        return 0

    def close(self) -> None:
        pass


def _shell_files(site: Site, host: str) -> sitefs.SshFiles:
    """An SSH host's view whose commands run with bash here (`_ShellRunner`)."""
    fs = object.__new__(sitefs.SshFiles)
    fs.runner, fs.where = _ShellRunner(), host  # type: ignore[assignment]
    return fs


def test_remote_checksums_come_in_batches_whose_deadline_follows_their_size(tmp_path: Path, monkeypatch) -> None:
    """The SSH view hashes in batches of about HASH_BATCH_BYTES, each command allowed the time to read its bytes
    at a slow disk's rate, so a checkpoint of tens of GB is never one command under a fixed deadline; the states
    equal the local view's (names with spaces and backslashes included)."""
    monkeypatch.setattr(sitefs, "HASH_BATCH_BYTES", 3 << 20)
    files = {"model/a b.safetensors": 2 << 20, "model/c.safetensors": 2 << 20, "secret": 10, "model/d": 5 << 20,
             "model/e\\f": 3}  # fmt: skip
    for name, size in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(os.urandom(size))
    fs = _shell_files(local_site(), "test-host")
    names = [*files, "missing"]
    got = fs.states(str(tmp_path), names)
    assert got == LocalFiles().states(str(tmp_path), names)  # sizes, modes, SHA-256; the missing file absent
    runner = fs.runner
    assert isinstance(runner, _ShellRunner)
    floor = sitefs.HASH_FLOOR_BYTES_PER_S
    # one stat command, then batches: [a b (2 MiB)], [c (2 MiB) + secret], [d (5 MiB): alone, over the limit]
    assert runner.deadlines == [
        sitefs.COMMAND_TIMEOUT_S,
        sitefs.COMMAND_TIMEOUT_S + (2 << 20) / floor,
        sitefs.COMMAND_TIMEOUT_S + ((2 << 20) + 10) / floor,
        sitefs.COMMAND_TIMEOUT_S + (5 << 20) / floor,
        sitefs.COMMAND_TIMEOUT_S + 3 / floor,
    ]


def test_jobs_with_the_same_model_share_the_work_roots_copy_of_it(tmp_path: Path) -> None:
    """model/init of a site job dir is a link to W/models/<content digest>: a second job with the same model
    copies none of its files, one with another model gets a directory of its own."""
    site = local_site(tmp_path / "w")
    first = job_dir(tmp_path / "a")
    one = stage_all(first, {"far": site}, job_id="job-1")
    cache = Path(one["far"]["model_cache"]["dir"])
    assert cache.parent == tmp_path / "w" / "models" and one["far"]["copied"] == {"localhost": 6}
    init = tmp_path / "w" / "jobs" / "job-1" / "model" / "init"
    assert init.is_symlink() and init.resolve() == cache.resolve()
    assert sorted(p.name for p in cache.iterdir()) == ["config.json", "model.safetensors"]

    second = job_dir(tmp_path / "b")
    for f in ("model.safetensors", "config.json"):  # the same model, another job
        (second / "model" / "init" / f).write_bytes((first / "model" / "init" / f).read_bytes())
    two = stage_all(second, {"far": site}, job_id="job-2")
    assert two["far"]["model_cache"] == one["far"]["model_cache"]
    assert two["far"]["copied"] == {"localhost": 4}  # job.json, plan.json, sites.json, secret: not the model

    third = job_dir(tmp_path / "c")  # another model (random weights): another directory
    three = stage_all(third, {"far": site}, job_id="job-3")
    assert three["far"]["model_cache"]["dir"] != str(cache) and three["far"]["copied"] == {"localhost": 6}
    assert (cache / "model.safetensors").read_bytes() == (first / "model" / "init" / "model.safetensors").read_bytes()


def test_a_site_job_dir_staged_before_the_cache_keeps_its_own_model_directory(tmp_path: Path) -> None:
    site = local_site(tmp_path / "w")
    src = job_dir(tmp_path)
    own = tmp_path / "w" / "jobs" / "job-1" / "model" / "init"
    own.mkdir(parents=True)
    staged = stage_all(src, {"far": site}, job_id="job-1")
    assert not own.is_symlink() and (own / "model.safetensors").is_file()
    assert staged["far"]["copied"] == {"localhost": 6}


def test_the_ssh_view_links_replaces_a_link_and_leaves_a_real_directory(tmp_path: Path) -> None:
    fs = object.__new__(sitefs.SshFiles)
    fs.runner, fs.where = _ShellRunner(), "test-host"  # type: ignore[assignment]
    a, b, real = tmp_path / "a", tmp_path / "b", tmp_path / "real"
    for d in (a, b, real):
        d.mkdir()
    link = tmp_path / "job" / "init"
    link.parent.mkdir()
    assert fs.link(str(a), str(link)) and link.resolve() == a
    assert fs.link(str(b), str(link)) and link.resolve() == b  # replaced, not a link inside the old target
    assert not (a / "b").exists() and not (a / "init").exists()
    assert not fs.link(str(a), str(real)) and not real.is_symlink()


def test_staging_progress_says_bytes_rate_and_time_left_at_most_every_interval() -> None:
    now = [0.0]
    said: list[str] = []
    p = stagecopy.StagingProgress("gen", said.append, interval_s=10.0, clock=lambda: now[0])
    p.add(3 * 10**9)
    now[0] = 5.0
    p.advance(5 * 10**8)  # within the interval: nothing said
    now[0] = 10.0
    p.advance(5 * 10**8)
    assert said == ["staging gen: 1.00 GB of 3.00 GB (33 %), 100 MB/s, ≈ 20 s left"]
    now[0] = 95.0
    p.advance(2 * 10**9)
    p.done()
    assert said[1:] == [
        "staging gen: 3.00 GB of 3.00 GB (100 %), 32 MB/s, ≈ 0 s left",
        "staging gen: 3.00 GB copied in 1 min 35 s (32 MB/s)",
    ]


def test_staging_progress_draws_a_bar_on_the_terminal_at_most_four_times_a_second() -> None:
    now = [0.0]
    shown: list[str] = []
    p = stagecopy.StagingProgress("gen", lambda _: None, show=shown.append, clock=lambda: now[0])
    p.add(3 * 10**9)
    now[0] = 0.1
    p.advance(10**8)  # too soon after the start
    now[0] = 10.0
    p.advance(9 * 10**8)
    now[0] = 10.2
    p.advance(10**8)  # too soon after the last
    assert shown == ["staging gen [██████████····················] 1.00 GB / 3.00 GB  100 MB/s  ≈ 20 s left"]


def test_stage_all_reports_the_copy_and_says_nothing_when_nothing_is_copied(tmp_path: Path) -> None:
    src = job_dir(tmp_path)
    said: list[str] = []
    shown: list[str] = []
    stage_all(src, {"far": local_site(tmp_path / "w")}, job_id="job-1", say=said.append, show=shown.append)
    assert len(said) == 1 and said[0].startswith("staging far: ") and " copied in " in said[0]
    assert shown[-1] == ""  # the live line cleared once the site is staged
    said.clear()
    stage_all(src, {"far": local_site(tmp_path / "w")}, job_id="job-1", say=said.append)
    assert said == []


def test_the_starting_model_is_recorded_at_the_first_launch_and_a_changed_one_refused_later(tmp_path: Path) -> None:
    src = job_dir(tmp_path)
    site = {"far": local_site(tmp_path / "w")}
    stage_all(src, site, job_id="job-1")
    record = json.loads((src / stage.INIT_RECORD).read_text())
    assert sorted(record) == ["model/init/config.json", "model/init/model.safetensors"]
    stage_all(src, site, job_id="job-1")  # a resume with the same model: fine
    (src / "model" / "init" / "config.json").write_text('{"hidden_size": 8}')  # rewritten in place
    with pytest.raises(LaunchError, match=r"model/init/config.json: the job's starting model changed since its "
                       r"first launch \(other bytes\): restore the checkpoint"):  # fmt: skip
        stage_all(src, site, job_id="job-1")


def test_the_users_checkpoint_is_hard_linked_where_it_can_be_and_copied_where_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlctl.ops.inputs import reference

    src = tmp_path / "ckpt" / "model.safetensors"
    src.parent.mkdir()
    src.write_bytes(os.urandom(1024))
    assert reference(src, tmp_path / "a") == "linked" and (tmp_path / "a").stat().st_ino == src.stat().st_ino

    def cross_device(a: object, b: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    assert reference(src, tmp_path / "b") == "copied"
    assert (tmp_path / "b").stat().st_ino != src.stat().st_ino and (tmp_path / "b").read_bytes() == src.read_bytes()


def test_a_rerun_whose_relay_holds_everything_still_fans_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # h20-02 (h20-04's parent in the tree) was staged by the run before: `fan` has no entry for it (a KeyError)
    site = Site.model_validate(
        {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "nodes": [{"host": "h20-[01-04]", "gpus": 8}]}
    )
    weights = "model/init/model.safetensors"
    want = {weights: FileState(stagefanout.FANOUT_MIN_BYTES, "ab" * 32, 0o644)}
    todo = {"h20-01": [], "h20-02": [], "h20-03": [weights], "h20-04": [weights]}
    views = [stagecopy.View(h, None, "/w/jobs/j", {} if t else dict(want), t) for h, t in todo.items()]  # type: ignore[arg-type]
    fan = stagefanout.fanned(views, want)
    assert set(fan) == {"h20-03", "h20-04"}
    cleared: list[tuple[str, list[str]]] = []
    copied: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(stagefanout, "_clear_stale", lambda site, v, names: cleared.append((v.host, names)))
    monkeypatch.setattr(
        stagefanout, "copy_files", lambda name, src, v, names, want, progress: copied.append((v.host, names))
    )

    class NoServer:
        def __init__(self, site: Site, seed: stagecopy.View) -> None:
            pass

        def start(self) -> None:
            raise LaunchError("no rlctl in the site's python")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(stagefanout, "_Server", NoServer)
    stagefanout.fan_out("h20", site, Path("/tmp"), views, fan, want, None)
    assert ("h20-02", []) in cleared  # the relay clears nothing
    assert sorted(c for c in copied if c[1]) == [("h20-03", [weights]), ("h20-04", [weights])]  # straight from here


def test_a_tail_reads_from_the_end_of_a_log_and_widens_for_long_lines(tmp_path: Path, monkeypatch) -> None:
    # an agent's last lines were read by reading its whole log (gigabytes after weeks), over SSH too
    log = tmp_path / "agent.log"
    lines = [f"line {i} " + "x" * (i % 7) * 10_000 for i in range(400)]  # some lines longer than the first read
    log.write_text("\n".join(lines) + "\n")
    fs = LocalFiles()
    read: list[tuple[int, int]] = []
    real = fs.read_from
    monkeypatch.setattr(fs, "read_from", lambda p, o, n: read.append((o, n)) or real(p, o, n))
    assert fs.tail(str(log), 15) == lines[-15:] and fs.tail(str(log), 0) == []
    assert sum(n for _, n in read) < log.stat().st_size / 4  # not the whole file
    assert fs.tail(str(tmp_path / "none.log"), 5) is None
    short = tmp_path / "short.log"
    short.write_text("a\nb\n")
    assert fs.tail(str(short), 5) == ["a", "b"]


def test_an_event_appended_while_the_site_events_are_merged_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rlctl status -w` merged the controller site's events into the operator's events.jsonl (read, merge, rename
    # over it); `rlctl stop`'s stop_requested appended in between went with the file replaced (8 of 40 in a loop)
    src, site, root = _controller_site(tmp_path)
    (root / "events.jsonl").write_text('{"t": 1, "event": "job_start"}\n')
    jd = JobDir(src)
    jd.event("staged")
    merge, flock = record._merge_lines, fcntl.flock
    reached = threading.Event()  # the append is done, or waits for the lock

    def append() -> None:
        jd.event("stop_requested")
        reached.set()

    appender = threading.Thread(target=append)

    def locking(fd: int, how: int) -> None:
        if threading.current_thread() is appender:
            reached.set()
        flock(fd, how)

    def merge_then_an_append(local: Path, remote: str) -> Iterator[str]:
        text = "".join(merge(local, remote))  # what the merge read: the append comes after it
        appender.start()
        reached.wait()
        yield text

    monkeypatch.setattr(fcntl, "flock", locking)
    monkeypatch.setattr(record, "_merge_lines", merge_then_an_append)
    assert "events.jsonl" in fetch_record(src, site, "localhost", str(root))
    appender.join()
    assert [e["event"] for e in jd.read_lines(jd.events)] == ["job_start", "staged", "stop_requested"]


def test_events_are_appended_unlocked_where_the_filesystem_has_no_flock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_flock(fd: int, how: int) -> None:  # Lustre mounted without flock
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    jd = JobDir(tmp_path)
    jd.event("agent_joined")
    assert [e["event"] for e in jd.read_lines(jd.events)] == ["agent_joined"]


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("plan.json", '{"trainer": {"si', r"plan.json: not valid JSON"),
        ("plan.json", "[1, 2]", r"plan.json: \(top level\): a JSON list, where the plan is an object"),
        ("plan.json", '{"controller_site": 3}', r"plan.json: controller_site: 3 is not a site name"),
        ("staged.json", '{"local": {"roo', r"staged.json: not valid JSON"),
        ("staged.json", '["local"]', r"staged.json: not an object of staged sites"),
        ("staged.json", '{"local": {"roots": []}}', r"staged.json: 'local': not a \{\"roots\""),
    ],
)
def test_a_damaged_plan_or_staged_record_is_one_error_naming_the_file(
    tmp_path: Path, name: str, text: str, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    # each was a JSONDecodeError / TypeError / KeyError traceback in status, stop, logs, pull and report
    d = job_dir(tmp_path)
    write_sites(d, {"local": local_site()})
    (d / "plan.json").write_text('{"controller_site": "local"}')
    stage.write_staged(d, {"local": {"roots": {"localhost": str(d)}, "files": []}})
    (d / name).write_text(text)
    with pytest.raises(LaunchError, match=says):
        record.record_view(d)
    assert agentrecords.all_recorded_agents(d) == []  # the agents recorded here: with a warning
    assert "agent record is unreachable" in caplog.text and name in caplog.text


def test_events_merge_past_a_line_that_is_not_a_json_event(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # an append cut short (a full disk: the next event on the same line), or a list: `rlctl status` failed with a
    # JSONDecodeError / AttributeError traceback at each merge of the controller site's events
    src, site, root = _controller_site(tmp_path)
    cut = '{"t": 2.5{"t": 3, "event": "agent_started"}'
    (src / "events.jsonl").write_text(f'{{"t": 1, "event": "launch"}}\n{cut}\n[1, 2]\n{{"t": 5, "event": "scale"}}\n')
    (root / "events.jsonl").write_text('{"t": 4, "event": "iteration"}\n{"t": 6, "event": "job_end"}\n')
    assert "events.jsonl" in fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == [
        '{"t": 1, "event": "launch"}', '{"t": 4, "event": "iteration"}', '{"t": 5, "event": "scale"}',
        '{"t": 6, "event": "job_end"}',
    ]  # fmt: skip
    assert JobDir(src).read_lines(src / "events.jsonl")[-1]["event"] == "job_end"  # it reads again
    assert (src / "events.jsonl.damaged").read_text() == f"{cut}\n[1, 2]\n"
    assert (
        f"{src / 'events.jsonl'}: line 2 is not a JSON event: left out of the merged events (and 1 more)" in caplog.text
    )


def test_a_damaged_line_of_the_sites_events_is_kept_and_said_once_however_often_they_merge(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the site's copy keeps its damaged line and each merge (a fetch after the site's events grew: a status, a stop,
    # a report) read it anew: it was appended to events.jsonl.damaged and warned of at every one of them
    src, site, root = _controller_site(tmp_path)
    cut = '{"t": 2, "ev'
    (root / "events.jsonl").write_text(f'{{"t": 1, "event": "launch"}}\n{cut}\n')
    for t in (3, 4, 5):
        with (root / "events.jsonl").open("a") as f:
            f.write(json.dumps({"t": t, "event": "iteration"}) + "\n")
        assert "events.jsonl" in fetch_record(src, site, "localhost", str(root))
    assert [e["t"] for e in JobDir(src).read_lines(src / "events.jsonl")] == [1, 3, 4, 5]
    assert (src / "events.jsonl.damaged").read_text() == f"{cut}\n"
    assert caplog.text.count("is not a JSON event") == 1


def test_a_local_copy_stopped_with_ctrl_c_leaves_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    """A local view copies under a name of its own (pid, thread) and renames it once whole; nothing resumes that
    name, so a copy a Ctrl-C stopped left its bytes (up to a whole shard, in the work root's shared model cache)
    for good, one more file per stopped launch."""
    src = tmp_path / "model.safetensors"
    src.write_bytes(os.urandom(1 << 20))
    dst = tmp_path / "site"
    dst.mkdir()

    def stopped(a: Path, b: Path) -> None:
        Path(b).write_bytes(Path(a).read_bytes()[:1000])  # some bytes landed, then the operator pressed Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(sitefs.shutil, "copyfile", stopped)
    with pytest.raises(KeyboardInterrupt):
        LocalFiles().put(src, str(dst / "model.safetensors"))
    assert list(dst.iterdir()) == []


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as at a terminal: a test run started in the background by a shell without
    job control has SIGINT ignored, and the operator's Ctrl-C these tests send was lost (they failed so)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_launch_stopped_while_it_stages_stops_its_copies(tmp_path: Path, monkeypatch, ctrl_c_raises) -> None:
    """Ctrl-C reaches the launcher's main thread, which waits on the site's copies in a thread pool: the pool waited
    for them to finish (minutes to hours of a model across a slow link) before the launch stopped. The copies now end
    at their next chunk, and what they wrote is there for the next launch to go on from."""
    import time

    chunks, written = 400, []

    class SlowFiles(LocalFiles):
        """A view whose copy reports each of its chunks, one every 20 ms (8 s in all)."""

        def put(self, local: Path, path: str, *, progress=None, resume: bool = False) -> int:  # type: ignore[no-untyped-def]
            if local.name != "model.safetensors":
                return super().put(local, path, progress=progress, resume=resume)
            for _ in range(chunks):
                time.sleep(0.02)
                written.append(1)
                if progress is not None:
                    progress(10)
            return 0

    monkeypatch.setattr(stage, "host_files", lambda site, host: SlowFiles())
    src = job_dir(tmp_path)
    ctrl_c = lambda: signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)  # noqa: E731
    timer = threading.Timer(0.5, ctrl_c)  # the operator's Ctrl-C, to the thread that waits on the copies
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        stage_all(src, {"far": local_site(tmp_path / "w")}, job_id="job-1", say=lambda line: None)
    timer.join()
    assert 0 < len(written) < chunks / 2, len(written)  # stopped, not waited for


def test_a_launch_stopped_while_a_host_hashes_what_it_staged_stops_the_hash_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctrl_c_raises: None
) -> None:
    """Ctrl-C while an SSH host hashes the files just copied (minutes for a model): the launch waited for the hash
    command to end. Now the command's stdin ends, its watcher kills the hash there and the launch stops at once,
    recording nothing as staged; the next launch hashes the files again and finds them whole."""

    bin_dir, marks = tmp_path / "bin", tmp_path / "marks"
    bin_dir.mkdir()
    slow = bin_dir / "sha256sum"  # the host's sha256sum, 10 s slower: it says when it starts, ends, or is killed
    slow.write_text(
        f"#!/bin/sh\necho started >> {marks}\ntrap 'kill $s; echo killed >> {marks}; exit 143' TERM\n"
        f'sleep 10 & s=$!\nwait $s\necho hashed >> {marks}\nexec {shutil.which("sha256sum")} "$@"\n'
    )
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(stage, "host_files", _shell_files)
    src, site = job_dir(tmp_path), local_site(tmp_path / "w")
    done = threading.Event()

    def ctrl_c_once_it_hashes() -> None:  # the operator's Ctrl-C, to the thread that waits on the staging
        while not done.wait(0.01):
            if marks.exists():
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                return

    operator = threading.Thread(target=ctrl_c_once_it_hashes)
    operator.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            stage_all(src, {"far": site}, job_id="job-1", say=lambda line: None)
    finally:
        done.set()
        operator.join()
    assert marks.read_text().split() == ["started", "killed"]  # not "hashed": the launch did not wait for it
    assert not (src / stage.STAGED_FILE).exists()
    slow.unlink()
    staged = stage_all(src, {"far": site}, job_id="job-1")
    assert staged["far"]["copied"] == {"localhost": 0}  # hashed whole there: nothing copied again


def _fanning_site(tmp_path: Path, python: Path) -> tuple[Site, list[stagecopy.View], dict[str, FileState]]:
    """A 3-host SSH site whose `python` (a bash stand-in for `-m rlctl.launch.fanout serve|fetch …`) is made
    executable, its hosts' views, and the one model file the two other hosts fetch from the seed."""
    python.chmod(0o755)
    site = Site.model_validate({"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "H20", "python": str(python),
                                "nodes": [{"host": "h20-[01-03]", "gpus": 8}]})  # fmt: skip
    weights = "model/init/model.safetensors"
    want = {weights: FileState(stagefanout.FANOUT_MIN_BYTES, "ab" * 32, 0o644)}
    views = [stagecopy.View(f"h20-0{i}", None, str(tmp_path / f"h{i}"), {}, [weights]) for i in (1, 2, 3)]  # type: ignore[arg-type]
    return site, views, want


def test_a_launch_stopped_while_hosts_fetch_from_the_seed_stops_the_fetches_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctrl_c_raises: None
) -> None:
    """Ctrl-C while a site's hosts fetch from its seed (the seed's copy done): the launch waited for each fetch's
    next progress line (a resumed file's hash first: minutes for a model's shard), and the fetch went on on its host
    after the launch had stopped. Now each fetch's stdin ends, its watcher kills it there, and the launch stops at
    once; the seed's server is stopped too."""

    marks = tmp_path / "marks"
    python = tmp_path / "python"  # the site's python: `-m rlctl.launch.fanout serve|fetch …`; a fetch of 10 s
    python.write_text(
        f"#!/bin/bash\ncase $3 in\n"
        f'serve) echo \'{{"listening": "tcp://h20-01:1"}}\'; cat >/dev/null; echo served >> {marks} ;;\n'
        f"fetch) cat >/dev/null; echo fetching >> {marks}\n"
        f"  trap 'kill $s; echo killed >> {marks}; exit 143' TERM\n"
        f"  sleep 10 & s=$!; wait $s; echo fetched >> {marks} ;;\nesac\n"
    )
    site, views, want = _fanning_site(tmp_path, python)
    monkeypatch.setattr(stagefanout, "SshRunner", _ShellRunner)
    monkeypatch.setattr(stagefanout, "_clear_stale", lambda site, v, names: None)
    monkeypatch.setattr(stagefanout, "copy_files", lambda name, src, v, names, want, progress: None)  # the seed's: done
    done = threading.Event()

    def ctrl_c_once_both_fetch() -> None:  # the operator's Ctrl-C, to the thread that waits on the fetches
        while not done.wait(0.01):
            if marks.exists() and marks.read_text().split() == ["fetching", "fetching"]:
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                return

    operator = threading.Thread(target=ctrl_c_once_both_fetch)
    operator.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            progress = stagecopy.StagingProgress("h20", lambda line: None)
            stagefanout.fan_out("h20", site, tmp_path, views, stagefanout.fanned(views, want), want, progress)
    finally:
        done.set()
        operator.join()
    # not "fetched": the launch did not wait for the fetches, and they did not go on
    assert sorted(marks.read_text().split()) == ["fetching", "fetching", "killed", "killed", "served"]


def test_a_launch_stopped_during_the_seeds_copy_logs_no_failed_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop while the seed copies the model and the other hosts wait on it: the seed's server was stopped first,
    its fetches ended with "the seed is stopping", and each logged "fetch from … failed" (a warning per host on a
    launch the operator stopped). Now the staging stops first, so each fetch ends as stopped, in silence."""
    marks = tmp_path / "marks"
    python = tmp_path / "python"  # `serve` tells its fetches it stops when its stdin ends, and waits for them
    python.write_text(
        f"#!/bin/bash\ncase $3 in\n"
        f'serve) echo \'{{"listening": "tcp://h20-01:1"}}\'; cat >/dev/null; touch {tmp_path}/seed-stops\n'
        f"  for i in $(seq 500); do [ $(grep -c ended {marks}) -ge 2 ] && break; sleep 0.01; done ;;\n"
        f"fetch) cat >/dev/null; echo fetching >> {marks}\n"
        f"  trap 'echo ended >> {marks}; exit 143' TERM\n"
        f"  while [ ! -e {tmp_path}/seed-stops ]; do sleep 0.01; done\n"
        f'  echo \'{{"error": "the seed is stopping"}}\'; echo ended >> {marks}; exit 1 ;;\nesac\n'
    )
    site, views, want = _fanning_site(tmp_path, python)

    def seed_copy(name: str, src: Path, v: object, names: list[str], want: object, progress: object) -> None:
        if not names:  # the small files: none here
            return
        while not (marks.exists() and marks.read_text().split().count("fetching") == 2):
            threading.Event().wait(0.01)
        raise sitefs.StagingStopped("stopped")  # the seed's copy of the model: the operator stops the launch meanwhile

    monkeypatch.setattr(stagefanout, "SshRunner", _ShellRunner)
    monkeypatch.setattr(stagefanout, "_clear_stale", lambda site, v, names: None)
    monkeypatch.setattr(stagefanout, "copy_files", seed_copy)
    progress = stagecopy.StagingProgress("h20", lambda line: None)
    with caplog.at_level("WARNING", logger=stagefanout.__name__), pytest.raises(sitefs.StagingStopped):
        stagefanout.fan_out("h20", site, tmp_path, views, stagefanout.fanned(views, want), want, progress)
    assert marks.read_text().split().count("ended") == 2
    assert [r.getMessage() for r in caplog.records] == []


def test_a_local_views_checksums_stop_once_the_launch_does(tmp_path: Path) -> None:
    """A site job dir on this machine (a work root on NFS) is hashed here, a MiB at a time: a stopped launch's
    checksum ends at its next MiB, not at the end of a model's shard."""
    (tmp_path / "model.safetensors").write_bytes(os.urandom(3 << 20))
    stop = threading.Event()
    assert "model.safetensors" in LocalFiles().states(str(tmp_path), ["model.safetensors"], stop=stop)
    stop.set()
    with pytest.raises(sitefs.StagingStopped, match=r"model\.safetensors: checksum stopped"):
        LocalFiles().states(str(tmp_path), ["model.safetensors"], stop=stop)


def test_a_cached_model_file_of_the_same_bytes_and_another_mode_is_chmodded_not_copied_again(tmp_path: Path) -> None:
    """Another job with the same model, whose weights are 0600 here: its files were copied again over the work
    root's model directory (and on a multi-host site removed first), which the first job may be reading. Now the
    mode is set in place: nothing copied, the same inode, the wanted mode; the SSH view's chmod does the same."""
    site = local_site(tmp_path / "w")
    first = job_dir(tmp_path / "a")
    one = stage_all(first, {"far": site}, job_id="job-1")
    weights = Path(one["far"]["model_cache"]["dir"]) / "model.safetensors"
    inode = weights.stat().st_ino
    assert weights.stat().st_mode & 0o777 == 0o644
    second = job_dir(tmp_path / "b")
    for f in ("model.safetensors", "config.json"):  # the same model, another job, its weights 0600
        (second / "model" / "init" / f).write_bytes((first / "model" / "init" / f).read_bytes())
    os.chmod(second / "model" / "init" / "model.safetensors", 0o600)
    two = stage_all(second, {"far": site}, job_id="job-2")
    assert two["far"]["copied"] == {"localhost": 4}  # job.json, plan.json, sites.json, secret: not the model
    assert weights.stat().st_ino == inode and weights.stat().st_mode & 0o777 == 0o600

    fs = object.__new__(sitefs.SshFiles)
    fs.runner, fs.where = _ShellRunner(), "test-host"  # type: ignore[assignment]
    fs.chmod(str(weights.parent), {"model.safetensors": 0o640, "config.json": 0o604})
    assert weights.stat().st_mode & 0o777 == 0o640 and (weights.parent / "config.json").stat().st_mode & 0o777 == 0o604


class _ElsewhereFiles(LocalFiles):
    """A host of its own storage: the site's work root `root` is `there` on it."""

    def __init__(self, root: Path, there: Path) -> None:
        self.root, self.there = str(root), str(there)

    def make_dirs(self, paths: list[str]) -> list[str]:
        return super().make_dirs([p.replace(self.root, self.there, 1) for p in paths])


def test_hosts_that_share_a_work_root_the_inventory_does_not_declare_are_staged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """h1 and h3 share a filesystem (an NFS home), h2 has its own; the inventory does not say `shared_workdir`.
    Each host copied (or fetched) into the same files, their `.part`s too, and the staging failed. Now h3 sees
    h1's mark: h1 stages, h3 uses its copy, h2 gets its own, one warning says so, no mark is left."""
    work = tmp_path / "w"
    site = Site.model_validate({"datacenter": "b", "gpu": "CPU", "nodes": [{"host": "h[1-3]", "gpus": 1}],
                                "scheduler": {"kind": "ssh", "workdir": str(work)}})  # fmt: skip
    views = {"h1": LocalFiles(), "h2": _ElsewhereFiles(work, tmp_path / "h2"), "h3": LocalFiles()}
    monkeypatch.setattr(stage, "host_files", lambda site, host: views[host])
    src = job_dir(tmp_path)
    with caplog.at_level("WARNING", logger="rlctl.launch.stage"):
        entry = stage.stage_site("b", site, src, job_id="job-1")
    assert entry["copied"] == {"h1": 6, "h2": 6, "h3": 0} and entry["shared_with"] == {"h3": "h1"}
    assert entry["roots"] == {"h1": str(work / "jobs" / "job-1"), "h2": str(tmp_path / "h2" / "jobs" / "job-1"),
                              "h3": str(work / "jobs" / "job-1")}  # fmt: skip
    [warning] = [r.getMessage() for r in caplog.records]
    assert "site b: hosts share a work root (h3 sees h1's)" in warning and "shared_workdir: true" in warning
    for root in (work, tmp_path / "h2"):
        assert not [p for p in (root / "jobs" / "job-1").iterdir() if p.name.startswith(".rlctl-stage-")]
        assert (root / "jobs" / "job-1" / "model" / "init" / "model.safetensors").read_bytes() == (
            src / "model" / "init" / "model.safetensors"
        ).read_bytes()


def test_a_host_that_shares_the_work_root_under_another_path_reads_the_model_through_its_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1 and h2 share the work root (an NFS share), undeclared; h2 mounts it at another path. h1 alone stages it,
    so model/init is h1's link for both: it named W/models/<digest> by h1's path, which h2 does not have (its
    rollout units failed: model/init/config.json: No such file or directory). The share as h2 sees it is the
    same tree under another path: here, the tree moved."""
    work = tmp_path / "w"
    site = Site.model_validate({"datacenter": "b", "gpu": "CPU", "nodes": [{"host": "h[1-2]", "gpus": 1}],
                                "scheduler": {"kind": "ssh", "workdir": str(work)}})  # fmt: skip
    monkeypatch.setattr(stage, "host_files", lambda site, host: LocalFiles())
    src = job_dir(tmp_path)
    entry = stage.stage_site("b", site, src, job_id="job-1")
    assert entry["copied"] == {"h1": 6, "h2": 0} and entry["shared_with"] == {"h2": "h1"}
    elsewhere = tmp_path / "mnt" / "w"
    elsewhere.parent.mkdir()
    work.rename(elsewhere)
    init = elsewhere / "jobs" / "job-1" / "model" / "init"
    for f in ("config.json", "model.safetensors"):
        assert (init / f).read_bytes() == (src / "model" / "init" / f).read_bytes()


def test_an_event_for_the_controller_goes_to_its_record_on_its_site_and_merges_back_once(tmp_path: Path) -> None:
    """A stop's event (`rlctl stop`'s stop_requested, the launcher's launcher_stop) was written only here: a controller
    on another site read its own events, took the stop's SIGTERM for a failure (`failed: controller got SIGTERM`),
    and every fetch of its summary brought that back over the launcher's `stopped`."""
    from rlctl.launch.jobdir import JobDir
    from rlctl.launch.record import event_to_record

    src, site, root = _controller_site(tmp_path)
    (root / "events.jsonl").write_text('{"t": 1, "event": "agent_started"}\n')
    row = JobDir(src).event("stop_requested")
    event_to_record(src, row, (site, "localhost", str(root)))
    there = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    assert there[-1] == row
    fetch_record(src, site, "localhost", str(root))
    here = [json.loads(line)["event"] for line in (src / "events.jsonl").read_text().splitlines()]
    assert here == ["agent_started", "stop_requested"]  # once, though on both sides
    event_to_record(src, row, (site, "localhost", str(src)))  # the record is here: nothing more
    assert len((src / "events.jsonl").read_text().splitlines()) == 2


def test_a_fetch_again_keeps_what_the_launcher_wrote_into_the_same_runs_summary(tmp_path: Path) -> None:
    """A controller on another site: the launcher's held-out figures and agent exits in summary.json were replaced by
    the controller's copy at the next fetch (every `rlctl status` of the ended job), so `rlctl report` lost them."""
    src = job_dir(tmp_path)
    site = local_site(tmp_path / "w")
    root = Path(site_root(site, "job-1", here=src))
    root.mkdir(parents=True)
    (root / "summary.json").write_text('{"run": "r1", "state": "done", "iterations": 4}')
    fetch_record(src, site, "localhost", str(root))  # the launcher's, once its run ended
    record = json.loads((src / "summary.json").read_text())
    record |= {"heldout": {"prompts": 512}, "agent_exits": {"trainer-0": 0}}
    (src / "summary.json").write_text(json.dumps(record))
    fetch_record(src, site, "localhost", str(root))  # `rlctl status`
    assert json.loads((src / "summary.json").read_text()) == record
    (root / "summary.json").write_text('{"run": "r2", "state": "stopped", "iterations": 6}')  # the next run's
    fetch_record(src, site, "localhost", str(root))
    assert json.loads((src / "summary.json").read_text()) == {"run": "r2", "state": "stopped", "iterations": 6}


def test_a_fetch_of_a_damaged_summary_keeps_the_launchers_repair_of_it(tmp_path: Path) -> None:
    """The controller's summary.json on its site does not read (cut short): the launcher wrote its held-out figures
    into its run's end read from the events (`update_summary`, the damaged copy kept aside), and the next fetch (every
    `rlctl status`) put the damaged copy back over that, so the figures were gone again, and the next write of the
    launcher's set a second copy of the same damage aside."""
    from rlctl.ops.runstate import run_summary, update_summary

    src = job_dir(tmp_path)
    site = local_site(tmp_path / "w")
    root = Path(site_root(site, "job-1", here=src))
    root.mkdir(parents=True)
    damaged = '{"run": "r1", "state": "done", "iterat'
    (root / "summary.json").write_text(damaged)
    jd = JobDir(src)
    jd.event("agent_started", agent="controller-0", run="r1")
    jd.event("job_end", state="done", iterations=4)
    fetch_record(src, site, "localhost", str(root))  # the launcher's, once its run ended
    update_summary(jd, "r1", {"heldout": {"prompts": 512}})
    fetch_record(src, site, "localhost", str(root))  # `rlctl status`
    summary = run_summary(jd, "r1")
    assert summary is not None and summary.get("heldout") == {"prompts": 512}, summary
    update_summary(jd, "r1", {"agent_exits": {"trainer-0": 0}})
    assert not (src / "summary.json.damaged.2").exists()
    (root / "summary.json").write_text('{"run": "r1", "state": "done", "iterations": 4}')  # put back whole there
    fetch_record(src, site, "localhost", str(root))
    want = {"run": "r1", "state": "done", "iterations": 4, "heldout": {"prompts": 512}, "agent_exits": {"trainer-0": 0}}
    got = json.loads((src / "summary.json").read_text())
    assert got.pop("summary_damaged").endswith("kept as summary.json.damaged")  # (a launcher's key: said on)
    assert got == want


def test_the_launchers_summary_write_during_a_fetch_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher wrote its held-out figures into summary.json while a `rlctl status` fetched the controller's copy:
    the fetch had read the launcher's copy before that write and put the two merged over it after, so the figures
    were gone. The launcher's read-change-write waits for the fetch's lock (and the fetch for the launcher's)."""
    import threading

    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.runstate import update_summary

    src = job_dir(tmp_path)
    site = local_site(tmp_path / "w")
    root = Path(site_root(site, "job-1", here=src))
    root.mkdir(parents=True)
    (root / "summary.json").write_text('{"run": "r1", "state": "done", "iterations": 4}')
    fetch_record(src, site, "localhost", str(root))  # the launcher's, once its run ended
    launcher = threading.Thread(target=update_summary, args=(JobDir(src), "r1", {"heldout": {"prompts": 512}}))
    replace = record.replace_text

    def between(path: Path, text: str) -> None:  # the fetch read summary.json here and merged: the launcher writes now
        if path.name == "summary.json" and launcher.ident is None:
            launcher.start()
            launcher.join(timeout=2)  # done by now where it does not wait for the fetch's lock
        replace(path, text)

    monkeypatch.setattr(record, "replace_text", between)
    fetch_record(src, site, "localhost", str(root))  # `rlctl status`
    launcher.join()
    want = {"run": "r1", "state": "done", "iterations": 4, "heldout": {"prompts": 512}}
    assert json.loads((src / "summary.json").read_text()) == want


def test_a_copied_job_dir_of_a_local_site_is_its_own_record(tmp_path: Path) -> None:
    # the copy's staged.json names the dir it was launched in: its status fetched that dir's record over the copy's,
    # and its stop wrote the original's events
    d = job_dir(tmp_path)
    write_sites(d, {"local": local_site(), "far": local_site(tmp_path / "w")})
    (d / "plan.json").write_text('{"controller_site": "local"}')
    far = str(tmp_path / "w" / "jobs" / "job-1")
    stage.write_staged(d, {"local": {"roots": {"localhost": str(d)}}, "far": {"roots": {"localhost": far}}})
    copy = tmp_path / "elsewhere" / "job-1"
    shutil.copytree(d, copy)
    assert record.record_view(copy) == (local_site(), "localhost", str(copy))
    assert fetch_record(copy, *record.record_view(copy)) == []
    (copy / "plan.json").write_text('{"controller_site": "far"}')  # a site with a work root keeps its own dir
    assert record.record_view(copy) == (local_site(tmp_path / "w"), "localhost", far)
