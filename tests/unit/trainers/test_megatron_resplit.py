"""A trainer checkpoint resumes at another split than it was written at: Megatron written at tp 2 and resumed at
tp 1, at pp 2 → tp 2, at tp 1 → tp 2, at tp 2 × pp 2 → tp 1, at pp 2 × dp 2 → pp 2 (each rank the shard of its
position, another rank's at dp 2), and the torch backend at dp 2 → dp 1. The ranks train two iterations,
checkpoint, a third → W_a (megatron_resume_rank.py's "run"); fresh ranks at the other split restore the checkpoint
("resplit": each rank's AdamW state rebuilt from the old shards) and train that third iteration → W_b. Gathered
whole (the HF layout, by the rule that splits the weights: `names.to_hf`, `gather_hf`), the resumed ranks' weights
and AdamW moments are the checkpoint's bit for bit, and the step count carried; W_b is W_a within float error (a
split sums gradients and logits in another order)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.megatron import names
from rlctl.trainers.megatron.names import Stage
from tests.unit.trainers.megatron_required import require_megatron
from tests.unit.trainers.test_megatron_resume import model_and_samples, run_phase

pytest.importorskip("transformers")
MOMENTS = ("exp_avg", "exp_avg_sq")


def whole_moments(ranks: list[dict], key: str, *, backend: str, tp: int, pp: int, dp: int, model: Path) -> dict:
    """{moment: {HF name: whole tensor}} from the policy AdamW state by parameter name of each rank (`key`) of a
    tp × pp × dp split: replica 0's ranks, each stage's tp parts joined."""
    if backend == "torch":
        return {m: {n: st[m] for n, st in ranks[0][key].items()} for m in MOMENTS}
    c = TinyGPT.from_pretrained(model).config
    out: dict[str, dict[str, torch.Tensor]] = {m: {} for m in MOMENTS}
    for p in range(pp):
        replica0 = [ranks[t + tp * dp * p][key] for t in range(tp)]
        for m in MOMENTS:
            parts = [{n.removeprefix("gpt."): st[m] for n, st in r.items()} for r in replica0]
            out[m] |= names.gather_hf([names.to_hf(part, c, tp=tp, stage=Stage(p, pp)) for part in parts])
    return out


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "backend,was,now,variant",
    [
        ("megatron", (2, 1, 1), (1, 1, 1), "llama-bias-tied"),
        ("megatron", (1, 2, 1), (2, 1, 1), "llama-bias-tied"),
        ("megatron", (1, 1, 1), (2, 1, 1), "llama-bias-tied"),
        ("megatron", (2, 2, 1), (1, 1, 1), "llama-bias-tied"),
        ("megatron", (1, 2, 2), (1, 2, 1), "llama-bias-tied"),
        ("torch", (1, 1, 2), (1, 1, 1), "llama-bias-tied"),
        ("megatron", (2, 2, 1), (1, 1, 1), "qwen3-tied-hd32"),  # its q/k norms' moments, whole on every tp rank
    ],
    ids=[
        "tp2-to-tp1",
        "pp2-to-tp2",
        "tp1-to-tp2",
        "tp2-pp2-to-tp1",
        "pp2-dp2-to-pp2",
        "torch-dp2-to-dp1",
        "qwen3-tp2-pp2-to-tp1",
    ],
)
def test_a_checkpoint_resumes_at_another_split_with_its_whole_state(
    tmp_path: Path, backend: str, was: tuple[int, int, int], now: tuple[int, int, int], variant: str
) -> None:
    if backend == "megatron":
        require_megatron()
    model_and_samples(tmp_path, variant)
    tp, pp, dp = was
    ran = run_phase(tmp_path, "run", backend=backend, algorithm="grpo", tp=tp, pp=pp, dp=dp)
    ckpt = tmp_path / "job" / "iter-2"
    manifest = json.loads((ckpt / "MANIFEST.trainer.json").read_text())
    assert manifest["split"] == {"tp": tp, "pp": pp, "dp": dp, "world": tp * pp * dp}

    ntp, npp, ndp = now
    resumed = run_phase(tmp_path, "resplit", backend=backend, algorithm="grpo", tp=ntp, pp=npp, dp=ndp)
    saved = TinyGPT.from_pretrained(ckpt / "model").state_dict()
    for rank, b in enumerate(resumed):
        assert b["counters"] == {"version": 2}
        assert all(torch.equal(b["restored_weights"][k], v) for k, v in saved.items()), rank
        assert {float(st["step"]) for st in b["restored"].values()} == {2.0}, rank  # two steps, carried
        # its policy checked against the model once, before the old shards are read (not again as it is loaded)
        assert b["policy_checks"] == (1 if backend == "megatron" else 0), rank
    checkpointed = whole_moments(ran, "at_checkpoint", backend=backend, tp=tp, pp=pp, dp=dp, model=ckpt / "model")
    restored = whole_moments(resumed, "restored", backend=backend, tp=ntp, pp=npp, dp=ndp, model=ckpt / "model")
    for m in MOMENTS:
        assert sorted(restored[m]) == sorted(checkpointed[m])
        different = [n for n, t in checkpointed[m].items() if not torch.equal(t, restored[m][n])]
        assert different == [], (m, different)  # bit for bit, gathered whole
    w_a, w_b = ran[0]["weights"], resumed[0]["weights"]
    assert not all(torch.equal(w_b[k], saved[k]) for k in saved)  # the third step moved it
    for k in w_a:
        torch.testing.assert_close(w_b[k], w_a[k], rtol=1e-4, atol=1e-5, msg=k)


def _shorter(state: dict) -> str:
    """The embedding's exp_avg_sq a row short (index 0: the embedding, first in GPTModel's order); what is said."""
    moment, name = state[0], "embedding.word_embeddings.weight"
    whole = tuple(moment["exp_avg_sq"].shape)
    moment["exp_avg_sq"] = moment["exp_avg_sq"][1:].clone()
    short = (whole[0] - 1, *whole[1:])
    return f"{name}'s exp_avg_sq is {short}; its rank's part of {name} at tp 2 pp 1 is {whole}"


def _bf16(state: dict) -> str:
    """The embedding's exp_avg in bf16 (AdamW's load cast it back to fp32 unsaid); what is said."""
    state[0]["exp_avg"] = state[0]["exp_avg"].to(torch.bfloat16)
    return "embedding.word_embeddings.weight's exp_avg is torch.bfloat16; its parameter's is torch.float32"


def _stepped_more(state: dict) -> str:
    """Every parameter's step count one past rank 0's shard's (2); what is said."""
    for st in state.values():
        st["step"] = torch.tensor(3.0)
    return "its parameters took 3 steps, rank 0's shard's 2 (every parameter steps together)"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("damage", [_shorter, _bf16, _stepped_more], ids=["shape", "dtype", "steps"])
