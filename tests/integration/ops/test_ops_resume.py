"""Long runs survive: a trainer SIGKILLed mid-run (held there by its reward, one iteration or two past a
checkpoint, whatever this machine's speed) ends the job with the resume command; `launch --resume`
continues from the latest complete checkpoint (policy, optimizer, RNG, ledger, ranker) and every prompt of
the run is trained exactly once in the lineage of the final model — with the torch trainer on one rank and
on two (data parallel: rank 0 writes the one shard, both ranks restore it), and with the Megatron trainer at
tensor parallel 2 (dp 1: each rank writes and restores its own optimizer shard; a plan split otherwise than
the checkpoint is refused). A rollout unit SIGKILLed mid-generation is replaced on its site while its
in-flight samples are generated again by the others."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import yaml

from rlctl.checkpoint.controller import sample_rows
from rlctl.launch.jobdir import JobDir
from rlctl.rl.schedule import StepLr
from tests.integration.agents.test_agents_megatron_job import split_model
from tests.unit.trainers.megatron_required import require_megatron

from .conftest import (
    REPO,
    events,
    held_past_checkpoint,
    hf_job,
    job_yaml,
    metrics_rows,
    rlctl,
    rlctl_json,
    wait_for,
    why_not_done,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

LOCAL = str(REPO / "clusters" / "local.yaml")


def pid_of(job_dir, agent: str) -> int:
    return [e["pid"] for e in events(job_dir) if e["event"] == "agent_joined" and e["agent"] == agent][-1]


def held_then_killed(tmp_path, launcher, job, job_dir, every: int) -> int:
    """Launch `job` (an `hf_job`), SIGKILL trainer-0 where its reward holds the run (one iteration or two past
    checkpoint `every`), check that the failure names the resume command, let go of the hold; the version
    of the latest checkpoint."""
    proc = launcher(str(job), "--job-dir", str(job_dir), "-o", "json")
    held_past_checkpoint(tmp_path, job_dir, every, proc)
    os.kill(pid_of(job_dir, "trainer-0"), signal.SIGKILL)
    (tmp_path / "hold").unlink()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"rlctl launch --resume {JobDir(job_dir).id}" in err, err[-2000:]  # the failure names the resume command
    assert len(metrics_rows(job_dir)) in (every + 1, every + 2)
    latest = json.loads((job_dir / "checkpoints" / "latest.json").read_text())["version"]
    assert latest == every
    return latest


@pytest.mark.parametrize("trainer_gpus", [1, 2], ids=["dp1", "dp2"])
def test_trainer_killed_then_resumed_trains_every_prompt_exactly_once(tmp_path, launcher, trainer_gpus):
    iterations, prompts, job_dir = 12, 4, tmp_path / "run"
    # a learning rate that warms up over 5 iterations and then decays: the resumed trainer steps on from the
    # checkpoint's version (a restart from step 0 would warm up again)
    schedule = {"lr_warmup_iterations": 5, "lr_decay": "cosine", "min_lr_ratio": 0.1}
    job = hf_job(
        tmp_path,
        job_dir=job_dir,
        iterations=iterations,
        every=3,
        placement={"trainer": {"site": "local", "gpus": trainer_gpus}, "rollout": [{"site": "local", "gpus": 2}]},
        algorithm={"kind": "grpo", "lr": 1.0e-4, **schedule},
    )
    latest = held_then_killed(tmp_path, launcher, job, job_dir, every=3)
    before = [r["iteration"] for r in metrics_rows(job_dir)]

    code, s = rlctl_json("launch", "--resume", str(job_dir), timeout_s=300)
    assert code == 0 and s["state"] == "done", why_not_done(job_dir, s)
    rows = metrics_rows(job_dir)
    assert [r["iteration"] for r in rows] == list(range(iterations))  # the curve continues from the checkpoint
    rate = StepLr(warmup=5, decay="cosine", total=iterations, floor=0.1)
    assert [r["lr"] for r in rows] == pytest.approx([1.0e-4 * rate.at(i) for i in range(iterations)], rel=1e-9)
    discarded = job_dir / "metrics.discarded.jsonl"
    past = [json.loads(x)["iteration"] for x in discarded.read_text().splitlines()]
    assert past and sorted(past) == [i for i in before if i >= latest]  # what the killed run trained past it
    # … and the rounds of it the ledger had retired (none when a slow group of the checkpoint's round was still out
    # when the hold began: the floor waits for it; which happens depends on this machine's speed)
    gone_file = job_dir / "samples.discarded.jsonl"
    gone = [json.loads(x) for x in gone_file.read_text().splitlines()] if gone_file.exists() else []
    assert {e["iteration"] for e in gone} <= set(past)
    assert [e["samples_discarded"] for e in events(job_dir) if e["event"] == "resumed_from"] == [len(gone)]
    # every prompt trained exactly once in the final model's lineage: the last checkpoint's ledger
    samples = sample_rows(JobDir(job_dir), iterations)  # the sample log up to the last checkpoint, and its ledger
    assert len({e["prompt_id"] for e in samples}) == iterations * prompts
    assert len({e["sample_id"] for e in samples}) == len(samples) and all(e["state"] == "trained" for e in samples)
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == iterations * prompts
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    assert s["resilience"]["resumes"] == 1
    # the optimizer state the trainer restored is the one it saved (its digest, checked by the trainer too); at
    # dp 2 rank 0 wrote the one shard (the replicas' state is the same) and both ranks restored it
    ckpt = job_dir / "checkpoints" / f"iter-{latest}"
    manifest = json.loads((ckpt / "MANIFEST.trainer.json").read_text())
    assert manifest["split"] == {"tp": 1, "pp": 1, "dp": trainer_gpus, "world": trainer_gpus}
    ranks = list(range(trainer_gpus))
    assert manifest["ranks"] == [
        {"rank": 0, "file": "ranks/rank-0.pt", "optimizer_sha256": manifest["optimizer_sha256"], "restored_by": ranks}
    ]
    assert sorted(p.name for p in (ckpt / "ranks").iterdir()) == ["rank-0.pt"]
    for rank in ranks:
        log = (job_dir / "logs" / f"trainer-{rank}.log").read_text()
        restored = re.findall(rf"restored iter-{latest}: optimizer state sha256 ([0-9a-f]+), as saved", log)
        assert restored == [manifest["optimizer_sha256"]], log[-2000:]
    resumed = [e for e in events(job_dir) if e["event"] == "resumed_from"]
    assert [e["version"] for e in resumed] == [latest]

    code, st = rlctl_json("status", str(job_dir))  # after the end: the totals, resumes and replaced units
    assert code == 0 and st["ledger"]["trained"] == iterations * prompts and st["resilience"]["resumes"] == 1, st
    assert st["controller"] == "exited: the job ended (done)", st["controller"]  # not an error
    print(f"\nresumed from v{latest}; {len(past)} iteration(s) trained past it were discarded and redone")
    if trainer_gpus == 1:
        trained_on(job_dir, iterations, prompts, schedule)
        rolled_back(job_dir, iterations, prompts)


def trained_on(job_dir, iterations: int, prompts: int, schedule: dict) -> None:
    """The finished job trains 2 iterations more (`launch --resume --iterations`): from its last checkpoint, the
    curve and the ledger continue, each prompt once, the rate's decay now ending at the new count."""
    code, s = rlctl_json("launch", "--resume", str(job_dir), "--iterations", str(iterations + 2), timeout_s=300)
    assert code == 0 and s["state"] == "done", why_not_done(job_dir, s)
    more = iterations + 2
    rows = metrics_rows(job_dir)
    assert [r["iteration"] for r in rows] == list(range(more))
    rate = StepLr(warmup=5, decay="cosine", total=more, floor=0.1)
    assert [r["lr"] for r in rows[iterations:]] == pytest.approx([1.0e-4 * rate.at(i) for i in range(iterations, more)])
    assert [e["version"] for e in events(job_dir) if e["event"] == "resumed_from"][-1] == iterations
    samples = sample_rows(JobDir(job_dir), more)
    assert len({e["prompt_id"] for e in samples}) == more * prompts and len(samples) == len(
        {e["sample_id"] for e in samples}
    )
    assert s["ledger"]["trained"] == more * prompts and (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    assert (job_dir / "checkpoints" / f"iter-{more}" / "model" / "config.json").exists()


def test_a_failed_run_resumes_by_itself_with_auto_resume(tmp_path, launcher):
    """`checkpoint.auto_resume: 1`: the trainer SIGKILLed past checkpoint v3 fails the run; the same launcher resumes
    it from v3 without the operator, and the job ends done with every prompt trained once in its lineage."""
    iterations, prompts, job_dir = 10, 4, tmp_path / "run"
    job = hf_job(tmp_path, job_dir=job_dir, iterations=iterations, every=3)
    spec = yaml.safe_load(job.read_text())
    spec["checkpoint"]["auto_resume"] = 1
    job.write_text(yaml.safe_dump(spec))
    proc = launcher(str(job), "--job-dir", str(job_dir), "-o", "json")
    held_past_checkpoint(tmp_path, job_dir, 3, proc)
    os.kill(pid_of(job_dir, "trainer-0"), signal.SIGKILL)
    (tmp_path / "hold").unlink()
    out, err = proc.communicate(timeout=300)
    s = json.loads(out) if out.strip() else {}
    assert proc.returncode == 0 and s.get("state") == "done", (proc.returncode, err[-3000:])
    said = [line for line in err.splitlines() if "resuming it from" in line]
    # the launcher saw how the rank ended, which the controller (its connection closed) cannot tell
    first = "job hf-demo failed: trainer rank 0 (trainer-0) exited with -9 (SIGKILL); trainer trainer-0 was lost ("
    assert len(said) == 1 and said[0].startswith(first), err[-3000:]
    assert said[0].endswith("; resuming it from checkpoint v3 (checkpoint.auto_resume: 0 more left)"), said
    assert "resumed from checkpoint v3" in err, err[-3000:]
    auto = [e for e in events(job_dir) if e["event"] == "auto_resume"]
    assert [(e["version"], e["left"]) for e in auto] == [(3, 0)] and "trainer-0" in auto[0]["after"], auto
    assert [r["iteration"] for r in metrics_rows(job_dir)] == list(range(iterations))
    samples = sample_rows(JobDir(job_dir), iterations)  # every prompt trained exactly once in the final lineage
    assert len({e["prompt_id"] for e in samples}) == iterations * prompts
    assert len({e["sample_id"] for e in samples}) == len(samples) and all(e["state"] == "trained" for e in samples)
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == iterations * prompts
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0) and s["resilience"]["resumes"] == 1
    code, rows = rlctl_json("status", "--all")
    assert code == 0 and next(r["state"] for r in rows if r["id"] == JobDir(job_dir).id) == "finished", rows


