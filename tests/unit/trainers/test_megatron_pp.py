"""Pipeline parallel 2 (two gloo processes), tp 2 × pp 2 and pp 2 × dp 2 (four) on CPU: each rank builds its
stage of the GPTModel (4 layers: 2 per stage, megatron's local numbers 0-1 on stage 1 standing for HF layers
2-3), the stages are chained inside `model(tokens)` (rlctl.trainers.megatron.pipeline), and every rank
returns the logits of the single-process megatron model; the gradients, gathered over tp and stages (a tied
embedding's two copies summed), are the `torch` backend's; `weights()` gathers the checkpoint back bit for
bit; one GRPO step through the learner moves the weights as in one process. The ranks make their calls with the
meta device as torch's default (megatron_tp_rank.elsewhere): every buffer the stages exchange is the stage's own."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.models.hf import read_config
from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.megatron.names import check_split
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.rope_checkpoints import YARN_8, with_rope
from tests.unit.trainers.megatron_required import require_megatron
from tests.unit.trainers.megatron_tp_rank import PAD
from tests.unit.trainers.ranks import spawn_ranks
from tests.unit.trainers.test_megatron_backend import rollouts
from tests.unit.trainers.test_megatron_tp_grpo import run_ranks as grpo_ranks

pytest.importorskip("transformers")
RANK = Path(__file__).with_name("megatron_tp_rank.py")
LAYERS = 4


def run_ranks(tmp_path: Path, name: str, *, tp: int, pp: int, checkpoints: list[Path]) -> list[subprocess.Popen[str]]:
    return spawn_ranks(
        RANK, world=tp * pp, tp=tp, pp=pp, rendezvous=tmp_path / f"{name}.rendezvous",
        out=lambda r: tmp_path / f"{name}-{r}.json", checkpoints=checkpoints,
    )  # fmt: skip


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "tp,pp,variants",
    [
        # tied embeddings with q/k/v bias and one key/value head (and again with yarn RoPE: each stage's rotary
        # tables); grouped-query attention with an untied lm_head
        (1, 2, ["qwen2-tied-hd32", "llama-hd64-eos3", "qwen2-tied-hd32+yarn"]),
        # tied and vocab-parallel at both ends, o_proj bias; grouped-query attention, untied lm_head; Qwen3's q/k norms
        (2, 2, ["llama-bias-tied", "llama-hd64-eos3", "qwen3-tied-hd32"]),
    ],
    ids=["pp2", "tp2-pp2"],
)
def test_pipeline_stages_give_the_single_process_logits(tmp_path: Path, tp: int, pp: int, variants: list[str]) -> None:
    require_megatron()
    checkpoints = [tmp_path / v for v in variants]
    for variant, path in zip(variants, checkpoints, strict=True):
        write_checkpoint(
            variant.removesuffix("+yarn"), path, num_hidden_layers=LAYERS, pad_token_id=PAD
        )  # (its row: no gradient from it)
        if variant.endswith("+yarn"):
            with_rope(path, YARN_8)
    procs = run_ranks(tmp_path, "split", tp=tp, pp=pp, checkpoints=checkpoints)
    procs += run_ranks(tmp_path, "whole", tp=1, pp=1, checkpoints=checkpoints)
    errors = [p.communicate(timeout=360)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(e[-3000:] for e in errors)
    whole = torch.load(tmp_path / "whole-0.pt")
    for r, c in ((r, str(c)) for r in range(tp * pp) for c in checkpoints):
        got = json.loads((tmp_path / f"split-{r}.json").read_text())[c]
        assert got["shard_numel"] < 0.75 * got["full_numel"]  # a stage (and its tp part) holds about 1/2 or 1/4
        split = torch.load(tmp_path / f"split-{r}.pt")[c]
        assert list(split) == list(whole[c]) == ["2x24", "1x24", "5x24"]
        for shape, logits in split.items():
            assert logits.shape == whole[c][shape].shape
            # stages and row chunks alone change no arithmetic (bit for bit); tp's row-parallel partial sums
            # round apart (fp32)
            assert torch.allclose(logits, whole[c][shape], rtol=0, atol=0 if tp == 1 else 2e-5), (r, c, shape)
        # the gradients on 5 rows: 4 chunks (2, 1, 1, 1 rows) sent forward in order, back in reverse (the engine
        # runs the chunk made last first on the last stage, and the stages before it receive in that order)
        stage = r // tp
        assert got["send_tags"] == {
            "forward": [0, 1, 2, 3] if stage < pp - 1 else [],
            "backward": [3, 2, 1, 0] if stage > 0 else [],
        }, (r, c)
        assert got["logits_max_abs_diff"] <= 2e-5  # against the torch backend, as at tp 1 (test_megatron_backend)
        assert got["grad_max_rel_diff"] <= 2e-5 and got["pad_positions"] == 2
        assert got["weights_names_are_the_engine_names"] and got["weights_bit_exact"]


def test_a_pp_that_does_not_divide_the_layers_is_refused(tmp_path: Path) -> None:
    write_checkpoint("llama-hd64-eos3", tmp_path, num_hidden_layers=3)
    with pytest.raises(ValueError, match="pipeline parallel 2 does not divide num_hidden_layers 3"):
        check_split(read_config(tmp_path), 1, 2)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "tp,pp,dp,variants",
    [
        (1, 2, 1, ["qwen2-tied-hd32", "llama-hd64-eos3"]),
        (2, 2, 1, ["llama-bias-tied", "llama-hd64-eos3", "qwen3-tied-hd32"]),
        (1, 2, 2, ["qwen2-tied-hd32"]),  # two pipelines: each stage's gradients summed over its dp group
    ],
    ids=["pp2", "tp2-pp2", "pp2-dp2"],
)
def test_a_grpo_step_over_pipeline_stages_moves_the_weights_as_in_one_process(
    tmp_path: Path, tp: int, pp: int, dp: int, variants: list[str]
) -> None:
    """The learner (rank 0 adds and steps, the others follow) on the megatron backend at tp × pp × dp against
    the same step at tp 1 pp 1: every rank takes its data-parallel share, publishes the same bytes, and the
    update and gradient norm are the single process's (a tied embedding's two copies step alike: one HF
    tensor)."""
    require_megatron()
    checkpoints = [tmp_path / v for v in variants]
    before: dict[str, dict[str, torch.Tensor]] = {}
    batch: dict[str, Any] = {}
    for variant, path in zip(variants, checkpoints, strict=True):
        write_checkpoint(variant, path, num_hidden_layers=LAYERS)
        model = TinyGPT.from_pretrained(path)
        before[str(path)] = {k: v.clone() for k, v in model.state_dict().items()}
        batch[str(path)] = copy.deepcopy(rollouts(model, prompts=3, group=4, seed=0))
    torch.save(batch, tmp_path / "samples.pt")
    world = tp * pp * dp
    procs = grpo_ranks(tmp_path, "split", world=world, tp=tp, pp=pp, checkpoints=checkpoints)
    procs += grpo_ranks(tmp_path, "whole", world=1, tp=1, checkpoints=checkpoints)
    errors = [p.communicate(timeout=360)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(e[-3000:] for e in errors)
    split = [torch.load(tmp_path / f"split-{r}.pt", weights_only=False) for r in range(world)]
    whole = torch.load(tmp_path / "whole-0.pt", weights_only=False)
    for c in map(str, checkpoints):
        want = whole[c]
        # megatron's rank order tp-dp-pp: consecutive ranks are tp, then dp, then pipeline stages
        assert [s[c]["dp"] for s in split] == [[r // tp % dp, dp] for r in range(world)]
        if read_config(Path(c)).tie_word_embeddings:  # the last stage's copy (on each of its tp × dp ranks)
            copies = [s[c]["tied_copy_equal"] for s in split if s[c]["tied_copy_equal"] is not None]
            assert copies == [True] * tp * dp
        for s in split:  # every rank publishes the same full HF tensors
            assert list(s[c]["weights"]) == list(want["weights"])
            assert all(torch.equal(s[c]["weights"][k], split[0][c]["weights"][k]) for k in want["weights"]), c
        got, s1 = split[0][c]["stats"], want["stats"]
        assert got["loss"] == pytest.approx(s1["loss"], abs=1e-6)
        assert got["tokens"] == s1["tokens"]
        # over every stage, the tied copy once; at tp 1 dp 1 the stages compute the logits one process does, but
        # each weight's gradient is summed chunk by chunk over the cut's rows (cuts of up to 5 rows in up to 4
        # chunks: rl.cuts.pipeline_chunks), another order (grad norm measured: 0 tied, 7e-8 untied)
        one_pipeline = tp == dp == 1
        assert got["grad_norm"] == pytest.approx(s1["grad_norm"], rel=1e-6 if one_pipeline else 1e-5)
        for k, w in want["weights"].items():
            step = (w - before[c][k]).norm()
            assert step > 0, k
            # through Adam's first step (≈ lr·sign(g)) that rounding moves a weight by ≤ 2.6e-5 of the step measured;
            # k_proj.bias's gradient is 0 up to rounding (softmax ignores a shift of every key), so its step is
            # rounding's sign: 2.4e-3 of the step measured, checked below
            if one_pipeline and not k.endswith("k_proj.bias"):
                assert (split[0][c]["weights"][k] - w).norm() <= 1e-4 * step, (c, k)
            # tp/dp's and the chunks' rounding through Adam's first step (a gradient near 0 rounds to either side),
            # over 4 layers: up to 2.1e-3 of the step measured (2.5e-3 for a k_proj.bias), 5e-2 as in the tp test
            tolerance = 5e-2 if k.endswith("k_proj.bias") else 5e-3
            assert (split[0][c]["weights"][k] - w).norm() <= tolerance * step, (c, k)
