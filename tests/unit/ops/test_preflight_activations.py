"""`rlctl check` judges a trainer rank with its cut's activations (`rlctl.profiler.actmem`), as `rlctl plan` prices
it: a 7B torch trainer whose weights, gradients and AdamW state fit FSDP2-sharded over 8 H800s, with rows of 16,384
tokens, is refused at the cut's field in one line with the figures and the fixes, and passes recomputed."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from rlctl.config import load_job
from rlctl.ops import counts
from tests.conftest import run_cli
from tests.unit.ops.test_preflight import GPU_CLUSTERS, load, refused


def long_rows_job(tmp_path: Path, **trainer: object) -> Path:
    job = load(
        tmp_path,
        inventory=GPU_CLUSTERS,
        model={"kind": "builtin", "name": "qwen2.5-7b"},
        task={"kind": "lengths", "prompt_tokens": 384, "median_output_tokens": 2750, "max_output_tokens": 16000},
        batch={"prompts_per_iteration": 16, "samples_per_prompt": 8},
        placement={"trainer": {"site": "h800", "gpus": 8}, "rollout": [{"site": "h20", "gpus": 12}]},
        rollout={"engine": "vllm", "tensor_parallel": 2},
        trainer={"backend": "torch", **trainer},
    )
    return job.path


def test_a_cut_whose_activations_do_not_fit_is_refused_at_its_field_and_passes_recomputed(tmp_path: Path) -> None:
    path = long_rows_job(tmp_path)
    job = load_job(path)
    assert counts.plan_counts(job, job.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 8, "fsdp": True}
    (p,) = refused(job, "batch.train_micro_batch_tokens")
    assert p.message == (
        "the trainer's 8 rank(s) at tp 1 pp 1 dp 8 need 175.7 GB each (weights, gradients and optimizer state "
        "121.9 GB ÷ 8 (FSDP2), layers gathered 7.9 GB, activations of a cut's 16,384 tokens a rank 150.6 GB), and a "
        "H800 holds 80 GB (90% usable)"
    )
    # (more GPUs do not help: a rank's share of a cut is its budgets' at any dp)
    assert p.hint is not None and "trainer.activation_checkpointing" in p.hint and "GPUs" not in p.hint
    data = yaml.safe_load(path.read_text())
    data["trainer"]["activation_checkpointing"] = True
    path.write_text(yaml.safe_dump(data))
    assert [q for q in refused(load_job(path), "batch.train_micro_batch_tokens")] == []
    assert "GB each" not in run_cli("check", str(path)).stderr


def test_the_tokens_a_rank_fits_that_check_names_are_the_budget_it_passes_at(tmp_path: Path) -> None:
    """Rows of 4,384 tokens in a budget of 65,536 a rank (601.4 GB of activations): check names the largest
    batch.train_micro_batch_tokens a rank's share fits at, exactly: the job passes at it and is refused one token
    above (the budget is a rank's at any dp; the figure was a linear estimate, "about 5,102", refused)."""
    path = long_rows_job(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["task"]["max_output_tokens"] = 4000
    data["batch"]["train_micro_batch_tokens"] = 65536
    path.write_text(yaml.safe_dump(data))
    (p,) = refused(load_job(path), "batch.train_micro_batch_tokens")
    found = re.search(r"\(65536; ([\d,]+) tokens a rank fit\)", p.hint or "")
    assert found is not None, p.hint
    fit = int(found.group(1).replace(",", ""))
    assert fit == 5096
    for budget, passes in ((fit, True), (fit + 1, False)):
        data["batch"]["train_micro_batch_tokens"] = budget
        path.write_text(yaml.safe_dump(data))
        assert (refused(load_job(path), "batch.train_micro_batch_tokens") == []) is passes, budget


def test_a_job_without_a_token_budget_is_told_to_set_one(tmp_path: Path) -> None:
    """Rows of 4,384 tokens and batch.train_micro_batch_tokens null: a rank's share of a cut is its rows alone, and
    check says to set the budget, versus "lower batch.train_micro_batch_tokens (unset; …)"."""
    path = long_rows_job(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["task"]["max_output_tokens"] = 4000
    data["batch"]["train_micro_batch_tokens"] = None
    path.write_text(yaml.safe_dump(data))
    (p,) = refused(load_job(path), "batch.train_micro_batch_tokens")
    assert p.hint is not None and re.match(
        r"set batch.train_micro_batch_tokens \(unset; [\d,]+ tokens a rank fit\)", p.hint
    ), p.hint
