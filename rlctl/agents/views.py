"""What the controller shows: the status reply (`rlctl status -o json`), summary.json, the row each
trained iteration appends to metrics.jsonl and the Prometheus gauges — functions of the controller's
books (a `Snapshot`, or the few parts a gauge reads), so they are tested without sockets or threads.

    ControllerAgent.snapshot() ──▶ Snapshot ──┬─▶ status(s, now=…)      ──▶ the status reply
                                              ├─▶ summary(s)            ──▶ summary.json
                                              └─▶ metrics_row(s, t, …)  ──▶ metrics.jsonl (the rebalance
                                                                            rule then adds its reading)
    every turn of the main loop ──▶ agent_gauges;  each trained iteration ──▶ iteration_gauges;
    an agent gone before the last metrics row ──▶ forget_agent_gauges
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from rlctl.agents.books import GoneBook, ScaleLog
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import IterationStats
from rlctl.agents.ledger import State
from rlctl.agents.messages import Heartbeat, Trained
from rlctl.agents.rebalance import Reading
from rlctl.agents.rowbook import RowBook
from rlctl.agents.weightbook import WeightBook
from rlctl.config.job import JobFile
from rlctl.metrics import JobMetrics
from rlctl.rl.reward_pool import RewardStats
from rlctl.rl.source import heldout_view


class AgentRecord(Protocol):
    """What the views read of the controller's record of one connected agent (`controller_base.Peer`)."""

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...  # trainer | rollout | client
    @property
    def state(self) -> str: ...  # running | unreachable | stopped | lost
    @property
    def last_seen(self) -> float: ...  # time.monotonic() of its last message
    @property
    def figures(self) -> Heartbeat: ...


@dataclass(frozen=True)
class Snapshot:
    """The controller's books at one moment (references, not copies: build one per view)."""

    job: JobFile
    core: ControllerCore
    book: WeightBook
    peers: Mapping[str, AgentRecord]
    sites: Mapping[str, str]  # agent → site
    rows: RowBook  # metrics.jsonl so far: what the views read of it
    t_start: float  # time.monotonic() when the controller started
    t_first: float | None  # … when it first dispatched a sample
    violations: int  # staleness violations the trainer reported
    reading: Reading | None  # the rebalance rule's last reading
    scale_log: ScaleLog  # the latest scale events, every one counted
    free_slots: dict[str, int]
    stop_requested: bool
    metrics_port: int
    job_dir: str
    resilience: Mapping[str, Any] = field(default_factory=dict)  # resumes, replaced units, a note
    data: Mapping[str, Any] = field(default_factory=dict)  # a dataset task's rows: prompts, bad rows skipped
    reward_stats: RewardStats = field(default_factory=RewardStats)  # the reward pool's counts so far
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # its first and last rows (Evaluator.rows)
    checkpoint: tuple[int, float | None] | None = None  # the latest complete one: version, time.monotonic() then
    metrics_host: str = "127.0.0.1"  # where /metrics binds: the controller's listen host (transport.bind_host)
    listen_field: str = "transport.listen_host"  # the setting that host came from (rlctl.agents.listen)
    gone: GoneBook = field(default_factory=GoneBook)  # agents gone before the last metrics row
    first_samples: Mapping[str, float] = field(default_factory=dict)  # unit asked for → seconds to its first sample
    failed_starts: Mapping[str, str] = field(default_factory=dict)  # unit asked for whose start failed → the error
    # seconds from the job's first controller start to this one's (a resumed run: `job_start_offset`), so that the
    # rows' wall_s continues across resumes instead of going back to 0 at each
    wall_offset_s: float = 0.0


LIVE_STATES = ("running", "unreachable")  # an agent that may still be in the phase it last reported
GONE_STATES = ("lost", "stopped")

