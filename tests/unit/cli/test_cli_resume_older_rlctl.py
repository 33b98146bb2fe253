"""job.json names the rlctl that launched the job (`rlctl_version`), and `launch --resume` of a job whose job.json
names none (an rlctl before it) says, in one line, a loss this rlctl computes otherwise: `decoupled` with an
`is_cap` > 1 truncated π_prox/μ at the cap before 8d7ca57 and leaves a token past it out now. Before, the resumed
run changed its loss without a word, and nothing in job.json told such a job apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rlctl
from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.launch.jobdir import JobDir, job_digests
from rlctl.ops.jobchanges import launch_changes, older_rlctl_changes, refuse_fixed_edits, take_edits
from tests.conftest import run_cli
from tests.unit.cli.test_cli_resume_finished import ended, launched_by


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def stopped_job(path: Path, *, older: bool, **algorithm: Any) -> JobDir:
    """A stopped job launched with `algorithm` (GRPO's); `older`: its job.json as an rlctl before the version's
    field wrote it (the field gone, every other as written)."""
    jd = ended(path, "stopped", iterations=7, indexed="stopped")
    spec = jd.read_job()
    jd.write_job(spec.model_copy(update={"algorithm": GrpoAlgorithm(kind="grpo", **algorithm)}), source="demo.yaml")
    if older:
        data = json.loads(jd.job_json.read_text())
        data.pop("rlctl_version", None)
        jd.job_json.write_text(json.dumps(data, indent=2))
    return jd


def test_a_launch_names_its_rlctl_in_job_json_and_every_reader_of_it_reads_it(tmp_path: Path) -> None:
    jd = stopped_job(tmp_path / "run", older=False, off_policy="decoupled", is_cap=1.5)
    data = json.loads(jd.job_json.read_text())
    assert data["rlctl_version"] == rlctl.__version__
    assert jd.read_job().algorithm.is_cap == 1.5  # (the job's own fields are read strictly: it is beside them)
    assert launch_changes(jd) == []  # not said as an edit of job.json
    refuse_fixed_edits(jd, resumed=5)
    take_edits(jd)
    assert json.loads(jd.job_json.read_text()) == data
    r = run_cli("status", str(jd.path))
    assert r.exit_code == 0 and "stopped" in r.stdout, r.stderr


def test_a_resume_of_a_decoupled_cap_an_older_rlctl_launched_says_how_the_cap_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jd = stopped_job(tmp_path / "run", older=True, off_policy="decoupled", is_cap=1.5)
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert launched["resume"] is True  # a warning, not a refusal
    assert said == [
        f"job demo: {jd.job_json} names no rlctl version (launched by an rlctl before 8d7ca57?): there, "
        "algorithm.off_policy 'decoupled' truncated each token's π_prox/μ at is_cap 1.5 (min(π_prox/μ, 1.5), as "
        "'tis' does); now it leaves out a token whose π_prox/μ exceeds 1.5 (weight 0). To resume with the "
        "truncation, set job.algorithm.off_policy to 'tis' in job.json"
    ]


@pytest.mark.parametrize(
    ("older", "algorithm"),
    [
        (False, {"off_policy": "decoupled", "is_cap": 1.5}),  # launched by this rlctl: the cap as it computes it
        (True, {"off_policy": "decoupled"}),  # no cap: nothing left out, then or now
        (True, {"off_policy": "tis", "is_cap": 1.5}),  # truncated then and now
        (True, {"off_policy": "decoupled", "is_cap": 0.8}),  # ≤ 1: read as the `tis` that rlctl computed
    ],
    ids=["new-record", "no-cap", "tis", "cap-at-most-1"],
)
def test_a_resume_that_computes_the_launchs_loss_says_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, older: bool, algorithm: dict[str, Any]
) -> None:
    if algorithm.get("is_cap", 2) > 1:
        jd = stopped_job(tmp_path / "run", older=older, **algorithm)
    else:  # (a job file refuses it: only an older rlctl's record holds it)
        jd = stopped_job(tmp_path / "run", older=older)
        data = json.loads(jd.job_json.read_text())
        data["job"]["algorithm"] |= algorithm
        data["job_sha256"] = job_digests(data["job"])  # as launched: not said as an edit
        jd.job_json.write_text(json.dumps(data, indent=2))
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert launched["resume"] is True and said == []


def test_the_older_rlctl_check_reads_job_json_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its version field and its job from one read (versus a read for each: a job launched by an older rlctl)."""
    jd = stopped_job(tmp_path / "run", older=True, off_policy="decoupled", is_cap=1.5)
    opened: list[Path] = []
    path_open = Path.open

    def counted(self: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(self)
        return path_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted)
    assert len(older_rlctl_changes(jd)) == 1
    assert opened.count(jd.job_json) == 1
