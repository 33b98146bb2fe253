"""A job of weeks whose rollout units come and go (lost and replaced, asked for and exited before they joined, seen
queued, stopped for not joining, joined as they were stopped and lost): what the scaler keeps per unit is that of the
units it still waits on, not one entry per unit the job ever had; its join bound and its counts are as before."""

from __future__ import annotations

from typing import Any

from rlctl.agents.scaling import Scaler
from tests.unit.agents.test_agents_healing import FakeSpawner, deliver, next_post, setup

CYCLES = 40

# what the scaler keeps of units asked for, for `scale --wait` and the status reply (each start asked for is told)
REPORTED = {"failed_starts", "first_sample_s"}


def _per_unit(scaler: Scaler) -> dict[str, int]:
    """The scaler's dicts and sets keyed by unit names, and their sizes (those `scale --wait` reads left out)."""
    return {
        k: len(v)
        for k, v in vars(scaler).items()
        if isinstance(v, dict | set) and k not in REPORTED and any(str(n).startswith("rollout-") for n in v)
    }


def _ssh_refused(name: str, *, grace_s: float) -> None:
    raise OSError("ssh: connection refused")


def _turn(scaler: Scaler, now: float) -> None:
    """The loop's turn at `now`, the sites just asked (their answers are handed in by the test)."""
    scaler._unjoined_at = now
    scaler.tick(now)


def test_what_the_scaler_keeps_per_unit_stays_bounded_as_units_come_and_go(tmp_path: Any) -> None:
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    now = scaler.t0 + 1.0
    _turn(scaler, now)  # the plan's units joined a second in
    sizes: list[int] = []
    for k in range(CYCLES):
        now += 4000.0
        victim = min((u.name for u in core.live_units), key=lambda n: int(n.split("-")[1]))
        if k % 4 == 0:  # lost: its replacement starts, joins 30 s later and samples
            core.lost(victim)
            scaler.replace(victim, now=now)
            _turn(scaler, now)
            deliver(scaler, posted)
            new = scaler.replacing[victim].unit
            assert new is not None
            core.join(new, role="rollout", version=0)
            _turn(scaler, now + 30.0)
            scaler.sampled(new)
        elif k % 4 == 1:  # asked for, seen queued, then its site cannot say, then it exited before it joined
            (name,) = scaler.scale(1, None, reason="operator")[0]["adding"]
            deliver(scaler, posted)
            scaler.not_joining([], now=now, queued={name: True})
            scaler.not_joining([], now=now + 60.0, queued={name: None})
            scaler.not_joining([name], now=now + 120.0)
            assert name in scaler.failed_starts
        elif k % 4 == 2:  # asked for, runs but never joins: stopped past the bound, a failed start
            (name,) = scaler.scale(1, None, reason="rebalance")[0]["adding"]
            deliver(scaler, posted)
            _turn(scaler, now + 1900.0)
            what, stopped, result = next_post(posted)
            assert (what, stopped) == ("unjoined_stopped", name)
            scaler.unjoined_stopped(name, result)
            assert name in scaler.failed_starts
        else:  # asked for, stopped for not joining, joined as it was stopped and its stop failed: stays, then lost
            (name,) = scaler.scale(1, None, reason="operator")[0]["adding"]
            deliver(scaler, posted)
            spawner.stop = _ssh_refused  # type: ignore[method-assign]
            _turn(scaler, now + 1900.0)
            _, _, result = next_post(posted)
            spawner.stop = FakeSpawner.stop.__get__(spawner)  # type: ignore[method-assign]
            core.join(name, role="rollout", version=0)
            scaler.unjoined_stopped(name, result)
            assert name not in scaler.failed_starts
            scaler.sampled(name)
            core.lost(name)
            scaler.replace(name, now=now + 1901.0)
            _turn(scaler, now + 1902.0)
            deliver(scaler, posted)  # its replacement, which joins and samples
            new = scaler.replacing[name].unit
            assert new is not None
            core.join(new, role="rollout", version=0)
            _turn(scaler, now + 1903.0)
            scaler.sampled(new)
            (drained,) = scaler.scale(-1, None, reason="operator")[0]["removing"]  # a scale-in: the newest, stopped
            core.lost(drained)
        assert scaler.pending_units() == [] and scaler.replacing == {} and posted == []
        sizes.append(sum(_per_unit(scaler).values()))
    assert scaler.join_bound_s() == 1800.0  # the longest join, 30 s, × 4 is below the least bound
    assert scaler.replaced == CYCLES // 2 and len(scaler.failed_starts) == CYCLES // 2
    assert len(core.live_units) == 2
    # the per-unit entries of the units gone leave: what is left is the live units' (the plan's, asked for)
    assert max(sizes) <= 6, (sizes, _per_unit(scaler))
    assert sizes[-1] == sizes[CYCLES // 2 - 1], (sizes, _per_unit(scaler))
