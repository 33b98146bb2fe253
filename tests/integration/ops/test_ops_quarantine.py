"""A prompt that crashes every rollout unit it reaches (an input that trips a kernel, a tokenizer edge case) is set
aside by the controller (ControllerCore._blame) instead of taking down unit after unit for ever: in flight at two
unit losses, it runs alone on a unit; lost there too, it is quarantined, named with its row in the user's data, and
a new prompt's group takes its place. A held-out prompt that crashes the engine stops the held-out evaluation
instead. Either way the job ends done, every iteration full, nothing lost or duplicated.

The crash is put into the real rollout agents by a `sitecustomize` on their PYTHONPATH (the launcher passes its
environment to local agents): a unit's engine exits the process as soon as it is handed a request of the poison
prompt (a sample of RL prompt $POISON, or held-out prompt $POISON_HELDOUT of any evaluation), every time, in every
unit — the replacements too. The held-out evaluation runs every 2 versions on 4 held-out prompts in both jobs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.checkpoint.controller import sample_rows
from rlctl.launch.jobdir import JobDir

from .conftest import events, hf_job, hooked, launched, why_not_done

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ITERATIONS, PROMPTS = 6, 4

SITECUSTOMIZE = """
import json, os

_PARALLEL = json.loads(os.environ.get("RLCTL_PARALLEL") or "{}")

if _PARALLEL.get("role") == "rollout":
    from rlctl.engines import embedded

    _add = embedded.EmbeddedEngine.add

    def poisoned(request_id):
        if request_id.startswith("eval-"):  # eval-v<version>-<held-out prompt>
            return request_id.rsplit("-", 1)[1] == os.environ.get("POISON_HELDOUT")
        return request_id.split("/")[0] == os.environ.get("POISON")  # <prompt>/<sample>

    def crashing_add(self, requests):
        if any(poisoned(r.request_id) for r in requests):
            os._exit(134)  # as a CUDA fault would end it: no goodbye
        return _add(self, requests)

    embedded.EmbeddedEngine.add = crashing_add
"""


def _run(tmp_path: Path, **poison: str) -> tuple[dict[str, Any], Path]:
    job_dir = tmp_path / "run"
    job = hf_job(tmp_path, job_dir=job_dir, iterations=ITERATIONS, every=3)
    (tmp_path / "hold").unlink()  # the reward never holds this run
    shutil.copy(tmp_path / "data.jsonl", tmp_path / "heldout.jsonl")
    spec = yaml.safe_load(job.read_text())
    spec["evaluation"] = {"heldout_prompts": 4, "every_iterations": 2, "path": "heldout.jsonl"}
    job.write_text(yaml.safe_dump(spec))
    proc = launched(job, job_dir, hooked(tmp_path, SITECUSTOMIZE, **poison), 400)
    s = json.loads(proc.stdout) if proc.stdout.strip() else {}
    assert proc.returncode == 0 and s.get("state") == "done", (proc.stderr[-2000:], why_not_done(job_dir, s))
    return s, job_dir


def _trained(job_dir: Path) -> list[dict[str, Any]]:
    """Every sample of the run once; every iteration trained in full, nothing twice."""
    samples = sample_rows(JobDir(job_dir), ITERATIONS)
    assert len({e["sample_id"] for e in samples}) == len(samples)
    assert len({e["prompt_id"] for e in samples if e["state"] == "trained"}) == ITERATIONS * PROMPTS
    return samples


def test_a_prompt_that_crashes_every_unit_is_quarantined_and_the_job_ends_done(tmp_path: Path) -> None:
    poison = "p5"  # a prompt of the second iteration
    s, job_dir = _run(tmp_path, POISON=poison)
    evs = events(job_dir)
    lost = [e for e in evs if e["event"] == "agent_lost" and e["agent"].startswith("rollout")]
    suspects = [e for e in evs if e["event"] == "prompt_suspect"]
    quarantined = [e for e in evs if e["event"] == "prompt_quarantined"]
    assert len(quarantined) == 1, (quarantined, lost)
    q = quarantined[0]
    # in flight at every loss (the poison was on both units, or on one), the last time alone on its unit (no
    # held-out evaluation beside it either)
    assert q["prompt"] == poison and q["with"] == 0 and q["losses"] == len(lost) <= 3, (q, lost)
    assert q["unit"] == lost[-1]["agent"] and re.fullmatch(r"data\.jsonl line \d+", q["source"]), q
    assert poison in {e["prompt"] for e in suspects} or q["losses"] == 2, suspects
    assert sum(e["event"] == "unit_replaced" for e in evs) >= len(lost) - 1  # the job kept its units
    log = (job_dir / "logs" / "controller-0.log").read_text()
    assert f"prompt {poison} (" in log and "quarantined: it was in flight at" in log

    # every iteration trained in full: a new prompt's group took the poison's place; nothing lost or duplicated
    samples = _trained(job_dir)
    assert {e["state"] for e in samples if e["prompt_id"] == poison} == {"quarantined"}
    led = s["ledger"]
    assert (led["quarantined"], led["lost"], led["duplicated"], led["trained"]) == (1, 0, 0, ITERATIONS * PROMPTS)
    # the held-out evaluation went on: every due version evaluated
    versions = sorted(json.loads(line)["version"] for line in (job_dir / "evaluations.jsonl").read_text().splitlines())
    assert versions == [0, 2, 4, 6] and not [e for e in evs if e["event"] == "evaluation_stopped"]
    print(f"\n{len(lost)} units lost, suspects {[e['prompt'] for e in suspects]}; quarantined: {q}")


def test_a_held_out_prompt_that_crashes_every_unit_stops_the_evaluation_and_quarantines_nothing(
    tmp_path: Path,
) -> None:
    s, job_dir = _run(tmp_path, POISON_HELDOUT="2")
    evs = events(job_dir)
    lost = [e for e in evs if e["event"] == "agent_lost" and e["agent"].startswith("rollout")]
    stopped = [e for e in evs if e["event"] == "evaluation_stopped"]
    # more than quarantine_after (2) evaluations lost in a row, and then no unit is asked again (an evaluation
    # asked before the stop, while two others were in flight, may still take its unit down after it)
    asked = [e for e in evs if e["event"] == "evaluation_asked"]
    assert [e["lost_in_a_row"] for e in stopped] == [3] and 3 <= len(lost) <= len(asked), (stopped, lost, asked)
    rows = job_dir / "evaluations.jsonl"
    assert lost[2]["t"] <= stopped[0]["t"] and not (rows.exists() and rows.read_text().strip())
    assert max(e["t"] for e in asked) < stopped[0]["t"]
    # the RL prompts those units held were not alone on them: none quarantined
    assert not [e for e in evs if e["event"] == "prompt_quarantined"]
    _trained(job_dir)
    led = s["ledger"]
    assert (led.get("quarantined", 0), led["lost"], led["duplicated"]) == (0, 0, 0)
    log = (job_dir / "logs" / "controller-0.log").read_text()
    assert "held-out evaluation stopped: 3 evaluations in a row were lost with their unit" in log
    print(f"\n{len(lost)} units lost; {stopped[0]}")
