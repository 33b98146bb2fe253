"""Greedy held-out evaluation: disjoint prompt indices, exact-match counting, the engine's batched greedy
answers against one-prompt-at-a-time decoding, the job summary's `heldout` figures and what check refuses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rlctl.config.inventory import load_inventory
from rlctl.config.job import Job, load_job
from rlctl.config.task import DigitsTask as DigitsTaskConfig
from rlctl.config.task import LengthsTask
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops.evaluation import add_heldout, heldout_line
from rlctl.ops.preflight import problems
from rlctl.rl.evaluate import compare, evaluate, greedy_outputs, score_outputs
from rlctl.rl.tasks import EOS, HELDOUT_OFFSET, MAX_DIGITS, RL_OFFSET, DigitsTask, encode, heldout_index, rl_index
from tests.unit.hf_checkpoints import rope_rows_loaded
from tests.unit.tiny_models import small_config

ROOT = Path(__file__).resolve().parents[3]
SHORT = DigitsTaskConfig(kind="digits", median_output_tokens=5, max_output_tokens=16)
TINY = small_config(hidden=16, positions=64)


def _index(prompt_id: str) -> int:
    return int(prompt_id[1:])


def test_heldout_indices_are_disjoint_from_sft_and_rl() -> None:
    task = DigitsTask(DigitsTaskConfig(kind="digits", growth_per_iteration=0.5))
    sft = [_index(p.prompt_id) for p in task.sample_prompts(4096, np.random.default_rng(0))]
    rl = [_index(p.prompt_id) for it in (0, 1, 10**6) for p in task.rl_prompts(it, 16)]
    held = [_index(p.prompt_id) for p in task.heldout_prompts(512)]
    assert max(sft) < RL_OFFSET <= min(rl) and max(rl) < HELDOUT_OFFSET <= min(held)
    assert held == [heldout_index(i) for i in range(512)] and rl_index(10**9, 10**6 - 1) < HELDOUT_OFFSET
    # held-out prompts keep the base length distribution, whatever RL's growth
    assert task.median_at(held[-1]) == task.median_at(sft[0]) == 30.0 < task.median_at(rl[-1])
    assert task.heldout_prompts(3) == task.heldout_prompts(3)


def test_score_outputs_counts_exact_answers_with_eos() -> None:
    task = DigitsTask(SHORT)
    a, b, c = task.heldout_prompts(3)
    outputs = {
        a.prompt_id: [*encode(a.answer), EOS],  # exact
        b.prompt_id: encode(b.answer),  # right letters, cut before EOS: reward 1, not exact
        c.prompt_id: [*encode("z" + c.answer), EOS],  # one wrong run in front
    }
    figures = score_outputs(task, [a, b, c], outputs)
    wrong = task.reward(c, outputs[c.prompt_id])
    assert wrong < 1.0
    assert figures.prompts == 3
    assert figures.exact == pytest.approx(1 / 3)
    assert figures.reward == pytest.approx((1.0 + 1.0 + wrong) / 3)
    with pytest.raises(ValueError, match="no prompts"):
        score_outputs(task, [], {})


@torch.no_grad()
def _one_by_one(model: TinyGPT, prompt_tokens: list[int], max_new: int) -> list[int]:
    """Greedy decoding without a KV cache or batching: argmax of a full forward, token by token."""
    tokens = list(prompt_tokens)
    out: list[int] = []
    while len(out) < max_new:
        t = int(model(torch.tensor([tokens]))[0, -1].argmax())
        out.append(t)
        tokens.append(t)
        if t == EOS:
            break
    return out


def test_batched_greedy_equals_one_prompt_at_a_time() -> None:
    torch.manual_seed(0)
    model = TinyGPT(TINY).eval()
    with torch.no_grad():  # sharper logits than at init: answers differ by prompt and end at different lengths
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(10)
    task = DigitsTask(SHORT)
    prompts = task.heldout_prompts(12)
    got = greedy_outputs(model, task, prompts, max_batch_size=5)  # several admissions, rows of mixed lengths
    assert len({len(v) for v in got.values()}) >= 4 and any(v[-1] == EOS for v in got.values())
    assert got == {p.prompt_id: _one_by_one(model, p.tokens, task.max_new_tokens) for p in prompts}
    assert evaluate(model, task, prompts) == score_outputs(task, prompts, got)


def _job_dir(tmp_path: Path, *, iterations: int, final: bool) -> tuple[JobDir, Job]:
    job = load_job(ROOT / "jobs" / "demo.yaml")
    spec = job.spec.model_copy(update={"iterations": iterations, "task": SHORT})
    spec = spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"heldout_prompts": 8})})
    jd = JobDir.create("demo", explicit=tmp_path / "job")
    write_sites(jd.path, job.inventory.sites)
    torch.manual_seed(0)
    TinyGPT(TINY).save_pretrained(jd.init_model)
    if final:
        TinyGPT(TINY).save_pretrained(jd.checkpoint(iterations) / "model")
    jd.write_json(jd.summary_json, {"state": "done", "iterations": iterations})
    return jd, Job(spec, job.inventory, job.path)


def test_summary_gains_heldout_figures_of_the_start_and_the_final_checkpoint(tmp_path: Path) -> None:
    jd, job = _job_dir(tmp_path, iterations=3, final=True)
    said: list[str] = []
    out = add_heldout(jd, job.spec, {"state": "done", "wall_s": 1.0}, say=said.append)
    h = out["heldout"]
    assert jd.read_json(jd.summary_json)["heldout"] == h and out["wall_s"] == 1.0 and len(said) == 1
    assert h["prompts"] == 8 and h["model_last"] == str(jd.checkpoint(3) / "model")
    task = DigitsTask(SHORT)
    first = evaluate(TinyGPT.from_pretrained(jd.init_model), task, task.heldout_prompts(8))
    last = compare(jd.init_model, jd.checkpoint(3) / "model", task, num_prompts=8)
    assert (h["greedy_exact_first"], h["greedy_reward_first"]) == (round(first.exact, 4), round(first.reward, 4))
    assert (h["greedy_exact_last"], h["greedy_reward_last"]) == (last["greedy_exact_last"], last["greedy_reward_last"])
    assert heldout_line(h).startswith("exact ")


def test_heldout_needs_a_finished_job_with_its_final_checkpoint(tmp_path: Path) -> None:
    jd, job = _job_dir(tmp_path, iterations=3, final=False)
    assert add_heldout(jd, job.spec, {"state": "stopped"}, say=print) == {"state": "stopped"}
    out = add_heldout(jd, job.spec, {"state": "done"}, say=lambda _: None)
    assert "iter-3/model/config.json does not exist" in out["heldout"]["error"]
    assert heldout_line(out["heldout"]).startswith("not evaluated: ")
    off = job.spec.model_copy(update={"evaluation": job.spec.evaluation.model_copy(update={"heldout_prompts": 0})})
    assert add_heldout(jd, off, {"state": "done"}, say=print) == {"state": "done"}


def test_an_evaluation_that_fails_after_the_job_is_noted_not_raised(tmp_path: Path, monkeypatch) -> None:
    """The job is done and kept: a reward file that no longer loads (ValueError) is the summary's error, and the
    line says so; a dataset task's figures (no exact match) have their own line."""
    jd, job = _job_dir(tmp_path, iterations=3, final=True)

    def broken(*_: object) -> dict:
        raise ValueError("reward/mine.py: no such file")

    monkeypatch.setattr("rlctl.ops.evaluation.heldout", broken)
    out = add_heldout(jd, job.spec, {"state": "done"}, say=lambda _: None)
    assert out["heldout"] == {"error": "ValueError: reward/mine.py: no such file"}
    assert jd.read_json(jd.summary_json)["heldout"] == out["heldout"]
    dataset = {"prompts": 4, "greedy_reward_first": 0.25, "greedy_reward_last": 0.5}
    assert heldout_line(dataset) == "reward 0.250 → 0.500 (greedy, 4 prompts)"
    # before: a reward that raised on every held-out answer read as the policies' figures, `reward_on_error` each
    assert heldout_line(dataset | {"reward_failures": 0}) == "reward 0.250 → 0.500 (greedy, 4 prompts)"
    assert heldout_line(dataset | {"reward_failures": 8}) == (
        "reward 0.250 → 0.500 (greedy, 4 prompts); 8 of its 8 reward calls failed, scored task.reward_on_error"
    )


