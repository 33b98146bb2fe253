"""Self-healing rollout: a lost unit is replaced on its site, with bounded attempts and backoff; when every
attempt fails the job goes on with fewer units and says so."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import pytest

from rlctl.agents import healing, scaling
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, PromptSpec
from rlctl.agents.placement import Placement
from rlctl.agents.scaling import Scaler
from rlctl.checkpoint.controller import load_controller, save_controller
from rlctl.config.inventory import Site
from rlctl.config.pipeline import Rebalance
from rlctl.errors import LaunchError
from rlctl.launch.backends import record_agent
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.jobdir import JobDir
from rlctl.launch.spawn import Spawner
from rlctl.metrics import JobMetrics
from tests.unit.controller_harness import small_job


class FakeSpawner:
    def __init__(self, fail: int) -> None:
        self.fail, self.calls = fail, []  # the first `fail` starts raise

    def first_free_replica(self) -> int:
        return 2

    gone: tuple[str, ...] = ()  # the agents their sites say exited

    def exited(self, names: list[str]) -> list[str]:
        self.asked = [*getattr(self, "asked", []), list(names)]
        return [n for n in names if n in self.gone]

    waiting: tuple[str, ...] = ()  # the agents their schedulers still queue
    silent = False  # their sites cannot say whether they queue them (squeue failing, agents.jsonl unreadable)

    def queued(self, names: list[str]) -> dict[str, bool | None]:
        return {n: None if self.silent else n in self.waiting for n in names}

    def stop(self, name: str, *, grace_s: float) -> None:
        self.stopped = [*getattr(self, "stopped", []), name]

    def add_rollout(self, site: str, replica: int) -> None:
        self.calls.append((site, replica))
        if len(self.calls) <= self.fail:
            raise LaunchError(f"sbatch refused rollout-{replica}")

    def close(self) -> None:
        pass


def setup(
    tmp_path, fail: int, rebalance: Rebalance | None = None
) -> tuple[Scaler, ControllerCore, JobDir, list[Any], FakeSpawner]:
    jd = JobDir.create("heal", explicit=tmp_path / "job")
    cfg = CoreConfig(iterations=2, prompts_per_iteration=1, samples_per_prompt=1, max_new_tokens=4, mode="async", eta=1)
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1], 1)])
    core.join("trainer-0", role="trainer", version=0)
    for i in range(2):
        core.join(f"rollout-{i}", role="rollout", version=0)
    site = Site.model_validate(
        {"datacenter": "d", "gpu": "CPU", "scheduler": {"kind": "local"}, "nodes": [{"host": "h", "gpus": 3}]}
    )
    plan = {"trainer": {"site": "t", "ranks": 1}, "rollout": [{"site": "a", "units": 2}]}
    placement = Placement(plan, {"a": site}, {"rollout-0": "a", "rollout-1": "a"}, small_job("heal", iterations=2))
    posted: list[Any] = []
    # the scaler's own reads (a unit asked for, its start returned) on a clock that stands still at the controller's
    # start: the tests' ticks (`scaler.t0 + s`) alone move time, versus the machine's (a spawn thread run 1.2 s late
    # moved a unit's join bound past the tick that was to stop it: nothing posted within 60 s)
    start = time.monotonic()
    scaler = Scaler(
        jd,
        rebalance or Rebalance(),
        core=core,
        placement=placement,
        metrics=JobMetrics(),
        post=posted.append,
        clock=lambda: start,
    )
    spawner = FakeSpawner(fail)
    scaler.spawner = spawner  # type: ignore[assignment]
    return scaler, core, jd, posted, spawner


def next_post(posted: list[Any]) -> Any:
    """The post of the thread a tick started (a spawn, a stop, the sites asked). The bound is on the wait, not a
    timing assertion: a loaded 2-core CI machine can take seconds to schedule the thread, so it is generous."""
    deadline = time.monotonic() + 60
    while not posted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert posted, "the thread the tick started posted nothing within 60 s"
    return posted.pop()


def deliver(scaler: Scaler, posted: list[Any]) -> None:
    """What the controller's loop does with the spawn thread's post."""
    _, name, info = next_post(posted)
    scaler.spawned(name, info)


def replaced_once(scaler: Scaler, core: ControllerCore, posted: list[Any]) -> None:
    """rollout-1 lost at 0 s; its replacement rollout-2 starts and joins; the loop's turn at 1 s sees it."""
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=0.0)
    scaler.tick(0.0)
    deliver(scaler, posted)
    core.join("rollout-2", role="rollout", version=0)
    scaler.tick(1.0)


def replace_until_given_up(scaler: Scaler, posted: list[Any], *, now: float, until: float) -> None:
    """The loop's turns a second apart from `now` until the scaler gives up on rollout-1 or `until`: each attempt to
    replace it fails (a setup whose spawner fails them all)."""
    while "rollout-1" not in scaler.gave_up and now < until:
        scaler.tick(now)
        r = scaler.replacing.get("rollout-1")
        if r is not None and r.unit is not None and r.error is None:  # an attempt started: its spawn fails
            deliver(scaler, posted)
        now += 1.0


def given_up_on(scaler: Scaler, core: ControllerCore, posted: list[Any]) -> None:
    """rollout-1 lost at 0 s; every attempt to replace it fails, and the scaler gives up on it."""
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=0.0)
    replace_until_given_up(scaler, posted, now=0.0, until=200.0)


def test_a_lost_unit_is_replaced_on_its_site(tmp_path) -> None:
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=100.0)
    assert scaler.resilience()["note"] == "replacing rollout-1"
    scaler.tick(100.0)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2)]
    core.join("rollout-2", role="rollout", version=0)  # the replacement said hello
    scaler.tick(101.0)
    assert scaler.resilience() == {"replaced": 1, "replacing": [], "gave_up": [], "gave_up_total": 0, "note": None}
    ev = [e for e in jd.read_lines(jd.events) if e["event"] == "unit_replaced"]
    assert [(e["lost"], e["by"], e["attempts"]) for e in ev] == [("rollout-1", "rollout-2", 1)]


def test_failed_attempts_back_off_then_the_job_goes_on_with_fewer_units(tmp_path) -> None:
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=healing.REPLACE_ATTEMPTS)
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=0.0)
    now, starts = 0.0, []
    for _ in range(200):
        scaler.tick(now)
        r = scaler.replacing.get("rollout-1")
        if r is not None and r.unit is not None and r.error is None:  # an attempt started: its spawn fails
            starts.append(now)
            deliver(scaler, posted)
        now += 1.0
    assert len(spawner.calls) == healing.REPLACE_ATTEMPTS
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # the failure is counted on the loop's next turn (1 s here), then 5 s, then 10 s of backoff
    assert gaps == [1 + healing.REPLACE_BACKOFF_S * 2**i for i in range(len(gaps))]
    r = scaler.resilience()
    assert r["gave_up"] == ["rollout-1"] and r["note"].startswith("running with fewer rollout units")
    assert [e["event"] for e in jd.read_lines(jd.events) if e["event"] == "replace_gave_up"] == ["replace_gave_up"]


