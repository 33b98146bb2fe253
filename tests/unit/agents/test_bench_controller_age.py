"""`python -m bench controller-age`: what the controller holds does not grow with the job's age."""

from __future__ import annotations

from bench import controller_age


def test_the_ledger_and_its_checkpoint_stay_the_size_of_the_rounds_in_flight() -> None:
    r = controller_age.measure(30, 10)
    entries = [x["ledger_entries"] for x in r["readings"]]
    per_round = controller_age.PROMPTS * controller_age.SAMPLES
    assert entries[:-1] == [2 * per_round] * 2 and entries[-1] == per_round  # η 1: two rounds in flight, then one
    assert r["checkpoint_bytes_growth"] <= 1.0
    assert r["samples_log_bytes"] > 200 * (30 - 1) * per_round  # the rounds retired went to the sample log
    assert "ledger_entries" in controller_age.summary(r)