def test_a_shard_not_holding_its_ranks_part_is_refused_at_another_split_naming_it_before_the_policy_loads(
    tmp_path: Path, damage: Any
) -> None:
    """A checkpoint written at tp 2 whose rank 1 shard (listed in the manifest as it is) holds the embedding's
    exp_avg_sq a row short, its exp_avg in bf16, or a step count rank 0's does not share, resumed at tp 1: one line
    naming the checkpoint, the shard and what is wrong, and the rank's weights still the HF model's it started from;
    versus the resplit's line naming no file (`<ckpt>: written by a trainer at tp 2 …: …`), raised after the
    checkpoint's policy was loaded (the shape), a line naming no file (the steps), or the moment cast to fp32 and
    resumed unsaid (the dtype)."""
    from tests.unit.checkpoint.test_shardcheck import relist

    require_megatron()
    model_and_samples(tmp_path)
    run_phase(tmp_path, "run", backend="megatron", algorithm="grpo", tp=2, pp=1, dp=1)
    ckpt = tmp_path / "job" / "iter-2"
    shard_path = ckpt / "ranks" / "rank-1.pt"
    shard = torch.load(shard_path, weights_only=True)
    said = damage(shard["optimizer.policy"]["state"])
    torch.save(shard, shard_path)
    relist(ckpt, "ranks/rank-1.pt")

    (refused,) = run_phase(tmp_path, "resplit-refused", backend="megatron", algorithm="grpo", tp=1, pp=1, dp=1)
    assert refused["errors"] == [f"{ckpt}: ranks/rank-1.pt: {said}"]
    start = TinyGPT.from_pretrained(tmp_path / "model").state_dict()
    assert all(torch.equal(refused["weights"][k], v) for k, v in start.items())  # the checkpoint's not loaded
    saved = TinyGPT.from_pretrained(ckpt / "model").state_dict()
    assert not all(torch.equal(saved[k], v) for k, v in start.items())  # (the premise: two steps moved them)


@pytest.mark.timeout(400)
def test_another_models_checkpoint_at_another_split_is_refused_naming_its_model_before_the_shards(
    tmp_path: Path,
) -> None:
    """A checkpoint written at tp 2 resumed at tp 1 by a job whose model is another one (its MLP twice as wide):
    the ConfigError naming the checkpoint's model and that its weights do not fit, the rank's weights its own model's;
    versus a line blaming ranks/rank-0.pt for an exp_avg of the other model's shape (the old shards read first)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    require_megatron()
    model_and_samples(tmp_path)
    run_phase(tmp_path, "run", backend="megatron", algorithm="grpo", tp=2, pp=1, dp=1)
    ckpt = tmp_path / "job" / "iter-2"
    config = AutoConfig.from_pretrained(tmp_path / "model")
    config.intermediate_size *= 2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")  # the job's model: another one

    (refused,) = run_phase(tmp_path, "resplit-refused", backend="megatron", algorithm="grpo", tp=1, pp=1, dp=1)
    (error,) = refused["errors"]
    assert error.startswith(f"{ckpt / 'model'}: weights do not fit this model: "), error
    assert "of another shape" in error and "mlp" in error, error
    start = TinyGPT.from_pretrained(tmp_path / "model").state_dict()
    assert all(torch.equal(refused["weights"][k], v) for k, v in start.items())  # nothing of the checkpoint's loaded
