"""A run whose rollout units come and go for weeks keeps the latest GONE_KEPT gone agents by name, versus every one
(`ControllerAgent.gone`); the status reply, summary.json's bubble and a lost unit's refused hello are as before."""

from __future__ import annotations

import time
from dataclasses import replace

from rlctl.agents.books import GoneAgent, GoneBook
from rlctl.agents.views import status, summary
from tests.unit.agents.test_agents_gone_churn import Churn, churn

__all__ = ["churn"]  # (the fixture)


def test_the_gone_agents_kept_by_name_are_bounded_and_every_one_still_counts(churn: Churn) -> None:
    """The controller kept a record of every agent gone for the rest of the run (`gone`); it keeps the latest
    GONE_KEPT by name (a lost unit's hello refused, summary.json's list) and counts every one (the status reply's
    counts, the bubble)."""
    r = churn
    r.ctl.gone.keep = KEPT = 6  # (GONE_KEPT in a real run: 1024)
    names = r.churn()
    assert len(r.ctl.gone.named) == KEPT
    st = status(r.ctl.snapshot(), now=time.monotonic())
    assert st["agents_gone"] == {"lost": len(names), "stopped": 0}
    snap = r.ctl.snapshot()
    every = GoneBook(keep=len(names))  # every one kept by name, as before
    for n in names:
        every.add(n, GoneAgent("rollout", "lost", 1.0))
    assert summary(snap)["bubble_fraction"] == summary(replace(snap, gone=every))["bubble_fraction"]
    end = r.hello(names[-1])  # the latest lost says hello again: told to stop
    assert end.recv(timeout_s=5).kind == "stop"
    r.ctl._shutdown()
    s = r.jd.read_json(r.jd.summary_json)
    assert sorted(s["agents"]) == sorted(["rollout-0", "rollout-1", "trainer-0", *names[-KEPT:]])
    assert s["agents_unlisted"] == len(names) - KEPT
    assert s["agents"][names[-1]] == {"role": "rollout", "busy_s": 1.0}
