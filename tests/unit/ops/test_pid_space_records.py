"""A launcher lock's holder line, a job index row's launcher and a stop request's stop process name their pid space
(`procfs.pid_space`: this boot, this pid namespace) beside their host, and each is taken for a process here only where
both are this machine's (`procfs.pids_here`), versus the host name alone: a container of another machine given this
host name, sharing the job dir (NFS) or the job index, had its pid read as whichever process of this machine has that
number, or as gone where none has. A record without a pid space (an older rlctl's) goes by its host, as before."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl import procfs
from rlctl.commands.attach import refuse_attach
from rlctl.config.inventory import Site
from rlctl.errors import UsageError
from rlctl.launch import stage
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.ops import detach
from rlctl.ops import stop as opstop
from rlctl.ops.runstate import STOP_REQUESTED
from tests.unit.lock_probe import probed_until_a_retry
from tests.unit.ops.test_detach import row
from tests.unit.ops.test_stop import LOCAL_SITE

OTHER = "00000000-0000-0000-0000-000000000000-4026531836"  # another machine's boot, the same pid namespace number


def _gone_pid() -> int:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(ended.stdout)


def test_a_launcher_lock_of_another_pid_space_under_this_host_name_is_tried_again_not_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the other container's launcher wrote this test's pid (a live process here, by chance) and this host name; a
    # `status -w` probe held the lock for an instant as a resume here took it: refused at once, 'job J has a
    # launcher already (pid N on HOST)', naming a launcher gone, versus tried again as another host's holder is
    jd = JobDir.create("demo", explicit=tmp_path / "j")
    lock, here = jd.path / ".launcher.lock", f"pid {os.getpid()} on {socket.gethostname()}"
    with monkeypatch.context() as m:
        m.setattr(procfs, "pid_space", lambda: OTHER)
        with jd.launcher_lock():
            assert jd.launcher_holder() == here  # said as before: its pid space is for `_runs_here` alone
    assert lock.read_text() == f"{here}\npid space {OTHER}\ndir {jd.path}\n"
    probe, slept = probed_until_a_retry(lock, monkeypatch)  # a probe's instant, over as the launcher retries
    with jd.launcher_lock():
        assert lock.read_text() == f"{here}\npid space {procfs.pid_space()}\ndir {jd.path}\n"
        monkeypatch.setattr(time, "sleep", lambda s: pytest.fail("waited on a launcher that runs here"))
        with pytest.raises(UsageError) as e, jd.launcher_lock():  # a launcher of this pid space: at once, as before
            pass
        assert str(e.value) == f"job {jd.id} has a launcher already ({here})"
    assert len(slept) == 1 and probe.closed


def test_a_launcher_of_another_pid_space_under_this_host_name_is_not_checked_not_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # its pid names no process here: said "gone: nothing watches the job", and `rlctl attach` took over from a
    # launcher that watched it (two launchers of one job), versus "another machine: not checked" of another host's
    gone, host = _gone_pid(), socket.gethostname()
    with monkeypatch.context() as m:
        m.setattr(procfs, "pid_space", lambda: OTHER)
        info = detach.this_launcher() | {"pid": gone}
    assert info == {"pid": gone, "host": host, "pid_space": OTHER}
    assert detach.launcher_running(info) is None
    assert (
        detach.launcher_state(info, ended=False) == f"pid {gone} on {host} (another machine or container: not checked)"
    )
    with pytest.raises(UsageError, match="on a machine this one cannot check"):
        refuse_attach("j1", row("running", info), force=False)
    assert detach.launcher_running(info | {"pid_space": procfs.pid_space()}) is False  # of this pid space: gone
    assert detach.launcher_running({"pid": gone, "host": host}) is False  # an older rlctl's: by its host, as before


def test_a_stop_request_of_another_pid_space_under_this_host_name_is_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its stop process's pid names no process here: read as a stop killed before the controller took it (no stop
    # under way), and a second stop forced the end the first was waiting out, versus under way as another host's
    jd = JobDir.create("far", explicit=tmp_path / "job")
    far = Site.model_validate({**LOCAL_SITE, "scheduler": {"kind": "local", "workdir": str(tmp_path / "w")}})
    write_sites(jd.path, {"far": far})
    jd.write_json(jd.plan_json, {"controller_site": "far", "trainer": {"site": "far", "ranks": 1}, "rollout": []})
    stage.write_staged(jd.path, {"far": {"roots": {"h": str(jd.path)}}})  # the controller's events here
    jd.event("agent_started", agent="controller-0", site="far", backend="local", ident={}, gpus=None, run="r1")
    gone = _gone_pid()
    with monkeypatch.context() as m:
        m.setattr(procfs, "pid_space", lambda: OTHER)
        stopper = opstop._stopper() | {"pid": gone}
    assert stopper["pid_space"] == OTHER
    jd.event(STOP_REQUESTED, stopper=stopper)
    assert opstop.stop_under_way(jd)
    jd.event(STOP_REQUESTED, stopper=stopper | {"pid_space": procfs.pid_space()})  # of this pid space: gone
    assert not opstop.stop_under_way(jd)
    jd.event(STOP_REQUESTED, stopper={k: v for k, v in stopper.items() if k != "pid_space"})  # an older rlctl's
    assert not opstop.stop_under_way(jd)
