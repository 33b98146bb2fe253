"""Agents that hang while their heartbeats still flow (rlctl.agents.watchdog): a rollout unit whose engine step never
returns and a trainer whose optimizer step never returns each end themselves past `hang_timeout_s`, with every
thread's stack in their log; the job goes on by itself — the unit replaced, the trainer's failed run resumed by
`checkpoint.auto_resume` — and ends done with every prompt trained once.

The hangs are put into the real agents by a `sitecustomize` on their PYTHONPATH (the launcher passes its
environment to local agents): rollout-1's 20th engine step and the trainer's 6th optimizer step wait for ever, once
per job (a mark file), so the replacement unit and the resumed trainer run normally."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from rlctl.agents.watchdog import HUNG_EXIT
from rlctl.checkpoint.controller import sample_rows
from rlctl.launch.jobdir import JobDir

from .conftest import RLCTL, events, hf_job, hooked, rlctl_json, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

# the trainer's is longer: `status` (a process of its own, a second or two) is asked while it hangs, and must see it
# past 2 s; each hang is waited out whole, once per test (and the follower's once more)
UNIT_HANG_S, TRAINER_HANG_S = 10.0, 12.0

SITECUSTOMIZE = """
import json, os, pathlib, threading

_PARALLEL = json.loads(os.environ.get("RLCTL_PARALLEL") or "{}")
_MARKS = pathlib.Path(os.environ["HANG_MARKS"])


def _hang_once(who):
    mark = _MARKS / who
    if not mark.exists():
        mark.touch()
        threading.Event().wait()


if _PARALLEL.get("role") == "rollout" and _PARALLEL.get("replica") == 1:
    from rlctl.engines import embedded

    _step, _steps = embedded.EmbeddedEngine.step, [0]

    def hanging_engine_step(self):
        _steps[0] += 1
        if _steps[0] == 20:
            _hang_once("rollout-1")
        return _step(self)

    embedded.EmbeddedEngine.step = hanging_engine_step

if _PARALLEL.get("role") == "trainer":
    from rlctl.rl import learner

    _train, _trains = learner.StreamingLearner.step, [0]

    def hanging_optimizer_step(self):
        _trains[0] += 1
        if _trains[0] == 6:
            _hang_once("trainer-0")
        return _train(self)

    learner.StreamingLearner.step = hanging_optimizer_step
"""


def test_hung_agents_end_themselves_and_the_job_goes_on(tmp_path):
    iterations, prompts, job_dir = 10, 4, tmp_path / "run"
    job = hf_job(tmp_path, job_dir=job_dir, iterations=iterations, every=3)
    (tmp_path / "hold").unlink()  # the reward never holds this run
    spec = yaml.safe_load(job.read_text())
    spec["checkpoint"]["auto_resume"] = 1
    spec["rollout"]["hang_timeout_s"] = UNIT_HANG_S
    spec["trainer"] = {"hang_timeout_s": TRAINER_HANG_S}
    job.write_text(yaml.safe_dump(spec))
    marks = tmp_path / "marks"
    marks.mkdir()
    env = hooked(tmp_path, SITECUSTOMIZE, HANG_MARKS=str(marks))
    proc = subprocess.Popen(
        [*RLCTL, "launch", str(job), "--job-dir", str(job_dir), "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_for("the trainer to hang", (marks / "trainer-0").exists, 300, alive=proc)

        def stuck() -> dict[str, Any] | None:  # `rlctl status` shows the hang before the watchdog acts
            code, st = rlctl_json("status", str(job_dir))
            agents = {a["name"]: a for a in st.get("live", {}).get("agents", [])} if code == 0 else {}
            t = agents.get("trainer-0", {})
            return t if t.get("phase") == "optimizer step" and t["phase_s"] >= 2 else None

        seen = wait_for("status to show the trainer stuck in its optimizer step", stuck, TRAINER_HANG_S, alive=proc)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    s = json.loads(out) if out.strip() else {}
    assert proc.returncode == 0 and s.get("state") == "done", (proc.returncode, err[-3000:])
    assert sorted(p.name for p in marks.iterdir()) == ["rollout-1", "trainer-0"]  # both hung, once

    # the unit: its own last word names the hang; the controller requeued its work and replaced it
    lost = [e for e in events(job_dir) if e["event"] == "agent_lost" and e["agent"] == "rollout-1"]
    assert len(lost) == 1, lost
    assert "it ended itself, hung: engine step ran" in lost[0]["reason"], lost
    unit_log = (job_dir / "logs" / "rollout-1.log").read_text()
    assert "rollout-1: engine step has run" in unit_log and f"past its limit of {UNIT_HANG_S:.0f} s" in unit_log
    assert "in hanging_engine_step" in unit_log and "most recent call first" in unit_log  # its stacks

    # the trainer: the run failed naming the hang, and its launcher resumed it from the checkpoint before
    said = [line for line in err.splitlines() if "resuming it from" in line]
    assert len(said) == 1 and "it ended itself, hung: optimizer step ran" in said[0], err[-3000:]
    auto = [e for e in events(job_dir) if e["event"] == "auto_resume"]
    assert len(auto) == 1 and auto[0]["version"] >= 3 and "hung: optimizer step" in auto[0]["after"], auto
    trainer_log = (job_dir / "logs" / "trainer-0.log").read_text()
    assert "trainer-0: optimizer step has run" in trainer_log and "in hanging_optimizer_step" in trainer_log
    assert f"exits {HUNG_EXIT}" in trainer_log

    samples = sample_rows(JobDir(job_dir), iterations)  # every prompt trained exactly once in the final lineage
    assert len({e["prompt_id"] for e in samples}) == iterations * prompts
    assert len({e["sample_id"] for e in samples}) == len(samples) and all(e["state"] == "trained" for e in samples)
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0) and s["resilience"]["resumes"] == 1
    print(f"\nstatus mid-hang: trainer-0 in {seen['phase']} for {seen['phase_s']} s\n{lost[0]['reason']}\n{said[0]}")


FOLLOWER_HANG = """
import json, os, pathlib, threading

