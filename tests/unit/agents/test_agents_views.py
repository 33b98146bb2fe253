"""The controller's views (status reply, summary.json, metrics row) over a core driven by a fake clock,
and the Scaler's scale-in and refusals — no sockets, no threads."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import pytest

from rlctl.agents.books import ScaleLog
from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, IterationStats, Out, PromptSpec
from rlctl.agents.ledger import State
from rlctl.agents.messages import Heartbeat, Trained
from rlctl.agents.placement import Placement
from rlctl.agents.rebalance import Reading
from rlctl.agents.rowbook import PACE_ROWS, RowBook, job_start_offset
from rlctl.agents.scaling import Scaler
from rlctl.agents.views import Snapshot, agent_gauges, iteration_gauges, metrics_row, status, summary
from rlctl.agents.weightbook import WeightBook
from rlctl.commands.launching.views import AGENTS_NAMED, agents_text, progress_line, summary_table
from rlctl.commands.status import checkpoint_line, metrics_line, suspects_line, time_line, training_line
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError
from rlctl.launch.jobdir import JobDir
from rlctl.metrics import JobMetrics
from rlctl.rl.reward_pool import RewardStats
from rlctl.tracking import row_to_metrics


@dataclass
class FakePeer:
    name: str
    role: str
    last_seen: float
    figures: Heartbeat
    state: str = "running"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _job(iterations: int = 2) -> JobFile:
    return JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "views",
            "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits"},
            "iterations": iterations,
            "batch": {"prompts_per_iteration": 2, "samples_per_prompt": 1},
            "pipeline": {"mode": "stream"},
            "placement": {"trainer": {"site": "a", "gpus": 1}, "rollout": [{"site": "a", "gpus": 1}]},
        }
    )


def _core(clock: Clock, iterations: int = 2) -> ControllerCore:
    cfg = CoreConfig(
        iterations=iterations, prompts_per_iteration=2, samples_per_prompt=1, max_new_tokens=8, mode="stream", eta=0
    )
    return ControllerCore(
        cfg, prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1], 4) for j in range(2)], predict=None, clock=clock
    )


def _one_iteration() -> tuple[ControllerCore, Trained, Clock]:
    """Trainer and r0 join at t=101 (dispatch), samples finish at 102 and 104, iteration 0 trained at 106."""
    clock = Clock()
    core = _core(clock)
    clock.now = 101.0
    core.join("trainer-0", role="trainer", version=0)
    outs = core.join("r0", role="rollout", version=0)
    sids = [r["sample_id"] for o in outs if o.kind == "generate" for r in o.header["requests"]]
    assert len(sids) == 2
    for at, sid in zip((102.0, 104.0), sids, strict=True):
        clock.now = at
        core.sample("r0", sample_id=sid, version=0, output_tokens=3, payload=None, reward=1.0)
    clock.now = 106.0
    core.trained(iteration=0, version=1, sample_ids=sids, stats={})
    t = Trained(
        iteration=0,
        version=1,
        sample_ids=sids,
        reward_mean=0.5,
        train_s=1.5,
        tokens=6,
        loss=0.1,
        staleness_violations=0,
        busy_s=1.5,
        kl=0.0123456,
        grad_norm=0.7654321,
        lr=2.5e-4,
        clip_frac=0.0312345,
        entropy=1.2345678,
        no_signal_frac=0.3333333,
    )
    return core, t, clock


def _snapshot(core: ControllerCore, rows: list[dict[str, Any]], *, rows_kept: int = 0, **over: Any) -> Snapshot:
    peers = {
        "trainer-0": FakePeer("trainer-0", "trainer", 105.0, Heartbeat(name="trainer-0", state="running", busy_s=1.5)),
        "r0": FakePeer("r0", "rollout", 104.0, Heartbeat(name="r0", state="running", version=1, busy_s=4.0)),
        "client-0": FakePeer("client-0", "client", 100.0, Heartbeat(name="client-0", state="running")),
    }
    s = Snapshot(
        job=_job(),
        core=core,
        book=WeightBook(),
        peers=peers,
        sites={"trainer-0": "a", "r0": "b"},
        rows=RowBook(rows, kept=rows_kept),
        t_start=100.0,
        t_first=101.0,
        violations=0,
        reading=None,
        scale_log=ScaleLog(),
        free_slots={"b": 1},
        stop_requested=False,
        metrics_port=9999,
        job_dir="/jobs/views",
    )
    return replace(s, **over)


def test_an_iteration_that_trained_no_token_has_no_per_token_figures():
    """Every group scored alike: the trainer ran no token and says NaN; the row leaves those figures out (a tracker
    plots a gap, not a 0 entropy) and keeps the rest."""
    core, t, _ = _one_iteration()
    nan = float("nan")
    nothing = msgspec.structs.replace(t, kl=nan, clip_frac=nan, entropy=nan, no_signal_frac=1.0)
    row = metrics_row(_snapshot(core, []), nothing, wall_time=0)
    assert not {"kl", "clip_frac", "entropy"} & set(row) and row["no_signal_frac"] == 1.0 and row["loss"] == 0.1


def test_metrics_row_times_rates_and_agents_from_the_core_and_the_trained_message():
    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=1234.56789)
    assert (row["t_gen_s"], row["t_train_s"], row["delta_s"]) == (3.0, 1.5, 1.5)  # gen: 101 → 104
    assert (row["period_s"], row["samples_per_s"], row["tokens_per_s"]) == (5.0, 0.4, 1.2)  # 101 → 106
    assert row["trainer_wait_s"] == 3.5  # 5 s, of which the trainer was busy 1.5
    assert (row["wall_s"], row["t"], row["kl"], row["weight_version"]) == (6.0, 1234.568, 0.012346, 1)
    assert (row["grad_norm"], row["lr"], row["clip_frac"], row["entropy"]) == (0.76543, 2.5e-4, 0.03123, 1.23457)
    assert row["no_signal_frac"] == 0.3333 and "kl_ref" not in row  # no reference model: kl_coef 0
    assert row["staleness"] == {"0": 2}
    assert row["agents"] == {
        "trainer-0": {"role": "trainer", "site": "a", "busy_s": 1.5, "state": "running"},
        "r0": {"role": "rollout", "site": "b", "busy_s": 4.0, "state": "running"},
    }


def test_a_row_lists_a_gone_agent_once_the_row_after_it_went_and_the_book_keeps_no_row_list():
    """A run that replaces units for weeks: each row lists the live agents and, once, the ones that went since the
    row before (how they ended, their last busy seconds: the controller holds them until that row, then lets them
    go); the controller's book of rows keeps totals and the last rows, whatever the number of iterations."""
    core, t, _ = _one_iteration()
    s = _snapshot(core, [])
    gone = {
        f"old-{i}": FakePeer(f"old-{i}", "rollout", 90.0, Heartbeat(name=f"old-{i}", state="running", busy_s=2.0))
        for i in range(50)
    }
    peers = {**s.peers, **gone}
    first = metrics_row(replace(s, peers=peers), t, wall_time=0.0)
    assert sorted(first["agents"]) == sorted(["trainer-0", "r0", *gone])
    for p in gone.values():
        p.state = "lost" if p.name.endswith(("0", "2", "4", "6", "8")) else "stopped"
    book = RowBook([first])
    second = metrics_row(replace(s, peers=peers, rows=book), t, wall_time=1.0)
    assert len(second["agents"]) == 52 and second["agents"]["old-3"]["state"] == "stopped"
    book.add(second)
    third = metrics_row(replace(s, rows=book), t, wall_time=2.0)  # the controller let them go (`_prune`)
    assert sorted(third["agents"]) == ["r0", "trainer-0"]
    for _ in range(10_000):
        book.add(third)
    assert book.count == 10_002 and len(book.reward_curve) == 10_002
    assert len(book.tail) + len(book.pace) <= 4 + 21  # not every row: the last few
    assert summary(replace(s, rows=book))["iterations"] == 10_002


