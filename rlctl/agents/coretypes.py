"""The controller core's vocabulary: its config, the messages it returns, the units and iterations it tracks,
and the constants that tune dispatch, reward stalls, the rounds created ahead and migration (`ControllerCore`,
core.py, and its parts: corestate, admission, delivery, unitloss, migrating)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from rlctl.config.pipeline import MAX_SAMPLES_AHEAD, rounds_ahead

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
        return rounds_ahead(self.eta, per_round, max_samples_ahead=self.max_samples_ahead)


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
