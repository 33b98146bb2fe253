"""`rlctl launch`'s summary table: the partial rollouts line."""

from __future__ import annotations

from rlctl.commands.launch import partials_line


def _ledger(**partials: int) -> dict[str, object]:
    base = {"resumed": 3, "resumed_tokens": 40, "interrupted": 0, "lost_units_measured": 0}
    return {"migrated": 2, "partials": base | partials}


def test_no_unit_lost_shows_moved_and_resumed_work_only() -> None:
    assert partials_line(_ledger()) == "migrated 2 resumed 3 (40 tokens not generated again)"


def test_lost_units_show_the_bound_and_what_their_flight_records_measured() -> None:
    cut = {"interrupted": 5, "interrupted_kept_tokens": 90, "interrupted_lost_tokens_max": 5}
    line = partials_line(_ledger(**cut))
    assert line.endswith("; 5 cut by a lost unit: 90 tokens kept, ≤ 5 generated again")
    one = partials_line(_ledger(**cut, lost_units_measured=1, interrupted_lost_tokens_measured=2))
    assert one.endswith("≤ 5 generated again (2 by the flight records of 1 lost unit)")
    two = partials_line(_ledger(**cut, lost_units_measured=2, interrupted_lost_tokens_measured=0))
    assert two.endswith("(0 by the flight records of 2 lost units)")
