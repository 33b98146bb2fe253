"""A job runs for weeks: what the controller's core holds stays the size of the rounds in flight and the live units,
however many iterations were trained and units replaced (async, η 1 and 2; groups dropped for equal rewards and
drawn again; units lost, drained and replaced under new names), and a checkpoint taken late still resumes."""

from __future__ import annotations

from collections import deque

import pytest

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out, PromptSpec
from rlctl.agents.ledger import Ledger
from rlctl.agents.migration import Cost

PROMPTS, GROUP = 2, 2


def _core(iterations: int, eta: int) -> ControllerCore:
    cfg = CoreConfig(
        iterations=iterations,
        prompts_per_iteration=PROMPTS,
        samples_per_prompt=GROUP,
        max_new_tokens=16,
        mode="async",
        eta=eta,
        max_refills=1,
    )
    return ControllerCore(
        cfg,
        prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1, 2], true_len=4) for j in range(PROMPTS)],
        refill=lambda it, j: PromptSpec(f"q{it}-{j}", [3], true_len=4),
    )


class _Job:
    """The agents around the core, answering at once; every 5th iteration a unit is lost or drained, and a new one
    (a new name) joins. Each unit reports once before it finishes a sample (its rate, its free rows)."""

    def __init__(self, core: ControllerCore) -> None:
        self.core, self.todo, self.held = core, deque[Out](), dict[int, list[str]]()
        self.named = 0
        self.versions: dict[str, int] = {}
        self.todo += core.join("trainer-0", role="trainer", version=0)
        for _ in range(2):
            self._add()

    def _add(self) -> None:
        name = f"rollout-{self.named}"
        self.named += 1
        self.versions[name] = self.core.trainer_version
        self.core.unit_costs[name] = Cost((0.01,), 0.0)  # as the controller sets it when a unit joins
        self.todo += self.core.join(name, role="rollout", version=self.core.trainer_version)

    def _churn(self, k: int) -> None:
        victim = sorted(self.versions)[0]
        if k % 2:
            del self.versions[victim]
            self.todo += self.core.lost(victim)
        else:
            self.todo += self.core.drain(victim)
        self._add()

    def run(self, iterations: int) -> None:
        core, n = self.core, 0
        while core.trainer_version < iterations:
            n += 1
            assert n < 100 * iterations, f"the driven job stopped at iteration {core.trainer_version}"
            while self.todo:
                self._answer(self.todo.popleft())
            ids = self.held.get(core.trainer_version, [])
            if ids and core.buffers.ready(core.trainer_version) and not core.undelivered:
                it = core.trainer_version
                del self.held[it]
                self.todo += core.trained(iteration=it, version=it + 1, sample_ids=ids, stats={"loss": 0.0})
                for name in list(self.versions):
                    self.versions[name] = it + 1
                    self.todo += core.weights_applied(name, it + 1)
                if (it + 1) % 5 == 0:
                    self._churn((it + 1) // 5)

    def _answer(self, o: Out) -> None:
        core = self.core
        if o.kind == "generate" and o.to in self.versions:
            for i, r in enumerate(o.header["requests"]):
                sid, v = r["sample_id"], self.versions[o.to]
                core.partial(o.to, sample_id=sid, start=0, tokens=[5], logprobs=[0.0], versions=[v], made_s=1.0)
                core.reported(o.to, free_rows=1)
                reward = 1.0 if sid.startswith("p") and sid.endswith("-0/0") else float(i % 2)  # some groups alike
                self.todo += core.sample(o.to, sample_id=sid, version=v, output_tokens=3, payload=None, reward=reward)
        elif o.kind == "samples":
            for s in o.header["samples"]:
                self.held.setdefault(s["iteration"], []).append(s["sample_id"])
        elif o.kind == "regroup":
            groups = set(o.header["groups"])
            for it, ids in self.held.items():
                moved = [s for s in ids if s.rsplit("/", 1)[0] in groups]
                self.held[it] = [s for s in ids if s not in moved]
                self.held.setdefault(o.header["iteration"], []).extend(moved)
        elif o.kind == "stop":
            self.versions.pop(o.to, None)


@pytest.mark.parametrize("eta", [1, 2])
def test_the_cores_iteration_stats_are_those_of_the_rounds_in_flight_and_the_last_two_trained(eta: int) -> None:
    core = _core(iterations=400, eta=eta)
    job = _Job(core)
    job.run(40)
    early = len(core.stats)
    job.run(300)
    assert len(core.stats) <= early + 1 <= eta + 5, (early, len(core.stats))
    # what the stats the core let go of counted goes on in the totals the summary reads
    assert core.pruned.iterations + len(core.stats) == core.created
    delivered = core.pruned.samples + sum(st.samples for st in core.stats.values())
    assert delivered == core.ledger.counts().trained_samples + sum(len(ids) for ids in job.held.values())


@pytest.mark.parametrize("eta", [1, 2])
def test_the_ledger_keeps_the_groups_drawn_for_the_rounds_in_flight_only(eta: int) -> None:
    core = _core(iterations=400, eta=eta)
    job = _Job(core)
    job.run(40)
    early = len(core.ledger.refills)
    job.run(300)
    assert core.ledger.counts().dropped > 100  # groups were drawn again
    assert len(core.ledger.refills) <= early + 1 <= eta + 3, (early, core.ledger.refills)


def test_a_checkpoint_taken_late_in_a_long_job_resumes_and_goes_on() -> None:
    core = _core(iterations=400, eta=1)
    job = _Job(core)
    job.run(200)
    saved = core.ledger.to_json()
    assert len(saved["refills"]) <= 3
    again = _core(iterations=400, eta=1)
    again.restore(version=200, ledger=Ledger.from_json(saved))
    resumed = _Job(again)
    resumed.run(220)
    assert again.ledger.counts().duplicated == 0 and len(again.stats) <= 6


def test_what_the_core_keeps_per_rollout_unit_is_of_the_live_units_only() -> None:
    core = _core(iterations=400, eta=1)
    job = _Job(core)
    job.run(300)
    assert job.named > 60  # units lost and drained, each replaced under a new name
    live = {u.name for u in core.units.values() if u.alive}
    for per_unit in (core._rates, core._unit_reported_at, core._admit_cap, core.unit_costs):
        assert set(per_unit) <= live, sorted(set(per_unit) - live)[:5]
    # their `Unit`s too (it kept every unit's for ever: `live_units` walked each at every dispatch); the names gone
    # are still known, and counted
    assert set(core.units) == live, sorted(set(core.units) - live)[:5]
    assert core.num_joined == job.named == len(live) + len(core.left) and len(core.left) > 50
    assert all(core.known(n) and n not in core.units for n in core.left) and not core.known("rollout-never")