MEGATRON_ITERATIONS, MEGATRON_PROMPTS = 6, 4  # the megatron resume tests' job: 6 iterations of 4 prompts


def megatron_tp2_killed(tmp_path: Path, launcher, job_dir: Path, *, pp: int) -> int:
    """A megatron job of two trainer ranks at tp 2 (its model split so that tp 2 and `pp` divide it: 2 heads, an even
    vocabulary, `pp` layers) run to a checkpoint and its trainer-0 SIGKILLed; the checkpoint's version."""
    require_megatron()
    job = hf_job(
        tmp_path,
        job_dir=job_dir,
        iterations=MEGATRON_ITERATIONS,
        every=3,
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer={"backend": "megatron", "tensor_parallel": 2},
    )
    split_model(tmp_path / "model", tp=2, pp=pp)
    return held_then_killed(tmp_path, launcher, job, job_dir, every=3)


def trained_every_prompt_once(job_dir: Path, s: dict) -> None:
    """The resumed megatron job (`megatron_tp2_killed`) trained each of its iterations, every prompt once: its
    metrics, its sample log up to the last checkpoint, and its ledger."""
    iterations, prompts = MEGATRON_ITERATIONS, MEGATRON_PROMPTS
    assert [r["iteration"] for r in metrics_rows(job_dir)] == list(range(iterations))
    samples = sample_rows(JobDir(job_dir), iterations)
    assert len({e["prompt_id"] for e in samples}) == iterations * prompts
    assert len({e["sample_id"] for e in samples}) == len(samples) and all(e["state"] == "trained" for e in samples)
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == iterations * prompts
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)