@pytest.mark.parametrize("damaged", ['{"state": "done", "iterat', '["done"]'])
def test_heldout_figures_go_into_a_damaged_summary_as_every_command_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: str
) -> None:
    """summary.json damaged while the job ran (cut short; a JSON list): `add_heldout` read it itself, so a done job's
    launcher failed (LaunchError 'not valid JSON'; a TypeError traceback of the list) where every other command reads
    its run's end from its job_end event. Its figures go in beside that end; the damaged file is kept aside whole."""
    jd, job = _job_dir(tmp_path, iterations=3, final=False)
    jd.event("agent_started", agent="controller-0", run="r1")
    jd.event("job_end", state="done", iterations=3)
    jd.summary_json.write_text(damaged)
    monkeypatch.setattr("rlctl.ops.evaluation.heldout", lambda *_: {"prompts": 8, "greedy_reward_last": 0.5})
    out = add_heldout(jd, job.spec, {"state": "done", "run": "r1"}, say=lambda _: None)
    assert out["heldout"] == {"prompts": 8, "greedy_reward_last": 0.5}
    record = jd.read_json(jd.summary_json)
    assert (record["state"], record["iterations"], record["heldout"]) == ("done", 3, out["heldout"])
    assert record["summary_damaged"].endswith("; kept as summary.json.damaged")
    assert (jd.path / "summary.json.damaged").read_text() == damaged