def test_status_reports_the_last_row_the_rule_and_live_agents_without_clients():
    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=0.0)
    events = [{"direction": "out", "agent": f"rollout-{i}"} for i in range(12)]
    reading = Reading(0, delta_s=1.23456, delta_prime_s=0.5, units=1, add=False, why="δ ≥ δ' but no free GPU slot")
    snap = _snapshot(core, [row, row], reading=reading, scale_log=ScaleLog(events), stop_requested=True)
    st = status(snap, now=110.0)
    assert st["state"] == "stopping" and st["iteration"] == st["weight_version"] == 1
    assert (st["t_gen_s"], st["reward"], st["figures_age_s"], st["elapsed_s"]) == (3.0, 0.5, 4.0, 10.0)
    assert (st["delta_window_s"], st["delta_prime_s"]) == (1.2346, 0.5)
    assert st["training"] == {
        "loss": 0.1,
        "kl": 0.012346,
        "lr": 2.5e-4,
        "grad_norm": 0.76543,
        "entropy": 1.23457,
        "clip_frac": 0.03123,
        "no_signal_frac": 0.3333,
    }
    assert training_line(st["training"]) == (
        "loss 0.1  kl 0.0123  lr 2.50e-04  grad norm 0.765  entropy 1.235  clipped 0.031  no signal 0.33"
    )
    assert "dropped_groups" not in row  # a job without dynamic sampling drops nothing: no column of zeros
    dynamic = {**st["training"], "dropped_groups": 3}  # … one with it says how many groups it dropped meanwhile
    assert training_line(dynamic).endswith("no signal 0.33  dropped 3 groups")
    assert st["rebalance"] == {"auto": False, "why": "δ ≥ δ' but no free GPU slot"}
    assert st["scale_events"] == events[-10:] and st["free_slots"] == {"b": 1}
    assert st["staleness"] == {"0": 4}  # summed over the rows
    assert [a["name"] for a in st["agents"]] == ["trainer-0", "r0"]
    r0 = st["agents"][1]
    assert (r0["heartbeat_age_s"], r0["site"], r0["inflight"], r0["draining"]) == (6.0, "b", 0, False)
    assert st["weights"]["version"] == 1 and st["weights"]["units_at_version"] == 0  # r0 has not applied v1
    assert st["ledger"] == {
        "prompts": 4,
        "trained": 2,
        "requeued": 0,
        "lost": 0,
        "duplicated": 0,
        "migrated": 0,
        "resumed": 0,
    }
    assert st["suspects"] == {}
    core.ledger.quarantined = 1  # a prompt set aside for crashing units: counted only once there is one
    core.ledger.crashes.update({"p1-0": 2, "p1-1": 1})  # … and the suspects running alone (2 losses: the job's bound)
    st = status(_snapshot(core, [row]), now=110.0)
    assert st["ledger"]["quarantined"] == 1 and st["suspects"] == {"p1-0": 2}
    assert suspects_line(st["suspects"]) == "p1-0 (2 unit losses): each runs alone on a unit"


def test_a_skipped_step_and_a_busy_phase_in_the_row_and_the_status():
    """A step skipped for a NaN gradient: the row says so with no NaN in it (strict JSON), and status while the skips
    last; an agent in a busy phase: status says which and for how long (its last heartbeat's figures)."""
    core, t, _ = _one_iteration()
    nan = float("nan")
    skipped = msgspec.structs.replace(t, grad_norm=nan, loss=nan, skipped=True)
    row = metrics_row(_snapshot(core, []), skipped, wall_time=0.0)
    assert (row["step_skipped"], row["grad_norm"], row["loss"]) == (True, None, None)
    assert "step_skipped" not in metrics_row(_snapshot(core, []), t, wall_time=0.0)
    core.skipped_in_a_row = [0]
    snap = _snapshot(core, [row])
    snap.peers["trainer-0"].figures = Heartbeat(
        name="trainer-0", state="running", phase="optimizer step", phase_s=42.04
    )
    st = status(snap, now=110.0)
    assert st["training"]["skipped_in_a_row"] == 1
    assert training_line(st["training"]).endswith("SKIPPED (gradient not finite; 1 in a row)")
    phases = {a["name"]: (a["phase"], a["phase_s"]) for a in st["agents"]}
    assert phases == {"trainer-0": ("optimizer step", 42.0), "r0": ("", 0.0)}


def test_status_says_the_time_left_at_this_runs_pace_and_the_latest_checkpoint():
    """A long run's operator reads how long it has run, how long it has left at the pace of its last iterations
    (this run's: rows a resume kept are of an earlier run, with the downtime between), and its latest checkpoint."""
    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=0.0)
    rows = [{**row, "t": 5.0}] + [{**row, "t": 1000.0 + 12.5 * i} for i in range(4)]  # the first: before a resume
    st = status(_snapshot(core, rows, job=_job(iterations=5), rows_kept=1, checkpoint=(1, 104.0)), now=110.0)
    assert (st["pace_s"], st["pace_iterations"], st["eta_s"]) == (12.5, 3, 50.0)  # 4 iterations left × 12.5 s
    assert st["checkpoint"] == {"version": 1, "age_s": 6.0, "every_iterations": 20}
    assert time_line(st) == "running 10 s; ≈ 50 s left at 12.5 s an iteration (last 3)"
    assert progress_line(st).startswith("iter 1/5 (≈ 50 s left)  reward 0.500")  # `launch`'s line per iteration
    assert checkpoint_line(st["checkpoint"]) == "v1, 6 s ago (every 20 iterations)"
    many = [{**row, "t": 10.0 * i} for i in range(3 * PACE_ROWS)]  # the pace of the last PACE_ROWS only
    many[-1] = {**row, "t": many[-2]["t"] + 10.0 + PACE_ROWS * 5.0}
    assert status(_snapshot(core, many, job=_job(iterations=5)), now=110.0)["pace_s"] == 15.0
    resumed = status(_snapshot(core, rows[:2], rows_kept=1, checkpoint=(1, None)), now=110.0)
    assert resumed["pace_s"] is resumed["eta_s"] is None  # one row of this run: no pace yet
    assert time_line(resumed) == "running 10 s; time left: known after 4 iterations of this run"
    assert time_line({**resumed, "iteration": 2}) == "running 10 s; no iteration left"  # the job's 2 trained
    assert checkpoint_line(resumed["checkpoint"]) == "v1 (resumed from) (every 20 iterations)"
    # a resumed job, its first controller started 3 d before this one: 'running 10 s' read as the job's
    since_first = status(_snapshot(core, rows[:2], rows_kept=1, wall_offset_s=3 * 86400.0), now=110.0)
    # (said 'job 3 d 00 h': a job stopped for days between its runs read as one that ran them)
    assert time_line(since_first).startswith("running 10 s (this run; 3 d 00 h since the job's first start); ")
    assert "(this run" not in time_line(resumed)  # a job that was never resumed (no offset): its one run
    assert (
        checkpoint_line({"version": None, "age_s": None, "every_iterations": 0})
        == "none complete yet (only at the end)"
    )


def test_a_paused_job_s_time_row_says_paused_not_an_estimate_at_the_old_pace():
    """A job paused for an unreachable site trains nothing while it waits: its time row said '≈ 50 s left at 12.5 s
    an iteration (last 3)', the pace from before the pause, as if it went on."""
    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=0.0)
    rows = [{**row, "t": 1000.0 + 12.5 * i} for i in range(5)]
    paused = {"resumes": 0, "paused": "paused: site gen unreachable since 12:03:04 (20 s; the job waits up to 300 s)"}
    st = status(_snapshot(core, rows, job=_job(iterations=5), resilience=paused), now=110.0)
    assert st["state"] == "paused" and st["resilience"]["paused"] == paused["paused"]
    # -o json and `launch`'s line per iteration: no time left while it waits (they kept '≈ 50 s left', the estimate
    # at the pace from before the pause, which the time row no longer showed); the pace itself is as measured
    assert st["eta_s"] is None and st["pace_s"] == 12.5
    assert progress_line(st).startswith("iter 1/5  reward ")
    assert time_line(st) == "running 10 s; paused: no time left estimated while it waits (the paused row says why)"
    assert time_line({**st, "iteration": 5}) == "running 10 s; no iteration left"
    st = status(_snapshot(core, rows, job=_job(iterations=5), resilience={**paused, "paused": None}), now=110.0)
    assert st["state"] == "running" and st["eta_s"] == 50.0  # resumed: the estimate again


