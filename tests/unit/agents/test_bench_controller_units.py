"""`python -m bench controller-units`: the controller's core driven by more and more rollout units."""

from __future__ import annotations

from bench import controller_units


def test_each_unit_count_is_driven_through_its_iterations_and_summarised() -> None:
    r = controller_units.measure((2, 4), prompts=4, iterations=2)
    assert [u["units"] for u in r["units"]] == [2, 4]
    assert all(u["in_flight"] > 0 and u["weights_applied_ms"] > 0 for u in r["units"])  # every unit kept at work
    assert r["samples_per_iteration"] == 4 * controller_units.SAMPLES
    assert "4 units" in controller_units.summary(r)
