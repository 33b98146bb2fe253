"""Prompts that crash the rollout units they run on (ControllerCore._blame): a prompt in flight at
`quarantine_after` unit losses runs alone on a unit; lost there too, it is quarantined and a new prompt's group
takes its place. Driven through whole runs by a small simulation of the units and the trainer."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out, PromptSpec
from rlctl.agents.ledger import Ledger, State


def _core(*, iterations: int = 4, prompts: int = 4, group: int = 2, after: int = 2, **kw: Any) -> ControllerCore:
    cfg = CoreConfig(
        iterations=iterations,
        prompts_per_iteration=prompts,
        samples_per_prompt=group,
        max_new_tokens=16,
        mode="async",
        eta=kw.pop("eta", 1),
        min_units=kw.pop("min_units", 3),
        quarantine_after=after,
        **kw,
    )
    return ControllerCore(
        cfg,
        prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1, 2 + j], true_len=4 + j) for j in range(prompts)],
        refill=lambda it, j: PromptSpec(f"q{it}-{j}", [3, 4 + j], true_len=4),
    )


class Sim:
    """Units that finish one sample each per step and die holding a poison prompt's sample; a trainer that trains an
    iteration once it holds all its groups; every live unit applies each new version at once; a lost unit is
    replaced at once."""

    def __init__(self, core: ControllerCore, *, units: int = 3, poison: frozenset[str] = frozenset()) -> None:
        self.core, self.poison = core, poison
        self.held: dict[str, list[str]] = {}
        self.got: dict[int, dict[str, list[str]]] = {}  # iteration → group → samples the trainer holds
        self.names = (f"r{i}" for i in itertools.count())
        self.lost: list[str] = []
        self.alone_violations: list[tuple[str, list[str]]] = []
        self.refused: list[str] = []
        self.absorb(core.join("trainer-0", role="trainer", version=0))
        for _ in range(units):
            self.join()

    def join(self) -> None:
        name = next(self.names)
        self.held[name] = []
        self.absorb(self.core.join(name, role="rollout", version=self.core.trainer_version))

    def absorb(self, outs: list[Out]) -> None:
        core = self.core
        for o in outs:
            if o.kind == "generate":
                sids = [r["sample_id"] for r in o.header["requests"]]
                groups = {s.split("/")[0] for s in sids}
                if groups & core.suspects() and (len(groups) > 1 or self.held[o.to]):
                    self.alone_violations.append((o.to, sids))
                self.held[o.to].extend(sids)
            elif o.kind == "samples":
                for s in o.header["samples"]:
                    self.got.setdefault(s["iteration"], {}).setdefault(s["prompt_id"], []).append(s["sample_id"])
            elif o.kind == "regroup":
                to = o.header["iteration"]
                for g in o.header["groups"]:
                    frm = next(it for it, gs in self.got.items() if g in gs)
                    self.got.setdefault(to, {})[g] = self.got[frm].pop(g)
            elif o.kind == "withdraw":
                take = self.held[o.to][-o.header["count"] :]
                del self.held[o.to][-len(take) :]
                self.absorb(core.withdrawn(o.to, [(sid, [], [], []) for sid in take]))

    def step(self) -> None:
        core = self.core
        for name, sids in list(self.held.items()):
            if any(s.split("/")[0] in self.poison for s in sids):
                del self.held[name]
                self.lost.append(name)
                self.absorb(core.lost(name, closed=True))
                self.join()
                return
        for name, sids in list(self.held.items()):
            if sids:
                sid = sids.pop(0)
                if core.ledger.entries.get(sid) is not None and core.ledger.entries[sid].state is State.QUARANTINED:
                    self.refused.append(sid)
                reward = float(sid.endswith("/0"))
                self.absorb(
                    core.sample(
                        name, sample_id=sid, version=core.trainer_version, output_tokens=4, payload=sid, reward=reward
                    )
                )
        b = core.trainer_version
        ready = self.got.get(b, {})
        if len(ready) == core.cfg.prompts_per_iteration and all(
            len(v) == core.cfg.samples_per_prompt for v in ready.values()
        ):
            sids = [s for v in self.got.pop(b).values() for s in v]
            self.absorb(core.trained(iteration=b, version=b + 1, sample_ids=sids, stats={}))
            for name in list(self.held):
                if name in core.units and core.units[name].alive:
                    self.absorb(core.weights_applied(name, b + 1))

    def run(self, steps: int = 500) -> None:
        for _ in range(steps):
            if self.core.done or self.core.failed:
                return
            self.step()
        raise AssertionError(f"not done after {steps} steps: {self.core.ledger.state_histogram()}")


def test_a_prompt_that_crashes_every_unit_it_runs_on_is_quarantined_after_three_losses_and_the_job_ends() -> None:
    core = _core()
    sim = Sim(core, poison=frozenset({"p0-1"}))
    quarantines: list[dict[str, Any]] = []
    while not (core.done or core.failed):
        sim.step()
        quarantines += core.quarantines
        core.quarantines.clear()
        assert len(sim.lost) <= 3, quarantines
    assert core.done and not core.failed
    # two losses shared with whatever else those units held, the third with it alone on its unit
    assert len(sim.lost) == 3
    assert [q for q in quarantines if q["action"] == "quarantined"] == [
        {"prompt": "p0-1", "losses": 3, "unit": sim.lost[-1], "with": 0, "action": "quarantined"}
    ]
    assert {e.state for e in core.ledger.group("p0-1")} <= {State.QUARANTINED}  # (retired with its round)
    counts = core.ledger.counts(completed_iterations=core.trainer_version)
    assert (counts.quarantined, counts.lost, counts.duplicated, counts.refused) == (1, 0, 0, 0)
    assert counts.trained == 4 * 4  # every iteration full: a new prompt's group took the quarantined one's place
    assert core.ledger.state_histogram()[State.QUARANTINED.value] == 2
    assert sim.alone_violations == []  # a suspect went to a unit holding nothing else, with nothing else
    assert core.ledger.crashes == {}  # the innocent suspects ran to the end alone: cleared


def test_one_loss_isolates_nothing_and_a_prompt_that_completes_is_cleared() -> None:
    core = _core(iterations=2)
    sim = Sim(core)
    sim.step()
    victim = next(n for n, sids in sim.held.items() if sids)
    held = {s.split("/")[0] for s in sim.held.pop(victim)}
    sim.absorb(core.lost(victim, closed=True))
    sim.join()
    assert set(core.ledger.crashes) == held and set(core.ledger.crashes.values()) == {1}
    assert core.suspects() == set() and core.quarantines == []
    sim.run()
    counts = core.ledger.counts(completed_iterations=core.trainer_version)
    assert core.done and core.ledger.crashes == {} and (counts.quarantined, counts.lost) == (0, 0)


def test_a_suspect_runs_alone_and_the_other_units_carry_the_rest() -> None:
    """Four units, two suspects: at most half the units hold or empty for a suspect at a time."""
    core = _core(iterations=3, prompts=6, min_units=4)
    sim = Sim(core, units=4)
    core.ledger.crashes.update({"p0-0": 2, "p1-2": 2})  # as if each had been in flight at two losses
    most = 0
    while not core.done:
        sim.step()
        suspects = core.suspects()
        barred = core._barred(suspects)
        most = max(most, len(barred))
        if suspects:  # the other units go on with the rest of the job meanwhile
            assert any(sids and not ({s.split("/")[0] for s in sids} & suspects) for sids in sim.held.values())
    assert sim.alone_violations == [] and most == 2 and core.ledger.crashes == {}


def test_with_one_unit_suspects_of_every_round_run_alone_in_turn_and_the_job_ends() -> None:
    """The one unit empties for a suspect only when the suspect may go to it: one whose group has no room within
    the bound yet leaves it to the work the trainer waits for (else the job would wait for ever)."""
    for eta in (1, 2):
        core = _core(iterations=4, prompts=3, min_units=1, eta=eta)
        core.ledger.crashes.update({f"p{r}-{j}": 2 for r in range(4) for j in (0, 2)})
        sim = Sim(core, units=1)
        sim.run()
        counts = core.ledger.counts(completed_iterations=core.trainer_version)
        assert sim.alone_violations == [] and core.ledger.crashes == {} and (counts.trained, counts.lost) == (12, 0)


def test_a_suspect_with_no_room_within_the_bound_holds_no_unit() -> None:
    """A unit emptied for a suspect that may not go to it would sit idle, and could hold the trainer's iteration."""
    core = _core(iterations=2, prompts=2, min_units=1)
    core.ledger.crashes["p0-1"] = 2
    may_reserve = core.buffers.may_reserve
    core.buffers.may_reserve = lambda group, version: group != "p0-1" and may_reserve(group, version)  # type: ignore[method-assign]
    sim = Sim(core, units=1)
    assert sorted(sim.held["r0"]) == ["p0-0/0", "p0-0/1", "p1-0/0", "p1-0/1", "p1-1/0", "p1-1/1"]
    sim.absorb(core.pump())
    assert core.clearing == set()  # not emptied for a suspect that could not go to it
    core.buffers.may_reserve = may_reserve  # type: ignore[method-assign]
    sim.absorb(core.pump())
    assert core.clearing == {"r0"}  # room now: it empties for the suspect, which then runs alone
    sim.run()
    assert core.done and sim.alone_violations == [] and core.ledger.crashes == {}