def test_no_time_left_from_one_interval_after_a_resume_nor_across_the_resume():
    """Right after a resume the first iterations train what the units had queued, back to back: one interval of
    0.01 s gave "≈ 12 s left at 0.0 s an iteration (last 1)" with 376 left. A few intervals of this run first; and a
    run's rows start where wall_s (seconds since the controller started) goes back, rows_kept or not."""
    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=0.0)
    job = _job(iterations=400)
    before = [{**row, "t": 1000.0 + 40.0 * i, "wall_s": 40.0 * (i + 1)} for i in range(24)]  # 40 s an iteration
    after = [{**row, "t": 9000.0 + 0.01 * i, "wall_s": 60.0 + 0.01 * i} for i in range(2)]  # queued work, at once
    st = status(_snapshot(core, before + after, job=job, rows_kept=24), now=110.0)
    assert st["pace_s"] is st["eta_s"] is None and st["pace_after_iterations"] == 4
    assert time_line(st) == "running 10 s; time left: known after 4 iterations of this run"
    # a record whose kept rows are not counted (rows_kept 0): the wall_s going back marks the new run all the same
    st = status(_snapshot(core, before + after, job=job, rows_kept=0), now=110.0)
    assert st["pace_s"] is st["eta_s"] is None
    later = after + [{**row, "t": 9040.0 + 40.0 * i, "wall_s": 100.0 + 40.0 * i} for i in range(2)]
    st = status(_snapshot(core, before + later, job=job, rows_kept=0), now=110.0)
    assert (st["pace_iterations"], st["pace_s"]) == (3, 26.667)  # only this run's: (9080 − 9000) / 3


def test_status_shows_where_metrics_are_served_and_what_keeps_another_machine_from_scraping_them():
    """The alerts' header sends operators to `rlctl status` for the /metrics address: the table never showed it, and
    by default it is loopback (the controller's listen host) on a port picked anew each run."""
    core, _, _ = _one_iteration()
    st = status(_snapshot(core, []), now=110.0)
    assert st["metrics"] == {"address": "127.0.0.1:9999", "port_fixed": False, "listen_field": "transport.listen_host"}
    assert metrics_line(st["metrics"]) == (
        "http://127.0.0.1:9999/metrics  (this machine only: set transport.listen_host to a reachable address; "
        "a new port each run and resume: set metrics.port)"
    )
    job = _job()
    job = job.model_copy(update={"metrics": job.metrics.model_copy(update={"port": 9400})})
    st = status(_snapshot(core, [], job=job, metrics_port=9400, metrics_host="10.0.0.5"), now=110.0)
    assert metrics_line(st["metrics"]) == "http://10.0.0.5:9400/metrics"
    assert metrics_line({"address": "fd00::5:9400", "port_fixed": True}) == "http://[fd00::5]:9400/metrics"
    # a site that sets network.listen_host decides over transport.listen_host: the hint names the site's (it named
    # transport.listen_host, and setting it changed nothing)
    st = status(_snapshot(core, [], listen_field="sites.train.network.listen_host"), now=110.0)
    assert metrics_line(st["metrics"]).startswith(
        "http://127.0.0.1:9999/metrics  (this machine only: set sites.train.network.listen_host to a reachable address;"
    )


def test_durations_read_as_people_read_them():
    from rlctl.textutil import duration

    assert [duration(x) for x in (45, 185, 7620, 3 * 86400 + 4 * 3600 + 59)] == [
        "45 s", "3 min 05 s", "2 h 07 min", "3 d 04 h",
    ]  # fmt: skip


def test_status_before_any_iteration_has_no_figures():
    clock = Clock()
    st = status(_snapshot(_core(clock), []), now=100.0)
    assert st["state"] == "running" and st["iteration"] == 0
    assert st["t_gen_s"] is st["figures_age_s"] is st["delta_window_s"] is None
    assert training_line(st["training"]) == "loss -  kl -  lr -  grad norm -  entropy -  clipped -  no signal -"


def test_summary_reward_throughput_and_bubbles_then_the_end_state():
    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=0.0)
    s = summary(_snapshot(core, [row]))
    assert s["state"] == "stopped" and s["iterations"] == 1 and s["iterations_planned"] == 2
    assert (s["reward_first"], s["reward_last"], s["reward_window"], s["reward_curve"]) == (0.5, 0.5, 1, [0.5])
    assert (s["run_s"], s["samples_per_s"], s["tokens_per_s"]) == (5.0, 0.4, 1.2)
    assert s["bubble_fraction"] == {"rollout": 0.2, "trainer": 0.7}  # 1 − busy / 5 s
    assert s["agents"] == {"trainer-0": {"role": "trainer", "busy_s": 1.5}, "r0": {"role": "rollout", "busy_s": 4.0}}
    assert s["job_dir"] == "/jobs/views" and s["ledger"]["trained_samples"] == 2
    ledger_line = next(line for line in summary_table(s | {"wall_s": 5.0}).splitlines() if "prompts 4 trained" in line)
    assert "dropped" not in ledger_line and "quarantined" not in ledger_line
    core.ledger.quarantined = 1  # the launch summary names what was set aside, once something was
    table = summary_table(summary(_snapshot(core, [row])) | {"wall_s": 5.0})  # (the launcher adds its wall time)
    assert "lost 0 duplicated 0 quarantined 1 (crashed units)" in table
    far = {"site": "train", "path": "/site/work/jobs/views"}  # the controller's, on its site (JobRun.wait)
    table = summary_table(summary(_snapshot(core, [row])) | {"wall_s": 5.0, "controller_job_dir": far})
    assert table.splitlines()[-2:] == [
        "job dir                   /jobs/views",
        "controller's job dir      /site/work/jobs/views (on site train)",
    ]
    core.failed = "trainer trainer-0 was lost"
    assert summary(_snapshot(core, [row]))["state"] == "failed: trainer trainer-0 was lost"
    empty = summary(_snapshot(_core(Clock()), []))
    assert (empty["reward_first"], empty["samples_per_s"], empty["bubble_fraction"]["rollout"]) == (None, None, None)


# -- the Scaler ----------------------------------------------------------------------------------------
def _site(gpus: int) -> Site:
    return Site.model_validate(
        {"datacenter": "d", "gpu": "CPU", "scheduler": {"kind": "local"}, "nodes": [{"host": "h", "gpus": gpus}]}
    )


def test_free_slots_count_the_trainer_live_and_pending_units_per_tp():
    plan = {"trainer": {"site": "a", "ranks": 1}, "rollout": [{"site": "a", "units": 1}, {"site": "b", "units": 1}]}
    p = Placement(plan, {"a": _site(4), "b": _site(4)}, {"rollout-0": "a", "rollout-1": "b"}, _job())
    assert p.free_slots(["rollout-0", "rollout-1"]) == {"a": 2, "b": 3}
    p.plan["rollout"][1]["tp"] = 2
    assert p.free_slots(["rollout-0", "rollout-1"]) == {"a": 2, "b": 1}
    assert p.planned_units == 2 and p.rollout_sites == ["a", "b"] and p.datacenter("rollout-1") == "d"


@pytest.mark.parametrize(
    ("plan", "said"),
    [
        ({"rollout": [{"site": "a", "units": "two"}]}, "rollout[0].units: 'two' is not a count of 0 or more"),
        ({"rollout": [{"units": 1}]}, "rollout[0]: no object with a site name"),
        ({"trainer": {"ranks": 1}, "rollout": []}, "trainer.site: None is not a site name"),
    ],
)
def test_a_damaged_plan_the_controller_starts_on_is_one_line_naming_the_file_and_field(
    tmp_path, plan: dict[str, Any], said: str
) -> None:
    # its site's copy (an automatic resume stages the operator's again, edited during the run or not): a KeyError
    # or ValueError traceback in the controller's log, versus JobDir's line
    jd = JobDir.create("views", explicit=tmp_path / "job")
    jd.write_json(jd.plan_json, plan)
    with pytest.raises(LaunchError) as refused:
        Placement.read(jd, _job())
    assert str(refused.value) == f"{jd.plan_json}: {said}"
    jd.write_json(jd.plan_json, {"trainer": {"site": "a"}, "rollout": [{"site": "a", "units": 2}]})  # ranks: 1
    assert Placement.read(jd, _job()).sites == {"trainer-0": "a", "rollout-0": "a", "rollout-1": "a"}


