"""`bench rpc`'s small-message round trips: the methods take turns in blocks, so a load that drifts during the
run weighs on each of them alike. The methods here are stand-ins on a simulated machine whose load grows with
every block run on it (no sockets, no timing)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import bench.rpc as rpc

# seconds per round trip on an idle machine
COST = {"untagged": 1e-4, "tagged": 2e-4, "encrypted": 4e-4, "pickle": 3e-4}


class _Machine:
    def __init__(self) -> None:
        self.load = 1.0
        self.calls: list[str] = []


class _Method:
    """A method whose round trips cost its idle cost × the machine's load, which each block raises by 1 %."""

    def __init__(self, machine: _Machine, kind: str, round_trips: int = 0) -> None:
        self.machine, self.kind, self.total = machine, kind, round_trips

    def once(self) -> float:
        return 1.0

    def round_trips(self, n: int) -> float:
        self.machine.calls.append(self.kind)
        self.machine.load += 0.01
        return n * COST[self.kind] * self.machine.load

    def finish(self) -> float:  # the interface before: every round trip of this method, one block after another
        blocks = max(1, self.total // 100)
        return blocks * 100 / sum(self.round_trips(100) for _ in range(blocks))

    def close(self) -> None:
        pass


def _stand_ins(monkeypatch: pytest.MonkeyPatch) -> _Machine:
    machine = _Machine()

    def rlctl(t: Any, repeats: int, *, tagged: bool = True, encrypt: bool = False, **kw: Any) -> _Method:
        kind = "encrypted" if encrypt else "tagged" if tagged else "untagged"
        return _Method(machine, kind, kw.get("round_trips", 0))

    monkeypatch.setattr(rpc, "_Rlctl", rlctl)
    monkeypatch.setattr(rpc, "_Raw", lambda t, repeats: _Method(machine, "pickle"))
    monkeypatch.setattr(rpc, "_Pickle", lambda t, repeats, *rest: _Method(machine, "pickle", *rest))
    monkeypatch.setattr(rpc.importlib.util, "find_spec", lambda name: None)  # no ucx
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    return machine


def test_the_round_trips_of_the_methods_take_turns():
    machine = _Machine()
    methods = {k: _Method(machine, k) for k in ("untagged", "tagged", "encrypted")}
    rps = rpc._round_trips_interleaved(methods, 300)
    # three turns of one block each, the first of a turn rotating
    turns = [("untagged", "tagged", "encrypted"), ("tagged", "encrypted", "untagged")]
    turns += [("encrypted", "untagged", "tagged")]
    assert machine.calls == [kind for turn in turns for kind in turn]
    # the median block: the untagged method's blocks ran at loads 1.01, 1.06, 1.08
    assert rps["untagged"] == pytest.approx(1 / (COST["untagged"] * 1.06))


def test_the_auth_overhead_on_round_trips_is_what_the_tags_cost_under_a_drifting_load(monkeypatch):
    _stand_ins(monkeypatch)
    r = rpc.auth_costs(nbytes=16, repeats=1, round_trips=2000)
    # the tags double a round trip's cost: one method measured after the other made it 1.36 (untagged first)
    assert r["auth_overhead_round_trips"] == pytest.approx(1.0, abs=0.05)


def test_the_run_measures_its_round_trip_rates_taking_turns(monkeypatch):
    _stand_ins(monkeypatch)
    r = rpc.run(quick=True)
    # one after the other, authenticated first: 0.70 (the reviewer's run on this machine: −0.28)
    assert r["auth_overhead_round_trips"] == pytest.approx(1.0, abs=0.05)
    assert r["rlctl_round_trips_per_s"] / r["pickle_round_trips_per_s"] == pytest.approx(1.5, rel=0.05)
