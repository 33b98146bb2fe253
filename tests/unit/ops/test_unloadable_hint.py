"""The launcher's hint where a trainer rank refused the checkpoint a resume continues from (`RunBase.unloadable_hint`):
continue from an older checkpoint (`--checkpoint V`, naming the versions the job dir holds before it), or at the split
it was written at where the split was the refusal; versus "fix what its log says, then launch the job again", which a
damaged checkpoint leaves nothing to fix in (launched again, it fails the same way). The launch that says it:
tests/integration/ops/test_ops_resume_refsdp.py."""

from __future__ import annotations

from pathlib import Path

from rlctl.checkpoint.choose import ResumePoint
from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.launch.jobdir import JobDir
from rlctl.ops.run import JobRun
from tests.conftest import ROOT


def resumed_at(tmp_path: Path, version: int | None) -> tuple[JobRun, JobDir]:
    jd = JobDir.create("j", explicit=tmp_path / "job")
    local = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
    run = JobRun(jd, load_job(ROOT / "jobs" / "demo.yaml").spec, {"controller_site": "train"},
                 sites={"train": Site.model_validate(local)})  # fmt: skip
    for v in (1, 2, 3, 4):
        jd.checkpoint(v).mkdir(parents=True)
        jd.event("checkpoint", version=v, keep=0)
    run.resumed = None if version is None else ResumePoint(version=version, pointer="latest.json")
    return run, jd


def test_a_trainer_refusing_the_resumed_checkpoint_is_told_of_the_older_ones(tmp_path: Path) -> None:
    run, jd = resumed_at(tmp_path, 3)
    damaged = f": rank 1: {jd.checkpoint(3)}: ranks/rank-1.pt: it holds no rng"
    assert run.unloadable_hint(damaged) == (
        f"the trainer cannot load checkpoint v3: continue from an older one, `rlctl launch --resume {jd.path} "
        "--checkpoint V` (V: 1, 2 here; the newer ones are set aside)"
    )
    split = (
        f": {jd.checkpoint(3)}: written by a trainer at tp 2 pp 1 dp 1, which this trainer (tp 1 pp 1 dp 2) cannot "
        "load: only megatron's shards are rebuilt at another tp × pp"
    )
    assert run.unloadable_hint(split) == (
        "the trainer cannot load checkpoint v3: resume it at the split it was written at (`--trainer-split`) or "
        f"continue from an older one, `rlctl launch --resume {jd.path} --checkpoint V` (V: 1, 2 here; the newer ones "
        "are set aside)"
    )
    policy = f": rank 1: {jd.checkpoint(3)}/model/model.safetensors: truncated: its header declares 58240 bytes"
    assert run.unloadable_hint(policy) == run.unloadable_hint(damaged)
    # an older iter-N the job never completed (a crash mid-write; its events say none) is not offered
    jd.events.write_text("".join(line for line in jd.events.read_text().splitlines(True) if '"version": 2' not in line))
    assert "(V: 1 here;" in (run.unloadable_hint(damaged) or "")
    # another checkpoint's path, another failure, a run that is no resume: the hint it had
    assert run.unloadable_hint(f": {jd.checkpoint(4)}: ranks/rank-1.pt: it holds no rng") is None
    assert run.unloadable_hint(": CUDA error: out of memory") is None
    assert resumed_at(tmp_path / "fresh", None)[0].unloadable_hint(damaged) is None


def test_a_trainer_refusing_the_oldest_checkpoint_is_told_how_the_job_starts_over(tmp_path: Path) -> None:
    run, jd = resumed_at(tmp_path, 1)
    source = tmp_path / "job.yaml"
    jd.write_json(jd.job_json, {"source_file": {"path": str(source)}})
    damaged = f": {jd.checkpoint(1)}: ranks/rank-0.pt: it holds no rng"
    assert run.unloadable_hint(damaged) == (
        f"the trainer cannot load checkpoint v1, the oldest in {jd.checkpoints}: `rlctl launch {source}` starts the "
        "job over in a new directory"
    )
    split = f": {jd.checkpoint(1)}: written by a trainer at tp 2 pp 1 dp 1, which this trainer (tp 1 pp 1 dp 2) cannot"
    assert run.unloadable_hint(split) == (
        f"the trainer cannot load checkpoint v1, the oldest in {jd.checkpoints}: resume it at the split it was written "
        f"at (`--trainer-split`), or else `rlctl launch {source}` starts the job over in a new directory"
    )