def test_a_trainer_site_over_ssh_takes_the_runs_own_first_and_last_evaluations(tmp_path: Path) -> None:
    """The final checkpoint is not on this machine: with `every_iterations` the summary's figures are the run's
    first and last rows (the rollout units decoded them); without its last version's row, an error, not a raise."""
    jd, job = _job_dir(tmp_path, iterations=3, final=False)
    inventory = load_inventory([ROOT / "clusters" / f for f in ("local.yaml", "h800-trainer.yaml", "h20-rollout.yaml")])
    write_sites(jd.path, inventory.sites)
    placement = job.spec.placement.model_copy(
        update={"trainer": job.spec.placement.trainer.model_copy(update={"site": "h20"})}
    )
    evaluation = job.spec.evaluation.model_copy(update={"every_iterations": 2})
    spec = job.spec.model_copy(update={"placement": placement, "evaluation": evaluation})
    assert not [p for p in problems(Job(spec, inventory, job.path)) if p.field.startswith("evaluation")]
    rows = [(0, 0.25, 0.0, [0, 1]), (2, 0.5, 0.125, [2, 2]), (3, 0.625, 0.25, [3, 3])]
    for v, reward, exact, versions in rows[:2]:
        jd.append(
            jd.evaluations,
            {"version": v, "greedy_reward": reward, "greedy_exact": exact, "prompts": 8, "versions": versions},
        )
    out = add_heldout(jd, spec, {"state": "done"}, say=lambda _: None)
    assert out["heldout"] == {"error": f"the run did not evaluate its last version v3 (see {jd.events})"}
    v, reward, exact, versions = rows[2]
    jd.append(
        jd.evaluations,
        {"version": v, "greedy_reward": reward, "greedy_exact": exact, "prompts": 8, "versions": versions},
    )
    h = add_heldout(jd, spec, {"state": "done"}, say=lambda _: None)["heldout"]
    assert h == {
        "prompts": 8,
        "source": "during the run",
        "evaluations": 3,
        "greedy_exact_first": 0.0,
        "greedy_exact_last": 0.25,
        "greedy_reward_first": 0.25,
        "greedy_reward_last": 0.625,
        "versions_first": [0, 1],
        "versions_last": [3, 3],
    }
    assert heldout_line(h) == "exact 0.000 → 0.250, reward 0.250 → 0.625 (greedy, 8 prompts, during the run: v0–1 → v3)"


