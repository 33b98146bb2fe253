"""A job of weeks whose units are asked for, fail to start, sample, are lost and given up on, over and over: what the
scaler reports of them (`scale --wait`'s first samples and failed starts, the status reply's resilience and scale
events, summary.json) is the latest few and counts, not an entry per unit or event the job ever had."""

from __future__ import annotations

from typing import Any

from rlctl.agents.scaling import Scaler
from rlctl.agents.views import agent_gauges, status, summary
from rlctl.metrics import JobMetrics
from tests.unit.agents.test_agents_healing import FakeSpawner, deliver, setup
from tests.unit.agents.test_agents_views import _snapshot

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


def _given_up(scaler: Scaler, posted: list[Any], spawner: FakeSpawner, lost: str, now: float) -> float:
    """`lost` is lost and every attempt to replace it fails to start: given up on; the loop's clock after."""
    spawner.fail = 10**9
    scaler.core.lost(lost)
    scaler.replace(lost, now=now)
    while lost in scaler.replacing:
        scaler.tick(now)
        r = scaler.replacing.get(lost)
        if r is not None and r.unit is not None and r.error is None:  # an attempt started: its start fails
            deliver(scaler, posted)
        now += 1.0
    return now


def test_the_units_given_up_on_are_counted_and_the_latest_named_in_one_line(tmp_path: Any) -> None:
    """A unit lost whose every replacement failed to start, then one asked for in its place, over and over: status
    names the latest `gave_up_kept` (with why) and counts every one, and its note is one line naming the latest three,
    versus every unit given up on, with why, in one note."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    scaler.gave_up_kept = 4
    now, lost = 0.0, []
    victim = "rollout-1"
    for _ in range(UNITS):
        now = _given_up(scaler, posted, spawner, victim, now)
        lost.append(victim)
        victim = _asked(scaler, posted, spawner, starts=True)  # in its place
        core.join(victim, role="rollout", version=0)
        scaler.sampled(victim)
    res = scaler.resilience()
    assert res["gave_up"] == lost[-4:] and res["gave_up_total"] == UNITS
    assert list(scaler.gave_up_why) == lost[-4:]
    a, b, c = lost[-3:]
    (_, failed), _ = spawner.calls[-2:]  # the last attempt to replace c, then the unit asked for in its place
    assert res["note"] == (
        f"running with fewer rollout units: {UNITS} units given up on (latest: {a}, {b}, {c}); {c}'s last attempt: "
        f"sbatch refused rollout-{failed}"
    )


def test_the_scale_events_listed_are_the_latest_and_every_one_is_counted(tmp_path: Any) -> None:
    """`rlctl scale +1` then `-1`, over and over, and a resumed run that continues a history of as many: status lists
    the last 10, summary.json the latest SCALE_EVENTS_KEPT, says how many it left out and counts every one per
    direction, versus every scale event the job had, held and written into each summary."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    made = []
    for _ in range(150):
        name = _asked(scaler, posted, spawner, starts=True)
        core.join(name, role="rollout", version=0)
        (drained,) = scaler.scale(-1, None, reason="operator")[0]["removing"]
        core.lost(drained)
        made += [("out", name), ("in", drained)]
    for log in (scaler.scale_log, _resumed(scaler, made)):
        s = summary(_snapshot(core, [], scale_log=log))
        listed = [(e["direction"], e["agent"]) for e in s["scale_events"]]
        assert 0 < len(listed) < len(made) and listed == made[-len(listed) :]
        assert s["scale_events_unlisted"] == len(made) - len(listed)
        assert s["scale_totals"] == {"out": 150, "in": 150}
        st = status(_snapshot(core, [], scale_log=log), now=0.0)
        assert [(e["direction"], e["agent"]) for e in st["scale_events"]] == made[-10:]


def _resumed(scaler: Scaler, made: list[tuple[str, str]]) -> Any:
    """A resumed run's scaler, given the scale events of the job's history it continues (`ControllerAgent`)."""
    scaler.scale_log = [{"direction": d, "agent": a, "site": "a", "reason": "operator"} for d, a in made]
    return scaler.scale_log


