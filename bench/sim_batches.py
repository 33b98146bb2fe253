"""One generation stage: predicted vs measured time of real batches on the embedded CPU engine.

1. Measure PTL(BS) of the embedded engine on this machine (`rlctl profile --source measured`'s code).
2. For several batches (long-tailed lengths like the digits task, DESIGN §10), run the engine for real:
   every request is forced to its drawn length (`ignore_eos`), admitted longest-first (LPT) or FIFO,
   with continuous batching at a batch cap; time the whole batch.
3. Predict the same batch with `planner.sim.run_instance` from the measured profile; report the
   mean absolute percentage error (`mape`) over all cases. The machine is shared: a short PTL probe
   before and after each case shows how much slower it ran than when profiled (`machine_drift`).
One thread (one "GPU" slot of a local site = one core); times are the thread's CPU time, so other
work on this shared machine does not count (the engine computes in the calling thread).
`python -m bench sim-accuracy` reports this as its `engine_batches` part.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rlctl.errors import RlctlError
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.planner.costs import decode_cost
from rlctl.planner.curves import live_context
from rlctl.planner.dispatch import dispatch_skew, fixed_split, lpt_order
from rlctl.planner.sim import run_with, split_by_simulation
from rlctl.planner.workload import LengthModel
from rlctl.profiler.measure import embedded_engine_factory, measure_generation

PROMPT_TOKENS = 6


def _engine_factory() -> Any:
    try:
        import torch

        torch.set_num_threads(1)
        return embedded_engine_factory(BUILTIN_MODELS["tiny-demo"])
    except (ImportError, RlctlError) as e:
        raise RuntimeError(f"sim-accuracy needs the embedded engine (rlctl.engines.embedded) and torch: {e}") from e


def _run_batch(factory: Any, lengths: np.ndarray, *, cap: int, lpt: bool) -> float:
    from rlctl.engines.base import GenRequest

    engine = factory(cap)
    prompt = [1] + [3] * (PROMPT_TOKENS - 1)
    engine.add(
        [
            GenRequest(f"r{i}", prompt, int(n), priority=float(n) if lpt else 0.0, ignore_eos=True)
            for i, n in enumerate(lengths)
        ]
    )
    t0 = time.thread_time()
    engine.run_until_done()
    return time.thread_time() - t0


def run_batches(*, quick: bool) -> dict[str, Any]:
    factory = _engine_factory()
    entry = measure_generation(
        factory,
        contexts=[8, 48, 160],
        batch_sizes=[1, 2, 4, 8, 16, 32, 64, 128],
        kv_capacity_tokens=10**9,
        steps=6 if quick else 12,
        warmup_steps=2,
        clock=time.thread_time,
        padded_attention=True,
    )
    reference = entry.ptl_s[1][entry.batch_sizes.index(16)]  # PTL(16) at context 48, as profiled
    lm = LengthModel(median=30.0, sigma=0.8, cap=256, prompt_tokens=PROMPT_TOKENS)
    rng = np.random.default_rng(0)
    cases = []
    sizes = [64, 256] if quick else [64, 128, 256, 512]
    for n in sizes:
        for cap in (16, 64):
            for lpt in (True, False):
                lengths = lm.sample(n // 8, 8, rng)
                ctx = live_context(PROMPT_TOKENS, lengths, padded=True)
                cost = decode_cost(entry, context=ctx, seq_tokens=ctx, engine_max_batch=cap)
                order = lpt_order(lengths.tolist()) if lpt else list(range(n))
                predicted = float(run_with(cost, lengths[order], batch_cap=cap, prompt_tokens=PROMPT_TOKENS).max())
                before = _probe(factory)
                measured = _run_batch(factory, lengths, cap=cap, lpt=lpt)
                drift = (before + _probe(factory)) / 2 / reference
                cases.append(
                    {
                        "samples": n,
                        "batch_cap": cap,
                        "order": "lpt" if lpt else "fifo",
                        "tokens": int(lengths.sum()),
                        "predicted_s": predicted,
                        "measured_s": measured,
                        "error": (predicted - measured) / measured,
                        "machine_drift": drift,
                    }
                )
    split_cases = _split_cases(factory, entry, lm, rng, reference)
    mape = float(np.mean([abs(c["error"]) for c in cases + split_cases]))
    ptl_ms = dict(zip(entry.batch_sizes, (1e3 * x for x in entry.ptl_s[1]), strict=True))
    return {"mape": mape, "cases": cases, "dispatch_2_units": split_cases, "ptl_ms_at_ctx48": ptl_ms}


def _probe(factory: Any) -> float:
    """PTL(16) at context 48 right now: how fast this shared machine runs the engine at this moment."""
    e = measure_generation(
        factory,
        contexts=[48],
        batch_sizes=[16],
        kv_capacity_tokens=10**9,
        steps=8,
        warmup_steps=1,
        clock=time.thread_time,
    )
    return e.ptl_s[0][0]


def _split_cases(
    factory: Any, entry: Any, lm: LengthModel, rng: np.random.Generator, reference: float
) -> list[dict[str, Any]]:
    """DESIGN §10's check: 256 prompts on 2 units — no split vs the paper's split vs the simulator's choice.

    Each unit runs on its own (one engine after the other, each timed); the batch time is the slower unit.
    Predictions are the true lengths (oracle ranker), so only the cost model is under test.
    """
    lengths = lm.sample(32, 8, rng)
    pred = lengths.astype(float)
    ctx = live_context(PROMPT_TOKENS, lengths, padded=True)
    cost = decode_cost(entry, context=ctx, seq_tokens=ctx, engine_max_batch=64)
    chosen = split_by_simulation(pred, cost, 2, alpha=0.2, prompt_tokens=PROMPT_TOKENS, length_dist=lengths)
    plans = {
        "no split (LPT by tokens)": fixed_split(list(pred), num_units=2, num_long=0, long_batch=0, regular_batch=64),
        "paper split (top 20 % at batch 8)": fixed_split(
            list(pred), num_units=2, num_long=1, long_batch=8, regular_batch=64
        ),
        f"simulator's choice (N_l={chosen.num_long}, batch {chosen.long_batch})": chosen,
    }
    out = []
    for name, split in plans.items():
        groups = dispatch_skew(list(pred), split)
        caps = [split.long_batch] * split.num_long + [64] * split.num_regular
        before = _probe(factory)
        measured = max(_run_batch(factory, lengths[g], cap=c, lpt=True) for g, c in zip(groups, caps, strict=True))
        drift = (before + _probe(factory)) / 2 / reference
        predicted = max(
            float(run_with(cost, lengths[g], batch_cap=c, prompt_tokens=PROMPT_TOKENS).max())
            for g, c in zip(groups, caps, strict=True)
        )
        out.append(
            {
                "policy": name,
                "predicted_s": predicted,
                "measured_s": measured,
                "error": (predicted - measured) / measured,
                "machine_drift": drift,
            }
        )
    return out


def summary_batches(r: dict[str, Any]) -> str:
    lines = [
        f"{'samples':>7} {'cap':>4} {'order':>5} {'tokens':>7} {'predicted s':>11} {'measured s':>10} "
        f"{'error':>7} {'drift':>6}"
    ]
    for c in r["cases"]:
        lines.append(
            f"{c['samples']:>7} {c['batch_cap']:>4} {c['order']:>5} {c['tokens']:>7} "
            f"{c['predicted_s']:>11.3f} {c['measured_s']:>10.3f} {c['error']:>+7.1%} "
            f"{c['machine_drift']:>6.2f}"
        )
    lines.append("256 prompts on 2 units (DESIGN §10: the paper's split lost 43 % on this CPU):")
    for c in r["dispatch_2_units"]:
        lines.append(
            f"  {c['policy']:<45} predicted {c['predicted_s']:.3f} s, measured {c['measured_s']:.3f} s "
            f"({c['error']:+.1%}; drift {c['machine_drift']:.2f})"
        )
    ptl = " ".join(f"{bs}:{ms:.2f}" for bs, ms in r["ptl_ms_at_ctx48"].items())
    lines.append(
        f"MAPE {r['mape']:.1%}; drift = PTL(16) probed around a case / as profiled (1.00 = the machine "
        "ran as fast as when profiled; other work on this shared machine moves it)"
    )
    lines.append(f"measured PTL ms (BS:ms, ctx 48): {ptl}")
    return "\n".join(lines)