# the last step's figures that `status` shows (metrics row keys): those every job has (null where the step had none:
# no token trained, a gradient not finite) ...
TRAINING = ("loss", "kl", "lr", "grad_norm", "entropy", "clip_frac", "no_signal_frac")
# ... and those of some jobs alone, shown where its row has them: the KL to a reference (kl_coef > 0), PPO's critic
# loss, a MoE's load-balancing loss, the groups dynamic sampling dropped
TRAINING_IF_ANY = ("kl_ref", "value_loss", "router_aux_loss", "dropped_groups")


def _per_token(**figures: float) -> dict[str, float]:
    """The figures averaged over the tokens an iteration trained; none when it trained none (every group's rewards
    were equal: the trainer reports NaN)."""
    return {k: v for k, v in figures.items() if not math.isnan(v)}


def metrics_row(s: Snapshot, t: Trained, *, wall_time: float) -> dict[str, Any]:
    """The metrics.jsonl row of trained iteration `t` (`wall_time`: time.time() now)."""
    st = s.core.stats[t.iteration]
    prev = s.core.stats.get(t.iteration - 1)
    start = prev.trained_at if prev is not None and prev.trained_at else (s.t_first or s.t_start)
    period = max((st.trained_at or 0.0) - start, 1e-9)
    t_gen = (st.last_finish or 0.0) - (st.first_dispatch or 0.0)
    # the trainer's wait for samples in the period: the period less its busy time (a count that restarted with a
    # restarted trainer is its busy time since then)
    before = float(prev.trainer.get("busy_s", 0.0)) if prev is not None else 0.0
    worked = t.busy_s - before if t.busy_s >= before else t.busy_s
    wait = max(period - worked, 0.0)
    return {
        "iteration": t.iteration,
        "reward_mean": round(t.reward_mean, 4),
        "t_gen_s": round(t_gen, 4),
        "t_train_s": round(t.train_s, 4),
        "delta_s": round(t_gen - t.train_s, 4),
        "samples_per_s": round(st.samples / period, 2),
        "tokens_per_s": round(st.output_tokens / period, 1),
        "weight_version": t.version,
        "staleness": {str(k): v for k, v in sorted(st.staleness.items())},
        "loss": _finite(t.loss, 5),
        **_per_token(kl=round(t.kl, 6), clip_frac=round(t.clip_frac, 5), entropy=round(t.entropy, 5)),
        # KL to the reference policy, which algorithm.kl_coef penalises (no reference model without it)
        **({"kl_ref": _finite(t.kl_ref, 6)} if t.kl_ref is not None else {}),
        **({"value_loss": _finite(t.value_loss, 5)} if t.value_loss is not None else {}),  # PPO's critic
        # a Qwen MoE's (Qwen3MoE or Qwen2MoE) load-balancing loss, where its config.json's output_router_logits puts
        # it in the loss
        **({"router_aux_loss": _finite(t.router_aux_loss, 6)} if t.router_aux_loss is not None else {}),
        "grad_norm": _finite(t.grad_norm, 5),  # None: NaN or infinite, and the step was skipped
        **({"step_skipped": True} if t.skipped else {}),
        "lr": t.lr,
        "no_signal_frac": round(t.no_signal_frac, 4),
        # dynamic sampling: the groups dropped for equal rewards while the trainer was at this iteration
        **({"dropped_groups": st.dropped} if s.core.cfg.max_refills else {}),
        "reward_failures": s.reward_stats.failures,  # calls that raised, timed out or returned a wrong type
        "period_s": round(period, 4),
        "trainer_wait_s": round(wait, 4),
        # seconds since the job's first controller started (across resumes), and the resumes before this row's run
        "wall_s": round((st.trained_at or 0.0) - s.t_start + s.wall_offset_s, 3),
        "resumes": int(s.resilience.get("resumes", 0)),
        "t": round(wall_time, 3),
        "agents": {
            p.name: {
                "role": p.role,
                "site": s.sites.get(p.name, ""),
                "busy_s": round(p.figures.busy_s, 3),
                "state": p.state,
            }
            # the live agents, and each lost or stopped one once, in the first row after it went (its last busy
            # seconds and how it ended; the controller holds a gone agent until that row: `ControllerAgent._prune`):
            # a run that replaced a hundred units over weeks writes the units it has, not every unit it ever had
            for p in s.peers.values()
            if p.role != "client"
        },
    }


