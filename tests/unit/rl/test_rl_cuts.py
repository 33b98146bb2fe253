"""The learner's cut rule over data-parallel ranks (`rlctl.rl.cuts`): the budgets bound each rank's share of a cut
(every dp-th row of it, `rlctl.rl.learner.backward_share`), not the whole cut."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.rl.cuts import cut_lengths, trainable_cuts, trained_count


def _shares(cut: list[int], ranks: int) -> list[list[int]]:
    return [cut[r::ranks] for r in range(ranks)]


@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=200),
    st.integers(1, 40),
    st.sampled_from([None, 800, 8192]),
    st.integers(1, 8),
)
@settings(max_examples=300, deadline=None)
def test_every_ranks_share_of_a_cut_keeps_to_the_budgets_and_a_cut_takes_all_it_can(
    rows: list[int], size: int, budget: int | None, ranks: int
) -> None:
    """Each rank's share holds at most `size` rows and pads (its rows × its longest) to at most the budget, a longer
    row alone; and a cut closes only where the next row would break that for the rank it would go to."""
    cuts = cut_lengths(rows, size, max_tokens=budget, ranks=ranks)
    flat = [i for c in cuts for i in c]
    assert sorted(flat) == list(range(len(rows))) and [rows[i] for i in flat] == sorted(rows)
    for c in cuts:
        for share in _shares(c, ranks):
            longest = max((rows[i] for i in share), default=0)
            assert len(share) <= size and (budget is None or len(share) * longest <= budget or len(share) == 1)
    for c, nxt in itertools.pairwise(cuts):  # the next cut's first row did not fit this one
        grown = _shares([*c, nxt[0]], ranks)[len(c) % ranks]
        over = budget is not None and len(grown) > 1 and len(grown) * rows[nxt[0]] > budget
        assert len(grown) > size or over


def test_at_dp_8_a_cut_of_3000_token_rows_gives_every_rank_its_budget() -> None:
    """64 rows of 3,000 tokens, 8,192 padded tokens and 32 rows a rank: at dp 8 a cut holds 16 rows, 2 a rank (before
    2026-12-07 the budget bounded the whole cut: 2 rows, 6 of 8 ranks idle, 32 cuts); at dp 1 the cut is the rank's
    share, as it always was."""
    rows = [3000] * 64
    assert [len(c) for c in cut_lengths(rows, 32, max_tokens=8192, ranks=8)] == [16] * 4
    assert [len(c) for c in cut_lengths(rows, 32, max_tokens=8192)] == [2] * 32
    # by rows alone: 32 a rank, one cut of 64 at dp 2; 8 rows over the budget: one a rank, 4 cuts of 2 at dp 2
    assert [len(c) for c in cut_lengths(rows, 32, ranks=2)] == [64]
    assert [len(c) for c in cut_lengths([9000] * 8, 32, max_tokens=8192, ranks=2)] == [2] * 4


def test_at_one_rank_the_cuts_are_those_of_a_whole_cut_budget() -> None:
    """dp 1 (the default): ≤ `size` rows and ≤ the budget padded tokens a cut, a longer row alone, as before."""
    rows = [100, 900, 300, 5000, 200, 250, 2000, 260]
    assert cut_lengths(rows, 3, max_tokens=1000) == [[0, 4, 5], [7, 2], [1], [6], [3]]
    assert cut_lengths(rows, 3, max_tokens=1000, ranks=1) == cut_lengths(rows, 3, max_tokens=1000)
    assert cut_lengths(rows, 3) == [[0, 4, 5], [7, 2, 1], [6, 3]]


def test_a_cut_is_full_at_its_ranks_rows_and_held_until_then() -> None:
    """Streaming: the last cut waits for more rows until every rank's share is full (`size` rows each), the same in
    `trainable_cuts` and on the lengths alone (`trained_count`, the simulator's)."""
    rows = [10] * 6
    assert trainable_cuts(rows, 2, ranks=2, flush=False) == ([[0, 1, 2, 3]], [4, 5])
    assert trained_count(rows, 2, ranks=2, flush=False) == 4
    assert trainable_cuts(rows, 2, max_tokens=20, ranks=3, flush=False) == ([[0, 1, 2, 3, 4, 5]], [])
    assert trained_count(rows, 2, max_tokens=20, ranks=3, flush=False) == 6
    assert trained_count(rows, 2, ranks=2, flush=True) == 6


@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=200),
    st.integers(1, 40),
    st.sampled_from([None, 800, 8192]),
    st.integers(2, 8),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_only_a_steps_last_cut_has_fewer_rows_than_ranks(
    rows: list[int], size: int, budget: int | None, ranks: int, once: bool
) -> None:
    """Every cut but the last holds a row a rank at least (a share closes at 2 rows or more), so FSDP2's rank with no
    row of a cut, which runs the cut's first at weight 0 (`rlctl.rl.learner.backward_share`), is one of a step's
    last cut alone: what the flush trains (`trainable_cuts` holds a partial last cut until then)."""
    cuts = cut_lengths(rows, size, max_tokens=budget, ranks=ranks)
    assert all(len(c) >= ranks for c in cuts[:-1])
    trained, _ = trainable_cuts(rows, size, max_tokens=budget, ranks=ranks, flush=False, reduce_per_step=once)
    assert all(len(c) >= ranks for c in trained)
    assert trainable_cuts([5] * (ranks + 1), 1, ranks=ranks, flush=True)[0][-1] == [ranks]  # reachable: 1 row