def test_the_count_of_replaced_units_continues_across_a_resume(tmp_path) -> None:
    scaler, core, jd, posted, _ = setup(tmp_path, fail=0)
    replaced_once(scaler, core, posted)
    assert scaler.replaced == 1
    state = {"iteration": 1, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": []}
    save_controller(jd, 1, state=state, ledger=core.ledger, trainer_digest="d" * 64, replaced=scaler.replaced)

    resumed, _, _, posted, _ = setup(tmp_path, fail=0)  # a resumed run's controller: a new scaler
    resumed.restore(replaced=load_controller(jd, 1).replaced)
    assert resumed.resilience()["replaced"] == 1
    resumed.core.lost("rollout-0")
    resumed.replace("rollout-0", now=0.0)
    resumed.tick(0.0)
    deliver(resumed, posted)
    resumed.core.join("rollout-2", role="rollout", version=0)
    resumed.tick(1.0)
    assert resumed.resilience() == {"replaced": 2, "replacing": [], "gave_up": [], "gave_up_total": 0, "note": None}


def test_the_unit_cap_is_named_where_it_stops_a_unit_from_being_added(tmp_path) -> None:
    """Site a has a free GPU for a third unit, but `rebalance.max_rollout_units: 2`: the rule's reading and
    `rlctl scale +1` name the cap, not the free slots."""
    cfg = Rebalance(auto=True, max_rollout_units=2, window_iterations=1, cooldown_iterations=1)
    scaler, _, _, _, spawner = setup(tmp_path, fail=0, rebalance=cfg)
    assert scaler.free_slots() == {"a": 1}
    reply, _ = scaler.scale(1, None, reason="operator")
    assert reply == {
        "error": "only 0 of 1 units fit: rebalance.max_rollout_units is 2 and the job has 2 unit(s), live and starting"
    }
    row: dict[str, Any] = {"iteration": 0, "t_gen_s": 5.0, "t_train_s": 1.0, "period_s": 5.0, "trainer_wait_s": 4.0}
    scaler.rebalance(row)
    assert scaler.reading is not None and not scaler.reading.add
    assert (
        scaler.reading.why == "δ ≥ δ' but rebalance.max_rollout_units is 2 and the job has 2 unit(s), live and starting"
    )
    assert spawner.calls == []


def test_a_scaled_unit_whose_start_failed_is_reported_to_scale_wait(tmp_path) -> None:
    """`rlctl scale --wait` reads the controller's status: a unit whose start failed is named there with its error
    (before, it was only an event, and the wait ran to its timeout, 300 s by default)."""
    scaler, _, _, posted, _ = setup(tmp_path, fail=1)
    reply, _ = scaler.scale(+1, None, reason="operator")
    deliver(scaler, posted)
    assert reply["adding"] == ["rollout-2"]
    assert scaler.failed_starts == {"rollout-2": "sbatch refused rollout-2"} and not scaler.first_sample_s


def test_a_scaled_unit_lost_before_its_first_sample_is_reported_to_scale_wait(tmp_path) -> None:
    """It joined and crashed: its replacement has another name, and `rlctl scale --wait` waited for the lost one to
    its timeout."""
    scaler, core, _, posted, _ = setup(tmp_path, fail=0)
    reply, _ = scaler.scale(+1, None, reason="operator")
    assert reply["adding"] == ["rollout-2"]
    deliver(scaler, posted)
    core.join("rollout-2", role="rollout", version=0)
    core.lost("rollout-2")
    scaler.replace("rollout-2", now=0.0)
    assert scaler.failed_starts == {
        "rollout-2": "lost before its first sample (its log says why); a replacement is started"
    }
    assert "rollout-2" in scaler.replacing  # replaced as any lost unit


def test_a_resume_starts_again_the_units_a_scale_added_once_the_planned_ones_joined(tmp_path) -> None:
    # `rlctl scale +1` (3 units on site a, 2 planned), then a resume: it went back to the 2 planned units, unsaid
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    scaler.scale(1, "a", reason="manual")
    deliver(scaler, posted)
    core.join("rollout-2", role="rollout", version=0)
    assert scaler.unit_counts() == {"a": 3}
    state = {"iteration": 1, "ranker": {"tokens": [], "lengths": []}, "rebalance_window": []}
    state["rollout_units"] = scaler.unit_counts()
    save_controller(jd, 1, state=state, ledger=core.ledger, trainer_digest="d" * 64)

    # a resumed run's controller: a new scaler, before the launcher's units joined
    resumed, core2, _, posted, spawner = setup(tmp_path / "resumed", fail=0)
    core2.units.pop("rollout-1")
    resumed.restore(replaced=0, units=load_controller(jd, 1).rollout_units, now=0.0)
    resumed.tick(1.0)
    assert spawner.calls == []  # rollout-1 of the plan has not joined: its GPU slice is the launcher's
    core2.join("rollout-1", role="rollout", version=0)
    resumed.tick(2.0)
    deliver(resumed, posted)
    assert spawner.calls == [("a", 2)]
    scale = [e for e in resumed.jobdir.read_lines(resumed.jobdir.events) if e["event"] == "scale"]
    got = [(e["direction"], e["agent"], e["site"], e["reason"]) for e in scale]
    assert got == [("out", "rollout-2", "a", "resume")]
    resumed.tick(3.0)  # once
    assert len(spawner.calls) == 1


def test_a_checkpoint_without_unit_counts_resumes_with_the_planned_units(tmp_path) -> None:
    scaler, _, _, _, spawner = setup(tmp_path, fail=0)
    scaler.restore(replaced=0, units=None, now=0.0)
    scaler.tick(1000.0)
    assert spawner.calls == []
    scaler.restore(replaced=0, units={"a": 2}, now=0.0)  # the plan's count: nothing beyond it to start again
    scaler.tick(1000.0)
    assert spawner.calls == []


def test_past_the_restore_wait_the_planned_units_not_joined_yet_are_not_started_twice(tmp_path) -> None:
    """The plan's 2 units still queued or loading after RESTORE_WAIT_S: only the one `scale` added is started again
    (before, each of the 3 the checkpoint's run had: 5 units once the plan's joined)."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    for name in ("rollout-0", "rollout-1"):
        core.units.pop(name)
    scaler.restore(replaced=0, units={"a": 3}, now=0.0)
    scaler.tick(scaling.RESTORE_WAIT_S - 1)
    assert spawner.calls == []
    scaler.tick(scaling.RESTORE_WAIT_S + 1)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2)]


def test_the_controller_keeps_its_units_per_site_in_each_checkpoint(tmp_path) -> None:
    from tests.unit.controller_harness import HandledController

    h = HandledController(tmp_path, small_job("units", iterations=6), listen="inproc://units-per-site")
    try:
        h.ctl._checkpoint_due(2)
        assert h.ctl.writing[2][0]["rollout_units"] == {"local": 2}
    finally:
        h.close()


def test_a_replacement_lost_before_its_first_sample_is_a_failed_attempt_of_its_chain(tmp_path) -> None:
    """A unit that crashes right after joining (hang_timeout_s past what faulthandler takes, a broken node): each
    replacement joins, then is lost before it produced a sample. Before, each loss started a new chain and the job
    replaced units without end (63 units in 150 s); now they are attempts of the first loss's chain, and after
    REPLACE_ATTEMPTS the job goes on with fewer units, saying why."""
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=0.0)
    now = 0.0
    for _ in range(200):
        scaler.tick(now)
        started = [r.unit for r in scaler.replacing.values() if r.unit is not None and not core.known(r.unit)]
        for unit in started:  # it joins, then crashes
            deliver(scaler, posted)
            core.join(unit, role="rollout", version=0)
            scaler.tick(now)
            core.lost(unit)
            scaler.replace(unit, now=now)
        now += 1.0
    assert len(spawner.calls) == healing.REPLACE_ATTEMPTS
    res = scaler.resilience()
    assert res["replaced"] == 0 and res["replacing"] == [] and res["gave_up"] == ["rollout-1"]
    assert res["note"] == (
        "running with fewer rollout units: 1 unit given up on (latest: rollout-1); rollout-1's last attempt: rollout-4 "
        "was lost before its first sample"
    )
    evs = [
        e for e in jd.read_lines(jd.events) if e["event"] in ("unit_replaced", "replacement_lost", "replace_gave_up")
    ]
    assert [(e["event"], e.get("by"), e["attempts"]) for e in evs] == [
        ("unit_replaced", "rollout-2", 1),
        ("replacement_lost", "rollout-2", 1),
        ("unit_replaced", "rollout-3", 2),
        ("replacement_lost", "rollout-3", 2),
        ("unit_replaced", "rollout-4", 3),
        ("replacement_lost", "rollout-4", 3),
        ("replace_gave_up", None, 3),
    ]


def test_the_units_asked_for_that_were_lost_or_failed_to_start_leave_no_join_bound_behind(tmp_path) -> None:
    """A job whose units are replaced for weeks keeps the join bounds (`join_since`) of the units it waits for, not
    of every replacement lost before its first sample or start that failed (each stayed for the job's life)."""
    scaler, core, _, posted, _ = setup(tmp_path, fail=0)
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=0.0)
    now = 0.0
    for _ in range(50):  # each replacement joins, then is lost before its first sample
        scaler.tick(now)
        for unit in [r.unit for r in scaler.replacing.values() if r.unit is not None and not core.known(r.unit)]:
            deliver(scaler, posted)
            assert unit in scaler.join_since  # its start returned: its bound counts
            core.join(unit, role="rollout", version=0)
            scaler.tick(now)
            core.lost(unit)
            scaler.replace(unit, now=now)
        now += 1.0
    assert scaler.resilience()["gave_up"] == ["rollout-1"]
    reply, _ = scaler.scale(+1, None, reason="operator")  # and a unit asked for, lost before its first sample
    deliver(scaler, posted)
    core.join(reply["adding"][0], role="rollout", version=0)
    core.lost(reply["adding"][0])
    scaler.replace(reply["adding"][0], now=now)
    assert scaler.join_since == {} and scaler.spawn_requested == {}


def test_a_replacement_that_produced_a_sample_stands(tmp_path) -> None:
    """Once a replacement has produced a sample its loss is a loss of its own, replaced by a new chain."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    replaced_once(scaler, core, posted)
    scaler.sampled("rollout-2")
    core.lost("rollout-2")
    scaler.replace("rollout-2", now=2.0)
    assert scaler.resilience()["note"] == "replacing rollout-2" and scaler.replacing["rollout-2"].attempts == 0
    assert scaler.replaced == 1 and spawner.calls == [("a", 2)]


def test_a_resume_starts_again_the_units_that_fit_when_not_all_do(tmp_path) -> None:
    """The checkpoint's run had 5 units on site a, which has a slot for 1 beyond the plan's 2 now: that one starts,
    the 2 others are a `scale_failed` (before, none started: the site's restore was all or nothing)."""
    scaler, _, _, posted, spawner = setup(tmp_path, fail=0)
    scaler.restore(replaced=0, units={"a": 5}, now=0.0)
    scaler.tick(1.0)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2)]
    failed = [e for e in scaler.jobdir.read_lines(scaler.jobdir.events) if e["event"] == "scale_failed"]
    assert [(e["site"], e["units"]) for e in failed] == [("a", 2)], failed
    assert failed[0]["error"] == "only 1 of 3 units fit on a: free slots a 1", failed