def test_a_megatron_tp2_trainer_killed_then_resumed_trains_every_prompt_exactly_once(tmp_path, launcher):
    """Two trainer ranks holding half of the model each (megatron tp 2 over gloo): both write their optimizer
    shard into every checkpoint; trainer-0 is SIGKILLed after one; `launch --resume` restores each rank's own
    shard (the digest the manifest records for it) and the job finishes with every prompt trained once."""
    job_dir = tmp_path / "run"
    latest = megatron_tp2_killed(tmp_path, launcher, job_dir, pp=1)
    manifest = json.loads((job_dir / "checkpoints" / f"iter-{latest}" / "MANIFEST.trainer.json").read_text())
    assert manifest["split"] == {"tp": 2, "pp": 1, "dp": 1, "world": 2}
    assert [r["file"] for r in manifest["ranks"]] == ["ranks/rank-0.pt", "ranks/rank-1.pt"]

    code, s = rlctl_json("launch", "--resume", str(job_dir), timeout_s=400)
    assert code == 0 and s["state"] == "done", why_not_done(job_dir, s)
    trained_every_prompt_once(job_dir, s)
    assert s["resilience"]["resumes"] == 1
    for rank in (0, 1):  # each rank restored its own shard, the optimizer state it saved
        log = next(job_dir.glob(f"**/trainer-{rank}*.log")).read_text()
        restored = re.findall(rf"restored iter-{latest}: optimizer state sha256 ([0-9a-f]+), as saved \(rank", log)
        assert restored == [manifest["ranks"][rank]["optimizer_sha256"]], log[-2000:]
    print(f"\nmegatron tp 2 resumed from v{latest}; both ranks restored their own optimizer shard")


