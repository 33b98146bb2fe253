"""A Megatron trainer at tp 2, at pp 2 (two gloo processes) and at tp 2 × pp 2 (four) checkpoints every rank's
optimizer shard and resumes from it exactly: the ranks train two GRPO iterations, checkpoint (rank 0 the
gathered HF policy and its shard, the others theirs, told through the learner's broadcasts), then a third →
W_a; fresh ranks restore the checkpoint (the HF policy through the backend, each its own optimizer shard and
RNG) and train that same third iteration → W_b. W_a and W_b are equal bit for bit, and so is every rank's
AdamW state; a flipped bit in one rank's shard, or another split, is refused naming the checkpoint (and the
rank)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from rlctl.engines.model import TinyGPT
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.trainers.megatron_required import require_megatron
from tests.unit.trainers.ranks import spawn_ranks
from tests.unit.trainers.test_megatron_backend import rollouts

pytest.importorskip("transformers")
RANK = Path(__file__).with_name("megatron_resume_rank.py")


def run_phase(tmp_path: Path, phase: str, *, tp: int, pp: int) -> list[dict]:
    world = tp * pp
    procs = spawn_ranks(
        RANK, world=world, tp=tp, pp=pp, rendezvous=tmp_path / f"{phase}.rendezvous",
        out=lambda r: tmp_path / f"{phase}-{r}.pt", checkpoints=[tmp_path / "model"],
        extra=(phase, str(tmp_path / "samples.pt"), str(tmp_path / "job")),
    )  # fmt: skip
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, "\n".join(e[-3000:] for e in errors)
    return [torch.load(tmp_path / f"{phase}-{r}.pt", weights_only=False) for r in range(world)]


def equal_state(a: dict, b: dict) -> bool:
    """Two optimizer state_dicts hold the same hyper-parameters and the same tensors, bit for bit."""
    if a["param_groups"] != b["param_groups"] or sorted(a["state"]) != sorted(b["state"]):
        return False
    return all(
        sorted(a["state"][i]) == sorted(b["state"][i]) and all(torch.equal(v, b["state"][i][k]) for k, v in st.items())
        for i, st in a["state"].items()
    )


@pytest.mark.timeout(400)
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)], ids=["tp2", "pp2", "tp2-pp2"])
def test_a_resumed_model_parallel_trainer_trains_on_bit_for_bit(tmp_path: Path, tp: int, pp: int) -> None:
    require_megatron()
    write_checkpoint("llama-bias-tied", tmp_path / "model")  # tied and vocab-parallel at both ends; 2 layers
    model = TinyGPT.from_pretrained(tmp_path / "model")
    torch.save([copy.deepcopy(rollouts(model, prompts=3, group=4, seed=i)) for i in range(3)], tmp_path / "samples.pt")

    ran = run_phase(tmp_path, "run", tp=tp, pp=pp)
    ckpt = tmp_path / "job" / "iter-2"
    manifest = json.loads((ckpt / "MANIFEST.trainer.json").read_text())
    shards = [f"ranks/rank-{r}.pt" for r in range(tp * pp)]
    assert manifest["split"] == {"tp": tp, "pp": pp, "dp": 1, "world": tp * pp}
    assert [r["file"] for r in manifest["ranks"]] == shards and set(shards) <= set(manifest["files"])
    assert len({r["optimizer_sha256"] for r in manifest["ranks"]}) == tp * pp  # a shard each
    damaged = tmp_path / "job" / "iter-2-damaged"
    shutil.copytree(ckpt, damaged)
    shard = damaged / "ranks" / "rank-1.pt"
    body = bytearray(shard.read_bytes())
    body[len(body) // 2] ^= 1  # one bit of rank 1's optimizer state
    shard.write_bytes(bytes(body))

    resumed = run_phase(tmp_path, "resume", tp=tp, pp=pp)
    for rank, (a, b) in enumerate(zip(ran, resumed, strict=True)):
        assert b["counters"] == {"version": 2}
        *damaged_errors, split_error = b["errors"]
        # rank 0 verifies every rank's shard, rank 1 its own: both name the checkpoint and rank 1 (ranks 2 and 3
        # do not read it; their trainer would stop with rank 0's)
        assert len(damaged_errors) == (rank in (0, 1)), b["errors"]
        for e in damaged_errors:
            assert e.startswith(f"{damaged}: rank 1's shard is not usable: ranks/rank-1.pt does not match")
        assert split_error.startswith(f"{ckpt}: written by a trainer at tp {tp} pp {pp} dp 1, which this trainer")
        assert list(a["weights"]) == list(b["weights"])
        different = [k for k in a["weights"] if not torch.equal(a["weights"][k], b["weights"][k])]
        assert different == [], (rank, different)  # W_a == W_b, bit for bit
        assert equal_state(a["optimizer"], b["optimizer"]), rank  # and this rank's AdamW moments
    start = TinyGPT.from_pretrained(tmp_path / "model").state_dict()
    assert not all(torch.equal(ran[0]["weights"][k], start[k]) for k in start)  # the iterations moved it