def test_the_plans_units_that_have_not_joined_yet_hold_their_slots(tmp_path) -> None:
    """The launcher starts the plan's units; until they join, `rlctl status` said their slots were free (`free slots
    local 3` of a 4-slot site holding the trainer and two units starting) and `rlctl scale` started units there."""
    scaler, core, _, _, spawner = setup(tmp_path, fail=0)
    joined = ControllerCore(core.cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1], 1)])
    joined.join("rollout-0", role="rollout", version=0)  # rollout-1, the plan's, is still starting
    scaler.core = joined
    assert scaler.free_slots() == {"a": 1}
    reply, _ = scaler.scale(2, None, reason="operator")
    assert reply == {"error": "only 1 of 2 units fit on a: free slots a 1"} and spawner.calls == []


def _asked(scaler: Scaler, posted: list[Any], now: float) -> list[str]:
    """The loop's turn at `now` (seconds after the controller started): the sites asked in a thread, the answer
    delivered as the controller's loop does; the units said gone."""
    scaler.tick(scaler.t0 + now)
    what, _, (gone, queued) = next_post(posted)
    assert what == "not_joining"
    scaler.not_joining(gone, now=scaler.t0 + now, queued=queued)
    return gone


def test_a_planned_unit_that_exited_before_joining_frees_its_slot_and_is_replaced(tmp_path) -> None:
    """rollout-1 of the plan died loading its model: it never joined, so nothing noticed, and it held its slot for
    good (`rlctl scale +1`: no free slot on a full site; the rebalance rule and replacements: none started)."""
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    joined = ControllerCore(core.cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1], 1)])
    joined.join("rollout-0", role="rollout", version=0)
    scaler.core = joined
    spawner.gone = ("rollout-1",)
    scaler.tick(scaler.t0 + 30.0)  # too early to ask: it may be loading a large model, or queued
    assert posted == [] and not hasattr(spawner, "asked")
    assert _asked(scaler, posted, 61.0) == ["rollout-1"] and spawner.asked == [["rollout-1"]]
    assert scaler.free_slots() == {"a": 2}
    assert [(e["agent"], e["site"]) for e in jd.read_events() if e["event"] == "unit_exited_before_joining"] == [
        ("rollout-1", "a")
    ]
    scaler.tick(scaler.t0 + 62.0)  # its replacement starts on its site
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2)] and scaler.free_slots() == {"a": 1}


