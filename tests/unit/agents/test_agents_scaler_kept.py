"""A job of weeks whose units are asked for, fail to start, sample, are lost and given up on, over and over: what the
scaler reports of them (`scale --wait`'s first samples and failed starts, the status reply's resilience and scale
events, summary.json) is the latest few and counts, not an entry per unit or event the job ever had."""

from __future__ import annotations

from typing import Any

from rlctl.agents.scaling import Scaler
from tests.unit.agents.test_agents_healing import FakeSpawner, deliver, setup

UNITS = 30


def _asked(scaler: Scaler, posted: list[Any], spawner: FakeSpawner, *, starts: bool) -> str:
    """`rlctl scale +1`: the unit's start returns (`starts`) or fails; its name."""
    spawner.fail = len(spawner.calls) if starts else len(spawner.calls) + 1
    (name,) = scaler.scale(1, None, reason="operator")[0]["adding"]
    deliver(scaler, posted)
    return name


def test_the_first_samples_and_failed_starts_kept_are_the_latest(tmp_path: Any) -> None:
    """Units asked for that failed to start, or joined, sampled and were drained: `scale --wait` (through the status
    reply) reads the latest `starts_kept` of each, versus one entry per unit ever asked for."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    scaler.starts_kept = 4
    failed, sampled = [], []
    for _ in range(UNITS):
        failed.append(_asked(scaler, posted, spawner, starts=False))
        name = _asked(scaler, posted, spawner, starts=True)
        core.join(name, role="rollout", version=0)
        scaler.sampled(name)
        sampled.append(name)
        (drained,) = scaler.scale(-1, None, reason="operator")[0]["removing"]
        core.lost(drained)
    assert list(scaler.failed_starts) == failed[-4:] and list(scaler.first_sample_s) == sampled[-4:]
    assert scaler.failed_starts[failed[-1]] == f"sbatch refused {failed[-1]}"
