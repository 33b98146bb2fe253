"""The dynamic-adjustment rule on known sequences: δ over a window (its median), δ' = T_gen/(N+1), cooldown,
caps."""

from __future__ import annotations

import pytest

from rlctl.agents.rebalance import RebalanceRule, delta_prime
from rlctl.config.pipeline import Rebalance


def feed(
    rule: RebalanceRule, rows: list[tuple[float, float]], *, units: int = 1, blocked: str | None = None
) -> list[bool]:
    return [rule.observe(i, t_gen_s=g, t_train_s=t, units=units, blocked=blocked).add for i, (g, t) in enumerate(rows)]


def test_delta_prime_is_the_time_one_more_balanced_unit_saves():
    work = 12.0  # 2 units take 6 s, 3 units 4 s: one more saves 2 s
    assert delta_prime(work / 2, 2) == pytest.approx(work / 2 - work / 3)


def test_adds_only_after_a_full_window_with_delta_at_least_delta_prime():
    rule = RebalanceRule(Rebalance(auto=True, window_iterations=3, cooldown_iterations=3))
    # T_gen 3, T_train 1: δ = 2 ≥ δ' = 1.5 — but only once three iterations were measured
    assert feed(rule, [(3.0, 1.0)] * 3) == [False, False, True]


def test_balanced_stages_never_add():
    rule = RebalanceRule(Rebalance(auto=True))
    r = [rule.observe(i, t_gen_s=2.0, t_train_s=1.5, units=1) for i in range(10)]
    assert not any(x.add for x in r) and r[-1].why == "δ < δ'"
    assert r[-1].delta_s == pytest.approx(0.5) and r[-1].delta_prime_s == pytest.approx(1.0)


def test_after_a_change_it_measures_afresh():
    rule = RebalanceRule(Rebalance(auto=True, window_iterations=2, cooldown_iterations=4))
    assert feed(rule, [(3.0, 1.0)] * 4) == [False, False, False, True]
    rule.changed()
    assert feed(rule, [(3.0, 1.0)] * 4, units=2) == [False, False, False, True]  # δ 2 ≥ δ' 1: again after 4


def test_iterations_beside_a_held_out_evaluation_are_not_measured():
    """A balanced job whose generation doubles while a unit decodes held-out prompts: those iterations neither add a
    unit nor count toward the window."""
    rule = RebalanceRule(Rebalance(auto=True, window_iterations=2, cooldown_iterations=2))
    assert feed(rule, [(2.0, 1.5)] * 2) == [False, False]
    spikes = [rule.observe(2 + i, t_gen_s=5.0, t_train_s=1.5, units=1, evaluating=True) for i in range(2)]
    assert not any(r.add for r in spikes) and "held-out evaluation" in spikes[0].why
    assert spikes[0].delta_s == pytest.approx(0.5)  # the window's, untouched
    assert rule.window == [(2.0, 1.5)] * 2
    rule2 = RebalanceRule(Rebalance(auto=True, window_iterations=2, cooldown_iterations=2))
    assert feed(rule2, [(2.0, 1.5)] * 2 + [(5.0, 1.5)] * 2)[-1]  # measured, the same spikes would add one


def test_evaluations_beside_every_iteration_are_the_workload_after_a_window():
    """Evaluations that overlap every iteration (K small next to their length): after window_iterations unmeasured
    iterations in a row the rule measures them; an iteration without one starts the count again."""
    rule = RebalanceRule(Rebalance(auto=True, window_iterations=2, cooldown_iterations=2))
    got = [rule.observe(i, t_gen_s=5.0, t_train_s=1.5, units=1, evaluating=True).add for i in range(4)]
    assert got == [False, False, False, True]  # 2 skipped, then 2 measured: δ 3.5 ≥ δ' 2.5
    rule.changed()
    rule.observe(4, t_gen_s=2.0, t_train_s=1.5, units=2)
    r = rule.observe(5, t_gen_s=5.0, t_train_s=1.5, units=2, evaluating=True)
    assert "held-out evaluation" in r.why and len(rule.window) == 1


def test_no_free_slot_or_auto_off_never_adds():
    full = RebalanceRule(Rebalance(auto=True))
    assert not any(feed(full, [(5.0, 1.0)] * 6, blocked="no free GPU slot on a rollout site"))
    off = RebalanceRule(Rebalance(auto=False))
    assert not any(feed(off, [(5.0, 1.0)] * 6))


def test_the_window_keeps_only_what_the_checks_read():
    rule = RebalanceRule(Rebalance(auto=True, window_iterations=3, cooldown_iterations=5))
    feed(rule, [(1.0, 1.0)] * 50)
    assert len(rule.window) == 5


def test_one_slow_iteration_in_the_window_does_not_add_a_unit():
    """The median over the window: a long sample's decode that slows one iteration (more units would not shorten
    it) is not the workload; the same window's mean would have added a unit."""
    rule = RebalanceRule(Rebalance(auto=True, window_iterations=3, cooldown_iterations=3))
    r = [rule.observe(i, t_gen_s=g, t_train_s=1.0, units=1) for i, g in enumerate([1.2, 6.0, 1.2])]
    assert not r[-1].add and r[-1].delta_s == pytest.approx(0.2) and r[-1].delta_prime_s == pytest.approx(0.6)
    assert feed(rule, [(6.0, 1.0)]) == [True]  # two slow ones of three: the workload
