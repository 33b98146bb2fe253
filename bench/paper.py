"""StreamRL's trends reproduced in simulation at the paper's scale (H800 / H20, Qwen2.5 7B–72B, batch 1024).

(a) planned allocation vs an even split of 128 H800 (32B, 72B; 20K dataset), async iteration time
    — StreamRL Fig. 10: 1.25×;
(b) throughput per hardware cost, 7B: rollout on 32 H20 + trainer on H800 vs everything on 32 H800
    (5K / 10K / 20K datasets) — StreamRL Fig. 12: 1.23–1.31×;
(c) generation time with random, skewness-aware (ranker recall 0.87 @ top 20 %) and oracle
    dispatch on the planned rollout units (20K dataset) — StreamRL Fig. 9: most of the oracle's gain;
(d) 7B on 32 GPUs, lengths growing linearly from the 10K to the 20K dataset over 20 iterations;
    the rebalance rule adds one 8-GPU node to rollout when δ ≥ δ' — StreamRL Fig. 11: after
    iterations 10 and 16.
Everything is simulated from the analytical (roofline) profile; no GPU is involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlctl.config.inventory import Inventory, Link, Site
from rlctl.config.job import Job, JobFile
from rlctl.planner.costs import TrainWorkload, decode_cost, train_time_s
from rlctl.planner.curves import gen_curve, live_context
from rlctl.planner.inputs import PlanOptions, length_model, profile_for
from rlctl.planner.plan import make_plan
from rlctl.planner.sim import DispatchConfig, GenEstimator, Unit, simulate_generation
from rlctl.planner.workload import LengthModel, noise_for_recall, predict_lengths
from rlctl.profiler.traincost import TrainingPasses, trained_models

DATASETS = {"5K": 0.25, "10K": 0.5, "20K": 1.0}
PAPER = {
    "planned_vs_even_speedup": 1.25,
    "planned_vs_even_speedup_ppo": 1.25,
    "cost_normalized_gain": (1.23, 1.31),
    "ranker_recall": 0.87,
    "scaleout_iterations": [10, 16],
}


def _site(gpu: str, gpus: int, dc: str, gbps: float) -> Site:
    full, rest = divmod(gpus, 8)
    nodes = [{"host": f"{dc}-[01-{full:02d}]" if full > 1 else f"{dc}-01", "gpus": 8}] if full else []
    if rest:
        nodes.append({"host": f"{dc}-x", "gpus": rest})
    return Site.model_validate(
        {
            "datacenter": dc,
            "scheduler": {"kind": "ssh"},
            "gpu": gpu,
            "nodes": nodes,
            "network": {"bandwidth_gbps": gbps},
        }
    )


def make_job(
    model: str,
    *,
    dataset: str,
    trainer: tuple[str, str, int, int | None],
    rollout: list[tuple[str, str, int, int | None]],
    seed: int = 0,
    algorithm: str = "ppo",
    rule: str = "simulated",
) -> Job:
    """trainer / rollout = (site, GPU type, GPUs in the site, GPUs to use or None = auto); the paper's
    PPO has a reference model for the KL term (StreamRL §7: actor, critic and reference of one size)."""
    sites = {
        name: _site(gpu, total, f"dc-{name}", 1600 if gpu == "H800" else 100)
        for name, gpu, total, _ in [trainer, *rollout]
    }
    links = [Link(between=(trainer[0], r[0]), bandwidth_gbps=80, latency_ms=2) for r in rollout if r[0] != trainer[0]]
    f = DATASETS[dataset]
    spec = JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "paper",
            "inventory": ["-"],
            "model": {"kind": "builtin", "name": model},
            "task": {"kind": "lengths", "median_output_tokens": 2750 * f, "max_output_tokens": round(20000 * f)},
            "algorithm": {"kind": algorithm, "kl_coef": 0.001},
            "batch": {"prompts_per_iteration": 128, "samples_per_prompt": 8},
            "pipeline": {"mode": "async"},
            "rollout": {"engine": "vllm", "max_batch_size": 256},
            "seed": seed,
            "planning": {"rule": rule},
            "placement": {
                "trainer": {"site": trainer[0], "gpus": trainer[3] or "auto"},
                "rollout": [{"site": r[0], "gpus": r[3] or "auto"} for r in rollout],
            },
        }
    )
    return Job(spec, Inventory(sites, links, ["(bench)"]), Path("paper.yaml"))


OPTS = PlanOptions(sim_iterations=5, curves_in_output=False)
# what-if: a trainer that re-scores old log-probs and recomputes activations (verl/Megatron-style);
# rlctl's trainer does neither, so the headline numbers use OPTS
VERL_STYLE = PlanOptions(
    sim_iterations=5, curves_in_output=False, trainer=TrainingPasses(old_logprobs=True, recompute=True)
)


def _planned_vs_even(models: list[str], *, algorithm: str = "ppo", opts: PlanOptions = OPTS) -> dict[str, Any]:
    out = {}
    for model in models:
        auto = make_job(
            model,
            dataset="20K",
            trainer=("h800", "H800", 128, None),
            rollout=[("h800", "H800", 128, None)],
            algorithm=algorithm,
        )
        planned = make_plan(auto, options=opts)
        alg1 = make_plan(
            make_job(
                model,
                dataset="20K",
                trainer=("h800", "H800", 128, None),
                rollout=[("h800", "H800", 128, None)],
                algorithm=algorithm,
                rule="paper",
            ),
            options=opts,
        )
        even = make_plan(
            make_job(
                model,
                dataset="20K",
                trainer=("h800", "H800", 128, 64),
                rollout=[("h800", "H800", 128, 64)],
                algorithm=algorithm,
            ),
            options=opts,
        )
        few = planned["alternatives"]["fewest_gpus"]
        even_s = even["predicted"]["iteration_s"]["async"]
        out[model] = {
            "planned": _stages(planned),
            "rule": planned["rule_applied"],
            "algorithm_1": _stages(alg1),  # StreamRL's rule on the stage curves, simulated the same way
            "even": _stages(even),
            "fewest_gpus_within_eps": {
                "gpus": few["rollout_gpus"] + few["trainer_gpus"],
                "iteration_s": few["iteration_s"],
            },
            "training_forward_units": planned["training"]["forward_units"],
            "t_gen_by_rollout_gpus_s": _gen_scaling(auto, [32, 64, 96, 128]),
            "speedup": even_s / planned["predicted"]["iteration_s"]["async"],
            "algorithm_1_speedup": even_s / alg1["predicted"]["iteration_s"]["async"],
        }
    return out


def _gen_scaling(job: Job, gpus: list[int]) -> dict[int, float]:
    """P_gen(x), the planner's stage curve: where it flattens, more rollout GPUs cannot shorten the
    iteration (the longest samples decode one token per step whatever the number of instances)."""
    prof = profile_for(job, None)
    lm = length_model(job)
    curve = gen_curve(
        prof.sites["h800"],
        lm.quantiles(job.spec.batch.samples_per_iteration),
        prompt_tokens=lm.prompt_tokens,
        engine_max_batch=job.spec.rollout.max_batch_size,
        max_gpus=max(gpus),
    )
    return {x: float(curve.seconds[x]) for x in gpus}


def _stages(p: dict[str, Any]) -> dict[str, Any]:
    used = {a["role"]: a["gpus_used"] for a in p["allocation"]}
    return {
        "rollout_gpus": used["rollout"],
        "trainer_gpus": used["trainer"],
        "t_gen_s": p["predicted"]["t_gen_s"],
        "t_train_s": p["predicted"]["t_train_s"],
        "iteration_s": p["predicted"]["iteration_s"]["async"],
    }


def _cost_normalized(datasets: list[str]) -> dict[str, Any]:
    out = {}
    for ds in datasets:
        single = make_plan(
            make_job(
                "qwen2.5-7b", dataset=ds, trainer=("h800", "H800", 32, None), rollout=[("h800", "H800", 32, None)]
            ),
            options=OPTS,
        )
        y = next(a["gpus_used"] for a in single["allocation"] if a["role"] == "trainer")
        cross = make_plan(
            make_job("qwen2.5-7b", dataset=ds, trainer=("h800", "H800", 128, y), rollout=[("h20", "H20", 32, None)]),
            options=OPTS,
        )
        # both are per iteration (the plan prices each GPU-hour of the iteration): their ratio needs no time scaling
        per_cost = {
            name: p["samples_per_iteration"] / p["cost"]["cost_units_per_iteration"]
            for name, p in (("single", single), ("cross", cross))
        }
        out[ds] = {
            "single_dc": _stages(single),
            "cross_dc": _stages(cross),
            "samples_per_cost_unit": per_cost,
            "gain": per_cost["cross"] / per_cost["single"],
        }
    return out


def _units_of(job: Job, plan: dict[str, Any], lm: LengthModel, lengths: np.ndarray) -> list[Unit]:
    prof = profile_for(job, None)
    units: list[Unit] = []
    ctx = live_context(lm.prompt_tokens, lengths)
    for a in plan["allocation"]:
        if a["role"] != "rollout" or not a["instances"]:
            continue
        entry = next(e for e in prof.sites[a["site"]].generation if e.tp == a["config"]["tp"])
        cost = decode_cost(entry, context=ctx, seq_tokens=ctx, engine_max_batch=job.spec.rollout.max_batch_size)
        units += [Unit(a["site"], cost)] * a["instances"]
    return units


def _dispatch(models: list[str], seeds: int) -> dict[str, Any]:
    lm = LengthModel()
    noise = noise_for_recall(PAPER["ranker_recall"], sigma=lm.sigma)  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    for model in models:
        job = make_job(model, dataset="20K", trainer=("h800", "H800", 128, None), rollout=[("h800", "H800", 128, None)])
        plan = make_plan(job, options=OPTS)
        policies = {
            "random": DispatchConfig("random"),
            "skew_aware": DispatchConfig("skew_aware"),
            "oracle": DispatchConfig("oracle"),
            "balanced_no_split": DispatchConfig("balanced"),
            "paper_literal": DispatchConfig("skew_aware", rule="sum", length_estimate="quantile"),
        }
        times: dict[str, list[float]] = {k: [] for k in policies}
        long_units: list[int] = []
        for seed in range(seeds):
            rng = np.random.default_rng(100 + seed)
            lengths = lm.sample(128, 8, rng)
            pred = predict_lengths(lengths, noise_sigma=noise, rng=rng)
            units = _units_of(job, plan, lm, lengths)
            for name, cfg in policies.items():
                g = simulate_generation(
                    lengths, pred, units, cfg, prompt_tokens=lm.prompt_tokens, rng=np.random.default_rng(seed)
                )
                times[name].append(g.makespan_s)
                if name == "skew_aware":
                    long_units.append(g.num_long_units)
        mean = {k: float(np.mean(v)) for k, v in times.items()}
        gain = (mean["random"] - mean["skew_aware"]) / max(mean["random"] - mean["oracle"], 1e-9)
        out[model] = {
            **{f"{k}_s": v for k, v in mean.items()},
            "units": len(units),
            "skew_long_tail_units": long_units,
            "share_of_oracle_gain": gain,
        }
    return out


def _scaleout(iterations: int, unit_gpus: int = 8) -> dict[str, Any]:
    """7B, 32 GPUs planned on the 10K dataset; lengths grow linearly to the 20K dataset; δ ≥ δ' adds a node.
    Planned by Algorithm 1, as the paper's experiment: δ prices one iteration's stage times, which the split
    of the `simulated` rule (its iterations overlapping in each unit's engine, fewer rollout GPUs) does not
    balance, so from there the rule would add a node at every iteration."""
    job = make_job(
        "qwen2.5-7b",
        dataset="10K",
        trainer=("h800", "H800", 32, None),
        rollout=[("h800", "H800", 32, None)],
        rule="paper",
    )
    plan = make_plan(job, options=OPTS)
    prof = profile_for(job, None)
    roll = next(a for a in plan["allocation"] if a["role"] == "rollout")
    trn = next(a for a in plan["allocation"] if a["role"] == "trainer")
    tp = roll["config"]["tp"]
    instances = roll["instances"]
    entry = next(e for e in prof.sites["h800"].generation if e.tp == tp)
    tentry = next(e for e in prof.sites["h800"].training if (e.tp, e.pp) == (trn["config"]["tp"], trn["config"]["pp"]))
    base = LengthModel().scaled(0.5)
    rng = np.random.default_rng(7)
    added: list[int] = []
    rows = []
    for i in range(iterations):
        lm = base.scaled(1.0 + i / max(iterations - 1, 1))  # 10K → 20K linearly
        lengths = lm.sample(128, 8, rng)
        ctx = live_context(lm.prompt_tokens, lengths)
        cost = decode_cost(entry, context=ctx, seq_tokens=ctx, engine_max_batch=job.spec.rollout.max_batch_size)
        g = simulate_generation(
            lengths,
            lengths.astype(float),
            [Unit("h800", cost)] * instances,
            DispatchConfig("skew_aware"),
            prompt_tokens=lm.prompt_tokens,
            rng=rng,
        )
        tw = TrainWorkload(  # cut as the learner cuts these rows (the job's budgets, a rank's share each)
            float(lengths.sum() + len(lengths) * lm.prompt_tokens),
            len(lengths),
            job.spec.batch.train_micro_batch_samples,
            job.spec.model.arch.params * 2 * trained_models("ppo"),
            micro_batch_tokens=job.spec.batch.train_micro_batch_tokens,
            row_tokens=tuple((lengths + lm.prompt_tokens).astype(float).tolist()),
        )
        t_train = train_time_s(tentry, trn["config"]["dp"], tw, site=prof.sites["h800"], node_bytes_per_s=200e9)
        est = GenEstimator(np.sort(lengths)[::-1], cost, prompt_tokens=lm.prompt_tokens)
        delta = g.makespan_s - t_train
        delta_prime = est.time_s(instances) - est.time_s(instances + unit_gpus // tp)
        rows.append(
            {
                "iteration": i,
                "rollout_gpus": instances * tp,
                "t_gen_s": g.makespan_s,
                "t_train_s": t_train,
                "delta_s": delta,
                "delta_prime_s": delta_prime,
            }
        )
        if delta >= delta_prime:
            instances += unit_gpus // tp
            added.append(i)
    return {
        "iterations": added,
        "delta_s": [r["delta_s"] for r in rows],
        "per_iteration": rows,
        "initial": {"rollout_gpus": roll["gpus_used"], "trainer_gpus": trn["gpus_used"], "rollout_tp": tp},
    }


def run(*, quick: bool) -> dict[str, Any]:
    models = ["qwen2.5-32b", "qwen2.5-72b"]
    a = _planned_vs_even(models)
    a_grpo = _planned_vs_even(models, algorithm="grpo")
    a_verl = _planned_vs_even(models, opts=VERL_STYLE)
    b = _cost_normalized(["20K"] if quick else list(DATASETS))
    c = _dispatch(["qwen2.5-72b"] if quick else ["qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b"], 2 if quick else 5)
    d = _scaleout(20)
    gains = [v["gain"] for v in b.values()]
    head = c["qwen2.5-72b"]
    ppo = {m: v["speedup"] for m, v in a.items()}
    return {
        "planned_vs_even_speedup": float(np.mean(list(ppo.values()))),  # the paper's algorithm (PPO)
        "planned_vs_even_speedup_ppo": float(np.mean(list(ppo.values()))),
        "planned_vs_even_speedup_ppo_by_model": ppo,
        "planned_vs_even": a,
        "planned_vs_even_speedup_grpo": float(np.mean([v["speedup"] for v in a_grpo.values()])),
        "planned_vs_even_grpo": a_grpo,
        "planned_vs_even_speedup_ppo_verl_style": float(np.mean([v["speedup"] for v in a_verl.values()])),
        "planned_vs_even_ppo_verl_style": a_verl,
        "cost_normalized_gain": float(np.mean(gains)),
        "cost_normalized_gain_range": [min(gains), max(gains)],
        "cost_normalized": b,
        "dispatch": {
            "random_s": head["random_s"],
            "skew_aware_s": head["skew_aware_s"],
            "oracle_s": head["oracle_s"],
            "by_model": c,
        },
        "scaleout": d,
        "paper": PAPER,
    }


def _split_lines(runs: dict[str, Any]) -> list[str]:
    lines = []
    for m, v in runs.items():
        p, e = v["planned"], v["even"]
        lines.append(
            f"    {m}: even {e['rollout_gpus']}+{e['trainer_gpus']} GPUs {e['iteration_s']:.0f} s "
            f"(gen {e['t_gen_s']:.0f} / train {e['t_train_s']:.0f}) → planned {p['rollout_gpus']}+"
            f"{p['trainer_gpus']} {p['iteration_s']:.0f} s (gen {p['t_gen_s']:.0f} / train "
            f"{p['t_train_s']:.0f}) by rule {v['rule']}: {v['speedup']:.2f}× (Algorithm 1: "
            f"{v['algorithm_1']['rollout_gpus']}+{v['algorithm_1']['trainer_gpus']}, "
            f"{v['algorithm_1_speedup']:.2f}×); fewest GPUs within 5 %: {v['fewest_gpus_within_eps']['gpus']} GPUs"
        )
    return lines


def summary(r: dict[str, Any]) -> str:
    units = next(iter(r["planned_vs_even"].values()))["training_forward_units"]
    lines = [
        "(a) planned vs even split of 128 H800, async, 20K dataset (paper Fig. 10: 1.25×); "
        f"PPO with KL on rlctl's trainer: {units:g} policy forwards per token"
    ]
    lines += _split_lines(r["planned_vs_even"])
    by_model = ", ".join(f"{m} {x:.2f}×" for m, x in r["planned_vs_even_speedup_ppo_by_model"].items())
    lines.append(f"    mean speedup (PPO) {r['planned_vs_even_speedup_ppo']:.2f}× ({by_model})   paper 1.25×")
    for m, v in r["planned_vs_even"].items():
        curve = ", ".join(f"{x}: {t:.0f} s" for x, t in v["t_gen_by_rollout_gpus_s"].items())
        lines.append(f"    {m} P_gen by rollout GPUs (the long tail's floor): {curve}")
    for key, label in (("grpo", "GRPO with KL"), ("ppo_verl_style", "PPO, old log-probs re-scored + recomputation")):
        runs = r[f"planned_vs_even_{key}"]
        u = next(iter(runs.values()))["training_forward_units"]
        lines.append(f"    {label} ({u:g} forwards per token): mean {r[f'planned_vs_even_speedup_{key}']:.2f}×")
        lines += _split_lines(runs)
    lo, hi = r["cost_normalized_gain_range"]
    lines.append(
        f"(b) samples per cost unit, H20 rollout + H800 trainer vs 32 H800, 7B: {lo:.2f}–{hi:.2f}×   paper 1.23–1.31×"
    )
    for ds, v in r["cost_normalized"].items():
        s, c = v["single_dc"], v["cross_dc"]
        lines.append(
            f"    {ds}: single {s['rollout_gpus']}+{s['trainer_gpus']} H800 {s['iteration_s']:.0f} s; cross "
            f"{c['rollout_gpus']} H20 + {c['trainer_gpus']} H800 {c['iteration_s']:.0f} s → {v['gain']:.2f}×"
        )
    lines.append(
        "(c) generation time by dispatch, 20K dataset, ranker recall 0.87 (paper Fig. 9: most of the oracle gain)"
    )
    for m, v in r["dispatch"]["by_model"].items():
        lines.append(
            f"    {m} on {v['units']} units: random {v['random_s']:.0f} s, "
            f"skew-aware {v['skew_aware_s']:.0f} s, "
            f"oracle {v['oracle_s']:.0f} s (random/skew {v['random_s'] / v['skew_aware_s']:.2f}×, "
            f"random/oracle {v['random_s'] / v['oracle_s']:.2f}×: {v['share_of_oracle_gain']:.0%} of the "
            f"oracle's gain); long-tail units chosen {v['skew_long_tail_units']}"
        )
        lines.append(
            "      other Alg. 2 cost models: no split (LPT by predicted tokens) "
            f"{v['balanced_no_split_s']:.0f} s, "
            f"Eq. 2 P90/P50 sum rule as written {v['paper_literal_s']:.0f} s"
        )
    d = r["scaleout"]
    lines.append(
        f"(d) 7B, 10K→20K over {len(d['delta_s'])} iterations, start {d['initial']['rollout_gpus']} rollout + "
        f"{d['initial']['trainer_gpus']} trainer GPUs: node added after iterations {d['iterations']} "
        "(paper Fig. 11: after 10 and 16)"
    )
    lines.append("    δ per iteration (s): " + " ".join(f"{x:.0f}" for x in d["delta_s"]))
    return "\n".join(lines)
