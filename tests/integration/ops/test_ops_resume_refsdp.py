"""`rlctl launch --resume JOB --trainer-split dp=3` of a torch trainer's FSDP2 checkpoint written at dp 2 whose rank-1
shard, listed in its manifest as it is (the SHA-256s of both parts agree: a shard another rlctl or a hand wrote),
breaks what FSDP2's rows say of it (`rlctl.checkpoint.refsdp.check_rows`) or lacks a parameter's state the other
holds (`rlctl.checkpoint.shardcheck.check_stepped`), and a resume at dp 2 of one lacking its optimizer's state: the
launch exits 1 with one line naming the checkpoint, the shard's file and what is wrong in it, no traceback, a hint
naming the older checkpoint to continue from (`--checkpoint V`), and the checkpoint as it was, every file. Versus a
KeyError's traceback and a line without its reason (an entry missing), a line naming the shapes of both old shards,
one of them never read but made from the broken one (another width), or a parameter's missing state, neither naming
the file; each after "written by a trainer at …, which this trainer … cannot load", as if the split were refused,
and the hint "fix what its log says, then launch the job again"."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.agents.test_agents_megatron_job import LENGTH_REWARD
from tests.integration.hfdemo import check_and_launch, hf_demo_job

from .conftest import rlctl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-iteration job of a torch trainer sharded by FSDP2 over 2 ranks, its checkpoints iter-1 and iter-2 written,
    done."""
    out = tmp_path_factory.mktemp("refsdp-launch")
    job = hf_demo_job(
        out,
        reward=LENGTH_REWARD,
        iterations=2,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer={"shard": "fsdp"},
        checkpoint={"every_iterations": 1},
    )
    s = check_and_launch(job, out / "run")
    assert s["state"] == "done" and s["iterations"] == 2
    return out / "run"


def relisted(ckpt: Path, rel: str, change: Callable[[dict[str, Any]], None]) -> None:
    """`change` shard `rel` of `ckpt` and list it as it is now: its bytes and SHA-256 in the trainer's manifest, that
    manifest's SHA-256 in the controller's (as rlctl writes them: the resume's choice verifies it)."""
    shard = torch.load(ckpt / rel, weights_only=True)
    change(shard)
    torch.save(shard, ckpt / rel)
    trainer = json.loads((ckpt / "MANIFEST.trainer.json").read_text())
    data = (ckpt / rel).read_bytes()
    trainer["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "MANIFEST.trainer.json").write_text(json.dumps(trainer, indent=1, sort_keys=True))
    controller = json.loads((ckpt / "MANIFEST.controller.json").read_text())
    controller["trainer_digest"] = hashlib.sha256((ckpt / "MANIFEST.trainer.json").read_bytes()).hexdigest()
    (ckpt / "MANIFEST.controller.json").write_text(json.dumps(controller, indent=1, sort_keys=True))


def first_moments(shard: dict[str, Any]) -> dict[str, torch.Tensor]:
    return shard["optimizer.policy"]["state"][0]


def one_row_fewer(shard: dict[str, Any]) -> None:
    first_moments(shard).update({m: t[1:].clone() for m, t in first_moments(shard).items() if t.dim()})


def narrower(shard: dict[str, Any]) -> None:
    first_moments(shard).update({m: t[:, 1:].clone() for m, t in first_moments(shard).items() if t.dim()})


# the embedding of the demo's 43-row vocabulary (96 wide): old rank 1 of 2 holds its last 21 rows. Each case: the
# damage, what the line says of it, the resume's split (None: the checkpoint's) and the ranks that read the shard
# (at dp 3, new ranks 1 and 2 read old rank 1's rows; rank 0 reads old rank 0's alone)
CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], str, str | None, tuple[int, ...]]] = {
    "rows": (one_row_fewer, r"optimizer\.policy parameter 0's exp_avg is \(20, 96\); FSDP2 cuts \(21, 96\) of its "
             r"\(43, 96\) to old rank 1 of 2", "dp=3", (1, 2)),
    "width": (narrower, r"optimizer\.policy parameter 0's exp_avg is \(21, 95\); FSDP2 cuts \(21, 96\) of its "
              r"\(43, 96\) to old rank 1 of 2", "dp=3", (1, 2)),
    "missing": (lambda shard: shard.pop("module.policy"), r"it holds no module\.policy", "dp=3", (1, 2)),
    # (rank 1 reads old shards 0 and 1: shard 1 lacks what 0 holds; rank 2 reads shard 1 alone, where a parameter
    # without state may be one no shard stepped, an expert no token was routed to: its digest refuses it)
    "unstepped": (lambda shard: shard["optimizer.policy"]["state"].pop(0),
                  r"(?:its optimizer\.policy holds no state of parameter 0, but state of the others|its optimizer "
                  r"state is not the one its rank wrote \(its SHA-256 is not the manifest's\))", "dp=3", (1, 2)),
    "same-dp": (lambda shard: shard.pop("optimizer.policy"), r"it holds no optimizer\.policy", None, (1,)),
}  # fmt: skip


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resume_of_a_damaged_shard_ends_in_one_line_naming_it_and_the_older_checkpoint(
    tmp_path: Path, finished: Path, case: str
) -> None:
    change, said, split, ranks = CASES[case]
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    ckpt = run / "checkpoints" / "iter-2"
    relisted(ckpt, "ranks/rank-1.pt", change)
    before = files_of(run / "checkpoints")

    resplit = ["--trainer-split", split] if split else []
    proc = rlctl("launch", "--resume", str(run), "--iterations", "4", *resplit, timeout_s=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rlctl: error:")]
    # whichever rank that reads the shard fails first is named
    who = f"[{''.join(map(str, ranks))}]"
    where = f"trainer-{who} exited with 1 before the job's trainer joined \\(its log: [^)]*\\): rank {who}: "
    refused = f"{re.escape(str(ckpt))}: ranks/rank-1\\.pt: {said}"
    hint = (
        r"\(hint: the trainer cannot load checkpoint v2: continue from an older one, `rlctl launch --resume \S+ "
        r"--checkpoint V` \(V: 1 here; the newer ones are set aside\)\)"
    )
    assert len(errors) == 1 and re.fullmatch(f"rlctl: error: {where}{refused} {hint}", errors[0]), proc.stderr
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr, proc.stderr[-3000:]
    for rank in ranks:  # each rank that read the shard said so in its log, in one line
        log = (run / "logs" / f"trainer-{rank}.log").read_text()
        assert re.search(f"ERROR trainer-{rank} rlctl.agents: {refused}$", log, re.M), log[-2000:]
        assert "Traceback" not in log, log[-3000:]
    assert files_of(run / "checkpoints") == before  # nothing removed, moved or rewritten
