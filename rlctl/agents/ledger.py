"""The sample ledger: every sample of every prompt, its state, and exactly-once delivery to the trainer.

One entry per sample (`<prompt_id>/<k>`, k < samples_per_prompt); a prompt (a group) is trained when all
its samples are. States and the only legal moves:

    queued ──dispatch(agent, version)──▶ dispatched ──finish(agent, version)──▶ finished ──score(reward)
      ▲                                      │                                    │    (its attempt only)
      ├──────── requeue (agent lost) ────────┤                                  deliver (the group: all
      ├──────── migrate (withdrawn) ─────────┘                                  │  finished and scored)
      └──────── requeue (its group has no room within the bound) ◀──────────────┤
                                                                                  ▼
                                              trained ◀──trained(ack from trainer)── delivered
    finished (its reward held the trainer) ──filter──▶ filtered: left out of its group, which trains without it
    finished (its group's rewards all equal) ──drop──▶ dropped: the group trains nothing; a new prompt's group
                                                       takes its place (DAPO's dynamic sampling, `refills`)
    any state before delivered ──quarantine──▶ quarantined: the prompt crashed or hung the rollout units it ran on
                                               (`ControllerCore`'s blame); a new prompt's group takes its place

What a dispatched sample has generated so far (its unit's reports) is in `partials` (`rlctl.agents.
trajectories`): a sample queued again after its unit was lost resumes from there.

`iteration` is the round a sample was created in until its group occupies a staleness buffer
(`rlctl.agents.buffers`), then the iteration that trains it (`assign`). Tokens generated and then thrown
away (a group requeued from `finished`, a filtered sample) are counted in `discarded_tokens`. A group is
trained when each of its samples is trained or filtered.

A `finish` from an agent the sample is not dispatched to (a late message from an agent declared
lost, a duplicate) is refused and counted, never delivered. A trainer ack for a sample that is not
`delivered` counts as a duplicate. Restoring a checkpoint turns every untrained entry back into
`queued`: the model checkpoint predates them, so they must be generated again (a filtered sample of a trained
group stays filtered, a dropped or quarantined group stays so: the group that took its place is in the ledger).

A job runs for weeks, so the ledger holds only what may still change: once every group of a round is complete
(trained, filtered or dropped: the controller's floor has passed it), `retire` takes the round's entries out and
hands them to the caller (the controller appends them to the job's sample log, `rlctl.agents.samplelog`);
`counts` and `state_histogram` go on counting them. Its size, a checkpoint's ledger.json and every scan of it
follow the rounds in flight, not the job's age. An ack or a result for a retired sample finds no entry: a
duplicate or a refused message, as it would have been.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlctl.agents.trajectories import TrajectoryStore


class State(StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    FINISHED = "finished"
    DELIVERED = "delivered"
    TRAINED = "trained"
    FILTERED = "filtered"
    DROPPED = "dropped"
    QUARANTINED = "quarantined"


class LedgerError(ValueError):
    """An illegal state transition: a bug in the caller (the controller), not a network event."""


@dataclass
class Entry:
    sample_id: str
    prompt_id: str
    iteration: int
    round: int | None = None  # the round it was created in (`iteration` moves to the buffer it occupies); None: a
    # checkpoint from before rounds were kept
    state: State = State.QUEUED
    agent: str | None = None
    dispatch_version: int | None = None
    sample_version: int | None = None
    attempts: int = 0
    answered: int = 0  # the latest attempt whose result was taken (a result of it or an earlier one is not again)
    output_tokens: int = 0
    reward: float | None = None  # scored (this attempt's), or not yet
    # the controller's wall clock (time.time) at the last dispatch, the finish, the delivery to the trainer and
    # its ack: when each sample was handed out, came back, went on and was trained (its latency, timelines)
    dispatched_at: float | None = None
    finished_at: float | None = None
    delivered_at: float | None = None
    trained_at: float | None = None


@dataclass
class LedgerCounts:
    prompts: int
    samples: int
    trained: int  # prompts whose every sample was trained (or filtered: its reward held the trainer)
    trained_samples: int
    requeued: int  # samples put back in the queue (agent lost or too stale)
    lost: int  # prompts of finished iterations that were not trained
    duplicated: int  # samples trained more than once (must be 0)
    refused: int  # sample messages refused (not dispatched to that agent)
    stale_requeued: int
    discarded_tokens: int  # generated, then thrown away, never trained (generated again: a requeue, a resume; filtered)
    aborted: int  # groups generated again because their reward held the trainer (ControllerCore.unstick)
    migrated: int  # samples a unit gave back to go to another (ControllerCore.migrate)
    filtered: int  # samples left out of their group's training: their reward held the trainer (unstick)
    dropped: int  # groups whose rewards were all equal, replaced by a new prompt's (dynamic sampling)
    quarantined: int  # prompts set aside for crashing the units that ran them, each replaced by a new prompt's


@dataclass
class Retired:
    """What the ledger still counts of the entries `Ledger.retire` took out."""

    prompts: int = 0
    trained: int = 0  # of those prompts, groups trained (`_trained`)
    lost: int = 0  # … and groups none of whose samples trained (all filtered out): `counts`' lost
    states: Counter[str] = field(default_factory=Counter)  # samples by their last state

    def to_json(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "trained": self.trained, "lost": self.lost, "states": dict(self.states)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Retired:
        data = data or {}
        states: Counter[str] = Counter({str(k): int(v) for k, v in data.get("states", {}).items()})
        return cls(int(data.get("prompts", 0)), int(data.get("trained", 0)), int(data.get("lost", 0)), states)


COMPLETE = (State.TRAINED, State.FILTERED, State.DROPPED, State.QUARANTINED)
SET_ASIDE = (State.DROPPED, State.QUARANTINED)  # a group that trains nothing, by design: not lost


_STAMPS = itertools.count(1)  # `Ledger.running_stamp`'s, one sequence for every ledger of the process


@dataclass
class Ledger:
    entries: dict[str, Entry] = field(default_factory=dict)
    by_iteration: dict[int, list[Entry]] = field(default_factory=dict)
    by_prompt: dict[str, list[Entry]] = field(default_factory=dict)
    requeued: int = 0
    stale_requeued: int = 0
    duplicated: int = 0
    refused: int = 0
    discarded_tokens: int = 0
    aborted: int = 0
    migrated: int = 0
    filtered: int = 0
    dropped: int = 0
    quarantined: int = 0
    rounds: int = 0  # rounds whose prompts are in the ledger (0..rounds − 1)
    # round → the groups drawn for it beyond its prompts (dynamic sampling): the next one's prompt is number this;
    # the rounds with a group in the ledger only (`retire`)
    refills: dict[int, int] = field(default_factory=dict)
    partials: TrajectoryStore = field(default_factory=TrajectoryStore)  # dispatched samples' output so far
    # prompt → losses of rollout units that held a sample of it (`ControllerCore._blame`; gone once it completes)
    crashes: dict[str, int] = field(default_factory=dict)
    retired: Retired = field(default_factory=Retired)  # the complete rounds taken out (`retire`)
    clock: Callable[[], float] = field(default=time.time, repr=False)  # wall clock of the entries' times
    # agent → its dispatched samples (entries in state DISPATCHED), kept by every transition: what a unit runs, read
    # without a scan of the ledger (`running`, `inflight`; the migration's look every fraction of a second)
    _running: dict[str, dict[str, Entry]] = field(default_factory=dict, repr=False)
    # iteration → how many of its samples are queued, kept by every transition: a round with none is passed over
    # without a scan of its entries (`queued_count`; the controller's dispatch, at every message)
    _queued: Counter[int] = field(default_factory=Counter, repr=False)
    # agent → a stamp drawn anew (`_STAMPS`, unique across ledgers) at each change of its dispatched samples, while it
    # has any: the same stamp, the same samples in the same order (`running_stamp`: a figure of them kept until it
    # changes, versus read from every one of them at each dispatch share)
    _stamps: dict[str, int] = field(default_factory=dict, repr=False)

    # -- building -----------------------------------------------------------------------------------
    def add_prompt(self, *, iteration: int, prompt_id: str, num_samples: int) -> list[str]:
        ids = [f"{prompt_id}/{k}" for k in range(num_samples)]
        for sid in ids:
            if sid in self.entries:
                raise LedgerError(f"sample {sid} already in the ledger")
            self._insert(Entry(sample_id=sid, prompt_id=prompt_id, iteration=iteration, round=iteration))
        self.rounds = max(self.rounds, iteration + 1)
        return ids

    def _insert(self, e: Entry) -> None:
        self.entries[e.sample_id] = e
        self.by_iteration.setdefault(e.iteration, []).append(e)
        self.by_prompt.setdefault(e.prompt_id, []).append(e)
        if e.state is State.QUEUED:
            self._queued[e.iteration] += 1

    def assign(self, prompt_id: str, *, iteration: int) -> None:
        """Every sample of the prompt now belongs to `iteration` (the buffer its group occupies)."""
        for e in self.by_prompt[prompt_id]:
            if e.iteration != iteration:
                self.by_iteration[e.iteration].remove(e)
                if e.state is State.QUEUED:
                    self._queued[e.iteration] -= 1
                    self._queued[iteration] += 1
                e.iteration = iteration
                self.by_iteration.setdefault(iteration, []).append(e)

    # -- transitions --------------------------------------------------------------------------------
    def _move(self, sample_id: str, frm: State, to: State) -> Entry:
        e = self.entries.get(sample_id)
        if e is None:
            raise LedgerError(f"unknown sample {sample_id}")
        if e.state is not frm:
            raise LedgerError(f"sample {sample_id}: {e.state.value} → {to.value} is not allowed")
        e.state = to
        return e

    def dispatch(self, sample_id: str, *, agent: str, version: int) -> None:
        e = self._move(sample_id, State.QUEUED, State.DISPATCHED)
        self._queued[e.iteration] -= 1
        e.agent, e.dispatch_version, e.attempts = agent, version, e.attempts + 1
        e.dispatched_at = self.clock()
        self._running.setdefault(agent, {})[sample_id] = e
        self._stamps[agent] = next(_STAMPS)

    def _leaves_dispatched(self, e: Entry) -> None:
        """`e` leaves state DISPATCHED (before its state and agent change): out of its agent's running samples."""
        if e.state is State.DISPATCHED and e.agent is not None:
            mine = self._running.get(e.agent)
            if mine is not None and mine.pop(e.sample_id, None) is not None:
                self._stamps[e.agent] = next(_STAMPS)
                if not mine:
                    del self._running[e.agent], self._stamps[e.agent]

    def dispatched_to(self, sample_id: str, agent: str) -> Entry | None:
        """The sample's entry while it is dispatched to `agent` (what that agent says of it counts), else None."""
        e = self.entries.get(sample_id)
        return e if e is not None and e.state is State.DISPATCHED and e.agent == agent else None

    def finish(
        self, sample_id: str, *, agent: str, version: int, output_tokens: int, attempt: int | None = None
    ) -> bool:
        """Record a finished sample; False (and counted) if it is not dispatched to `agent`, or if it answers an
        attempt (`attempt`: the dispatch its generation came from) no later than one whose result was taken: a
        second copy of a result, come after the sample went back to the same unit. An earlier attempt's first
        result counts (a unit handed a sample it still held goes on with its own generation)."""
        e = self.dispatched_to(sample_id, agent)
        if e is None and sample_id in self.entries and self.entries[sample_id].state is State.QUARANTINED:
            return False  # a unit still ran it when its prompt was set aside: expected, not refused
        if e is None or (attempt is not None and attempt <= e.answered):
            self.refused += 1
            return False
        if attempt is not None:
            e.answered = attempt
        self._leaves_dispatched(e)
        e.state = State.FINISHED
        # A sample whose generation straddled a weight swap is as old as its oldest token.
        assert e.dispatch_version is not None
        e.sample_version = min(version, e.dispatch_version) if version >= 0 else e.dispatch_version
        e.output_tokens = output_tokens
        e.finished_at = self.clock()
        return True

    def score(self, sample_id: str, *, attempt: int, reward: float) -> bool:
        """The reward of a finished sample's attempt `attempt`; False (ignored) when the sample was requeued since
        (a later attempt, or queued again) or is scored already."""
        e = self.entries.get(sample_id)
        if e is None or e.state is not State.FINISHED or e.attempts != attempt or e.reward is not None:
            return False
        e.reward = float(reward)
        return True

    def deliver(self, sample_id: str) -> Entry:
        e = self._move(sample_id, State.FINISHED, State.DELIVERED)
        e.delivered_at = self.clock()
        return e

    def mark_trained(self, sample_id: str) -> None:
        e = self.entries.get(sample_id)
        if e is None or e.state is not State.DELIVERED:
            self.duplicated += 1
            return
        e.state = State.TRAINED
        e.trained_at = self.clock()

    def requeue_agent(self, agent: str) -> list[str]:
        """An agent is gone: everything dispatched to it and not finished goes back to the queue."""
        back = self.running(agent)
        for e in back:
            self._reset(e)
        self.requeued += len(back)
        return [e.sample_id for e in back]

    def migrate(self, sample_id: str) -> None:
        """A dispatched sample its unit gave back (its output so far is in `partials`) is queued for another."""
        self._reset(self._move(sample_id, State.DISPATCHED, State.DISPATCHED))
        self.migrated += 1

    def requeue_stale(self, sample_id: str) -> None:
        """A sample of a group that found no buffer within its bound is generated again: a finished one (its tokens
        discarded) or, as `abort_group` does, one filtered out of it (its tokens were counted when it was filtered)."""
        e = self.entries.get(sample_id)
        if e is not None and e.state is State.FILTERED:
            self._reset(e)
            self.requeued += 1
        else:
            self._discard(self._move(sample_id, State.FINISHED, State.FINISHED))
        self.stale_requeued += 1

    def abort_group(self, prompt_id: str) -> None:
        """Every finished (or filtered) sample of the group is generated again (its tokens are discarded); counted
        once."""
        for e in self.by_prompt[prompt_id]:
            if e.state is State.FINISHED:
                self._discard(e)
            elif e.state is State.FILTERED:  # its tokens were counted when it was filtered
                self._reset(e)
                self.requeued += 1
        self.aborted += 1

    def filter(self, sample_id: str) -> None:
        """A finished sample whose reward has not come is left out of its group (its tokens are discarded)."""
        e = self._move(sample_id, State.FINISHED, State.FILTERED)
        self.discarded_tokens += e.output_tokens
        self.filtered += 1

    def drop_group(self, prompt_id: str) -> None:
        """A group whose every kept sample is finished and scored alike trains nothing: its finished samples are
        dropped (their tokens discarded); counted once."""
        for e in self.by_prompt[prompt_id]:
            if e.state is State.FINISHED:
                self.discarded_tokens += e.output_tokens
                e.state = State.DROPPED
        self.dropped += 1

    def quarantine(self, prompt_id: str) -> None:
        """Set the group aside: the prompt crashed or hung the units that ran it. Its samples' tokens are discarded
        (a finished one's count, a running one's kept output; a filtered one's were counted when it was filtered); a
        late result of one is dropped, not refused."""
        for e in self.by_prompt[prompt_id]:
            assert e.state not in (State.DELIVERED, State.TRAINED), f"{e.sample_id} is with the trainer already"
            finished = e.output_tokens if e.state is not State.FILTERED else 0
            self.discarded_tokens += finished + self.partials.drop(e.sample_id)
            self._leaves_dispatched(e)
            if e.state is State.QUEUED:
                self._queued[e.iteration] -= 1
            e.state = State.QUARANTINED
        self.crashes.pop(prompt_id, None)
        self.quarantined += 1

    def _discard(self, e: Entry) -> None:
        """A finished sample goes back to the queue: its tokens are thrown away."""
        self.discarded_tokens += e.output_tokens
        self._reset(e)
        self.requeued += 1

    def _reset(self, e: Entry) -> None:
        self._leaves_dispatched(e)
        if e.state is not State.QUEUED and e.sample_id in self.entries:  # (one not inserted yet: `_insert` counts it)
            self._queued[e.iteration] += 1
        e.state, e.agent, e.dispatch_version, e.sample_version, e.output_tokens = State.QUEUED, None, None, None, 0
        e.reward = None
        e.dispatched_at = e.finished_at = e.delivered_at = e.trained_at = None

    # -- queries ------------------------------------------------------------------------------------
    def in_state(self, state: State, *, iteration: int | None = None) -> list[Entry]:
        pool = self.entries.values() if iteration is None else self.by_iteration.get(iteration, [])
        return [e for e in pool if e.state is state]

    def iteration_entries(self, iteration: int) -> list[Entry]:
        return list(self.by_iteration.get(iteration, []))

    def group(self, prompt_id: str) -> list[Entry]:
        return list(self.by_prompt.get(prompt_id, []))

    def queued_count(self, iteration: int) -> int:
        """How many samples of `iteration` are queued."""
        return self._queued.get(iteration, 0)

    def inflight(self, agent: str) -> int:
        return len(self._running.get(agent, ()))

    def running_stamp(self, agent: str) -> int:
        """Changes whenever `agent`'s dispatched samples do (`running`): equal stamps, the same samples in the same
        order; 0: none."""
        return self._stamps.get(agent, 0)

    def all_running(self) -> Iterator[Entry]:
        """Every dispatched sample not finished, agent by agent."""
        for mine in self._running.values():
            yield from mine.values()

    def running(self, agent: str) -> list[Entry]:
        """The samples dispatched to `agent` and not finished, in the order they were dispatched."""
        return list(self._running.get(agent, {}).values())

    def counts(self, *, completed_iterations: int | None = None) -> LedgerCounts:
        by_prompt, gone = self.by_prompt, self.retired
        trained = gone.trained + sum(1 for es in by_prompt.values() if _trained(es))
        lost = 0
        if completed_iterations is not None:  # the retired rounds were all before it (the floor ≤ the trainer's)
            lost = gone.lost  # delivered for an iteration that was committed without them
            done = (State.DELIVERED, State.TRAINED, State.FILTERED)
            lost += sum(
                1
                for es in by_prompt.values()
                if es[0].iteration < completed_iterations and all(e.state in done for e in es) and not _trained(es)
            )
        return LedgerCounts(
            prompts=gone.prompts + len(by_prompt),
            samples=gone.states.total() + len(self.entries),
            trained=trained,
            trained_samples=gone.states[State.TRAINED.value]
            + sum(1 for e in self.entries.values() if e.state is State.TRAINED),
            requeued=self.requeued,
            lost=lost,
            duplicated=self.duplicated,
            refused=self.refused,
            stale_requeued=self.stale_requeued,
            discarded_tokens=self.discarded_tokens,
            aborted=self.aborted,
            migrated=self.migrated,
            filtered=self.filtered,
            dropped=self.dropped,
            quarantined=self.quarantined,
        )

    def state_histogram(self) -> dict[str, int]:
        return dict(self.retired.states + Counter(e.state.value for e in self.entries.values()))

    # -- retiring -----------------------------------------------------------------------------------
    def retire(self, iteration: int) -> list[Entry]:
        """Take out the entries of `iteration`, every group of which is complete (each sample trained, filtered or
        dropped); they are returned, and counted on in `retired`. LedgerError if one is not complete."""
        entries = self.by_iteration.get(iteration, [])
        if any(e.state not in COMPLETE for e in entries):
            raise LedgerError(f"iteration {iteration} still has samples to train: it cannot be retired")
        self.by_iteration.pop(iteration, None)
        self._queued.pop(iteration, None)
        for e in entries:
            del self.entries[e.sample_id]
            self.partials.drop(e.sample_id)
            self.retired.states[e.state.value] += 1
        for prompt_id in dict.fromkeys(e.prompt_id for e in entries):
            group = self.by_prompt.pop(prompt_id)
            assert all(e.iteration == iteration for e in group), f"group {prompt_id} spans iterations"
            trained = _trained(group)
            self.retired.prompts += 1
            self.retired.trained += trained
            self.retired.lost += not trained and all(e.state not in SET_ASIDE for e in group)
            self.crashes.pop(prompt_id, None)
        self._prune_refills()
        return list(entries)

    def _prune_refills(self) -> None:
        """Forget the groups drawn for the rounds none of whose groups is in the ledger any more: only a group of
        round r still here can be dropped or quarantined and draw the next of r's (`refills[r]`), and a resume
        draws again only the rounds of the groups it holds. (Kept while an entry of a checkpoint from before rounds
        were kept does not say its round.)"""
        rounds = [e.round for e in self.entries.values()]
        if None in rounds:
            return
        oldest = min((r for r in rounds if r is not None), default=self.rounds)
        for r in [r for r in self.refills if r < oldest]:
            del self.refills[r]

    def forget_rounds(self, first: int) -> None:
        """Take out the groups of rounds `first` and later that are only queued, and the rounds themselves: the job's
        count was lowered to `first` iterations at a resume (`launch --resume --iterations`), so they are never
        generated; kept, they were prompts of the job's ledger that no iteration trains. The output the store kept of
        them is thrown away (`discarded_tokens`; a finished one's were counted as the checkpoint was read)."""
        groups = [es for es in self.by_prompt.values() if es[0].round is not None and es[0].round >= first]
        for es in groups:
            if any(e.state is not State.QUEUED for e in es):
                continue
            for e in es:
                del self.entries[e.sample_id]
                self.by_iteration[e.iteration].remove(e)
                self._queued[e.iteration] -= 1
                self.discarded_tokens += self.partials.drop(e.sample_id)
            del self.by_prompt[es[0].prompt_id]
            self.crashes.pop(es[0].prompt_id, None)
        for it in [i for i, es in self.by_iteration.items() if not es]:
            del self.by_iteration[it]
        self.refills = {r: n for r, n in self.refills.items() if r < first}
        self.rounds = min(self.rounds, first)

    # -- checkpoint ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "counters": {
                "requeued": self.requeued,
                "stale_requeued": self.stale_requeued,
                "duplicated": self.duplicated,
                "refused": self.refused,
                "discarded_tokens": self.discarded_tokens,
                "aborted": self.aborted,
                "migrated": self.migrated,
                "filtered": self.filtered,
                "dropped": self.dropped,
                "quarantined": self.quarantined,
            },
            "rounds": self.rounds,
            "refills": {str(k): v for k, v in self.refills.items()},
            "entries": [entry_row(e) for e in self.entries.values()],
            "partials": self.partials.to_json(),
            "retired": self.retired.to_json(),
            "crashes": dict(self.crashes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ledger:
        led = cls(
            **data["counters"],
            partials=TrajectoryStore.from_json(data.get("partials")),
            retired=Retired.from_json(data.get("retired")),
        )
        led.refills = {int(k): int(v) for k, v in data.get("refills", {}).items()}
        led.rounds = int(data.get("rounds", 0))
        led.crashes = {str(k): int(v) for k, v in data.get("crashes", {}).items()}
        entries = [Entry(**{**row, "state": State(row["state"])}) for row in data["entries"]]
        trained = {e.prompt_id for e in entries if e.state is State.TRAINED}
        dropped = {e.prompt_id for e in entries if e.state in SET_ASIDE}
        for e in entries:
            kept = e.prompt_id in trained and e.state is State.FILTERED
            if not (e.state is State.TRAINED or kept or e.prompt_id in dropped):
                if e.state in (State.FINISHED, State.DELIVERED):  # generated, never trained: generated again
                    led.discarded_tokens += e.output_tokens  # (a filtered one's were counted when it was filtered)
                led._reset(e)
            led._insert(e)
        return led


def entry_row(e: Entry) -> dict[str, Any]:
    """The entry as JSON (a checkpoint's ledger.json, the sample log): its fields, flat (`asdict` would deep-copy
    each: 10× slower on the controller's loop)."""
    return {**vars(e), "state": e.state.value}


def _trained(entries: list[Entry]) -> bool:
    """A group is trained: every sample trained or filtered, one at least trained."""
    return all(e.state in (State.TRAINED, State.FILTERED) for e in entries) and any(
        e.state is State.TRAINED for e in entries
    )