def test_the_inventory_links_reach_the_trainer_as_datacenter_pairs():
    """plan.json carries the inventory's links between the job's sites; the controller turns them into
    datacenter pairs and sends them with the members, so the weight plane routes on them."""

    def site(dc: str) -> Site:
        return Site.model_validate(
            {"datacenter": dc, "gpu": "CPU", "scheduler": {"kind": "local"}, "nodes": [{"host": "h", "gpus": 1}]}
        )

    specs = {"a": site("dc-a"), "a2": site("dc-a"), "b": site("dc-b"), "c": site("dc-c")}
    links = [["a", "b"], ["b", "c"], ["a", "a2"], ["a2", "b"], ["a", "gone"]]
    p = Placement({"rollout": [], "links": links}, specs, {}, _job())
    assert p.dc_links == [["dc-a", "dc-b"], ["dc-b", "dc-c"]]  # one pair per datacenters, none inside one
    assert Placement({"rollout": []}, specs, {}, _job()).dc_links is None  # no links recorded: every pair counts

    cfg = replace(_core(Clock()).cfg, dc_links=p.dc_links)
    core = ControllerCore(
        cfg, prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1], 4) for j in range(2)], predict=None, clock=Clock()
    )
    core.join("trainer-0", role="trainer", version=0, datacenter="dc-a")
    core.join("rollout-0", role="rollout", version=0, address="r0", weights="w0", datacenter="dc-c")
    members = next(
        o for o in core.join("rollout-1", role="rollout", version=0, datacenter="dc-b") if o.kind == "members"
    )
    assert members.header["dc_links"] == [["dc-a", "dc-b"], ["dc-b", "dc-c"]]
    assert set(members.header["rollouts"]) == {"rollout-0", "rollout-1"}


def _scaler(tmp_path, units: int) -> tuple[Scaler, ControllerCore, JobDir, list[Any]]:
    jd = JobDir.create("views", explicit=tmp_path / "job")
    core = _core(Clock())
    core.join("trainer-0", role="trainer", version=0)
    for i in range(units):
        core.join(f"rollout-{i}", role="rollout", version=0)
    plan = {"rollout": [{"site": "a", "units": units}]}
    placement = Placement(plan, {}, {f"rollout-{i}": "a" for i in range(units)}, _job())
    posted: list[Any] = []
    scaler = Scaler(jd, _job().rebalance, core=core, placement=placement, metrics=JobMetrics(), post=posted.append)
    return scaler, core, jd, posted


def test_scale_in_drains_the_newest_units_and_logs_scale_events(tmp_path):
    scaler, core, jd, posted = _scaler(tmp_path, units=3)
    reply, outs = scaler.scale(-2, None, reason="manual")
    assert reply == {"removing": ["rollout-2", "rollout-1"]}
    assert [u.name for u in core.live_units] == ["rollout-0"]
    assert Out("rollout-2", "stop", {}) in outs and Out("rollout-1", "stop", {}) in outs  # none had work in flight
    assert [(e["direction"], e["agent"], e["reason"]) for e in scaler.scale_log] == [
        ("in", "rollout-2", "manual"),
        ("in", "rollout-1", "manual"),
    ]
    assert [e["agent"] for e in jd.read_lines(jd.events) if e["event"] == "scale"] == ["rollout-2", "rollout-1"]
    assert posted == []


def test_scale_in_takes_a_unit_named_by_hand_last(tmp_path):
    # `rollout-gpu7` made the sort by the name's number raise: the controller ended
    scaler, core, _, _ = _scaler(tmp_path, units=2)
    core.join("rollout-gpu7", role="rollout", version=0)
    assert scaler.scale(-1, None, reason="manual")[0] == {"removing": ["rollout-1"]}
    assert scaler.scale(-1, None, reason="manual")[0] == {"removing": ["rollout-0"]}


def test_scale_refusals_say_what_is_valid(tmp_path):
    scaler, core, _, _ = _scaler(tmp_path, units=2)
    # the rollout sites as text, not a Python list ("rollout sites: ['a']"), and a near miss named
    assert scaler.scale(-1, "zz", reason="manual") == (
        {"error": "site 'zz' runs no rollout units of this job; rollout sites: a"},
        [],
    )
    assert scaler.scale(1, "A", reason="manual")[0] == {
        "error": "site 'A' runs no rollout units of this job; rollout sites: a (did you mean 'a'?)"
    }
    reply, outs = scaler.scale(-2, None, reason="manual")
    assert reply == {
        "error": "cannot remove 2 rollout unit(s): the job runs 2 in dispatch; at most 1 can be removed (at least one "
        "unit must stay in the job)"
    }
    assert outs == [] and len(core.live_units) == 2
    reply, _ = scaler.scale(1, None, reason="manual")
    assert reply == {"error": "this controller has no launch backends (no sites.json in the job directory)"}


def test_a_scale_in_of_more_units_than_a_site_runs_says_what_the_site_runs(tmp_path):
    # `scale --rollout -3 --site a` of a job with 2 units on a and 2 on b said "cannot remove 3 of 2 rollout unit(s)
    # on a: at least one unit must stay in the job", of a job that would keep one
    scaler, core, _, _ = _scaler(tmp_path, units=2)
    for i in (2, 3):
        core.join(f"rollout-{i}", role="rollout", version=0)
        scaler.placement.sites[f"rollout-{i}"] = "b"
    scaler.placement.plan["rollout"].append({"site": "b", "units": 2})
    reply, outs = scaler.scale(-3, "a", reason="manual")
    assert reply == {
        "error": "cannot remove 3 rollout unit(s) on a: the job runs 4 in dispatch, 2 on a; at most 2 can be removed "
        "there"
    }
    assert outs == [] and len(core.live_units) == 4
    reply, _ = scaler.scale(-4, None, reason="manual")  # the job's floor, as before
    assert reply == {
        "error": "cannot remove 4 rollout unit(s): the job runs 4 in dispatch; at most 3 can be removed (at least one "
        "unit must stay in the job)"
    }


def test_a_scale_in_of_more_units_than_the_job_runs_says_how_many_it_runs_and_how_many_may_go(tmp_path):
    # `scale --rollout -5` of a job with 2 units said "cannot remove 5 of 2 rollout unit(s): at least one unit must
    # stay in the job", as if removing all but one were the trouble; then "the job runs 2 in dispatch", not what was
    # valid (three messages, by case, each saying a different half)
    scaler, core, _, _ = _scaler(tmp_path, units=2)
    reply, outs = scaler.scale(-5, None, reason="manual")
    assert reply == {
        "error": "cannot remove 5 rollout unit(s): the job runs 2 in dispatch; at most 1 can be removed (at least one "
        "unit must stay in the job)"
    }
    assert outs == [] and len(core.live_units) == 2
    reply, _ = scaler.scale(-3, "a", reason="manual")
    assert reply == {
        "error": "cannot remove 3 rollout unit(s) on a: the job runs 2 in dispatch, 2 on a; at most 1 can be removed "
        "(at least one unit must stay in the job)"
    }
    scaler.placement.plan["rollout"].append({"site": "b", "units": 0})
    reply, _ = scaler.scale(-1, "b", reason="manual")
    assert reply == {
        "error": "cannot remove 1 rollout unit(s) on b: the job runs 2 in dispatch, 0 on b; none can be removed there"
    }
    reply, _ = _scaler(tmp_path / "one", units=1)[0].scale(-1, None, reason="manual")
    assert reply == {
        "error": "cannot remove 1 rollout unit(s): the job runs 1 in dispatch; none can be removed (at least one unit "
        "must stay in the job)"
    }


