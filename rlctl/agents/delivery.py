"""Rewards, completion and delivery: a finished, scored group occupies a staleness buffer and goes to the trainer.

How long a reward may hold the trainer's iteration (`stall_s`), a complete group's buffer (`_complete`) or its drop
(dynamic sampling: `_dropped`), the batches sent to the trainer (`_deliver`) and the groups moved into the trainer's
iteration (`_fill_forward`), each with the delivery figures of the iterations (`_tally`, `_prune_stats`).
"""

from __future__ import annotations

from typing import Any

from rlctl.agents.admission import Admission
from rlctl.agents.coretypes import MIN_GROUP, STALL_FACTOR, STALL_FLOOR_S, STALL_MIN_SAMPLES, STALL_P90_FACTOR, Out
from rlctl.agents.ledger import Entry, State


class Delivery(Admission):
    """Rewards, complete groups and their delivery to the trainer (a layer of `ControllerCore`)."""

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
