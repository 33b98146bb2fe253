"""ControllerCore wiring: skewness-aware dispatch, the start gate, sync vs stream delivery, requeue, the staleness
buffers' order of groups, rewards that hold the trainer."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, Mode, Out, PromptSpec
from rlctl.agents.ledger import Ledger, State
from rlctl.agents.messages import Delivered, Regroup
from rlctl.agents.trainer import _regroup


def _core(mode="stream", dispatch="skew_aware", eta=0, prompts=4, group=1, iterations=2, min_units=1, **cfg: Any):
    lengths = [50, 10, 30, 20, 5, 40][:prompts]

    def make(it: int) -> list[PromptSpec]:
        return [PromptSpec(f"p{it}-{j}", [1, 2], true_len=lengths[j]) for j in range(prompts)]

    cfg = CoreConfig(
        iterations=iterations,
        prompts_per_iteration=prompts,
        samples_per_prompt=group,
        max_new_tokens=64,
        mode=mode,
        eta=eta,
        dispatch=dispatch,
        min_units=min_units,
        **cfg,
    )
    # a perfect predictor, so the expected split is known; a clock that stands still, so that the core looks to
    # migrate where a test asks (`migrate(now=True)`, a join) and at its first pump only, versus the machine's: a
    # stall of MIGRATE_EVERY_S (0.2 s) between two of a test's lines let a pump look first and ask the withdraw
    return ControllerCore(
        cfg, prompts=make, predict=lambda specs: [float(s.true_len) for s in specs], clock=lambda: 0.0
    )


def _generate(outs: list[Out]) -> dict[str, list[tuple[str, float]]]:
    gen: dict[str, list[tuple[str, float]]] = {}
    for o in outs:
        if o.kind == "generate":
            gen.setdefault(o.to, []).extend((r["sample_id"], r["priority"]) for r in o.header["requests"])
    return gen


def test_skew_aware_balances_predicted_tokens_longest_first():
    core = _core()
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    outs = core.join("r1", role="rollout", version=0)
    gen = _generate(outs)
    assert gen == {}  # r0 alone already started the job (min_units=1) …
    core2 = _core(min_units=2)
    core2.join("trainer-0", role="trainer", version=0)
    assert _generate(core2.join("r0", role="rollout", version=0)) == {}  # … unless two units are planned
    gen = _generate(core2.join("r1", role="rollout", version=0))
    # LPT over predicted tokens (len + 2 prompt tokens): 52→r0, 32→r1, 22→r1, 12→r0 : loads 64 / 54
    assert gen == {"r0": [("p0-0/0", 50.0), ("p0-1/0", 10.0)], "r1": [("p0-2/0", 30.0), ("p0-3/0", 20.0)]}


def test_a_unit_drained_before_the_first_dispatch_is_not_waited_for():
    """A resumed run drains again a unit its checkpoint's run had scaled in (`scale -1`), before the trainer joined
    (it restores its checkpoint first): the start waited for the planned 2 units with 1 left in dispatch, and the job
    stood at its checkpoint's iteration for START_WAIT_S (90 s), then said `start_with_fewer_units`."""
    core = _core(min_units=2)
    core.join("r0", role="rollout", version=0)
    core.join("r1", role="rollout", version=0)
    core.drain("r1")
    gen = _generate(core.join("trainer-0", role="trainer", version=0))
    assert core.started and set(gen) == {"r0"} and len(gen["r0"]) == 4