def test_a_scale_in_of_every_unit_of_a_site_beside_one_elsewhere_blames_the_site_not_the_jobs_floor(tmp_path):
    # `scale --rollout -4 --site a` of a job with 3 units on a and 1 on b said "at most 3 can be removed (at least one
    # unit must stay in the job)": a's 3 may all go (b's stays), so a's count is what holds it back, not the floor
    scaler, core, _, _ = _scaler(tmp_path, units=3)
    core.join("rollout-3", role="rollout", version=0)
    scaler.placement.sites["rollout-3"] = "b"
    scaler.placement.plan["rollout"].append({"site": "b", "units": 1})
    reply, outs = scaler.scale(-4, "a", reason="manual")
    assert reply == {
        "error": "cannot remove 4 rollout unit(s) on a: the job runs 4 in dispatch, 3 on a; at most 3 can be removed "
        "there"
    }
    assert outs == [] and len(core.live_units) == 4
    reply, _ = scaler.scale(-3, "a", reason="manual")
    assert reply == {"removing": ["rollout-2", "rollout-1", "rollout-0"]}


def test_first_sample_of_a_requested_unit_is_recorded_once(tmp_path):
    scaler, _, jd, _ = _scaler(tmp_path, units=1)
    scaler.spawn_requested["rollout-5"] = 0.0
    assert scaler.pending_units() == ["rollout-5"]
    scaler.sampled("rollout-5")
    scaler.sampled("rollout-5")
    scaler.sampled("rollout-0")
    assert [e["agent"] for e in jd.read_lines(jd.events) if e["event"] == "first_sample"] == ["rollout-5"]
    assert scaler.pending_units() == []
    # and the controller's status says it (`rlctl scale --wait`: its events.jsonl may be on another site)
    assert list(scaler.first_sample_s) == ["rollout-5"]
    core, _, _ = _one_iteration()
    assert status(_snapshot(core, [], first_samples=scaler.first_sample_s), now=106.0)["first_sample_s"] == {
        "rollout-5": scaler.first_sample_s["rollout-5"]
    }


def test_the_trainer_s_wait_is_its_period_less_its_busy_time_since_the_last_iteration():
    core, t, _ = _one_iteration()
    core.stats[-1] = IterationStats(-1, trained_at=103.0, trainer={"busy_s": 1.0})  # the iteration before, at 103
    assert metrics_row(_snapshot(core, []), t, wall_time=0)["trainer_wait_s"] == 2.5  # 3 s, busy 1.5 − 1.0
    core.stats[-1].trainer["busy_s"] = 9.0  # a restarted trainer counts its busy time from 0 again
    assert metrics_row(_snapshot(core, []), t, wall_time=0)["trainer_wait_s"] == 1.5


def _row(period: float, wait: float, t_gen: float, t_train: float) -> dict[str, Any]:
    return {"iteration": 0, "period_s": period, "trainer_wait_s": wait, "t_gen_s": t_gen, "t_train_s": t_train}


def test_in_async_the_rebalance_rule_reads_the_trainer_s_wait_elsewhere_the_stage_times(tmp_path):
    """Async: a round waits in the engines behind the one before, so its makespan (here 3 s against a 1 s step)
    says nothing of whether the units keep up; the trainer that never waits does. Stream: the stage times."""
    scaler, core, _, _ = _scaler(tmp_path, units=1)
    core.cfg.eta = 1
    scaler.rebalance(row := _row(1.1, 0.0, 3.0, 1.0))
    assert (row["delta_window_s"], row["delta_prime_s"]) == (0.0, 0.55)  # δ: the wait; δ': period / (N + 1)
    scaler.rebalance(row := _row(2.0, 1.0, 3.0, 1.0))
    assert (row["delta_window_s"], row["delta_prime_s"]) == (0.5, 0.775)  # medians of two
    scaler, core, _, _ = _scaler(tmp_path / "stream", units=1)
    scaler.rebalance(row := _row(1.1, 0.0, 3.0, 1.0))
    assert (row["delta_window_s"], row["delta_prime_s"]) == (2.0, 1.5)  # T_gen − T_train, T_gen / (N + 1)


def test_the_gauges_of_a_trained_iteration_and_of_the_agents():
    """What the alerting rules read: the time of the last trained iteration, skipped steps, each agent's phase age."""
    core, t, _ = _one_iteration()
    m = JobMetrics()
    row = metrics_row(_snapshot(core, []), msgspec.structs.replace(t, skipped=True), wall_time=1234.5)
    iteration_gauges(m, row, msgspec.structs.replace(t, skipped=True), core.stats[0], RowBook([row]))
    snap = _snapshot(core, [row])
    snap.peers["r0"].figures = Heartbeat(name="r0", state="running", phase="weight load", phase_s=7.5)
    agent_gauges(m, core, snap.peers, snap.sites, now=110.0)
    value = m.registry.get_sample_value
    assert value("rlctl_job_last_trained_timestamp_seconds") == 1234.5
    assert value("rlctl_train_skipped_steps_total") == 1.0
    assert value("rlctl_throughput_samples_per_second") == row["samples_per_s"]  # one row: its own
    assert value("rlctl_agent_phase_seconds", {"role": "rollout", "name": "r0", "site": "b"}) == 7.5
    assert value("rlctl_agent_phase_seconds", {"role": "trainer", "name": "trainer-0", "site": "a"}) == 0.0


def test_a_lost_or_stopped_agent_s_phase_gauge_reads_zero():
    """A unit its watchdog ended (hung in an engine step) is lost; its last heartbeat said 1805 s in the phase,
    and RlctlAgentBusyLong (phase > 300 s) fired for as long as the controller ran.
    An unreachable one may be in it still."""
    core, _, _ = _one_iteration()
    snap = _snapshot(core, [])
    m = JobMetrics()
    value = m.registry.get_sample_value
    r0 = {"role": "rollout", "name": "r0", "site": "b"}
    snap.peers["r0"].figures = Heartbeat(name="r0", state="hung", phase="engine step", phase_s=1805.0)
    for state, phase in (("running", 1805.0), ("unreachable", 1805.0), ("lost", 0.0), ("stopped", 0.0)):
        snap.peers["r0"].state = state
        agent_gauges(m, core, snap.peers, snap.sites, now=110.0)
        assert (state, value("rlctl_agent_phase_seconds", r0)) == (state, phase)
        assert value("rlctl_agent_up", r0) == (1.0 if state == "running" else 0.0)


def test_the_reference_kl_is_in_the_row_when_the_job_penalises_it():
    core, t, _ = _one_iteration()
    job = _job()
    job = job.model_copy(update={"algorithm": job.algorithm.model_copy(update={"kl_coef": 0.05})})
    row = metrics_row(_snapshot(core, [], job=job), msgspec.structs.replace(t, kl_ref=0.0), wall_time=0.0)
    assert row["kl_ref"] == 0.0  # the first iteration: the policy is still its reference
    assert row_to_metrics(row)["train/kl_ref"] == 0.0


def test_ppo_s_critic_loss_and_reference_kl_are_in_the_row_and_absent_where_no_figure_applies():
    """PPO's value loss and the KL its rewards penalise reach the row and the trackers (they were dropped, and
    kl_ref read 0.0); a GRPO step without a reference model has neither, rather than a made-up 0."""
    core, t, _ = _one_iteration()
    ppo = metrics_row(_snapshot(core, []), msgspec.structs.replace(t, value_loss=0.123456, kl_ref=0.0123), wall_time=0)
    assert (ppo["value_loss"], ppo["kl_ref"]) == (0.12346, 0.0123)
    assert row_to_metrics(ppo)["train/value_loss"] == 0.12346
    grpo = metrics_row(_snapshot(core, []), t, wall_time=0)
    assert not {"value_loss", "kl_ref"} & set(grpo)
    assert (t.value_loss, t.kl_ref) == (None, None)  # the message's defaults: no figure


def test_a_moes_load_balancing_loss_is_in_the_row_where_its_loss_has_it():
    """A Qwen3MoE with output_router_logits: its step's router_aux_loss reaches the row and the trackers; a model whose
    loss has no such term (the message's default, None) none."""
    core, t, _ = _one_iteration()
    moe = metrics_row(_snapshot(core, []), msgspec.structs.replace(t, router_aux_loss=1.02345678), wall_time=0)
    assert moe["router_aux_loss"] == 1.023457 and row_to_metrics(moe)["train/router_aux_loss"] == 1.023457
    assert "router_aux_loss" not in metrics_row(_snapshot(core, []), t, wall_time=0) and t.router_aux_loss is None


