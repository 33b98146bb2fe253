"""The sample ledger's state machine: legal moves, refusals, requeues, duplicates, checkpoints."""

from __future__ import annotations

import pytest

from rlctl.agents.ledger import Ledger, LedgerError, State


def _ledger() -> Ledger:
    led = Ledger()
    led.add_prompt(iteration=0, prompt_id="p0", num_samples=2)
    led.add_prompt(iteration=1, prompt_id="p1", num_samples=2)
    return led


def _finished(led: Ledger, sid: str, *, tokens: int = 5) -> None:
    led.dispatch(sid, agent="r0", version=0)
    assert led.finish(sid, agent="r0", version=0, output_tokens=tokens)


def _trained(led: Ledger, sid: str, *, tokens: int = 5) -> None:
    _finished(led, sid, tokens=tokens)
    led.deliver(sid)
    led.mark_trained(sid)


def test_happy_path_walks_every_state_in_order():
    led = _ledger()
    led.clock = iter([1.0, 2.0, 3.0, 4.0, 5.0]).__next__  # the controller's wall clock, one reading per move
    seen = [led.entries["p0/0"].state]
    led.dispatch("p0/0", agent="r0", version=0)
    seen.append(led.entries["p0/0"].state)
    assert led.finish("p0/0", agent="r0", version=0, output_tokens=7)
    seen.append(led.entries["p0/0"].state)
    led.deliver("p0/0")
    seen.append(led.entries["p0/0"].state)
    led.mark_trained("p0/0")
    seen.append(led.entries["p0/0"].state)
    assert seen == [State.QUEUED, State.DISPATCHED, State.FINISHED, State.DELIVERED, State.TRAINED]
    e = led.entries["p0/0"]
    assert e.output_tokens == 7
    # each move's time, in order; a requeue forgets them (the sample starts over)
    assert (e.dispatched_at, e.finished_at, e.delivered_at, e.trained_at) == (1.0, 2.0, 3.0, 4.0)
    led.dispatch("p1/0", agent="r0", version=0)
    led.requeue_agent("r0")
    assert led.entries["p1/0"].dispatched_at is None


def test_illegal_moves_raise():
    led = _ledger()
    with pytest.raises(LedgerError):
        led.deliver("p0/0")  # queued, not finished
    led.dispatch("p0/0", agent="r0", version=0)
    with pytest.raises(LedgerError):
        led.dispatch("p0/0", agent="r1", version=0)  # already dispatched
    with pytest.raises(LedgerError):
        led.add_prompt(iteration=2, prompt_id="p0", num_samples=1)


def test_finish_from_another_agent_or_twice_is_refused_not_delivered():
    led = _ledger()
    led.dispatch("p0/0", agent="r0", version=0)
    assert not led.finish("p0/0", agent="r1", version=0, output_tokens=1)
    assert led.finish("p0/0", agent="r0", version=0, output_tokens=1)
    assert not led.finish("p0/0", agent="r0", version=0, output_tokens=1)
    assert not led.finish("nope/0", agent="r0", version=0, output_tokens=1)
    assert led.refused == 3
    assert led.entries["p0/0"].state is State.FINISHED


def test_a_second_copy_of_a_result_is_refused_after_the_sample_went_back_to_the_same_unit():
    """p0/0's result (attempt 1) was taken; its group was generated again and the sample went back to r0
    (attempt 2): a copy of the first result is refused, the new one counts. A unit handed back a sample it still
    held answers with its own, earlier attempt: that first result counts."""
    led = _ledger()
    led.dispatch("p0/0", agent="r0", version=0)
    assert led.finish("p0/0", agent="r0", version=0, output_tokens=1, attempt=1)
    led.abort_group("p0")
    led.dispatch("p0/0", agent="r0", version=1)
    assert not led.finish("p0/0", agent="r0", version=0, output_tokens=1, attempt=1)
    assert led.refused == 1
    assert led.finish("p0/0", agent="r0", version=1, output_tokens=1, attempt=2)
    led.dispatch("p1/0", agent="r0", version=1)
    assert led.requeue_agent("r0") == ["p1/0"]  # it went silent; back, it gets the same sample again
    led.dispatch("p1/0", agent="r0", version=1)
    assert led.finish("p1/0", agent="r0", version=1, output_tokens=1, attempt=1)
    assert led.entries["p1/0"].state is State.FINISHED


