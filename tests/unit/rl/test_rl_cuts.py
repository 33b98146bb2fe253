"""The learner's cut rule over data-parallel ranks (`rlctl.rl.cuts`): the budgets bound each rank's share of a cut
(a contiguous run of its length order, `share_rows`: `rlctl.rl.learner.backward_share`), not the whole cut."""

from __future__ import annotations

import itertools
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.rl.cuts import cut_lengths, share_rows, share_slice, trainable_cuts, trained_count


def _shares(rows: list[int], cut: list[int], size: int, budget: int | None, ranks: int) -> list[list[int]]:
    """Each rank's rows of `cut` as the learner takes them (`share_slice`)."""
    tokens = [rows[i] for i in cut]
    return [cut[share_slice(tokens, size, max_tokens=budget, ranks=ranks, rank=r)] for r in range(ranks)]


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
        shares = _shares(rows, c, size, budget, ranks)
        assert [i for share in shares for i in share] == c  # contiguous runs, rank 0's first, every row once
        assert all(shares) or len(c) < ranks  # a rank without a row: a cut of fewer rows than ranks alone
        for share in shares:
            longest = max((rows[i] for i in share), default=0)
            assert len(share) <= size and (budget is None or len(share) * longest <= budget or len(share) == 1)
    for c, nxt in itertools.pairwise(cuts):  # the next cut's first row did not fit this one's last share
        last = _shares(rows, c, size, budget, ranks)[-1]
        over = budget is not None and (len(last) + 1) * rows[nxt[0]] > budget
        assert len(last) >= size or over


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


@given(
    st.lists(st.integers(1, 5000), min_size=0, max_size=120),
    st.integers(1, 12),
    st.sampled_from([None, 800, 8192]),
    st.integers(1, 8),
    st.booleans(),
    st.booleans(),
)
@settings(max_examples=400, deadline=None)
def test_trained_count_is_what_trainable_cuts_trains(
    rows: list[int], size: int, budget: int | None, ranks: int, flush: bool, once: bool
) -> None:
    """The simulator's rule on the lengths alone (`trained_count`) trains as many rows as the learner's
    (`trainable_cuts`), at any dp, by rows alone or with a token budget, streaming or flushing."""
    cuts, held = trainable_cuts(rows, size, max_tokens=budget, ranks=ranks, flush=flush, reduce_per_step=once)
    n = trained_count(sorted(rows), size, max_tokens=budget, ranks=ranks, flush=flush, reduce_per_step=once)
    assert n == sum(map(len, cuts)) == len(rows) - len(held)


def _padded_tokens(rows: list[int], size: int, budget: int | None, ranks: int) -> int:
    """Padded tokens every rank computes over the cuts, all ranks together (each share: its rows × its longest)."""
    total = 0
    for c in cut_lengths(rows, size, max_tokens=budget, ranks=ranks):
        tokens = [rows[i] for i in c]
        at = 0
        for k in share_rows(tokens, size, max_tokens=budget, ranks=ranks):
            total, at = total + (k * tokens[at + k - 1] if k else 0), at + k
    return total


def test_a_ranks_share_pads_as_little_at_dp_2_and_4_as_at_dp_1() -> None:
    """A long-tailed batch (lognormal lengths, 512 rows, cuts of 16 rows a rank): the ranks compute within 2 % of
    dp 1's padded tokens, by rows alone and with a token budget. Before 2026-12-07 each rank took every `ranks`-th row
    of a cut, its share spanning the cut's lengths: padded/real 1.163 at dp 2 and 1.337 at dp 4 against 1.087 at dp 1
    by rows alone, 1.054 and 1.102 against 1.027 with the budget of 8,192."""
    rng = random.Random(0)
    rows = [min(8000, int(rng.lognormvariate(6.0, 0.8))) + 20 for _ in range(512)]
    for budget in (None, 8192):
        one = _padded_tokens(rows, 16, budget, 1)
        for ranks in (2, 4):
            assert _padded_tokens(rows, 16, budget, ranks) <= 1.02 * one, (budget, ranks)


def test_a_cut_the_budgets_do_not_fill_is_split_balanced_by_padded_tokens() -> None:
    """The flush's remainder: 5 rows over 2 ranks that could take 8 each go 3 short and 2 long (the busiest 2 × 100,
    not one rank all 5 × 100 while the other idles); fewer rows than ranks leave the last ranks without a row."""
    assert share_rows([10, 10, 10, 100, 100], 8, ranks=2) == [3, 2]
    assert share_rows([10, 10, 10, 10, 100], 8, ranks=2) == [4, 1]
    assert share_rows([10, 20], 8, ranks=4) == [1, 1, 0, 0]
    assert share_rows([], 8, ranks=2) == [0, 0]
    assert share_rows([10] * 4, 2, ranks=2) == [2, 2]  # full: the budgets' fill


def _balanced_by_rows(tokens: list[int], size: int, *, max_tokens: int | None, ranks: int) -> list[int]:
    """`share_rows` as written before its fill was vectorised (2026-12-08): every candidate cap (k rows × a row's
    length) in a Python set, the fill a loop over the rows."""

    def fits(rows: int, n: float) -> bool:
        return rows == 0 or (rows < size and (max_tokens is None or (rows + 1) * n <= max_tokens))

    def fill(cap: float) -> list[int]:
        out = [0]
        for n in tokens:
            if not (fits(out[-1], n) and (out[-1] == 0 or (out[-1] + 1) * n <= cap)):
                out.append(0)
            out[-1] += 1
        return out

    filled = fill(math.inf)
    if len(filled) >= ranks:
        return filled
    caps = sorted({k * n for j, n in enumerate(tokens) for k in range(1, min(size, j + 1) + 1)})
    lo, hi = 0, len(caps) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(fill(caps[mid])) <= ranks else (mid + 1, hi)
    out = fill(caps[lo])
    while len(out) < min(ranks, len(tokens)):
        i = max((i for i, r in enumerate(out) if r > 1), key=lambda i: out[i] * tokens[sum(out[: i + 1]) - 1])
        out[i : i + 1] = [out[i] - out[i] // 2, out[i] // 2]
    return out + [0] * (ranks - len(out))


def test_the_balanced_split_is_the_row_by_row_rules() -> None:
    """The flush's remainder split into `ranks` runs (the fill vectorised: 6.5 against 24.6 ms a cut of 1,024 rows at
    32 a rank into 33-256 runs, which the planner pays at every dp it prices) is the row-by-row rule's, in 400 drawn
    cuts of 1 to 300 rows, with and without a token budget."""
    rng = random.Random(7)
    for _ in range(400):
        tokens = sorted(rng.randint(1, 400) for _ in range(rng.randint(1, 300)))
        size, ranks = rng.randint(1, 40), rng.randint(1, 64)
        budget = rng.choice([None, 400, 2000])
        want = _balanced_by_rows(tokens, size, max_tokens=budget, ranks=ranks)
        if len(want) > ranks:  # more shares than ranks: not one cut (`cut_lengths` closes it before)
            continue
        assert share_rows(tokens, size, max_tokens=budget, ranks=ranks) == want, (tokens, size, budget, ranks)