def test_random_dispatch_ignores_lengths():
    core = _core(dispatch="random", min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    assert sorted(len(v) for v in gen.values()) == [2, 2]
    assert {p for v in gen.values() for _, p in v} == {0.0}


def _finish(core: ControllerCore, agent: str, sid: str, version: int = 0, tokens: int = 3) -> list[Out]:
    return core.sample(agent, sample_id=sid, version=version, output_tokens=tokens, payload=sid, reward=1.0)


def test_sync_delivers_only_a_complete_iteration_stream_delivers_at_once():
    for mode, expect_early in (("sync", False), ("stream", True)):
        core = _core(mode=mode, prompts=2)
        core.join("trainer-0", role="trainer", version=0)
        gen = _generate(core.join("r0", role="rollout", version=0))
        (first, _), (second, _) = gen["r0"]
        early = [o for o in _finish(core, "r0", first) if o.kind == "samples"]
        assert bool(early) is expect_early, mode
        late = [o for o in _finish(core, "r0", second) if o.kind == "samples"]
        delivered = [s["sample_id"] for o in early + late for s in o.header["samples"]]
        assert sorted(delivered) == sorted([first, second])


def test_sync_does_not_dispatch_the_next_iteration_before_new_weights():
    core = _core(mode="sync", prompts=1)
    core.join("trainer-0", role="trainer", version=0)
    ((sid, _),) = _generate(core.join("r0", role="rollout", version=0))["r0"]
    _finish(core, "r0", sid)
    outs = core.trained(iteration=0, version=1, sample_ids=[sid], stats={})
    assert _generate(outs) == {}  # r0 still holds v0; iteration 1 needs v1
    assert list(_generate(core.weights_applied("r0", 1))) == ["r0"]


def test_async_dispatches_one_iteration_ahead():
    core = _core(mode="async", eta=1, prompts=1, iterations=3)
    core.join("trainer-0", role="trainer", version=0)
    gen = _generate(core.join("r0", role="rollout", version=0))
    assert [sid for sid, _ in gen["r0"]] == ["p0-0/0", "p1-0/0"]  # iterations 0 and 1 with v0
    (_, p0), (_, p1) = gen["r0"]
    assert p0 > p1  # the older iteration is admitted first, whatever the predicted lengths


def test_async_the_group_that_finishes_first_fills_the_trainers_iteration_and_the_slow_one_moves_on():
    """η 1, one prompt per iteration: round 1's group finishes before round 0's. It fills iteration 0 (the earliest
    buffer that keeps round 0's reservation, due by iteration 1, feasible), and goes to the trainer at once; round
    0's group then takes iteration 1 — within its bound, so the trainer never waits for the slow one."""
    core = _core(mode="async", eta=1, prompts=1, iterations=3)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    early = [o for o in _finish(core, "r0", "p1-0/0") if o.kind == "samples"]
    assert [(s["sample_id"], s["iteration"]) for o in early for s in o.header["samples"]] == [("p1-0/0", 0)]
    assert core.ledger.entries["p1-0/0"].state is State.DELIVERED and core.trainer_version == 0
    assert core.stats[0].staleness == {0: 1}  # generated with v0, trained at v0
    late = [o for o in _finish(core, "r0", "p0-0/0") if o.kind == "samples"]
    assert [(s["sample_id"], s["iteration"], s["reward"]) for o in late for s in o.header["samples"]] == [
        ("p0-0/0", 1, 1.0)
    ]
    assert core.stats[1].staleness == {1: 1}  # generated with v0, trained at v1: η allows it
    assert core.ledger.entries["p0-0/0"].iteration == 1 and core.ledger.entries["p1-0/0"].iteration == 0


def test_a_group_goes_to_the_trainer_only_once_every_sample_is_in_and_scored():
    """Rewards are scored beside the controller: a sample waits for its reward, its group for all of them; a
    reward for an attempt that was requeued since is dropped."""
    core = _core(mode="stream", prompts=1, group=2, iterations=1)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    assert core.sample("r0", sample_id="p0-0/0", version=0, output_tokens=3, payload="a", reward=None) == []
    attempt = core.awaiting_reward("p0-0/0")
    assert attempt == 1
    assert [o.kind for o in core.scored("p0-0/0", attempt=attempt, reward=0.25)] == []  # its sibling is not in
    assert [o.kind for o in core.scored("p0-0/0", attempt=attempt, reward=0.9)] == []  # scored once only
    outs = core.sample("r0", sample_id="p0-0/1", version=0, output_tokens=2, payload="b", reward=None)
    assert not [o for o in outs if o.kind == "samples"]
    [out] = [o for o in core.scored("p0-0/1", attempt=1, reward=0.75) if o.kind == "samples"]
    assert [(s["sample_id"], s["reward"]) for s in out.header["samples"]] == [("p0-0/0", 0.25), ("p0-0/1", 0.75)]
    assert core.scored("p0-0/1", attempt=0, reward=0.0) == []  # not the attempt that is waiting

    # stream (η 0) never has a later iteration in flight: nothing changes there
    stream = _core(mode="stream", prompts=1, iterations=2)
    stream.join("trainer-0", role="trainer", version=0)
    stream.join("r0", role="rollout", version=0)
    assert stream.created == 1


def test_lost_agent_requeues_to_the_survivor_and_nothing_is_delivered_twice():
    core = _core(min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    done_r1 = gen["r1"][0][0]
    _finish(core, "r1", done_r1)
    outs = core.lost("r1")
    regen = _generate(outs)
    assert list(regen) == ["r0"] and [s for s, _ in regen["r0"]] == [gen["r1"][1][0]]
    assert core.ledger.requeued == 1
    assert core.sample("r1", sample_id=gen["r1"][1][0], version=0, output_tokens=1, payload=None, reward=0.0) == []
    assert core.ledger.entries[done_r1].state is State.DELIVERED


def test_lost_trainer_fails_the_job():
    core = _core()
    core.join("trainer-0", role="trainer", version=0)
    core.lost("trainer-0")
    assert core.failed and core.pump() == []


def test_more_skipped_steps_in_a_row_than_the_job_takes_fail_it():
    """`trainer.skip_nonfinite: 1`: one step skipped for a NaN/Inf gradient is taken, a trained one resets the count,
    two in a row fail the job naming them and the version whose weights it still has."""
    core = _core(prompts=1, iterations=6, skip_nonfinite=1)
    core.join("trainer-0", role="trainer", version=0)
    outs = core.join("r0", role="rollout", version=0)
    for it, skipped in enumerate([True, False, True, True]):
        ((sid, _),) = _generate(outs)["r0"]
        _finish(core, "r0", sid, version=it)
        core.trained(iteration=it, version=it + 1, sample_ids=[sid], stats={}, skipped=skipped)
        if it < 3:
            assert core.failed is None, it
            outs = core.weights_applied("r0", it + 1)
    assert core.skipped_in_a_row == [2, 3] and core.pump() == []
    assert core.failed == (
        "the trainer's gradient norm was NaN or infinite at 2 steps in a row (iterations 2–3), more than "
        "trainer.skip_nonfinite (1) allows; those steps were skipped, so the weights are still those of v2"
    )


def test_restored_core_regenerates_exactly_what_the_checkpoint_had_not_trained():
    from rlctl.agents.ledger import Ledger

    core = _core(mode="async", eta=1, prompts=2, iterations=4)
    retired: list = []  # the sample log: the rounds each core's ledger retired
    core.on_retire = retired.extend
    core.join("trainer-0", role="trainer", version=0)
    gen = _generate(core.join("r0", role="rollout", version=0))["r0"]
    for sid, _ in gen:  # iterations 0 and 1 generated on v0
        _finish(core, "r0", sid)
    core.trained(iteration=0, version=1, sample_ids=["p0-0/0", "p0-1/0"], stats={})
    saved = core.ledger.to_json()  # the checkpoint of v1: iteration 1 was generated, not trained
    assert [e.sample_id for e in retired] == ["p0-0/0", "p0-1/0"] and "p0-0/0" not in core.ledger.entries

    again = _core(mode="async", eta=1, prompts=2, iterations=4)
    again.on_retire = retired.extend
    again.restore(version=1, ledger=Ledger.from_json(saved))
    again.join("trainer-0", role="trainer", version=1)
    regen = _generate(again.join("r0", role="rollout", version=0))["r0"]
    assert sorted(s for s, _ in regen) == ["p1-0/0", "p1-1/0"]  # v0 may serve iteration 1 only (η = 1)
    trained, pending, unit_version = ["p0-0/0", "p0-1/0"], [s for s, _ in regen], 0
    for it in (1, 2, 3):
        outs = []
        for sid in [s for s in pending if s.startswith(f"p{it}-")]:
            outs += _finish(again, "r0", sid, version=unit_version)
        delivered = sorted(s["sample_id"] for o in outs if o.kind == "samples" for s in o.header["samples"])
        assert delivered == [f"p{it}-0/0", f"p{it}-1/0"]
        again.trained(iteration=it, version=it + 1, sample_ids=delivered, stats={})
        trained += delivered
        unit_version = it + 1
        pending += [s for s, _ in _generate(again.weights_applied("r0", unit_version)).get("r0", [])]
    assert again.done and sorted(trained) == sorted(e.sample_id for e in retired)  # each prompt trained once
    assert not again.ledger.entries and again.ledger.counts().duplicated == 0  # every round retired


def test_a_new_version_is_shared_by_every_unit_catching_up_not_taken_by_the_first_to_apply_it():
    """Sync, three units: the first unit to apply v1 takes its share of iteration 1, not the whole of it; the
    next takes its own; the share of a unit that has not caught up within `reserve_s` goes to the others."""
    lengths = [50, 10, 30, 20, 5, 40]
    now = [0.0]
    cfg = CoreConfig(
        iterations=2, prompts_per_iteration=6, samples_per_prompt=1, max_new_tokens=64, mode="sync", eta=0,
        min_units=3, reserve_s=30.0,
    )  # fmt: skip
    core = ControllerCore(
        cfg,
        prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1, 2], true_len=lengths[j]) for j in range(6)],
        predict=lambda specs: [float(s.true_len) for s in specs],
        clock=lambda: now[0],
    )
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    core.join("r1", role="rollout", version=0)
    first = _generate(core.join("r2", role="rollout", version=0))
    assert sorted(len(v) for v in first.values()) == [2, 2, 2]
    for unit, reqs in first.items():
        for sid, _ in reqs:
            _finish(core, unit, sid)
    core.trained(iteration=0, version=1, sample_ids=[sid for v in first.values() for sid, _ in v], stats={})
    now[0] = 1.0
    # LPT over r0, r1, r2 (52, 42 | 32, 22 | 12, 7 → r0: 52 + 7, r1: 42 + 12, r2: 32 + 22): r0 sends its share
    assert {u: [s for s, _ in v] for u, v in _generate(core.weights_applied("r0", 1)).items()} == {
        "r0": ["p1-0/0", "p1-4/0"]
    }
    assert core.reserving
    got = _generate(core.weights_applied("r1", 1))
    assert list(got) == ["r1"] and len(got["r1"]) == 2
    now[0] = 1.0 + 29.0
    assert _generate(core.pump()) == {}  # r2's share still waits for it …
    now[0] = 1.0 + 30.0
    assert not core.reserving
    late = _generate(core.pump())  # … until reserve_s has passed: the units that have v1 take it
    assert sorted(late) == ["r0", "r1"] and sum(len(v) for v in late.values()) == 2
    assert core.ledger.in_state(State.QUEUED) == []