def test_the_runs_first_evaluation_whose_reward_calls_failed_is_said_when_its_last_had_none(tmp_path: Path) -> None:
    """Before: the run's failed reward calls were counted only where its last row had some, so a starting policy's
    evaluation whose every call failed (8 of 8 scored reward_on_error) read as its figure when the last's passed."""
    jd, job = _job_dir(tmp_path, iterations=2, final=False)
    inventory = load_inventory([ROOT / "clusters" / f for f in ("local.yaml", "h800-trainer.yaml", "h20-rollout.yaml")])
    write_sites(jd.path, inventory.sites)
    placement = job.spec.placement.model_copy(
        update={"trainer": job.spec.placement.trainer.model_copy(update={"site": "h20"})}
    )
    evaluation = job.spec.evaluation.model_copy(update={"every_iterations": 2})
    spec = job.spec.model_copy(update={"placement": placement, "evaluation": evaluation})
    row = {"greedy_exact": 0.0, "prompts": 8}
    jd.append(jd.evaluations, row | {"version": 0, "greedy_reward": 0.0, "versions": [0, 0], "reward_failures": 8})
    jd.append(jd.evaluations, row | {"version": 2, "greedy_reward": 0.5, "versions": [2, 2]})
    h = add_heldout(jd, spec, {"state": "done"}, say=lambda _: None)["heldout"]
    assert h["reward_failures"] == 8
    assert heldout_line(h).endswith("; 8 of its 16 reward calls failed, scored task.reward_on_error")


def test_a_run_whose_only_evaluation_is_its_last_counts_its_failed_reward_calls_once(tmp_path: Path) -> None:
    """A run with one evaluation row (its starting policy's lost with its unit, the last version's answering for
    it): that row was its first and its last, and its failed reward calls were counted twice, of twice its calls
    ('8 of its 16' where 4 of its 8 failed)."""
    jd, job = _job_dir(tmp_path, iterations=2, final=False)
    inventory = load_inventory([ROOT / "clusters" / f for f in ("local.yaml", "h800-trainer.yaml", "h20-rollout.yaml")])
    write_sites(jd.path, inventory.sites)
    placement = job.spec.placement.model_copy(
        update={"trainer": job.spec.placement.trainer.model_copy(update={"site": "h20"})}
    )
    evaluation = job.spec.evaluation.model_copy(update={"every_iterations": 2})
    spec = job.spec.model_copy(update={"placement": placement, "evaluation": evaluation})
    row = {"greedy_exact": 0.0, "prompts": 8, "greedy_reward": 0.5, "versions": [2, 2], "reward_failures": 4}
    jd.append(jd.evaluations, row | {"version": 2})
    h = add_heldout(jd, spec, {"state": "done"}, say=lambda _: None)["heldout"]
    assert (h["evaluations"], h["reward_failures"]) == (1, 4)
    assert heldout_line(h).endswith("; 4 of its 8 reward calls failed, scored task.reward_on_error")


def test_check_refuses_an_evaluation_it_cannot_run() -> None:
    demo = load_job(ROOT / "jobs" / "demo.yaml")
    assert demo.spec.evaluation.heldout_prompts > 0 and problems(demo) == []
    inventory = load_inventory([ROOT / "clusters" / f for f in ("local.yaml", "h800-trainer.yaml", "h20-rollout.yaml")])
    placement = demo.spec.placement.model_copy(
        update={"trainer": demo.spec.placement.trainer.model_copy(update={"site": "h20"})}
    )
    remote = Job(demo.spec.model_copy(update={"placement": placement}), inventory, demo.path)
    lengths = Job(demo.spec.model_copy(update={"task": LengthsTask(kind="lengths")}), inventory, demo.path)
    for job, says in ((remote, "reached over SSH"), (lengths, "task kinds 'digits' and 'dataset'")):
        found = [p for p in problems(job) if p.field == "evaluation.heldout_prompts"]
        assert len(found) == 1 and says in found[0].message


def test_the_held_out_policies_are_built_for_the_tasks_longest_prompt_plus_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digits evaluation's models hold RoPE tables of the task's prompt + output (BOS, MAX_DIGITS digits, '=',
    16 output tokens: 70), versus every one of the checkpoint's max_position_embeddings (4096 here; 1,024,000 for
    Mistral Nemo); its figures are the full tables' model's."""
    torch.manual_seed(0)
    TinyGPT(small_config(hidden=16, positions=4096)).save_pretrained(tmp_path / "model")
    task = DigitsTask(SHORT)
    full = evaluate(TinyGPT.from_pretrained(tmp_path / "model"), task, task.heldout_prompts(4))
    tables = rope_rows_loaded(monkeypatch)
    figures = compare(tmp_path / "model", tmp_path / "model", task, num_prompts=4)
    assert tables == [task.context] * 2 == [1 + MAX_DIGITS + 1 + 16] * 2
    assert (figures["greedy_exact_first"], figures["greedy_reward_first"]) == (
        round(full.exact, 4),
        round(full.reward, 4),
    )
