"""The sim-accuracy benchmark's parts that do not need a running job: the dedicated-core clock, the replay of
a job's ledger through the simulator, the overhead calibration, and the job files it launches."""

from __future__ import annotations

import itertools
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.cpuclock import DedicatedClock
from bench.jobrun import JobRun
from bench.jobsim import MeasuredProfile, Overheads, Replay, calibrate, predict_iteration_s, profile_of, replay
from bench.sim_accuracy import Case, job_dict, plan_for, trainer_cpu_s
from rlctl.config.job import JobFile
from rlctl.launch.jobdir import JobDir
from rlctl.planner.costs import TRAIN_STEP_OVERHEAD_S, TrainWorkload, decode_cost, train_time_s, trainer_layout
from rlctl.planner.sim import run_with
from rlctl.planner.simjob import MODES, IterationWork, Mode, simulate_job
from rlctl.planner.split import shard_rule
from rlctl.profiler.profile import GenerationEntry, SiteProfile, TrainingEntry
from rlctl.rl.cuts import cut_lengths, step_padded_tokens
from rlctl.rl.source import task_source

S = 1_000_000_000  # ns


def test_the_clock_advances_at_the_rate_the_job_threads_ran():
    clock = DedicatedClock(root_pid=0)  # never started: fed by hand
    clock.record(100.0, {(7, 7): (0, 0), (7, 8): (0, 0)})
    # both threads runnable the whole second, each ran a quarter of it: the job progressed 0.25 s
    clock.record(101.0, {(7, 7): (S // 4, 3 * S // 4), (7, 8): (S // 4, 3 * S // 4)})
    # nothing runnable (waiting on messages): wall time is the job's time
    clock.record(102.0, {(7, 7): (S // 4, 3 * S // 4), (7, 8): (S // 4, 3 * S // 4)})
    # a thread seen for the first time counts from its first reading, not from its birth
    clock.record(103.0, {(7, 7): (S // 4, 3 * S // 4), (7, 8): (S // 4, 3 * S // 4), (9, 9): (50 * S, 50 * S)})
    assert clock.virtual(np.array([100.0, 100.5, 101.0, 102.0, 103.0])).tolist() == pytest.approx(
        [0.0, 0.125, 0.25, 1.25, 2.25]
    )
    assert clock.cpu_s(7, 100.0, 103.0) == pytest.approx(0.5)
    assert clock.cpu_s(9, 100.0, 103.0) == 0.0
    assert clock.cpu_share == pytest.approx(0.25)


def test_overheads_go_on_the_training_and_on_each_sample_of_its_unit():
    w = IterationWork(np.array([3.0, 1.0, 2.0]), np.array([10.0, 10.0, 10.0]), 1.0, 2)
    rep = Replay([w], [np.array([0, 0, 1])], [{0: 3.0, 1: 2.0}])
    (out,) = rep.with_overheads(Overheads(trainer_s=0.5, rollout_s_per_unit=0.2))
    # the simulator applies the units' part in each unit's engine (test_planner_sim.py)
    assert (out.train_s, out.unit_delay_s) == pytest.approx((1.5, 0.2))
    assert out.unit_of is not None and out.unit_of.tolist() == [0, 0, 1]
    assert w.train_s == 1.0  # the replay itself is unchanged


def _profile() -> MeasuredProfile:
    entry = GenerationEntry(
        tp=1,
        contexts=[16, 64],
        batch_sizes=[1, 16, 64],
        ptl_s=[[1e-3, 1.5e-3, 3e-3], [1.2e-3, 2e-3, 4e-3]],
        prefill_s_per_token=1e-5,
        kv_capacity_tokens=10**9,
        padded_attention=True,
    )
    return MeasuredProfile(entry, train_s_per_token=5e-5)


def _fake_run(
    tmp_path: Path,
    *,
    iterations: int,
    truth: Overheads,
    prof: MeasuredProfile,
    mode: Mode = "sync",
    shared: bool = False,
    parallel: dict[str, Any] | None = None,
) -> JobRun:
    """A 'run' whose measured times are the simulator's own, and agents' CPU the profile's price, with `truth`;
    every iteration on both units with `shared`, else each iteration after the first on one. Its plan.json's trainer
    split: `parallel` (default one rank)."""
    spec = job_dict("demo", mode=mode, units=2, iterations=iterations)
    jd = JobDir.create("fake", explicit=tmp_path / f"job-{mode}{'-shared' if shared else ''}")
    jd.write_job(JobFile.model_validate(spec), source="test")
    parallel = parallel or {"tp": 1, "pp": 1, "dp": 1}
    ranks = parallel["tp"] * parallel["pp"] * parallel["dp"]
    trainer = {"site": "local", "ranks": ranks, "parallel": parallel}  # as `rlctl.ops.counts.plan_counts` writes it
    rollout = [{"site": "local", "units": 2, "tp": 1}]
    jd.write_json(jd.plan_json, {"trainer": trainer, "rollout": rollout, "controller_site": "local"})
    rng = np.random.default_rng(3)
    ledger = [
        {
            "prompt_id": f"p{it * 100 + p}",
            "iteration": it,
            "agent": f"rollout-{(p * 8 + k) % 2 if it == 0 or shared else it % 2}",
            "output_tokens": int(rng.integers(1, 55)),
            "state": "trained",
            "reward": float(k % 2),  # every group has signal: the learner trains it
        }
        for it in range(iterations)
        for p in range(8)
        for k in range(8)
    ]
    run = JobRun("fake", spec, jd, [], ledger, [], np.zeros(0), np.zeros(0), 1.0, 0.0, {}, {}, [], [])
    rep = replay(run, prof)
    tl = simulate_job(rep.with_overheads(truth), mode=mode, weight_sync_s=truth.weight_sync_s)
    run.end_dedicated_s = run.end_wall_s = np.array(tl.train_end_s) + 1000.0  # any origin
    for e in run.ledger:  # each iteration's generation, as simulated (in async i + 1 runs while i trains)
        e["dispatched_at"], e["finished_at"] = (
            tl.gen_start_s[e["iteration"]] + 1000.0,
            tl.gen_end_s[e["iteration"]] + 1000.0,
        )
    # the units' CPU: each share's, spread over the training intervals its generation overlaps
    rollout = np.zeros(iterations - 1)
    for it, busy in enumerate(rep.unit_busy_s):
        t0, t1 = tl.gen_start_s[it] + 1000.0, tl.gen_end_s[it] + 1000.0
        cpu = sum(busy.values()) + len(busy) * truth.rollout_s_per_unit
        for k, (a, b) in enumerate(itertools.pairwise(run.end_wall_s)):
            rollout[k] += cpu * max(0.0, min(t1, b) - max(t0, a)) / (t1 - t0)
    run.agent_cpu_s = {
        "trainer-0": [w.train_s + truth.trainer_s for w in rep.works[1:]],
        "rollout-0": rollout.tolist(),
        "rollout-1": [0.0] * (iterations - 1),
        "controller-0": [0.05] * (iterations - 1),
    }
    # the trainer's loop is its main thread; its other threads (reading messages, serving weights) run beside
    run.agent_main_cpu_s = {**run.agent_cpu_s, "trainer-0": run.agent_cpu_s["trainer-0"]}
    run.agent_cpu_s["trainer-0"] = [x + 0.02 for x in run.agent_cpu_s["trainer-0"]]
    return run


def test_replay_prices_each_unit_with_the_profile(tmp_path):
    prof = _profile()
    run = _fake_run(tmp_path, iterations=3, truth=Overheads(), prof=prof)
    rep = replay(run, prof)
    entries = [e for e in run.ledger if e["iteration"] == 1]  # one unit generated the whole iteration
    # one index per unit across the run: iteration 1 ran on rollout-1, iteration 2 on rollout-0
    assert len(rep.works) == 3 and rep.unit_of[1].tolist() == [1] * 64 and rep.unit_of[2].tolist() == [0] * 64
    assert set(rep.unit_of[0].tolist()) == {0, 1}
    source = task_source(run.jobdir.read_job(), run.jobdir.path, run.jobdir.init_model)
    prompts = np.array([len(source.prompt_tokens(e["prompt_id"])) for e in entries])
    outputs = np.array([e["output_tokens"] for e in entries])
    assert rep.works[1].sample_tokens.tolist() == (prompts + outputs).tolist()
    # at dp 1 each cut (≤ 32 rows, ≤ 1,024 padded tokens, in length order) padded to its longest row
    padded = step_padded_tokens((prompts + outputs).tolist(), 32, max_tokens=1024)
    assert padded > (prompts + outputs).sum()
    assert rep.works[1].train_s == pytest.approx(5e-5 * padded)
    prompt = round(float(prompts.mean()))
    ctx = prompt + outputs.max() / 2  # padded attention: every row attends over the longest row
    cost = decode_cost(prof.generation, context=ctx, seq_tokens=ctx, engine_max_batch=64)
    alone = run_with(cost, np.sort(outputs)[::-1], batch_cap=64, prompt_tokens=prompt)
    assert rep.unit_busy_s[1] == pytest.approx({1: float(alone.max())})
    assert rep.works[1].finish_s.max() == pytest.approx(float(alone.max()))
    # trained as the learner cuts (≤ 32 rows, ≤ 1024 padded tokens), whole groups: 8 prompts × 8 samples
    w = rep.works[1]
    assert (w.micro_batch_samples, w.micro_batch_tokens) == (32, 1024)
    assert w.group_of is not None and np.bincount(w.group_of).tolist() == [8] * 8
    pairs = set(zip((e["prompt_id"] for e in entries), w.group_of.tolist(), strict=True))
    assert len(pairs) == 8  # each prompt one group


def test_replay_leaves_out_the_groups_the_learner_skips(tmp_path):
    """GRPO without a KL term: a group whose rewards are all equal has advantages all 0, which the learner does not
    train (`StreamingLearner.add`); the replay generates it and neither cuts nor prices it, as if its rows were not
    in the step (versus trained and priced like the others until 2026-12-08). With a KL term every group trains."""
    prof = _profile()
    run = _fake_run(tmp_path, iterations=3, truth=Overheads(), prof=prof)
    flat = {f"p{it * 100 + p}" for it in range(3) for p in (0, 3, 4)}  # 3 of each iteration's 8 groups
    for e in run.ledger:
        if e["prompt_id"] in flat:
            e["reward"] = 1.0
    rep = replay(run, prof)
    for it, w in enumerate(rep.works):
        entries = [e for e in run.ledger if e["iteration"] == it]
        assert w.trained is not None
        assert w.trained.tolist() == [e["prompt_id"] not in flat for e in entries]
    # priced as a step of the other groups' rows alone
    signal = _fake_run(tmp_path / "signal", iterations=3, truth=Overheads(), prof=prof)
    signal.ledger = [e for e in run.ledger if e["prompt_id"] not in flat]
    assert [w.train_s for w in rep.works] == pytest.approx([w.train_s for w in replay(signal, prof).works])
    every = replay(_fake_run(tmp_path / "all", iterations=3, truth=Overheads(), prof=prof), prof).works
    assert all(w.train_s < 0.8 * v.train_s for w, v in zip(rep.works, every, strict=True))
    # the step waits for the skipped groups still: the training ends after the last arrival
    tl = simulate_job(rep.works, mode="stream", weight_sync_s=0.0)
    assert all(t >= g for t, g in zip(tl.train_end_s, tl.gen_end_s, strict=True))
    job = run.jobdir.read_job()
    kl = job.model_copy(update={"algorithm": job.algorithm.model_copy(update={"kl_coef": 0.1})})
    run.jobdir.write_job(kl, source="test")
    assert all(w.trained is not None and w.trained.all() for w in replay(run, prof).works)


def test_replay_cuts_as_the_plan_s_trainer_split_trains(tmp_path):
    """A run launched at dp 4 whose FSDP2 reduces once a step: its learner's budgets bound each rank's share of a cut
    and it holds its last cut to the flush, as `rlctl plan` simulates that split (`rlctl.rl.cuts`), versus dp 1 and
    every cut trained as it filled whatever the plan said. A plan of before the split (no `parallel`): every rank a
    whole replica (torch), dp its ranks."""
    prof = _profile()
    split = {"tp": 1, "pp": 1, "dp": 4, "fsdp": True, "reduce_per_step": True}
    run = _fake_run(tmp_path, iterations=3, truth=Overheads(), prof=prof, mode="async", parallel=split)
    works = replay(run, prof).works
    assert {(w.dp, w.reduce_per_step) for w in works} == {(4, True)}
    # an iteration's 64 rows of 5–70 tokens, in budgets of 32 rows and 1,024 padded tokens a rank: 1 cut at dp 4
    # (4 shares, each a run of the length order), 4 at dp 1; the async learner then trains (and holds) other cuts, its
    # training ends elsewhere
    rows = works[1].sample_tokens.tolist()
    assert [len(cut_lengths(rows, 32, max_tokens=1024, ranks=r)) for r in (4, 1)] == [1, 4]
    # at the same price a token (each work's train_s), dp 4's cut (64 rows: 4 shares to the budgets) fills later than
    # dp 1's first of 4, trained as they fill: every iteration's training ends later (0.182 s, versus 0.170 s the first)
    one = simulate_job([replace(x, dp=1, reduce_per_step=False) for x in works], mode="async", weight_sync_s=0.0)
    four = simulate_job(works, mode="async", weight_sync_s=0.0)
    assert all(a > b for a, b in zip(four.train_end_s, one.train_end_s, strict=True)), (four, one)
    plan = run.jobdir.read_plan()
    run.jobdir.write_json(run.jobdir.plan_json, {**plan, "trainer": {"site": "local", "ranks": 3}})
    assert {(w.dp, w.reduce_per_step) for w in replay(run, prof).works} == {(3, False)}


def test_replay_prices_a_step_as_the_planner_prices_its_split(tmp_path):
    """A run launched at dp 4 (FSDP2, reducing once a step): each step's training is what `rlctl plan` prices that
    split at for the step's own rows (`costs.train_time_s`: each cut at its busiest rank's share padded, and the
    gradient reduction), less the planner's optimizer-step constant (calibrated here: `Overheads.trainer_s`),
    versus one rank's price of all the step's tokens whatever the dp. At dp 1: one rank's price of its cuts padded."""
    prof = _profile()
    split = {"tp": 1, "pp": 1, "dp": 4, "fsdp": True, "reduce_per_step": True}
    run = _fake_run(tmp_path, iterations=3, truth=Overheads(), prof=prof, mode="async", parallel=split)
    works = replay(run, prof).works
    job = run.jobdir.read_job()
    rule = shard_rule(job, job.model.arch)
    # a replica that fits one GPU only sharded (80 GB of 80), so the planner decides the plan's FSDP2, held once a step
    entry = TrainingEntry(tp=1, pp=1, gpu_s_per_token=5e-5, fixed_bytes_per_gpu=0.0, sharded_bytes_per_gpu=80e9)
    # this machine's site (a CPU host: its ranks reduce over gloo, `costs.host_link_bytes_per_s`)
    site = SiteProfile(gpu="CPU", gpus_per_node=8, hbm_bytes=80e9, cost_per_gpu_hour=1.0, training=[entry])
    for w in works:
        rows = tuple(w.sample_tokens.tolist())
        tw = TrainWorkload(
            sum(rows),
            len(rows),
            32,
            micro_batch_tokens=1024,
            row_tokens=rows,
            **{f.name: getattr(rule, f.name) for f in fields(rule)},
        )
        assert trainer_layout(tw, entry, dp=4, hbm_bytes=site.hbm_bytes) == (True, True)
        planned = train_time_s(entry, 4, tw, site=site, node_bytes_per_s=25e9, hosts=1)
        assert w.train_s == pytest.approx(planned - TRAIN_STEP_OVERHEAD_S, rel=1e-12)
        assert w.train_s < 0.5 * 5e-5 * sum(rows)  # its cuts' rows over 4 ranks, not one rank's price
    one = _fake_run(tmp_path / "dp1", iterations=3, truth=Overheads(), prof=prof, mode="async")
    rows_1 = [step_padded_tokens(w.sample_tokens.tolist(), 32, max_tokens=1024) for w in replay(one, prof).works]
    assert [w.train_s for w in replay(one, prof).works] == pytest.approx([5e-5 * r for r in rows_1], rel=1e-12)
    run.jobdir.write_json(
        run.jobdir.plan_json,
        {**run.jobdir.read_plan(), "trainer": {"site": "local", "ranks": 2, "parallel": {"tp": 2, "pp": 1, "dp": 1}}},
    )
    with pytest.raises(ValueError, match=r"trainer\.parallel tp 2 pp 1: jobsim prices tp 1 pp 1"):
        replay(run, prof)


def test_calibration_recovers_the_overheads_the_runs_had(tmp_path):
    """The trainer's from each run (by pipeline mode), the units' (per unit: each fetches and loads the weights every
    iteration) and the hops from the sync run, whose 2 units do nothing beside their shares."""
    prof = _profile()
    truth = Overheads(trainer_s=0.03, rollout_s_per_unit=0.012, weight_sync_s=0.02)
    sync = _fake_run(tmp_path, iterations=6, truth=truth, prof=prof, shared=True)
    # the async run's units are busier beside their shares: not what a unit's own overhead is read from
    cpu_run = _fake_run(tmp_path, iterations=6, truth=replace(truth, rollout_s_per_unit=0.05), prof=prof, mode="async")
    got = calibrate(sync, cpu_run, prof, warmup=1)
    assert (got.trainer_s, got.rollout_s_per_unit, got.weight_sync_s) == pytest.approx((0.03, 0.012, 0.02), abs=1e-9)
    predicted, _ = predict_iteration_s(replay(sync, prof), sync.jobdir.read_job(), got, warmup=1)
    assert predicted == pytest.approx(sync.iteration_s(warmup=1))
    bare, _ = predict_iteration_s(replay(sync, prof), sync.jobdir.read_job(), Overheads(), warmup=1)
    assert bare < predicted
    # the per-unit cost delays each unit's share (the simulator releases it that much after the weights)
    (w,) = Replay([replay(sync, prof).works[2]], [replay(sync, prof).unit_of[2]], [{}]).with_overheads(got)
    assert w.unit_delay_s == pytest.approx(0.012) and w.shares is not None and len(w.shares) == 2
    # --quick: the sync run for all of it
    assert calibrate(sync, sync, prof, warmup=1) == pytest.approx(got)


def test_the_trainers_overhead_is_calibrated_per_pipeline_kind(tmp_path):
    """Sync jobs take the sync run's figure, async jobs, where samples arrive while the trainer trains (2–3× the
    CPU for the demo job), the async run's, and stream jobs, where they do for part of the training, the mean."""
    prof = _profile()
    sync = _fake_run(tmp_path, iterations=6, truth=Overheads(trainer_s=0.02), prof=prof, shared=True)
    cpu_run = _fake_run(tmp_path, iterations=6, truth=Overheads(trainer_s=0.04), prof=prof, mode="async")
    got = calibrate(sync, cpu_run, prof, warmup=1)
    assert (got.trainer_s, got.trainer_s_overlapped) == pytest.approx((0.02, 0.04))
    assert [got.for_mode(m).trainer_s for m in MODES] == pytest.approx([0.02, 0.03, 0.04])
    assert all(got.for_mode(m).for_mode(m) == got.for_mode(m) for m in MODES)  # resolved once for all
    one = calibrate(sync, sync, prof, warmup=1)  # one run: its figure for every mode
    assert [one.for_mode(m).trainer_s for m in MODES] == pytest.approx([0.02, 0.02, 0.02])
    rep = replay(cpu_run, prof)
    for mode in MODES:  # the simulator prices each job with its mode's figure
        job = JobFile.model_validate(job_dict("demo", mode=mode, units=1, iterations=6))
        own = replace(got, trainer_s={"sync": 0.02, "stream": 0.03, "async": 0.04}[mode], trainer_s_overlapped=None)
        other = replace(own, trainer_s=own.trainer_s + 0.01)
        assert predict_iteration_s(rep, job, got, warmup=1) == predict_iteration_s(rep, job, own, warmup=1)
        assert predict_iteration_s(rep, job, got, warmup=1)[0] != predict_iteration_s(rep, job, other, warmup=1)[0]


def test_each_calibration_run_is_priced_by_its_own_profile(tmp_path):
    """A run measured on a slower machine (its profile 1.5× the other's) gives the same overheads when each run
    is priced by the profile measured right before it."""
    prof = _profile()
    slow = MeasuredProfile(
        prof.generation.model_copy(update={"ptl_s": (np.array(prof.generation.ptl_s) * 1.5).tolist()}),
        prof.train_s_per_token * 1.5,
    )
    truth = Overheads(trainer_s=0.03, rollout_s_per_unit=0.012, weight_sync_s=0.02)
    sync = _fake_run(tmp_path, iterations=6, truth=truth, prof=prof, shared=True)
    cpu_run = _fake_run(tmp_path, iterations=6, truth=truth, prof=slow, mode="async")
    got = calibrate(sync, cpu_run, prof, cpu_prof=slow, warmup=1)
    assert (got.trainer_s, got.rollout_s_per_unit, got.weight_sync_s) == pytest.approx((0.03, 0.012, 0.02), abs=1e-9)
    assert got.trainer_s_overlapped == pytest.approx(0.03, abs=1e-9)
    assert calibrate(sync, cpu_run, prof, warmup=1).trainer_s_overlapped > 0.06  # by the other run's profile: 0.087


@pytest.mark.parametrize("kind", ["demo", "hf"])
def test_the_benchmark_jobs_are_valid_job_files_and_calibration_draws_other_prompts(kind):
    for mode in MODES:
        spec = JobFile.model_validate(job_dict(kind, mode=mode, units=3, iterations=4))
        assert spec.pipeline.mode == mode and spec.batch.samples_per_iteration <= spec.rollout.max_batch_size
        calib = JobFile.model_validate(job_dict(kind, mode=mode, units=3, iterations=4, calibration=True))
        key = "seed" if kind == "demo" else "shuffle_seed"  # another stream of prompts
        assert getattr(calib.task, key) != getattr(spec.task, key) and calib.seed != spec.seed


def test_a_runs_profile_is_the_median_of_every_probe_before_and_after_it():
    """Cell by cell, over the probes on both sides of the run (a slow minute before it, a fast one after)."""

    def probe(scale: float) -> dict:
        g = _profile().generation
        ptl = (np.array(g.ptl_s) * scale).tolist()
        return {
            "generation": [g.model_copy(update={"ptl_s": ptl, "prefill_s_per_token": 1e-5 * scale}).model_dump()],
            "training": {"gpu_s_per_token": 2e-4 * scale},
        }

    before, after = [probe(x) for x in (1.4, 1.5, 1.6)], [probe(x) for x in (1.0, 1.1)]
    got = profile_of(before + after)
    assert np.array(got.generation.ptl_s) == pytest.approx(np.array(_profile().generation.ptl_s) * 1.4)
    assert (got.generation.prefill_s_per_token, got.train_s_per_token) == pytest.approx((1.4e-5, 2.8e-4))
    assert profile_of(before).train_s_per_token == pytest.approx(3e-4)  # before only: the slow minute's


def test_quick_runs_the_demo_job_once_per_mode_and_full_adds_units_the_trainer_at_dp_2_and_the_hf_job():
    quick = plan_for(quick=True, hf_built=True)
    assert quick.cases == [Case("demo", m, 1) for m in MODES] and quick.kinds == ["demo"]
    assert quick.calibration == [("sync", 2)]
    assert plan_for(quick=False, hf_built=True).calibration == [("sync", 2), ("async", 1)]
    full = plan_for(quick=False, hf_built=True)
    assert not quick.bracket and full.bracket and full.run_probes == 5  # probes after each run too
    assert {(c.job, c.mode) for c in full.cases} == {(k, m) for k in ("demo", "hf") for m in MODES}
    assert {c.units for c in full.cases} == {1, 2, 3} and full.warmup < full.iterations - 2
    # the demo job's trainer at dp 2 (one unit), in every mode; the calibration runs stay at dp 1
    assert [c for c in full.cases if c.dp > 1] == [Case("demo", m, 1, dp=2) for m in MODES]
    assert all(c.job == "demo" for c in plan_for(quick=False, hf_built=False).cases)


def test_modes_units_and_dp_keep_only_those_cases_and_the_jobs_they_need():
    some = plan_for(quick=False, hf_built=True, modes=["async"], units=[2, 3])
    assert some.cases == [Case("demo", "async", 2), Case("demo", "async", 3), Case("hf", "async", 3)]
    assert some.kinds == ["demo", "hf"] and some.calibration == [("sync", 2), ("async", 1)]
    assert plan_for(quick=False, hf_built=True, units=[2]).kinds == ["demo"]  # the HF job runs 1 and 3 units
    assert plan_for(quick=False, hf_built=True, modes=["sync"], dps=[2]).cases == [Case("demo", "sync", 1, dp=2)]
    with pytest.raises(ValueError, match="no case"):
        plan_for(quick=True, hf_built=False, units=[3])
    with pytest.raises(ValueError, match=r"no case .* dp \[2\]"):
        plan_for(quick=False, hf_built=False, units=[3], dps=[2])


def test_a_dp_2_case_places_the_trainer_on_two_slots_the_planner_splits_as_dp_2():
    """The job file's trainer placement is the data-parallel ranks the launch's plan gives it (torch: a replica
    a rank), so the run replays at dp 2 (`bench.jobsim.replay` reads plan.json's trainer.parallel)."""
    spec = JobFile.model_validate(job_dict("demo", mode="sync", units=1, iterations=4, dp=2))
    assert spec.placement.trainer.gpus == 2 and spec.trainer.backend == "torch"


def test_the_training_phase_as_run_is_its_busiest_ranks_main_thread(tmp_path):
    """At dp 2 each rank trains its share of every cut and waits for the other in the reduction: the phase is the
    busier rank's loop, interval by interval, not rank 0's alone (nor the ranks' sum); at dp 1 it is trainer-0's."""
    prof = _profile()
    split = {"tp": 1, "pp": 1, "dp": 2}
    run = _fake_run(tmp_path, iterations=4, truth=Overheads(), prof=prof, parallel=split)
    run.agent_main_cpu_s["trainer-0"] = [0.30, 0.10, 0.20]
    run.agent_main_cpu_s["trainer-1"] = [0.25, 0.15, 0.20]
    assert trainer_cpu_s(run) == [0.30, 0.15, 0.20]
    del run.agent_main_cpu_s["trainer-1"]
    assert trainer_cpu_s(run) == [0.30, 0.10, 0.20]


def test_the_first_calibration_run_is_priced_by_the_first_profiles_probes_not_by_the_same_probes_again(monkeypatch):
    """The job kind's first profile is probed right before the first calibration run, of what that run's own probes
    measure (model, engine, algorithm, batch): those probes price it, versus probing again at once (5 probes in a full
    run, one of 5 in --quick's ~1 min)."""
    from types import SimpleNamespace

    import bench.sim_accuracy as sa

    events: list[tuple[str, Any]] = []

    def probes(job: JobFile, *, repeats: int) -> list[dict[str, Any]]:
        events.append(("probe", repeats))
        return [{"probe": i} for i in range(repeats)]

    def launch(spec: dict[str, Any], *, workdir: Path, name: str) -> Any:
        events.append(("launch", name))
        return SimpleNamespace(name=name)

    monkeypatch.setattr(sa, "_probes", probes)
    monkeypatch.setattr(sa, "launch", launch)
    monkeypatch.setattr(sa, "profile_of", lambda ps: len(ps))
    monkeypatch.setattr(sa, "calibrate", lambda *a, **k: Overheads(trainer_s_overlapped=0.0))
    monkeypatch.setattr(sa, "_predict", lambda *a, **k: {})
    full = plan_for(quick=False, hf_built=False)
    first = [{"first": i} for i in range(full.run_probes)]
    cal = sa._calibrate("demo", full, _profile(), workdir=Path("/nonexistent"), first_probes=first)
    assert events == [
        ("launch", "demo-calibration-sync"),
        ("probe", 5),  # after it (bracket)
        ("probe", 5),  # before the async one
        ("launch", "demo-calibration-async"),
        ("probe", 5),
    ]
    assert cal.report["runs"] == ["sync, 2 unit(s), other prompts", "async, 1 unit(s), other prompts"]
    events.clear()  # a first profile of another count of probes than a run's: the run is probed as ever
    quick = plan_for(quick=True, hf_built=False)
    sa._calibrate("demo", quick, _profile(), workdir=Path("/nonexistent"), first_probes=first)
    assert events == [("probe", 1), ("launch", "demo-calibration-sync")]
