"""A `launch --resume` of a job whose launcher runs is refused before it does anything to the job dir: its
`--iterations` and `--checkpoint` fetched the controller site's record into it first (the launcher at work there),
and only then met the launcher lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.ops import operate
from tests.conftest import run_cli
from tests.unit.cli.test_cli_bad_input import home, one_error, prepared, snapshot

__all__ = ["home"]  # (the fixture: RLCTL_HOME under tmp_path)


def test_a_resume_of_a_job_its_launcher_holds_is_refused_before_it_fetches_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd = prepared(tmp_path / "run")
    fetched: list[Path] = []  # a controller on another site: each fetch of its record, recorded
    monkeypatch.setattr(operate, "record_view", lambda path: ("site", "host", "/w/jobs/run"))
    monkeypatch.setattr(operate, "fetch_record", lambda path, *view: fetched.append(path) or [])
    with jd.launcher_lock():  # (this process holds it, as the job's running launcher would)
        for given in (["--iterations", "400"], ["--checkpoint", "v1"], []):
            line = one_error(run_cli("launch", "--resume", str(jd.path), *given))
            assert f"job {jd.id} has a launcher already (pid " in line, given  # was: --checkpoint: no such checkpoint
    assert fetched == []  # was: fetched by --iterations, then refused by the lock


def test_of_two_resumes_started_at_once_the_second_is_refused_before_it_fetches_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `launch --resume --iterations` of one job at the same moment: the second, run while the first fetches
    the controller site's record, is refused by the launcher lock the first holds from before its fetch into its
    run; versus both passing a probe of the lock (`launcher_holder`) and both fetching into one job dir before either
    took the lock in `be_launcher`."""
    from rlctl.commands.launching import resume
    from rlctl.render import OutputFormat

    jd = prepared(tmp_path / "run")
    fetched: list[Path] = []
    second: list[str] = []

    def fetch(path: Path, *view: object) -> list[str]:
        fetched.append(path)
        if len(fetched) == 1:  # the second resume starts as the first fetches
            second.append(one_error(run_cli("launch", "--resume", str(jd.path), "--iterations", "400")))
        return []

    ran: list[str | None] = []  # who held the launcher lock as each launcher began its run
    monkeypatch.setattr(operate, "record_view", lambda path: ("site", "host", "/w/jobs/run"))
    monkeypatch.setattr(operate, "fetch_record", fetch)
    monkeypatch.setattr(
        resume, "be_launcher", lambda jd, _s, _p, db, *_a, **_k: (ran.append(jd.launcher_holder()), db.close())
    )
    resume.resume_job(str(jd.path), OutputFormat.table, iterations=400)
    assert fetched == [jd.path]  # was: fetched twice, the second resume's too
    assert len(second) == 1 and f"job {jd.id} has a launcher already (pid " in second[0], second
    assert len(ran) == 1 and ran[0] is not None and ran[0].startswith("pid "), ran  # still held as its run began


HOLDS_THE_LOCK = """
import os, sys
from pathlib import Path
from rlctl.launch.jobdir import JobDir
from rlctl.launch.locks import LOCK_FD_ENV
jd = JobDir(Path(sys.argv[1]))
with jd.launcher_lock():
    print(os.getpid(), LOCK_FD_ENV in os.environ, jd.launcher_holder(), flush=True)
"""


