"""A dispatch share balances with the tokens each unit holds (`Admission._held_tokens`), summed again only once the
unit's samples in flight changed (`Ledger.running_stamp`), versus a read of every one of them at each share (one at
each unit's `weights_applied`): the same float as the full sum, whatever happened to the samples in between."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, PromptSpec
from rlctl.agents.ledger import Ledger, State

AGENTS = ("rollout-0", "rollout-1")
PROMPTS = 3
OPS = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "finish", "requeue_agent", "migrate", "quarantine", "abort", "reload", "read"]),
        st.integers(0, 4 * PROMPTS - 1),
        st.sampled_from(AGENTS),
    ),
    min_size=20,
    max_size=80,
)


def _core(preds: list[float]) -> ControllerCore:
    cfg = CoreConfig(
        iterations=1, prompts_per_iteration=PROMPTS, samples_per_prompt=4, max_new_tokens=64, mode="async", eta=0
    )
    core = ControllerCore(cfg, prompts=lambda it: [], predict=lambda specs: preds[: len(specs)])
    specs = [PromptSpec(f"p{j}", list(range(j + 1)), 8) for j in range(PROMPTS)]
    core._register(specs)
    for spec in specs:
        core.ledger.add_prompt(iteration=0, prompt_id=spec.prompt_id, num_samples=4)
    return core


def full_scan(core: ControllerCore, unit: str) -> float:
    """`_held_tokens` before the stamp: every sample `unit` runs, summed in the order it was dispatched."""
    total = 0.0
    for e in core.ledger.running(unit):
        total += core.pred_len[e.prompt_id] + len(core.prompts[e.prompt_id].tokens)
    return total


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=PROMPTS, max_size=PROMPTS), OPS)
def test_held_tokens_are_the_full_sum_of_what_each_unit_runs(
    preds: list[float], ops: list[tuple[str, int, str]]
) -> None:
    core = _core(preds)  # predictions with fractions: a total kept by adding and taking away would round otherwise
    ids = list(core.ledger.entries)
    for op, i, agent in ops:
        led = core.ledger
        e = led.entries[ids[i]]
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
        elif op == "reload":  # a resume's ledger, not read until a unit runs something of it again
            core.ledger = Ledger.from_json(led.to_json())
            continue
        for a in AGENTS:  # "read": only this, so that a unit's figure is read twice with nothing changed between
            assert core._held_tokens(a) == full_scan(core, a), (op, a)


def test_a_share_reads_a_units_samples_again_only_once_they_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    core = _core([10.5, 20.25, 30.125])
    led = core.ledger
    reads: list[str] = []
    running = led.running
    monkeypatch.setattr(led, "running", lambda agent: reads.append(agent) or running(agent))
    for sid in ("p0/0", "p1/0", "p2/1"):
        led.dispatch(sid, agent="rollout-0", version=0)
    assert core._held_tokens("rollout-0") == 10.5 + 1 + 20.25 + 2 + 30.125 + 3
    assert core._held_tokens("rollout-0") == 10.5 + 1 + 20.25 + 2 + 30.125 + 3
    assert reads == ["rollout-0"]  # read once: nothing it runs changed since
    led.finish("p1/0", agent="rollout-0", version=0, output_tokens=5)
    assert core._held_tokens("rollout-0") == 10.5 + 1 + 30.125 + 3
    assert core._held_tokens("rollout-1") == 0.0  # runs nothing: nothing to read
    assert reads == ["rollout-0", "rollout-0"]
