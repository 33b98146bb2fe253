"""Stage curves: P_gen(x) and P_train(y) for every GPU count of a site, with the config that achieves it.

P_gen(x) = min over TP degrees (TP within a node: instances = the TP groups that fit on the hosts x GPUs span,
`units_that_fit`) of the slowest instance's time under balanced LPT dispatch (`sim.GenEstimator`).
P_train(y) = min over (TP, PP, DP) whose ranks, each TP group on one host, take ≤ y GPU slots (`costs.train_curve`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlctl.planner.costs import DecodeCost, TrainConfig, TrainWorkload, decode_cost, train_curve
from rlctl.planner.sim import GenEstimator
from rlctl.profiler.profile import SiteProfile


@dataclass(frozen=True)
class GenConfig:
    tp: int
    instances: int

    @property
    def gpus(self) -> int:
        return self.tp * self.instances


@dataclass
class GenCurve:
    seconds: np.ndarray  # index = GPUs
    configs: list[GenConfig | None]
    costs: dict[int, DecodeCost]  # TP → decode cost at the workload's context
    estimators: dict[int, GenEstimator]  # TP → P_gen by number of instances


@dataclass
class TrainCurve:
    seconds: np.ndarray
    configs: list[TrainConfig | None]


def live_context(prompt_tokens: int, lengths: np.ndarray, *, padded: bool = False) -> float:
    """Context a decode step pays for, averaged over steps.

    Paged attention (each row its own length): prompt + E[L²] / (2·E[L]) — longer samples live for
    more steps. Padded attention (the embedded engine: every row attends over the batch's longest
    context): prompt + L_max / 2, since the longest sample is alive for about the whole batch.
    """
    lf = lengths.astype(float)
    if padded:
        return prompt_tokens + float(lf.max()) / 2.0
    return prompt_tokens + float((lf * lf).sum() / (2.0 * lf.sum()))


def units_that_fit(host_gpus: Sequence[int], tp: int, max_gpus: int) -> np.ndarray:
    """Rollout units of `tp` GPUs in x = 0 … max_gpus GPU slots (index = x) taken host by host in the order of
    `host_gpus` (whole hosts, then part of the next): each unit on one host (`GpuPool.take`), so a host of g
    slots holds ⌊g / tp⌋ of them — 4 hosts of 6 GPUs hold 4 units of TP 4, not 6. Slots beyond the hosts hold none."""
    out = np.zeros(max_gpus + 1, dtype=int)
    x = units = 0
    for g in host_gpus:
        for k in range(1, min(g, max_gpus - x) + 1):
            out[x + k] = units + k // tp
        x, units = x + g, units + g // tp
        if x >= max_gpus:
            return out
    out[x + 1 :] = units
    return out


def gen_curve(
    site: SiteProfile,
    lengths_desc: np.ndarray,
    *,
    prompt_tokens: int,
    engine_max_batch: int,
    max_gpus: int,
    tp: int | None = None,
    host_gpus: Sequence[int] | None = None,
) -> GenCurve:
    """P_gen of `site` for 0 … max_gpus GPUs; `host_gpus`: its hosts' GPUs in the order the rollout's x GPUs fill
    them (default: hosts of `site.gpus_per_node` GPUs each)."""
    if host_gpus is None:
        host_gpus = [site.gpus_per_node] * -(-max_gpus // site.gpus_per_node)
    entries = [e for e in site.generation if (tp is None or e.tp == tp) and e.tp <= max(max_gpus, 1)]
    kv_ctx = live_context(prompt_tokens, lengths_desc)
    costs = {
        e.tp: decode_cost(
            e,
            context=live_context(prompt_tokens, lengths_desc, padded=e.padded_attention),
            seq_tokens=kv_ctx,
            engine_max_batch=engine_max_batch,
        )
        for e in entries
    }
    ests = {t: GenEstimator(lengths_desc, c, prompt_tokens=prompt_tokens) for t, c in costs.items()}
    fits = {t: units_that_fit(host_gpus, t, max_gpus) for t in ests}
    seconds = np.full(max_gpus + 1, math.inf)
    configs: list[GenConfig | None] = [None] * (max_gpus + 1)
    for x in range(1, max_gpus + 1):
        best, cfg = math.inf, None
        for t, est in ests.items():
            if (n := int(fits[t][x])) and (s := est.time_s(n)) < best:
                best, cfg = s, GenConfig(t, n)
        if seconds[x - 1] <= best:  # extra GPUs do not help: keep the smaller configuration
            seconds[x], configs[x] = seconds[x - 1], configs[x - 1]
        else:
            seconds[x], configs[x] = best, cfg
    return GenCurve(seconds, configs, costs, ests)


def train_stage_curve(
    site: SiteProfile,
    w: TrainWorkload,
    *,
    max_gpus: int,
    node_bytes_per_s: float,
    split: tuple[int, int] | None = None,
    host_gpus: Sequence[int] | None = None,
    ranks: int | None = None,
    slurm: bool = False,
    order_tp: int = 1,
) -> TrainCurve:
    seconds, configs = train_curve(
        site,
        w,
        max_gpus,
        node_bytes_per_s=node_bytes_per_s,
        split=split,
        host_gpus=host_gpus,
        ranks=ranks,
        slurm=slurm,
        order_tp=order_tp,
    )
    return TrainCurve(seconds, configs)
