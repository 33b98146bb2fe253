"""What the controller core holds (`CoreState`: its state, set up once) and the small reads every part of it uses:
the live units, the rounds created, the prompts registered with their predicted lengths, the samples in flight,
the trainer's view of the rollout units (`_members`).

The core is one class built in layers, each a module of one concern, each using only those below it:

    CoreState (corestate) ◀── Admission (admission) ◀── Delivery (delivery) ◀── UnitLoss (unitloss)
        ◀── Migrating (migrating) ◀── ControllerCore (core: the events and the pump)
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rlctl.agents import migration
from rlctl.agents.books import LeftBook
from rlctl.agents.buffers import StalenessBuffers
from rlctl.agents.coretypes import (
    FINISHED_LENGTHS,
    MIGRATE_EVERY_S,
    CoreConfig,
    IterationStats,
    Out,
    PromptSpec,
    PrunedStats,
    Unit,
)
from rlctl.agents.ledger import Entry, Ledger, State
from rlctl.agents.staleness import StalenessBound


class CoreState:
    """The core's state and the reads its parts share (the base of `ControllerCore`)."""

    def __init__(
        self,
        cfg: CoreConfig,
        *,
        prompts: Callable[[int], list[PromptSpec]],
        predict: Callable[[list[PromptSpec]], Sequence[float]] | None = None,
        refill: Callable[[int, int], PromptSpec] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        """`prompts(r)`: round r's prompts; `refill(r, j)`: the j-th prompt drawn for round r beyond them (dynamic
        sampling, `cfg.max_refills`); `cpu_clock`: the CPU seconds a migration look costs (`migrate`), which set how
        often it looks — a test that drives the core on its own clock gives it one too, or the core's choices follow
        the machine (one look of 17,586 in a property run took 0.1 s of CPU: the next 2 s later)."""
        self.cfg = cfg
        self.clock = clock
        self.cpu_clock = cpu_clock
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
        # the name tells a late message of a unit that is gone from one the job never had (`known`): the plan's (the
        # scaler pins them: `UnitStarts`) and the latest LEFT_KEPT others, versus one name kept per unit the job
        # ever lost
        self.left = LeftBook()
        # the names of units retired after a drain (told to stop: `_retire_drained`) whose connection may still be
        # open: their bye is taken and status shows them draining until their record leaves the controller's peers
        # (it lets them go then) or the name joins again; as few as the units connected, versus read from `left`,
        # which let one go once LEFT_KEPT more units went (its bye refused, shown running)
        self.told_to_stop: set[str] = set()
        # those of `left` that went since the last gauge update (`views.agent_gauges` zeroes their sites and empties
        # it): the gauges walk only them, not every unit that left in a job that runs for weeks
        self.left_ungauged: set[str] = set()
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
        # unit → (the ledger's stamp of its dispatched samples, their tokens as a dispatch share balances them):
        # `_held_tokens`, read again only once they changed
        self._held_tokens_at: dict[str, tuple[int, float]] = {}

    @property
    def live_units(self) -> list[Unit]:
        """Rollout units in dispatch (alive, reachable and not draining)."""
        return [u for u in self.units.values() if u.alive and u.reachable and not u.draining]

    def known(self, name: str) -> bool:
        """Whether rollout unit `name` joined the job (it may be gone since)."""
        return name in self.units or name in self.left

    @property
    def num_joined(self) -> int:
        """Rollout units that joined the job, those gone since among them (by name: a name taken again counts once).
        A name `left` let go joins no more: new units take new names, and a unit of it that reconnects is refused
        (the controller's `_hello`: its hello says `again`), versus taken and counted twice."""
        return len(self.units) + self.left.total

    @property
    def done(self) -> bool:
        return self.trainer_version >= self.cfg.iterations

    @property
    def created(self) -> int:
        """Rounds whose prompts are in the ledger (0 … created − 1)."""
        return self.ledger.rounds

    def suspects(self) -> set[str]:
        """Prompts that run alone on a unit (`_blame`)."""
        after = self.cfg.quarantine_after
        return {g for g, n in self.ledger.crashes.items() if n >= after} if after else set()

    def _in_flight(self) -> Iterator[Entry]:
        """Samples dispatched and not finished, unit by unit (the ledger keeps them: no scan of the rounds)."""
        return self.ledger.all_running()

    def _kept(self, group: str) -> list[Entry]:
        """The group's samples that train (not filtered out)."""
        return [e for e in self.ledger.group(group) if e.state is not State.FILTERED]

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

    def _members(self) -> Out:
        targets = {
            u.name: {"address": u.address, "weights": u.weights, "datacenter": u.datacenter}
            for u in self.units.values()
            if u.alive and u.reachable
        }
        dc = self.trainer.datacenter if self.trainer is not None else ""
        return Out("trainer", "members", {"datacenter": dc, "rollouts": targets, "dc_links": self.cfg.dc_links})
