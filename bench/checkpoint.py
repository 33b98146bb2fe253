"""What a checkpoint costs the training loop: written in the training thread (as before) or snapshotted into
host memory and written beside training (`rlctl.checkpoint.background`), as the trainer agent does now.

Models: the hf-demo trainer's policy (jobs/hf-demo/build.py's "tiny" shape, fp32 with AdamW's moments) and a
larger TinyGPT (≈ 40M parameters, ≈ 480 MB of checkpoint; skipped with --quick). Per model, in the same run:

- `sync_s`: `save_trainer` (the shard, the HF policy, the manifest, each file fsynced and hashed) in the
  training thread — what a checkpoint blocked training before;
- `blocked_s`: the training thread's time for the same checkpoint written in the background: the host copies
  (`HostPolicy`, `snapshot_trainer`) and handing the write to the writer thread;
- `blocked_over_sync` = blocked_s / sync_s (the issue's goal: ≤ 0.10), medians of `repeats` checkpoints;
- `background_write_s`: the background write itself, timed on the writer's thread (median of `repeats`);
- `step_s_while_writing` / `step_s`: a training step (forward, backward, AdamW) that started and ended inside a
  write, and as many steps right after it, alone, repeat by repeat (so both see the same load on this shared
  machine); `step_slowdown_while_writing` = their ratio, what training still pays while the writer competes for
  the cores (reported, not hidden). A step that straddles either end of the write counts in neither; None where
  no step fitted inside a write. Training runs on one thread (`torch.set_num_threads(1)`): on 2 shared cores
  torch's default of one thread a core made the steps' times swing with every other job's load;
- `restored_exact`: the background checkpoint restores the optimizer state of its snapshot (digest), not the
  state of the steps taken while it was written.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlctl.checkpoint.background import BackgroundWriter
from rlctl.checkpoint.trainer import HostPolicy, load_trainer, optimizer_digest, save_trainer, snapshot_trainer
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.hf import QWEN2
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.trainers.base import DataParallel

ONE = ParallelConfig("trainer")
ALONE = DataParallel()


def _configs(quick: bool) -> dict[str, TinyGPTConfig]:
    # jobs/hf-demo/build.py SHAPES["tiny"] (a Qwen2 layout), at the demo tokenizer's vocabulary
    out = {"hf_demo": TinyGPTConfig(max_position_embeddings=256, tie_word_embeddings=True, architecture=QWEN2)}
    if not quick:
        out["tinygpt_40m"] = TinyGPTConfig(
            vocab_size=8192,
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=10,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            architecture=QWEN2,
        )
    return out


def _step(model: TinyGPT, opt: torch.optim.Optimizer, g: torch.Generator) -> tuple[float, float]:
    """One training step; its start and end (perf_counter)."""
    t0 = time.perf_counter()
    x = torch.randint(0, model.config.vocab_size, (4, 64), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return t0, time.perf_counter()


def _timed(write: Callable[[], object]) -> tuple[Callable[[], None], list[float]]:
    """`write`, and the list its run appends its start and end to (perf_counter, on the writer's thread: the
    training thread sees the write end only at its next check, after a whole step)."""
    span: list[float] = []

    def run() -> None:
        span.append(time.perf_counter())
        try:
            write()
        finally:
            span.append(time.perf_counter())

    return run, span


def _inside(steps: list[tuple[float, float]], start: float, end: float) -> list[float]:
    """The durations of the steps that started and ended within [start, end]: beside the write all along."""
    return [t1 - t0 for t0, t1 in steps if start <= t0 and t1 <= end]


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def _case(cfg: TinyGPTConfig, root: Path, *, repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):  # AdamW's moments exist, the allocator warm
        _step(model, opt, g)
    sync_s, blocked_s, written_s = [], [], []
    while_writing: list[float] = []
    alone: list[float] = []
    restored_exact = True
    writer = BackgroundWriter()
    for r in range(repeats):
        t0 = time.perf_counter()
        save_trainer(
            root / f"sync-{r}" / "iter-1",
            model=model,
            optimizers={"policy": opt},
            counters={"version": 1},
            split=ONE,
            data_parallel=ALONE,
        )
        sync_s.append(time.perf_counter() - t0)

        digest = optimizer_digest({"policy": opt})  # the state the snapshot below holds
        t0 = time.perf_counter()
        write = snapshot_trainer(
            root / f"background-{r}" / "iter-1",
            model=HostPolicy(model.state_dict(), cfg),
            optimizers={"policy": opt},
            counters={"version": 1},
            split=ONE,
            data_parallel=ALONE,
        )
        timed, span = _timed(write)
        writer.submit(timed)
        blocked_s.append(time.perf_counter() - t0)
        steps = []
        while writer.busy():  # training goes on while the write runs
            steps.append(_step(model, opt, g))
        writer.wait()
        start, end = span
        written_s.append(end - start)
        inside = _inside(steps, start, end)
        while_writing += inside
        alone += [t1 - t0 for t0, t1 in (_step(model, opt, g) for _ in inside)]  # as many, with no write
        other = TinyGPT(cfg)
        other_opt = torch.optim.AdamW(other.parameters(), lr=1e-4)
        load_trainer(
            root / f"background-{r}" / "iter-1",
            model=other,
            optimizers={"policy": other_opt},
            split=ONE,
            data_parallel=ALONE,
            version=1,
        )
        restored_exact &= optimizer_digest({"policy": other_opt}) == digest
    params = sum(p.numel() for p in model.parameters())
    sync, blocked = statistics.median(sync_s), statistics.median(blocked_s)
    step, step_writing = _median(alone), _median(while_writing)
    return {
        "params": params,
        "checkpoint_bytes": sum(f.stat().st_size for f in (root / "sync-0").rglob("*") if f.is_file()),
        "sync_s": round(sync, 4),
        "blocked_s": round(blocked, 4),
        "blocked_over_sync": round(blocked / sync, 4),
        "background_write_s": round(statistics.median(written_s), 4),
        "step_s": step,
        "step_s_while_writing": step_writing,
        "step_slowdown_while_writing": round(step_writing / step, 3) if step and step_writing else None,
        "steps_while_writing": len(while_writing),
        "restored_exact": restored_exact,
        "sync_s_all": [round(x, 4) for x in sync_s],
        "blocked_s_all": [round(x, 4) for x in blocked_s],
        "background_write_s_all": [round(x, 4) for x in written_s],
    }


def run(*, quick: bool) -> dict[str, Any]:
    repeats = 3 if quick else 5
    cases = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, cfg in _configs(quick).items():
            with tempfile.TemporaryDirectory(prefix="rlctl-bench-ckpt-") as d:
                cases[name] = _case(cfg, Path(d), repeats=repeats)
    finally:
        torch.set_num_threads(threads)
    return {
        "repeats": repeats,
        "threads": 1,
        "cases": cases,
        "blocked_over_sync": max(c["blocked_over_sync"] for c in cases.values()),
        "goal_blocked_over_sync": 0.10,
    }


def summary(result: dict[str, Any]) -> str:
    lines = []
    for name, c in result["cases"].items():
        lines.append(
            f"{name}: {c['params'] / 1e6:.1f}M params, {c['checkpoint_bytes'] / 1e6:.1f} MB; sync {c['sync_s']:.3f} s, "
            f"background blocks {c['blocked_s']:.4f} s ({c['blocked_over_sync']:.3f} of sync; write "
            f"{c['background_write_s']:.3f} s beside training); step {c['step_s']} s alone, "
            f"{c['step_s_while_writing']} s while writing ({c['steps_while_writing']} steps inside the writes, "
            f"× {c['step_slowdown_while_writing']}); restored exactly: {c['restored_exact']}"
        )
    lines.append(f"worst blocked/sync {result['blocked_over_sync']} (goal ≤ {result['goal_blocked_over_sync']})")
    return "\n".join(lines)
