"""The staleness buffers (StaleFlow's Reserve / Occupy / Consume, per group): a reservation is refused when it
could not be honoured, a completed group takes the earliest buffer that keeps every other reservation within its
bound, and — whatever the order of completions — every reserved group finds a place by its deadline."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rlctl.agents.buffers import StalenessBuffers


def test_reserve_is_refused_when_the_groups_due_by_a_buffer_would_not_fit() -> None:
    b = StalenessBuffers(capacity=1, eta=1, last=5)
    assert b.may_reserve("g1", 0)
    b.reserve("g1", 0)  # due by 1
    assert b.may_reserve("g2", 0)
    b.reserve("g2", 0)
    assert not b.may_reserve("g3", 0)  # three groups due by buffer 1, two entries in buffers 0 and 1
    assert b.may_reserve("g3", 1)  # with the next weights it is due by 2
    assert b.may_reserve("g1", 0)  # a group already reserved: another of its samples at the same version
    assert b.deadline == {"g1": 1, "g2": 1}


def test_the_first_group_to_complete_fills_the_current_buffer_unless_an_older_one_needs_it() -> None:
    b = StalenessBuffers(capacity=1, eta=1, last=5)
    for g in ("slow", "fast"):
        b.reserve(g, 0)
    assert b.occupy("fast", 0) == 0  # "slow" still fits in buffer 1, its deadline
    assert b.occupy("slow", 0) == 1
    b2 = StalenessBuffers(capacity=1, eta=1, last=5, consumed=1)
    b2.reserve("old", 0)  # due by 1
    b2.reserve("new", 1)  # due by 2
    assert b2.occupy("new", 1) == 2  # buffer 1 is the only place "old" can still go
    assert b2.occupy("old", 0) == 1


def test_a_group_without_room_within_its_bound_is_refused_and_the_last_buffer_caps_deadlines() -> None:
    b = StalenessBuffers(capacity=1, eta=1, last=1)
    b.reserve("a", 1)
    assert b.deadline["a"] == 1  # never past the job's last iteration
    assert b.occupy("a", 1) == 0
    b.reserve("b", 1)
    assert b.occupy("b", 1) == 1
    c = StalenessBuffers(capacity=1, eta=1, last=5, consumed=2)
    c.reserve("x", 2)
    assert c.occupy("x", 0) is None  # a sample older than the one it was dispatched at: due by 1 < 2
    assert "x" not in c.deadline and "x" not in c.where


def test_consume_takes_a_full_buffer_only() -> None:
    b = StalenessBuffers(capacity=2, eta=0, last=3)
    b.reserve("a", 0)
    b.reserve("b", 0)
    assert b.occupy("a", 0) == 0 and not b.ready(0)
    with pytest.raises(AssertionError, match="not ready"):
        b.consume()
    assert b.occupy("b", 0) == 0 and b.ready(0)
    assert b.consume() == ["a", "b"] and b.consumed == 1 and b.where == {}


@pytest.mark.parametrize("seed", range(40))
def test_every_reserved_group_finds_a_place_by_its_deadline_whatever_the_order(seed: int) -> None:
    """Random rounds of dispatch at the units' versions and completions in random order, with consumes when
    the current buffer is full: no occupy is ever refused, no buffer overflows, no group lands past its
    deadline or before its version, and every group is consumed exactly once."""
    rng = random.Random(seed)
    eta, cap, last = rng.randint(0, 3), rng.randint(1, 4), 6
    b = StalenessBuffers(capacity=cap, eta=eta, last=last)
    versions: dict[str, int] = {}
    waiting: list[str] = []  # reserved, not completed
    consumed: list[str] = []
    created = 0
    while b.consumed <= last:
        # rounds are created up to η ahead of the trainer, `cap` groups each (what ControllerCore does)
        while created <= min(b.consumed + eta, last):
            for k in range(cap):
                g = f"r{created}-{k}"
                v = rng.randint(max(0, created - eta), b.consumed)  # a unit takes round r only if r ≤ w + η
                while not b.may_reserve(g, v):  # refused: it waits for a unit with newer weights
                    v += 1
                assert v <= b.consumed, "a round's group could not be reserved even at the trainer's version"
                b.reserve(g, v)
                versions[g] = v
                waiting.append(g)
            created += 1
        if b.ready(b.consumed):
            consumed += b.consume()
            continue
        g = waiting.pop(rng.randrange(len(waiting)))
        at = b.occupy(g, versions[g])
        assert at is not None, (g, versions[g], b)
        assert versions[g] <= at <= versions[g] + eta and at >= b.consumed
        assert all(len(gs) <= cap for gs in b.occupied.values())
    assert sorted(consumed) == sorted(versions) and len(consumed) == len(set(consumed))


def _hall(b: StalenessBuffers, deadlines: list[int]) -> bool:
    """Hall's condition over these deadlines one by one: for every k, those due by k fit in consumed … k's room."""
    if any(d < b.consumed for d in deadlines):
        return False
    due = room = 0
    for k in range(b.consumed, max(deadlines, default=b.consumed) + 1):
        due, room = due + deadlines.count(k), room + b.free(k)
        if due > room:
            return False
    return True


@pytest.mark.parametrize("seed", range(30))
def test_the_deadline_counts_follow_the_reservations_and_answer_as_their_deadlines_do(seed: int) -> None:
    """The checks read a count per deadline, kept by reserve, release and occupy (they read every reserved group's
    deadline at each new group's dispatch and each completion): after any sequence of moves the counts are the
    reservations', and `may_reserve` answers as Hall's condition over every other reservation and the new one."""
    rng = random.Random(seed)
    b = StalenessBuffers(capacity=rng.randint(1, 4), eta=rng.randint(0, 3), last=8)
    groups = [f"g{i}" for i in range(12)]
    for _ in range(300):
        g, v = rng.choice(groups), rng.randint(b.consumed, b.consumed + 2)
        old, new = b.deadline.get(g), b.due(v)
        others = [d for h, d in b.deadline.items() if h != g]
        expect = (old is not None and old <= new) or _hall(b, [*others, new])
        assert b.may_reserve(g, v) == expect
        op = rng.choice(["reserve", "reserve", "release", "occupy", "fill", "consume"])
        if op == "reserve" and expect and g not in b.where:
            b.reserve(g, v)
        elif op == "release":
            b.release(g)
        elif op == "occupy" and g in b.deadline:
            b.occupy(g, v)
        elif op == "fill":
            b.fill_forward()
        elif op == "consume" and b.consumed < b.last and b.ready(b.consumed):
            b.consume()
        assert b._due == Counter(b.deadline.values()), (op, g)
