"""Property: a controller that resumes from a checkpoint (the ledger as it was at a `trained`, partial outputs
and their per-token versions and log-probs with it) still trains every prompt exactly once and never a sample older
than η: the real ControllerCore is driven through random event orders (samples finishing, rewards arriving late,
units reporting partial output, dying and joining, migration), crashed at a random moment after a checkpoint, and
a new core restored from the checkpoint goes on with new units and a trainer at the checkpoint's version. A resumed
sample's prefix holds only tokens of versions at or before the checkpoint's, each with its log-prob."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out
from rlctl.agents.ledger import Ledger
from rlctl.agents.staleness import StalenessBound
from tests.unit.agents.test_agents_staleness_property import FakeTrainer, FakeUnit, prompts_for, whole


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    extra_eta=st.integers(0, 2),
    iterations=st.integers(2, 5),
    prompts=st.integers(1, 3),
    group=st.integers(1, 3),
    num_units=st.integers(1, 3),
    unit_batch=st.integers(1, 4),
    data=st.data(),
)
def test_a_resumed_controller_trains_every_prompt_once_within_the_bound(
    extra_eta, iterations, prompts, group, num_units, unit_batch, data
):
    eta = extra_eta
    cfg = CoreConfig(
        iterations=iterations,
        prompts_per_iteration=prompts,
        samples_per_prompt=group,
        max_new_tokens=16,
        mode="async",
        eta=eta,
        dispatch="skew_aware",
        seed=1,
        unit_batch=unit_batch,
        abort_stalled=False,
        quarantine_after=0,  # (the other property test sets prompts aside)
    )
    bound = StalenessBound(eta)
    now = [0.0]

    def new_core() -> ControllerCore:
        return ControllerCore(
            cfg,
            prompts=prompts_for(prompts),
            predict=lambda specs: [float(len(s.tokens)) for s in specs],
            clock=lambda: now[0],
            cpu_clock=lambda: 0.0,  # looks cost nothing: the same choices whatever a look cost the machine (a replay)
        )

    core = new_core()
    units: dict[str, FakeUnit] = {}
    trainer = FakeTrainer()
    trained: list[str] = []  # every sample trained, by both runs (the first run's up to its checkpoint)
    checkpoint: tuple[int, str, int] | None = None  # (version, the ledger's JSON, samples trained then)
    violations: list[Any] = []

    def handle(outs: list[Out]) -> None:
        for o in outs:
            if o.to == "trainer":
                if o.kind == "samples":
                    for s in o.header["samples"]:
                        if not trainer.hold(s, bound):
                            violations.append(s)
                elif o.kind == "regroup":
                    violations.extend(trainer.regroup(o.header["groups"], o.header["iteration"], bound))
                elif o.kind == "members":
                    for name in o.header["rollouts"]:
                        units[name].catch_up(trainer.version)
            elif o.kind == "generate":
                u = units[o.to]
                assert u.alive
                for r in o.header["requests"]:
                    assert r["sample_id"] not in u.attempt  # (no unit here keeps a sample the core requeued)
                    prefix = list(r.get("prefix_versions", []))
                    # a kept output: a log-prob per token, none of weights past the trainer's (a resumed run's are
                    # the checkpoint's lineage)
                    assert len(r.get("prefix_logprobs", [])) == len(r.get("prefix_tokens", [])) == len(prefix)
                    assert all(v <= trainer.version for v in prefix)
                    u.admit(r)
            elif o.kind == "withdraw":
                units[o.to].withdraws.append(o.header["count"])

    def join(name: str, version: int) -> None:
        units[name] = FakeUnit(version=version)
        handle(core.join(name, role="rollout", version=version, address=f"inproc://{name}"))

    def start(version: int) -> None:
        handle(core.join("trainer-0", role="trainer", version=version))
        for k in range(num_units):
            join(f"r{k}", version)

    start(0)
    next_unit, kills_left, crashed = num_units, 2, False
    unscored: list[tuple[str, int]] = []
    for _ in range(3000):
        if core.done:
            break
        now[0] += 0.1
        alive = [n for n, u in units.items() if u.alive]
        actions = [("finish", n) for n in alive if units[n].inflight]
        actions += [("report", n) for n in alive if units[n].inflight]
        actions += [("answer", n) for n in alive if units[n].withdraws]
        actions += [("score", "")] if unscored else []
        actions += [("weights", n) for n in alive if units[n].pending_weights]
        if whole(trainer.buffer.get(trainer.version, []), prompts):
            actions.append(("train", ""))
        if len(alive) > 1 and kills_left:
            actions += [("kill", n) for n in alive]
        if next_unit < num_units + 2:
            actions.append(("join", ""))
        if checkpoint is not None and not crashed:
            actions.append(("crash", ""))
        assert actions, f"deadlock: {core.ledger.state_histogram()} trainer v{trainer.version}"
        what, name = data.draw(st.sampled_from(actions))
        if what == "report":
            u = units[name]
            sid, _ = data.draw(st.sampled_from(u.inflight))
            start_at, new = u.grow(sid, data.draw(st.integers(1, 2)))
            core.partial(
                name,
                sample_id=sid,
                start=start_at,
                tokens=[7] * len(new),
                logprobs=[-float(v) - 1 for v in new],
                versions=new,
            )
        elif what == "answer":
            u = units[name]
            count = u.withdraws.pop(0)
            take = data.draw(st.lists(st.sampled_from(u.inflight), unique=True, max_size=count)) if u.inflight else []
            parts = [(sid, [7] * len(out), [-float(v) - 1 for v in out], out) for sid, out in u.give_back(take)]
            handle(core.withdrawn(name, parts))
        elif what == "finish":
            u = units[name]
            sid, v_admit = u.inflight.pop(data.draw(st.integers(0, len(u.inflight) - 1)))
            u.out.pop(sid, None)
            attempt = u.attempt.pop(sid)
            scored_now = data.draw(st.booleans())
            handle(
                core.sample(
                    name,
                    sample_id=sid,
                    version=v_admit,
                    output_tokens=3,
                    payload=sid,
                    reward=data.draw(st.sampled_from([0.0, 1.0])) if scored_now else None,
                    attempt=attempt,
                )
            )
            attempt = core.awaiting_reward(sid)
            if attempt is not None:
                unscored.append((sid, attempt))
        elif what == "score":
            sid, attempt = unscored.pop(data.draw(st.integers(0, len(unscored) - 1)))
            handle(core.scored(sid, attempt=attempt, reward=0.5))
        elif what == "weights":
            u = units[name]
            u.version = u.pending_weights.pop(0)
            handle(core.weights_applied(name, u.version))
        elif what == "train":
            it = trainer.version
            ids = [s["sample_id"] for s in trainer.buffer.pop(it)]
            trained.extend(ids)
            trainer.version += 1
            for u in units.values():
                if u.alive:
                    u.pending_weights.append(trainer.version)
            handle(core.trained(iteration=it, version=trainer.version, sample_ids=ids, stats={}))
            if data.draw(st.booleans()):  # the trainer checkpoints this version: the controller keeps its ledger
                checkpoint = (trainer.version, json.dumps(core.ledger.to_json()), len(trained))
        elif what == "kill":
            kills_left -= 1
            units[name].alive = False
            handle(core.lost(name))
        elif what == "join":
            join(f"r{next_unit}", trainer.version)
            next_unit += 1
        elif what == "crash":  # everything goes; a new controller resumes from the checkpoint, with new agents
            assert checkpoint is not None
            crashed = True
            version, saved, kept = checkpoint
            del trained[kept:]  # what the lost run trained past its checkpoint is trained again
            core = new_core()
            core.restore(version=version, ledger=Ledger.from_json(json.loads(saved)))
            assert all(max(p.versions) <= version for p in core.ledger.partials.parts.values() if p)
            units, trainer, unscored = {}, FakeTrainer(version=version), []
            next_unit, kills_left = num_units, 2
            start(version)

    assert core.done
    assert not violations
    assert sorted(trained) == sorted(set(trained))  # none trained twice
    groups = {sid.rsplit("/", 1)[0] for sid in trained}
    assert len(groups) == iterations * prompts and len(trained) == iterations * prompts * group  # none lost
    counts = core.ledger.counts(completed_iterations=iterations)
    assert counts.trained == iterations * prompts and counts.duplicated == 0 and counts.lost == 0
    assert not core.ledger.entries
