"""The planner's activation price on CUDA (gpu-check's `actmem` piece, bench/gpu_actmem.py, at a small shape): the
torch trainer's GRPO step on a cut takes no more than 10 % past `actmem.activation_bytes` beyond what it held before
(its peak allocation), with and without activation checkpointing."""

from pathlib import Path

from bench.gpu_actmem import actmem_check


def test_a_cuts_step_takes_no_more_device_memory_than_the_planner_prices(checkpoint: Path) -> None:
    r = actmem_check(checkpoint, "cuda", cuts_of=((2, 256, False), (8, 256, False), (8, 256, True)))
    assert set(r["cuts"]) == {"2x256", "8x256", "8x256+ckpt"}
    assert all(c["measured_bytes"] > 0 for c in r["cuts"].values()), r["cuts"]
    assert r["failures"] == [], (r["failures"], r["cuts"])
