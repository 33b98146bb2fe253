"""`migration.plan`: who gives how much to whom."""

from __future__ import annotations

from rlctl.agents.migration import Load, plan


def test_waiting_requests_go_to_free_rows_and_an_idle_unit_takes_half_of_a_busy_one():
    loads = [Load("a", 3, 10), Load("b", 3, 2), Load("c", 3, 0)]
    # c (idle) first takes as many of a's 6 waiting requests as fit (4); a is then busy with that move
    assert plan(loads, {}, batch=4) == [("a", "c", 4)]
    assert plan([Load("a", 3, 5), Load("b", 3, 0)], {}, batch=8) == [("a", "b", 2)]  # the long tail: half
    assert plan([Load("a", 3, 1), Load("b", 3, 0)], {}, batch=8) == []  # one request: nothing to share


def test_pending_moves_count_as_done_and_leave_both_units_alone():
    loads = [Load("a", 3, 10), Load("b", 3, 0), Load("c", 3, 0)]
    assert plan(loads, {"a": ("b", 4)}, batch=4) == []  # c may take from neither a nor b while a → b is pending
    loads = [Load("a", 3, 10), Load("b", 3, 0), Load("c", 3, 8), Load("d", 3, 0)]
    assert plan(loads, {"a": ("b", 4)}, batch=4) == [("c", "d", 4)]


def test_no_work_goes_to_a_unit_on_older_weights():
    assert plan([Load("a", 3, 10), Load("b", 2, 0)], {}, batch=4) == []
    assert plan([Load("a", 2, 10), Load("b", 3, 0)], {}, batch=4) == [("a", "b", 4)]
