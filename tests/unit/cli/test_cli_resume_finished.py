"""`rlctl launch --resume` of a finished job is refused (exit 2, one line, nothing started or written), whether
the job index or only its summary.json says it finished; a stopped or failed one is still resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.config import load_job
from rlctl.errors import UsageError
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.ops.jobdb import JobDB, default_home
from rlctl.ops.run import refuse_if_finished
from tests.conftest import ROOT, run_cli

DEMO = ROOT / "jobs" / "demo.yaml"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ended(path: Path, state: str, *, iterations: int, indexed: str | None) -> JobDir:
    """A job directory whose run ended in `state` (summary.json) after `iterations` of 15; in the job index with
    state `indexed` unless None."""
    job = load_job(DEMO)
    jd = JobDir.create("demo", explicit=path)
    jd.write_job(job.spec, source=str(DEMO))
    jd.write_json(jd.plan_json, {"trainer": {"site": "local", "ranks": 1}, "controller_site": "local", "rollout": []})
    write_sites(jd.path, dict(job.inventory.sites))
    summary = {"job": "demo", "state": state, "iterations": iterations, "iterations_planned": 15}
    jd.summary_json.write_text(json.dumps(summary))
    if indexed is not None:
        db = JobDB(default_home() / "jobs.db")
        db.put(jd.path.name, job_dir=str(jd.path), spec={"name": "demo"})
        db.update(jd.path.name, state=indexed)
        db.close()
    return jd


def files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("indexed", ["finished", None])
def test_resuming_a_finished_job_is_refused_and_starts_nothing(tmp_path: Path, indexed: str | None) -> None:
    jd = ended(tmp_path / "run", "done", iterations=15, indexed=indexed)
    before = files(jd.path)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"rlctl: error: job {jd.path.name}: finished (15/15 iterations); nothing to resume")
    assert files(jd.path) == before  # no event, no agent record, no summary set aside


def test_the_index_saying_finished_is_enough_without_a_summary(tmp_path: Path) -> None:
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    jd.summary_json.unlink()  # e.g. not fetched back from the controller's site
    with pytest.raises(UsageError, match=f"job {jd.path.name}: finished; nothing to resume"):
        refuse_if_finished(jd, state="finished")


@pytest.mark.parametrize("state", ["stopped", "failed"])
def test_a_stopped_or_failed_job_is_not_refused(tmp_path: Path, state: str) -> None:
    jd = ended(tmp_path / "run", state, iterations=7, indexed=state)
    refuse_if_finished(jd, state=state)  # nothing raised: its resume goes on as before