def test_a_unit_asked_for_that_exited_before_joining_is_a_failed_start_and_one_still_starting_keeps_its_slot(
    tmp_path,
) -> None:
    scaler, _, _, posted, spawner = setup(tmp_path, fail=0)
    reply, _ = scaler.scale(1, None, reason="operator")
    deliver(scaler, posted)
    assert reply["adding"] == ["rollout-2"] and scaler.free_slots() == {"a": 0}
    scaler.spawn_requested["rollout-2"] = scaler.t0  # asked for as the controller started
    assert _asked(scaler, posted, 61.0) == []  # it still runs (queued in SLURM, loading): its slot stays taken
    assert scaler.free_slots() == {"a": 0}
    assert scaler.tick(scaler.t0 + 62.0) == [] and posted == []  # asked again only after UNJOINED_CHECK_S
    spawner.gone = ("rollout-2",)
    assert _asked(scaler, posted, 122.0) == ["rollout-2"]
    assert scaler.free_slots() == {"a": 1} and scaler.failed_starts == {
        "rollout-2": "exited before it joined (its log says why)"
    }
    assert scaler.replacing == {}  # the operator asked for it: told, not restarted


def test_a_failed_look_at_the_sites_is_answered_and_asked_again(tmp_path) -> None:
    """The sites' answer is what lets the loop ask again: a look that failed in a way no one foresaw (an agents.jsonl
    with bytes that are not UTF-8) is answered with none gone, and the next look comes UNJOINED_CHECK_S later, versus
    a thread that ended unanswered and no unit asked about again for the rest of the run."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    joined = ControllerCore(core.cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1], 1)])
    joined.join("rollout-0", role="rollout", version=0)
    scaler.core = joined

    def damaged(names: list[str]) -> list[str]:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    spawner.exited = damaged  # type: ignore[method-assign]
    assert _asked(scaler, posted, 61.0) == []
    spawner.exited = FakeSpawner.exited.__get__(spawner)  # type: ignore[method-assign]
    spawner.gone = ("rollout-1",)
    assert _asked(scaler, posted, 122.0) == ["rollout-1"]


def test_a_unit_whose_start_failed_while_its_site_was_asked_is_not_replaced(tmp_path) -> None:
    """The sites were asked about rollout-2 (asked for by a scale); its start then failed (`spawned` said so and it
    left `spawn_requested`); the answer 'exited' came after: it was replaced as though it were the plan's."""
    scaler, _, jd, _, _ = setup(tmp_path, fail=0)
    scaler.not_joining(["rollout-2"], now=scaler.t0 + 61.0)  # neither the plan's nor asked for (any more)
    assert scaler.replacing == {} and "rollout-2" not in scaler.never_joined
    assert not [e for e in jd.read_events() if e["event"] == "unit_exited_before_joining"]


def test_a_replacement_still_loading_keeps_its_slot_and_one_that_exited_is_a_failed_attempt(tmp_path) -> None:
    """rollout-2 replaces rollout-1 and loads a large model for minutes: past a fixed 120 s it counted as a failed
    attempt, left `spawn_requested`, and the next attempt started another unit beside it, on the same slot's GPUs
    (both then ran). Now its site is asked, as for any unit not joined: one still running keeps its slot and its
    chain waits; one that exited is a failed attempt, and the next starts after the backoff."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=t0)
    scaler.tick(t0)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2)] and scaler.replacing["rollout-1"].unit == "rollout-2"
    assert _asked(scaler, posted, 61.0) == [] and spawner.asked == [["rollout-2"]]  # it still runs
    for later in (181.0, 600.0):  # minutes loading: no second unit beside it
        scaler._unjoined_at = t0 + later - 1.0  # looked a second ago: none now
        scaler.tick(t0 + later)
        assert spawner.calls == [("a", 2)] and scaler.replacing["rollout-1"].unit == "rollout-2"
        assert posted == []
    assert scaler.free_slots() == {"a": 1}  # site a's 3 slots: rollout-0, and rollout-2 loading
    spawner.gone = ("rollout-2",)
    assert _asked(scaler, posted, 661.0) == ["rollout-2"]
    scaler.tick(t0 + 662.0)  # its chain counts the failed attempt and backs off
    r = scaler.replacing["rollout-1"]
    assert (r.unit, r.attempts, r.why) == (None, 1, "exited before it joined (its log says why)")
    assert scaler.failed_starts == {} and "rollout-2" not in scaler.spawn_requested
    scaler.tick(r.due)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2), ("a", 3)]  # the next attempt


def test_a_replacement_that_never_joins_though_it_runs_is_stopped_past_the_bound_and_is_a_failed_attempt(
    tmp_path, caplog
) -> None:
    """rollout-2 replaces rollout-1, and its load hangs (a lock, a mount): its site says it still runs, so it held
    its slot for the rest of the run and its chain waited for ever. Past JOIN_BOUND_FACTOR × the longest a unit took
    to join (at least JOIN_BOUND_MIN_S) it is stopped, and counted a failed attempt, in one log line."""
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 600.0)  # the plan's units joined 10 min in: the bound is 4 × that, 40 min
    assert scaler.join_bound_s() == pytest.approx(2400.0)
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=t0 + 600.0)
    scaler.tick(t0 + 600.0)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2)]
    for later in (1800.0, 2999.0):  # its site says it still runs: it keeps its slot, its chain waits
        scaler._unjoined_at = t0 + later  # (the sites just asked)
        scaler.tick(t0 + later)
        assert posted == [] and not hasattr(spawner, "stopped")
    caplog.set_level(logging.WARNING, logger="rlctl.agents.healing")
    scaler._unjoined_at = t0 + 3001.0
    scaler.tick(t0 + 3001.0)  # past 2400 s since its attempt started
    what, name, why = next_post(posted)
    assert (what, name) == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]
    core.join("rollout-2", role="rollout", version=0)  # it joined as it was stopped: not counted replaced
    scaler.tick(t0 + 3002.0)
    assert scaler.replaced == 0
    scaler.unjoined_stopped(name, why)
    scaler.tick(t0 + 3003.0)
    r = scaler.replacing["rollout-1"]
    expected = "rollout-2 did not join within 2400 s though its site said it ran (its log says why); stopped"
    assert (r.unit, r.attempts, r.why) == (None, 1, expected)
    assert [m.getMessage() for m in caplog.records] == [
        f"controller: replacing rollout-1 failed ({expected}); next attempt in 5 s"
    ]
    ev = [e for e in jd.read_events() if e["event"] == "replacement_not_joined"]
    assert [(e["lost"], e["by"], e["attempts"]) for e in ev] == [("rollout-1", "rollout-2", 1)]
    assert scaler.free_slots() == {"a": 1}  # rollout-0 and rollout-2's join; rollout-2's slot is no attempt's now
    core.lost("rollout-2")
    scaler.replace("rollout-2", now=t0 + 3004.0)  # its loss, once stopped, is no new chain
    assert list(scaler.replacing) == ["rollout-1"]
    scaler.tick(r.due)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2), ("a", 3)]  # the next attempt


def test_a_replacement_stopped_for_not_joining_that_its_site_then_says_exited_is_counted_once_as_not_joined(
    tmp_path,
) -> None:
    """The sites, asked about units not joined while the replacement stopped for not joining was being stopped, said
    it exited: that answer counted the attempt failed as 'exited before it joined (its log says why)', with an
    event unit_exited_before_joining, and the stop's own count found no attempt left: no replacement_not_joined,
    the reason its status gave wrong."""
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 600.0)  # the bound is 40 min
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=t0 + 600.0)
    scaler.tick(t0 + 600.0)
    deliver(scaler, posted)
    scaler._unjoined_at = t0 + 3001.0  # (the sites just asked)
    scaler.tick(t0 + 3001.0)  # past the bound: stopped, in a thread
    stopped = next_post(posted)
    spawner.gone = ("rollout-2",)  # the sites' answer, as the stop took it down
    scaler.not_joining(["rollout-2"], now=t0 + 3002.0)
    scaler.tick(t0 + 3002.0)
    scaler.unjoined_stopped(stopped[1], stopped[2])
    scaler.tick(t0 + 3003.0)
    r = scaler.replacing["rollout-1"]
    assert (r.unit, r.attempts) == (None, 1)
    assert r.why == "rollout-2 did not join within 2400 s though its site said it ran (its log says why); stopped"
    events = [e["event"] for e in jd.read_events()]
    assert "unit_exited_before_joining" not in events and events.count("replacement_not_joined") == 1


def test_a_replacement_its_scheduler_still_queues_is_not_stopped_for_not_joining(tmp_path) -> None:
    """A replacement pending in a busy SLURM queue is not loading: its join bound counts from when it leaves the
    queue, versus stopped (and resubmitted at the back of the queue) once the bound passed since its submission."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 600.0)  # the plan's units joined 10 min in: the bound is 40 min
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=t0 + 600.0)
    scaler.tick(t0 + 600.0)
    deliver(scaler, posted)
    assert spawner.calls == [("a", 2)]
    spawner.waiting = ("rollout-2",)
    assert _asked(scaler, posted, 2900.0) == []  # still queued 38 min after its submission
    scaler._unjoined_at = t0 + 3100.0  # (the sites just asked)
    scaler.tick(t0 + 3100.0)  # 42 min after its submission, 3 min after it was last seen queued
    assert posted == [] and not hasattr(spawner, "stopped")
    spawner.waiting = ()  # it starts, and hangs loading
    scaler._unjoined_at = t0 + 2900.0 + 2399.0
    scaler.tick(t0 + 2900.0 + 2399.0)
    assert posted == [] and not hasattr(spawner, "stopped")
    scaler._unjoined_at = t0 + 2900.0 + 2401.0
    scaler.tick(t0 + 2900.0 + 2401.0)  # the bound passed since it was last seen queued
    assert next_post(posted)[:2] == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]