def test_a_unit_decoding_a_held_out_evaluation_takes_a_suspect_only_once_it_is_done() -> None:
    core = _core(iterations=1, prompts=1, min_units=1)
    core.ledger.crashes["p0-0"] = 2
    evaluating = {"r0"}
    core.evaluating = evaluating.__contains__
    sim = Sim(core, units=1)
    assert sim.held["r0"] == [] and core.clearing == {"r0"}  # empty of rollout work, not of held-out prompts
    evaluating.clear()  # its evaluation answered: nothing else arrives from it, the controller's loop pumps
    sim.absorb(core.pump())
    assert sorted(sim.held["r0"]) == ["p0-0/0", "p0-0/1"] and core.clearing == set()


def test_off_a_prompt_that_crashes_units_is_never_set_aside() -> None:
    core = _core(after=0)
    sim = Sim(core, poison=frozenset({"p0-1"}))
    for _ in range(20):
        sim.step()
    assert len(sim.lost) >= 5 and core.ledger.crashes == {} and not core.suspects()


def test_a_unit_that_went_silent_blames_nothing() -> None:
    core = _core(after=1)
    sim = Sim(core)
    name = next(n for n, sids in sim.held.items() if sids)
    sim.absorb(core.unreachable(name))  # its link: its samples go back to the queue
    sim.absorb(core.lost(name))  # lost later, holding nothing
    assert core.ledger.crashes == {} and core.quarantines == []


