"""`rlctl profile --source measured` at a job's megatron split: the probe runs the split's tp·pp ranks as real
processes (rlctl.profiler.measure_split) and the profile's entry at the split is their wall-clock figure; a
rank that fails is one error line, and a split the probe's host has too few cores for is refused in one line."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import yaml

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.errors import RlctlError
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.profiler import measure_split, measure_train, probe
from rlctl.profiler.profile import load_profile
from tests.conftest import ROOT, CliResult
from tests.unit.profiler.test_profiler_trainer_backends import fake_generation
from tests.unit.rank_end import probe_rank_ends
from tests.unit.trainers.megatron_required import require_megatron

Cli = Callable[..., CliResult]
BATCH = {"prompts_per_iteration": 2, "samples_per_prompt": 4, "train_micro_batch_samples": 4}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def splittable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-demo's size with 2 layers and 2 heads (its own 3 and 3 split by neither 2): an HF checkpoint."""
    config = TinyGPTConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)
    return TinyGPT(config).save_pretrained(tmp_path_factory.mktemp("model") / "tiny-2x2")


def job_file(
    tmp_path: Path, model: dict[str, str], algorithm: str = "grpo", aggregation: str = "token_mean", **trainer: Any
) -> Path:
    data = yaml.safe_load((ROOT / "jobs/demo.yaml").read_text())
    data["inventory"] = [str(ROOT / "clusters/local.yaml")]
    data.update(batch=BATCH, model=model, trainer={"backend": "megatron", **trainer})
    data["algorithm"] = {"kind": algorithm, "kl_coef": 0.05, "loss_aggregation": aggregation}  # a reference too
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def synthetic_tokens(*, seeds: range, vocab: int) -> list[int]:
    """Padded tokens (prompt + output, the step's rows cut as the learner cuts them, each cut padded to its longest:
    `measure_train.padded_tokens`) of each synthetic iteration the probe trains."""
    b = Batch(**BATCH)
    return [
        measure_train.padded_tokens(batch, b)
        for batch in (
            measure_train.synthetic_samples(
                prompts=b.prompts_per_iteration, group_size=b.samples_per_prompt, vocab=vocab, seed=i
            )
            for i in seeds
        )
    ]


def spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[measure_train.TrainMeasurement]:
    """What `module.name` returns, call by call (it still runs)."""
    real, got = getattr(module, name), []

    def call(*args: Any, **kw: Any) -> measure_train.TrainMeasurement:
        got.append(real(*args, **kw))
        return got[-1]

    monkeypatch.setattr(module, name, call)
    return got


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "split,algorithm,aggregation",
    [((2, 1), "grpo", "token_mean"), ((1, 2), "grpo", "constant"), ((2, 1), "ppo", "constant"),
     ((1, 2), "ppo", "sequence_mean")],
    ids=["tp2", "pp2-constant", "tp2-ppo-constant", "pp2-ppo"],
)  # fmt: skip
def test_the_jobs_split_is_measured_over_its_ranks(
    cli: Cli,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    splittable: Path,
    split: tuple[int, int],
    algorithm: str,
    aggregation: str,
) -> None:
    """(with each loss aggregation: `constant` divides by the synthetic samples' longest output)"""
    require_megatron()
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the split's 2 ranks need 2 cores")
    fake_generation(monkeypatch)
    thread = spy(monkeypatch, measure_train, "measure_training")
    wall = spy(monkeypatch, measure_split, "measure_split")
    ends = probe_rank_ends(monkeypatch, tmp_path, "rlctl.profiler.measure_split")
    tp, pp = split
    model = {"kind": "hf", "path": str(splittable)}
    job = job_file(tmp_path, model, algorithm, aggregation, tensor_parallel=tp, pipeline_parallel=pp)
    r = cli("profile", "--job", str(job), "--source", "measured", "-o", str(tmp_path / "p.yaml"))
    assert r.exit_code == 0, r.stderr
    # the 1 + 2 ranks (tp 1 pp 1, then the split's) ended without the interpreter's finalization, where a gloo
    # thread freeing the last collective could abort a rank (-6) whose figures were written
    ran = sorted(p.name.partition("-")[0] for p in ends.iterdir())
    assert ran == ["rank"] * 3, ran
    assert not dist.is_initialized()  # the probe's own one-rank group is gone; the ranks were other processes
    (one_rank,) = thread
    single, at_split = wall
    assert [(m.tp, m.pp, len(m.rank_step_s)) for m in wall] == [(1, 1, 1), (tp, pp, 2)]
    # every rank trained every synthetic iteration's tokens (tp and pp ranks share a data-parallel rank)
    tokens = synthetic_tokens(seeds=range(1, 4), vocab=66)  # 1 warm-up step, 3 timed
    assert one_rank.step_tokens == single.step_tokens == at_split.step_tokens == tokens
    assert single.rank_tokens == [tokens] and at_split.rank_tokens == [tokens, tokens]
    # a step lasts as long as its slowest rank; the figure is tp·pp ranks × the median seconds per token
    assert at_split.step_s == [max(s) for s in zip(*at_split.rank_step_s, strict=True)]
    assert at_split.gpu_s_per_token == pytest.approx(
        2 * statistics.median(t / n for t, n in zip(at_split.step_s, tokens, strict=True))
    )
    entries = {(e.tp, e.pp): e for e in load_profile(tmp_path / "p.yaml").sites["local"].training}
    assert sorted(entries) == [(1, 1), split]
    assert (entries[split].backend, entries[split].pipeline_wait_included) == ("megatron", True)
    assert entries[split].gpu_s_per_token == at_split.gpu_s_per_token > 0
    assert (entries[1, 1].gpu_s_per_token, entries[1, 1].pipeline_wait_included) == (one_rank.gpu_s_per_token, False)
    assert f"training at tp {tp} pp {pp}, measured over its 2 ranks" in r.stderr
    print(  # `pytest -s`: the figures
        f"tp {tp} pp {pp}: {at_split.gpu_s_per_token:.3g} GPU-s/token (wall, 2 ranks); tp 1 pp 1: "
        f"{single.gpu_s_per_token:.3g} (wall, 1 rank), {one_rank.gpu_s_per_token:.3g} (thread clock)"
    )


@pytest.mark.timeout(120)
def test_a_rank_that_fails_is_one_error_line_and_no_rank_is_left(tmp_path: Path) -> None:
    require_megatron()
    # tiny-demo's 3 layers do not split over 2 stages: each rank raises in load_backend (the probe refuses this
    # split before starting anything; here the ranks run to show how a failure comes back)
    with pytest.raises(RlctlError) as e:
        measure_split.measure_split(GrpoAlgorithm(kind="grpo"), Batch(**BATCH), tp=1, pp=2, timeout_s=100)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("training at tp 1 pp 2: rank ")
    assert msg.endswith("exited 1: ValueError: pipeline parallel 2 does not divide num_hidden_layers 3; use a divisor "
                        "(every stage holds as many layers)")  # fmt: skip


def test_a_split_with_more_ranks_than_cores_or_that_does_not_divide_the_model_is_refused_in_one_line(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, splittable: Path
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(probe, "megatron_available", lambda: None)  # refused before anything runs, installed or not
    monkeypatch.setattr(measure_train, "measure_training", lambda *a, **kw: ran.append(a))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    job = job_file(tmp_path, {"kind": "hf", "path": str(splittable)}, tensor_parallel=2)
    r = cli("profile", "--job", str(job), "--source", "measured")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr
    assert "the megatron split tp 2 pp 1 is timed over its 2 ranks, a core each, and this host gives the probe 1" in (
        r.stderr
    )
    assert "--source analytical" in r.stderr  # the hint
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    r = cli("profile", "--job", str(job_file(tmp_path, {"kind": "builtin", "name": "tiny-demo"}, tensor_parallel=2)),
            "--source", "measured")  # fmt: skip
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "megatron split tp 2 pp 1 of tiny-demo: tensor parallel 2 does not divide num_key_value_heads 3" in r.stderr
    assert ran == []