def _stop_posted(posted: list[Any]) -> tuple[str, str, tuple[str, bool]]:
    what, name, why = next_post(posted)
    return what, name, why


def test_a_unit_asked_for_that_never_joins_though_it_runs_is_stopped_past_the_bound_and_is_a_failed_start(
    tmp_path, caplog
) -> None:
    """rollout-2, added by `rlctl scale +1`, hangs loading (a lock, a mount) while its site says it runs: it held its
    slot for the rest of the run and `scale --wait` waited for it for ever (replacements had a bound, units asked for
    none). Past the same bound it is stopped and is a failed start; its slot is free again."""
    scaler, _, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)  # the plan's units joined a second in: the bound is its least, 30 min
    reply, _ = scaler.scale(1, None, reason="operator")
    deliver(scaler, posted)
    assert reply["adding"] == ["rollout-2"] and scaler.free_slots() == {"a": 0}
    scaler.spawn_requested["rollout-2"] = t0  # asked for as the controller started
    assert scaler.join_bound_s() == pytest.approx(1800.0)
    scaler._unjoined_at = t0 + 1799.0  # (the sites just asked: it runs)
    scaler.tick(t0 + 1799.0)
    assert posted == [] and not hasattr(spawner, "stopped")
    caplog.set_level(logging.WARNING, logger="rlctl.agents.healing")
    scaler._unjoined_at = t0 + 1801.0
    scaler.tick(t0 + 1801.0)
    what, name, why = _stop_posted(posted)
    assert (what, name) == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]
    scaler.tick(t0 + 1802.0)  # stopping: not stopped twice, its slot still held
    assert posted == [] and spawner.stopped == ["rollout-2"] and scaler.free_slots() == {"a": 0}
    scaler.unjoined_stopped(name, why)
    expected = "rollout-2 did not join within 1800 s though its site said it ran (its log says why); stopped"
    assert scaler.failed_starts == {"rollout-2": expected} and scaler.free_slots() == {"a": 1}
    assert [(e["agent"], e["error"]) for e in jd.read_events() if e["event"] == "scale_failed"] == [
        ("rollout-2", expected)
    ]
    assert [m.getMessage() for m in caplog.records] == [f"controller: rollout-2 on a: {expected}"]


def _stop_fails(name: str, *, grace_s: float) -> None:
    raise LaunchError("scancel: timed out")


def test_a_unit_asked_for_that_joins_as_it_is_stopped_and_whose_stop_fails_is_no_failed_start(tmp_path) -> None:
    """rollout-2, added by `rlctl scale +1`, joined while it was being stopped for not joining, and the stop failed:
    it was said a failed start (scale_failed, `scale --wait` told so) though it ran in the job, and a replacement was
    never started when it was lost later. It joined: no failure, its first sample counted, replaced if lost."""
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)  # the bound is its least, 30 min
    scaler.scale(1, None, reason="operator")
    deliver(scaler, posted)
    scaler.spawn_requested["rollout-2"] = t0
    spawner.stop = _stop_fails  # type: ignore[method-assign]
    scaler._unjoined_at = t0 + 1801.0
    scaler.tick(t0 + 1801.0)
    what, name, result = _stop_posted(posted)
    assert what == "unjoined_stopped" and result == (
        "rollout-2 did not join within 1800 s though its site said it ran (its log says why); stopping it failed: "
        "scancel: timed out",
        False,
    )
    core.join("rollout-2", role="rollout", version=0)  # as it was being stopped
    scaler.unjoined_stopped(name, result)
    assert scaler.failed_starts == {} and "scale_failed" not in [e["event"] for e in jd.read_events()]
    scaler.sampled("rollout-2")
    assert list(scaler.first_sample_s) == ["rollout-2"]
    core.lost("rollout-2")
    scaler.replace("rollout-2", now=t0 + 1900.0)
    assert list(scaler.replacing) == ["rollout-2"]