def test_the_sites_of_units_gone_for_good_leave_the_placement_beyond_the_latest(tmp_path: Any) -> None:
    """Units asked for that failed to start, or joined and were drained, or lost and replaced, over and over: the
    placement holds the plan's agents, the units the job runs or waits for and the latest `gone_sites_kept` gone, versus
    the site of every unit the job ever started; the live units' gauges per site read as before, no unit without one."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    scaler.gone_sites_kept = 4
    started = []
    for k in range(UNITS):
        started.append(_asked(scaler, posted, spawner, starts=k % 3 != 0))
        if k % 3 == 0:
            continue  # its start failed
        core.join(started[-1], role="rollout", version=0)
        scaler.sampled(started[-1])
        if k % 3 == 1:  # drained
            (drained,) = scaler.scale(-1, None, reason="operator")[0]["removing"]
            core.lost(drained)
        else:  # lost: its replacement starts, joins and samples
            core.lost(started[-1])
            scaler.replace(started[-1], now=float(k))
            scaler.tick(float(k))
            deliver(scaler, posted)
            (new,) = scaler.pending_units()
            core.join(new, role="rollout", version=0)
            scaler.tick(float(k) + 1.0)
            scaler.sampled(new)
            started.append(new)
            (drained,) = scaler.scale(-1, None, reason="operator")[0]["removing"]  # the site's slot free again
            core.lost(drained)
    pending = _asked(scaler, posted, spawner, starts=True)  # asked for, not joined yet
    live = [u.name for u in core.live_units]
    gone = [n for n in started if n not in live]
    assert len(gone) > 4 and scaler.pending_units() == [pending] and scaler.replacing == {}
    plan = {"rollout-0": "a", "rollout-1": "a"}  # (the placement `setup` gives)
    assert scaler.placement.sites == plan | {n: "a" for n in [*live, *gone[-4:], pending]}
    metrics = JobMetrics()
    agent_gauges(metrics, core, {}, scaler.placement.sites, now=0.0)
    units = {s.labels["site"]: s.value for m in metrics.rollout_units.collect() for s in m.samples}
    assert units == {"a": len(live)}


def test_a_unit_that_took_a_given_up_place_and_stands_leaves_nothing_behind(tmp_path: Any) -> None:
    """Units asked for, each taking the place of a unit given up on, that sampled (or were lost and replaced): the
    scaler kept each one's given-up place for the rest of the run (`_filling`, consulted only if its start fails);
    the places counted for a resume are as before."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    now, victim = 0.0, "rollout-1"
    for k in range(UNITS):
        now = _given_up(scaler, posted, spawner, victim, now)
        victim = _asked(scaler, posted, spawner, starts=True)  # in its place
        core.join(victim, role="rollout", version=0)
        if k % 2:  # lost before its first sample: its replacement takes the place
            core.lost(victim)
            scaler.replace(victim, now=now)
            spawner.fail = len(spawner.calls)
            scaler.tick(now)
            deliver(scaler, posted)
            (victim,) = scaler.pending_units()
            core.join(victim, role="rollout", version=0)
            scaler.tick(now + 1.0)
        scaler.sampled(victim)
        assert scaler.unit_counts() == {"a": 2}
    assert scaler._filling == {} and scaler._unfilled == {"a": 0}


def test_a_unit_asked_for_and_drained_before_its_first_sample_is_no_longer_asked_for(tmp_path: Any) -> None:
    """`rlctl scale +1` then `-1` before the new unit sampled (scale -N drains the newest), over and over: each unit
    retired by its drain is no unit asked for any more once the loop turns (its request, join bound and site go),
    versus its request kept for the rest of the run (spawn_requested, join_since, its site in the placement: one
    each per such unit), and asked for again — counted in each checkpoint's units, its slot taken, then stopped as a
    unit that never joined — once the core no longer kept its name among the units gone (LEFT_KEPT later)."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    core.left.keep = 4  # (a job's keeps LEFT_KEPT; the scaler pinned the plan's rollout-0 and rollout-1)
    scaler.gone_sites_kept = 4
    for k in range(UNITS):
        name = _asked(scaler, posted, spawner, starts=True)
        core.join(name, role="rollout", version=0)
        (drained,) = scaler.scale(-1, None, reason="operator")[0]["removing"]
        assert drained == name and name in core.left  # retired at once: it held no sample
        scaler.tick(float(k))
    assert scaler.spawn_requested == {} and scaler.join_since == {} and scaler.unproven == {}
    assert scaler.pending_units() == [] and scaler.unit_counts() == {"a": 2}
    # the plan's, the latest 4 gone and the last (its site goes as the next unit is asked for: `_forget_sites`)
    assert len(scaler.placement.sites) == 2 + 4 + 1 and len(core.left) == 4


def test_the_scaler_pins_the_plans_units_among_the_units_gone(tmp_path: Any) -> None:
    """The scaler tells the plan's units not joined yet by their names among the core's units gone (`core.left`), so
    it pins them there as it is built: the plan's rollout-0, lost, then more units lost than the core keeps by name,
    is still a unit that joined, not one of the plan's to wait for, ask its site about and replace."""
    scaler, core, _, _, _ = setup(tmp_path, fail=0)
    core.left.keep = 2
    core.lost("rollout-0")
    for i in range(5):
        core.join(f"rollout-{10 + i}", role="rollout", version=0)
        core.lost(f"rollout-{10 + i}")
    assert core.known("rollout-0") and scaler._planned_unjoined() == [] and not scaler.awaits("rollout-0")
    assert list(core.left) == ["rollout-0", "rollout-13", "rollout-14"] and core.num_joined == 2 + 5