def test_the_iteration_gauge_counts_completed_iterations_as_the_weight_version_and_status_do():
    # it read the last trained iteration's 0-based index: one behind rlctl_weights_version and status's iteration
    core, t, _ = _one_iteration()
    m = JobMetrics()
    row = metrics_row(_snapshot(core, []), t, wall_time=0.0)
    iteration_gauges(m, row, t, core.stats[0], RowBook([row]))
    value = m.registry.get_sample_value
    assert value("rlctl_job_iteration") == value("rlctl_weights_version") == 1.0
    assert status(_snapshot(core, [row]), now=110.0)["iteration"] == 1


def test_the_queue_gauge_counts_prompts_of_every_iteration_and_a_site_without_units_reads_zero():
    clock = Clock()
    cfg = CoreConfig(iterations=4, prompts_per_iteration=2, samples_per_prompt=4, max_new_tokens=8, mode="async", eta=2)
    core = ControllerCore(
        cfg, prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1], 4) for j in range(2)], predict=None, clock=clock
    )
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    peers = {
        "trainer-0": FakePeer("trainer-0", "trainer", 100.0, Heartbeat(name="trainer-0", state="running")),
        "r0": FakePeer("r0", "rollout", 100.0, Heartbeat(name="r0", state="running")),
    }
    sites = {"trainer-0": "a", "r0": "b"}
    m = JobMetrics()
    value = m.registry.get_sample_value
    agent_gauges(m, core, peers, sites, now=100.0)
    assert value("rlctl_rollout_units", {"site": "b"}) == 1.0
    core.lost("r0")  # the site's only unit: its work goes back to the queue
    peers["r0"].state = "lost"
    agent_gauges(m, core, peers, sites, now=101.0)
    assert value("rlctl_rollout_units", {"site": "b"}) == 0.0
    queued = core.ledger.in_state(State.QUEUED)
    prompts = {e.prompt_id for e in queued}
    assert len({e.iteration for e in queued}) > 1 and len(queued) > len(prompts)  # several iterations, 4 samples each
    assert value("rlctl_queue_prompts") == len(prompts)


def test_the_throughput_status_and_the_gauges_show_is_the_last_iterations_not_one_bursts():
    """Async iterations end in bursts: one took 10 s for 16 samples, the next ended 4 ms after it (4,000 samples/s
    in its row). status and /metrics showed the last row's figure (603.8 samples/s where the run did 60); now the
    last PACE_ROWS rows': their samples over the time they took."""
    rows = [{"reward_mean": 0.0, "t_gen_s": 0.0, "t_train_s": 0.0, "delta_s": 0.0, "staleness": {}, "wall_s": 10.0 * i,
             "period_s": p, "samples_per_s": round(16 / p, 2), "tokens_per_s": round(160 / p, 1)}
            for i, p in enumerate([10.0, 9.996, 0.004], 1)]  # fmt: skip
    book = RowBook(rows)
    assert rows[-1]["samples_per_s"] == 4000.0
    assert book.rate("samples_per_s") == pytest.approx(48 / 20.0, abs=0.01)  # 48 samples in 20 s
    assert book.rate("tokens_per_s") == pytest.approx(480 / 20.0, abs=0.1)
    assert RowBook().rate("samples_per_s") is None
    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=1234.5)
    burst = [{**row, **r} for r in rows]
    st = status(_snapshot(core, burst), now=130.0)
    assert (st["samples_per_s"], st["tokens_per_s"]) == (book.rate("samples_per_s"), book.rate("tokens_per_s"))
    m = JobMetrics()
    iteration_gauges(m, burst[-1], t, core.stats[0], RowBook(burst))
    assert m.registry.get_sample_value("rlctl_throughput_samples_per_second") == book.rate("samples_per_s")


def test_wall_s_continues_across_a_resume_and_the_resume_still_starts_the_pace():
    # after a resume, metrics.jsonl and time/wall_s went 14.4, 14.8, 15.7, then 12.47: each run counted from its own
    # controller's start (and RowBook took the drop for a new run's start)
    core, t, _ = _one_iteration()
    first = metrics_row(_snapshot(core, []), t, wall_time=1000.0)
    assert (first["wall_s"], first["resumes"]) == (6.0, 0)  # trained 106, the controller started at 100
    # the job's first controller started at 1000 − 6 (its row's t − wall_s); this one at 1020
    offset = job_start_offset([first], [], now=1020.0)
    assert offset == 26.0 and job_start_offset([], [{"event": "controller_listening", "t": 990.0}], now=1020.0) == 30.0
    assert job_start_offset([], [], now=1020.0) == 0.0
    resumed = metrics_row(_snapshot(core, [], wall_offset_s=offset, resilience={"resumes": 1}), t, wall_time=0.0)
    assert (resumed["wall_s"], resumed["resumes"]) == (32.0, 1) and row_to_metrics(resumed)["time/wall_s"] == 32.0
    assert summary(_snapshot(core, [first, resumed], rows_kept=1))["job_wall_s"] == 32.0  # what `report` shows
    # pace: this run's rows start where `resumes` changes, though wall_s no longer goes back there
    job = _job(iterations=400)
    before = [{**first, "t": 1000.0 + 40.0 * i, "wall_s": 40.0 * (i + 1)} for i in range(24)]
    after = [{**resumed, "t": 9000.0 + 40.0 * i, "wall_s": 8000.0 + 40.0 * i} for i in range(5)]
    st = status(_snapshot(core, before + after, job=job, rows_kept=0), now=110.0)
    assert (st["pace_iterations"], st["pace_s"]) == (4, 40.0)  # the 5 rows of the resumed run only


def test_the_live_status_says_how_many_reward_calls_failed_and_the_first():
    """`rlctl status` showed the reward stuck at 0.000 while every reward call raised, and nothing of why; it says so
    now as the launch's summary does, naming the first failure's sample and row."""
    from rlctl.commands.status import _table

    core, _, _ = _one_iteration()
    first = "error: sample p1/0 (data.jsonl line 2): KeyError: 'boom' (r.py:3)"
    stats = RewardStats(calls=8, errors=8, first_failure=first)
    live = status(_snapshot(core, [], reward_stats=stats), now=110.0)
    assert live["rewards"]["errors"] == 8 and live["rewards"]["first_failure"] == first
    page = {"id": "j", "source": "controller", "live": live, "controller_latency_s": 0.01, "job_dir": "/jobs/views"}
    rows = [line for line in _table(page).splitlines() if line.startswith("reward failures")]
    assert rows == [
        "reward failures      8 of 8 calls scored task.reward_on_error (8 raised); the first: "
        + first
        + "; each in the controller's log"
    ]
    quiet = status(_snapshot(core, []), now=110.0)
    assert "reward failures" not in _table({**page, "live": quiet})


def test_the_live_status_table_lists_the_trainer_then_the_units_by_replica():
    # the table listed the agents in the order they joined: after a resume and a scale, `rollout-1, rollout-0,
    # trainer-0, rollout-10, rollout-2`: a unit of 64 looked for down the whole table
    from rlctl.commands.status import _table

    core, _, _ = _one_iteration()
    live = status(_snapshot(core, []), now=110.0)
    one = live["agents"][0]
    joined = [("rollout-1", "rollout"), ("rollout-0", "rollout"), ("trainer-0", "trainer"), ("rollout-10", "rollout"),
              ("rollout-2", "rollout")]  # fmt: skip
    live["agents"] = [{**one, "name": name, "role": role} for name, role in joined]
    page = {"id": "j", "source": "controller", "live": live, "controller_latency_s": 0.01, "job_dir": "/jobs/views"}
    listed = [line.split()[0] for line in _table(page).splitlines() if line.startswith(("rollout-", "trainer-"))]
    assert listed == ["trainer-0", "rollout-0", "rollout-1", "rollout-2", "rollout-10"]