def _one_prompt_core(
    now: list[float], *, mode: Mode, eta: int, iterations: int, stall: float | None, group: int = 1
) -> ControllerCore:
    """One prompt of `group` samples per iteration, a trainer and unit r0 joined; the clock reads now[0]; `stall`:
    the reward stall limit (None: the job waits for its rewards)."""
    cfg = CoreConfig(
        iterations=iterations,
        prompts_per_iteration=1,
        samples_per_prompt=group,
        max_new_tokens=8,
        mode=mode,
        eta=eta,
        reward_stall_s=stall,
        abort_stalled=stall is not None,
    )
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1, 2], 3)], clock=lambda: now[0])
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    return core


def test_a_reward_that_holds_the_trainers_iteration_past_the_stall_limit_is_aborted_and_a_later_group_moves_in():
    """η 1, one prompt per iteration, the trainer at version 1: round 1's group (dispatched with v0: due by 1) is
    generated but its reward hangs; round 2's group (v1: due by 2) is done and went to iteration 2. Past the stall
    limit the hung group is generated again (its tokens discarded) and round 2's group moves into iteration 1: the
    trainer is told (`regroup`) and trains it at once; the late reward is ignored."""
    now = [0.0]
    core = _one_prompt_core(now, mode="async", eta=1, iterations=4, stall=0.5)
    _finish(core, "r0", "p0/0")
    core.trained(iteration=0, version=1, sample_ids=["p0/0"], stats={})
    core.weights_applied("r0", 1)
    assert core.buffers.deadline == {"p1": 1, "p2": 2}
    core.sample("r0", sample_id="p1/0", version=0, output_tokens=5, payload="p1", reward=None)  # reward hangs
    attempt = core.awaiting_reward("p1/0")
    [samples] = [o for o in _finish(core, "r0", "p2/0", version=1) if o.kind == "samples"]
    assert [s["iteration"] for s in samples.header["samples"]] == [2]  # buffer 1 is p1's: it can go nowhere else
    now[0] = 0.4
    assert core.unstick() == []  # not past the limit yet
    now[0] = 0.6
    outs = core.unstick()
    [regroup] = [o for o in outs if o.kind == "regroup"]
    assert regroup.to == "trainer" and regroup.header == {"groups": ["p2"], "iteration": 1}
    assert core.buffers.ready(1) and core.ledger.entries["p2/0"].iteration == 1
    assert core.ledger.entries["p1/0"].state is State.DISPATCHED  # generated again, at once, with v1: due by 2
    assert core.buffers.deadline == {"p1": 2}
    c = core.ledger.counts()
    assert (c.aborted, c.discarded_tokens) == (1, 5)
    assert core.scored("p1/0", attempt=attempt, reward=1.0) == []  # the hung call's late answer: dropped
    core.trained(iteration=1, version=2, sample_ids=["p2/0"], stats={})
    assert core.stats[1].samples == 1 and core.stats[2].samples == 0 and core.stats[1].staleness == {0: 1}


def test_a_reward_call_that_ends_without_a_result_fails_the_job_only_while_its_sample_waits_for_it():
    """A cancelled reward call: while its sample waits for that attempt's reward the job cannot go on (the reward
    pool stopped) and the core says why; once the sample was generated again (the call given up on purpose), or
    for another attempt, it is nothing."""
    now = [0.0]
    core = _one_prompt_core(now, mode="async", eta=1, iterations=4, stall=0.5)
    _finish(core, "r0", "p0/0")
    core.trained(iteration=0, version=1, sample_ids=["p0/0"], stats={})
    core.sample("r0", sample_id="p1/0", version=0, output_tokens=5, payload="p1", reward=None)
    attempt = core.awaiting_reward("p1/0")
    assert attempt is not None
    why = core.reward_lost("p1/0", attempt=attempt)
    assert why is not None and "p1/0" in why and "reward pool stopped: see the controller's log" in why
    failed = "no reward worker could load r.py:f for 61 s (7 failed starts); the last error: OSError"
    why = core.reward_lost("p1/0", attempt=attempt, why=failed)  # the pool failed: the job's failure says why
    assert why is not None and why.endswith(f"(the reward pool stopped: {failed})")
    assert core.reward_lost("p1/0", attempt=attempt + 1) is None
    now[0] = 0.6
    core.unstick()  # its reward held the trainer past the limit: generated again
    assert core.ledger.entries["p1/0"].state is State.DISPATCHED
    assert core.reward_lost("p1/0", attempt=attempt) is None


def test_a_sample_whose_reward_holds_the_trainer_is_filtered_out_and_its_group_trains_without_it():
    """Stream, one prompt of 4 samples: 3 scored, the 4th's reward hangs. Past the stall limit that sample is
    filtered out (its tokens discarded) and the group goes to the trainer at once with the 3 it keeps, saying so
    (`group_size`); the hung call's late answer is dropped; the prompt counts as trained."""
    now = [0.0]
    core = _one_prompt_core(now, mode="stream", eta=0, iterations=1, stall=0.5, group=4)
    for k in range(3):
        assert [o.kind for o in _finish(core, "r0", f"p0/{k}")] == []  # the group is not whole yet
    core.sample("r0", sample_id="p0/3", version=0, output_tokens=5, payload="p0/3", reward=None)
    attempt = core.awaiting_reward("p0/3")
    now[0] = 0.4
    assert core.unstick() == []
    now[0] = 0.6
    [out] = [o for o in core.unstick() if o.kind == "samples"]
    assert [(s["sample_id"], s["group_size"]) for s in out.header["samples"]] == [(f"p0/{k}", 3) for k in range(3)]
    assert core.ledger.entries["p0/3"].state is State.FILTERED
    assert core.aborts == [{"group": "p0", "iteration": 0, "waited_s": 0.6, "filtered": 1}]
    assert core.scored("p0/3", attempt=attempt, reward=1.0) == []
    core.trained(iteration=0, version=1, sample_ids=["p0/0", "p0/1", "p0/2"], stats={})
    c = core.ledger.counts(completed_iterations=1)
    assert (c.filtered, c.aborted, c.discarded_tokens, c.trained, c.lost, c.trained_samples) == (1, 0, 5, 1, 0, 3)
    # the trained round left the ledger (for the sample log) as it was trained; a checkpoint counts it on
    assert "p0/3" not in core.ledger.entries and core.ledger.state_histogram() == {"trained": 3, "filtered": 1}
    back = Ledger.from_json(core.ledger.to_json())
    assert back.counts(completed_iterations=1) == c and back.state_histogram() == {"trained": 3, "filtered": 1}


def test_with_no_finished_group_to_move_in_the_hung_group_is_generated_again_unless_the_job_waits():
    """Stream (η 0): nothing later can take the hung group's entry; aborted, it is generated again at once (the
    trainer waits for that instead of the reward's timeout). With `reward_stall_s: never` it waits."""
    now = [0.0]
    for stall in (0.5, None):
        core = _one_prompt_core(now, mode="stream", eta=0, iterations=2, stall=stall)
        core.sample("r0", sample_id="p0/0", version=0, output_tokens=5, payload="p0", reward=None)
        now[0] += 100.0
        outs = core.unstick()
        if stall is None:
            assert outs == [] and core.ledger.counts().aborted == 0
        else:
            assert [o.kind for o in outs] == ["generate"] and core.ledger.counts().aborted == 1
            assert core.ledger.entries["p0/0"].state is State.DISPATCHED


