"""`rlctl attach` to a job that `rlctl stop` stopped before it attached (rlctl.ops.autoresume.Runs.attach): the stop is
the run's end, said at once as a stopped job's launcher says it, not a failure to resume from."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.errors import Stopped
from rlctl.launch import local
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.ops.autoresume import Runs
from rlctl.ops.jobdb import JobDB
from rlctl.ops.runstate import STOP_REQUESTED
from tests.conftest import ROOT


def _killed_controller() -> dict[str, int]:
    """A local controller's record (pid, pgid, start time) whose process is gone: the stop's forced part killed it
    past the grace, before it wrote a summary."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    ticks = local.start_ticks(proc.pid)
    assert ticks is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    return {"pid": proc.pid, "pgid": proc.pid, "start_ticks": ticks}


@pytest.mark.parametrize("damaged", [False, True])
def test_attach_to_a_job_stopped_before_it_attached_ends_as_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: bool
) -> None:
    # damaged: agents.jsonl also holds a line cut short by a full disk, which attach read strictly and failed on
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    jd = JobDir.create(spec.name, explicit=tmp_path / "job")
    jd.write_job(spec, source="demo.yaml")
    site = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
    write_sites(jd.path, {"local": Site.model_validate(site)})
    row = {"name": "controller-0", "role": "controller", "replica": 0, "site": "local", "backend": "local"}
    rec = row | {"ident": _killed_controller(), "host": None, "gpus": None, "log": None}
    (jd.path / "agents.jsonl").write_text(('{"name": "rollout-1", "ro\n' if damaged else "") + json.dumps(rec) + "\n")
    jd.event("agent_started", agent="controller-0", run="r1")
    jd.event(STOP_REQUESTED)  # `rlctl stop` (from a terminal whose index does not hold the job): its row says running
    db = JobDB()
    try:
        gone = {"launcher": {"pid": 2**22 + 1, "host": socket.gethostname()}}
        db.put(jd.path.name, job_dir=str(jd.path), spec={"name": spec.name})
        db.update(jd.path.name, state="running", info=gone)
        said: list[str] = []
        runs = Runs(jd, spec, {"controller_site": "local"}, db=db, say=said.append)
        runs.attach()
        with pytest.raises(Stopped, match=r"was stopped by `rlctl stop` \(forced"):
            runs.wait()  # was: LaunchError "the controller exited … without a summary", the index row failed
        assert db.get(jd.path.name).state == "stopped"
    finally:
        db.close()


def test_attach_after_a_resume_watches_the_latest_runs_agents_only(tmp_path: Path) -> None:
    """agents.jsonl of a resumed job: run 1 had rollout-2 (scaled in, never started again), run 2 recorded the same
    names again. Attach watches run 2's agents and controller; it took every record from the first controller's
    place on (a name recorded again keeps its first place among the handles), so run 1's rollout-2 too."""
    from rlctl.ops.run import JobRun

    jd = JobDir.create("demo", explicit=tmp_path / "job")

    def rec(name: str, role: str, pid: int) -> str:
        row = {"name": name, "role": role, "replica": int(name[-1]), "site": "local", "backend": "local", "host": None}
        return json.dumps(row | {"gpus": None, "log": None, "ident": {"pid": pid, "pgid": pid, "start_ticks": 1}})

    roles = {"controller-0": "controller", "trainer-0": "trainer", "rollout-0": "rollout", "rollout-2": "rollout"}
    run1, run2 = list(roles), ["controller-0", "trainer-0", "rollout-0"]
    lines = [rec(n, roles[n], 100 + i) for i, n in enumerate(run1)]
    lines += [rec(n, roles[n], 200 + i) for i, n in enumerate(run2)]
    (jd.path / "agents.jsonl").write_text("\n".join(lines) + "\n")
    r = object.__new__(JobRun)
    r.jobdir, r.db = jd, None
    r.attach()
    assert sorted(h.spec.name for h in r.handles) == ["controller-0", "rollout-0", "trainer-0"]
    assert r.controller is not None and r.controller.ident["pid"] == 200