def test_a_checkpoint_keeps_the_quarantined_group_set_aside_and_the_suspects_counts() -> None:
    core = _core(iterations=3, after=2)
    sim = Sim(core, poison=frozenset({"p1-0"}))
    while not core.ledger.quarantined:
        sim.step()
    saved = core.ledger.to_json()
    crashes = dict(core.ledger.crashes)
    again = _core(iterations=3, after=2)
    again.restore(version=core.trainer_version, ledger=Ledger.from_json(saved))
    assert {e.state for e in again.ledger.group("p1-0")} == {State.QUARANTINED}
    assert again.ledger.crashes == crashes and again.ledger.quarantined == 1
    assert "q1-0" in again.prompts  # the group drawn in its place is generated again
    Sim(again).run()
    counts = again.ledger.counts(completed_iterations=again.trainer_version)
    assert again.done and (counts.quarantined, counts.lost, counts.duplicated) == (1, 0, 0)


def test_a_unit_lost_while_evaluating_held_out_prompts_too_held_nothing_alone() -> None:
    """The held-out prompts it decoded may have crashed it: the suspect beside them is counted, not quarantined."""
    core = _core(iterations=1, prompts=1, min_units=1)
    core.ledger.crashes["p0-0"] = 2
    sim = Sim(core, units=1)
    assert sorted(sim.held["r0"]) == ["p0-0/0", "p0-0/1"] and core.isolating() == {"r0"}
    sim.absorb(core.lost("r0", closed=True, evaluating=True))
    assert core.ledger.crashes == {"p0-0": 3} and not core.ledger.quarantined
    assert core.quarantines == []
    sim.held.pop("r0")
    sim.join()
    sim.absorb(core.lost("r1", closed=True))  # alone this time
    assert core.ledger.quarantined == 1 and core.quarantines[-1]["action"] == "quarantined"


def test_a_prompt_alone_on_its_unit_at_its_first_loss_is_only_counted() -> None:
    core = _core(iterations=1, prompts=1, min_units=1)
    sim = Sim(core, units=1)
    sim.absorb(core.lost("r0", closed=True))
    assert core.ledger.crashes == {"p0-0": 1} and not core.ledger.quarantined
    assert Counter(q["action"] for q in core.quarantines) == Counter()


def test_samples_given_back_after_a_loss_made_their_prompt_a_suspect_are_not_run_beside_other_work() -> None:
    # migration asked A for samples; before A answered, a unit loss made p0-0 a suspect: the answer's p0-0
    # samples went to the migration target beside p0-1's
    core = ControllerCore(
        CoreConfig(
            iterations=1,
            prompts_per_iteration=2,
            samples_per_prompt=4,
            max_new_tokens=16,
            mode="stream",
            eta=0,
            min_units=1,
            quarantine_after=2,
            unit_batch=64,
        ),
        prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1, 2 + j], 4) for j in range(2)],
        refill=lambda it, j: PromptSpec(f"q{it}-{j}", [3], 4),
    )
    held: dict[str, list[str]] = {}
    asked: dict[str, int] = {}

    def absorb(outs: list[Out]) -> None:
        for o in outs:
            if o.kind == "generate":
                held.setdefault(o.to, []).extend(r["sample_id"] for r in o.header["requests"])
            elif o.kind == "withdraw":
                asked[o.to] = o.header["count"]

    def give_back(unit: str, sids: list[str]) -> None:
        take = sids[: asked.pop(unit)]
        held[unit] = [s for s in held[unit] if s not in take]
        absorb(core.withdrawn(unit, [(s, [], [], []) for s in take]))

    absorb(core.join("trainer-0", role="trainer", version=0))
    absorb(core.join("A", role="rollout", version=0))
    absorb(core.join("C", role="rollout", version=0))  # idle: A gives some back
    give_back("A", ["p0-0/2", "p0-0/3", "p0-1/2", "p0-1/3"])
    core.ledger.crashes["p0-0"] = 1  # lost once before with a unit
    absorb(core.join("T", role="rollout", version=0))  # idle: A is asked again
    assert "A" in asked and held["C"]
    del held["C"]
    absorb(core.lost("C", closed=True))  # C held p0-0's samples: p0-0 is a suspect now
    assert "p0-0" in core.suspects()
    give_back("A", ["p0-0/1", "p0-1/1"])
    on_t = {s.split("/")[0] for s in held.get("T", [])}
    assert not (on_t & core.suspects() and len(on_t) > 1), held.get("T")