def _finite(x: float, digits: int) -> float | None:
    """A figure for a row (strict JSON): None where it is NaN or infinite."""
    return round(x, digits) if math.isfinite(x) else None


def _draining(core: ControllerCore, name: str, state: str) -> bool:
    """Whether rollout unit `name` (its peer in `state`) is draining: in dispatch no more, its samples still coming,
    or retired once they were in and told to stop, its bye not here yet (gone from `core.units`, its name in
    `core.told_to_stop`: kept while it is connected, however many units left since), versus listed as a unit that
    runs."""
    unit = core.units.get(name)
    return unit.draining if unit is not None else name in core.told_to_stop and state in LIVE_STATES


def status(s: Snapshot, *, now: float) -> dict[str, Any]:
    """The reply to a status request (`now`: time.monotonic())."""
    core = s.core
    last = s.rows.last or {}
    agents = [
        {
            "name": p.name,
            "role": p.role,
            "state": p.state,
            "version": p.figures.version,
            "site": s.sites.get(p.name, ""),
            "heartbeat_age_s": round(now - p.last_seen, 2),
            "busy_s": round(p.figures.busy_s, 2),
            # the busy phase it was in at its last heartbeat ("" waiting for work): a hang shows here first
            "phase": p.figures.phase,
            "phase_s": round(p.figures.phase_s, 1),
            "inflight": core.ledger.inflight(p.name) if p.role == "rollout" else 0,
            "draining": p.role == "rollout" and _draining(core, p.name, p.state),
        }
        for p in s.peers.values()
        if p.role != "client"
    ]
    counts = core.ledger.counts(completed_iterations=core.trainer_version)  # lost: of iterations already trained
    last_trained = core.stats.get(core.trainer_version - 1)
    r = s.reading
    state = "done" if core.done else "failed" if core.failed else "running"
    if state == "running" and s.resilience.get("paused"):  # waiting for an unreachable site (resilience.paused)
        state = "paused"
    return {
        "job": s.job.name,
        "mode": s.job.pipeline.mode,
        "eta": s.job.pipeline.eta,
        "state": "stopping" if s.stop_requested and state == "running" else state,
        "iteration": core.trainer_version,
        "iterations": s.job.iterations,
        "weight_version": core.trainer_version,
        "reward": last.get("reward_mean"),
        "rewards": asdict(s.reward_stats),  # the calls scored on_error so far, and the first of them
        "t_gen_s": last.get("t_gen_s"),
        "t_train_s": last.get("t_train_s"),
        "delta_s": last.get("delta_s"),
        "training": {k: last.get(k) for k in TRAINING}
        | {k: last[k] for k in TRAINING_IF_ANY if k in last}
        | ({"skipped_in_a_row": len(core.skipped_in_a_row)} if core.skipped_in_a_row else {}),
        "heldout": heldout_view(s.evaluations),
        "delta_window_s": None if r is None else round(r.delta_s, 4),
        "delta_prime_s": None if r is None else round(r.delta_prime_s, 4),
        "rebalance": {"auto": s.job.rebalance.auto, "why": None if r is None else r.why},
        "rollout_units": len(core.live_units),
        "free_slots": s.free_slots,
        "scale_events": s.scale_log.latest(10),
        # what `rlctl scale --wait` waits for: the controller's job dir (its events) may be on another site
        "first_sample_s": dict(s.first_samples),
        "failed_starts": dict(s.failed_starts),
        "staleness": dict(s.rows.staleness),
        "weights": weights_view(s),
        "figures_age_s": None
        if last_trained is None or last_trained.trained_at is None
        else round(now - last_trained.trained_at, 2),
        # over the last iterations (`RowBook.rate`): one async iteration's own is a burst
        "samples_per_s": s.rows.rate("samples_per_s"),
        "tokens_per_s": s.rows.rate("tokens_per_s"),
        "queue_depth": len(core.ledger.in_state(State.QUEUED, iteration=core.trainer_version)),
        "staleness_violations": s.violations,
        "elapsed_s": round(now - s.t_start, 2),  # this run's (a resumed job's controller started anew)
        # the job's, from its first controller start, where this run is a resume whose offset is known; else None
        "job_elapsed_s": round(now - s.t_start + s.wall_offset_s, 2) if s.wall_offset_s >= 1.0 else None,
        # paused: no time left (it trains nothing while it waits; `state` and resilience.paused say why), versus the
        # estimate at the pace from before the pause that status's time row no longer showed
        **progress_view(s, now=now, paused=state == "paused"),
        "metrics_port": s.metrics_port,
        # where Prometheus scrapes: bound where the controller listens; a port of its own only with metrics.port
        "metrics": {
            "address": f"{s.metrics_host}:{s.metrics_port}",
            "port_fixed": s.job.metrics.port != 0,
            "listen_field": s.listen_field,
        },
        "ledger": {
            "prompts": counts.prompts,
            "trained": counts.trained,
            "requeued": counts.requeued,
            "lost": counts.lost,
            "duplicated": counts.duplicated,
            "migrated": counts.migrated,
            "resumed": core.ledger.partials.resumed,
            **({"dropped": counts.dropped} if counts.dropped else {}),  # dynamic sampling
            **({"quarantined": counts.quarantined} if counts.quarantined else {}),  # prompts that crashed units
        },
        # prompts in flight at quarantine_after unit losses, each running alone on a unit: prompt → losses
        "suspects": {g: core.ledger.crashes[g] for g in sorted(core.suspects())},
        "resilience": dict(s.resilience),
        "data": dict(s.data),
        "agents": agents,
        "agents_gone": gone_counts(s),
    }


