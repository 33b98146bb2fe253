"""A prompt that crashes every rollout unit it reaches (an input that trips a kernel, a tokenizer edge case) is set
aside by the controller (ControllerCore._blame) instead of taking down unit after unit for ever: in flight at two
unit losses, it runs alone on a unit; lost there too, it is quarantined, named with its row in the user's data, and
a new prompt's group takes its place. The job ends done, every iteration full, nothing lost or duplicated.

The crash is put into the real rollout agents by a `sitecustomize` on their PYTHONPATH (the launcher passes its
environment to local agents): a unit's engine exits the process as soon as it is handed a sample of the poison
prompt, every time, in every unit — the replacements too."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from rlctl.checkpoint.controller import sample_rows
from rlctl.launch.jobdir import JobDir

from .conftest import REPO, RLCTL, events, hf_job, why_not_done

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

POISON = "p5"  # a prompt of the second iteration (4 prompts an iteration)

SITECUSTOMIZE = """
import json, os

_PARALLEL = json.loads(os.environ.get("RLCTL_PARALLEL") or "{}")

if _PARALLEL.get("role") == "rollout":
    from rlctl.engines import embedded

    _add = embedded.EmbeddedEngine.add

    def crashing_add(self, requests):
        if any(r.request_id.split("/")[0] == os.environ["POISON"] for r in requests):
            os._exit(134)  # as a CUDA fault would end it: no goodbye
        return _add(self, requests)

    embedded.EmbeddedEngine.add = crashing_add
"""


def test_a_prompt_that_crashes_every_unit_is_quarantined_and_the_job_ends_done(tmp_path):
    iterations, prompts, job_dir = 6, 4, tmp_path / "run"
    job = hf_job(tmp_path, job_dir=job_dir, iterations=iterations, every=3)
    (tmp_path / "hold").unlink()  # the reward never holds this run
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), str(REPO)]), "POISON": POISON}
    proc = subprocess.run(
        [*RLCTL, "launch", str(job), "--job-dir", str(job_dir), "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    s = json.loads(proc.stdout) if proc.stdout.strip() else {}
    assert proc.returncode == 0 and s.get("state") == "done", (proc.stderr[-2000:], why_not_done(job_dir, s))

    evs = events(job_dir)
    lost = [e for e in evs if e["event"] == "agent_lost" and e["agent"].startswith("rollout")]
    suspects = [e for e in evs if e["event"] == "prompt_suspect"]
    quarantined = [e for e in evs if e["event"] == "prompt_quarantined"]
    assert len(quarantined) == 1, (quarantined, lost)
    q = quarantined[0]
    # in flight at every loss (the poison was on both units, or on one), the last time alone on its unit
    assert q["prompt"] == POISON and q["with"] == 0 and q["losses"] == len(lost) <= 3, (q, lost)
    assert q["unit"] == lost[-1]["agent"] and re.fullmatch(r"data\.jsonl line \d+", q["source"]), q
    assert POISON in {e["prompt"] for e in suspects} or q["losses"] == 2, suspects
    assert sum(e["event"] == "unit_replaced" for e in evs) >= len(lost) - 1  # the job kept its units
    log = (job_dir / "logs" / "controller-0.log").read_text()
    assert f"prompt {POISON} (" in log and "quarantined: it was in flight at" in log

    # every iteration trained in full: a new prompt's group took the poison's place; nothing lost or duplicated
    samples = sample_rows(JobDir(job_dir), iterations)
    trained = {e["prompt_id"] for e in samples if e["state"] == "trained"}
    assert len(trained) == iterations * prompts and POISON not in trained
    assert {e["state"] for e in samples if e["prompt_id"] == POISON} == {"quarantined"}
    assert {e["prompt_id"] for e in samples} == trained | {POISON}
    assert len({e["sample_id"] for e in samples}) == len(samples)
    led = s["ledger"]
    assert (led["quarantined"], led["lost"], led["duplicated"], led["trained"]) == (1, 0, 0, iterations * prompts)
    print(f"\n{len(lost)} units lost, suspects {[e['prompt'] for e in suspects]}; quarantined: {q}")