def test_a_replacement_that_joins_as_it_is_stopped_and_whose_stop_fails_counts_replaced(tmp_path) -> None:
    """The chain's rollout-2 joined while it was being stopped for not joining, and the stop failed: a failed attempt
    was counted, and another unit started beside the one that ran in the job."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 600.0)  # the bound is 40 min
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=t0 + 600.0)
    scaler.tick(t0 + 600.0)
    deliver(scaler, posted)
    spawner.stop = _stop_fails  # type: ignore[method-assign]
    scaler._unjoined_at = t0 + 3001.0
    scaler.tick(t0 + 3001.0)
    _, name, result = _stop_posted(posted)
    core.join("rollout-2", role="rollout", version=0)
    scaler.unjoined_stopped(name, result)
    scaler.tick(t0 + 3002.0)
    assert scaler.resilience()["replaced"] == 1 and scaler.replacing == {} and spawner.calls == [("a", 2)]


def test_a_unit_asked_for_whose_start_failed_or_that_exited_leaves_no_join_bound(tmp_path) -> None:
    """`join_since` kept the entry of a unit asked for that exited before it joined, or whose start failed, for the
    rest of the run: it goes where the unit leaves `spawn_requested`."""
    scaler, _, _, posted, spawner = setup(tmp_path, fail=0)
    scaler.scale(1, None, reason="operator")
    deliver(scaler, posted)
    assert list(scaler.join_since) == ["rollout-2"]
    spawner.gone = ("rollout-2",)
    assert _asked(scaler, posted, 61.0) == ["rollout-2"]
    assert scaler.join_since == {} and scaler.spawn_requested == {}
    scaler.join_since["rollout-3"] = scaler.t0  # (its scheduler seen queueing it) and then its start failed
    scaler.spawn_requested["rollout-3"] = scaler.t0
    scaler.spawned("rollout-3", ("a", "operator", "sbatch: refused"))
    assert scaler.join_since == {}


def test_a_unit_asked_for_that_joins_as_it_is_stopped_for_not_joining_is_said_a_failed_start(tmp_path) -> None:
    """rollout-2, added by `rlctl scale +1`, joins and produces its first sample just as it is stopped past the join
    bound: its first sample dropped its request, so the stop's end found nothing to count and said nothing — no
    event, `scale --wait` told it stood — while the unit was gone (its loss, one stopped for not joining, is not
    replaced). It is a failed start, saying it joined as it was being stopped."""
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)  # the plan's units joined a second in: the bound is its least, 30 min
    scaler.scale(1, None, reason="operator")
    deliver(scaler, posted)
    scaler.spawn_requested["rollout-2"] = scaler.join_since["rollout-2"] = t0  # asked for as the controller started
    scaler._unjoined_at = t0 + 1801.0  # (the sites just asked: it runs)
    scaler.tick(t0 + 1801.0)
    what, name, why = _stop_posted(posted)
    assert (what, name) == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]
    core.join("rollout-2", role="rollout", version=0)  # it joined as it was stopped, and sampled
    scaler.sampled("rollout-2")
    scaler.unjoined_stopped(name, why)
    expected = (
        "rollout-2 did not join within 1800 s though its site said it ran (its log says why); stopped "
        "(it joined as it was being stopped)"
    )
    assert scaler.failed_starts == {"rollout-2": expected} and scaler.first_sample_s == {}
    assert [(e["agent"], e["error"]) for e in jd.read_events() if e["event"] == "scale_failed"] == [
        ("rollout-2", expected)
    ]
    core.lost("rollout-2")  # its connection ends: it is neither running nor pending, and not replaced
    scaler.replace("rollout-2", now=t0 + 1802.0)
    assert scaler.pending_units() == [] and [u.name for u in core.live_units] == ["rollout-0", "rollout-1"]
    assert scaler.replacing == {} and scaler.unit_counts() == {"a": 2} and scaler.free_slots() == {"a": 1}


def test_a_unit_asked_for_its_scheduler_still_queues_is_not_stopped_for_not_joining(tmp_path) -> None:
    scaler, _, _, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)  # the plan's units joined a second in: the bound is its least, 30 min
    scaler.scale(1, None, reason="rebalance")
    deliver(scaler, posted)
    scaler.spawn_requested["rollout-2"] = t0
    spawner.waiting = ("rollout-2",)
    assert _asked(scaler, posted, 1700.0) == []  # still queued 28 min after the request
    scaler._unjoined_at = t0 + 1900.0
    scaler.tick(t0 + 1900.0)  # 32 min after the request, 3 min after it was last seen queued
    assert posted == [] and not hasattr(spawner, "stopped")
    scaler._unjoined_at = t0 + 1700.0 + 1801.0
    scaler.tick(t0 + 1700.0 + 1801.0)  # the bound passed since it was last seen queued
    assert _stop_posted(posted)[:2] == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]


def test_a_unit_last_said_queued_whose_sites_cannot_say_is_not_stopped_for_not_joining(tmp_path) -> None:
    # asking its sites raised (squeue, sacct, a damaged agents.jsonl): the answer read as "none queued", so the join
    # bound of rollout-2, still waiting in SLURM's queue, ran on from when it was last seen queued and it was stopped
    scaler, _, _, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)
    scaler.scale(1, None, reason="rebalance")
    deliver(scaler, posted)
    scaler.spawn_requested["rollout-2"] = t0
    spawner.waiting = ("rollout-2",)
    assert _asked(scaler, posted, 1700.0) == []  # seen queued 28 min after the request

    def cannot_say(names: list[str]) -> list[str]:
        raise LaunchError("squeue: timed out")

    spawner.exited = cannot_say  # type: ignore[method-assign]
    spawner.silent = True
    scaler._unjoined_at = t0 - 1.0
    assert _asked(scaler, posted, 3400.0) == []  # its sites could not say: queued, as they last said
    scaler._unjoined_at = t0 + 3501.0
    scaler.tick(t0 + 3501.0)  # the bound passed since it was seen queued, not since its sites could not say
    assert posted == [] and not hasattr(spawner, "stopped")
    assert "rollout-2" in scaler.pending_units()


def test_a_unit_last_said_queued_whose_sites_never_say_again_is_stopped_once_its_bound_runs(tmp_path) -> None:
    # asking its sites raised at every turn (a damaged agents.jsonl): rollout-2, last seen queued, was taken as
    # queued for good, its join bound started again at each ask, and a unit that hung loading was never stopped
    # (the scaler alone bounds a silent site so since Spawner.queued never raises: SILENT_QUEUE_S)
    scaler, _, _, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)
    scaler.scale(1, None, reason="rebalance")
    deliver(scaler, posted)
    scaler.spawn_requested["rollout-2"] = t0
    spawner.waiting = ("rollout-2",)
    assert _asked(scaler, posted, 1700.0) == []  # seen queued

    def cannot_say(names: list[str]) -> list[str]:
        raise LaunchError("agents.jsonl: line 3: not JSON")

    spawner.exited = cannot_say  # type: ignore[method-assign]
    spawner.silent = True
    for at in (1800.0, 2400.0, 3700.0):  # its sites say nothing from here on
        scaler._unjoined_at = t0 - 1.0
        assert _asked(scaler, posted, at) == []
    assert scaler.join_since["rollout-2"] == t0 + 2400.0  # its bound runs from the last turn it was taken as queued
    scaler._unjoined_at = t0 + 2400.0 + 1801.0
    scaler.tick(t0 + 2400.0 + 1801.0)
    assert "rollout-2" in scaler.abandoned  # stopped for not joining


def test_a_unit_never_said_queued_whose_sites_cannot_say_waits_for_a_bounded_time(tmp_path) -> None:
    """rollout-2's sites could not say anything from the start (asking raised): the scaler read that as "none
    queued", so its join bound ran from its start and it was stopped at the bound though it may wait in SLURM's
    queue, while a spawner whose squeue alone failed kept it queued. One rule now: a unit whose queue state cannot be
    learnt is queued, as its site last said (never: queued), for SILENT_QUEUE_S from when it first could not say; then
    it is taken as started (said once, `queue_unanswered`) and stopped once its bound runs, not kept for good."""
    scaler, _, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)  # the plan's units joined a second in: the bound is its least, 30 min
    scaler.scale(1, None, reason="rebalance")
    deliver(scaler, posted)
    scaler.spawn_requested["rollout-2"] = scaler.join_since["rollout-2"] = t0

    def cannot_say(names: list[str]) -> list[str]:
        raise LaunchError("agents.jsonl: cannot read: Input/output error")

    spawner.exited = cannot_say  # type: ignore[method-assign]
    spawner.silent = True
    assert _asked(scaler, posted, 1700.0) == []
    scaler._unjoined_at = t0 + 1801.0
    scaler.tick(t0 + 1801.0)  # its bound passed since its start: its sites never said it left the queue
    assert posted == [] and "rollout-2" not in scaler.abandoned and not hasattr(spawner, "stopped")
    scaler._unjoined_at = t0 - 1.0
    assert _asked(scaler, posted, 3400.0) == []  # silent 1700 s: queued still
    assert scaler.join_since["rollout-2"] == t0 + 3400.0
    scaler._unjoined_at = t0 - 1.0
    assert _asked(scaler, posted, 3600.0) == []  # silent 1900 s: taken as started, its bound runs from 3400 s
    scaler._unjoined_at = t0 - 1.0
    assert _asked(scaler, posted, 3700.0) == []
    assert scaler.join_since["rollout-2"] == t0 + 3400.0
    assert [(e["agent"], e["site"], e["silent_s"]) for e in jd.read_events("queue_unanswered")] == [
        ("rollout-2", "a", 1900)
    ]
    scaler._unjoined_at = t0 + 3400.0 + 1801.0
    scaler.tick(t0 + 3400.0 + 1801.0)
    assert _stop_posted(posted)[:2] == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]


class _Site:
    """A site's backend: rollout-1 exited, the others run; its queue cannot be asked (`queued` raises `error`)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def poll(self, handle: AgentHandle) -> int | None:
        return 1 if handle.spec.name == "rollout-1" else None

    def queued(self, handle: AgentHandle) -> bool:
        raise self.error