def test_sample_version_is_the_oldest_of_dispatch_and_reported():
    led = _ledger()
    led.dispatch("p0/0", agent="r0", version=3)
    led.finish("p0/0", agent="r0", version=5, output_tokens=1)  # a weight swap mid-generation
    assert led.entries["p0/0"].sample_version == 3


def test_lost_agent_requeues_only_its_unfinished_samples():
    led = _ledger()
    led.dispatch("p0/0", agent="r0", version=0)
    led.dispatch("p0/1", agent="r0", version=0)
    led.dispatch("p1/0", agent="r1", version=0)
    led.finish("p0/1", agent="r0", version=0, output_tokens=2)
    assert led.requeue_agent("r0") == ["p0/0"]
    assert led.entries["p0/0"].state is State.QUEUED and led.entries["p0/0"].agent is None
    assert led.entries["p0/1"].state is State.FINISHED  # already finished: kept, delivered once
    assert led.entries["p1/0"].state is State.DISPATCHED
    assert led.requeued == 1
    # a late sample from the lost agent is refused
    assert not led.finish("p0/0", agent="r0", version=0, output_tokens=2)


def test_training_twice_counts_a_duplicate():
    led = _ledger()
    led.dispatch("p0/0", agent="r0", version=0)
    led.finish("p0/0", agent="r0", version=0, output_tokens=1)
    led.deliver("p0/0")
    led.mark_trained("p0/0")
    led.mark_trained("p0/0")
    assert led.counts().duplicated == 1


def test_counts_trained_prompts_and_lost_ones():
    led = _ledger()
    for sid in ("p0/0", "p0/1"):
        _trained(led, sid, tokens=1)
    c = led.counts(completed_iterations=2)
    assert (c.prompts, c.trained, c.trained_samples, c.lost) == (2, 1, 2, 0)  # p1 is still to come (in flight)
    for sid in ("p1/0", "p1/1"):  # p1 delivered for iteration 1, which was committed without it: lost
        _finished(led, sid, tokens=1)
        led.deliver(sid)
    assert led.counts(completed_iterations=2).lost == 1
    assert led.counts(completed_iterations=1).lost == 0


def test_score_takes_the_reward_of_the_waiting_attempt_once_and_a_requeue_discards_the_tokens():
    led = _ledger()
    led.dispatch("p0/0", agent="r0", version=0)
    assert not led.score("p0/0", attempt=1, reward=1.0)  # not finished
    led.finish("p0/0", agent="r0", version=0, output_tokens=7)
    assert not led.score("p0/0", attempt=0, reward=1.0)
    assert led.score("p0/0", attempt=1, reward=0.5) and led.entries["p0/0"].reward == 0.5
    assert not led.score("p0/0", attempt=1, reward=0.9)
    led.requeue_stale("p0/0")
    assert led.entries["p0/0"].reward is None and led.counts().discarded_tokens == 7
    led.assign("p0", iteration=3)
    assert [e.sample_id for e in led.iteration_entries(3)] == ["p0/0", "p0/1"] and led.iteration_entries(0) == []


def test_checkpoint_round_trip_requeues_untrained():
    led = _ledger()
    led.dispatch("p0/0", agent="r0", version=0)
    led.finish("p0/0", agent="r0", version=0, output_tokens=1)
    led.deliver("p0/0")
    led.mark_trained("p0/0")
    led.dispatch("p0/1", agent="r0", version=0)
    back = Ledger.from_json(led.to_json())
    assert back.entries["p0/0"].state is State.TRAINED
    assert back.entries["p0/1"].state is State.QUEUED
    assert [e.sample_id for e in back.in_state(State.QUEUED, iteration=1)] == ["p1/0", "p1/1"]


