"""Bring your own model, data and reward: `rlctl launch` of a job on a local Qwen2-architecture checkpoint
(built by the shipped hf-demo builder), a jsonl dataset with chat-message prompts, and a user reward file
that raises, hangs or returns the wrong type for some samples — the job finishes, every failure is scored
0 and counted, the TensorBoard event files hold every iteration's metrics, and the held-out file's prompts are
evaluated greedily during the run (on a rollout unit) and at the end (where launch runs). The reward file imports a
module beside it, which the launch copies into the job with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.hfdemo import build_hf_demo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]

FLAKY_REWARD = """
import time

from words import credit  # a module beside the reward file: the launch copies it into the job with it

CALLS = "@CALLS@"

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    i = extra_info["index"]
    with open(CALLS, "a") as f:  # one line per call that ran, written before its outcome (append: one write each)
        f.write(f"{i}\\n")
    if i % 5 == 0:
        raise ValueError(f"row {i}: the user's reward failed")
    if i % 7 == 0:
        time.sleep(30)  # past the job's per-call timeout
    if i % 11 == 0:
        return "not a number"
    return credit(solution_str.split(), ground_truth.split())
"""
WORDS = """
def credit(got, want):  # partial credit: the words in place
    return {"score": sum(g == w for g, w in zip(got, want)) / max(len(got), len(want), 1), "length": len(got)}
"""


def test_hf_checkpoint_dataset_and_user_reward_run_end_to_end(tmp_path):
    build_hf_demo(tmp_path)
    (tmp_path / "rewards").mkdir()  # not the directory the job runs from: only the job's copy is found
    (tmp_path / "rewards" / "flaky.py").write_text(FLAKY_REWARD.replace("@CALLS@", str(tmp_path / "calls.log")))
    (tmp_path / "rewards" / "words.py").write_text(WORDS)
    with (tmp_path / "data.jsonl").open("a") as f:  # two bad rows, skipped and counted (task.bad_rows: skip)
        f.write(json.dumps({"data_source": "x"}) + "\n" + json.dumps({"prompt": 3, "data_source": "x"}) + "\n")
    job = yaml.safe_load((ROOT / "jobs/hf-demo.yaml").read_text())
    job["inventory"] = [str(ROOT / "clusters/local.yaml")]
    job["model"]["path"] = "model"
    job["task"].update(
        path="data.jsonl", reward="rewards/flaky.py:compute_score", reward_timeout_s=1.0, bad_rows="skip"
    )
    job.update(iterations=4, batch={"prompts_per_iteration": 8, "samples_per_prompt": 2})
    # held-out prompts: rows of the demo's data the flaky reward scores (indices not ≡ 0 mod 5, 7 or 11)
    rows = [json.loads(line) for line in (tmp_path / "data.jsonl").read_text().splitlines()[:16]]
    held = [r for r in rows if "prompt" in r and all(r["extra_info"]["index"] % k for k in (5, 7, 11))][:8]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    job["evaluation"] = {"heldout_prompts": 8, "path": "held.jsonl", "every_iterations": 4}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))

    check = subprocess.run([sys.executable, "-m", "rlctl", "check", str(tmp_path / "job.yaml")], capture_output=True)
    assert check.returncode == 0, check.stderr
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlctl", "launch", str(tmp_path / "job.yaml"), "--job-dir", str(run), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    for key in ("iterations", "reward_first", "reward_last", "samples_per_s", "wall_s", "ledger"):
        assert key in s, key  # the same summary fields as the demo
    assert s["state"] == "done" and s["iterations"] == 4
    assert sorted(p.name for p in (run / "reward").glob("*.py")) == ["flaky.py", "words.py"]
    assert s["ledger"]["prompts"] == s["ledger"]["trained"] == 32
    assert (s["ledger"]["lost"], s["ledger"]["duplicated"]) == (0, 0)
    # the prompts came from the data prepared once at launch; failures (rows ≡ 0 mod 5, 7 or 11: raised,
    # timed out, wrong type) are each scored 0 and counted
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    assert (manifest["num_rows"], manifest["num_bad_rows"]) == (64, 2)
    assert s["data"] == {"prompts": 64, "bad_rows_skipped": 2, "checksum": manifest["checksum"]}
    # rows ≡ 0 mod 5 raise and ≡ 0 mod 11 (not 7) return a wrong type at once: every such call that ran is counted,
    # but for one cancelled while it ran. Rows ≡ 0 mod 7 hang: a call times out, or is cancelled when the controller
    # gives up on it (its group held the trainer: generated again; a call queued behind it may be cancelled too)
    # and is not a failure then
    r = s["rewards"]
    ran = [int(line) for line in (tmp_path / "calls.log").read_text().split()]
    raised = sum(1 for i in ran if i % 5 == 0)
    wrong = sum(1 for i in ran if i % 11 == 0 and i % 5 and i % 7)
    assert raised - r["cancelled"] <= r["errors"] <= raised and raised > 0, (r, raised)
    assert wrong - r["cancelled"] <= r["bad_type"] <= wrong, (r, wrong)
    assert r["timeouts"] + r["cancelled"] > 0 and s["reward_failures"] <= r["errors"] + r["bad_type"] + r["timeouts"]
    # the trainer saw the user's checkpoint: the final checkpoint is an HF directory with its tokenizer
    final = run / "checkpoints" / "iter-4" / "model"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert (final / "tokenizer.json").exists()
    # TensorBoard event files, read back
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [0, 1, 2, 3]
    assert {
        "time/gen_s",
        "time/train_s",
        "delta/delta_s",
        "throughput/samples_per_s",
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/no_signal_frac",
    } <= set(acc.Tags()["scalars"])
    # the held-out file's prompts, decoded greedily by the starting and the final policy and scored by the reward
    h = s["heldout"]
    assert h["prompts"] == 8 and 0 <= h["greedy_reward_first"] <= 1 and 0 <= h["greedy_reward_last"] <= 1, h
    assert json.loads((run / "summary.json").read_text())["heldout"] == h
    assert (run / "data-heldout" / "manifest.json").exists()
    # … and during the run, by a rollout unit: versions 0 and 4 (the last), scored by the same reward; a version
    # decoded by its weights alone gives the figure the end-of-job evaluation gives it
    rows = [json.loads(line) for line in (run / "evaluations.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [0, 4] and {r["prompts"] for r in rows} == {8}, rows
    assert rows[-1]["versions"] == [4, 4] and rows[-1]["greedy_reward"] == h["greedy_reward_last"], (rows, h)
    if rows[0]["versions"] == [0, 0]:  # (version 1 may have arrived while it decoded)
        assert rows[0]["greedy_reward"] == h["greedy_reward_first"], (rows, h)
    # a row is logged at the iteration that trained its version or, when its scores came later, at the last
    # iteration logged by then (trackers take no step below their last); eval/version says which version it was
    logged = [(e.step, int(e.value)) for e in acc.Scalars("eval/version")]
    assert [v for _, v in logged] == [0, 4] and 0 <= logged[0][0] <= logged[1][0] == 3, logged
    assert "eval/greedy_reward" in acc.Tags()["scalars"]
