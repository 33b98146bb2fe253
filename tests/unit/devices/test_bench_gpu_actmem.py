"""gpu-check's `actmem` piece (bench/gpu_actmem.py) in its CPU form: the trainer's GRPO learner, one step a cut on a
small model under bf16 autocast, the bytes its forward saves for backward against the planner's `saved_bytes`, and
the verdict that fails a cut over its price by more than 10 % (on CUDA the step's peak allocation is held to
`activation_bytes` by the same verdict: tests/gpu/test_gpu_actmem.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import rlctl.profiler.actmem as actmem
from bench.gpu_actmem import actmem_check, verdict
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

# GQA and q/k/v biases: a small Qwen2. Untied: with its embedding tied, lm_head's bf16 autocast copy (vocab × hidden ×
# 2 B) is kept but not priced (`actmem._matmul_params` leaves the embedding out, tied or not: 57,600 B short here)
CFG = TinyGPTConfig(
    architecture="Qwen2ForCausalLM",
    vocab_size=300,
    hidden_size=96,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    max_position_embeddings=128,
)
CUTS = ((2, 40, False), (6, 40, False), (6, 40, True))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    TinyGPT(CFG).save_pretrained(d, dtype=torch.bfloat16)
    return d


def test_the_learners_step_saves_what_the_planner_prices(checkpoint: Path) -> None:
    r = actmem_check(checkpoint, "cpu", cuts_of=CUTS)
    assert set(r["cuts"]) == {"2x40", "6x40", "6x40+ckpt"} and r["failures"] == r["loose"] == []
    for key, c in r["cuts"].items():
        assert c["measured_bytes"] == pytest.approx(c["priced_bytes"], rel=0.02), key
    # a figure that grows with the cut (1.4 to 3.4 MB; the weights' bf16 copies ≈ 0.4 MB of each), and that
    # checkpointing cuts to a quarter
    assert 2.0 < r["cuts"]["6x40"]["measured_bytes"] / r["cuts"]["2x40"]["measured_bytes"] < 3.0
    assert r["cuts"]["6x40+ckpt"]["measured_bytes"] < 0.3 * r["cuts"]["6x40"]["measured_bytes"]


def test_a_price_short_of_the_steps_bytes_fails_the_piece(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner pricing 20 % short: every cut fails, where 5 % short passes (within the 10 % allowed)."""
    real = actmem.saved_bytes
    for short, failing in ((0.8, 3), (0.95, 0)):
        monkeypatch.setattr(actmem, "saved_bytes", lambda *a, short=short, **k: short * real(*a, **k))
        r = actmem_check(checkpoint, "cpu", cuts_of=CUTS)
        assert len(r["failures"]) == failing, r["failures"]
    assert r["loose"] == []


def test_the_verdict_fails_over_10_percent_and_reports_over_1_5_times() -> None:
    cuts = {
        "ok": {"measured_bytes": 109, "priced_bytes": 100, "ratio": 1.09},
        "over": {"measured_bytes": 111, "priced_bytes": 100, "ratio": 1.11},
        "loose": {"measured_bytes": 60, "priced_bytes": 100, "ratio": 0.6},
        "fair": {"measured_bytes": 70, "priced_bytes": 100, "ratio": 0.7},
        "skipped": {"priced_bytes": 100, "skipped": "over 0.9 of the device"},
        "oom": {"priced_bytes": 100, "rank_priced_bytes": 10**9, "out_of_memory": "CUDA out of memory"},
    }
    v = verdict(cuts)
    assert [f.split(":")[0] for f in v["failures"]] == ["cut over", "cut oom"]
    assert [f.split(":")[0] for f in v["loose"]] == ["cut loose"]


def fake_device(monkeypatch: pytest.MonkeyPatch, *, free: int, before: int, peak: int) -> None:
    """torch.cuda's allocator readings for a CPU learner: `free` bytes on the device and 0.5 MB this process's
    allocator holds unused, `before` allocated, `peak` the most."""
    for name, fn in {
        "mem_get_info": lambda: (free, 80 * 10**9),
        "memory_reserved": lambda: before + 500_000,
        "synchronize": lambda: None,
        "reset_peak_memory_stats": lambda: None,
        "memory_allocated": lambda: before,
        "max_memory_allocated": lambda: peak,
    }.items():
        monkeypatch.setattr(torch.cuda, name, fn)


@pytest.mark.parametrize(("peak_over", "fails"), [(1_000_000, False), (10_000_000, True), (None, True)])
def test_on_cuda_a_cut_is_its_steps_peak_less_what_was_held_before(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, peak_over: int | None, fails: bool
) -> None:
    """The CUDA form's bookkeeping, the allocator's readings faked on a CPU learner: measured is the peak less what
    was allocated before the step, the gradients made by then (as a step's later cuts hold them); a cut far over its
    price (≈ 1.4 MB here), or one the device ran out of memory on (`peak_over` None), fails; one priced past 90 % of
    the device's free memory is skipped, not run."""
    from bench.gpu_actmem import _learner, _peak

    backend, learner = _learner(checkpoint, "cpu", rows=2, checkpointing=False)
    real_step, grads_held = learner.step, []

    def step() -> dict[str, float]:
        grads_held.append(all(p.grad is not None for p in backend.model.parameters()))
        if peak_over is None:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step()

    learner.step = step
    fake_device(monkeypatch, free=10**12, before=10**9, peak=10**9 + (peak_over or 0))
    c = _peak(checkpoint, backend, learner, rows=2, row_tokens=40, ckpt=False)
    assert grads_held == [True] and c["tokens"] == 80 and 1e6 < c["priced_bytes"] < 2e6
    if peak_over is None:
        assert "out of memory" in c["out_of_memory"] and c["rank_priced_bytes"] > c["priced_bytes"]
    else:
        held = (c["measured_bytes"], c["held_before_bytes"], c["rank_peak_bytes"])
        assert held == (peak_over, 10**9, 10**9 + peak_over)
    assert bool(verdict({"c": c})["failures"]) == fails
    fake_device(monkeypatch, free=1_000_000, before=10**9, peak=0)  # 1.5 MB in all: 0.9 of it is under the price
    c = _peak(checkpoint, backend, learner, rows=2, row_tokens=40, ckpt=False)
    assert c["skipped"] == f"priced {c['priced_bytes'] / 1e9:.3f} GB, over 0.9 of the 0.002 GB free"
    assert len(grads_held) == 1  # (not run)
