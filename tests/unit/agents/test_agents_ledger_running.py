"""The ledger keeps each agent's dispatched samples (`Ledger.running`) and each iteration's count of queued ones
(`Ledger.queued_count`) through every transition, so that what a unit runs, and which rounds have work to dispatch,
are read without a scan of the ledger; the controller's migration look, which reads every sample in
flight, runs less often when it costs more (`MIGRATE_COST_SHARE`)."""

from __future__ import annotations

import itertools
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import MIGRATE_COST_SHARE, CoreConfig, PromptSpec
from rlctl.agents.ledger import Ledger, State

AGENTS = ("rollout-0", "rollout-1", "rollout-2")
OPS = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "finish", "requeue_agent", "migrate", "quarantine", "abort", "assign", "reload"]),
        st.integers(0, 11),
        st.sampled_from(AGENTS),
    ),
    max_size=60,
)


def brute(led: Ledger, agent: str) -> list[str]:
    return sorted(e.sample_id for e in led.entries.values() if e.state is State.DISPATCHED and e.agent == agent)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_running_and_queued_samples_are_those_the_ledger_holds(ops: list[tuple[str, int, str]]) -> None:
    led = Ledger()
    ids = [sid for p in range(3) for sid in led.add_prompt(iteration=0, prompt_id=f"p{p}", num_samples=4)]
    for op, i, agent in ops:
        e = led.entries.get(ids[i])
        if e is None:
            continue
        if op == "dispatch" and e.state is State.QUEUED:
            led.dispatch(e.sample_id, agent=agent, version=0)
        elif op == "finish" and e.state is State.DISPATCHED:
            led.finish(e.sample_id, agent=str(e.agent), version=0, output_tokens=3)
        elif op == "requeue_agent":
            led.requeue_agent(agent)
        elif op == "migrate" and e.state is State.DISPATCHED:
            led.migrate(e.sample_id)
        elif op == "quarantine" and e.state not in (State.DELIVERED, State.TRAINED):
            led.quarantine(e.prompt_id)
        elif op == "abort":
            led.abort_group(e.prompt_id)
        elif op == "assign":  # the group occupies a buffer of another iteration
            led.assign(e.prompt_id, iteration=i % 3)
        elif op == "reload":  # a resume: everything untrained queued again
            led = Ledger.from_json(led.to_json())
        for a in AGENTS:
            assert sorted(x.sample_id for x in led.running(a)) == brute(led, a), (op, a)
            assert led.inflight(a) == len(brute(led, a))
        for it in range(3):
            assert led.queued_count(it) == len(led.in_state(State.QUEUED, iteration=it)), (op, it)
    assert sorted(e.sample_id for e in led.all_running()) == sorted(s for a in AGENTS for s in brute(led, a))


def test_a_costly_migration_look_is_taken_less_often(monkeypatch) -> None:
    """Every 0.2 s whatever it cost: at η 63 with 2,048 samples a round (131,072 in flight on 4 units) a look took
    56 ms of the controller's CPU, 28 % of a core at 5 looks a second."""
    now = [0.0]
    cfg = CoreConfig(iterations=4, prompts_per_iteration=2, samples_per_prompt=2, max_new_tokens=8, mode="async", eta=1)
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1], 4) for j in range(2)])
    core.clock = lambda: now[0]
    looks: list[float] = []

    def costly() -> list:
        looks.append(now[0])
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:  # 50 ms of this thread's CPU
            pass
        return []

    monkeypatch.setattr(core, "_migrate", costly)
    for step in range(40):  # 4 s of the clock, a pump every 0.1 s
        now[0] = step * 0.1
        core.migrate()
    assert looks[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(looks)]
    floor = 0.05 / MIGRATE_COST_SHARE  # ≥ 1 s: at most 5 % of the controller's CPU
    assert gaps and all(g >= floor - 1e-9 for g in gaps), looks
    core.migrate(now=True)  # a unit joined: looked at once all the same
    assert len(looks) == len(gaps) + 2


def test_how_often_migration_looks_follows_the_cores_cpu_clock_not_the_machines(monkeypatch) -> None:
    """A core driven on its own clocks (the property tests) looks every MIGRATE_EVERY_S when its CPU clock says a look
    costs nothing, whatever it cost the thread: versus the thread's CPU time, one look of which (17,586 in a
    property run) took 0.1 s (the next look 2 s later): a replay of the same events chose otherwise and
    hypothesis failed the test as flaky (FlakyStrategyDefinition)."""
    now = [0.0]
    cfg = CoreConfig(iterations=4, prompts_per_iteration=2, samples_per_prompt=2, max_new_tokens=8, mode="async", eta=1)

    def prompts(it: int) -> list[PromptSpec]:
        return [PromptSpec(f"p{it}-{j}", [1], 4) for j in range(2)]

    core = ControllerCore(cfg, prompts=prompts, clock=lambda: now[0], cpu_clock=lambda: 0.0)
    looks: list[float] = []

    def costly() -> list:
        looks.append(now[0])
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.05:  # 50 ms of this thread's CPU, which the core's CPU clock does not see
            pass
        return []

    monkeypatch.setattr(core, "_migrate", costly)
    for step in range(8):  # 1 s of the clock, a pump every 0.125 s (exact in binary)
        now[0] = step * 0.125
        core.migrate()
    assert looks == [0.0, 0.25, 0.5, 0.75]  # every MIGRATE_EVERY_S (0.2 s)
    # a look its CPU clock says cost 1/16 s: the next one 1/16 / MIGRATE_COST_SHARE = 1.25 s later, by the same clock
    cpu = [0.0]

    def counted() -> list:
        looks.append(now[0])
        cpu[0] += 0.0625
        return []

    core = ControllerCore(cfg, prompts=prompts, clock=lambda: now[0], cpu_clock=lambda: cpu[0])
    monkeypatch.setattr(core, "_migrate", counted)
    looks.clear()
    for step in range(40):
        now[0] = step * 0.125
        core.migrate()
    assert looks == [0.0, 1.25, 2.5, 3.75]
