"""Tensor parallel 2 across two processes over gloo on CPU: megatron-core's column/row-parallel layers and
vocab-parallel embedding, logits gathered over the tp group, equal the `torch` backend's; the gradients,
gathered, equal its gradients; each rank exports its own HF shard and the all-gather is the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.models.hf import read_config
from rlctl.trainers.megatron.names import check_split
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.rope_checkpoints import YARN_8, with_rope
from tests.unit.trainers.megatron_required import require_megatron
from tests.unit.trainers.megatron_tp_rank import PAD
from tests.unit.trainers.ranks import spawn_ranks

pytest.importorskip("transformers")
RANK = Path(__file__).with_name("megatron_tp_rank.py")


# grouped-query attention (2 groups of 2 heads) with an explicit head_dim and an untied lm_head; and tied
# embeddings (vocab-parallel on both ends) with Llama's o_proj bias (whole on every rank of a row-parallel layer);
# Qwen3's per-head q/k norms (whole on every rank, each rank's gradient its own heads' part); Phi3's fused qkv_proj and
# gate_up_proj in its file (each rank's query groups and gate/up rows cut from them); the first with yarn RoPE (each
# rank's heads rotated by YarnRotaryEmbedding's tables), its 24 positions past a pretraining context of 8; and the Phi3
# with RoPE on 0.75 of each head, as Phi-4-mini (each rank's heads rotated on their first 24 of 32 dimensions)
VARIANTS = ["llama-hd64-eos3", "llama-bias-tied", "qwen3-bias-hd32", "phi3-gqa"]


@pytest.mark.timeout(300)
def test_tp2_over_gloo_equals_the_torch_backend(tmp_path: Path) -> None:
    require_megatron()
    checkpoints = [tmp_path / v for v in VARIANTS]
    for variant, path in zip(VARIANTS, checkpoints, strict=True):
        write_checkpoint(variant, path, pad_token_id=PAD)  # (the embedding's pad row: no gradient from its tokens)
    write_checkpoint(VARIANTS[0], tmp_path / "yarn", pad_token_id=PAD)
    checkpoints.append(with_rope(tmp_path / "yarn", YARN_8))
    write_checkpoint("phi3-gqa", tmp_path / "partial", pad_token_id=PAD)
    checkpoints.append(with_rope(tmp_path / "partial", {"partial_rotary_factor": 0.75}))
    procs = spawn_ranks(
        RANK, world=2, tp=2, pp=1, rendezvous=tmp_path / "rendezvous", out=lambda r: tmp_path / f"rank{r}.json",
        checkpoints=checkpoints,
    )  # fmt: skip
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors[0][-3000:] + errors[1][-3000:]
    for r, c in ((r, c) for r in (0, 1) for c in checkpoints):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())[str(c)]
        assert got["shard_numel"] < 0.75 * got["full_numel"]  # each rank holds about half (norms are whole)
        assert got["logits_max_abs_diff"] <= 2e-5  # fp32 rounding, as at tp = 1 (test_megatron_backend.py)
        assert got["grad_max_rel_diff"] <= 2e-5 and got["pad_positions"] == 2
        assert got["weights_names_are_the_engine_names"] and got["weights_bit_exact"]


def test_a_tp_that_splits_a_query_group_is_refused(tmp_path: Path) -> None:
    write_checkpoint("qwen2-tied-hd32", tmp_path)  # one key/value head
    with pytest.raises(ValueError, match="tensor parallel 2 does not divide num_key_value_heads 1"):
        check_split(read_config(tmp_path), 2)