def test_the_trainer_moves_regrouped_samples_into_the_iteration_they_now_belong_to():
    def held(sid: str, pid: str, it: int) -> tuple[Delivered, list[int], list[float]]:
        return (Delivered(sid, pid, it, 0, 1, 0.5), [3], [-0.1])

    h = {1: deque([held("p0/0", "p0", 1)]), 2: deque([held("p2/0", "p2", 2), held("p3/0", "p3", 2)])}
    h[2].append(held("p2/1", "p2", 2))
    _regroup(h, Regroup(groups=["p2"], iteration=1))
    assert [(d.sample_id, d.iteration) for d, _, _ in h[1]] == [("p0/0", 1), ("p2/0", 1), ("p2/1", 1)]
    assert [d.sample_id for d, _, _ in h[2]] == ["p3/0"]


def test_a_group_is_aborted_once_then_its_reward_is_waited_for():
    """A reward that hangs on the same output every time: the group is generated again once; the second time its
    reward is waited for (scored at the pool's timeout), so it is trained and the job cannot be held for ever."""
    now = [0.0]
    core = _one_prompt_core(now, mode="stream", eta=0, iterations=1, stall=0.5)
    core.sample("r0", sample_id="p0/0", version=0, output_tokens=5, payload="p0", reward=None)
    now[0] += 1.0
    core.unstick()
    core.sample("r0", sample_id="p0/0", version=0, output_tokens=5, payload="p0", reward=None)
    attempt = core.awaiting_reward("p0/0")
    now[0] += 100.0
    assert core.unstick() == [] and core.ledger.counts().aborted == 1
    [out] = [o for o in core.scored("p0/0", attempt=attempt, reward=0.0) if o.kind == "samples"]
    assert out.header["samples"][0]["iteration"] == 0


def _requests(outs: list[Out]) -> dict[str, dict]:
    return {r["sample_id"]: r for o in outs if o.kind == "generate" for r in o.header["requests"]}


