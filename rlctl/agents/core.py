"""The controller's brain, without I/O: prompt queue, dispatch, ledger, versions, staleness, stats.

Every event from the outside (an agent joined / was lost, a sample finished or was scored, weights were
applied, the trainer committed an iteration) is one method call that returns the messages to send. The
process shell (`controller.py`) owns sockets, clocks, files and the reward pool; tests drive this class.

    round r of prompts created when r ≤ trainer_version + η
         │
         ▼  dispatch: queued samples of r → units at version w with r ≤ w + η (LPT-balanced), each group
         │            reserved in the staleness buffers with deadline w + η (buffers.py; refused: it waits)
    rollout units ──sample(version)──▶ ledger: finished ──scored(reward)──▶ group complete?
         ▲                                                                      │ occupy: the earliest
         │                                                                      ▼ buffer b it may be in
         │                        sync: buffer b once full; stream/async: at once ──▶ trainer (iteration b)
         └──── weights v+1 (trainer → units) ◀── trained(b, v+1) ◀─────────────────────────────┘

A round says when a group is created and dispatched; the buffer it occupies says which iteration trains it
(the earliest with room that keeps every reservation within the bound): with η ≥ 1 a slow group — a long
generation, a reward that hangs — lets the groups that finished first fill the trainer's iteration.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from rlctl.agents import migration
from rlctl.agents.buffers import StalenessBuffers
from rlctl.agents.ledger import COMPLETE, Entry, Ledger, State
from rlctl.agents.staleness import StalenessBound
from rlctl.errors import RlctlError
from rlctl.planner.dispatch import assign_balanced

Mode = Literal["sync", "stream", "async"]
DispatchPolicy = Literal["random", "skew_aware", "oracle"]
# An iteration's share is kept this long for a unit that is still applying the weights it needs (the first
# unit to apply them must not take the whole iteration): long enough for a cross-datacenter weight transfer,
# short next to a unit that hangs (a lost unit leaves dispatch at once).
RESERVE_S = 30.0
ITERATION_PRIORITY_STEP = 1e6  # > any predicted length: the iteration dominates the admission order
# A group whose samples are all in but whose reward is still computing holds the trainer's iteration when it may
# only be trained there. Past this long (the job's `task.reward_stall_s`, else STALL_FACTOR × the median of the last
# rewards' latencies, at least STALL_FLOOR_S and STALL_P90_FACTOR × their p90) the samples whose reward is late are
# filtered out and the group trains without them; one that would keep fewer than MIN_GROUP is generated again and a
# finished group of a later iteration takes its place (`unstick`). The median: a pool with hung calls queued the
# others, and in `bench reward` 10 × a p90 of 0.16 s (median 0.016 s) set a limit of 1.6 s, near the 2 s timeout
# (hung calls are cancelled since, and others no longer queue behind them). The p90 term: a reward that is slower on
# some outputs as a rule (a verifier slower on long answers: 80 ms on 30 % of them, 2 ms on the rest) is no stall,
# and filtering those outputs out biased every batch and the reward curve (the filtered were the long, right ones).
STALL_FACTOR = 10.0
STALL_P90_FACTOR = 2.0
STALL_FLOOR_S = 0.05
STALL_MIN_SAMPLES = 32  # reward latencies seen before the automatic limit applies (worker start-up is slow)
MIN_GROUP = 2  # samples a filtered group keeps at least (a group advantage compares two or more)
# Rounds are created up to η ahead of the trainer, and no more than this many samples' worth ahead: a bound of
# thousands (a job that means "as stale as it likes") made every round at once, each sample ≈ 1.5 kB of the
# controller's memory and a request queued in a unit's engine. At 2,048 samples a round that is 128 rounds ahead.
MAX_SAMPLES_AHEAD = 262_144
RATE_REPORTS = 64  # a unit's last reports whose per-sample token rates bound what its loss cost
FINISHED_LENGTHS = 256  # output lengths of the last finished samples: the remaining-steps estimate of migration
MIGRATE_EVERY_S = 0.2  # how often the units' loads are compared (`migrate`): each look reads the samples in flight
MIGRATE_COST_SHARE = 0.05  # … and less often when a look costs more than this share of the controller's CPU


class PromptSpec(NamedTuple):
    prompt_id: str
    tokens: list[int]
    true_len: int  # the correct output length (used only by the `oracle` dispatch policy)


class Out(NamedTuple):
    """One message to send: `to` is an agent name, or "trainer" for the trainer's rank 0."""

    to: str
    kind: str
    header: dict[str, Any]
    payload: Any = None  # opaque sample payloads travel from rollout to trainer untouched