def gone_counts(s: Snapshot) -> dict[str, int]:
    """The agents that went, per end state: those the status reply still lists (until the metrics row after they
    went) and those it no longer does."""
    listed = [p.state for p in s.peers.values() if p.role != "client" and p.state not in LIVE_STATES]
    ended = s.gone.ended + Counter(listed)
    return {state: ended[state] for state in GONE_STATES}


# `status` estimates the time left from the pace of this run's last PACE_ROWS iterations (`RowBook.pace`), and from
# no fewer than this many: one interval right after a resume is no pace (the first iterations train samples the
# units had queued, back to back: "≈ 12 s left at 0.0 s an iteration (last 1)" with 376 iterations left)
PACE_MIN_INTERVALS = 3


def progress_view(s: Snapshot, *, now: float, paused: bool = False) -> dict[str, Any]:
    """How far a long run is: seconds an iteration over this run's last PACE_ROWS iterations (their metrics rows'
    wall times; none before PACE_MIN_INTERVALS of them), the time left at that pace (none while `paused`: the pace
    measured before the pause estimates nothing of a job that waits), and the latest complete checkpoint (version,
    age, how often)."""
    times = [r["t"] for r in s.rows.pace]
    pace = (times[-1] - times[0]) / (len(times) - 1) if len(times) > PACE_MIN_INTERVALS else None
    left = max(0, s.job.iterations - s.core.trainer_version)
    version, at = s.checkpoint if s.checkpoint is not None else (None, None)
    return {
        "pace_s": None if pace is None else round(pace, 3),
        "pace_iterations": max(0, len(times) - 1),
        "pace_after_iterations": PACE_MIN_INTERVALS + 1,  # this run's rows before a pace is estimated
        "eta_s": 0.0 if left == 0 else None if pace is None or paused else round(left * pace, 1),
        "checkpoint": {
            "version": version,
            "age_s": None if at is None else round(now - at, 1),
            "every_iterations": s.job.checkpoint.every_iterations,
        },
    }


