"""The torch trainer on CUDA: fp32 master weights, bf16 autocast, one GRPO step close to the CPU's fp32 step;
NCCL for CUDA tensors in the trainer's group; versions exported from GPU memory in the checkpoint's dtype."""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.devices import compute_for
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops.runstart import _free_port
from rlctl.rl.learner import make_learner
from rlctl.rl.samples import Sample
from rlctl.trainers.base import load_backend, wire_weights
from rlctl.weights import chunks


def samples(n: int = 16) -> list[Sample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(n):
        prompt = torch.randint(1, 500, (6,), generator=g).tolist()
        output = torch.randint(1, 500, (10 + i % 7,), generator=g).tolist()
        out.append(Sample(f"p{i // 4}", prompt, output, [-6.0] * len(output), float(i % 3), version=0))
    return out


def one_step(checkpoint: Path, kind: str) -> dict[str, torch.Tensor]:
    compute = compute_for(kind)
    backend = load_backend("torch", checkpoint, compute=compute)
    learner = make_learner(backend, GrpoAlgorithm(kind="grpo", lr=1e-3), Batch(samples_per_prompt=4), ref=None)
    for s in samples():
        learner.add(s)
    learner.step()
    assert all(p.dtype == torch.float32 and p.device.type == kind for p in backend.model.parameters())
    return {k: v.float().cpu() for k, v in backend.weights().items()}


def test_a_grpo_step_on_cuda_moves_the_weights_as_on_the_cpu(checkpoint: Path) -> None:
    """bf16 autocast vs fp32: the same update direction, over the whole model and tensor by tensor. AdamW's first
    step moves every element by about lr·sign(gradient), so a tensor whose gradient is at bf16's noise moves in a
    noisy direction: the key projections' biases, which shift every key of a query by nearly the same amount and
    barely change attention (cosine 0.77 on an H100, 2026-11-27), are left out of the per-tensor check."""
    start = TinyGPT.from_pretrained(checkpoint).state_dict()
    gpu, cpu = one_step(checkpoint, "cuda"), one_step(checkpoint, "cpu")
    assert update_cosine(start, gpu, cpu) > 0.98
    for name, w in start.items():
        if not name.endswith("k_proj.bias"):
            c = torch.nn.functional.cosine_similarity((gpu[name] - w).flatten(), (cpu[name] - w).flatten(), dim=0)
            assert c > 0.95, (name, float(c))


def update_cosine(start: dict[str, torch.Tensor], a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The cosine between two whole-model updates from `start`."""
    da = torch.cat([(a[k] - w).flatten() for k, w in start.items()])
    db = torch.cat([(b[k] - w).flatten() for k, w in start.items()])
    return float(torch.nn.functional.cosine_similarity(da, db, dim=0))


def test_fsdp2_on_one_cuda_rank_steps_as_the_whole_replica(checkpoint: Path) -> None:
    """FSDP2 with bf16 parameters and fp32 gradient reduction over NCCL (one rank: a GPU cannot hold two NCCL
    ranks) makes the whole replica's update, and its delta encoder reads its shards' rows on the device."""
    from rlctl.agents.trainer import init_group
    from rlctl.weights.encoder import DeviceEncoder

    start = TinyGPT.from_pretrained(checkpoint).state_dict()
    whole = one_step(checkpoint, "cuda")
    init_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=_free_port(), cuda=True)
    try:
        backend = load_backend("torch", checkpoint, compute=compute_for("cuda"), shard=True)
        learner = make_learner(backend, GrpoAlgorithm(kind="grpo", lr=1e-3), Batch(samples_per_prompt=4), ref=None)
        for s in samples():
            learner.add(s)
        learner.step()
        sharded = {k: v.float() for k, v in backend.wire_weights(dtype=torch.float32, tied=False).items()}
        assert update_cosine(start, sharded, whole) > 0.98
        wire = backend.wire_weights(dtype=torch.bfloat16, tied=True)
        enc = DeviceEncoder.for_shards(chunks.layout_of(wire), backend.tensors(), device=torch.device("cuda"))
        snap = enc.snapshot(backend.tensors())
        assert snap.device.type == "cuda"
        assert torch.equal(
            snap.cpu(), torch.cat([wire[s.name].reshape(-1).view(torch.uint8) for s in enc.layout.slots])
        )
    finally:
        dist.destroy_process_group()


def test_the_trainer_group_reduces_cuda_tensors_over_nccl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlctl.agents.trainer import init_group

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # this test's: not left set for the tests after it
    init_group(rank=0, world_size=1, master_addr="127.0.0.1", master_port=_free_port(), cuda=True)
    try:
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        box: list[object] = [("step", 3)]
        dist.broadcast_object_list(box, src=0)  # objects go over gloo
        assert t.sum().item() == 4 and box == [("step", 3)]
    finally:
        dist.destroy_process_group()


def test_versions_leave_gpu_memory_in_the_checkpoints_dtype(checkpoint: Path) -> None:
    backend = load_backend("torch", checkpoint, compute=compute_for("cuda"))
    sent = wire_weights(backend.weights(), dtype=torch.bfloat16, tied=True)
    assert "lm_head.weight" not in sent
    assert all(t.device.type == "cpu" and t.dtype == torch.bfloat16 for t in sent.values())
    kept = backend.wire_weights(dtype=torch.bfloat16, tied=True, on_device=True)  # the publisher's snapshot
    assert all(t.device.type == "cuda" and t.dtype == torch.bfloat16 for t in kept.values())
    layout = chunks.layout_of(sent)
    assert torch.equal(chunks.flatten(kept, layout), chunks.flatten(sent, layout))  # straight into the host buffer