def test_a_megatron_tp2_trainer_killed_then_resumed_at_tp1_pp2_by_trainer_split_trains_every_prompt_exactly_once(
    tmp_path, launcher
):
    """The trainer moved to another split on resume: `launch --resume JOB --trainer-split tp=1,pp=2` (shown first by
    --dry-run, nothing written) rewrites plan.json's trainer section, and each rank rebuilds its optimizer state from
    the tp 2 shards (`rlctl.checkpoint.resplit`); the job finishes with every prompt trained once. Versus a resume
    that always ran the plan's split (plan.json edited by hand was the only way to another)."""
    job_dir = tmp_path / "run"
    latest = megatron_tp2_killed(tmp_path, launcher, job_dir, pp=2)
    plan_json = job_dir / "plan.json"
    assert json.loads(plan_json.read_text())["trainer"]["parallel"] == {"tp": 2, "pp": 1, "dp": 1}

    dry = rlctl("launch", "--resume", str(job_dir), "--trainer-split", "tp=1,pp=2", "--dry-run", timeout_s=120)
    assert dry.returncode == 0 and "tp2 pp1 dp1 (2 ranks) → tp1 pp2 dp1 (2 ranks)" in dry.stdout, dry.stderr
    assert json.loads(plan_json.read_text())["trainer"]["parallel"] == {"tp": 2, "pp": 1, "dp": 1}
    bad = rlctl("launch", "--resume", str(job_dir), "--trainer-split", "tp=3", timeout_s=120)  # 2 heads
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--trainer-split tp=3: tp 3" in bad.stderr, bad

    code, s = rlctl_json("launch", "--resume", str(job_dir), "--trainer-split", "tp=1,pp=2", timeout_s=400)
    assert code == 0 and s["state"] == "done", why_not_done(job_dir, s)
    assert json.loads(plan_json.read_text())["trainer"] == {
        "site": "local",
        "ranks": 2,
        "parallel": {"tp": 1, "pp": 2, "dp": 1},
    }
    trained_every_prompt_once(job_dir, s)
    for rank in (0, 1):  # each pipeline stage rebuilt its optimizer state from both tp 2 shards of its layers
        log = next(job_dir.glob(f"**/trainer-{rank}*.log")).read_text()
        rebuilt = f"checkpoint iter-{latest} was written at tp2 pp1 dp1 and is resumed at tp1 pp2 dp1: rank {rank} "
        assert rebuilt in log, log[-2000:]