def partials_view(core: ControllerCore) -> dict[str, Any]:
    """Partial rollouts: generations resumed from kept output (their unit was lost, or their work migrated), the
    tokens that kept from being generated again, what the store holds now, the reports its bound turned away,
    the outputs dropped as too old to resume within the staleness bound, and for generations cut by a lost unit
    what was kept and at most how much was lost: `regenerated_fraction_max` = lost ÷ (kept + lost), the share of
    a restart's regeneration that is still paid (an upper bound)."""
    p = core.ledger.partials
    return {
        "resumed": p.resumed,
        "resumed_tokens": p.resumed_tokens,
        "held": len(p.parts),
        "held_bytes": p.nbytes,
        "over_budget": p.over_budget,
        "too_old": p.too_old,
        # generations whose unit was lost: kept tokens, and the most their units generated unreported (again now)
        "interrupted": p.interrupted,
        "interrupted_kept_tokens": p.interrupted_kept_tokens,
        "interrupted_lost_tokens_max": p.interrupted_lost_tokens_max,
        "regenerated_fraction_max": (
            round(p.interrupted_lost_tokens_max / (p.interrupted_kept_tokens + p.interrupted_lost_tokens_max), 4)
            if p.interrupted_kept_tokens + p.interrupted_lost_tokens_max
            else None
        ),
        # what the lost units whose flight records the controller's host holds had really not sent
        "lost_units_measured": p.lost_units_measured,
        "interrupted_lost_tokens_measured": p.interrupted_lost_tokens_measured,
    }


def weights_view(s: Snapshot) -> dict[str, Any]:
    """The newest version, how many live units have it, and per recent version: transfers, bytes,
    encodings, bytes and copies per inter-DC link, seconds until the last unit had it."""
    v = s.core.trainer_version
    return {
        "version": v,
        "units_at_version": sum(1 for u in s.core.live_units if u.version >= v),
        "sync": s.job.weight_sync.mode,
        "inter_dc_total": {k: dict(x) for k, x in s.book.totals.items()},
        "versions": s.book.view(),
    }