def test_a_planned_unit_said_exited_is_handled_though_the_queue_cannot_be_asked(tmp_path) -> None:
    """The sites said the plan's rollout-1 exited before it joined, then asking whether rollout-2 (asked for) is
    queued raised (squeue failing in a way its backend did not translate): the whole answer was thrown away, and
    rollout-1 held its slot, never replaced, for as long as the queue could not be asked. The exited unit is handled;
    rollout-2's queue state is unknown."""
    scaler, core, jd, posted, _ = setup(tmp_path, fail=0)
    joined = ControllerCore(core.cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1], 1)])
    joined.join("rollout-0", role="rollout", version=0)
    scaler.core = joined
    for role, replica in (("controller", 0), ("rollout", 1), ("rollout", 2)):
        ident = {"pid": 10 + replica, "pgid": 10 + replica}
        record_agent(jd.path, AgentHandle(AgentSpec(role, replica, "a", []), ident, "local"))
    spawner = Spawner(jd, scaler.placement.site_specs, job=jd.id)
    spawner.backends.for_site = lambda name: _Site(OSError("squeue: broken pipe"))  # type: ignore[method-assign]
    scaler.spawner = spawner
    scaler.placement.sites["rollout-2"] = "a"
    scaler.spawn_requested["rollout-2"] = scaler.join_since["rollout-2"] = scaler.t0
    try:
        assert _asked(scaler, posted, 61.0) == ["rollout-1"]
    finally:
        spawner.close()
    assert [e["agent"] for e in jd.read_events("unit_exited_before_joining")] == ["rollout-1"]
    assert list(scaler.replacing) == ["rollout-1"] and scaler.join_since["rollout-2"] == scaler.t0 + 61.0


def test_a_resume_scales_in_again_a_site_the_run_had_scaled_in(tmp_path) -> None:
    # `rlctl scale -1` (1 unit on site a, 2 planned), then a resume: it came back with the plan's 2, unsaid
    scaler, *_ = setup(tmp_path, fail=0)
    _, outs = scaler.scale(-1, "a", reason="manual")
    drained = [o.to for o in outs if o.to != "trainer"]
    assert drained == ["rollout-1"]
    assert scaler.unit_counts() == {"a": 1}
    resumed, core2, _, _, spawner = setup(tmp_path / "resumed", fail=0)
    core2.units.pop("rollout-1")
    resumed.restore(replaced=0, units=scaler.unit_counts(), now=0.0)
    assert not resumed.tick(1.0)  # rollout-1 of the plan has not joined: the launcher's, nothing drained yet
    core2.join("rollout-1", role="rollout", version=0)
    outs = resumed.tick(2.0)
    assert resumed.unit_counts() == {"a": 1} and spawner.calls == []
    assert [o.to for o in outs if o.to != "trainer"] == drained
    scale = [e for e in resumed.jobdir.read_lines(resumed.jobdir.events) if e["event"] == "scale"]
    assert [(e["direction"], e["agent"], e["site"], e["reason"]) for e in scale] == [("in", "rollout-1", "a", "resume")]
    assert resumed.tick(3.0) == []  # once


