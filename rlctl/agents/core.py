"""The controller's brain, without I/O: prompt queue, dispatch, ledger, versions, staleness, stats.

Every event from the outside (an agent joined / was lost, a sample finished or was scored, weights were
applied, the trainer committed an iteration) is one method call that returns the messages to send. The
process shell (`controller.py`) owns sockets, clocks, files and the reward pool; tests drive this class.
This module holds the events and the pump; the class is built on layers, one concern a module (corestate.py
draws them): its state, dispatch (admission.py), rewards and delivery (delivery.py), units' reports and losses
(unitloss.py) and migration's trigger (migrating.py); its types and constants are in coretypes.py.

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

from typing import Any

from rlctl.agents.coretypes import MIN_GROUP, IterationStats, Out, Unit
from rlctl.agents.ledger import Entry, Ledger, State
from rlctl.agents.migrating import Migrating
from rlctl.errors import RlctlError


class ControllerCore(Migrating):
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
            self.told_to_stop.discard(name)
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
        if not self.started:  # (a resume's scale-in again, before the trainer joined): the start waits for one fewer
            self.cfg.min_units = max(1, self.cfg.min_units - 1)
        return self._retire_drained()

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

    def scored(self, sample_id: str, *, attempt: int, reward: float) -> list[Out]:
        """The reward of attempt `attempt` of a finished sample (one of an attempt since requeued is dropped)."""
        if not self.ledger.score(sample_id, attempt=attempt, reward=reward):
            return []
        since = self.scoring_since.pop(sample_id, None)
        if since is not None:
            self.reward_latency.append(self.clock() - since)
        self._complete(self.ledger.entries[sample_id].prompt_id)
        return self.pump()

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
        if moved:  # (a gone donor's late answer moved nothing: no `migrated` event of nothing)
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
        # in the ledger's order, versus a set's: the groups re-queued and dispatched after a resume came in an order
        # PYTHONHASHSEED chose (two resumes of one checkpoint dispatched differently)
        queued = dict.fromkeys(e.prompt_id for e in ledger.entries.values() if e.state is State.QUEUED)
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
        if missing := sorted(queued.keys() - self.prompts.keys()):
            # (else the first dispatch of one failed the run mid-way: `controller error: KeyError: 'p8'`)
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise RlctlError(
                f"checkpoint v{version} holds prompts to generate again that the job no longer draws for their rounds "
                f"({', '.join(missing[:3])}{more}): its batch.prompts_per_iteration, data or task changed since "
                "the checkpoint was written (job.json edited)",
                hint="put job.json's batch and task back as they were at the launch, or launch the changed job anew",
            )