def summary(s: Snapshot) -> dict[str, Any]:
    """summary.json: how the job ended, its reward curve, throughput, bubbles, staleness and ledger."""
    core, rows = s.core, s.rows
    curve = rows.reward_curve
    k = max(1, min(20, len(curve) // 10)) if curve else 0  # reward_first/last: mean of the first/last 10 %
    # throughput over this run's iterations (a resumed job's earlier rows have no stats here)
    # (the core keeps the last iterations' stats only: the older ones' counts are in `pruned`)
    ran = [core.stats[r["iteration"]] for r in rows.tail if r["iteration"] in core.stats]
    end = ran[-1].trained_at if ran else None
    span = (end - (s.t_first or s.t_start)) if end else 0.0
    samples = core.pruned.samples + sum(st.samples for st in ran)
    tokens = core.pruned.output_tokens + sum(st.output_tokens for st in ran)
    counts = core.ledger.counts(completed_iterations=core.trainer_version)
    # every agent the run had: the ones gone before the last row (the latest by name, all counted), then the ones it
    # still holds
    busy = {name: (g.role, g.busy_s) for name, g in s.gone.named.items()}
    held = {p.name: (p.role, p.figures.busy_s) for p in s.peers.values() if p.role != "client"}
    busy |= held

    def bubble(role: str) -> float | None:
        xs = [b for r, b in held.values() if r == role]
        n = len(xs) + s.gone.agents[role]
        mean = (sum(xs) + s.gone.busy_s.get(role, 0.0)) / n if n else 0.0
        return round(max(0.0, 1 - mean / span), 4) if n and span > 0 else None

    return {
        "job": s.job.name,
        "mode": s.job.pipeline.mode,
        "eta": s.job.pipeline.eta,
        "state": "done" if core.done else f"failed: {core.failed}" if core.failed else "stopped",
        # the latest SCALE_EVENTS_KEPT (those before: counted only), and every one counted per direction
        "scale_events": s.scale_log.latest(),
        **({"scale_events_unlisted": s.scale_log.unlisted()} if s.scale_log.unlisted() else {}),
        "scale_totals": {d: s.scale_log.totals[d] for d in ("out", "in")},
        "weights": weights_view(s),
        "reward_failures": _failures(rows.last, s.reward_stats.failures),
        "rewards": {**reward_view(core), **asdict(s.reward_stats)},
        "iterations": rows.count,
        "iterations_planned": s.job.iterations,
        "reward_first": round(sum(curve[:k]) / k, 4) if curve else None,
        "reward_last": round(sum(curve[-k:]) / k, 4) if curve else None,
        "reward_window": k,
        "reward_curve": list(curve),
        "samples_per_s": round(samples / span, 2) if span > 0 else None,
        "tokens_per_s": round(tokens / span, 1) if span > 0 else None,
        "run_s": round(span, 3),  # this run's: its first sample to its last trained iteration
        # the job's: its first controller's start to this run's last trained iteration, across resumes (rows' wall_s)
        "job_wall_s": rows.last.get("wall_s") if rows.last else None,
        "t_gen_s": rows.mean("t_gen_s"),
        "t_train_s": rows.mean("t_train_s"),
        "delta_s": rows.mean("delta_s"),
        "bubble_fraction": {"rollout": bubble("rollout"), "trainer": bubble("trainer")},
        "staleness": dict(rows.staleness),
        "staleness_violations": s.violations,
        "ledger": {
            "prompts": counts.prompts,
            "trained": counts.trained,
            "requeued": counts.requeued,
            "lost": counts.lost,
            "duplicated": counts.duplicated,
            "refused": counts.refused,
            "samples": counts.samples,
            "trained_samples": counts.trained_samples,
            "discarded_tokens": counts.discarded_tokens,
            "aborted": counts.aborted,
            "filtered": counts.filtered,
            "dropped": counts.dropped,
            "quarantined": counts.quarantined,
            "migrated": counts.migrated,
            "partials": partials_view(core),
        },
        "resilience": dict(s.resilience),
        "data": dict(s.data),
        "agents": {n: {"role": r, "busy_s": round(b, 3)} for n, (r, b) in busy.items()},
        **({"agents_unlisted": s.gone.unlisted()} if s.gone.unlisted() else {}),  # gone long ago: counted above
        "job_dir": s.job_dir,
    }


# -- Prometheus gauges (declared in rlctl/metrics.py) ------------------------------------------------


def _failures(row: dict[str, Any] | None, pool: int) -> int:
    """The reward calls that failed as of metrics row `row`; `pool` (the reward pool's count now, what a row written
    now would say) where there is no row or it has no count (a kept row of an older version, null or text in an
    edited file)."""
    n = row.get("reward_failures") if row else None
    return n if isinstance(n, int) and not isinstance(n, bool) else pool


def reward_view(core: ControllerCore) -> dict[str, Any]:
    """The last rewards' latencies (sample in → scored, beside the controller) and the stall limit they give."""
    seen = bool(core.reward_latency)
    stall = core.stall_s()
    return {
        "latency_p50_s": round(core.reward_quantile(0.5), 4) if seen else None,
        "latency_p90_s": round(core.reward_quantile(0.9), 4) if seen else None,
        "stall_limit_s": None if stall is None else round(stall, 4),
    }


def agent_gauges(
    m: JobMetrics, core: ControllerCore, peers: Mapping[str, AgentRecord], sites: Mapping[str, str], *, now: float
) -> None:
    """Queue depth, each agent's liveness, heartbeat age and busy phase's age, live rollout units per site."""
    # prompts, as the gauge says, of every iteration (async queues the next ones' too); not their samples
    m.queue_depth.set(len({e.prompt_id for e in core.ledger.in_state(State.QUEUED)}))
    for p in peers.values():
        if p.role == "client":
            continue
        labels = (p.role, p.name, sites.get(p.name, ""))
        m.agent_up.labels(*labels).set(1 if p.state == "running" else 0)
        m.agent_heartbeat_age_seconds.labels(*labels).set(now - p.last_seen)
        # a lost or stopped agent's last heartbeat is no phase that still runs (a hung unit its watchdog ended would
        # keep RlctlAgentBusyLong firing for as long as the controller runs)
        m.agent_phase_seconds.labels(*labels).set(p.figures.phase_s if p.state in LIVE_STATES else 0.0)
    # every site that ever had a unit: one whose last unit was lost or scaled in reads 0, not its last count
    units = {sites.get(p.name, ""): 0 for p in peers.values() if p.role == "rollout"}
    units |= {sites.get(u.name, ""): 0 for u in core.units.values()}
    # a unit gone since the last update (its agent may have left `peers` already): its site's gauge now reads 0 and
    # keeps reading it, so the units that left before need no walk (`core.left`: up to LEFT_KEPT and the plan's)
    units |= {sites[name]: 0 for name in core.left_ungauged if name in sites}
    core.left_ungauged.clear()
    for u in core.units.values():
        if u.alive:
            site = sites.get(u.name, "")
            units[site] += 1
    for site, n in units.items():
        m.rollout_units.labels(site).set(n)


def forget_agent_gauges(m: JobMetrics, p: AgentRecord, sites: Mapping[str, str]) -> None:
    """Agent `p` left the controller's books (`ControllerAgent._prune`): its label sets leave /metrics, which would
    otherwise export its last liveness, heartbeat age and phase for as long as the controller runs."""
    labels = (p.role, p.name, sites.get(p.name, ""))
    for gauge in (m.agent_up, m.agent_heartbeat_age_seconds, m.agent_phase_seconds):
        gauge.remove(*labels)


def _or_nan(x: float | None) -> float:
    """A gauge's value for a figure the job may not have: NaN (a gap on a graph) for none."""
    return math.nan if x is None else x


def iteration_gauges(m: JobMetrics, row: dict[str, Any], t: Trained, stats: IterationStats, rows: RowBook) -> None:
    """The figures of trained iteration `t` (its metrics `row`, its `stats` in the core); the rates over the last
    iterations (`rows`, which hold `row`)."""
    m.iteration.set(t.iteration + 1)  # iterations completed, as status and rlctl_weights_version count them
    m.last_trained.set(row["t"])
    m.generation_seconds.set(row["t_gen_s"])
    m.training_seconds.set(row["t_train_s"])
    m.trainer_wait_seconds.set(row["trainer_wait_s"])
    m.imbalance_seconds.set(row["delta_s"])
    m.samples_per_second.set(rows.rate("samples_per_s") or 0.0)
    m.tokens_per_second.set(rows.rate("tokens_per_s") or 0.0)
    m.reward_mean.set(t.reward_mean)
    m.grad_norm.set(t.grad_norm)
    if t.skipped:
        m.skipped_steps.inc()
    m.learning_rate.set(t.lr)
    m.clip_fraction.set(t.clip_frac)  # NaN when the iteration trained no token: a gap, not the last value
    m.entropy.set(t.entropy)
    m.loss.set(t.loss)
    m.kl.set(t.kl)  # NaN when the iteration trained no token, as the clip fraction
    # NaN, no figure (a gap, not 0), where the job has none: no reference model (kl_coef 0), no critic (GRPO), no
    # load-balancing term (a dense model, or a MoE whose config.json leaves output_router_logits false)
    m.kl_ref.set(_or_nan(t.kl_ref))
    m.value_loss.set(_or_nan(t.value_loss))
    m.router_aux_loss.set(_or_nan(t.router_aux_loss))
    m.no_signal_fraction.set(t.no_signal_frac)
    m.dropped_groups.inc(stats.dropped)
    m.weight_version.set(t.version)
    m.samples_total.labels("trained").inc(len(t.sample_ids))
    m.staleness_violations.inc(t.staleness_violations)  # (must stay 0)
    for gap, n in stats.staleness.items():
        for _ in range(n):
            m.staleness_versions.observe(gap)