@dataclass
class CoreConfig:
    iterations: int
    prompts_per_iteration: int
    samples_per_prompt: int
    max_new_tokens: int
    mode: Mode
    eta: int
    dispatch: DispatchPolicy = "skew_aware"
    seed: int = 0
    min_units: int = 1  # rollout units to wait for before the first dispatch (the planned count)
    dc_links: list[list[str]] | None = None  # inter-DC links (datacenter pairs) for the weight plane; None = all
    reserve_s: float = RESERVE_S  # how long an iteration's share waits for a unit catching up on the weights
    reward_stall_s: float | None = None  # see STALL_FACTOR; None: automatic
    abort_stalled: bool = True  # False: a group always waits for its rewards (up to the reward timeout)
    partial_store_bytes: int = 256 << 20  # the trajectory store's bound (`rollout.partial_store_mb`)
    unit_batch: int = 64  # requests a unit runs at once (`rollout.max_batch_size`): more wait in its engine
    migrate: bool = True  # move waiting and running work to units with free rows (`rollout.migrate`)
    report_steps: int = 0  # units report after every this many decode steps too (`rollout.partial_report_steps`)
    max_refills: int = 0  # dynamic sampling: groups drawn for a round beyond its prompts, at most (0: off)
    skip_nonfinite: int = 3  # optimizer steps skipped for a NaN/Inf gradient in a row the job takes (more: failed)
    quarantine_after: int = 2  # unit losses a prompt was in flight at before it runs alone (`_blame`; 0: never)
    max_samples_ahead: int = MAX_SAMPLES_AHEAD  # rounds ahead of the trainer, in samples (at least one round)

    @property
    def rounds_ahead(self) -> int:
        """How many rounds past the trainer's version may be created: η, or fewer where η rounds would hold more than
        `max_samples_ahead` samples (at least 1: the next round)."""
        per_round = self.prompts_per_iteration * self.samples_per_prompt
        return min(self.eta, max(1, self.max_samples_ahead // max(per_round, 1)))


@dataclass
class Unit:
    name: str
    role: str
    version: int
    address: str = ""
    weights: str = ""  # its weight node's address
    datacenter: str = ""
    alive: bool = True
    busy_s: float = 0.0
    draining: bool = False  # being removed: no new work; stopped once nothing is in flight
    reachable: bool = True  # False while it is silent (its site's link down?): no work, not in the broadcast


@dataclass
class IterationStats:
    iteration: int
    first_dispatch: float | None = None
    last_finish: float | None = None
    trained_at: float | None = None
    samples: int = 0
    output_tokens: int = 0
    dropped: int = 0  # groups dropped for equal rewards while the trainer was at this iteration (dynamic sampling)
    staleness: Counter[int] = field(default_factory=Counter)
    trainer: dict[str, Any] = field(default_factory=dict)


@dataclass
class PrunedStats:
    """The delivery figures of the trained iterations `ControllerCore._prune_stats` took out of `stats` (the
    summary's throughput counts them)."""

    iterations: int = 0
    samples: int = 0
    output_tokens: int = 0


def admission_priority(iteration: int, pred_len: float) -> float:
    """Older iterations first, longest predicted first within one (LPT). With η ≥ 1 a unit holds two
    iterations; letting the newer one's long samples jump ahead would delay the trainer's step on the
    older one, hence the next weights, hence the next dispatch."""
    return pred_len - iteration * ITERATION_PRIORITY_STEP


class ControllerCore:
    def __init__(
        self,
        cfg: CoreConfig,
        *,
        prompts: Callable[[int], list[PromptSpec]],
        predict: Callable[[list[PromptSpec]], Sequence[float]] | None = None,
        refill: Callable[[int, int], PromptSpec] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`prompts(r)`: round r's prompts; `refill(r, j)`: the j-th prompt drawn for round r beyond them (dynamic
        sampling, `cfg.max_refills`)."""
        self.cfg = cfg
        self.clock = clock
        self.bound = StalenessBound(cfg.eta)
        self.ledger = Ledger()
        self.ledger.partials.budget_bytes = cfg.partial_store_bytes
        self.buffers = StalenessBuffers(capacity=cfg.prompts_per_iteration, eta=cfg.eta, last=cfg.iterations - 1)
        self.undelivered: list[str] = []  # occupied groups not sent to the trainer yet, in occupy order
        self.scoring_since: dict[str, float] = {}  # sample → when its reward started computing
        self.reward_latency: deque[float] = deque(maxlen=256)  # the last rewards' latencies (s)
        self.aborts: list[dict[str, Any]] = []  # what `unstick` did, for the controller's events (it empties it)
        self.unwanted: list[str] = []  # reward calls `unstick` gave up on: the controller cancels them, empties it
        self.aborted: set[str] = set()  # groups aborted once: their next rewards are waited for
        self.floor = 0  # the oldest round that may still have samples to dispatch; those before it are retired
        self.on_retire: Callable[[list[Entry]], None] | None = None  # gets each retired round's entries
        self.evaluating: Callable[[str], bool] = lambda unit: False  # is it decoding held-out prompts? (`_isolate`)
        self._make_prompts = prompts
        self._refill = refill
        assert refill is not None or not cfg.max_refills, "dynamic sampling draws its prompts from `refill`"
        self._predict = predict
        self._rng = random.Random(cfg.seed)
        self.units: dict[str, Unit] = {}  # the rollout units that joined and are not gone for good (all alive)
        # the names of those gone for good (lost, or stopped after a drain): their `Unit` goes (`_forget_unit`), and
        # the name tells a late message of a unit that is gone from one the job never had (`known`)
        self.left: set[str] = set()
        self.trainer: Unit | None = None
        self.trainer_version = 0  # = iterations committed; the trainer is working on this iteration
        self.prompts: dict[str, PromptSpec] = {}
        self.pred_len: dict[str, float] = {}
        self.payloads: dict[str, Any] = {}
        self.stats: dict[int, IterationStats] = {}  # the rounds in flight and the last two trained (`_prune_stats`)
        self.pruned = PrunedStats()  # what the iterations `_prune_stats` took out of `stats` still count
        self.failed: str | None = None
        self.skipped_in_a_row: list[int] = []  # the latest iterations whose optimizer step was skipped (`trained`)
        self.started = False  # waiting for agents → running: the trainer and min_units rollout units joined
        self.withdrawing: dict[str, tuple[str, int]] = {}  # donor unit → (the unit its work goes to, how many)
        self.migrations: list[dict[str, Any]] = []  # what `migrate` moved, for the controller's events (it empties it)
        self._looked = -MIGRATE_EVERY_S  # when `migrate` last compared the units' loads
        self._migrate_every = MIGRATE_EVERY_S  # how long `migrate` waits between looks (`MIGRATE_COST_SHARE`)
        self.quarantines: list[dict[str, Any]] = []  # suspects and quarantined prompts, for the controller's events
        self.clearing: set[str] = set()  # units given no new work until empty, to run a suspect alone (`_isolate`)
        self.unit_costs: dict[str, migration.Cost] = {}  # unit → its site's decode cost (the controller sets it)
        self.finished_lengths: deque[int] = deque(maxlen=FINISHED_LENGTHS)  # the last samples' output lengths
        # what bounds the tokens a lost unit took with it (`_interrupted`): when each dispatched sample was last
        # heard of (its dispatch, then each report), when each unit last reported, and its samples' token rates
        # between two reports
        self._heard_at: dict[str, float] = {}
        self._made_at: dict[str, float] = {}  # … when the unit took a sample's last report, by its clock (rates)
        self._unit_reported_at: dict[str, float] = {}
        self._rates: dict[str, deque[float]] = {}
        self._gapped: set[str] = set()  # samples with a report the store refused: only their own last one counts
        self._reported_by: dict[str, str] = {}  # sample → the unit whose report of it was kept last
        # unit → how many generations it may have started since its last report: its engine's free rows then, and
        # one more per row freed since (a sample it finished, a request it gave back); absent: not known
        self._admit_cap: dict[str, int] = {}
        # sample → (the unit that may still run it, the version its generation there answers for): its work was queued
        # again when the unit went silent or reconnected, but the unit's engine goes on with it, and answers a dispatch
        # of it back to that unit with that generation (`rollout._admit`), as old as its first dispatch there
        self._held: dict[str, tuple[str, int]] = {}

    # -- events -------------------------------------------------------------------------------------
    def join(
        self, name: str, *, role: str, version: int, address: str = "", weights: str = "", datacenter: str = ""
    ) -> list[Out]:
        unit = Unit(name, role, version, address, weights, datacenter)
        if role == "trainer":
            self.trainer = unit
        else:
            self.units[name] = unit
            self.left.discard(name)  # a stopped unit's name, a new agent's now
        return [self._members(), *self.pump(), *self.migrate(now=True)]

    def lost(
        self,
        name: str,
        *,
        at: float | None = None,
        closed: bool = False,
        unsent: int | None = None,
        evaluating: bool = False,
    ) -> list[Out]:
        """An agent is gone; `at`: when that was heard (this clock; default now); `closed`: its connection ended in
        order (everything it wrote before arrived: the process ended), not by a reset, a timeout or silence;
        `unsent`: a rollout unit's tokens generated and not sent, from its flight record where it could be read;
        `evaluating`: it was decoding a held-out evaluation too (`_blame`: its samples were not alone on it)."""
        if self.trainer is not None and name == self.trainer.name:
            self.trainer.alive = False
            self.failed = f"trainer {name} was lost"
            return []
        unit = self.units.get(name)
        if unit is None or not unit.alive:
            return []
        unit.alive = False
        self.withdrawing.pop(name, None)
        self.clearing.discard(name)
        requeued = self.ledger.requeue_agent(name)
        self._interrupted(name, requeued, at=at, closed=closed)
        if unsent is not None:
            self.ledger.partials.measured(unsent)
        self._blame(name, requeued, evaluating=evaluating)
        self._release_idle(requeued)
        self._forget_unit(name)
        return [self._members(), *self.pump()]

    def _forget_unit(self, name: str) -> None:
        """A rollout unit is gone for good (lost, or stopped after a drain): what was kept per unit for it goes, its
        `Unit` too, so that a job whose units are replaced for weeks holds only its live units' and walks only them
        (`live_units`, `_members`: each dispatch); its name stays in `left` (`known`)."""
        del self.units[name]
        self.left.add(name)
        # (a drained unit retired before its answer to a `withdraw` came: the move asked of it held its receiver
        # busy for good, `migration.plan`, which then neither took nor gave work again)
        for per_unit in (self._rates, self._unit_reported_at, self._admit_cap, self.unit_costs, self.withdrawing):
            per_unit.pop(name, None)
        for sid in [sid for sid, (unit, _) in self._held.items() if unit == name]:
            del self._held[sid]

    def _blame(self, name: str, sample_ids: list[str], *, evaluating: bool = False) -> None:
        """Unit `name` was lost holding `sample_ids`: every prompt among them counts one more loss. A prompt that
        crashes or hangs the engine (an input that trips a kernel, a tokenizer edge case, a generation that never
        ends) would otherwise take down each unit it is sent to, for ever; an innocent one shares some losses with it
        by chance. So a prompt at `quarantine_after` losses is a suspect: it runs alone on a unit (`_isolate`), and a
        suspect whose unit is lost while holding nothing else is quarantined — its group is set aside and a new
        prompt's takes its place. A suspect that completes is cleared (`_complete`). A unit that was only silent
        (`unreachable`: its link, its node) blames nothing: its samples went back to the queue before it was lost.
        A unit that was `evaluating` held the held-out prompts too: nothing on it was alone (the controller asks no
        unit that runs a suspect to evaluate, and stops the evaluation when it keeps losing units: evaluation.py)."""
        after = self.cfg.quarantine_after
        groups = sorted({self.ledger.entries[sid].prompt_id for sid in sample_ids})
        if not after or not groups:
            return
        crashes = self.ledger.crashes
        for group in groups:
            crashes[group] = n = crashes.get(group, 0) + 1
            if n < after:
                continue
            record = {"prompt": group, "losses": n, "unit": name, "with": len(groups) - 1 + int(evaluating)}
            if len(groups) == 1 and not evaluating:
                self._quarantine(group)
                self.quarantines.append({**record, "action": "quarantined"})
            elif n == after:
                self.quarantines.append({**record, "action": "suspect"})

    def _quarantine(self, group: str) -> None:
        """Set `group` aside (`Ledger.quarantine`) and draw a new prompt for its round in its place, as dynamic
        sampling does for a dropped group (sharing its count of drawn prompts: `ledger.refills`)."""
        entries = self.ledger.group(group)
        self._forget(entries)
        for e in entries:
            self._heard_at.pop(e.sample_id, None)
        self.buffers.release(group)
        r = entries[0].iteration  # its round: a group gets an iteration of its own only once it occupies a buffer
        self.ledger.quarantine(group)
        if self._refill is None:
            self.failed = f"prompt {group} crashed the rollout units that ran it, and no prompt can take its place"
            return
        drawn = self.ledger.refills.get(r, 0)
        spec = self._register([self._refill(r, drawn)])[0]
        self.ledger.refills[r] = drawn + 1
        self.ledger.add_prompt(iteration=r, prompt_id=spec.prompt_id, num_samples=self.cfg.samples_per_prompt)

    def isolating(self) -> set[str]:
        """Units that run a suspect alone or empty for one: nothing else is sent to them."""
        return self._barred(self.suspects())

    def suspects(self) -> set[str]:
        """Prompts that run alone on a unit (`_blame`)."""
        after = self.cfg.quarantine_after
        return {g for g, n in self.ledger.crashes.items() if n >= after} if after else set()

    def unreachable(self, name: str) -> list[Out]:
        """A rollout unit went silent (not lost yet: it may come back): its in-flight samples are requeued for
        the others and it leaves dispatch and the broadcast. With no unit left, dispatch simply pauses."""
        unit = self.units.get(name)
        if unit is None or not unit.alive or not unit.reachable:
            return []
        unit.reachable = False
        self.withdrawing.pop(name, None)  # its answer may never come
        self._still_held(name)
        requeued = self.ledger.requeue_agent(name)
        self._interrupted(name, requeued)
        self._release_idle(requeued)
        return [self._members(), *self.pump()]

    def _interrupted(self, name: str, sample_ids: list[str], *, at: float | None = None, closed: bool = False) -> None:
        """Count the generations the unit held, `sample_ids` (`TrajectoryStore.interrupt`): each kept its reported
        output, and lost at most what it generated after it was last accounted for — a unit's report carries every
        running generation's new tokens, so that is after the later of the unit's last report and the sample's own
        last kept report or dispatch (its own only, once the store refused one of its reports) until `at` (when the
        loss was heard: default now) — at the fastest per-sample rate the unit's reports showed (all it had left
        when no rate is known). Times are arrivals on this clock, so the bound holds but for the jitter of the
        network's delay between the last report and the loss.

        Units that report after every `report_steps` decode steps, whose connection ended in order (`closed`: every
        report they wrote arrived), lost at most that many tokens of each generation whose reports were all kept:
        a step adds one token to a generation (rlctl's engines decode one token per step), and fewer steps than
        that ran after the last report. Of the generations no report of this unit showed, at most its admission
        cap (`reported`: the rows free at its last report, plus each freed since) started after that report;
        the others were still waiting in its queue and lost nothing. Which ones started is not known, so the
        cap is charged to the first of them."""
        now = self.clock() if at is None else at
        rate = max(self._rates.pop(name, ()), default=0.0)
        unit_t = self._unit_reported_at.pop(name, float("-inf"))
        cap = self._admit_cap.pop(name, None)
        for sid in sample_ids:
            own = self._heard_at.pop(sid, now)
            gapped = sid in self._gapped
            self._gapped.discard(sid)
            since = now - (own if gapped else max(unit_t, own))
            kept = len(self.ledger.partials.parts.get(sid, ()))
            most = max(self.cfg.max_new_tokens - kept, 0)
            if rate:
                most = min(most, math.ceil(rate * max(since, 0.0) - 1e-9))  # a bound: whole tokens, up
            if closed and self.cfg.report_steps and not gapped:
                most = min(most, self.cfg.report_steps)
                if cap is not None and self._reported_by.get(sid) != name:  # not started here, or one of `cap`
                    most, cap = (most, cap - 1) if cap > 0 else (0, 0)
            self.ledger.partials.interrupt(sid, lost_at_most=most)
            self._made_at.pop(sid, None)
            self._reported_by.pop(sid, None)

    def _still_held(self, name: str) -> None:
        """Unit `name`'s samples are about to be queued again while the unit may go on running them: a dispatch of
        one back to it answers for the version its generation there began with (`_held`), not the unit's now."""
        for e in self.ledger.running(name):
            assert e.dispatch_version is not None
            held = self._held.get(e.sample_id)
            version = e.dispatch_version if held is None or held[0] != name else min(held[1], e.dispatch_version)
            self._held[e.sample_id] = (name, version)

    def rejoin(self, name: str, *, version: int, requeue: bool) -> list[Out]:
        """An unreachable (or reconnecting) rollout unit is back at weight `version`. `requeue`: it came back on
        a new connection, so work sent on the old one may never have arrived: what it holds is queued again
        (a late result of it is refused by the ledger, or accepted if the same sample is dispatched to it again)."""
        unit = self.units.get(name)
        if unit is None or not unit.alive:
            return []
        unit.reachable = True
        unit.version = max(unit.version, version)
        if requeue:
            self.withdrawing.pop(name, None)  # asked on the old connection: the answer may never come
            self._still_held(name)
            requeued = self.ledger.requeue_agent(name)
            self._interrupted(name, requeued)
            self._release_idle(requeued)
        return [self._members(), *self.pump()]

    def drain(self, name: str) -> list[Out]:
        """Take a rollout unit out of dispatch; it is told to stop once its in-flight samples are in."""
        unit = self.units[name]
        unit.draining = True
        return self._retire_drained()

    def _retire_drained(self) -> list[Out]:
        out = []
        for u in list(self.units.values()):
            if u.alive and u.draining and self.ledger.inflight(u.name) == 0:
                u.alive = False
                self._forget_unit(u.name)
                out += [Out(u.name, "stop", {}), self._members()]
        return out

    @property
    def live_units(self) -> list[Unit]:
        """Rollout units in dispatch (alive, reachable and not draining)."""
        return [u for u in self.units.values() if u.alive and u.reachable and not u.draining]

    def known(self, name: str) -> bool:
        """Whether rollout unit `name` joined the job (it may be gone since)."""
        return name in self.units or name in self.left

    @property
    def num_joined(self) -> int:
        """Rollout units that joined the job, those gone since among them (by name: a name taken again counts once)."""
        return len(self.units) + len(self.left)

    def weights_applied(self, name: str, version: int) -> list[Out]:
        unit = self.units.get(name)
        if unit is None:  # gone since it fetched the version (a late report)
            return []
        unit.version = max(unit.version, version)
        return self.pump() + self.migrate(now=True)

    def sample(
        self,
        name: str,
        *,
        sample_id: str,
        version: int,
        output_tokens: int,
        payload: Any,
        reward: float | None,
        attempt: int | None = None,
    ) -> list[Out]:
        """A unit finished a sample; `reward` when it is scored already (else `scored` brings it later); `attempt`:
        the dispatch its generation answers (`Ledger.finish`)."""
        if name in self._admit_cap:
            self._admit_cap[name] += 1  # its row is free again, whether the ledger takes the sample or not
        if self._held.get(sample_id, ("", 0))[0] == name:
            del self._held[sample_id]  # its generation there is over, whether the ledger takes it or not
        if not self.ledger.finish(sample_id, agent=name, version=version, output_tokens=output_tokens, attempt=attempt):
            return []
        self.ledger.partials.drop(sample_id)
        for times in (self._heard_at, self._made_at):
            times.pop(sample_id, None)
        self._gapped.discard(sample_id)
        self._reported_by.pop(sample_id, None)
        self.payloads[sample_id] = payload
        self.finished_lengths.append(output_tokens)
        st = self.stats[self.ledger.entries[sample_id].iteration]
        st.last_finish = self.clock()
        if reward is not None:
            self.ledger.score(sample_id, attempt=self.ledger.entries[sample_id].attempts, reward=reward)
            self._complete(self.ledger.entries[sample_id].prompt_id)
        else:
            self.scoring_since[sample_id] = self.clock()
        return self.pump() + self._retire_drained()

    def partial(
        self,
        name: str,
        *,
        sample_id: str,
        start: int,
        tokens: list[int],
        logprobs: list[float],
        versions: list[int],
        made_s: float = 0.0,
        heard_s: float | None = None,
    ) -> bool:
        """A unit's report of a running sample's output from index `start` on; kept (True) only while the sample
        is dispatched to that unit (a late report of a lost unit is ignored) and the store takes it. `made_s`: the
        unit's clock when it took the report (0: the arrival stands in for it); `heard_s`: when it arrived (this
        clock; default now)."""
        if self.ledger.dispatched_to(sample_id, name) is None:
            return False
        now = self.clock() if heard_s is None else heard_s
        made = made_s or now
        last = self._made_at.get(sample_id)
        if last is not None and made > last and tokens:  # between two reports: a rate of generating, not waiting
            self._rates.setdefault(name, deque(maxlen=RATE_REPORTS)).append(len(tokens) / (made - last))
        self._made_at[sample_id] = made
        self._unit_reported_at[name] = now
        if not self.ledger.partials.extend(sample_id, start, tokens, logprobs, versions):
            self._gapped.add(sample_id)  # its output since its last kept report is not here
            return False
        self._heard_at[sample_id] = now
        self._reported_by[sample_id] = name
        return True

    def reported(self, name: str, *, free_rows: int | None) -> None:
        """Unit `name`'s report (its parts went to `partial`) said its engine had `free_rows` rows free (None:
        not known): at most that many of the generations it holds may have started after it (`_interrupted`). The
        late report of a unit gone for good (still in the inbox as it was lost) is not kept: nothing reads it, and
        `_forget_unit` has run (it was kept for the rest of the run)."""
        if name not in self.units:
            return
        if free_rows is None:
            self._admit_cap.pop(name, None)
        else:
            self._admit_cap[name] = free_rows

    def awaiting_reward(self, sample_id: str) -> int | None:
        """The attempt whose reward `sample_id` waits for (pass it back to `scored`), or None."""
        e = self.ledger.entries.get(sample_id)
        return e.attempts if e is not None and e.state is State.FINISHED and e.reward is None else None

    def reward_lost(self, sample_id: str, *, attempt: int, why: str | None = None) -> str | None:
        """A reward call ended without a result (cancelled): why the job cannot go on when `sample_id` still waits
        for that attempt's reward (nothing would ever score it, and its iteration would wait for ever); None when
        it does not (a call given up on purpose: its sample was filtered out or generated again). `why`: what the
        reward pool said when it failed (a function no worker could load), if it did."""
        if self.awaiting_reward(sample_id) != attempt:
            return None
        why = why or "see the controller's log"
        return (
            f"the reward call of sample {sample_id} ended without a result while its iteration waited for it "
            f"(the reward pool stopped: {why})"
        )

    def scored(self, sample_id: str, *, attempt: int, reward: float) -> list[Out]:
        """The reward of attempt `attempt` of a finished sample (one of an attempt since requeued is dropped)."""
        if not self.ledger.score(sample_id, attempt=attempt, reward=reward):
            return []
        since = self.scoring_since.pop(sample_id, None)
        if since is not None:
            self.reward_latency.append(self.clock() - since)
        self._complete(self.ledger.entries[sample_id].prompt_id)
        return self.pump()

    def stall_s(self) -> float | None:
        """How long a reward may hold the trainer's iteration before `unstick` filters its sample out (or generates
        its group again) — None: not known yet, or the job waits for rewards."""
        if not self.cfg.abort_stalled:
            return None
        if self.cfg.reward_stall_s is not None:
            return self.cfg.reward_stall_s
        if len(self.reward_latency) < STALL_MIN_SAMPLES:
            return None
        return max(
            STALL_FLOOR_S, STALL_FACTOR * self.reward_quantile(0.5), STALL_P90_FACTOR * self.reward_quantile(0.9)
        )

    def reward_quantile(self, q: float) -> float:
        """The q-quantile of the last rewards' latencies (0.0 before any)."""
        lat = sorted(self.reward_latency)
        return lat[int(q * (len(lat) - 1))] if lat else 0.0

    def unstick(self) -> list[Out]:
        """The trainer's iteration b waits for a group that may only be trained there, whose samples are all in and
        some of whose rewards have been computing longer than `stall_s`: those samples are filtered out (their
        tokens discarded, a late reward ignored) and the group is trained without them at once — StaleFlow's filter.
        A group that would keep fewer than MIN_GROUP samples is generated again instead (its tokens counted as
        discarded), and its entry goes to the first finished group of a later iteration (`pump` moves it:
        `_fill_forward`) or, with none yet, to the next group to finish; once only per group: a reward that hangs
        on the same output every time is then waited for (up to its timeout, scored `reward_on_error`), so a
        group cannot be put off for ever. `aborts` records each (its `filtered` says which)."""
        limit = self.stall_s()
        b = self.buffers.consumed
        if limit is None or self.done or self.failed or self.buffers.ready(b) or not self.scoring_since:
            return []
        now = self.clock()
        # a reward holds the trainer only once the trainer waits for iteration b: since it trained b − 1
        prev = self.stats.get(b - 1)
        idle = prev.trained_at if prev is not None and prev.trained_at is not None else float("-inf")

        def held(e: Entry) -> float:
            return now - max(self.scoring_since.get(e.sample_id, now), idle)

        changed = False
        for group, due in list(self.buffers.deadline.items()):
            entries = self._kept(group)
            if due != b or not all(e.state is State.FINISHED for e in entries):
                continue
            late = [e for e in entries if e.reward is None and held(e) >= limit]
            if not late:
                continue
            waited = round(max(held(e) for e in late), 3)
            if len(entries) - len(late) >= MIN_GROUP:  # filtered out: the group trains without them
                self._forget(late, late=limit)
                for e in late:
                    self.ledger.filter(e.sample_id)
                self._complete(group)
                self.aborts.append({"group": group, "iteration": b, "waited_s": waited, "filtered": len(late)})
            elif group not in self.aborted:  # too few would be left: generated again, once per group
                self._forget(entries, late=limit)
                self.buffers.release(group)
                self.ledger.abort_group(group)
                self.aborted.add(group)
                self.aborts.append({"group": group, "iteration": b, "waited_s": waited, "filtered": 0})
            else:
                continue
            changed = True
        return self.pump() if changed else []

    def _forget(self, entries: list[Entry], *, late: float | None = None) -> None:
        """Their rewards and outputs are not waited for any more (the reward calls still running: `unwanted`).
        `late`: the stall limit they were given up on at (`unstick`): it counts as each call's latency among the
        reward latencies (a lower bound). Left out, the automatic limit saw only the rewards it let finish, and a
        reward slower on some outputs as a rule (the long answers) was filtered out for ever, never raising it; with
        it, more than a tenth filtered raise the p90, hence the limit. Not the calls' whole time so far: in async mode
        a hung call may have run most of its timeout before it held the trainer, and the limit then passed the
        timeout (`bench reward`: 5 timeouts)."""
        for e in entries:
            if self.scoring_since.pop(e.sample_id, None) is not None:
                self.unwanted.append(e.sample_id)
                if late is not None:
                    self.reward_latency.append(late)
            self.payloads.pop(e.sample_id, None)

    def _fill_forward(self) -> list[Out]:
        """Entries of the trainer's iteration that no reservation needs take finished groups of later iterations
        (`StalenessBuffers.fill_forward`); the trainer, which holds them already, is told (`regroup`)."""
        out = []
        for group, frm in self.buffers.fill_forward():
            to = self.buffers.consumed
            self.ledger.assign(group, iteration=to)
            if group in self.undelivered:
                continue  # not sent yet (no trainer to send it to): it goes with its new iteration, counted then
            entries = self._kept(group)  # the delivery figures follow the samples
            self._tally(frm, entries, -1)
            self._tally(to, entries, +1)
            out.append(Out("trainer", "regroup", {"groups": [group], "iteration": to}))
        return out

    def _tally(self, it: int, entries: list[Entry], sign: int) -> None:
        """Count delivered samples into (sign +1) or out of (-1) iteration `it`'s figures."""
        st = self.stats[it]
        for e in entries:
            assert e.sample_version is not None
            st.samples += sign
            st.output_tokens += sign * e.output_tokens
            st.staleness[it - e.sample_version] += sign
        st.staleness = +st.staleness  # drop the ages no sample has any more

    def _complete(self, group: str) -> None:
        """When every sample of `group` (but those filtered out) is finished and scored: it occupies the earliest
        buffer it may (then it goes to the trainer), or, with no room within its bound, it is generated again."""
        entries = self._kept(group)
        if not all(e.state is State.FINISHED and e.reward is not None for e in entries):
            return
        self.ledger.crashes.pop(group, None)  # it ran to the end: whatever crashed with it was not its doing
        if self._dropped(group, entries):
            return
        oldest = min(e.sample_version for e in entries if e.sample_version is not None)
        b = self.buffers.occupy(group, oldest)
        if b is None:  # the whole group, its filtered samples too (as `abort_group`): else it trained short of them
            for e in self.ledger.group(group):
                self.ledger.requeue_stale(e.sample_id)
                self.payloads.pop(e.sample_id, None)
            return
        self.ledger.assign(group, iteration=b)
        self.undelivered.append(group)

    def _dropped(self, group: str, entries: list[Entry]) -> bool:
        """DAPO's dynamic sampling: a complete group whose rewards are all equal has no advantage and trains
        nothing (`group_advantages`), so it is dropped and a new prompt's group of the same round takes its place
        in the staleness buffers: the trainer's iterations are full of groups with signal. At most `max_refills`
        per round; past that, such a group trains as it is (the trainer's `no_signal_frac` shows them)."""
        if self.done or not self.cfg.max_refills or len(entries) < MIN_GROUP or len({e.reward for e in entries}) != 1:
            return False
        r = entries[0].iteration  # the group's round: a group is assigned an iteration when it occupies a buffer
        drawn = self.ledger.refills.get(r, 0)
        if drawn >= self.cfg.max_refills:
            return False
        self._forget(entries)
        self.buffers.release(group)
        self.ledger.drop_group(group)
        assert self._refill is not None
        spec = self._register([self._refill(r, drawn)])[0]
        self.ledger.refills[r] = drawn + 1
        self.ledger.add_prompt(iteration=r, prompt_id=spec.prompt_id, num_samples=self.cfg.samples_per_prompt)
        self.stats[self.trainer_version].dropped += 1
        return True

    def _release_idle(self, requeued: list[str]) -> None:
        """Groups with nothing in flight, done or kept any more (their unit went) give their reservation back. A
        group with kept output keeps it (StaleFlow: an interrupted trajectory keeps its buffer entry), so that the
        output can always resume within its bound."""
        kept = self.ledger.partials.parts
        for group in {self.ledger.entries[sid].prompt_id for sid in requeued}:
            if all(e.state is State.QUEUED and not kept.get(e.sample_id) for e in self.ledger.group(group)):
                self.buffers.release(group)

    def trained(
        self, *, iteration: int, version: int, sample_ids: list[str], stats: dict[str, Any], skipped: bool = False
    ) -> list[Out]:
        """Iteration `iteration` is trained (`skipped`: its gradient was not finite, so the trainer took no optimizer
        step). More than `skip_nonfinite` skipped in a row fail the job: something keeps producing NaN or infinite
        gradients (the data, the learning rate, the weights), and going on would only train nothing."""
        assert iteration == self.trainer_version, (iteration, self.trainer_version)
        self.skipped_in_a_row = [*self.skipped_in_a_row, iteration] if skipped else []
        if len(self.skipped_in_a_row) > self.cfg.skip_nonfinite:
            first, last = self.skipped_in_a_row[0], self.skipped_in_a_row[-1]
            self.failed = (
                f"the trainer's gradient norm was NaN or infinite at {len(self.skipped_in_a_row)} steps in a row "
                f"(iterations {first}–{last}), more than trainer.skip_nonfinite ({self.cfg.skip_nonfinite}) allows; "
                f"those steps were skipped, so the weights are still those of v{first}"
            )
        for sid in sample_ids:
            self.ledger.mark_trained(sid)
        self.buffers.consume()
        self.trainer_version = version
        st = self.stats[iteration]
        st.trained_at, st.trainer = self.clock(), stats
        self._advance_floor()  # (the last one too: `pump` does nothing once the job is done)
        self._prune_stats()
        return self.pump()  # when done, the controller stops everyone once the last version reached the units

    def _prune_stats(self) -> None:
        """A job runs for weeks: `stats` keeps the rounds still in flight (from the floor on: dispatch, results and
        deliveries count into them) and the last two trained iterations (a metrics row reads the one trained and the
        one before it); the older ones' sample and token counts go on in `pruned`."""
        keep_from = min(self.floor, self.trainer_version - 2)
        for it in [k for k in self.stats if k < keep_from]:
            st = self.stats.pop(it)
            self.pruned.iterations += 1
            self.pruned.samples += st.samples
            self.pruned.output_tokens += st.output_tokens

    @property
    def done(self) -> bool:
        return self.trainer_version >= self.cfg.iterations

    # -- the pump: create, dispatch, deliver --------------------------------------------------------
    def start_now(self) -> list[Out]:
        """Stop waiting for the planned rollout units (some never came); run with those present."""
        self.started = self.trainer is not None and any(u.alive for u in self.units.values())
        return self.pump()

    def pump(self) -> list[Out]:
        if self.failed or self.done:
            return []
        if not self.started:
            alive = len(self.live_units)
            self.started = self.trainer is not None and alive >= self.cfg.min_units
            if not self.started:
                return []
        while self.created < self.cfg.iterations and self.created <= self.trainer_version + self.cfg.rounds_ahead:
            self._create(self.created)  # the round's prompts enter the ledger: `created` counts it
        return self._dispatch() + self.migrate() + self._deliver() + self._fill_forward()

    # -- migration ----------------------------------------------------------------------------------
    def migrate(self, *, now: bool = False) -> list[Out]:
        """`_migrate`, at most every MIGRATE_EVERY_S, or every MIGRATE_COST_SHARE⁻¹ × the last look's CPU seconds
        when that is longer (a look reads every sample in flight: 34,816 at η 16 with 2,048 samples a round, 15 ms
        of CPU), unless `now` (a unit joined or caught up)."""
        t = self.clock()
        if not now and t - self._looked < self._migrate_every:
            return []
        self._looked = t
        began = time.thread_time()
        out = self._migrate()
        self._migrate_every = max(MIGRATE_EVERY_S, (time.thread_time() - began) / MIGRATE_COST_SHARE)
        return out

    def _in_flight(self) -> Iterator[Entry]:
        """Samples dispatched and not finished, unit by unit (the ledger keeps them: no scan of the rounds)."""
        return self.ledger.all_running()

    def _migrate(self) -> list[Out]:
        """Work moves to units with free rows (`rlctl.agents.migration`): each donor is asked to `withdraw` n
        requests and answers with what it took out (`withdrawn`)."""
        if not self.cfg.migrate or not self.started:
            return []
        running: dict[str, list[Entry]] = {}
        for e in self._in_flight():
            running.setdefault(str(e.agent), []).append(e)
        residual = self._residual()
        loads = []
        barred = self.isolating()
        for u in self.live_units:
            if u.name in barred:
                continue  # it runs a suspect alone, or empties for one
            mine = running.get(u.name, [])
            done = [len(self.ledger.partials.parts.get(e.sample_id, ())) for e in mine]
            steps = sum(residual(n) for n in done) / len(mine) if mine and residual is not None else None
            prefill = sum(len(self.prompts[e.prompt_id].tokens) + n for e, n in zip(mine, done, strict=True))
            cost = self.unit_costs.get(u.name)
            loads.append(migration.Load(u.name, u.version, len(mine), cost, steps, prefill / max(len(mine), 1)))
        out = []
        for donor, to, n in migration.plan(loads, self.withdrawing, batch=self.cfg.unit_batch):
            self.withdrawing[donor] = (to, n)
            out.append(Out(donor, "withdraw", {"count": n}))
        return out

    def _residual(self) -> Callable[[int], float] | None:
        """Expected decode steps left for a sample with n output tokens so far: the mean of L − n over the last
        finished lengths L > n (max_new_tokens − n when none is that long); None before any sample finished."""
        if not self.finished_lengths:
            return None
        lengths = sorted(self.finished_lengths)
        tail = list(itertools.accumulate(reversed(lengths)))[::-1]  # tail[i] = sum(lengths[i:])
        cap = self.cfg.max_new_tokens

        def left(n: int) -> float:
            i = bisect.bisect_right(lengths, n)
            return tail[i] / (len(lengths) - i) - n if i < len(lengths) else max(cap - n, 1)

        return left

    def withdrawn(self, name: str, parts: list[tuple[str, list[int], list[float], list[int]]]) -> list[Out]:
        """Unit `name` took these requests out of its engine (sample id, output so far: tokens, log-probs,
        versions): each resumes on the unit `migrate` chose (else wherever dispatch puts it)."""
        to, _ = self.withdrawing.pop(name, ("", 0))
        if name in self._admit_cap:
            self._admit_cap[name] += len(parts)  # rows it may have freed
        moved: list[Entry] = []
        tokens_moved = 0
        for sample_id, tokens, logprobs, versions in parts:
            if self._held.get(sample_id, ("", 0))[0] == name:
                del self._held[sample_id]  # taken out of its engine
            e = self.ledger.dispatched_to(sample_id, name)
            if e is None:
                continue
            self.ledger.partials.drop(sample_id)
            self._reported_by.pop(sample_id, None)
            if tokens and self.ledger.partials.extend(sample_id, 0, tokens, logprobs, versions):
                tokens_moved += len(tokens)  # the output it resumes from (its `migrated` event's tokens)
            else:
                self.ledger.discarded_tokens += len(tokens)  # past the store's bound: the sample starts over
            self.ledger.migrate(sample_id)
            moved.append(e)
        out: list[Out] = []
        target = self.units.get(to)
        # not a suspect's (a loss since the ask may have made one): each runs alone, as `_isolate` sends it
        suspects = self.suspects()
        given = [e for e in moved if e.prompt_id not in suspects]
        if given and target is not None and target in self.live_units and target.name not in self.isolating():
            for it in sorted({e.iteration for e in given}):
                if self.bound.may_dispatch(iteration=it, unit_version=target.version):
                    out += self._give(target, [e for e in given if e.iteration == it], it)
        self.migrations.append(
            {
                "from": name,
                "to": to,
                "samples": len(moved),
                "tokens": tokens_moved,
                "sent": sum(len(o.header["requests"]) for o in out),
            }
        )
        return out + self.pump()

    def restore(self, *, version: int, ledger: Ledger) -> None:
        """Continue from the checkpoint of `version`: the iterations before it are trained; every other entry
        of `ledger` is queued again (`Ledger.from_json`), to be generated on the checkpoint's weights."""
        assert not self.started and self.created == 0, "restore before the first agent joins"
        ledger.forget_rounds(self.cfg.iterations)  # (the job's count lowered since: rounds past it are not generated)
        queued = {e.prompt_id for e in ledger.entries.values() if e.state is State.QUEUED}
        # the rounds whose groups are generated again: a group keeps the round it was created in (a checkpoint from
        # before rounds were kept: within η of the buffer it had)
        rounds: set[int] = set()
        eta = self.cfg.eta
        for e in ledger.entries.values():
            if e.state is State.QUEUED:
                rounds |= {e.round} if e.round is not None else set(range(e.iteration - eta, e.iteration + eta + 1))
        # a group of an earlier round not trained yet (a slow one, pushed to a later buffer) is generated again
        # in the first round from here
        for group in queued:
            if ledger.group(group)[0].iteration < version:
                ledger.assign(group, iteration=version)
        self.ledger, self.trainer_version = ledger, version
        ledger.partials.budget_bytes = self.cfg.partial_store_bytes
        ledger.partials.keep_upto(version)  # output of weights past the checkpoint is not in this run's lineage
        self.buffers.consumed = self.floor = version
        # the rounds created (an iteration a group occupied may be before its round: not a measure of them)
        legacy = max((e.iteration + 1 for e in ledger.entries.values()), default=0)  # a checkpoint without rounds
        ledger.rounds = max(ledger.rounds or legacy, version)
        for it in sorted(i for i in ledger.by_iteration if i < version):  # trained, not retired when it was written
            self._retire(it)
        for iteration in range(version, self.created):
            self.stats[iteration] = IterationStats(iteration)
        for r in sorted(x for x in rounds if 0 <= x < self.created):  # the prompts to be generated again
            drawn = self._make_prompts(r)
            if self._refill is not None:  # and those drawn in place of dropped groups
                drawn += [self._refill(r, j) for j in range(ledger.refills.get(r, 0))]
            self._register([spec for spec in drawn if spec.prompt_id in queued])
        if missing := sorted(queued - self.prompts.keys()):
            # (else the first dispatch of one failed the run mid-way: `controller error: KeyError: 'p8'`)
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise RlctlError(
                f"checkpoint v{version} holds prompts to generate again that the job no longer draws for their rounds "
                f"({', '.join(missing[:3])}{more}): its batch.prompts_per_iteration, data or task changed since "
                "the checkpoint was written (job.json edited)",
                hint="put job.json's batch and task back as they were at the launch, or launch the changed job anew",
            )

    @property
    def created(self) -> int:
        """Rounds whose prompts are in the ledger (0 … created − 1)."""
        return self.ledger.rounds

    def _specs(self, iteration: int) -> list[PromptSpec]:
        """The iteration's prompts (a function of the iteration) with their predicted output lengths."""
        specs = self._make_prompts(iteration)
        assert len(specs) == self.cfg.prompts_per_iteration
        return self._register(specs)

    def _register(self, specs: list[PromptSpec]) -> list[PromptSpec]:
        """Prompts about to be generated, with their predicted output lengths."""
        preds: Sequence[float]
        if not specs:
            return specs
        if self.cfg.dispatch == "oracle":
            preds = [float(p.true_len) for p in specs]
        elif self.cfg.dispatch == "skew_aware" and self._predict is not None:
            preds = self._predict(specs)
        else:
            preds = [0.0] * len(specs)
        for spec, pred in zip(specs, preds, strict=True):
            self.prompts[spec.prompt_id] = spec
            self.pred_len[spec.prompt_id] = float(pred)
        return specs

    def _create(self, iteration: int) -> None:
        for spec in self._specs(iteration):
            self.ledger.add_prompt(
                iteration=iteration, prompt_id=spec.prompt_id, num_samples=self.cfg.samples_per_prompt
            )
        self.stats[iteration] = IterationStats(iteration)

    def _dispatch(self) -> list[Out]:
        """Each round's queued samples over the units that may generate them, balanced with what each unit
        already holds; the shares of units still catching up on the weights wait for them (`_pool`). A sample
        goes out only if its group's reservation in the staleness buffers stays feasible at that unit's version
        (else it waits for a unit with newer weights)."""
        out: list[Out] = []
        now = self.clock()
        self._advance_floor()
        suspects = self.suspects()
        out += self._isolate(suspects)  # first: a unit it does not keep emptying for takes other work below
        barred = self._barred(suspects)
        for it in range(self.floor, self.created):
            if not self.ledger.queued_count(it):  # (most rounds in flight: all their samples out)
                continue
            queued = [e for e in self.ledger.in_state(State.QUEUED, iteration=it) if e.prompt_id not in suspects]
            units = [
                u
                for u in self.live_units
                if u.name not in barred and self.bound.may_dispatch(iteration=it, unit_version=u.version)
            ]
            if not queued or not units:
                continue
            st = self.stats[it]
            if st.first_dispatch is None:
                st.first_dispatch = now
            ready = {u.name for u in units}
            pool = self._pool(it, units, ready | barred, waited=now - st.first_dispatch)
            for unit, entries in zip(pool, self._assign(queued, pool), strict=True):
                if entries and unit.name in ready:
                    out += self._give(unit, entries, it)
        return out

    def _barred(self, suspects: set[str]) -> set[str]:
        """Units that take no work but a suspect's (`_blame`): those holding one, and those emptying for one."""
        if not suspects:
            self.clearing.clear()
            return set()
        holding = {str(e.agent) for e in self._in_flight() if e.prompt_id in suspects}
        self.clearing -= holding
        return holding | self.clearing

    def _isolate(self, suspects: set[str]) -> list[Out]:
        """Each suspect with samples queued goes, all of them, to a live unit that holds nothing else (no held-out
        evaluation either: `evaluating`). With none empty, the least loaded unit takes no new work until it is
        (`clearing`: the controller pumps meanwhile, as nothing may come from it when it empties by ending an
        evaluation); at most half the live units (one at least) hold or wait for suspects, so the rest of the job goes
        on meanwhile."""
        if not suspects:
            return []
        waiting: dict[str, list[Entry]] = {}
        for it in range(self.floor, self.created):
            for e in self.ledger.in_state(State.QUEUED, iteration=it):
                if e.prompt_id in suspects:
                    waiting.setdefault(e.prompt_id, []).append(e)
        if not waiting:
            self.clearing.clear()
            return []
        running = list(self._in_flight())
        held = Counter(str(e.agent) for e in running)
        started = {e.prompt_id for e in running}
        busy = {str(e.agent) for e in running if e.prompt_id in suspects}
        live = self.live_units
        cap = max(1, len(live) // 2)
        keep: set[str] = set()  # units emptying for a suspect that may go to them now
        out: list[Out] = []
        for group, entries in sorted(waiting.items()):
            if group in started:
                continue  # part of it runs already (alone, or where it was before it became a suspect): the rest waits
            it = entries[0].iteration
            fit = [
                u
                for u in live
                if u.name not in busy
                and self.bound.may_dispatch(iteration=it, unit_version=u.version)
                and self.buffers.may_reserve(group, u.version)
            ]  # none: it waits, holding no unit (a unit emptied for it would idle, and could hold the trainer)
            empty = [u for u in fit if held[u.name] == 0 and not self.evaluating(u.name)]
            if empty:
                unit = min(empty, key=lambda u: (u.name not in self.clearing, u.name))
                sent = self._give(unit, entries, it)
                if sent:
                    busy.add(unit.name)
                    out += sent
                continue
            mine = [u.name for u in fit if u.name in self.clearing and u.name not in keep]
            if mine:
                keep.add(mine[0])
            elif len(busy | keep) < cap and (free := [u for u in fit if u.name not in keep]):
                keep.add(min(free, key=lambda u: (held[u.name], u.name)).name)
        self.clearing = keep - busy
        return out

    def _advance_floor(self) -> None:
        """Past the trained rounds every sample of which is complete, retiring each."""
        while self.floor < self.trainer_version and all(
            e.state in COMPLETE for e in self.ledger.iteration_entries(self.floor)
        ):
            self._retire(self.floor)
            self.floor += 1

    def _retire(self, iteration: int) -> None:
        """A round every group of which is complete leaves the ledger (`Ledger.retire`) and the prompts' specs go:
        the controller holds what may still change, not the job's history, which goes to `on_retire` (the sample
        log)."""
        entries = self.ledger.retire(iteration)
        for e in entries:
            self._held.pop(e.sample_id, None)
        for prompt_id in {e.prompt_id for e in entries}:
            self.prompts.pop(prompt_id, None)
            self.pred_len.pop(prompt_id, None)
            self.aborted.discard(prompt_id)
        if entries and self.on_retire is not None:
            self.on_retire(entries)

    def _give(self, unit: Unit, entries: list[Entry], it: int) -> list[Out]:
        """Dispatch queued samples of round `it` to `unit`: those whose group may reserve at its version; a sample
        with kept output resumes from it."""
        reqs = []
        for e in entries:
            held = self._held.get(e.sample_id)
            oldest = None
            if held is not None and held[0] == unit.name and held[1] < unit.version:
                # it may still run the sample, begun on older weights: its generation answers for those …
                oldest = self._reservable(e, held[1])
            if oldest is None:
                # … unless they are too old for any buffer with room (or it never got the sample: a reconnection):
                # then the unit's, so that it is not kept from the sample for ever; its old generation, if it
                # answers, is as old as it says (`Ledger.finish`), and a group it leaves no room for is generated
                # again (`_complete`)
                oldest = self._reservable(e, unit.version)
            if oldest is None:
                continue
            self.buffers.reserve(e.prompt_id, oldest)
            # the version the sample answers for: the unit's, or its kept output's oldest token's
            self.ledger.dispatch(e.sample_id, agent=unit.name, version=oldest)
            self._heard_at[e.sample_id] = self.clock()
            self._made_at.pop(e.sample_id, None)
            self._gapped.discard(e.sample_id)
            spec = self.prompts[e.prompt_id]
            req = {
                "sample_id": e.sample_id,
                "prompt_tokens": spec.tokens,
                "max_new_tokens": self.cfg.max_new_tokens,
                "priority": admission_priority(it, self.pred_len[e.prompt_id]),
                "iteration": it,
                "attempt": self.ledger.entries[e.sample_id].attempts,
            }
            prefix = self.ledger.partials.resume(e.sample_id)
            if prefix is not None:  # an interrupted generation resumes from its output so far
                req |= {
                    "prefix_tokens": prefix.tokens,
                    "prefix_logprobs": prefix.logprobs,
                    "prefix_versions": prefix.versions,
                }
            reqs.append(req)
        return [Out(unit.name, "generate", {"requests": reqs})] if reqs else []

    def _reservable(self, e: Entry, version: int) -> int | None:
        """The oldest version a dispatch of `e` to a unit at `version` makes its group answer for (the unit's, or
        that of the oldest token of the output it resumes), or None when its group has no room for it. A kept
        output too old for any buffer with room is dropped (its tokens discarded) and the sample starts over."""
        kept = self.ledger.partials.oldest(e.sample_id)
        oldest = version if kept is None else min(version, kept)
        if self.buffers.may_reserve(e.prompt_id, oldest):
            return oldest
        if kept is not None and self.buffers.may_reserve(e.prompt_id, version):
            self.ledger.discarded_tokens += self.ledger.partials.expire(e.sample_id)
            return version
        return None

    def _pool(self, iteration: int, units: list[Unit], ready: set[str], *, waited: float) -> list[Unit]:
        """The units `iteration` is shared over: those that may generate it now, and, for `reserve_s` after its
        first dispatch, the live units that will once they apply the trainer's latest weights (on their way
        through the weight plane). Without the wait, the first unit to apply a version would take the whole
        iteration and the others would sit idle; past it, a unit that is slow to catch up no longer holds the
        iteration back. `units`: those that may generate it now, `ready` their names."""
        latest_will_do = self.bound.may_dispatch(iteration=iteration, unit_version=self.trainer_version)
        if waited >= self.cfg.reserve_s or not latest_will_do:
            return units
        return units + [u for u in self.live_units if u.name not in ready]

    @property
    def reserving(self) -> bool:
        """Does a queued share wait for a unit catching up? (The controller pumps on a timer meanwhile, so the
        share goes to the others when the wait ends even if nothing else happens.)"""
        now = self.clock()
        for it in range(self.floor, self.created):
            since = self.stats[it].first_dispatch
            waiting = since is not None and now - since < self.cfg.reserve_s
            if waiting and self.ledger.in_state(State.QUEUED, iteration=it):
                return True
        return False

    def _assign(self, entries: list[Any], units: list[Unit]) -> list[list[Any]]:
        """Balanced with the work each unit holds: skewness-aware, LPT by predicted tokens (prompt + predicted
        output), longest first inside each unit; `random`, a shuffle balanced by sample count."""
        held: dict[str, float] = dict.fromkeys((u.name for u in units), 0.0)
        for e in self._in_flight():
            if e.agent in held:
                held[e.agent] += 1.0 if self.cfg.dispatch == "random" else self._tokens(e)
        loads = [held[u.name] for u in units]
        if self.cfg.dispatch == "random":
            shuffled = list(entries)
            self._rng.shuffle(shuffled)
            groups = assign_balanced([1.0] * len(shuffled), len(units), loads=loads)
            return [[shuffled[i] for i in sorted(g)] for g in groups]
        groups = assign_balanced([self._tokens(e) for e in entries], len(units), loads=loads)
        return [[entries[i] for i in g] for g in groups]

    def _tokens(self, e: Any) -> float:
        return self.pred_len[e.prompt_id] + len(self.prompts[e.prompt_id].tokens)

    def _deliver(self) -> list[Out]:
        """Occupied groups go to the trainer, labelled with the iteration (buffer) that trains them: at once
        (stream, async: it holds a later iteration's until it gets there, so it starts that one as soon as it
        commits this one), or, sync, the current iteration's once it is full. Every sample of a group occupies
        a buffer within η of the oldest version it was generated with (`buffers.occupy`)."""
        if self.trainer is None or not self.trainer.alive or not self.undelivered:
            return []
        if self.cfg.mode == "sync":
            b = self.buffers.consumed
            if not self.buffers.ready(b):
                return []
            groups = [g for g in self.undelivered if self.buffers.where.get(g) == b]
        else:
            groups = list(self.undelivered)
        sent = set(groups)
        self.undelivered = [g for g in self.undelivered if g not in sent]
        batch: list[tuple[Entry, Any]] = []
        size: dict[str, int] = {}
        for g in groups:
            entries = self._kept(g)
            size[g] = len(entries)
            for e in entries:
                assert e.reward is not None
                self.ledger.deliver(e.sample_id)
                batch.append((e, self.payloads.pop(e.sample_id)))
            self._tally(self.buffers.where[g], entries, +1)
        if not batch:
            return []
        samples = [
            {
                "sample_id": e.sample_id,
                "prompt_id": e.prompt_id,
                "iteration": e.iteration,
                "version": e.sample_version,
                "output_tokens": e.output_tokens,
                "reward": e.reward,
                "group_size": size[e.prompt_id],
            }
            for e, _ in batch
        ]
        return [Out("trainer", "samples", {"samples": samples}, [p for _, p in batch])]

    def _kept(self, group: str) -> list[Entry]:
        """The group's samples that train (not filtered out)."""
        return [e for e in self.ledger.group(group) if e.state is not State.FILTERED]

    def _members(self) -> Out:
        targets = {
            u.name: {"address": u.address, "weights": u.weights, "datacenter": u.datacenter}
            for u in self.units.values()
            if u.alive and u.reachable
        }
        dc = self.trainer.datacenter if self.trainer is not None else ""
        return Out("trainer", "members", {"datacenter": dc, "rollouts": targets, "dc_links": self.cfg.dc_links})