def test_a_detached_resume_hands_its_launcher_lock_to_the_launcher_it_spawns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch --resume --detach`: the launcher lock taken before the record is fetched is held while the launcher
    in the background starts, which takes it over (the descriptor inherited); versus let go before the spawn, where
    a resume started before that launcher took the lock again passed, and that launcher was then refused."""
    from rlctl.commands.launching import resume
    from rlctl.render import OutputFormat

    jd = prepared(tmp_path / "run")
    second: list[str] = []
    spawned: list[str] = []

    def run_detached(
        args: list[str],
        path: Path,
        output: object,
        *,
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        assert args == ["launch", "--resume", str(jd.path)]
        second.append(one_error(run_cli("launch", "--resume", str(jd.path))))  # as its launcher starts
        child = subprocess.run(  # the launcher in the background, as `detach.start` starts it
            [sys.executable, "-c", HOLDS_THE_LOCK, str(path)],
            env={**os.environ, **(env or {})},
            pass_fds=pass_fds,
            capture_output=True,
            text=True,
            check=True,
        )
        spawned.append(child.stdout)

    monkeypatch.setattr(resume, "run_detached", run_detached)
    monkeypatch.setattr(resume, "be_launcher", lambda *_a, **_k: pytest.fail("the second resume ran"))
    resume.resume_job(str(jd.path), OutputFormat.table, detached=True)
    assert len(second) == 1 and f"job {jd.id} has a launcher already (pid {os.getpid()} " in second[0], second
    pid, env_left, holder = spawned[0].split(" ", 2)
    assert env_left == "False" and holder.startswith(f"pid {pid} on "), spawned  # taken over, not refused
    assert jd.launcher_holder() is None  # let go once both ended


def test_a_resume_that_cannot_open_the_launcher_lock_says_so_in_one_line(tmp_path: Path) -> None:
    """A job dir whose `.launcher.lock` cannot be opened (another user's job dir, a read-only mount; here a
    directory by that name, as root may write anywhere): one line naming the file, exit 2, the job dir as it was;
    versus the OSError's traceback, now that a resume takes the lock before its refusals (a finished job's
    `nothing to resume` was one line)."""
    jd = prepared(tmp_path / "run")
    (jd.path / ".launcher.lock").mkdir()
    before = snapshot(jd.path)
    said = f"rlctl: error: {jd.path / '.launcher.lock'}: cannot open the job's launcher lock ("
    hint = f"(hint: a launcher writes in the job dir: look at its owner and permissions (`ls -la {jd.path}`))"
    for given in (["--iterations", "400"], ["--detach"], []):
        line = one_error(run_cli("launch", "--resume", str(jd.path), *given))
        assert line.startswith(said) and line.endswith(hint), (given, line)
    assert snapshot(jd.path) == before


@pytest.mark.parametrize("command", ["status", "stop", "launch"])
def test_a_launcher_lock_that_cannot_be_read_is_one_line_naming_it(tmp_path: Path, command: str) -> None:
    """`status`, `stop` and a launch into the job dir ask who holds the launcher lock (`launcher_holder`): one that
    cannot be read (another user's job dir whose lock is theirs alone, 0600; here a directory by that name, as root
    reads anything) is one line naming it, exit 2, versus the OSError's traceback (IsADirectoryError,
    PermissionError)."""
    from tests.unit.cli.test_cli_bad_input import DEMO

    jd = prepared(tmp_path / "run")
    (jd.path / ".launcher.lock").mkdir()
    args = {"status": [str(jd.path)], "stop": [str(jd.path)], "launch": [str(DEMO), "--job-dir", str(jd.path)]}
    line = one_error(run_cli(command, *args[command]))
    assert line.startswith(f"rlctl: error: {jd.path / '.launcher.lock'}: cannot open the job's launcher lock (")
    hint = "(hint: whether a launcher runs the job is read from it: look at its owner and permissions "
    hint += f"(`ls -la {jd.path}`))"
    assert line.endswith(hint), line


def test_a_resume_on_a_filesystem_with_no_flock_goes_on_unlocked_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A job dir on NFS mounted `nolock` (flock: ENOLCK): the resume goes on unlocked, as the record's fetch and the
    event appends do there, with one warning line naming `.launcher.lock`; versus the OSError's traceback, which the
    launcher lock, taken before every refusal of a resume, raised."""
    import errno
    import fcntl

    from rlctl.commands.launching import resume

    def no_flock(fd: int, how: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    jd = prepared(tmp_path / "run")
    ran: list[str | None] = []
    monkeypatch.setattr(fcntl, "flock", no_flock)
    monkeypatch.setattr(
        resume, "be_launcher", lambda jd, _s, _p, db, *_a, **_k: (ran.append(jd.launcher_holder()), db.close())
    )
    for _ in range(2):
        r = run_cli("launch", "--resume", str(jd.path))
        assert r.exit_code == 0 and "Traceback" not in r.stderr, r.stderr  # was: exit 1, OSError: [Errno 37]
    assert ran == [None, None]  # ran, no launcher can be told apart there
    said = [m for m in caplog.messages if ".launcher.lock: no file locks on this filesystem" in m]
    assert len(said) == 1 and "goes on unlocked" in said[0], caplog.messages


def test_a_detached_attach_holds_the_launcher_lock_from_its_checks_and_hands_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attach --detach`, as `launch --resume --detach`: the launcher lock taken once its checks passed, held while
    the launcher in the background starts, which takes it over; a second `attach --detach` meanwhile is refused in
    one line. Versus no lock in the process that checks: both passed and spawned a launcher, one of them refused
    later in its log (`has a launcher already`)."""
    import socket

    from rlctl.commands import attach
    from tests.unit.job_rows import indexed_row

    jd = prepared(tmp_path / "run")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # the job's launcher, as the index records it: gone
    launcher = {"pid": gone.pid, "host": socket.gethostname()}
    indexed_row(jd.id, jd.path, job="demo", state="running", info={"launcher": launcher})
    calls: list[list[str]] = []
    second: list[str] = []
    spawned: list[str] = []

    def run_detached(
        args: list[str],
        path: Path,
        output: object,
        *,
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        calls.append(args)
        if len(calls) > 1:  # the second attach's launcher (was: spawned too)
            spawned.append("the second attach's")
            return
        second.append(run_cli("attach", str(jd.path), "--detach").stderr.strip())  # as its launcher starts
        child = subprocess.run(  # the launcher in the background, as `detach.start` starts it
            [sys.executable, "-c", HOLDS_THE_LOCK, str(path)],
            env={**os.environ, **(env or {})},
            pass_fds=pass_fds,
            capture_output=True,
            text=True,
            check=True,
        )
        spawned.append(child.stdout)

    monkeypatch.setattr(attach, "run_detached", run_detached)
    r = run_cli("attach", str(jd.path), "--detach")
    assert r.exit_code == 0, r.stderr
    assert calls[0] == ["attach", str(jd.path)]
    assert f"job {jd.id} has a launcher already (pid {os.getpid()} " in second[0], (second, spawned)
    assert second[0].startswith("rlctl: error: ") and second[0].count("\n") == 0, second
    (child,) = spawned  # was: the second attach's launcher spawned too
    pid, env_left, holder = child.split(" ", 2)
    assert env_left == "False" and holder.startswith(f"pid {pid} on "), spawned  # taken over, not refused
    assert jd.launcher_holder() is None  # let go once both ended


def test_an_attach_whose_job_json_does_not_read_closes_the_job_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attach` (not detached) of a job whose job.json was edited into a value a job file refuses: one line, and the
    job index it opened closed, as every other refusal of it closes it; versus left open (its connection to the
    index's SQLite file held by the process until it was collected)."""
    import json
    import socket

    from rlctl.ops.jobdb import JobDB
    from tests.unit.job_rows import indexed_row

    jd = prepared(tmp_path / "run")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # the job's launcher, as the index records it: gone
    indexed_row(
        jd.id, jd.path, job="demo", state="running", info={"launcher": {"pid": gone.pid, "host": socket.gethostname()}}
    )
    data = json.loads(jd.job_json.read_text())
    data["job"]["seed"] = "not a number"  # edited by hand
    jd.job_json.write_text(json.dumps(data))
    opened: list[JobDB] = []
    closed: list[JobDB] = []
    init, close = JobDB.__init__, JobDB.close

    def opening(db: JobDB, path: Path | None = None) -> None:
        init(db, path)
        opened.append(db)

    def closing(db: JobDB) -> None:
        closed.append(db)
        close(db)

    monkeypatch.setattr(JobDB, "__init__", opening)
    monkeypatch.setattr(JobDB, "close", closing)
    line = one_error(run_cli("attach", str(jd.path)))
    assert line.startswith(f"rlctl: error: {jd.job_json}: job.seed"), line
    assert opened and all(db in closed for db in opened), (opened, closed)  # was: the attach's own left open
    assert jd.launcher_holder() is None
