"""Property: whatever the timing, the trainer never trains on a sample older than η, and every prompt
is trained exactly once — proven by driving the real ControllerCore through random event orders
(samples finishing, rewards arriving late or for an attempt since requeued, weights arriving late, units
dying and joining with old weights, duplicates, units reporting partial output, migration asking units to give
work back and resumed samples as old as their prefix, units going silent — their work queued again while their
engines go on with it — and coming back on their connection or a new one, handed back samples they still run, units
drained, reports lost on the way, leaving a gap, and a lost or silent unit's reports arriving late).
No group is ever generated only to be thrown away: the staleness buffers' reservations keep a place within the
bound for every group dispatched, except a sample filtered out because its reward held the trainer (its group
trains without it), or a group generated again when too few of its samples would be left (its entry goes to a
later finished group, moved forward), or a group dropped because its rewards were all equal (dynamic sampling: a
new prompt's group takes its place)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out, PromptSpec
from rlctl.agents.ledger import Entry, State
from rlctl.agents.staleness import StalenessBound


@dataclass
class FakeUnit:
    version: int = 0
    alive: bool = True
    inflight: list[tuple[str, int]] = field(default_factory=list)  # (sample id, oldest version of its output)
    pending_weights: list[int] = field(default_factory=list)
    sent: list[tuple[str, int, int]] = field(default_factory=list)  # (sample id, version, attempt) of each result
    attempt: dict[str, int] = field(default_factory=dict)  # in flight: the dispatch it was admitted from
    out: dict[str, list[int]] = field(default_factory=dict)  # in flight: the version of each output token so far
    reported: dict[str, int] = field(default_factory=dict)  # … and how many of them the controller has
    withdraws: list[int] = field(default_factory=list)  # the controller's `withdraw` counts not answered yet
    reachable: bool = True  # False while silent: it goes on generating, and nothing of it reaches the controller

    def admit(self, request: dict[str, Any]) -> None:
        """A `generate` request it does not hold: it runs from its prefix, as old as the prefix's oldest token."""
        sid, prefix = request["sample_id"], list(request.get("prefix_versions", []))
        self.inflight.append((sid, min([self.version, *prefix])))
        self.out[sid], self.reported[sid] = prefix, len(prefix)
        self.attempt[sid] = request["attempt"]

    def grow(self, sid: str, tokens: int) -> tuple[int, list[int]]:
        """`sid` generates `tokens` more at its weights: the report of what the controller does not have yet (its
        start, its tokens' versions)."""
        self.out[sid] += [self.version] * tokens
        start, self.reported[sid] = self.reported[sid], len(self.out[sid])
        return start, self.out[sid][start:]

    def give_back(self, take: list[tuple[str, int]]) -> list[tuple[str, list[int]]]:
        """Take `take` out of its engine (a `withdraw`'s answer): each sample id with its output's versions."""
        for item in take:
            self.inflight.remove(item)
            self.attempt.pop(item[0])
        return [(sid, self.out.pop(sid)) for sid, _ in take]

    def catch_up(self, version: int) -> None:
        """It is told of the trainer's `version` (a `members` message): it will get those weights, later."""
        if self.version < version and version not in self.pending_weights:
            self.pending_weights.append(version)


@dataclass
class FakeTrainer:
    version: int = 0
    buffer: dict[int, list[dict]] = field(default_factory=dict)  # by iteration: later ones held (async)
    trained: list[str] = field(default_factory=list)
    violations: int = 0
    early_deliveries: int = 0  # sample batches that reached the trainer before their iteration was complete

    def hold(self, sample: dict[str, Any], bound: StalenessBound) -> bool:
        """A delivered sample is held for its iteration (trained at that version); False: older than the bound."""
        self.buffer.setdefault(sample["iteration"], []).append(sample)
        return bound.may_train(trainer_version=sample["iteration"], sample_version=sample["version"])

    def regroup(self, groups: list[str], to: int, bound: StalenessBound) -> list[dict[str, Any]]:
        """The held samples of `groups` move to iteration `to`: those of them now older than the bound."""
        stale = []
        for it in list(self.buffer):
            moving = [s for s in self.buffer[it] if s["prompt_id"] in groups]
            self.buffer[it] = [s for s in self.buffer[it] if s not in moving]
            for s in moving:
                s["iteration"] = to
                if not bound.may_train(trainer_version=to, sample_version=s["version"]):
                    stale.append(s)
            self.buffer.setdefault(to, []).extend(moving)
        return stale


