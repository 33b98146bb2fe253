"""Held-out evaluation of a dataset task (`evaluation: {heldout_prompts, path}`): the summary's figures are the
task's reward of each policy's greedy answers, as `transformers`' own greedy decoding gives them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from rlctl.config.task import DatasetTask
from rlctl.rl.dataset import prepare_dataset
from rlctl.rl.evaluate import compare_dataset
from rlctl.rl.source import heldout_task
from rlctl.rl.tokenizer import decode_output, load_tokenizer
from tests.unit.hf_checkpoints import rope_rows_loaded, write_checkpoint
from tests.unit.hf_tokenizer import write_tokenizer

QUESTIONS = ["what is 1 + 2 ?", "hello world", "the answer is", "a b c", "what is 4 + 5 ?"]
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" + (
    "    return float(len(solution_str.split()))\n"
)


def test_dataset_heldout_figures_are_the_reward_of_transformers_greedy_answers(tmp_path: Path) -> None:
    dirs = [tmp_path / "before", tmp_path / "after"]
    models = [write_checkpoint("qwen2-tied-hd32", d, seed=seed) for seed, d in enumerate(dirs)]
    for d in dirs:
        write_tokenizer(d)
    (tmp_path / "held.jsonl").write_text(
        "".join(json.dumps({"prompt": q, "ground_truth": str(i)}) + "\n" for i, q in enumerate(QUESTIONS))
    )
    (tmp_path / "rewards.py").write_text(REWARD)
    cfg = DatasetTask.model_validate(
        {"kind": "dataset", "path": "train.jsonl", "reward": "rewards.py:compute_score", "max_output_tokens": 12}
    )
    task = heldout_task(cfg.model_copy(update={"reward_workers": 0}), "held.jsonl")
    tok = load_tokenizer(dirs[0])
    data = prepare_dataset(task, data_path=tmp_path / "held.jsonl", tokenizer=tok, out_dir=tmp_path / "held")
    assert [data.prompt(i).ground_truth for i in range(5)] == ["0", "1", "2", "3", "4"]  # the file's order

    figures = compare_dataset(dirs[0], dirs[1], task, data_dir=tmp_path / "held", reward_dir=tmp_path, num_prompts=4)
    assert figures["prompts"] == 4 and figures["reward_failures"] == 0
    for key, model in (("greedy_reward_first", models[0]), ("greedy_reward_last", models[1])):
        words = []
        for i in range(4):  # the file's first rows
            prompt = torch.tensor([data.prompt(i).tokens])
            with torch.no_grad():
                out = model.generate(
                    prompt, do_sample=False, max_new_tokens=12, eos_token_id=list(tok.eos_ids), pad_token_id=0
                )
            words.append(len(decode_output(tok, out[0, prompt.shape[1] :].tolist()).split()))
        assert figures[key] == round(sum(words) / 4, 4), (key, words)
    assert figures["greedy_reward_first"] != figures["greedy_reward_last"]  # the two policies are told apart


def _one_held_out_prompt(tmp_path: Path, reward: str, workers: int, **fields: int) -> tuple[list[Path], DatasetTask]:
    """Two policies (before, after), a held-out file of one prompt, prepared, and `reward` (rewards.py's source) on
    `workers` reward workers (the dataset task's other `fields` given): the policies' directories and the held-out
    task."""
    dirs = [tmp_path / "before", tmp_path / "after"]
    for seed, d in enumerate(dirs):
        write_checkpoint("qwen2-tied-hd32", d, seed=seed)
        write_tokenizer(d)
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": QUESTIONS[0], "ground_truth": "0"}) + "\n")
    (tmp_path / "rewards.py").write_text(reward)
    cfg = DatasetTask.model_validate(
        {"kind": "dataset", "path": "train.jsonl", "reward": "rewards.py:compute_score", "max_output_tokens": 4}
        | fields
    )
    task = heldout_task(cfg.model_copy(update={"reward_workers": workers}), "held.jsonl")
    prepare_dataset(
        task, data_path=tmp_path / "held.jsonl", tokenizer=load_tokenizer(dirs[0]), out_dir=tmp_path / "held"
    )
    return dirs, task


def test_a_reward_no_worker_can_load_fails_the_evaluation_saying_why(tmp_path: Path) -> None:
    """The reward file loads in the caller but not in a worker: the pool fails and the evaluation with it, naming
    the load error (the held-out figures were once every call's `reward_on_error`)."""
    reward = "import multiprocessing\nif multiprocessing.parent_process() is not None:\n"
    dirs, task = _one_held_out_prompt(tmp_path, reward + "    raise ImportError('only in the caller')\n" + REWARD, 1)
    with pytest.raises(
        ValueError, match=r"reward pool failed: a reward worker cannot load rewards\.py:compute_score: "
    ):
        compare_dataset(dirs[0], dirs[1], task, data_dir=tmp_path / "held", reward_dir=tmp_path, num_prompts=1)


def test_a_failed_reward_call_names_its_row_of_the_held_out_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the warning named the row without its file (`(line 1)`), while the run's own name it (`held.jsonl
    line 1`)."""
    reward = (
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    raise KeyError('boom')\n"
    )
    dirs, task = _one_held_out_prompt(tmp_path, reward, 0)
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_pool")
    figures = compare_dataset(dirs[0], dirs[1], task, data_dir=tmp_path / "held", reward_dir=tmp_path, num_prompts=1)
    assert figures["reward_failures"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"reward error: sample {d}#0 (held.jsonl line 1): KeyError: 'boom' (rewards.py:2); scored 0.0" for d in dirs
    ]


def test_the_held_out_policies_are_built_for_the_tasks_longest_prompt_plus_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end-of-job evaluation's models hold RoPE tables of max_prompt_tokens + max_output_tokens (40 + 4), versus
    every one of the checkpoint's max_position_embeddings (128 here; 1,024,000 for Mistral Nemo)."""
    dirs, task = _one_held_out_prompt(tmp_path, REWARD, 0, max_prompt_tokens=40)
    tables = rope_rows_loaded(monkeypatch)
    compare_dataset(dirs[0], dirs[1], task, data_dir=tmp_path / "held", reward_dir=tmp_path, num_prompts=1)
    assert tables == [44, 44]


def test_a_mixed_held_out_file_gives_each_data_sources_figures_beside_the_mean(tmp_path: Path) -> None:
    """Rows of two data_sources, a reward that scores openai/gsm8k 1 and lighteval/MATH 0: the figures per source
    are 1.0 and 0.0 and the overall their mean weighted by rows (3 of 4: 0.75), versus the mean alone (a dataset
    improving while another regresses went unseen). A file of one source keeps its figures as they were."""
    from rlctl.ops.evaluation import heldout_line

    dirs = [tmp_path / "before", tmp_path / "after"]
    for seed, d in enumerate(dirs):
        write_checkpoint("qwen2-tied-hd32", d, seed=seed)
        write_tokenizer(d)
    sources = ["openai/gsm8k", "lighteval/MATH", "openai/gsm8k", "openai/gsm8k"]
    (tmp_path / "held.jsonl").write_text(
        "".join(
            json.dumps({"prompt": q, "ground_truth": "0", "data_source": s}) + "\n"
            for q, s in zip(QUESTIONS, sources, strict=False)
        )
    )
    (tmp_path / "rewards.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(data_source == 'openai/gsm8k')\n"
    )
    cfg = DatasetTask.model_validate(
        {"kind": "dataset", "path": "train.jsonl", "reward": "rewards.py:compute_score", "max_output_tokens": 2}
    )
    task = heldout_task(cfg.model_copy(update={"reward_workers": 0}), "held.jsonl")
    prepare_dataset(
        task, data_path=tmp_path / "held.jsonl", tokenizer=load_tokenizer(dirs[0]), out_dir=tmp_path / "held"
    )
    figures = compare_dataset(dirs[0], dirs[1], task, data_dir=tmp_path / "held", reward_dir=tmp_path, num_prompts=4)
    per_source = {"lighteval/MATH": 0.0, "openai/gsm8k": 1.0}
    assert (figures["greedy_reward_first"], figures["greedy_reward_last"]) == (0.75, 0.75)
    assert figures["greedy_reward_first_by_source"] == figures["greedy_reward_last_by_source"] == per_source
    assert heldout_line(figures).endswith("; by data_source: lighteval/MATH 0.000 → 0.000, openai/gsm8k 1.000 → 1.000")

    one = compare_dataset(dirs[0], dirs[1], task, data_dir=tmp_path / "held", reward_dir=tmp_path, num_prompts=1)
    assert {k for k in one if "by_source" in k} == set()  # the first row alone: one source
    assert heldout_line(one) == "reward 1.000 → 1.000 (greedy, 1 prompts)"
