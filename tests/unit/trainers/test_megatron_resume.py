"""A trainer checkpoints the shards of its data-parallel replica 0 and resumes from them exactly: Megatron at
tp 2, at pp 2 (two gloo processes), at tp 2 × pp 2 and at pp 2 × dp 2 (four), and the torch backend at dp 2;
PPO on Megatron at tp 2 and pp 2, whose shards hold the critic (this rank's part of its trunk, and its head) and
both optimizers. The ranks train two iterations, checkpoint (rank 0 the gathered HF policy and its shard,
replica 0's other ranks theirs, told through the learner's broadcasts; the other replicas write nothing), then a
third → W_a; fresh ranks restore the checkpoint (the HF policy through the backend, each the shard of its
(tp, pp) position: optimizers, modules, RNG) and train that same third iteration → W_b. W_a and W_b are equal
bit for bit, and so is every rank's optimizer state (and PPO's critic), which is the same on every replica of a
position; a flipped bit in a shard, or a split the ranks cannot rebuild their state at (sharded by FSDP at pp > 1; PPO's
critic at another tp × pp), is refused naming the checkpoint (and the rank that wrote the shard) on rank 0 and on
the ranks that read it. Resuming at another split: test_megatron_resplit.py."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.tinygpt import TinyGPT
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.trainers.megatron_required import require_megatron
from tests.unit.trainers.ranks import spawn_ranks
from tests.unit.trainers.test_megatron_backend import rollouts

pytest.importorskip("transformers")
RANK = Path(__file__).with_name("megatron_resume_rank.py")


def run_phase(tmp_path: Path, phase: str, *, backend: str, algorithm: str, tp: int, pp: int, dp: int) -> list[dict]:
    world = tp * pp * dp
    procs = spawn_ranks(
        RANK, world=world, tp=tp, pp=pp, rendezvous=tmp_path / f"{phase}.rendezvous",
        out=lambda r: tmp_path / f"{phase}-{r}.pt", checkpoints=[tmp_path / "model"],
        extra=(backend, algorithm, phase, str(tmp_path / "samples.pt"), str(tmp_path / "job")),
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


def equal_optimizers(a: dict, b: dict) -> bool:
    """Every optimizer of two ranks' results (the policy's; PPO's critic's too) holds the same state."""
    return sorted(a) == sorted(b) and all(equal_state(a[k], b[k]) for k in a)


def equal_modules(a: dict, b: dict) -> bool:
    """The learners' other modules (PPO's critic) hold the same tensors, bit for bit."""
    return sorted(a) == sorted(b) and all(
        sorted(a[k]) == sorted(b[k]) and all(torch.equal(v, b[k][n]) for n, v in a[k].items()) for k in a
    )


def same_rng(a: dict, b: dict) -> bool:
    return torch.equal(a["torch"], b["torch"]) and (a["python"], a["numpy"]) == (b["python"], b["numpy"])


@pytest.mark.timeout(400)
def model_and_samples(tmp_path: Path, variant: str = "llama-bias-tied") -> None:
    """The tests' model (`tmp_path/model`: tied and vocab-parallel at both ends, 2 layers) and three batches of its
    rollouts (`tmp_path/samples.pt`) that `run_phase` trains on."""
    write_checkpoint(variant, tmp_path / "model")
    model = TinyGPT.from_pretrained(tmp_path / "model")
    torch.save([copy.deepcopy(rollouts(model, prompts=3, group=4, seed=i)) for i in range(3)], tmp_path / "samples.pt")


@pytest.mark.parametrize(
    "backend,algorithm,tp,pp,dp",
    [
        ("megatron", "grpo", 2, 1, 1),
        ("megatron", "grpo", 1, 2, 1),
        ("megatron", "grpo", 2, 2, 1),
        ("megatron", "grpo", 1, 2, 2),
        ("torch", "grpo", 1, 1, 2),
        ("megatron", "ppo", 2, 1, 1),
        ("megatron", "ppo", 1, 2, 1),
    ],
    ids=["tp2", "pp2", "tp2-pp2", "pp2-dp2", "torch-dp2", "ppo-tp2", "ppo-pp2"],
)
def test_a_resumed_sharded_trainer_trains_on_bit_for_bit(
    tmp_path: Path, backend: str, algorithm: str, tp: int, pp: int, dp: int
) -> None:
    if backend == "megatron":
        require_megatron()
    model_and_samples(tmp_path)

    ran = run_phase(tmp_path, "run", backend=backend, algorithm=algorithm, tp=tp, pp=pp, dp=dp)
    ckpt = tmp_path / "job" / "iter-2"
    manifest = json.loads((ckpt / "MANIFEST.trainer.json").read_text())
    # replica 0 writes: its ranks in megatron's order (tp fastest, then dp, then pp); pp 2 × dp 2: ranks 0 and 2
    writers = ParallelConfig("trainer", tp=tp, pp=pp, dp=dp).first_replica_ranks()
    assert writers == {(1, 2, 2): [0, 2], (1, 1, 2): [0]}.get((tp, pp, dp), list(range(tp * pp)))
    shards = [f"ranks/rank-{r}.pt" for r in writers]
    assert manifest["split"] == {"tp": tp, "pp": pp, "dp": dp, "world": tp * pp * dp}
    assert [r["file"] for r in manifest["ranks"]] == shards and set(shards) <= set(manifest["files"])
    assert sorted(f"ranks/{p.name}" for p in (ckpt / "ranks").iterdir()) == sorted(shards)  # nothing else written
    # each shard is restored by the ranks of its position, one per replica (megatron's data-parallel group)
    restored_by = {r["rank"]: r["restored_by"] for r in manifest["ranks"]}
    assert restored_by == {w: [w + tp * d for d in range(dp)] for w in writers}
    assert len({r["optimizer_sha256"] for r in manifest["ranks"]}) == tp * pp  # a shard per position
    peer = {r: w for w, ranks in restored_by.items() for r in ranks}
    for rank, a in enumerate(ran):  # the premise: every replica of a position holds the same AdamW state
        assert equal_optimizers(a["optimizer"], ran[peer[rank]]["optimizer"]), rank
        assert equal_modules(a["modules"], ran[peer[rank]]["modules"]), rank
    damaged = tmp_path / "job" / "iter-2-damaged"
    shutil.copytree(ckpt, damaged)
    bad = writers[-1]
    shard = damaged / "ranks" / f"rank-{bad}.pt"
    body = bytearray(shard.read_bytes())
    body[len(body) // 2] ^= 1  # one bit of that rank's optimizer state
    shard.write_bytes(bytes(body))

    resumed = run_phase(tmp_path, "resume", backend=backend, algorithm=algorithm, tp=tp, pp=pp, dp=dp)
    for rank, (a, b) in enumerate(zip(ran, resumed, strict=True)):
        assert b["counters"] == {"version": 2}
        *damaged_errors, split_error = b["errors"]
        # rank 0 verifies every shard, the ranks that restore the damaged one verify it: each names the checkpoint
        # and the rank that wrote it (the others do not read it; their trainer would stop with rank 0's)
        assert len(damaged_errors) == (rank in {0, *restored_by[bad]}), b["errors"]
        for e in damaged_errors:
            assert e.startswith(f"{damaged}: rank {bad}'s shard is not usable: ranks/rank-{bad}.pt does not match")
        want = f"{ckpt}: written by a trainer at tp {tp} pp {pp} dp {dp}, which this trainer"
        assert split_error.startswith(want), split_error
        why = (
            "sharded state is rebuilt at another dp alone"
            if algorithm == "grpo"
            else "critic's state at another tp × pp is not built"
        )
        assert why in split_error, split_error
        assert same_rng(b["rng"], resumed[peer[rank]]["rng"]), rank  # replica 0's RNG at this position
        assert list(a["weights"]) == list(b["weights"])
        different = [k for k in a["weights"] if not torch.equal(a["weights"][k], b["weights"][k])]
        assert different == [], (rank, different)  # W_a == W_b, bit for bit
        assert equal_optimizers(a["optimizer"], b["optimizer"]), rank  # and this rank's AdamW moments
        assert sorted(a["optimizer"]) == (["critic", "policy"] if algorithm == "ppo" else ["policy"])
        assert equal_modules(a["modules"], b["modules"]), rank  # and PPO's critic
    start = TinyGPT.from_pretrained(tmp_path / "model").state_dict()
    assert not all(torch.equal(ran[0]["weights"][k], start[k]) for k in start)  # the iterations moved it