def prompts_for(p: int):
    def make(it: int) -> list[PromptSpec]:
        return [PromptSpec(f"p{it}-{j}", [1, 2 + j], true_len=(j * 7) % 11 + 1) for j in range(p)]

    return make


def whole(samples: list[dict[str, Any]], prompts: int) -> bool:
    """An iteration's delivered samples make it whole: every group, each with the samples it trains."""
    have = Counter(s["prompt_id"] for s in samples)
    size = {s["prompt_id"]: s["group_size"] for s in samples}
    return len(have) == prompts and all(have[g] == size[g] for g in have)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["sync", "stream", "async"]),
    extra_eta=st.integers(0, 2),
    iterations=st.integers(1, 5),
    prompts=st.integers(1, 4),
    group=st.integers(1, 3),
    num_units=st.integers(1, 3),
    dispatch=st.sampled_from(["random", "skew_aware", "oracle"]),
    unit_batch=st.integers(1, 4),
    refills=st.integers(0, 2),
    silences=st.integers(0, 2),
    data=st.data(),
)
def test_no_staleness_violation_and_exactly_once(
    mode, extra_eta, iterations, prompts, group, num_units, dispatch, unit_batch, refills, silences, data
):
    eta = extra_eta if mode == "async" else 0
    cfg = CoreConfig(
        iterations=iterations,
        prompts_per_iteration=prompts,
        samples_per_prompt=group,
        max_new_tokens=16,
        mode=mode,
        eta=eta,
        dispatch=dispatch,
        seed=1,
        reward_stall_s=0.0,  # `unstick` aborts any group due now with a reward pending
        unit_batch=unit_batch,  # small: migration moves work between units
        max_refills=refills,  # dynamic sampling: groups whose rewards are equal are dropped and drawn again
    )
    now = [0.0]
    core = ControllerCore(
        cfg,
        prompts=prompts_for(prompts),
        predict=lambda specs: [float(len(s.tokens)) for s in specs],
        refill=lambda it, j: PromptSpec(f"q{it}-{j}", [3, j], true_len=j % 5 + 1),
        clock=lambda: now[0],
        cpu_clock=lambda: 0.0,  # looks cost nothing: the same choices whatever a look cost the machine (a replay)
    )
    bound = StalenessBound(eta)
    units: dict[str, FakeUnit] = {}
    trainer = FakeTrainer()

    def handle(outs: list[Out]) -> None:
        for o in outs:
            if o.to == "trainer":
                if o.kind == "samples":
                    for s in o.header["samples"]:
                        # the current iteration, or a later one within η (held until the trainer gets there)
                        assert trainer.version <= s["iteration"] <= trainer.version + eta
                        # iteration i is trained at version i
                        if not trainer.hold(s, bound):
                            trainer.violations += 1
                    its = {s["iteration"] for s in o.header["samples"]}
                    entries = [e for it in its for e in core.ledger.iteration_entries(it)]
                    if any(e.state in (State.QUEUED, State.DISPATCHED) for e in entries):
                        trainer.early_deliveries += 1
                elif o.kind == "regroup":  # groups held for a later iteration now belong to this one
                    to = o.header["iteration"]
                    assert to == trainer.version
                    trainer.violations += len(trainer.regroup(o.header["groups"], to, bound))
                elif o.kind == "members":
                    for name in o.header["rollouts"]:  # a newcomer (or one back) gets the current weights, later
                        units[name].catch_up(trainer.version)
            elif o.kind == "generate":
                u = units[o.to]
                assert u.alive
                for r in o.header["requests"]:  # a resumed sample is as old as its prefix's oldest token
                    if r["sample_id"] in u.attempt:  # held already: its own generation answers this dispatch
                        u.attempt[r["sample_id"]] = r["attempt"]
                        continue
                    u.admit(r)
            elif o.kind == "withdraw":
                units[o.to].withdraws.append(o.header["count"])
            elif o.kind == "stop":  # drained: nothing dispatched to it is left (what it still runs went back)
                assert all(core.ledger.dispatched_to(sid, o.to) is None for sid, _ in units[o.to].inflight)
                units[o.to].alive = False

    def join(name: str, version: int) -> None:
        units[name] = FakeUnit(version=version)
        handle(core.join(name, role="rollout", version=version, address=f"inproc://{name}"))

    handle(core.join("trainer-0", role="trainer", version=0))
    for k in range(num_units):
        join(f"r{k}", 0)
    next_unit = num_units
    dups_left, kills_left, silences_left, drains_left, lates_left = 3, 2, silences, 1, 3
    unscored: list[tuple[str, int]] = []  # (sample id, attempt) whose reward is still computing
    unstick_discarded = 0  # tokens that `unstick` threw away (filtered samples, regenerated groups)
    quarantine_discarded = 0  # … and a quarantined group's (a kill can set aside a group it killed twice)

    retired: list[Entry] = []  # the rounds the ledger took out once complete (the controller's sample log)
    core.on_retire = retired.extend

    def every() -> list[Entry]:
        return [*retired, *core.ledger.entries.values()]

    def dropped_tokens() -> int:  # the outputs of groups dropped for equal rewards (dynamic sampling)
        return sum(e.output_tokens for e in every() if e.state is State.DROPPED)

    for _ in range(2000):
        if core.done:
            break
        now[0] += 0.1
        alive = [n for n, u in units.items() if u.alive and u.reachable]
        actions = [("finish", n) for n in alive if units[n].inflight]
        actions += [("report", n) for n in alive if units[n].inflight]  # partial output so far
        if lates_left:
            actions += [("late", n) for n, u in units.items() if u.inflight and (not u.alive or not u.reachable)]
        if drains_left and len([n for n in alive if not core.units[n].draining]) > 1:
            actions += [("drain", n) for n in alive if not core.units[n].draining]
        actions += [("answer", n) for n in alive if units[n].withdraws]  # give back what migration asked for
        actions += [("score", ""), ("unstick", "")] if unscored else []
        actions += [("weights", n) for n in alive if units[n].pending_weights]
        if dups_left:
            actions += [("dup", n) for n, u in units.items() if u.sent]
        if whole(trainer.buffer.get(trainer.version, []), prompts):
            actions.append(("train", ""))
        if len(alive) > 1 and kills_left:
            actions += [("kill", n) for n in alive]
        if next_unit < num_units + 2 or not core.live_units:  # (drained and killed, none left: a new one)
            actions.append(("join", ""))
        if len(alive) > 1 and silences_left:  # a unit's link goes down: it goes on, unheard
            actions += [("silent", n) for n in alive]
        actions += [("back", n) for n, u in units.items() if u.alive and not u.reachable]
        assert actions, f"deadlock: {core.ledger.state_histogram()} trainer v{trainer.version}"
        what, name = data.draw(st.sampled_from(actions))
        if what == "report":
            u = units[name]
            sid, _ = data.draw(st.sampled_from(u.inflight))
            start, new = u.grow(sid, data.draw(st.integers(1, 2)))
            if data.draw(st.integers(0, 4)):  # else lost on the way, the unit none the wiser: the next leaves a gap
                core.partial(
                    name, sample_id=sid, start=start, tokens=[7] * len(new), logprobs=[-1.0] * len(new), versions=new
                )
        elif what == "late":  # a report a unit sent before it was lost (or went silent) arrives after
            lates_left -= 1
            u = units[name]
            sid, _ = data.draw(st.sampled_from(u.inflight))
            n = len(u.out[sid])
            assert not core.partial(name, sample_id=sid, start=n, tokens=[7], logprobs=[-1.0], versions=[u.version])
        elif what == "drain":  # scaled down: no new work, stopped once what it holds is in
            drains_left -= 1
            handle(core.drain(name))
        elif what == "answer":
            u = units[name]
            count = u.withdraws.pop(0)  # what it still holds of it (some may have finished meanwhile)
            take = data.draw(st.lists(st.sampled_from(u.inflight), unique=True, max_size=count)) if u.inflight else []
            parts = [(sid, [7] * len(out), [-1.0] * len(out), out) for sid, out in u.give_back(take)]
            handle(core.withdrawn(name, parts))
        elif what == "finish":
            u = units[name]
            sid, v_admit = u.inflight.pop(data.draw(st.integers(0, len(u.inflight) - 1)))
            u.out.pop(sid, None)
            attempt = u.attempt.pop(sid)
            # the engine reports the oldest version; report the newest sometimes: the ledger must cope
            v = v_admit if data.draw(st.booleans()) else u.version
            u.sent.append((sid, v, attempt))
            scored_now = data.draw(st.booleans())
            handle(
                core.sample(
                    name,
                    sample_id=sid,
                    version=v,
                    output_tokens=3,
                    payload=sid,
                    reward=data.draw(st.sampled_from([0.0, 1.0])) if scored_now else None,
                    attempt=attempt,
                )
            )
            attempt = core.awaiting_reward(sid)
            if attempt is not None:
                unscored.append((sid, attempt))
        elif what == "unstick":  # a reward held the trainer: late samples filtered out, or the group generated again
            before, dropped = core.ledger.discarded_tokens, dropped_tokens()
            handle(core.unstick())
            unstick_discarded += core.ledger.discarded_tokens - before - (dropped_tokens() - dropped)
        elif what == "score":
            sid, attempt = unscored.pop(data.draw(st.integers(0, len(unscored) - 1)))
            handle(core.scored(sid, attempt=attempt, reward=0.5))
        elif what == "dup":
            dups_left -= 1
            sid, v, attempt = data.draw(st.sampled_from(units[name].sent))
            handle(
                core.sample(name, sample_id=sid, version=v, output_tokens=3, payload=sid, reward=1.0, attempt=attempt)
            )
        elif what == "weights":
            u = units[name]
            u.version = u.pending_weights.pop(0)
            handle(core.weights_applied(name, u.version))
        elif what == "train":
            it = trainer.version
            ids = [s["sample_id"] for s in trainer.buffer.pop(it)]
            trainer.trained += ids
            trainer.version += 1
            for u in units.values():
                if u.alive and u.reachable:  # a silent unit is out of the broadcast
                    u.pending_weights.append(trainer.version)
            handle(core.trained(iteration=it, version=trainer.version, sample_ids=ids, stats={}))
        elif what == "kill":
            kills_left -= 1
            units[name].alive = False
            before, too_old = core.ledger.discarded_tokens, core.ledger.partials.too_old_tokens
            handle(core.lost(name))
            grown = core.ledger.discarded_tokens - before - (core.ledger.partials.too_old_tokens - too_old)
            quarantine_discarded += grown
        elif what == "silent":
            silences_left -= 1
            units[name].reachable = False
            handle(core.unreachable(name))
        elif what == "back":  # on the same connection (its engine's work goes on) or a new one (queued again)
            u = units[name]
            u.reachable = True
            handle(core.rejoin(name, version=u.version, requeue=data.draw(st.booleans())))
        elif what == "join":
            join(f"r{next_unit}", 0)  # a newcomer starts from the initial weights
            next_unit += 1

    assert core.done
    counts = core.ledger.counts(completed_iterations=iterations)
    assert trainer.violations == 0
    assert counts.stale_requeued == 0  # reservations kept a place for each group
    # only what a stalled reward filtered out or had generated again, and kept output of regenerated groups too
    # old to resume after that
    partials = core.ledger.partials
    assert (
        counts.discarded_tokens == unstick_discarded + partials.too_old_tokens + dropped_tokens() + quarantine_discarded
    )
    assert quarantine_discarded == 0 or counts.quarantined
    assert unstick_discarded <= 3 * (group * counts.aborted + counts.filtered)
    assert partials.too_old == 0 or counts.aborted > 0
    assert sorted(trainer.trained) == sorted(set(trainer.trained))
    # the ledger holds no round the floor passed; at the end it has retired every one, each sample once
    assert not core.ledger.entries and core.floor == iterations
    assert len({e.sample_id for e in retired}) == len(retired) == counts.samples
    groups: dict[str, list[Entry]] = {}
    for e in retired:
        groups.setdefault(e.prompt_id, []).append(e)
    trained_groups = {e.prompt_id for e in retired if e.state is State.TRAINED}
    left_out = [e for e in retired if e.state is State.FILTERED and e.prompt_id in trained_groups]
    assert len(trainer.trained) == counts.trained_samples == iterations * prompts * group - len(left_out)
    assert all(sum(e.state is State.TRAINED for e in groups[e.prompt_id]) >= 2 for e in left_out)
    # every group drawn is trained or, dropped for equal rewards (at most `refills` a round) or quarantined (in flight
    # at both kills, alone at the second), replaced
    assert counts.trained == iterations * prompts
    assert counts.prompts == counts.trained + counts.dropped + counts.quarantined
    assert counts.dropped + counts.quarantined == counts.prompts - iterations * prompts  # the groups drawn
    assert counts.dropped <= refills * iterations and counts.quarantined <= 1
    assert group >= 2 or counts.dropped == 0
    assert counts.duplicated == 0 and counts.lost == 0
    if mode == "sync":
        assert trainer.early_deliveries == 0
    assert not any(trainer.buffer.values())  # nothing held back at the end