_PARALLEL = json.loads(os.environ.get("RLCTL_PARALLEL") or "{}")
_MARKS = pathlib.Path(os.environ["HANG_MARKS"])

if _PARALLEL.get("role") == "trainer" and _PARALLEL.get("rank") == 1:
    from rlctl.rl import learner

    _share, _shares = learner.StreamingLearner.backward_share, [0]

    def hanging_backward_share(self, chunk, **kw):
        _shares[0] += 1
        mark = _MARKS / "trainer-1"
        if _shares[0] == 4 and not mark.exists():
            mark.touch()
            threading.Event().wait()
        return _share(self, chunk, **kw)

    learner.StreamingLearner.backward_share = hanging_backward_share
"""


def test_a_hung_trainer_rank_above_0_is_named_in_the_runs_failure(tmp_path):
    """Ranks above 0 are watched too: rank 1 of a two-rank trainer whose backward never returns ends itself, its
    stacks in its own log, and leaves its last word in the trainer group's store; rank 0's collective with it
    fails, and the run's failure names rank 1 and its host (not rank 0's broken collective). The launcher resumes
    the run, which ends done."""
    iterations, job_dir = 8, tmp_path / "run"
    job = hf_job(
        tmp_path,
        job_dir=job_dir,
        iterations=iterations,
        every=3,
        placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 2}]},
    )
    (tmp_path / "hold").unlink()
    spec = yaml.safe_load(job.read_text())
    spec["checkpoint"]["auto_resume"] = 1
    spec["trainer"] = {"hang_timeout_s": TRAINER_HANG_S}
    job.write_text(yaml.safe_dump(spec))
    marks = tmp_path / "marks"
    marks.mkdir()
    env = hooked(tmp_path, FOLLOWER_HANG, HANG_MARKS=str(marks))
    proc = subprocess.run(
        [*RLCTL, "launch", str(job), "--job-dir", str(job_dir), "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=360,
    )
    s = json.loads(proc.stdout) if proc.stdout.strip() else {}
    assert proc.returncode == 0 and s.get("state") == "done", (proc.returncode, proc.stderr[-3000:])
    assert [p.name for p in marks.iterdir()] == ["trainer-1"]

    said = [line for line in proc.stderr.splitlines() if "resuming it from" in line]
    assert len(said) == 1 and "hung: trainer-1 on " in said[0] and ": train ran" in said[0], proc.stderr[-3000:]
    rank1_log = (job_dir / "logs" / "trainer-1.log").read_text()
    assert "trainer-1: train has run" in rank1_log and "in hanging_backward_share" in rank1_log
    assert f"exits {HUNG_EXIT}" in rank1_log
    assert "trainer-1 on " in (job_dir / "logs" / "trainer-0.log").read_text()  # rank 0's ERROR line names it
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0) and s["resilience"]["resumes"] == 1
    print(f"\n{said[0]}")