def test_retiring_a_complete_round_keeps_every_count_and_forgets_its_entries():
    led = _ledger()
    led.add_prompt(iteration=0, prompt_id="p2", num_samples=2)  # round 0: p0 trained, p2 dropped
    for sid in ("p0/0", "p0/1"):
        _trained(led, sid)
    for sid in ("p2/0", "p2/1"):
        _finished(led, sid, tokens=3)
    led.drop_group("p2")
    _trained(led, "p1/0")  # round 1: one sample trained, one in flight
    led.dispatch("p1/1", agent="r1", version=0)
    with pytest.raises(LedgerError, match="iteration 1 still has samples to train"):
        led.retire(1)
    assert led.retire(7) == []  # an iteration no group occupies
    before = (led.counts(completed_iterations=1), led.state_histogram())
    gone = led.retire(0)
    assert sorted(e.sample_id for e in gone) == ["p0/0", "p0/1", "p2/0", "p2/1"]
    assert sorted(led.entries) == ["p1/0", "p1/1"] and list(led.by_prompt) == ["p1"] and list(led.by_iteration) == [1]
    assert (led.counts(completed_iterations=1), led.state_histogram()) == before
    assert led.inflight("r1") == 1 and led.requeue_agent("r0") == []  # scans see only the rounds in flight
    led.mark_trained("p0/0")  # a second ack of a retired sample: a duplicate, as before
    assert not led.finish("p0/1", agent="r0", version=0, output_tokens=1)  # … and a late result is refused
    assert (led.duplicated, led.refused) == (1, 1)
    back = Ledger.from_json(led.to_json())  # a checkpoint carries the retired rounds' counts
    c = back.counts(completed_iterations=1)
    assert (c.prompts, c.samples, c.trained, c.trained_samples, c.dropped, c.duplicated) == (3, 6, 1, 3, 1, 1)
    assert back.state_histogram() == {"trained": 3, "dropped": 2, "queued": 1}  # p1/1 queued again


def test_a_retired_round_of_filtered_samples_alone_counts_as_lost():
    led = _ledger()
    for sid in ("p0/0", "p0/1"):
        _finished(led, sid, tokens=2)
        led.filter(sid)
    lost = led.counts(completed_iterations=1).lost
    led.retire(0)
    assert lost == led.counts(completed_iterations=1).lost == 1


def test_quarantining_a_group_counts_a_filtered_samples_tokens_once() -> None:
    """A sample filtered out (its reward held the trainer) had its tokens counted as discarded then; its group,
    generated again (no buffer within its bound had room), is set aside later: the filtered sample's tokens are not
    counted a second time, the others' are."""
    led = Ledger()
    led.add_prompt(iteration=0, prompt_id="p0", num_samples=3)
    for sid in ("p0/0", "p0/1", "p0/2"):
        _finished(led, sid, tokens=5)
    led.filter("p0/2")
    assert led.discarded_tokens == 5
    for sid in ("p0/0", "p0/1"):  # the rest of the group found no room within its bound: generated again
        led.requeue_stale(sid)
    assert led.discarded_tokens == 15
    _finished(led, "p0/0", tokens=7)  # … and one of them is done again when the prompt is set aside
    led.quarantine("p0")
    assert led.discarded_tokens == 22
    assert {e.state for e in led.group("p0")} == {State.QUARANTINED}


def test_a_resume_counts_the_finished_and_delivered_outputs_it_generates_again_as_discarded_tokens():
    """At the checkpoint p0/0 was finished (7 tokens) and p0/1 delivered (4), neither trained, and p1/0 filtered
    (its 3 tokens counted then): the resumed ledger queues them again and counts the 11 tokens it generates again in
    `discarded_tokens` (generated, never trained), as a requeue does, versus the count the checkpoint had (3)."""
    led = _ledger()
    _finished(led, "p0/0", tokens=7)
    _finished(led, "p0/1", tokens=4)
    led.deliver("p0/1")
    _finished(led, "p1/0", tokens=3)
    led.filter("p1/0")
    assert led.discarded_tokens == 3
    back = Ledger.from_json(led.to_json())
    assert {e.state for e in back.entries.values()} == {State.QUEUED}
    assert back.counts().discarded_tokens == 3 + 7 + 4


def test_a_resume_with_fewer_iterations_counts_the_kept_output_of_the_rounds_it_forgets_as_discarded_tokens():
    """At the checkpoint p1/0 (round 1) ran with 6 tokens kept in the store and p1/1 had finished (4); the resume
    lowers the job to 1 iteration, so round 1 is never generated: its 4 finished tokens and the 6 kept ones were
    generated and never trained, both in `discarded_tokens`, versus the 6 dropped from the store unsaid."""
    led = _ledger()
    led.dispatch("p1/0", agent="r0", version=0)
    assert led.partials.extend("p1/0", 0, [1] * 6, [0.0] * 6, [0] * 6)
    _finished(led, "p1/1", tokens=4)
    back = Ledger.from_json(led.to_json())
    back.forget_rounds(1)
    assert "p1/0" not in back.entries and back.partials.nbytes == 0
    assert back.counts().discarded_tokens == 4 + 6