def test_the_live_status_table_says_why_a_paused_job_waits_and_what_its_units_losses_left():
    # the table said `state  paused` and nothing more: which site since when (resilience.paused) and a note of units
    # given up on or being replaced were in `-o json` only, though docs/runtime.md names both as status's
    from rlctl.commands.status import _table

    core, _, _ = _one_iteration()
    paused = "paused: site gen unreachable since 12:03:04 (20 s; the job waits up to 300 s)"
    note = "replacing rollout-3 (last attempt: lost before its first sample)"
    live = status(_snapshot(core, [], resilience={"resumes": 0, "paused": paused, "note": note}), now=110.0)
    page = {"id": "j", "source": "controller", "live": live, "controller_latency_s": 0.01, "job_dir": "/jobs/views"}
    lines = _table(page).splitlines()
    assert [line.split(None, 1) for line in lines if line.startswith(("state", "paused", "resilience"))] == [
        ["state", "paused  (stream, η=0)"],
        ["paused", "site gen unreachable since 12:03:04 (20 s; the job waits up to 300 s)"],
        ["resilience", note],
    ]
    quiet = status(_snapshot(core, []), now=110.0)
    assert not [line for line in _table({**page, "live": quiet}).splitlines() if line.startswith(("paused", "resil"))]


@pytest.mark.parametrize(("auto", "says"), [(False, "manual: automatic rebalancing is off"),
                                             (True, "auto: measuring from the first trained iteration")])  # fmt: skip
def test_the_live_status_rebalance_row_before_the_first_reading_says_what_it_waits_for(auto: bool, says: str):
    # before the rule's first reading (no iteration trained yet) the row read `rebalance  manual: -`
    from rlctl.commands.status import _table

    core, _, _ = _one_iteration()
    job = _job()
    job = job.model_copy(update={"rebalance": job.rebalance.model_copy(update={"auto": auto})})
    live = status(_snapshot(core, [], job=job), now=110.0)
    page = {"id": "j", "source": "controller", "live": live, "controller_latency_s": 0.01, "job_dir": "/jobs/views"}
    (row,) = [line.split(None, 1)[1] for line in _table(page).splitlines() if line.startswith("rebalance")]
    assert row == says


def test_the_live_status_weights_row_counts_one_unit_as_one():
    # `weights  v60 (full), 1 units at it` of a job with one unit (scaled in to one, or planned so)
    from rlctl.commands.status import _weights_line

    assert _weights_line({"version": 60, "sync": "full", "units_at_version": 1}) == "v60 (full), 1 unit at it"
    assert _weights_line({"version": 60, "sync": "full", "units_at_version": 2}) == "v60 (full), 2 units at it"


def test_a_resume_passes_over_a_kept_row_whose_t_or_wall_s_is_null():
    # float(r["t"]) − float(r["wall_s"]) raised TypeError on a kept row with null there, as the resumed controller
    # started; such a row is skipped for that figure, as event_time reads one
    rows = [{"t": None, "wall_s": 5.0}, {"t": 1000.0, "wall_s": None}, {"t": "x", "wall_s": True}]
    assert job_start_offset(rows, [], now=1020.0) == 0.0
    assert job_start_offset([*rows, {"t": 1000.0, "wall_s": 6.0}], [], now=1020.0) == 26.0
    events = [{"event": "controller_listening", "t": 990.0}]
    assert job_start_offset(rows, events, now=1020.0) == 30.0


def test_a_resume_counts_a_kept_row_whose_figures_are_null_without_them():
    # RowBook(kept rows) added None to its sums (TypeError) and iterated a null staleness (AttributeError): the
    # resumed controller died as it started; such a figure is left out of its curve, mean and counts
    old = {"iteration": 0, "reward_mean": None, "t_gen_s": None, "t_train_s": "x", "delta_s": 1.0, "staleness": None}
    row = {"iteration": 1, "reward_mean": 0.5, "t_gen_s": 2.0, "t_train_s": 1.0, "delta_s": 3.0, "staleness": {"0": 4}}
    book = RowBook([old, {k: v for k, v in row.items() if k != "staleness"} | {"staleness": {"0": None}}, row], kept=3)
    assert book.count == 3 and book.reward_curve == [0.5, 0.5]
    assert (book.mean("t_gen_s"), book.mean("t_train_s"), book.mean("delta_s")) == (2.0, 1.0, 2.3333)
    assert book.staleness == {"0": 4}


def test_the_live_status_of_a_resumed_run_shows_a_kept_rows_text_figure_as_it_is():
    # before the resumed run's first iteration the figures are the kept last row's: format('x', '.3f') of an edited
    # one was a ValueError traceback in `rlctl status`
    from rlctl.commands.status import _table

    core, _, _ = _one_iteration()
    kept = {"iteration": 0, "reward_mean": "x", "t_gen_s": None, "t_train_s": 1.0, "delta_s": 0.0, "lr": "high"}
    live = status(_snapshot(core, [kept], rows_kept=1), now=110.0)
    page = {"id": "j", "source": "controller", "live": live, "controller_latency_s": 0.01, "job_dir": "/jobs/views"}
    lines = _table(page).splitlines()
    assert [line.split()[1:] for line in lines if line.startswith("reward ")] == [["x"]]
    # its figures are the kept row's: 'figures - s old' said of them
    assert next(line for line in lines if line.startswith("iteration")).endswith(
        "(no iteration trained by this run yet)"
    )
    aged = {**page, "figures_age_s": 0.5}  # (operate's page: the live reply's own)
    assert next(line for line in _table(aged).splitlines() if line.startswith("iteration")).endswith(
        "(figures 0.5 s old)"
    )
    assert next(line for line in lines if "T_gen / T_train" in line).endswith("- / 1.00 s")
    assert training_line(live["training"]).startswith("loss -  kl -  lr high  grad norm -")


def test_the_summary_of_a_resumed_run_whose_only_rows_are_kept_ones_without_reward_failures():
    """A resumed run that trained no iteration yet: its only rows are kept ones from an older version, without
    `reward_failures` (or edited to null); the summary counts the reward pool's, versus a KeyError."""
    core, t, _ = _one_iteration()
    old = {k: v for k, v in metrics_row(_snapshot(core, []), t, wall_time=0.0).items() if k != "reward_failures"}
    pool = RewardStats(calls=5, errors=2)
    assert summary(_snapshot(core, [old], rows_kept=1, reward_stats=pool))["reward_failures"] == 2
    edited = {**old, "reward_failures": None}
    assert summary(_snapshot(core, [edited], rows_kept=1, reward_stats=pool))["reward_failures"] == 2
    assert summary(_snapshot(core, [{**old, "reward_failures": 1}], rows_kept=1))["reward_failures"] == 1


