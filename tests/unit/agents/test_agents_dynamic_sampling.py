"""DAPO's dynamic sampling in the controller's core: a group whose rewards are all equal is dropped once scored and a
new prompt's group of the same round takes its place, up to `max_refills` per round; a checkpoint keeps the dropped
groups dropped and the groups drawn in their place to be generated again."""

from __future__ import annotations

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Out, PromptSpec
from rlctl.agents.ledger import Ledger, State


def _core(*, refills: int, prompts: int = 2, iterations: int = 1, mode: str = "stream", eta: int = 0) -> ControllerCore:
    cfg = CoreConfig(
        iterations=iterations,
        prompts_per_iteration=prompts,
        samples_per_prompt=2,
        max_new_tokens=16,
        mode=mode,  # type: ignore[arg-type]
        eta=eta,
        max_refills=refills,
    )
    return ControllerCore(
        cfg,
        prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1, 2 + j], true_len=4) for j in range(prompts)],
        refill=lambda it, j: PromptSpec(f"q{it}-{j}", [3, 4 + j], true_len=4),
    )


def _sent(outs: list[Out]) -> list[str]:
    return sorted(r["sample_id"] for o in outs if o.kind == "generate" for r in o.header["requests"])


def _delivered(outs: list[Out]) -> list[tuple[str, float]]:
    return sorted((s["sample_id"], s["reward"]) for o in outs if o.kind == "samples" for s in o.header["samples"])


def _group(core: ControllerCore, group: str, rewards: tuple[float, float], version: int = 0) -> list[Out]:
    outs: list[Out] = []
    for k, reward in enumerate(rewards):
        outs += core.sample(
            "r0", sample_id=f"{group}/{k}", version=version, output_tokens=5, payload=group, reward=reward
        )
    return outs


def _started(core: ControllerCore) -> list[str]:
    core.join("trainer-0", role="trainer", version=0)
    return _sent(core.join("r0", role="rollout", version=0))


def test_a_group_whose_rewards_are_all_equal_is_dropped_and_a_new_prompt_s_group_takes_its_place() -> None:
    core = _core(refills=2)
    assert _started(core) == ["p0-0/0", "p0-0/1", "p0-1/0", "p0-1/1"]
    outs = _group(core, "p0-0", (1.0, 1.0))  # no advantage: trains nothing
    assert _delivered(outs) == [] and _sent(outs) == ["q0-0/0", "q0-0/1"]
    assert {e.state for e in core.ledger.group("p0-0")} == {State.DROPPED}
    assert _delivered(_group(core, "p0-1", (0.0, 1.0))) == [("p0-1/0", 0.0), ("p0-1/1", 1.0)]
    assert _delivered(_group(core, "q0-0", (1.0, 0.0))) == [("q0-0/0", 1.0), ("q0-0/1", 0.0)]
    core.trained(iteration=0, version=1, sample_ids=["p0-1/0", "p0-1/1", "q0-0/0", "q0-0/1"], stats={})
    counts = core.ledger.counts(completed_iterations=1)
    assert core.done and (counts.prompts, counts.trained, counts.dropped, counts.lost) == (3, 2, 1, 0)
    assert counts.discarded_tokens == 10 and core.stats[0].dropped == 1  # the dropped group's two outputs


def test_past_max_refills_a_group_without_signal_trains_as_it_is() -> None:
    core = _core(refills=1, prompts=1)
    _started(core)
    assert _sent(_group(core, "p0-0", (0.0, 0.0))) == ["q0-0/0", "q0-0/1"]
    outs = _group(core, "q0-0", (0.0, 0.0))  # the round drew its one refill already
    assert _delivered(outs) == [("q0-0/0", 0.0), ("q0-0/1", 0.0)] and _sent(outs) == []
    assert core.ledger.counts().dropped == 1


def test_off_nothing_is_dropped() -> None:
    core = _core(refills=0, prompts=1)
    _started(core)
    assert _delivered(_group(core, "p0-0", (1.0, 1.0))) == [("p0-0/0", 1.0), ("p0-0/1", 1.0)]


def test_a_checkpoint_keeps_dropped_groups_dropped_and_the_groups_drawn_in_their_place_to_generate_again() -> None:
    """η 1: round 1's first group is dropped (its replacement drawn) before the checkpoint of v1; resumed there,
    the dropped group stays dropped, its replacement is generated again beside round 1's other group, and the next
    refill of round 1 is its second prompt (no id reused)."""
    core = _core(refills=3, iterations=3, mode="async", eta=1)
    assert _started(core) == [f"p{i}-{j}/{k}" for i in (0, 1) for j in (0, 1) for k in (0, 1)]
    assert _sent(_group(core, "p1-0", (1.0, 1.0))) == ["q1-0/0", "q1-0/1"]
    _group(core, "p0-0", (0.0, 1.0))
    _group(core, "p0-1", (1.0, 0.0))
    core.trained(iteration=0, version=1, sample_ids=[f"p0-{j}/{k}" for j in (0, 1) for k in (0, 1)], stats={})
    saved = core.ledger.to_json()

    again = _core(refills=3, iterations=3, mode="async", eta=1)
    again.restore(version=1, ledger=Ledger.from_json(saved))
    assert {e.state for e in again.ledger.group("p1-0")} == {State.DROPPED}
    assert _started(again) == ["p1-1/0", "p1-1/1", "q1-0/0", "q1-0/1"]  # a unit at v0 serves round 1 alone
    assert _sent(_group(again, "p1-1", (0.5, 0.5), version=0)) == ["q1-1/0", "q1-1/1"]
    assert again.ledger.refills == {1: 2} and again.ledger.counts().dropped == 2


def test_a_resume_takes_the_groups_it_moves_to_its_first_buffer_in_the_ledgers_order() -> None:
    """Resumed at v1 with round 0's 24 groups not trained: they occupy buffer 1 in the order the ledger holds them,
    versus the order a set of their ids came in (PYTHONHASHSEED's: two resumes of one checkpoint dispatched
    differently)."""
    core = _core(refills=0, prompts=24, iterations=3, mode="async", eta=1)
    _started(core)
    again = _core(refills=0, prompts=24, iterations=3, mode="async", eta=1)
    again.restore(version=1, ledger=Ledger.from_json(core.ledger.to_json()))
    moved = [e.prompt_id for e in again.ledger.by_iteration[1] if e.prompt_id.startswith("p0-")]
    assert list(dict.fromkeys(moved)) == [f"p0-{j}" for j in range(24)]
