"""Simulation of a whole job over several iterations: generation, streaming, training, weight transfer.

For iteration i (0-based), with staleness bound η (version v = number of finished training steps):

    start[i, u]    = max(end[i-1, u], weights_at_rollout[i-1-η])     (sync/stream: η = 0)
    sample k of i  arrives at start[i, u(k)] + finish_k (streamed as soon as it is done); with groups
                   (GRPO: advantages need the whole group) it reaches the learner with its group's last
    train[i]       as the trainer's learner cuts (`rlctl.rl.cuts`): whenever the trainer is free, what has
                   reached it (everything, in sync) in length order, in cuts whose share on each of
                   the dp ranks holds ≤ micro_batch_samples rows and ≤ micro_batch_tokens padded tokens; a
                   partial last cut waits for more samples;
                   then the work that needs the whole batch (`at_step_s`: PPO's GAE-whitened update,
                   later epochs), after the last sample
    weights[i]     = train_end[i] + weight transfer (the rollout swaps at the next batch start)

    sync:   gen ▮▮▮▮░░░░░░░▮▮▮▮      stream: gen ▮▮▮▮░░░░▮▮▮▮      async: gen ▮▮▮▮▮▮▮▮▮▮▮▮
            trn ░░░░▮▮▮░░░░░░░░              trn ░▮▮▮▮░░░░▮▮▮▮             trn ░░░░▮▮▮▮▮▮▮▮

Each rollout unit u gets its share of iteration i once it holds weights recent enough (the controller's
dispatch: a unit at version w takes iterations ≤ w + η); it does not wait for the other units. With
`IterationWork.shares` the unit is one engine across iterations (`engine.run_groups`), as it runs: in
async its share of i+1 arrives while its share of i still runs and fills the rows i's tail frees (older
iteration first, unless the engine's group barrier holds it back), which makes i's tail dearer. Without,
a unit starts its share of i when it is done with its own share of i−1 (`finish_s`: the share alone).
Without a per-sample unit (`unit_of` None) the batch is one pool: it starts when all of i−1 is done.

Iteration time is the steady-state mean gap between training ends.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rlctl.planner.engine import EPS_S, EngineRun, EngineSpec, Group, same_engine
from rlctl.rl.cuts import trained_count

Mode = Literal["sync", "stream", "async"]
MODES: tuple[Mode, ...] = ("sync", "stream", "async")


@dataclass(frozen=True)
class UnitShare:
    """A unit's share of one iteration: which samples, in its engine's admission order, and their lengths."""

    samples: np.ndarray  # indices into the iteration's samples
    lengths: np.ndarray  # output tokens, the same order
    engine: EngineSpec


@dataclass(frozen=True)
class IterationWork:
    """One iteration's generation outcome and training cost.

    With `shares` a unit's shares of successive iterations run in one engine (`engine.run_groups`): the
    share of i+1 reaches it `unit_delay_s` after the weights it needs, and fills the rows i's tail frees
    unless the barrier holds it back; `finish_s` is then not used. Without, each share runs alone, from
    when the unit is done with its previous share and has the weights (`finish_s` after that start)."""

    finish_s: np.ndarray  # per sample, seconds after the batch started generating
    sample_tokens: np.ndarray  # per sample, tokens to train on
    train_s: float  # trainer time for the whole batch
    micro_batch_samples: int  # the learner's rows a rank's share of a cut
    at_step_s: float = 0.0  # the part of train_s that waits for the whole batch (the rest streams)
    unit_of: np.ndarray | None = None  # per sample, its rollout unit (None: one pool, as if one unit)
    micro_batch_tokens: int | None = None  # the padded-token budget of a rank's share of a cut (None: rows)
    group_of: np.ndarray | None = None  # per sample, its group: it reaches the learner with the group's last
    shares: dict[int, UnitShare] | None = None  # by unit (the indices of `unit_of`)
    unit_delay_s: float = 0.0  # with shares: weights ready → the unit's share reaches its engine (fetch, load)
    reduce_per_step: bool = False  # FSDP2 reduces in the step's last cut: the learner holds its last cut to the flush
    dp: int = 1  # the trainer's data-parallel ranks: the learner's budgets are each one's share of a cut
    # per sample, whether the learner trains it (a replay's GRPO group without signal is not: `bench.jobsim`); such a
    # sample still arrives and the step waits for it, but it is in no cut and no price (None: every sample trains)
    trained: np.ndarray | None = None


@dataclass(frozen=True)
class JobTimeline:
    gen_start_s: list[float]
    gen_end_s: list[float]
    train_end_s: list[float]
    weights_ready_s: list[float]
    unit_gen_s: list[dict[int, float]]  # per iteration, per unit: its share, from its start to its last sample

    def periods_s(self) -> list[float]:
        """The time between consecutive training ends."""
        return [b - a for a, b in itertools.pairwise(self.train_end_s)]

    def iteration_s(self, warmup: int = 1) -> float:
        ends = self.train_end_s
        if len(ends) <= warmup + 1:
            return ends[-1] / len(ends)
        return (ends[-1] - ends[warmup]) / (len(ends) - 1 - warmup)


def weight_transfer_s(
    weight_bytes: float,
    *,
    link_bytes_per_s: float,
    latency_s: float,
    local_bytes_per_s: float,
    num_local_hops: int,
    chunk_bytes: float,
    relay_chains: int = 1,
) -> float:
    """Root → the site's first host over the link, then `num_local_hops` more hosts, one copy into each
    (`weights/plan.py` chains whole hosts), every node forwarding chunk k while k+1 arrives (`weights/node.py`):
    the first chunk crosses every hop and the rest follow at the slowest hop's rate. `relay_chains`: the chains
    of hosts the first host's relay heads (another datacenter's: `weight_sync.chains_per_datacenter`), which
    share its host link (k = min(that, hops)): T ≈ lat + c/B_link + k·c/B_local + (⌈h/k⌉ − 1)·c/B_local +
    (S − c)/min(B_link, B_local/k). A chain costs its hops' chunk times, not a second copy of the weights (as if
    each relay waited for the whole version before it forwarded: 12 rollout GPUs of 8-GPU hosts beside the
    trainer priced twice 8's)."""
    c = min(chunk_bytes, weight_bytes)
    if num_local_hops == 0:
        return latency_s + weight_bytes / link_bytes_per_s
    k = max(1, min(relay_chains, num_local_hops))
    first_hop_rate = local_bytes_per_s / k
    fill = c / link_bytes_per_s + c / first_hop_rate + (-(-num_local_hops // k) - 1) * c / local_bytes_per_s
    return latency_s + fill + (weight_bytes - c) / min(link_bytes_per_s, first_hop_rate)


def simulate_job(
    works: Sequence[IterationWork], *, mode: Mode, weight_sync_s: float, eta: int | None = None, drain: int = 0
) -> JobTimeline:
    """The timeline of `works` but the last `drain` of them: those only follow the others into the rollout engines.

    Iteration i shares its units' engines with i+1 … i+η (the shares released before its tail is done), so without
    them the last η iterations' tails run alone and their gaps are about the training time: a steady-state estimate
    passes η more works as `drain` (sync and stream, η = 0, have no such end). A replay of a finished run, whose last
    iterations did run alone, passes none."""
    eta = (1 if mode == "async" else 0) if eta is None else eta
    assert 0 <= drain < len(works)
    gen_start: list[float] = []
    gen_end: list[float] = []
    train_end: list[float] = []
    ready: list[float] = []
    unit_gen: list[dict[int, float]] = []
    unit_end: dict[int, float] = {}  # rollout unit → when it finished its share of the last iteration it ran
    engines: dict[int, tuple[EngineRun, list[int]]] = {}  # rollout unit → its engine's run, the iterations it holds

    def release(k: int) -> float:  # when iteration k's shares reach the units (its weights are known by then)
        j = k - 1 - eta
        return (ready[j] if j >= 0 else 0.0) + works[k].unit_delay_s

    holds: dict[int, list[int]] = {}  # rollout unit → the iterations it has a share of, in order
    for k, w in enumerate(works):
        for u in w.shares or {}:
            holds.setdefault(u, []).append(k)
    for i, w in enumerate(works[: len(works) - drain]):
        j = i - 1 - eta
        weights = ready[j] if j >= 0 else 0.0
        units = np.zeros(len(w.finish_s), dtype=int) if w.unit_of is None else w.unit_of
        arrival = np.empty(len(w.finish_s))
        starts = []
        gens: dict[int, float] = {}
        if w.shares is not None:
            # each unit's engine from the start, with every share released by now: up to i + η (whose release
            # needs the weights of i − 1 at most); later ones cannot reach it before i's tail is done, so the run
            # of i − 1 goes on with the shares released since (`EngineRun.add`), unless its engine differs
            released = min(i + eta, len(works) - 1)
            start_i = release(i)
            samples: list[np.ndarray] = []
            finish: list[float] = []  # the units' finish times, in the order of `samples`
            for u, share in w.shares.items():
                mine = holds[u][: bisect.bisect_right(holds[u], released)]
                # every share in the run is priced with this iteration's engine (PTL at its share's context)
                run, held = engines.get(u, (None, []))
                if run is None or not same_engine(run.engine, share.engine) or mine[: len(held)] != held:
                    run, held = EngineRun(share.engine), []
                for k in mine[len(held) :]:
                    if not run.add(Group(release(k), (works[k].shares or {})[u].lengths)):
                        run = EngineRun(share.engine)  # a release the run stopped past: from the start
                        for k2 in mine:
                            run.add(Group(release(k2), (works[k2].shares or {})[u].lengths))
                        break
                engines[u] = (run, mine)
                f = run.run_until(mine.index(i))
                samples.append(share.samples)
                finish += f
                starts.append(start_i)
                gens[u] = float(max(f)) - start_i if f else 0.0
            if samples:  # one scatter for all units: per unit, numpy's fixed cost is more than its few samples
                arrival[np.concatenate(samples)] = finish
        else:
            for u in np.unique(units):
                mine_ = units == u
                s_u = max(unit_end.get(int(u), 0.0), weights)
                arrival[mine_] = s_u + w.finish_s[mine_]
                unit_end[int(u)] = float(arrival[mine_].max())
                starts.append(s_u)
                gens[int(u)] = float(w.finish_s[mine_].max())
        unit_gen.append(gens)
        start = min(starts, default=max(weights, gen_end[-1] if gen_end else 0.0))
        if w.group_of is not None:  # every sample of a group arrives with its last
            _, of = np.unique(w.group_of, return_inverse=True)
            last = np.full(of.max() + 1 if of.size else 0, -np.inf)
            np.maximum.at(last, of, arrival)
            arrival = last[of]
        order = np.argsort(arrival, kind="stable")
        arrivals = arrival[order]
        tokens = w.sample_tokens[order]
        trained = None if w.trained is None else w.trained[order]
        g_end = float(arrivals[-1]) if arrivals.size else start
        t = train_end[-1] if train_end else 0.0
        total = float(tokens.sum() if trained is None else tokens[trained].sum()) or 1.0
        streamed_s = w.train_s - w.at_step_s
        t = learner_train(
            arrivals,
            tokens,
            max(1, w.micro_batch_samples),
            w.micro_batch_tokens,
            whole=mode == "sync",
            free=t,
            s=streamed_s / total,
            reduce_per_step=w.reduce_per_step,
            ranks=w.dp,
            trained=trained,
        )
        if w.at_step_s > 0:
            t = max(t, g_end) + w.at_step_s
        gen_start.append(start)
        gen_end.append(g_end)
        train_end.append(t)
        ready.append(t + weight_sync_s)
    return JobTimeline(gen_start, gen_end, train_end, ready, unit_gen)


def learner_train(
    arrivals: np.ndarray,
    tokens: np.ndarray,
    size: int,
    max_tokens: int | None,
    *,
    whole: bool,
    free: float,
    s: float,
    reduce_per_step: bool = False,
    ranks: int = 1,
    trained: np.ndarray | None = None,
) -> float:
    """When the trainer, free at `free`, has trained one iteration (`s` seconds per token) as its learner cuts
    it (`rlctl.rl.learner.train_ready`): whenever the trainer is free, it takes every sample that has arrived
    (sorted `arrivals`; what came while it trained waits in its inbox), cuts those not yet trained and trains
    all cuts but a partial last one, which may still grow; after the last arrival, all of them (the learner's
    own rule, `trainable_cuts`). `whole` (sync): everything once the last sample is in. `reduce_per_step` (FSDP2
    reducing in a step's last cut alone): the last cut waits for the last arrival, full or not, as the learner's.
    `ranks`: the trainer's data-parallel ranks, whose shares of a cut the budgets bound (`rlctl.rl.cuts`). `trained`
    (per row; None: all): the rows the learner cuts, the others (a GRPO group without signal) arriving uncut, as
    `StreamingLearner.add` skips them: the last cut still waits for the last arrival of any row."""
    t, k, n = free, 0, len(arrivals)
    times, rows = arrivals.tolist(), [float(x) for x in tokens]  # plain floats: numpy scalars cost more than a cut
    keep = None if trained is None else trained.tolist()
    held: list[float] = []  # the rows cut but not trained (a partial last cut), in length order
    while k < n:
        now = max(t, times[-1] if whole else times[k])
        # arrivals within EPS_S of now are now's: two units' float sums of one finish time differ in their last bits,
        # and taking them as two events cut (and timed) the iteration otherwise than one
        j = bisect.bisect_right(times, now + EPS_S, lo=k)
        # only the lengths matter: the trained rows' sum (in length order, as the cuts train them) and what is held
        arrived = rows[k:j] if keep is None else [r for r, y in zip(rows[k:j], keep[k:j], strict=True) if y]
        ready = sorted(held + arrived)
        k = j
        m = trained_count(
            ready, size, max_tokens=max_tokens, ranks=ranks, flush=k == n, reduce_per_step=reduce_per_step
        )
        t = now + s * sum(ready[:m])
        held = ready[m:]
    return t
