"""The pieces of a launcher that outlives its terminal (rlctl.ops.detach), with real processes, pipes and signals:
the log shown until the child says it started (only this launcher's lines), a child that ends first, Ctrl-C,
a SIGHUP that moves the output to the log, and whether a recorded launcher still runs."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlctl.commands.attach import refuse_attach
from rlctl.commands.logs import agent_name
from rlctl.errors import UsageError
from rlctl.ops import detach
from rlctl.ops.jobdb import JobRow

CHILD = """
import json, os, sys, time
fd = int(os.environ["{env}"])
print("staging", flush=True)
print("started agents", flush=True)
{what}
"""


def child(tmp_path: Path, what: str, *, before: str | None = "", name: str = "child") -> detach.Detached:
    """A stand-in launcher (a Python script, not `rlctl`): started as `spawn` starts one, its log `log` (`before`:
    what earlier launchers wrote there; None: left as it is)."""
    log = tmp_path / "logs" / detach.LOG_NAME
    log.parent.mkdir(parents=True, exist_ok=True)
    if before is not None:
        log.write_text(before)
    script = tmp_path / f"{name}.py"
    script.write_text(CHILD.format(env=detach.READY_FD_ENV, what=textwrap.dedent(what)))
    return detach.start([sys.executable, str(script)], log)


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_log_is_shown_until_the_launcher_says_the_job_started_and_its_own_lines_only(tmp_path):
    c = child(
        tmp_path,
        """
        os.write(fd, json.dumps({"id": "j1", "launcher_pid": os.getpid()}).encode() + b"\\n")
        time.sleep(30)
        """,
        before="an earlier launcher's line\n",
    )
    shown: list[bytes] = []
    try:
        info = c.follow(shown.append)
        assert info is not None and info["id"] == "j1" and info["launcher_pid"] == c.proc.pid
        assert b"".join(shown) == b"staging\nstarted agents\n"
        assert c.proc.poll() is None  # it goes on watching: returning ended nothing
    finally:
        c.proc.kill()
        c.proc.wait()


def test_a_launcher_that_ends_before_the_job_runs_gives_its_last_lines_and_exit_code(tmp_path):
    c = child(tmp_path, 'print("rlctl: error: job j1 is running", flush=True); sys.exit(2)')
    shown: list[bytes] = []
    assert c.follow(shown.append) is None
    assert c.proc.returncode == 2
    assert b"".join(shown).endswith(b"rlctl: error: job j1 is running\n")


def test_ctrl_c_while_it_starts_terminates_the_launcher(tmp_path):
    c = child(
        tmp_path,
        """
        import signal
        signal.signal(signal.SIGTERM, lambda *_: (print("stopping what I started", flush=True), sys.exit(143)))
        print("starting", flush=True)
        time.sleep(60)
        """,
    )
    wait_until(lambda: c.start_log.read_text().endswith("starting\n"))
    assert c.cancel(grace_s=30) == 143
    assert c.log.read_text().endswith("stopping what I started\n") and not c.start_log.exists()


def test_two_launchers_of_one_job_each_show_their_own_lines_and_both_reach_its_log(tmp_path):
    # two `launch -d --resume kt` 0.3 s apart: both children appended to launcher.log, and the winner printed the
    # loser's `rlctl: error: job kt-… has a launcher already (pid …)` before its own `running (detached)`
    loser = child(
        tmp_path, 'print("rlctl: error: job kt-1 has a launcher already", flush=True); sys.exit(1)', name="loser"
    )
    winner = child(
        tmp_path,
        """
        from rlctl.ops import detach
        time.sleep(1)  # the loser's lines are written meanwhile
        detach.say_started({"id": "kt-1"})
        print("watching the job", flush=True)
        time.sleep(30)
        """,
        before=None,
        name="winner",
    )
    lost: list[bytes] = []
    won: list[bytes] = []
    try:
        assert loser.follow(lost.append) is None and loser.proc.returncode == 1
        assert winner.follow(won.append) == {"id": "kt-1"}
        assert b"".join(won) == b"staging\nstarted agents\n"
        assert b"".join(lost) == b"staging\nstarted agents\nrlctl: error: job kt-1 has a launcher already\n"
        wait_until(lambda: "watching the job\n" in winner.log.read_text())  # its output goes there from now on
        text = winner.log.read_text()
        assert "rlctl: error: job kt-1 has a launcher already\n" in text and text.count("staging\n") == 2
        assert not list(winner.log.parent.glob(".launcher.start-*"))
    finally:
        winner.proc.kill()
        winner.proc.wait()


def test_a_launcher_whose_waiting_process_died_copies_on_only_what_it_had_not(tmp_path):
    """The `launch -d` process copied part of the start log to launcher.log, then died: the child copied the whole
    start log again as it said it started (its first lines twice in launcher.log). Now each copies on from where
    the other's copy ended, and the child's own output follows, in order."""
    go = tmp_path / "go"
    c = child(
        tmp_path,
        f"""
        from pathlib import Path
        from rlctl.ops import detach
        while not Path({str(go)!r}).exists():
            time.sleep(0.02)
        print("prepared", flush=True)
        detach.say_started({{"id": "j1"}})  # nobody reads the pipe any more
        print("watching the job", flush=True)
        """,
    )
    wait_until(lambda: c.start_log.read_text() == "staging\nstarted agents\n")
    shown: list[bytes] = []
    c._copy(shown.append)  # what the waiting process did before it died
    assert c.log.read_text() == "staging\nstarted agents\n" and b"".join(shown) == c.log.read_bytes()
    os.close(c.ready_fd)  # it died
    go.touch()
    assert c.proc.wait(timeout=30) == 0
    assert c.log.read_text() == "staging\nstarted agents\nprepared\nwatching the job\n"
    assert not list(c.log.parent.glob(".launcher.start-*"))  # its start log, and what was copied of it, removed


def test_say_started_is_nothing_without_a_waiting_process(monkeypatch):
    monkeypatch.delenv(detach.READY_FD_ENV, raising=False)
    detach.say_started({"id": "j1"})  # an attached launcher: no pipe, nothing written, no error


def test_a_sighup_moves_the_output_to_the_log_and_the_process_goes_on(tmp_path):
    log = tmp_path / "launcher.log"
    code = f"""
        import os, signal, sys, time
        from pathlib import Path
        from rlctl.ops import detach
        detach.survive_hangup(Path({str(log)!r}))
        print("before", flush=True)
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.2)
        print("after: hung up", detach.hung_up(), flush=True)
        os.kill(os.getpid(), signal.SIGHUP)  # a second one: ignored
        sys.stderr.write("still here\\n")
        """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "before\n"
    lines = log.read_text().splitlines()
    assert lines[0].endswith("the terminal went away (SIGHUP); this launcher keeps watching the job")
    assert lines[1:] == ["after: hung up True", "still here"]


def test_a_sighup_while_a_live_frame_is_drawn_moves_the_output_once_the_frame_is_whole(tmp_path):
    """The rest of a frame drawn when the SIGHUP came went to the log, its escape codes with it (CI once); and a line
    another thread wrote as the output moved could come before the reason it moved."""
    log = tmp_path / "launcher.log"
    code = f"""
        import os, signal, sys, time
        from pathlib import Path
        from rlctl.ops import detach
        detach.survive_hangup(Path({str(log)!r}))
        with detach.terminal_frame():
            sys.stderr.write("\\x1b[2Kiter 3 ")
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
            sys.stderr.write("reward 0.5\\x1b[1A\\n")
            print("in the frame: hung up", detach.hung_up(), flush=True)
        print("after: hung up", detach.hung_up(), flush=True)
        """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "\x1b[2Kiter 3 reward 0.5\x1b[1A\n"  # the whole frame, to the terminal
    assert p.stdout == "in the frame: hung up False\n"
    lines = log.read_text().splitlines()
    assert lines[0].endswith("the terminal went away (SIGHUP); this launcher keeps watching the job")
    assert lines[1:] == ["after: hung up True"]


def test_whether_a_recorded_launcher_still_runs(tmp_path):
    here = socket.gethostname()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "rlctl-launch"])
    try:
        info = {"pid": p.pid, "host": here}
        wait_until(lambda: b"rlctl-launch" in Path(f"/proc/{p.pid}/cmdline").read_bytes())  # exec'd
        assert detach.launcher_running(info) is True
        assert detach.launcher_state(info, ended=False) == f"pid {p.pid} on {here}, watching"
    finally:
        p.kill()
        p.wait()
    assert detach.launcher_running(info) is False
    assert detach.launcher_state(info, ended=True) == f"pid {p.pid} on {here}, ended"
    assert "gone: nothing watches the job" in str(detach.launcher_state(info, ended=False))
    other = {"pid": 1, "host": here + "-elsewhere"}
    assert detach.launcher_running(other) is None
    assert "not checked" in str(detach.launcher_state(other, ended=False))
    assert detach.launcher_state(None, ended=False) is None


def test_a_dead_launcher_of_a_job_whose_directory_is_gone_says_the_directory_is_gone(tmp_path):
    # `status --all` said "gone before it prepared the job: nothing runs (launch it anew …)" of a row whose job dir
    # had been removed (or was not mounted): the missing directory read as a job never prepared
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    info = {"pid": p.pid, "host": socket.gethostname()}
    gone = detach.launcher_state(info, ended=False, job_dir=tmp_path / "removed", source="job.yaml")
    said = "gone; so is its job directory (removed, or not mounted on this machine)"
    assert gone == f"pid {p.pid} on {info['host']}, {said}"
    (tmp_path / "unprepared").mkdir()  # a directory without job.json: never prepared, as before
    fresh = detach.launcher_state(info, ended=False, job_dir=tmp_path / "unprepared", source="job.yaml")
    assert "gone before it prepared the job" in str(fresh)


@pytest.mark.parametrize("text, name", [("launcher", "launcher"), ("rollout/1", "rollout-1"), ("trainer", "trainer-0")])
def test_logs_names_the_launchers_log(text, name):
    assert agent_name(text) == name


def test_a_near_miss_of_launcher_is_named():
    with pytest.raises(UsageError, match=r"one of controller, trainer, rollout, launcher .*did you mean 'launcher'"):
        agent_name("launch")


def test_an_agent_named_as_its_replicas_are_is_read_as_one():
    # `rollout/01` was looked up as rollout-01 ("no log for rollout-01; known: … rollout-1"), and `launcher/0` was
    # told "role must be one of …, launcher (did you mean 'launcher'?)"; `rollout/²` is no number (int() refuses it)
    assert agent_name("rollout/01") == "rollout-1" and agent_name("trainer-007") == "trainer-7"
    with pytest.raises(UsageError, match=r"^agent 'rollout/²': replica must be a number, e.g. rollout/1$"):
        agent_name("rollout/²")
    for text in ("launcher/0", "launcher-1"):
        with pytest.raises(UsageError) as e:
            agent_name(text)
        assert str(e.value) == f"agent {text!r}: the launcher has no replicas: `rlctl logs JOB launcher`"


def row(state: str, launcher: Any) -> JobRow:
    return JobRow("j1", "/x", state, None, {}, {"launcher": launcher} if launcher is not None else {}, 0.0, 0.0)


def test_attach_is_refused_while_a_launcher_watches_and_for_an_ended_job():
    here = socket.gethostname()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "rlctl-launch"])
    try:
        wait_until(lambda: b"rlctl-launch" in Path(f"/proc/{p.pid}/cmdline").read_bytes())
        with pytest.raises(UsageError, match=rf"job j1 has a launcher \(pid {p.pid} on {here}\)") as e:
            refuse_attach("j1", row("running", {"pid": p.pid, "host": here}), force=True)
        assert e.value.hint == "`rlctl logs j1 launcher -f` follows it"
    finally:
        p.kill()
        p.wait()
    refuse_attach("j1", row("running", {"pid": p.pid, "host": here}), force=False)  # gone: attach
    refuse_attach("j1", row("launching", None), force=False)  # an index row of an older rlctl: no launcher recorded
    elsewhere = row("running", {"pid": 1, "host": here + "-elsewhere"})
    with pytest.raises(UsageError, match="on a machine this one cannot check") as e:
        refuse_attach("j1", elsewhere, force=False)
    assert e.value.hint == "if it is gone, `rlctl attach j1 --force`"
    refuse_attach("j1", elsewhere, force=True)
    with pytest.raises(UsageError, match=r"job j1 ended \(failed\): nothing to watch") as e:
        refuse_attach("j1", row("failed", None), force=True)
    assert e.value.hint == "`rlctl status j1`; continue it with `rlctl launch --resume j1`"
    # a finished job's plain resume is refused: the hint said to run it all the same
    with pytest.raises(UsageError, match=r"job j1 ended \(finished\): nothing to watch") as e:
        refuse_attach("j1", row("finished", None), force=True)
    assert e.value.hint == "`rlctl status j1`; train it on with `rlctl launch --resume j1 --iterations N`"
    with pytest.raises(UsageError, match="not in this machine's job index"):
        refuse_attach("/runs/j1", None, force=True)


def test_attach_hints_name_a_job_id_as_a_shell_reads_it() -> None:
    """A job dir `runs/my run (2)` has the id `my run (2)`: the hints said `rlctl status my run (2)`, which a shell
    reads as three arguments and a syntax error; each command is now one a shell runs as written."""
    elsewhere = {"pid": 1, "host": socket.gethostname() + "-elsewhere"}
    for job, command in (
        (row("failed", None), "rlctl launch --resume 'my run (2)'"),
        (row("finished", None), "rlctl status 'my run (2)'"),
        (row("running", elsewhere), "rlctl attach 'my run (2)' --force"),
    ):
        with pytest.raises(UsageError) as e:
            refuse_attach("my run (2)", job, force=False)
        assert e.value.hint is not None and f"`{command}" in e.value.hint, e.value.hint
        hinted = [part for i, part in enumerate(e.value.hint.split("`")) if i % 2]
        for line in hinted:
            assert shlex.split(line)[2 if "--resume" not in line else 3] == "my run (2)", line


def test_a_detached_launchs_follow_and_stop_commands_name_the_job_as_a_shell_reads_it() -> None:
    """`launch --detach` of a job dir `my run (2)` printed `rlctl status -w my run (2)` and `rlctl stop my run (2)`,
    which a shell splits and refuses: each command is now one a shell runs as written."""
    from rlctl.commands.launching.detached import _started_table

    table = _started_table(
        {"id": "my run (2)", "job_dir": "/r/my run (2)", "launcher_pid": 7, "launcher_log": "/r/l.log"}
    )
    for command in ("rlctl status -w 'my run (2)'", "rlctl logs 'my run (2)' launcher -f", "rlctl stop 'my run (2)'"):
        assert command in table, table


def test_status_all_names_a_launch_anew_for_a_job_whose_launcher_died_before_it_prepared_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its row left `launching`, no job.json: `status --all` said `rlctl attach` watches it again, which refuses it
    # (`nothing to watch`: never prepared)
    from rlctl.launch.jobdir import JobDir
    from tests.conftest import run_cli
    from tests.unit.job_rows import indexed_row

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # the launcher: gone
    jd = JobDir.create("cut", explicit=tmp_path / "cut")
    launcher = {"pid": p.pid, "host": socket.gethostname()}
    indexed_row("cut", jd.path, job="cut", info={"launcher": launcher, "source": "jobs/cut.yaml"})
    r = run_cli("status", "--all", "-o", "json")
    assert r.exit_code == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["state"] == "launching" and "rlctl attach" not in row["launcher"], row
    assert row["launcher"].endswith(
        "gone before it prepared the job: nothing runs (launch it anew: `rlctl launch jobs/cut.yaml`)"
    )
    attach = run_cli("attach", "cut")  # what it named before
    assert attach.exit_code == 2 and "rlctl launch jobs/cut.yaml" in attach.stderr, attach.stderr


def test_a_detached_launcher_heads_its_lines_in_the_launcher_log(tmp_path: Path) -> None:
    # each detached launcher appended its lines to launcher.log with nothing saying whose they were
    log = tmp_path / "logs" / detach.LOG_NAME
    log.parent.mkdir()
    log.write_text("an earlier launcher's line\n")
    c = detach.spawn(["--help"], log)
    try:
        c.proc.wait(timeout=60)
    finally:
        os.close(c.ready_fd)
    lines = log.read_text().splitlines()
    m = detach.HEADER.match(lines[1])
    assert lines[0] == "an earlier launcher's line" and m is not None, lines
    assert (int(m["pid"]), m["how"]) == (c.proc.pid, "detached") and lines[1].endswith(
        f"rlctl --help; {detach.DETACHED}"
    )
    assert detach.latest_in_terminal(log) is None  # its output comes here: nothing to say


def test_status_all_says_which_job_dirs_are_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a row whose job dir was removed (or is on a filesystem not mounted here) was listed as any other, while
    # `rlctl status JOB` says it is gone
    from rlctl.launch.jobdir import JobDir
    from tests.conftest import run_cli
    from tests.unit.job_rows import indexed_row

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    here = JobDir.create("here", explicit=tmp_path / "here")
    indexed_row("here", here.path, job="here", state="finished")
    indexed_row("gone", tmp_path / "gone", job="gone", state="finished")
    r = run_cli("status", "--all", "-o", "json")
    assert r.exit_code == 0, r.stderr
    assert {row["id"]: row["job_dir_gone"] for row in json.loads(r.stdout)} == {"here": False, "gone": True}
    table = run_cli("status", "--all")
    assert table.exit_code == 0, table.stderr
    (gone,) = [line for line in table.stdout.splitlines() if line.startswith("gone")]
    assert f"{tmp_path / 'gone'} (gone: removed, or not mounted on this machine)" in gone
    (kept,) = [line for line in table.stdout.splitlines() if line.startswith("here")]
    assert "(gone" not in kept


def test_status_all_lists_a_row_whose_job_dirs_filesystem_does_not_answer_as_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a job dir on an NFS mount gone stale: stat raises ESTALE, which Path.is_dir passes on (it takes only a
    # missing one for no directory): `rlctl status --all` failed with a traceback, every other row unlisted
    import errno

    from rlctl.launch.jobdir import JobDir
    from tests.conftest import run_cli
    from tests.unit.job_rows import indexed_row

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    here = JobDir.create("here", explicit=tmp_path / "here")
    indexed_row("here", here.path, job="here", state="finished")
    indexed_row("stale", tmp_path / "stale", job="stale", state="finished")
    p = subprocess.Popen([sys.executable, "-c", "pass"])  # a launcher that died, the job not ended by its row
    p.wait()
    launcher = {"launcher": {"pid": p.pid, "host": socket.gethostname()}}
    indexed_row("stale2", tmp_path / "stale", job="stale2", state="running", info=launcher)
    stat = Path.stat

    def stale(self: Path, **kwargs: Any) -> os.stat_result:
        if self == tmp_path / "stale":
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), str(self))
        return stat(self, **kwargs)

    monkeypatch.setattr(Path, "stat", stale)
    r = run_cli("status", "--all", "-o", "json")
    assert r.exit_code == 0, r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert {name: row["job_dir_gone"] for name, row in rows.items()} == {"here": False, "stale": True, "stale2": True}
    said = "gone; so is its job directory (removed, or not mounted on this machine)"
    assert rows["stale2"]["launcher"].endswith(said)
