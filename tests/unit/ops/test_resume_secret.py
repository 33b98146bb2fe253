"""A job dir whose `secret` is damaged (empty, not hex) is refused in one line naming it before a resume moves
anything or starts any agent: by `launch --resume` itself and by the run it starts (an automatic resume's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlctl.errors import ConfigError, LaunchError
from rlctl.launch.jobdir import JobDir
from rlctl.ops.run import JobRun
from tests.unit.ops.test_resume_point import job_run, prepared, spec

DAMAGED = {"empty": "", "not hex": "nothex!!\n"}


@pytest.mark.parametrize("how", list(DAMAGED))
def test_a_damaged_secret_is_one_line_naming_the_file(tmp_path: Path, how: str) -> None:
    jd = JobDir.create("s", explicit=tmp_path / "job")
    assert len(jd.secret()) == 32  # made on first use
    (jd.path / "secret").write_text(DAMAGED[how])
    with pytest.raises(ConfigError) as e:
        jd.secret()  # an empty one was an empty key; another a ValueError's traceback
    with pytest.raises(ConfigError):
        jd.check_secret()
    (jd.path / "secret").unlink()
    jd.check_secret()  # none there: none made (a resume's job dir left as it was)
    assert not (jd.path / "secret").exists()
    assert str(e.value).startswith(f"{jd.path / 'secret'}: {how.replace('not hex', 'not hex digits')}: ")
    assert e.value.exit_code == 2 and "\n" not in str(e.value) + str(e.value.hint)


@pytest.mark.parametrize("how", list(DAMAGED))
def test_a_resume_of_a_job_whose_secret_is_damaged_is_refused_before_anything_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # the controller failed on it with a traceback in its log (rc 1) after the run's agents started, summary.json
    # renamed summary.1.json: the finished job's status became 'ended without a summary'
    from rlctl.ops import runstart
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))

    def staged(*_: object, **__: object) -> None:  # (no agent of a run the old code went on with is ever started)
        raise LaunchError("staged: the run went on")

    monkeypatch.setattr(runstart, "stage_all", staged)
    jd = prepared(tmp_path)
    jd.event("checkpoint", version=3, keep=0)
    summary = '{"state": "failed: trainer trainer-0 was lost", "iterations": 4}'
    jd.summary_json.write_text(summary)
    (jd.path / "secret").write_text(DAMAGED[how])
    before = sorted(p.name for p in jd.path.iterdir())
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"rlctl: error: {jd.path / 'secret'}: ")
    assert sorted(p.name for p in jd.path.iterdir()) == before and jd.summary_json.read_text() == summary

    # the run itself (an automatic resume's, which never comes through `launch --resume`): before it moves anything
    run, sites = job_run(tmp_path / "run")
    sites.c.summary_json.write_text(summary)
    sites.c.write_job(spec(), source="test")
    (sites.c.path / "secret").write_text(DAMAGED[how])

    def prepare(self: JobRun, *_: Any, **__: Any) -> Any:
        raise AssertionError("the run went on to stage and start its agents")

    monkeypatch.setattr(JobRun, "_prepare", prepare)
    with pytest.raises(ConfigError, match="secret"):
        run.start(resume=True)
    assert sites.c.summary_json.read_text() == summary and not list(sites.c.path.glob("summary.*.json"))
