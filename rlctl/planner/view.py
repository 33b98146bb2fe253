"""Rendering a plan: the table view and the PNG (stage-time breakdown per site, like StreamRL Fig. 10)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl.errors import UsageError
from rlctl.ownfiles import png_metadata, refuse_foreign
from rlctl.render import grid


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _add_unit(rb: dict[str, Any]) -> str:
    """What a plan whose rebalance rule would add a unit (δ ≥ δ') leaves to the run: the controller's rule where the
    job turns it on (it measures δ over its window first), else the operator."""
    if rb.get("auto"):
        return "one more pays (δ ≥ δ'): the controller's rule (rebalance.auto) adds it once it measures the same"
    return "one more pays (δ ≥ δ'): `rlctl scale JOB --rollout +1` during the run, or rebalance.auto: true"


def plan_table(p: dict[str, Any]) -> str:
    rows = [
        [
            a["site"],
            a["role"],
            a["gpu"],
            f"{a['gpus_used']}/{a['gpus_available']}",
            " ".join(k if v is True else f"{k}={v}" for k, v in (a["config"] or {}).items()),
            a["instances"],
            _s(a["predicted_s"]),
        ]
        for a in p["allocation"]
    ]
    out = [
        grid(
            rows,
            ["site", "role", "gpu", "gpus used/avail", "config", "instances", "stage s"],
            f"Allocation of {p['job']} ({p['model']}, rule {p.get('rule_applied', p['rule'])}, "
            f"profile {p['profile_source']}{', ' + p['profile_file'] if p.get('profile_file') else ''})",
        )
    ]
    alt = [
        [name, a["rollout_gpus"], a["trainer_gpus"], _s(a["t_gen_s"]), _s(a["t_train_s"]), _s(a["iteration_s"])]
        for name, a in {**p["alternatives"], "baseline:" + p["baseline"]["kind"]: p["baseline"]}.items()
    ]
    out.append(
        grid(
            alt,
            ["allocation", "rollout gpus", "trainer gpus", "gen s", "train s", "max s"],
            "Candidates (stage curves)",
        )
    )
    if "search" in p:
        sr = p["search"]
        across = sr.get("kind") == "across_datacenters"
        chosen = (sr["chosen"], sr.get("chosen_trainer"))
        rows = [
            [
                e["rollout_gpus"],
                e["trainer_gpus"],
                _s(e["iteration_s"]),
                "*" if (e["rollout_gpus"], e["trainer_gpus"] if across else None) == chosen else "",
            ]
            for e in sr["evaluated"]
        ]
        title = (
            f"Allocations across {', '.join(sr['sites'])} simulated ({sr['mode']}: the fewest GPUs within "
            f"{sr['within']:.0%} of the full allocation's iteration)"
            if across
            else f"Splits of {sr['site']} simulated ({sr['mode']}: a unit's next iteration fills its tail's rows)"
        )
        out.append(grid(rows, ["rollout gpus", "trainer gpus", "iteration s", "chosen"], title))
    pr = p["predicted"]
    modes = [
        [m, _s(t), f"{pr['samples_per_s'][m]:.2f}", "*" if m == p["mode"] else ""] for m, t in pr["iteration_s"].items()
    ]
    out.append(
        grid(
            modes,
            ["mode", "iteration s", "samples/s", "job"],
            f"Simulated: t_gen {_s(pr['t_gen_s'])} s, t_train {_s(pr['t_train_s'])} s, "
            f"weight sync {_s(pr['weight_sync_s'])} s",
        )
    )
    d = p["dispatch"]
    drows = [
        [
            v["rule"],
            v["length_estimate"],
            v["long_tail_units"],
            v["regular_units"],
            f"{v['long_tail_batch']}/{v['regular_batch']}",
            _s(v["estimate_s"]),
            _s(v["simulated_s"]),
        ]
        for v in d["candidates"].values()
    ]
    out.append(
        grid(
            drows,
            ["Alg. 2 rule", "lengths", "long-tail units", "regular units", "batches", "estimate s", "simulated s"],
            f"Dispatch on {d['site']}: {d['policy']} ({d['rule']}/{d['length_estimate']}), α={d['alpha']}, "
            f"no-split {_s(d['no_split_simulated_s'])} s, rule closer to the simulator: {d['better_rule']}",
        )
    )
    tr = p["training"]
    extras = [k for k in ("reference", "old_logprobs", "recompute") if tr["passes"][k]]
    if tr.get("lora_adapter_params"):  # the backward computes the adapters' weight gradients alone
        extras.append(f"LoRA ({tr['lora_adapter_params'] / 1e6:.3g} M adapter parameters)")
    epochs, minis = tr["passes"]["epochs"], tr["mini_batches"]
    steps = f", {epochs} epoch{'s' * (epochs > 1)} × {minis} mini-batch{'es' * (minis > 1)}"
    out.append(
        f"Training cost: {tr['algorithm']} = {tr['forward_units']:.3g} forward passes of the policy per token "
        f"({tr['flops_per_token']:.3g} FLOPs{', with ' + ', '.join(extras) if extras else ''}{steps}); "
        f"{tr['streamed_fraction']:.0%} trains as samples stream in"
    )
    for a in p["allocation"]:
        if a.get("gpus_asked") is not None and a["gpus_used"] < a["gpus_asked"]:
            out.append(
                f"Rollout on {a['site']}: {a['gpus_used']} of the job's {a['gpus_asked']} GPUs used "
                f"({a['instances']} unit(s) of tp {a['config']['tp'] if a['config'] else '-'}; the rest idle): "
                "set rollout.tensor_parallel to choose the tp, or a count it divides"
            )
    rb = p["rebalance"]
    c = p["cost"]
    verdict = rb.get("reason") or ("not needed (δ < δ')" if not rb["add_unit"] else _add_unit(rb))
    basis = " (async, simulated: the trainer's wait, and what one more unit saves)"
    out.append(
        f"Rebalance{basis if rb.get('basis') == 'simulated_async' else ''}: δ = {_s(rb['delta_s'])} s, "
        f"δ' = {_s(rb['delta_prime_s'])} s for one more {rb['unit_gpus']}-GPU unit on {rb['site']}: {verdict}"
    )
    out.append(
        f"Cost: {c['gpu_hours_per_iteration']:.4g} GPU-h and {c['cost_units_per_iteration']:.4g} cost units "
        f"per iteration; {c['gpu_hours_per_1k_samples']:.4g} GPU-h and {c['cost_units_per_1k_samples']:.4g} "
        "cost units per 1k samples"
    )
    return "\n\n".join(out)


def plot_path(path: Path) -> Path:
    """Where `plan_plot` writes for `--plot PATH`: PATH, or PATH.png when it has no suffix (the PNG the option
    promises). UsageError, one line, for a directory, a directory that does not exist or a format matplotlib does
    not write, or a file there that rlctl did not write (`refuse_foreign`): checked before the plan is computed."""
    from matplotlib.backend_bases import FigureCanvasBase

    if path.is_dir():
        raise UsageError(f"--plot {path}: is a directory", hint=f"give a file name, e.g. {path / 'plan.png'}")
    if not path.parent.is_dir():
        raise UsageError(f"--plot {path}: no such directory {path.parent}", hint="create it, or write elsewhere")
    out = path.with_name(path.name + ".png") if not path.suffix else path
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if out.suffix[1:].lower() not in formats:
        raise UsageError(
            f"--plot {path}: cannot write a {path.suffix!r} image; valid suffixes: {', '.join(formats)}",
            hint=f"e.g. {path.with_suffix('.png')}",
        )
    refuse_foreign(out, named_by=f"--plot {path}", what="the plan's plot")  # only a PNG carries rlctl's mark
    return out


def plan_plot(p: dict[str, Any], path: Path) -> None:
    """Stage seconds per site for the baseline and the plan, GPU counts on the bars (StreamRL Fig. 10), written
    to `path` (its suffix names the format: see `plot_path`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = p["baseline"]
    trainer = next(a for a in p["allocation"] if a["role"] == "trainer")
    groups = [
        (
            b["kind"].replace("_", " "),
            [("generation", b["t_gen_s"], b["rollout_gpus"]), ("training", b["t_train_s"], b["trainer_gpus"])],
        ),
        (
            "planned",
            [
                (f"gen @ {a['site']}", a["predicted_s"], a["gpus_used"])
                for a in p["allocation"]
                if a["role"] == "rollout" and a["gpus_used"]
            ]
            + [(f"train @ {trainer['site']}", trainer["predicted_s"], trainer["gpus_used"])],
        ),
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = 0.0
    ticks, labels = [], []
    for name, bars in groups:
        start = x
        for label, sec, gpus in bars:
            color = "tab:blue" if label.startswith("gen") else "tab:orange"
            ax.bar(x, sec or 0.0, width=0.8, color=color)
            ax.text(x, (sec or 0.0), f"{gpus} GPUs", ha="center", va="bottom", fontsize=8)
            ticks.append(x)
            labels.append(label)
            x += 1
        ax.text(
            (start + x - 1) / 2,
            -0.18,
            name,
            ha="center",
            transform=ax.get_xaxis_transform(),
            fontsize=9,
            fontweight="bold",
        )
        x += 0.8
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("stage seconds per iteration")
    it = p["predicted"]["iteration_s"][p["mode"]]
    ax.set_title(f"{p['job']}: stage times ({p['mode']} iteration {it:.1f} s simulated)", fontsize=10)
    ax.legend(
        handles=[plt.Rectangle((0, 0), 1, 1, color="tab:blue"), plt.Rectangle((0, 0), 1, 1, color="tab:orange")],
        labels=["generation", "training"],
        fontsize=8,
    )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, metadata=png_metadata("plan") if path.suffix.lower() == ".png" else None)
    except OSError as e:  # the operator's path (a folder not theirs, a file system that refuses it): exit 2
        raise UsageError(f"--plot {path}: cannot write: {e.strerror or e}", hint="write elsewhere") from e
    finally:
        plt.close(fig)
