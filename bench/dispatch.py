"""dispatch: real generation on the embedded engine, 2 rollout units — random vs skew-aware vs oracle.

For each batch of prompts (the demo task, SFT-warmed tiny model, temperature 1, max batch 64):

    random      random equal split over the 2 units, FIFO admission inside each unit
    skew_aware  the length ranker's predictions: LPT across units by predicted tokens
                (rlctl.planner.dispatch.assign_balanced) and longest-predicted-first admission
    oracle      the same with the true generated lengths

Each unit is a fresh EmbeddedEngine run to completion on one thread; units run one after the other
and a batch's generation time is the makespan = max over its units. Sampling is batch-invariant
(noise hashed from request id and position), so every schedule generates exactly the same tokens
(`length_mismatches` checks it) and only the schedule differs. The ranker is bootstrapped on a
separate run and refit online after every batch.

Two clocks, because the dev machines are shared (2 cores, several people):
  measured   each unit's CPU time (`time.process_time`; one thread, so on a core of its own this is
             its wall time), min over `timing_repeats` runs interleaved across the schedules;
  step_model the engine's real step trace (rows computed at every decode step, finished rows
             included until compaction) priced with PTL(BS) measured once at the start (CPU time,
             context 32) — one price list for every schedule, so contention cannot favour one of them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from rlctl.engines.base import GenRequest, GenResult
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.tinygpt import TinyGPT
from rlctl.planner.dispatch import assign_balanced
from rlctl.profiler.measure import measure_generation
from rlctl.rl.ranker import LengthRanker, recall_at
from rlctl.rl.sft import DEMO_STEPS, warmup
from rlctl.rl.tasks import VOCAB_SIZE, DigitsTask, Prompt

NUM_UNITS = 2
MAX_BATCH = 64
FRACS = (0.2, 0.1, 0.05)
PTL_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
SCHEDULES = ("random", "skew_aware", "oracle")
# Below this oracle gain (1 − oracle / random) the gain is within the measurement's noise (the oracle's two units, of
# equal tokens, measured 2.6 % and 13 % apart in two quick runs) and a fraction of it could be any number: None.
ORACLE_GAIN_FLOOR = 0.03


def _generate(
    model: TinyGPT, task: DigitsTask, prompts: list[Prompt], priority: list[float], trace: list[int] | None = None
) -> list[GenResult]:
    engine = EmbeddedEngine(model, max_batch_size=MAX_BATCH, temperature=1.0, seed=0)
    engine.trace = trace
    engine.add(
        [
            GenRequest(p.prompt_id, p.tokens, task.max_new_tokens, priority=pr)
            for p, pr in zip(prompts, priority, strict=True)
        ]
    )
    return engine.run_until_done()


def _gain(base: float, other: float) -> float:
    return round(1 - other / base, 3)


def _fraction(times: dict[str, float]) -> float | None:
    """The skew-aware schedule's share of the oracle's gain; None when the oracle gains less than the floor."""
    gain = times["random"] - times["oracle"]
    if gain < ORACLE_GAIN_FLOOR * times["random"]:
        return None
    return round((times["random"] - times["skew_aware"]) / gain, 3)


def _run_batch(
    model: TinyGPT,
    task: DigitsTask,
    prompts: list[Prompt],
    ranker: LengthRanker,
    rng: np.random.Generator,
    repeats: int,
    ptl: dict[int, float],
) -> tuple[dict[str, Any], list[float], list[float]]:
    n = len(prompts)
    perm = rng.permutation(n).tolist()
    half = n // NUM_UNITS
    random_units = [
        perm[u * half : (u + 1) * half] if u < NUM_UNITS - 1 else perm[u * half :] for u in range(NUM_UNITS)
    ]
    # The random run reveals the true lengths the oracle needs; it is repeated below with the others.
    true_len: dict[str, int] = {}
    for idx in random_units:
        ps = [prompts[i] for i in idx]
        true_len.update({r.request_id: len(r.output_tokens) for r in _generate(model, task, ps, [0.0] * len(ps))})
    true = [float(true_len[p.prompt_id]) for p in prompts]
    pred = ranker.predict(prompts).tolist()
    plans = {
        "random": (random_units, [0.0] * n),
        "skew_aware": (assign_balanced(pred, NUM_UNITS), pred),
        "oracle": (assign_balanced(true, NUM_UNITS), true),
    }
    cpu = {s: [float("inf")] * NUM_UNITS for s in SCHEDULES}
    wall = {s: [float("inf")] * NUM_UNITS for s in SCHEDULES}
    model_s = {s: [0.0] * NUM_UNITS for s in SCHEDULES}
    mismatches = 0
    bs, price = np.array(sorted(ptl)), np.array([ptl[b] for b in sorted(ptl)])
    for _ in range(repeats):
        for name in SCHEDULES:
            units, key = plans[name]
            for u, idx in enumerate(units):
                trace: list[int] = []
                c0, w0 = time.process_time(), time.perf_counter()
                res = _generate(model, task, [prompts[i] for i in idx], [key[i] for i in idx], trace)
                cpu[name][u] = min(cpu[name][u], time.process_time() - c0)
                wall[name][u] = min(wall[name][u], time.perf_counter() - w0)
                model_s[name][u] = float(np.interp(trace, bs, price).sum())
                mismatches += sum(len(r.output_tokens) != true_len[r.request_id] for r in res)
    row = {
        "measured_s": {s: max(cpu[s]) for s in SCHEDULES},
        "step_model_s": {s: max(model_s[s]) for s in SCHEDULES},
        "wall_s": {s: max(wall[s]) for s in SCHEDULES},
        "units_measured_s": cpu,
        "units_step_model_s": model_s,
        "unit_tokens": {s: [int(sum(true[i] for i in u)) for u in plans[s][0]] for s in SCHEDULES},
        "tokens": int(sum(true)),
        "recall": {str(f): recall_at(pred, true, f) for f in FRACS},
        "length_mismatches": mismatches,
    }
    return row, pred, true


def run(*, quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    task = DigitsTask()
    sft_steps = 150 if quick else DEMO_STEPS
    model = TinyGPT()
    model.load_state_dict(warmup(task, steps=sft_steps, seed=0))
    # each unit gets 2 × its max batch in both: with one batch a unit admits everything at once, and neither the
    # split by tokens nor the admission order can change its makespan (quick measured an oracle gain of 0.9 %)
    num_prompts, batches, bootstrap, repeats = (256, 1, 128, 1) if quick else (256, 3, 512, 3)
    rng = np.random.default_rng(0)

    def factory(bs: int) -> EmbeddedEngine:
        return EmbeddedEngine(model, max_batch_size=bs, temperature=1.0, seed=0)

    entry = measure_generation(
        factory,
        contexts=[32],
        batch_sizes=PTL_BATCH_SIZES,
        kv_capacity_tokens=10**9,
        steps=10 if quick else 40,
        clock=time.process_time,
    )
    ptl = dict(zip(PTL_BATCH_SIZES, entry.ptl_s[0], strict=True))

    boot = task.prompts(1_000_000, bootstrap)
    boot_len = {r.request_id: len(r.output_tokens) for r in _generate(model, task, boot, [0.0] * len(boot))}
    ranker = LengthRanker(VOCAB_SIZE).fit(boot, [boot_len[p.prompt_id] for p in boot])

    rows, all_pred, all_true, all_target = [], [], [], []
    for b in range(batches):
        prompts = task.prompts(2_000_000 + b * num_prompts, num_prompts)
        row, pred, true = _run_batch(model, task, prompts, ranker, rng, repeats, ptl)
        rows.append(row)
        all_pred += pred
        all_true += true
        all_target += [float(p.target_tokens) for p in prompts]
        ranker.update(prompts, true)  # online refit, as the controller does between iterations

    measured = {s: float(np.mean([r["measured_s"][s] for r in rows])) for s in SCHEDULES}
    modelled = {s: float(np.mean([r["step_model_s"][s] for r in rows])) for s in SCHEDULES}
    return {
        "random_s": round(measured["random"], 4),
        "skew_aware_s": round(measured["skew_aware"], 4),
        "oracle_s": round(measured["oracle"], 4),
        "fraction_of_oracle_gain": _fraction(measured),
        "oracle_gain_floor": ORACLE_GAIN_FLOOR,
        "skew_aware_gain": _gain(measured["random"], measured["skew_aware"]),
        "oracle_gain": _gain(measured["random"], measured["oracle"]),
        "step_model": {
            **{f"{s}_s": round(v, 4) for s, v in modelled.items()},
            "fraction_of_oracle_gain": _fraction(modelled),
            "skew_aware_gain": _gain(modelled["random"], modelled["skew_aware"]),
            "oracle_gain": _gain(modelled["random"], modelled["oracle"]),
        },
        "ranker_recall": {str(f): round(recall_at(all_pred, all_true, f), 3) for f in FRACS},
        # the ceiling: the task's own noiseless length (the digits' sum) as the prediction; the generated lengths
        # scatter around it (a small SFT-warmed model sampling at temperature 1), and no prompt feature sees that
        "target_recall": {str(f): round(recall_at(all_target, all_true, f), 3) for f in FRACS},
        "ptl_ms": {str(k): round(v * 1e3, 3) for k, v in ptl.items()},
        "num_units": NUM_UNITS,
        "max_batch_size": MAX_BATCH,
        "prompts_per_batch": num_prompts,
        "batches": batches,
        "bootstrap_prompts": bootstrap,
        "sft_steps": sft_steps,
        "timing_repeats": repeats,
        "assignment": "rlctl.planner.dispatch.assign_balanced",
        "threads": 1,
        "timing": "process_time",
        "per_batch": rows,
    }


def _shown(fraction: float | None) -> str:
    return "none" if fraction is None else f"{fraction:.3f}"


def summary(result: dict[str, Any]) -> str:
    r, m = result, result["step_model"]
    rec = r["ranker_recall"]
    return (
        f"{r['batches']}×{r['prompts_per_batch']} prompts on {r['num_units']} units (max batch "
        f"{r['max_batch_size']}), makespan per batch, measured CPU s | step-trace × PTL model:\n"
        f"  random + FIFO   {r['random_s']:.3f} | {m['random_s']:.3f}\n"
        f"  skew-aware      {r['skew_aware_s']:.3f} | {m['skew_aware_s']:.3f}  "
        f"({100 * r['skew_aware_gain']:.1f} % | {100 * m['skew_aware_gain']:.1f} % faster)\n"
        f"  oracle lengths  {r['oracle_s']:.3f} | {m['oracle_s']:.3f}  "
        f"({100 * r['oracle_gain']:.1f} % | {100 * m['oracle_gain']:.1f} % faster)\n"
        f"  fraction of the oracle's gain: {_shown(r['fraction_of_oracle_gain'])} | "
        f"{_shown(m['fraction_of_oracle_gain'])} (none where the oracle gains < {100 * ORACLE_GAIN_FLOOR:.0f} %)\n"
        f"  ranker recall of the true top 20/10/5 %: {rec['0.2']:.2f} / {rec['0.1']:.2f} / {rec['0.05']:.2f}"
        f" (the task's own target lengths: {' / '.join(f'{v:.2f}' for v in r['target_recall'].values())})"
    )
