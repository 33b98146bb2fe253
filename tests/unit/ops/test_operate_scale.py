"""`rlctl scale` (rlctl.ops.operate.scale) of a job whose index row says it ended is one usage line, not a
"the controller did not answer" about a controller that is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops import operate
from rlctl.ops.jobdb import JobDB
from rlctl.ops.jobref import JobRef


@pytest.mark.parametrize("state", ["finished", "failed", "stopped"])
def test_a_scale_of_an_ended_job_says_it_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("short", explicit=tmp_path / "short2")
    db = JobDB()
    try:
        db.put("short2", job_dir=str(jd.path), spec={"name": "short"})
        db.update("short2", state=state)
        row = db.get("short2")
    finally:
        db.close()
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: pytest.fail("no controller to ask"))
    with pytest.raises(UsageError, match=rf"^job short2 ended \({state}\): nothing to scale$") as e:
        operate.scale(JobRef("short2", jd, row), +1, site=None)
    assert (
        e.value.exit_code == 2
        and e.value.hint == "continue a failed or stopped one with `rlctl launch --resume short2`"
    )