def test_a_lost_units_reported_output_resumes_on_the_survivor_and_is_dropped_once_finished():
    """Partial rollouts: r1 reported 5 then 3 more tokens of a sample, then was lost; the survivor gets the sample
    with those 8 tokens (log-probs, versions) as its prefix; a late report of r1 is ignored; the finished sample
    leaves the store."""
    core = _core(min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    sid = gen["r1"][0][0]
    assert core.partial("r1", sample_id=sid, start=0, tokens=[4, 5, 6, 7, 8], logprobs=[-0.5] * 5, versions=[0] * 5)
    assert core.partial("r1", sample_id=sid, start=5, tokens=[9, 9, 9], logprobs=[-0.25] * 3, versions=[0] * 3)
    assert not core.partial("r0", sample_id=sid, start=8, tokens=[1], logprobs=[0.0], versions=[0])  # not r0's
    assert not core.partial("r1", sample_id=sid, start=12, tokens=[1], logprobs=[0.0], versions=[0])  # a gap
    req = _requests(core.lost("r1"))[sid]
    assert req["prefix_tokens"] == [4, 5, 6, 7, 8, 9, 9, 9]
    assert req["prefix_logprobs"] == [-0.5] * 5 + [-0.25] * 3 and req["prefix_versions"] == [0] * 8
    assert (core.ledger.partials.resumed, core.ledger.partials.resumed_tokens) == (1, 8)
    assert not core.partial("r1", sample_id=sid, start=8, tokens=[3], logprobs=[0.0], versions=[0])  # r1 is gone
    assert core.partial("r0", sample_id=sid, start=8, tokens=[3], logprobs=[-1.0], versions=[0])  # r0's now
    _finish(core, "r0", sid)
    assert core.ledger.partials.parts == {} and core.ledger.partials.nbytes == 0


def test_a_resumed_output_answers_for_its_oldest_token_and_is_dropped_when_too_old_for_any_buffer():
    """η = 1: a sample whose kept output was sampled with v0 reserves its group as of v0 when it resumes on a unit
    at v1; once the trainer is past v0 + η, the output is dropped (its tokens discarded) and it starts over."""
    core = _core(mode="async", eta=1, prompts=1, iterations=4, min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    sid = next(s for s, _ in gen.get("r1", []) if s.startswith("p1-"))  # iteration 1, on v0
    core.partial("r1", sample_id=sid, start=0, tokens=[7, 7], logprobs=[-0.1, -0.2], versions=[0, 0])
    for s, _ in gen.get("r0", []):
        _finish(core, "r0", s)
    core.trained(iteration=0, version=1, sample_ids=["p0-0/0"], stats={})
    core.weights_applied("r0", 1)
    req = _requests(core.lost("r1"))[sid]
    assert req["prefix_versions"] == [0, 0] and core.buffers.deadline["p1-0"] == 1  # v0 + η, not v1 + η

    # the same sample, after a unit at v1 filled buffer 1 (the last its v0 tokens may be trained in)
    core.ledger.requeue_agent("r0")  # nothing in flight any more: no reservation
    for group in list(core.buffers.deadline):
        core.buffers.release(group)
    core.buffers.occupy("p2-x", 1)
    e = core.ledger.entries[sid]
    assert core._reservable(e, 1) == 1  # starts over at v1: due by buffer 2
    assert core.ledger.partials.parts == {} and core.ledger.discarded_tokens == 2


def test_partial_outputs_survive_a_checkpoint_unless_newer_than_it():
    from rlctl.agents.ledger import Ledger

    core = _core(min_units=1, group=2)
    core.join("trainer-0", role="trainer", version=0)
    gen = _generate(core.join("r0", role="rollout", version=0))["r0"]
    (a, _), (b, _) = gen[:2]
    core.partial("r0", sample_id=a, start=0, tokens=[1, 2], logprobs=[-0.5, -0.5], versions=[0, 0])
    core.partial("r0", sample_id=b, start=0, tokens=[3], logprobs=[-0.5], versions=[2])
    back = Ledger.from_json(__import__("json").loads(__import__("json").dumps(core.ledger.to_json())))
    assert back.partials.prefix(a).tokens == [1, 2] and back.partials.nbytes == 3 * 12
    again = _core(min_units=1, group=2)
    again.restore(version=1, ledger=back)
    assert set(again.ledger.partials.parts) == {a}  # b's token came from v2, past the checkpoint's v1


def _lost_after_two_reports(
    *,
    store_bytes: int = 256 << 20,
    heard_late: bool = False,
    report_steps: int = 0,
    closed: bool = False,
    lost_at: float = 2.5,
) -> ControllerCore:
    """r0 reports 10 tokens of each of its 2 samples a second (one report each at t 1, 2) and is lost at t 2.5
    (`heard_late`: each report is handled 0.4 s after it arrived, the loss as it arrives; `closed`: its connection
    ended in order; `lost_at`: another time)."""
    from dataclasses import replace

    now = [0.0]
    core = _core(min_units=1, prompts=2)
    core.cfg = replace(core.cfg, partial_store_bytes=store_bytes, report_steps=report_steps)
    core.ledger.partials.budget_bytes = store_bytes
    core.clock = lambda: now[0]
    core.join("trainer-0", role="trainer", version=0)
    held = [s for s, _ in _generate(core.join("r0", role="rollout", version=0))["r0"]]
    for t in (1.0, 2.0):
        now[0] = t + (0.4 if heard_late else 0.0)
        for sid in held:
            start = len(core.ledger.partials.parts.get(sid, ()))
            start = 10 if t == 2.0 else start  # what the unit sent, whatever the store kept
            core.partial(
                "r0",
                sample_id=sid,
                start=start,
                tokens=[7] * 10,
                logprobs=[-0.1] * 10,
                versions=[0] * 10,
                made_s=100 + t,
                heard_s=t,
            )
    now[0] = lost_at + 0.4 if heard_late else lost_at
    core.lost("r0", at=lost_at, closed=closed)
    return core


def test_a_lost_unit_s_generations_count_what_was_kept_and_at_most_what_was_lost():
    """Lost at t 2.5, r0 generated at most 10 × 0.5 = 5 more of each sample that nobody saw: kept 20, lost ≤ 5,
    a restart would have regenerated 25."""
    from rlctl.agents.views import partials_view

    core = _lost_after_two_reports()
    v = partials_view(core)
    assert (v["interrupted"], v["interrupted_kept_tokens"], v["interrupted_lost_tokens_max"]) == (2, 40, 10)
    assert v["regenerated_fraction_max"] == 0.2
    back = Ledger.from_json(__import__("json").loads(__import__("json").dumps(core.ledger.to_json())))
    assert back.partials.interrupted_lost_tokens_max == 10  # kept across a checkpoint


def test_the_bound_by_time_counts_a_started_token_whole():
    """Lost 0.24 s after its last report at 10 tokens a second, a sample may have made 2.4 tokens: 3 count."""
    from rlctl.agents.views import partials_view

    assert partials_view(_lost_after_two_reports(lost_at=2.24))["interrupted_lost_tokens_max"] == 2 * 3


def test_a_lost_unit_s_flight_record_counts_what_its_generations_really_lost():
    """The controller read r0's flight record (3 tokens generated and not sent): the view has the measured loss
    beside the bound, kept across a checkpoint; a unit lost twice counts once."""
    import json

    from rlctl.agents.views import partials_view

    v = partials_view(_lost_after_two_reports())  # no record read
    assert (v["lost_units_measured"], v["interrupted_lost_tokens_measured"]) == (0, 0)
    core = _core(min_units=1, prompts=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    core.lost("r0", closed=True, unsent=3)
    core.lost("r0", closed=True, unsent=3)
    v = partials_view(core)
    assert (v["lost_units_measured"], v["interrupted_lost_tokens_measured"]) == (1, 3)
    back = Ledger.from_json(json.loads(json.dumps(core.ledger.to_json())))
    assert back.partials.interrupted_lost_tokens_measured == 3


def test_a_lost_unit_s_bound_counts_from_arrivals_and_from_a_sample_s_own_last_kept_report():
    """The bound is timed by when reports and the loss arrived, not by when the controller got to them (0.4 s later
    here: the same 10); a sample whose second report the store refused (full) lost at most what it made since its
    first (10 × 1.5 = 15 each, 20 kept in all), though later reports of its unit came in; a unit lost before any
    rate was known lost at most all its generations had left (64 - kept), not 0."""
    from rlctl.agents.trajectories import TOKEN_BYTES
    from rlctl.agents.views import partials_view

    assert partials_view(_lost_after_two_reports(heard_late=True))["interrupted_lost_tokens_max"] == 10
    v = partials_view(_lost_after_two_reports(store_bytes=25 * TOKEN_BYTES))
    assert (v["interrupted_kept_tokens"], v["interrupted_lost_tokens_max"]) == (20, 30)


def test_units_reporting_every_few_steps_lost_at_most_that_many_tokens_when_their_connection_ended_in_order():
    """Reports after every 3 decode steps (`rollout.partial_report_steps`) and a connection that ended in order
    (every report written arrived): at most 3 tokens of each generation, not 10 × 0.5. Not when the end was a
    reset or silence (reports may be missing: the time bound), nor for a sample the store refused a report of."""
    from rlctl.agents.trajectories import TOKEN_BYTES
    from rlctl.agents.views import partials_view

    def lost(**kw: Any) -> int:
        return int(partials_view(_lost_after_two_reports(report_steps=3, **kw))["interrupted_lost_tokens_max"])

    assert (lost(closed=True), lost(closed=False)) == (6, 10)
    assert lost(closed=True, store_bytes=25 * TOKEN_BYTES) == 30
    core = _core(min_units=1, prompts=2)
    core.join("trainer-0", role="trainer", version=0)
    held = [s for s, _ in _generate(core.join("r0", role="rollout", version=0))["r0"]]
    core.partial("r0", sample_id=held[0], start=0, tokens=[7] * 4, logprobs=[-0.1] * 4, versions=[0] * 4)
    core.lost("r0")  # one report: no rate yet
    v = partials_view(core)
    assert (v["interrupted_kept_tokens"], v["interrupted_lost_tokens_max"]) == (4, (64 - 4) + 64)


def test_generations_no_report_showed_count_only_up_to_the_rows_the_unit_had_free():
    """r0 holds 6 generations, reports after every step, and ended in order. Its last report showed 2 of them and
    1 free row: of the 4 it never reported, at most 1 started after that report (1 token), the other 3 waited in
    its queue (0). A sample it finished after the report freed a row: 2 may have started. Without the engine's
    free rows (vLLM may preempt), or before any report, each generation counts its step."""
    from dataclasses import replace

    from rlctl.agents.views import partials_view

    def lost(*, free_rows: int | None = 1, finished: bool = False, reports: bool = True) -> int:
        core = _core(min_units=1, prompts=6)
        core.cfg = replace(core.cfg, report_steps=1)
        core.join("trainer-0", role="trainer", version=0)
        held = [s for s, _ in _generate(core.join("r0", role="rollout", version=0))["r0"]]
        assert len(held) == 6
        if reports:
            for sid in held[: 3 if finished else 2]:
                core.partial("r0", sample_id=sid, start=0, tokens=[7] * 4, logprobs=[-0.1] * 4, versions=[0] * 4)
            core.reported("r0", free_rows=free_rows)
        if finished:
            core.sample("r0", sample_id=held[2], version=0, output_tokens=5, payload=None, reward=None)
        core.lost("r0", closed=True)
        return int(partials_view(core)["interrupted_lost_tokens_max"])

    assert lost() == 2 * 1 + 1
    assert lost(finished=True) == 2 * 1 + 2
    assert lost(free_rows=0) == 2
    assert lost(free_rows=None) == 6
    assert lost(reports=False) == 6


def test_a_unit_back_on_a_new_connection_counts_its_requeued_generations_as_interrupted():
    from rlctl.agents.views import partials_view

    core = _core(min_units=1, prompts=2)
    core.join("trainer-0", role="trainer", version=0)
    held = [s for s, _ in _generate(core.join("r0", role="rollout", version=0))["r0"]]
    core.partial("r0", sample_id=held[0], start=0, tokens=[7] * 4, logprobs=[-0.1] * 4, versions=[0] * 4)
    core.rejoin("r0", version=0, requeue=True)  # what it held went out again: its unreported output is lost
    v = partials_view(core)
    assert (v["interrupted"], v["interrupted_kept_tokens"]) == (2, 4)


def test_the_store_keeps_nothing_past_its_bound():
    from rlctl.agents.trajectories import TOKEN_BYTES, TrajectoryStore

    store = TrajectoryStore(budget_bytes=10 * TOKEN_BYTES)
    assert store.extend("a", 0, [1] * 6, [0.0] * 6, [0] * 6)
    assert not store.extend("b", 0, [1] * 5, [0.0] * 5, [0] * 5) and store.over_budget == 1
    assert store.extend("a", 6, [2] * 4, [0.0] * 4, [0] * 4) and store.nbytes == 10 * TOKEN_BYTES
    assert store.extend("a", 3, [5], [0.0], [1]) and len(store.parts["a"]) == 4  # a resumed attempt rewrites
    assert store.drop("a") == 4 and store.nbytes == 0


def _withdraws(outs: list[Out]) -> dict[str, int]:
    return {o.to: o.header["count"] for o in outs if o.kind == "withdraw"}


def _batch_core(batch: int, **kw) -> ControllerCore:
    core = _core(**kw)
    core.cfg.unit_batch = batch
    return core


def test_a_unit_that_joins_takes_the_waiting_work_of_a_unit_holding_more_than_its_batch():
    """Migration: r0 holds 8 samples with rows for 3 (5 wait in its engine); r1 joins: r0 is asked for 3 (r1's free
    rows); what r0 gives back (2 waiting, 1 running with 4 tokens) goes to r1 at once, the running one with its
    output as the prefix; r0 is not asked again while its answer is pending."""
    core = _batch_core(3, group=2, prompts=4, min_units=1)
    core.join("trainer-0", role="trainer", version=0)
    gen = _generate(core.join("r0", role="rollout", version=0))
    held = [s for s, _ in gen["r0"]]
    assert len(held) == 8
    outs = core.join("r1", role="rollout", version=0)
    assert _withdraws(outs) == {"r0": 3}
    assert _withdraws(core.migrate(now=True)) == {}  # pending: not asked twice
    back = [(held[-1], [], [], []), (held[-2], [], [], []), (held[0], [5, 6, 7, 8], [-0.5] * 4, [0] * 4)]
    reqs = _requests(core.withdrawn("r0", back))
    assert sorted(reqs) == sorted([held[-1], held[-2], held[0]])
    assert reqs[held[0]]["prefix_tokens"] == [5, 6, 7, 8] and "prefix_tokens" not in reqs[held[-1]]
    assert {core.ledger.entries[s].agent for s in reqs} == {"r1"}
    assert core.ledger.migrated == 3 and core.ledger.requeued == 0
    assert core.migrations == [{"from": "r0", "to": "r1", "samples": 3, "tokens": 4, "sent": 3}]
    assert _withdraws(core.migrate(now=True)) == {}  # r0 holds 5 (3 rows + 2 waiting), r1 3 of 3: no room left


def test_an_idle_unit_takes_half_of_a_busy_units_work_and_a_late_answer_is_ignored():
    core = _batch_core(8, group=2, prompts=2, min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    for sid, _ in gen["r1"]:  # r1 is done with its share; r0 still runs 2 (the long tail)
        _finish(core, "r1", sid)
    outs = core.migrate(now=True)
    r0 = [s for s, _ in gen["r0"]]
    assert len(r0) == 2 and _withdraws(outs) == {"r0": 1}
    reqs = _requests(core.withdrawn("r0", [(r0[1], [9] * 3, [-1.0] * 3, [0] * 3)]))
    assert list(reqs) == [r0[1]] and core.ledger.entries[r0[1]].agent == "r1"
    assert core.withdrawn("r0", [(r0[1], [9], [-1.0], [0])]) == [] and core.ledger.migrated == 1  # r1's now
    assert _withdraws(core.migrate(now=True)) == {}  # one each: nothing to move


def test_a_gone_donor_s_late_withdrawn_answer_records_no_migration():
    """r0 was asked to give r1 one of its two samples, then lost: its samples went back to the queue. Its answer, come
    in late, moved nothing: it recorded a migration of 0 samples to "" (a `migrated` event of nothing)."""
    core = _batch_core(8, group=2, prompts=2, min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    for sid, _ in gen["r1"]:
        _finish(core, "r1", sid)
    assert _withdraws(core.migrate(now=True)) == {"r0": 1}
    core.lost("r0")
    r0 = [s for s, _ in gen["r0"]]
    core.withdrawn("r0", [(r0[1], [9] * 3, [-1.0] * 3, [0] * 3)])
    assert core.migrations == [] and core.ledger.migrated == 0  # was: [{"from": "r0", "to": "", "samples": 0, ...}]


def test_the_tail_stays_where_the_planners_cost_model_says_splitting_does_not_pay():
    """As above, with each unit priced by its site's decode cost: a flat PTL (a memory-bound step) keeps r0's two
    running samples where they are; a steep one (each row adds a step's worth) splits them. The steps left come
    from the finished samples' lengths: r1's finished at 40 tokens, r0's have 3 each so far."""
    from rlctl.agents.migration import Cost

    for per_row, asked in ((1e-7, {}), (0.01, {"r0": 1})):
        core = _batch_core(8, group=2, prompts=2, min_units=2)
        core.join("trainer-0", role="trainer", version=0)
        ptl = Cost(tuple(0.01 + per_row * (b - 1) for b in range(1, 9)), prefill_s_per_token=1e-4)
        core.unit_costs = {"r0": ptl, "r1": ptl}
        core.join("r0", role="rollout", version=0)
        gen = _generate(core.join("r1", role="rollout", version=0))
        for sid, _ in gen["r0"]:
            core.partial("r0", sample_id=sid, start=0, tokens=[1, 2, 3], logprobs=[-0.1] * 3, versions=[0] * 3)
        for sid, _ in gen["r1"]:
            _finish(core, "r1", sid, tokens=40)
        assert list(core.finished_lengths) == [40, 40]
        assert _withdraws(core.migrate(now=True)) == asked, per_row


class _CountedReads(dict[str, Any]):
    """The trajectory store's outputs so far, counting the reads of them."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.reads += 1
        return super().get(key, default)


def test_a_migration_look_reads_the_running_samples_only_when_a_unit_is_idle():
    """What the running samples hold (their steps left, their prefill) decides only whether a busy unit's work is split
    with an idle one: with every unit busy a look read every sample in flight all the same, at each `weights_applied`
    (64 looks a version at 64 units)."""
    core = _batch_core(8, group=2, prompts=2, min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    parts = core.ledger.partials.parts = _CountedReads(core.ledger.partials.parts)
    assert _withdraws(core.migrate(now=True)) == {} and parts.reads == 0  # two samples on each unit
    for sid, _ in gen["r1"]:
        _finish(core, "r1", sid)
    parts.reads = 0
    assert _withdraws(core.migrate(now=True)) == {"r0": 1} and parts.reads == 2  # r1 idle: r0's two samples read


def test_no_work_moves_to_a_unit_on_older_weights_or_when_migration_is_off():
    core = _batch_core(8, group=2, prompts=2, min_units=2)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=1)
    gen = _generate(core.join("r1", role="rollout", version=0))
    for sid, _ in gen.get("r1", []):
        _finish(core, "r1", sid)
    assert _withdraws(core.migrate(now=True)) == {}  # r1 (v0) may not take r0's (v1) work
    off = _batch_core(1, group=4, prompts=2, min_units=1)
    off.cfg.migrate = False
    off.join("trainer-0", role="trainer", version=0)
    off.join("r0", role="rollout", version=0)
    assert _withdraws(off.join("r1", role="rollout", version=0)) == {}


def _resumed(core: ControllerCore, version: int, **kw: Any) -> tuple[ControllerCore, list[str]]:
    """`core`'s ledger restored at `version` into a fresh core (`kw`: `_core`'s); what a unit at `version` is sent."""
    again = _core(**kw)
    again.restore(version=version, ledger=Ledger.from_json(core.ledger.to_json()))
    again.join("trainer-0", role="trainer", version=version)
    return again, sorted(s for s, _ in _generate(again.join("r0", role="rollout", version=version)).get("r0", []))


def test_a_resume_generates_again_the_groups_of_earlier_rounds_that_had_filled_later_buffers() -> None:
    """η 1: round 1's groups finish first and fill iteration 0; round 0's are still out when v1 is checkpointed.
    Resumed, they are generated again (their prompts known: a group keeps its round), then round 2's."""
    kw: dict[str, Any] = {"mode": "async", "eta": 1, "prompts": 2, "iterations": 3}
    core = _core(**kw)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    for sid in ("p1-0/0", "p1-1/0"):
        _finish(core, "r0", sid)
    core.trained(iteration=0, version=1, sample_ids=["p1-0/0", "p1-1/0"], stats={})
    again, sent = _resumed(core, 1, **kw)
    assert sent == ["p0-0/0", "p0-1/0", "p2-0/0", "p2-1/0"]
    assert again.created == 3 and again.ledger.entries["p0-0/0"].round == 0


def test_a_resume_does_not_create_again_a_round_whose_group_trained_in_an_earlier_iteration() -> None:
    """η 2, one prompt a round: round 2's group fills iteration 0, round 0's iteration 1; at the checkpoint of v1,
    rounds 0–2 exist (round 1's group still out) though no group sits in iteration 2: the resumed core creates
    round 3 next, not round 2 again."""
    kw: dict[str, Any] = {"mode": "async", "eta": 2, "prompts": 1, "iterations": 4}
    core = _core(**kw)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    _finish(core, "r0", "p2-0/0")
    core.trained(iteration=0, version=1, sample_ids=["p2-0/0"], stats={})
    again, sent = _resumed(core, 1, **kw)
    assert again.created == 4 and sent == ["p0-0/0", "p1-0/0", "p3-0/0"]


def test_the_automatic_stall_limit_is_above_a_reward_that_is_slower_on_some_outputs_as_a_rule():
    """A verifier slower on long answers (80 ms on 30 % of them, 2 ms on the rest): the limit was 10 × the median at
    least 0.05 s, so every long answer whose reward held the trainer was filtered out (the right ones: a biased batch
    and reward curve). The p90 term puts the limit past them: max(0.05, 10 × 0.002, 2 × 0.08) = 0.16 s."""
    core = _one_prompt_core([0.0], mode="async", eta=1, iterations=4, stall=None)
    core.cfg.abort_stalled = True
    core.reward_latency.extend([0.002] * 70 + [0.08] * 30)
    assert core.stall_s() == pytest.approx(0.16)
    core.reward_latency.clear()
    core.reward_latency.extend([0.016] * 98 + [2.0] * 2)  # `bench reward`: hung calls, 2 %, cut at the timeout
    assert core.stall_s() == pytest.approx(0.16)  # 10 × the median, as before: the hung calls do not raise it


def test_a_reward_holds_the_trainer_only_from_when_the_trainer_waits_for_it():
    """A reward computing while the trainer still trained the iteration before costs nothing: its hold is counted
    from the trainer's last step, not from when the call began (it was filtered as soon as the step ended)."""
    now = [0.0]
    core = _one_prompt_core(now, mode="async", eta=1, iterations=4, stall=0.5)
    _finish(core, "r0", "p0/0")
    core.sample("r0", sample_id="p1/0", version=0, output_tokens=5, payload="p1", reward=None)  # scoring from 0.0
    now[0] = 2.0
    core.trained(iteration=0, version=1, sample_ids=["p0/0"], stats={})  # the trainer waits for iteration 1 from now
    now[0] = 2.3
    assert core.unstick() == [] and core.ledger.entries["p1/0"].state is State.FINISHED  # held 0.3 s of 0.5
    now[0] = 2.6
    core.unstick()
    assert core.ledger.entries["p1/0"].state is State.DISPATCHED  # held 0.6 s: generated again


def test_a_core_restored_with_fewer_iterations_leaves_the_rounds_past_them_out_of_its_ledger():
    """`launch --resume JOB --iterations N` below the job's count: the checkpoint's ledger holds rounds up to η past
    its version, some of them past N. They stayed in the ledger, queued and never generated: the summary of a done
    2-iteration job said `prompts 6 trained 4` (η 1; `prompts 8` at η 2), with none lost."""
    for eta in (1, 2):
        core = _core(mode="async", eta=eta, prompts=2, iterations=6)
        core.join("trainer-0", role="trainer", version=0)
        for sid, _ in _generate(core.join("r0", role="rollout", version=0))["r0"]:
            _finish(core, "r0", sid)
        core.trained(iteration=0, version=1, sample_ids=["p0-0/0", "p0-1/0"], stats={})
        assert core.created == 2 + eta  # the checkpoint of v1 holds rounds 0 … 1 + η

        again = _core(mode="async", eta=eta, prompts=2, iterations=2)
        again.restore(version=1, ledger=Ledger.from_json(core.ledger.to_json()))
        again.join("trainer-0", role="trainer", version=1)
        outs = []
        for sid, _ in _generate(again.join("r0", role="rollout", version=1))["r0"]:
            outs += _finish(again, "r0", sid, version=1)
        delivered = sorted(s["sample_id"] for o in outs if o.kind == "samples" for s in o.header["samples"])
        again.trained(iteration=1, version=2, sample_ids=delivered, stats={})
        counts = again.ledger.counts(completed_iterations=2)
        assert again.done and (counts.prompts, counts.trained, counts.lost) == (4, 4, 0), (eta, counts)
        assert again.created == 2 and not again.ledger.entries


def test_a_huge_staleness_bound_creates_rounds_only_so_many_samples_ahead():
    """η 50 (of 100 iterations) created 51 rounds at once, each sample a ledger entry of the controller and a request
    queued in a unit: rounds are created up to `max_samples_ahead` samples past the trainer (at least one round)."""
    core = _core(mode="async", eta=50, prompts=2, group=2, iterations=100, max_samples_ahead=16)
    assert core.cfg.rounds_ahead == 4  # 16 samples at 4 a round
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    assert core.created == 5  # rounds 0 … 4: the trainer's next one and 4 ahead
    wide = _core(mode="async", eta=3, prompts=2, group=2, iterations=100, max_samples_ahead=16)
    assert wide.cfg.rounds_ahead == 3  # η below the cap: η
    huge = _core(mode="async", eta=50, prompts=64, group=16, iterations=100, max_samples_ahead=16)
    assert huge.cfg.rounds_ahead == 1  # a round larger than the cap: the next one still comes


def test_a_restore_whose_prompts_the_job_no_longer_draws_is_refused_in_one_line() -> None:
    """job.json edited before a resume so that a round draws other prompts (a dataset job's prompts_per_iteration:
    its positions move): the checkpoint's queued prompts have no spec. The restore says so, naming them, versus a
    run that started and failed at their first dispatch (`controller error: KeyError`)."""
    from rlctl.agents.ledger import Ledger
    from rlctl.errors import RlctlError

    core = _core(mode="async", eta=1, prompts=2, iterations=4)
    core.join("trainer-0", role="trainer", version=0)
    for sid, _ in _generate(core.join("r0", role="rollout", version=0))["r0"]:
        _finish(core, "r0", sid)
    core.trained(iteration=0, version=1, sample_ids=["p0-0/0", "p0-1/0"], stats={})
    saved = core.ledger.to_json()  # iteration 1 generated, not trained: queued again on resume

    def moved(it: int) -> list[PromptSpec]:  # the data stream's positions as the edited job draws them
        return [PromptSpec(f"p{it}-{j + 2}", [1, 2], true_len=10) for j in range(2)]

    cfg = _core(mode="async", eta=1, prompts=2, iterations=4).cfg
    again = ControllerCore(cfg, prompts=moved, predict=lambda specs: [10.0] * len(specs))
    with pytest.raises(RlctlError, match=r"checkpoint v1 holds prompts .* \(p1-0, p1-1, p2-0 and 1 more\): its batch"):
        again.restore(version=1, ledger=Ledger.from_json(saved))


def test_a_filtered_group_with_no_buffer_left_is_generated_again_whole_as_an_aborted_one_is():
    """A group of 4 whose 4th sample was filtered out (its reward held the trainer) finds no buffer within its bound
    once its last reward comes: all 4 are generated again (the filtered one's tokens counted once, when it was
    filtered), as `abort_group` does, versus the 3 kept ones only, the filtered one left out for good (the group
    later trained as a group of 3 though nothing of it was filtered any more)."""
    now = [0.0]
    core = _one_prompt_core(now, mode="stream", eta=0, iterations=2, stall=0.5, group=4)
    for k in range(2):
        _finish(core, "r0", f"p0/{k}")
    core.sample("r0", sample_id="p0/3", version=0, output_tokens=5, payload="p0/3", reward=None)  # hangs
    now[0] = 0.5
    core.sample("r0", sample_id="p0/2", version=0, output_tokens=3, payload="p0/2", reward=None)  # scoring
    attempt = core.awaiting_reward("p0/2")
    now[0] = 0.6
    core.unstick()
    assert core.ledger.entries["p0/3"].state is State.FILTERED
    # buffer 0 (the last p0's v0 samples may train in) is taken before p0's last reward comes
    core.buffers.release("p0")
    assert core.buffers.occupy("x", 0) == 0
    core.scored("p0/2", attempt=attempt, reward=1.0)
    states = {e.sample_id: e.state for e in core.ledger.group("p0")}
    assert State.FILTERED not in states.values() and State.FINISHED not in states.values(), states
    c = core.ledger.counts()
    assert c.discarded_tokens == 5 + 3 * 3  # the filtered one's once, the three kept ones'


def _r1_idle_beside_r0_with_room_for_2_tokens() -> tuple[ControllerCore, list[str]]:
    """Two prompts of two; r0 runs two samples (their ids returned) and r1 finished its two, with room in the partial
    store for 2 tokens."""
    from rlctl.agents.trajectories import TOKEN_BYTES

    core = _batch_core(8, group=2, prompts=2, min_units=2)
    core.ledger.partials.budget_bytes = 2 * TOKEN_BYTES
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    for sid, _ in gen["r1"]:
        _finish(core, "r1", sid)
    return core, [s for s, _ in gen["r0"]]


def test_a_migrations_event_counts_only_the_output_it_carried_not_the_output_thrown_away_past_the_bound():
    """r0 gives back two running samples, 1 and 4 tokens, with room in the store for 2: the first goes to r1 with
    its token, the second starts over (its 4 in `discarded_tokens`); the `migrated` event says 1 token moved,
    versus 5 (those thrown away counted as moved too, and twice over with `discarded_tokens`)."""
    core, r0 = _r1_idle_beside_r0_with_room_for_2_tokens()
    core.migrate(now=True)
    reqs = _requests(core.withdrawn("r0", [(r0[0], [8], [-1.0], [0]), (r0[1], [9] * 4, [-1.0] * 4, [0] * 4)]))
    assert reqs[r0[0]]["prefix_tokens"] == [8] and "prefix_tokens" not in reqs[r0[1]]
    assert core.ledger.counts().discarded_tokens == 4
    assert [(m["samples"], m["tokens"]) for m in core.migrations] == [(2, 1)]


def test_the_output_a_migration_gives_back_past_the_store_s_bound_counts_as_discarded_tokens():
    """r0 gives back a running sample with 4 tokens, but the partial store has room for 2: the output is not kept
    (the sample starts over on r1, `over_budget`), and its 4 tokens, generated and thrown away, count in the ledger's
    `discarded_tokens`, versus not at all (a migration past the store's bound threw work away unsaid)."""
    core, r0 = _r1_idle_beside_r0_with_room_for_2_tokens()
    assert _withdraws(core.migrate(now=True)) == {"r0": 1}
    reqs = _requests(core.withdrawn("r0", [(r0[1], [9] * 4, [-1.0] * 4, [0] * 4)]))
    assert list(reqs) == [r0[1]] and "prefix_tokens" not in reqs[r0[1]]  # starts over
    assert core.ledger.partials.over_budget == 1
    assert core.ledger.counts().discarded_tokens == 4


def test_a_late_report_of_a_unit_gone_for_good_keeps_nothing_of_it():
    """A unit lost (silent, its connection still up) whose reports were still in the controller's inbox: their free
    rows were kept for the rest of the run, in the per-unit state `_forget_unit` had cleared (`core.units` holds the
    live units only, and what is kept per unit is theirs)."""
    core = _core(min_units=1, prompts=2)
    core.join("trainer-0", role="trainer", version=0)
    held = [s for s, _ in _generate(core.join("r0", role="rollout", version=0))["r0"]]
    core.reported("r0", free_rows=3)
    core.lost("r0")
    assert "r0" in core.left and "r0" not in core._admit_cap
    core.partial("r0", sample_id=held[0], start=0, tokens=[7] * 4, logprobs=[-0.1] * 4, versions=[0] * 4)
    core.reported("r0", free_rows=2)  # (its late report: the controller books each)
    assert "r0" not in core._admit_cap  # was: {"r0": 2}, for good


def test_a_drained_unit_retired_before_its_withdraw_answer_leaves_its_receiver_free_to_migrate():
    """r0 was asked to give r1 one of its two samples, then drained; both finished there, so it retired, and its
    answer never came (the link dropped it as it stopped). The move pending for it held r1 busy for good
    (`migration.plan`: a move each way at a time): r1 holding two beside an idle r2 was never asked to give one."""
    core = _batch_core(8, group=2, prompts=2, min_units=2, iterations=4)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    gen = _generate(core.join("r1", role="rollout", version=0))
    delivered: list[str] = []

    def finish(unit: str, sid: str, version: int = 0) -> None:
        outs = _finish(core, unit, sid, version=version)
        delivered.extend(s["sample_id"] for o in outs if o.kind == "samples" for s in o.header["samples"])

    for sid, _ in gen["r1"]:
        finish("r1", sid)
    assert _withdraws(core.migrate(now=True)) == {"r0": 1}  # r1 idle beside r0's two
    core.drain("r0")
    for sid, _ in gen["r0"]:  # (before it took the `withdraw` in): retired, told to stop
        finish("r0", sid)
    assert "r0" in core.left and "r0" not in core.withdrawing  # was: {"r0": ("r1", 1)} for good
    core.join("r2", role="rollout", version=0)
    core.trained(iteration=0, version=1, sample_ids=delivered, stats={})
    gen = _generate(core.weights_applied("r1", 1) + core.weights_applied("r2", 1))
    for sid, _ in gen["r2"]:
        finish("r2", sid, version=1)
    assert len(gen["r1"]) == 2 and _withdraws(core.migrate(now=True)) == {"r1": 1}  # was: {} (r1 busy)