def test_an_fsdp_trainer_killed_then_resumed_at_dp3_by_trainer_split_trains_every_prompt_exactly_once(
    tmp_path, launcher
):
    """A torch trainer sharded by FSDP2 over 2 ranks (`trainer.shard: fsdp`), its trainer-0 SIGKILLed past a
    checkpoint, resumed on 3 (`launch --resume JOB --trainer-split dp=3`: the plan's trainer sharded at dp 3, as a
    launch there would be): each rank rebuilds its part of the policy and of AdamW's state from both old ranks'
    shards (`rlctl.checkpoint.refsdp`), and the job finishes with every prompt trained once. Versus refused at the
    option (FSDP's sharded state was restored at its own split alone)."""
    job_dir = tmp_path / "run"
    job = hf_job(
        tmp_path,
        job_dir=job_dir,
        iterations=MEGATRON_ITERATIONS,
        every=3,
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer={"shard": "fsdp"},
    )
    latest = held_then_killed(tmp_path, launcher, job, job_dir, every=3)
    manifest = json.loads((job_dir / "checkpoints" / f"iter-{latest}" / "MANIFEST.trainer.json").read_text())
    assert manifest["split"] == {"tp": 1, "pp": 1, "dp": 2, "world": 2, "fsdp": True}

    code, s = rlctl_json("launch", "--resume", str(job_dir), "--trainer-split", "dp=3", timeout_s=400)
    assert code == 0 and s["state"] == "done", why_not_done(job_dir, s)
    trainer = json.loads((job_dir / "plan.json").read_text())["trainer"]
    assert trainer["ranks"] == 3 and trainer["parallel"]["fsdp"] is True and trainer["parallel"]["dp"] == 3
    trained_every_prompt_once(job_dir, s)
    # each rank rebuilt its part from the old ranks' shards its rows overlap (FSDP2's rows, `refsdp.shards_read`): the
    # first third of every tensor lies in old rank 0's half, the last third in old rank 1's, the middle one in both
    for rank, read in ((0, "0"), (1, "0,1"), (2, "1")):
        log = next(job_dir.glob(f"**/trainer-{rank}*.log")).read_text()
        rebuilt = (
            f"checkpoint iter-{latest} was written at tp1 pp1 dp2 fsdp and is resumed at tp1 pp1 dp3 fsdp: rank {rank} "
            f"rebuilt its state from ranks {read}' shards"
        )
        assert rebuilt in log, log[-2000:]