class _CountedWalks(set[str]):
    """A set that counts how often it is walked (`core.left`: its walks grow with every unit the job ever lost)."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_the_unit_gauges_zero_a_gone_units_site_once_and_walk_no_unit_that_left_before():
    # agent_gauges walked `core.left`, every unit that ever left, on every turn of the controller's loop
    cfg = CoreConfig(iterations=4, prompts_per_iteration=2, samples_per_prompt=4, max_new_tokens=8, mode="async", eta=2)
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}-{j}", [1], 4) for j in range(2)], predict=None)
    core.join("trainer-0", role="trainer", version=0)
    core.join("r0", role="rollout", version=0)
    core.join("r1", role="rollout", version=0)
    sites = {"trainer-0": "a", "r0": "b", "r1": "c"}
    m = JobMetrics()
    value = m.registry.get_sample_value
    agent_gauges(m, core, {}, sites, now=100.0)
    assert value("rlctl_rollout_units", {"site": "b"}) == 1.0
    core.lost("r0")  # its agent already left the peers (pruned): only `core` names it
    core.left = _CountedWalks(core.left)
    agent_gauges(m, core, {}, sites, now=101.0)
    agent_gauges(m, core, {}, sites, now=102.0)
    assert value("rlctl_rollout_units", {"site": "b"}) == 0.0  # and still 0 a turn later
    assert value("rlctl_rollout_units", {"site": "c"}) == 1.0
    assert _CountedWalks.walks == 0


def test_launchs_line_counts_the_running_agents_and_names_the_others() -> None:
    """A 64-unit job's line per iteration stays one short line (every agent's `name:state` ran past a thousand
    characters); the agents that do not run are named; before the controller named any, a dash (was nothing)."""
    units = [{"name": f"rollout-{i}", "state": "running"} for i in range(64)]
    assert agents_text(units) == "64 running"
    gone = [{"name": "rollout-7", "state": "lost"}, {"name": "rollout-9", "state": "stopping"}]
    assert agents_text([*units, *gone]) == "64 running, rollout-7 lost, rollout-9 stopping"
    many = [{"name": f"r{i}", "state": "lost"} for i in range(AGENTS_NAMED + 3)]
    assert (
        agents_text(many)
        == ", ".join(["0 running", *(f"r{i} lost" for i in range(AGENTS_NAMED))]) + ", 3 more not running"
    )
    assert agents_text([]) == "-"
    line = progress_line({"iteration": 1, "iterations": 5, "weight_version": 1, "agents": [*units, *gone]})
    assert line.endswith("weights v1  agents 64 running, rollout-7 lost, rollout-9 stopping") and len(line) < 200


def test_a_moes_load_balancing_loss_is_a_gauge_and_on_the_status_line_where_its_loss_has_it():
    """rlctl_train_router_aux_loss and `rlctl status`'s last step carry a Qwen3MoE's load-balancing loss, versus the
    row and trackers alone; a model whose loss has no such term reads NaN (no figure, a gap), not 0, and no status
    field."""
    core, t, _ = _one_iteration()
    m = JobMetrics()
    value = m.registry.get_sample_value
    dense = metrics_row(_snapshot(core, []), t, wall_time=0)
    iteration_gauges(m, dense, t, core.stats[0], RowBook([dense]))
    assert math.isnan(value("rlctl_train_router_aux_loss"))
    st = status(_snapshot(core, [dense]), now=110.0)
    assert "router_aux_loss" not in st["training"] and "router" not in training_line(st["training"])
    moe_t = msgspec.structs.replace(t, router_aux_loss=1.02345678)
    moe = metrics_row(_snapshot(core, []), moe_t, wall_time=0)
    iteration_gauges(m, moe, moe_t, core.stats[0], RowBook([moe]))
    assert value("rlctl_train_router_aux_loss") == 1.02345678
    st = status(_snapshot(core, [moe]), now=110.0)
    assert st["training"]["router_aux_loss"] == 1.023457
    assert training_line(st["training"]) == (
        "loss 0.1  kl 0.0123  router aux loss 1.0235  lr 2.50e-04  grad norm 0.765  entropy 1.235  clipped 0.031  "
        "no signal 0.33"
    )
    assert "  router aux loss -  " in training_line({**st["training"], "router_aux_loss": None})  # NaN: no figure


def test_the_losses_and_kls_are_gauges_nan_where_the_job_has_no_such_figure():
    """rlctl_train_loss, _kl, _kl_ref and _value_loss carry the row's figures, versus metrics.jsonl and the trackers
    alone; a GRPO job without a reference model has no critic loss nor reference KL, and an iteration that trained
    no token no off-policy KL: NaN (a gap), not 0 nor the last value."""
    core, t, _ = _one_iteration()
    m = JobMetrics()
    value = m.registry.get_sample_value
    figures = ("loss", "kl", "kl_ref", "value_loss")
    assert all(math.isnan(value(f"rlctl_train_{f}")) for f in figures)  # before the first trained iteration
    ppo_t = msgspec.structs.replace(t, kl_ref=0.0456789, value_loss=0.8765432)
    ppo = metrics_row(_snapshot(core, []), ppo_t, wall_time=0)
    iteration_gauges(m, ppo, ppo_t, core.stats[0], RowBook([ppo]))
    assert {f: value(f"rlctl_train_{f}") for f in figures} == pytest.approx({f: ppo[f] for f in figures}, abs=1e-5)
    assert (value("rlctl_train_kl_ref"), value("rlctl_train_value_loss")) == (0.0456789, 0.8765432)
    grpo_t = msgspec.structs.replace(t, loss=-0.25, kl=math.nan)  # no reference, no critic, no token trained
    grpo = metrics_row(_snapshot(core, []), grpo_t, wall_time=0)
    assert not {"kl", "kl_ref", "value_loss"} & grpo.keys()
    iteration_gauges(m, grpo, grpo_t, core.stats[0], RowBook([grpo]))
    assert value("rlctl_train_loss") == -0.25
    assert all(math.isnan(value(f"rlctl_train_{f}")) for f in ("kl", "kl_ref", "value_loss"))


@pytest.mark.parametrize(
    ("reported", "shown"),
    [
        ({}, "loss 0.1  kl 0.0123  lr"),  # GRPO at kl_coef 0: no reference, no critic
        ({"kl_ref": 0.0456789}, "loss 0.1  kl 0.0123  kl ref 0.0457  lr"),  # GRPO with a reference
        ({"kl_ref": 0.0456789, "value_loss": 0.8765432}, "loss 0.1  kl 0.0123  kl ref 0.0457  value loss 0.8765  lr"),
        ({"value_loss": 0.8765432, "router_aux_loss": 1.02345678}, "value loss 0.8765  router aux loss 1.0235  lr"),
    ],
)
def test_status_s_last_step_shows_each_loss_and_kl_the_job_s_step_reports_and_none_it_does_not(reported, shown):
    """`rlctl status` (its line and `-o json`) carries the policy's loss and off-policy KL, and the reference KL, PPO's
    critic loss and a MoE's load-balancing loss where the step reports them, versus none of the four but the last
    (they were in metrics.jsonl and the gauges alone); a figure the job has not is no key, no '-' on the line."""
    core, t, _ = _one_iteration()
    step = msgspec.structs.replace(t, **reported)
    st = status(_snapshot(core, [metrics_row(_snapshot(core, []), step, wall_time=0)]), now=110.0)
    optional = {"kl_ref": 0.045679, "value_loss": 0.87654, "router_aux_loss": 1.023457}
    assert st["training"] == {
        "loss": 0.1,
        "kl": 0.012346,
        **{k: v for k, v in optional.items() if k in reported},
        "lr": 2.5e-4,
        "grad_norm": 0.76543,
        "entropy": 1.23457,
        "clip_frac": 0.03123,
        "no_signal_frac": 0.3333,
    }
    line = training_line(st["training"])
    assert shown in line
    labels = {"kl_ref": "kl ref", "value_loss": "value loss", "router_aux_loss": "router aux loss"}
    assert [k for k, label in labels.items() if f"  {label} " in line] == [k for k in labels if k in reported]


def test_launch_s_line_per_iteration_shows_the_step_s_loss_and_kl_as_status_does():
    """`rlctl launch`'s line per iteration carries the last step's policy loss and off-policy KL, formatted as
    `rlctl status`'s last-step row shows them, versus the reward, rates and times alone (a diverging loss showed only
    in `rlctl status` or metrics.jsonl); before the first step (and where a step had none) '-'."""
    core, t, _ = _one_iteration()
    st = status(_snapshot(core, [metrics_row(_snapshot(core, []), t, wall_time=0)], job=_job(iterations=5)), now=110.0)
    line = progress_line(st)
    assert "  reward 0.500  loss 0.1  kl 0.0123  samples/s " in line
    assert training_line(st["training"]).startswith("loss 0.1  kl 0.0123  ")  # the same figures, the same format
    assert "kl ref" not in progress_line({**st, "training": {**st["training"], "kl_ref": 0.5}})  # the two alone
    before = status(_snapshot(core, []), now=100.0)
    assert "  reward -  loss -  kl -  samples/s " in progress_line(before)
    assert "  loss -  kl -  " in progress_line({k: v for k, v in before.items() if k != "training"})


def test_the_live_status_table_says_the_staleness_violations():
    # `staleness  0:4` in the table; the violations (must stay 0) were in `-o json` and the summary alone
    from rlctl.commands.status import _table

    core, t, _ = _one_iteration()
    row = metrics_row(_snapshot(core, []), t, wall_time=0)
    page = {"id": "j", "source": "controller", "controller_latency_s": 0.01, "job_dir": "/jobs/views"}
    for violations in (0, 3):
        page["live"] = status(_snapshot(core, [row], violations=violations), now=110.0)
        (staleness,) = [line.split(None, 1)[1] for line in _table(page).splitlines() if line.startswith("staleness")]
        assert staleness == f"0:2  violations {violations}"
