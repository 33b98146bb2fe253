"""Jobs for the operations tests: real agents launched by `rlctl launch` in a subprocess, then
operated from other `rlctl` processes (status, scale, stop), as an operator would from a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.agents.appliedlog import unit_rows
from tests.conftest import RLCTL_AT_A_TERMINAL
from tests.integration.hfdemo import build_hf_demo

REPO = Path(__file__).resolve().parents[3]
RLCTL = [sys.executable, "-m", "rlctl"]


def rlctl(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RLCTL, *args], capture_output=True, text=True, timeout=timeout_s)


def rlctl_json(*args: str, timeout_s: float = 120) -> tuple[int, Any]:
    proc = rlctl(*args, "-o", "json", timeout_s=timeout_s)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"rlctl {' '.join(args)}: exit {proc.returncode}, no JSON:\n{proc.stderr}") from None


def wait_for(
    what: str, cond: Callable[[], Any], timeout_s: float, *, alive: subprocess.Popen[str] | None = None
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the launcher exited ({alive.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


def processes_mentioning(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `marker` (e.g. a job directory)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() not in (d / "cmdline").read_bytes():
                continue
            if (d / "stat").read_text().rsplit(") ", 1)[1].split()[0] != "Z":
                pids.append(int(d.name))
        except (OSError, IndexError):
            continue
    return pids


def hooked(tmp_path: Path, sitecustomize: str, **extra: str) -> dict[str, str]:
    """This environment with `sitecustomize` (the source of a `sitecustomize` module) first on PYTHONPATH, and
    `extra`: for `rlctl launch`, whose local agents inherit it, so a test can put a fault into the real agents."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(sitecustomize)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), str(REPO)]), **extra}


def launched(job: Path, job_dir: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`rlctl launch JOB --job-dir DIR -o json` in `env`, to its end."""
    return subprocess.run(
        [*RLCTL, "launch", str(job), "--job-dir", str(job_dir), "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )


def metrics_rows(job_dir: Path) -> list[dict[str, Any]]:
    p = job_dir / "metrics.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def events(job_dir: Path) -> list[dict[str, Any]]:
    """The job's events, a version's `weights_applied` / `weights_skipped` as one row per unit (`unit_rows`)."""
    p = job_dir / "events.jsonl"
    return unit_rows(json.loads(line) for line in p.read_text().splitlines() if line.strip()) if p.exists() else []


def why_not_done(job_dir: Path, summary: dict[str, Any]) -> str:
    """For an assertion message: the run's state and exit, its last events and the end of the controller's log."""
    log = job_dir / "logs" / "controller-0.log"
    tail = log.read_text(errors="replace").splitlines()[-30:] if log.exists() else ["(no controller log)"]
    last = [json.dumps(e) for e in events(job_dir)[-12:]]
    return "\n".join(
        [f"state {summary.get('state')!r}, controller exit {summary.get('controller_exit')}", *last, *tail]
    )


HELD_REWARD = """
import time
from pathlib import Path

METRICS, HOLD, HELD = Path({metrics!r}), Path({hold!r}), Path({held!r})


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if HOLD.exists() and METRICS.exists() and len(METRICS.read_text().splitlines()) >= {rows}:
        HELD.touch()
        while HOLD.exists():
            time.sleep(0.05)
    return len(solution_str.split()) % 3 / 2  # differs within a group: the weights move
"""


def hf_job(tmp_path: Path, *, job_dir: Path, iterations: int, every: int, **over: Any) -> Path:
    """A job on the HF demo's checkpoint and data (built untrained in `tmp_path`), scored by a reward that holds
    the run one iteration past its first checkpoint, so that a test can kill it there whatever this machine's
    speed: once `job_dir` has `every` + 1 metrics rows, every reward call waits while `tmp_path`/hold exists (and
    says so in `tmp_path`/held). Why that holds the run there: the controller creates (and so dispatches) iteration
    i only once it has taken in iteration i − 2's `trained` (η = 1), whose metrics row it appends first; so the
    calls of iterations ≥ `every` + 2 wait, nothing past iteration `every` + 1 trains and the checkpoint stays
    at `every` (needs `every` ≥ 3). Remove the hold file before the job goes on. The job waits for its rewards
    (`reward_stall_s: never`): with the default, a held sample whose group mates scored before the hold began would
    be filtered out after the stall limit and its group trained without it, and the run would go on past the hold."""
    assert every >= 3 and iterations > every + 2
    build_hf_demo(tmp_path)
    (tmp_path / "hold").touch()
    fields = {"metrics": str(job_dir / "metrics.jsonl"), "hold": str(tmp_path / "hold"), "held": str(tmp_path / "held")}
    (tmp_path / "held_reward.py").write_text(HELD_REWARD.format(rows=every + 1, **fields))
    job = yaml.safe_load((REPO / "jobs/hf-demo.yaml").read_text())
    job["model"]["path"] = "model"
    job["task"].update(
        path="data.jsonl", reward="held_reward.py:compute_score", reward_timeout_s=600, reward_stall_s="never"
    )
    job.update(
        inventory=[str(REPO / "clusters" / "local.yaml")],
        iterations=iterations,
        batch={"prompts_per_iteration": 4, "samples_per_prompt": 4},
        pipeline={"mode": "async", "staleness": 1},
        checkpoint={"every_iterations": every},
        tracking=[],
        **over,
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def held_past_checkpoint(tmp_path: Path, job_dir: Path, every: int, proc: subprocess.Popen[str]) -> None:
    """Wait until an `hf_job`'s reward holds the run and checkpoint `every` is complete (its `checkpoint` event): the
    trainer writes its model part in the background, which a loaded machine finished after the hold began — the rank
    killed then left the checkpoint half written, an auto-resume nothing to resume from, and a controller killed then
    never sealed it (no checkpoints/latest.json)."""
    wait_for("the run held past its first checkpoint", (tmp_path / "held").exists, 300, alive=proc)
    wait_for(
        f"checkpoint v{every} complete",
        lambda: any(e["event"] == "checkpoint" and e.get("version") == every for e in events(job_dir)),
        120,
        alive=proc,
    )


def job_yaml(
    path: Path,
    *,
    inventory: list[str],
    trainer: str,
    rollout: str,
    rollout_gpus: int = 1,
    engine: dict[str, Any] | None = None,
    **over: Any,
) -> Path:
    """A job file: `rollout` names the rollout site, `engine` is the job's `rollout:` section."""
    data: dict[str, Any] = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": path.stem,
        "inventory": inventory,
        "model": {"kind": "builtin", "name": "tiny-demo"},
        "task": {"kind": "digits", "median_output_tokens": 8, "max_output_tokens": 32},
        "iterations": 400,
        "batch": {"prompts_per_iteration": 4, "samples_per_prompt": 4, "train_micro_batch_samples": 8},
        "pipeline": {"mode": "async"},
        "placement": {"trainer": {"site": trainer, "gpus": 1}, "rollout": [{"site": rollout, "gpus": rollout_gpus}]},
        "warmup": {"sft_steps": 0},
        "checkpoint": {"every_iterations": 0},
    }
    if engine is not None:
        data["rollout"] = engine
    data.update(over)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def launcher():
    """Start `rlctl launch …` in the background, as a terminal starts it (a SIGINT is Ctrl-C, also where the tests
    run with SIGINT ignored); every launcher still running at the end is killed (its own `finally` stops the
    agents)."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [*RLCTL_AT_A_TERMINAL, "launch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