def test_a_rollout_unit_killed_mid_generation_is_replaced(tmp_path, launcher):
    job = job_yaml(
        tmp_path / "heal.yaml",
        inventory=[LOCAL],
        trainer="local",
        rollout="local",
        rollout_gpus=2,
        iterations=100_000,  # runs until the test stops it: how fast this machine trains does not matter
        task={"kind": "digits", "median_output_tokens": 24, "max_output_tokens": 64},
    )
    job_dir = tmp_path / "run"
    proc = launcher(str(job), "--job-dir", str(job_dir))
    wait_for("two trained iterations", lambda: len(metrics_rows(job_dir)) >= 2, 240, alive=proc)
    os.kill(pid_of(job_dir, "rollout-1"), signal.SIGKILL)
    wait_for("the replacement to join", lambda: any(e["event"] == "unit_replaced" for e in events(job_dir)), 120)
    rep = next(e for e in events(job_dir) if e["event"] == "unit_replaced")
    assert rep["lost"] == "rollout-1" and rep["site"] == "local"
    by = rep["by"]
    wait_for(
        "the replacement to work in a trained iteration",
        lambda: any(by in r["agents"] and r["agents"][by]["busy_s"] > 0 for r in metrics_rows(job_dir)),
        120,
        alive=proc,
    )
    lost = next(e for e in events(job_dir) if e["event"] == "agent_lost" and e["agent"] == "rollout-1")
    code, st = rlctl_json("status", str(job_dir))
    assert code == 0 and st["resilience"]["replaced"] == 1 and st["ledger"]["duplicated"] == 0, st
    code, stopped = rlctl_json("stop", str(job_dir), timeout_s=120)
    assert code == 0, stopped
    proc.wait(timeout=60)
    s = json.loads((job_dir / "summary.json").read_text())
    assert s["ledger"]["lost"] == 0 and s["ledger"]["duplicated"] == 0
    print(f"\nrollout-1 lost ({lost['requeued']} samples requeued), replaced by {by}")
    assert rlctl("logs", str(job_dir), f"rollout/{by.rsplit('-', 1)[1]}").returncode == 0


def rolled_back(job_dir, back: int, prompts: int) -> None:
    """The job, done at `back` + 2, is taken back to its checkpoint v`back` (`launch --resume --checkpoint`): the
    newer one is set aside, the curve and the ledger continue from v`back`, each prompt once in the new lineage."""
    more = back + 2
    # its trainer part damaged first: refused in one line, the finished job left as it was (its summary, its state)
    manifest = job_dir / "checkpoints" / f"iter-{back}" / "MANIFEST.trainer.json"
    manifest.rename(job_dir / "manifest.aside")
    r = rlctl("launch", "--resume", str(job_dir), "--checkpoint", f"v{back}", timeout_s=120)
    assert r.returncode == 2 and f"--checkpoint v{back}: trainer part: no MANIFEST.trainer.json" in r.stderr, r.stderr
    code, st = rlctl_json("status", str(job_dir))
    assert code == 0 and st["summary"]["state"] == "done" and st["index_state"] == "finished", st
    (job_dir / "manifest.aside").rename(manifest)
    code, s = rlctl_json("launch", "--resume", str(job_dir), "--checkpoint", f"v{back}", timeout_s=300)
    assert code == 0 and s["state"] == "done", why_not_done(job_dir, s)
    resumed = [e for e in events(job_dir) if e["event"] == "resumed_from"][-1]
    assert (resumed["version"], resumed["set_aside"]) == (back, [more])
    assert [p.name.split(".")[0] for p in (job_dir / "checkpoints" / "abandoned").iterdir()] == [f"iter-{more}"]
    assert [r["iteration"] for r in metrics_rows(job_dir)] == list(range(more))
    samples = sample_rows(JobDir(job_dir), more)
    assert len({e["prompt_id"] for e in samples}) == more * prompts
    assert len(samples) == len({e["sample_id"] for e in samples})
    # `status --checkpoints`: the new lineage's checkpoints, the last one's reward that of the iterations that made it
    code, ck = rlctl_json("status", str(job_dir), "--checkpoints")
    last = ck["checkpoints"][-1]
    assert code == 0 and (last["version"], last["latest"]) == (more, True), ck
    reward = {r["iteration"]: r["reward_mean"] for r in metrics_rows(job_dir)}
    made = [reward[i] for i in range(last["iterations"][0] - 1, more)]
    assert last["reward_mean"] == round(sum(made) / len(made), 4), ck