def test_a_unit_asked_for_whose_start_has_not_returned_is_not_stopped_for_not_joining(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rollout-2's start stages its site first (the model copied over a slow link) past the join bound: it was
    'stopped' (nothing to stop: not recorded yet) and said a failed start, its slot free, and it then started and ran
    all the same. Its bound counts from when its start returned, as its site then says it runs."""
    scaler, _, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)  # the plan's units joined a second in: the bound is its least, 30 min
    scaler.scale(1, None, reason="operator")
    _, name, info = next_post(posted)  # its start, still staging as far as the controller's loop knows
    scaler._unjoined_at = t0 + 1801.0  # (the sites just asked)
    scaler.tick(t0 + 1801.0)
    time.sleep(0.2)  # (a stop runs in a thread)
    assert posted == [] and not hasattr(spawner, "stopped") and scaler.failed_starts == {}
    with monkeypatch.context() as m:  # its start returns 1850 s after the request
        m.setattr(scaler, "clock", lambda: t0 + 1850.0)
        scaler.spawned(name, info)
    scaler._unjoined_at = t0 + 3600.0
    scaler.tick(t0 + 3600.0)  # 29 min after its start returned
    time.sleep(0.2)
    assert posted == [] and not hasattr(spawner, "stopped") and scaler.free_slots() == {"a": 0}
    scaler._unjoined_at = t0 + 3651.0
    scaler.tick(t0 + 3651.0)  # the bound passed since its start returned
    assert _stop_posted(posted)[:2] == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]
    assert [e for e in jd.read_events() if e["event"] == "scale_failed"] == []  # (counted once the stop ends)


def test_a_replacement_whose_start_has_not_returned_is_not_stopped_for_not_joining(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rollout-2 replaces rollout-1, and its start stages its site first (the model copied over a slow link) past the
    join bound: it was 'stopped' (nothing to stop: not recorded yet) and counted a failed attempt, and it then
    started and ran all the same. Its bound counts from when its start returned, as 9cb2735 does for a unit asked
    for."""
    scaler, core, jd, posted, spawner = setup(tmp_path, fail=0)
    t0 = scaler.t0
    scaler.tick(t0 + 1.0)  # the plan's units joined a second in: the bound is its least, 30 min
    core.lost("rollout-1")
    scaler.replace("rollout-1", now=t0 + 1.0)
    scaler.tick(t0 + 1.0)
    _, name, info = next_post(posted)  # its start, still staging as far as the controller's loop knows
    assert name == "rollout-2"
    scaler._unjoined_at = t0 + 1802.0  # (the sites just asked)
    scaler.tick(t0 + 1802.0)
    time.sleep(0.2)  # (a stop runs in a thread)
    assert posted == [] and not hasattr(spawner, "stopped")
    r = scaler.replacing["rollout-1"]
    assert (r.unit, r.attempts, r.why) == ("rollout-2", 1, None)
    with monkeypatch.context() as m:  # its start returns 1850 s after the request
        m.setattr(scaler, "clock", lambda: t0 + 1851.0)
        scaler.spawned(name, info)
    scaler._unjoined_at = t0 + 3600.0
    scaler.tick(t0 + 3600.0)  # 29 min after its start returned
    time.sleep(0.2)
    assert posted == [] and not hasattr(spawner, "stopped")
    scaler._unjoined_at = t0 + 3652.0
    scaler.tick(t0 + 3652.0)  # the bound passed since its start returned
    assert _stop_posted(posted)[:2] == ("unjoined_stopped", "rollout-2") and spawner.stopped == ["rollout-2"]
    assert [e for e in jd.read_events() if e["event"] == "replacement_not_joined"] == []  # (counted once it ends)


def test_a_resume_does_not_scale_in_a_site_for_a_unit_its_run_gave_up_replacing(tmp_path) -> None:
    """rollout-1 lost and every attempt to replace it failed (its node down): the checkpoint kept 1 unit for site a,
    as though `scale -1` had removed it, and the resumed run (the node back, the plan's 2 units joined) drained the
    healthy rollout-1 as a scale-in, reason resume. A unit given up on is a loss, not a scale-in: the plan's count."""
    scaler, core, _, posted, _ = setup(tmp_path, fail=healing.REPLACE_ATTEMPTS)
    given_up_on(scaler, core, posted)
    assert scaler.gave_up == ["rollout-1"]
    assert scaler.unit_counts() == {"a": 2}
    resumed, _, _, _, spawner = setup(tmp_path / "resumed", fail=0)
    resumed.restore(replaced=0, units=scaler.unit_counts(), now=0.0)
    assert resumed.tick(2.0) == [] and spawner.calls == []  # the plan's 2 joined: none drained, none started
    assert not [e for e in resumed.jobdir.read_lines(resumed.jobdir.events) if e["event"] == "scale"]


def test_a_resume_after_a_unit_given_up_on_and_a_scale_out_brings_the_units_the_job_had(tmp_path) -> None:
    """rollout-1 lost and given up on (its node down), then `rlctl scale +1` started rollout-5 on the same site: the
    job ran 2 units, but the checkpoint counted 3 (the given-up unit's name counted at every checkpoint), and a resume
    started one more unit than the job had. A unit asked for after a give-up takes the lost unit's place; one whose
    start fails gives it back."""
    scaler, core, _, posted, spawner = setup(tmp_path, fail=healing.REPLACE_ATTEMPTS)
    given_up_on(scaler, core, posted)
    assert scaler.gave_up == ["rollout-1"] and scaler.unit_counts() == {"a": 2}
    spawner.fail = len(spawner.calls) + 1  # the next start fails: the lost unit's place is open again
    assert scaler.scale(1, None, reason="manual")[0]["adding"] == ["rollout-5"]
    deliver(scaler, posted)
    assert "rollout-5" in scaler.failed_starts and scaler.unit_counts() == {"a": 2}
    assert scaler.scale(1, None, reason="manual")[0]["adding"] == ["rollout-6"]
    assert scaler.unit_counts() == {"a": 2}  # starting: it takes rollout-1's place
    deliver(scaler, posted)
    core.join("rollout-6", role="rollout", version=0)
    assert [u.name for u in core.live_units] == ["rollout-0", "rollout-6"] and scaler.unit_counts() == {"a": 2}
    resumed, _, _, _, spawner2 = setup(tmp_path / "resumed", fail=0)
    resumed.restore(replaced=0, units=scaler.unit_counts(), now=0.0)
    assert resumed.tick(2.0) == [] and spawner2.calls == []  # the plan's 2 joined: the 2 the job had


def test_a_resume_that_starts_the_units_its_run_had_beside_a_unit_given_up_on_keeps_its_place(tmp_path) -> None:
    """A resumed run of a checkpoint with 3 units on site a (the plan's 2 and a `scale +1`): the plan's rollout-1
    exited before it joined and was given up on before the resume's units started, so the site counted rollout-0 and
    the given-up place, and the resume started the 1 missing unit. That unit took the given-up place too: the
    checkpoint then counted 2 (the place counted out twice) and a second resume came back with one unit fewer than
    the job had. A unit the resume starts is one its checkpoint counted, beside the place."""
    scaler, core, _, posted, _ = setup(tmp_path, fail=healing.REPLACE_ATTEMPTS)
    scaler.core = ControllerCore(core.cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1], 1)])
    scaler.core.join("rollout-0", role="rollout", version=0)
    scaler._unjoined_at = 1e9  # (the sites' answer is given below, not asked in a thread)
    scaler.restore(replaced=0, units={"a": 3}, now=0.0)
    scaler.not_joining(["rollout-1"], now=61.0)  # its site said it exited
    replace_until_given_up(scaler, posted, now=61.0, until=scaling.RESTORE_WAIT_S)
    assert scaler.gave_up == ["rollout-1"] and scaler.restoring is not None and scaler.unit_counts() == {"a": 2}
    scaler.tick(scaling.RESTORE_WAIT_S + 1.0)  # rollout-1 never joined: the checkpoint's units start past the wait
    deliver(scaler, posted)
    assert scaler.restoring is None and scaler.pending_units() == ["rollout-5"]
    assert scaler.unit_counts() == {"a": 3}  # rollout-0, rollout-5 and rollout-1's place
