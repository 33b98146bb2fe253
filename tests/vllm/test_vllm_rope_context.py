"""A llama3 or yarn scaling without original_max_position_embeddings, as vLLM 0.32 reads it: the pretraining context
its rotary embedding is built with (transformers' `standardize_rope_params`, which vLLM calls) and the max_model_len it
derives (vllm/config/model.py `_get_and_verify_max_len`) are max_position_embeddings, as rlctl reads the file
(`rope.resolved`, `TinyGPTConfig.max_positions`)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from rlctl.models import rope
from rlctl.models.hf import read_config
from tests.unit.rope_checkpoints import LINEAR, LLAMA3, YARN, llama


@pytest.mark.parametrize(
    ("entry", "qwen2"),
    [({k: v for k, v in LLAMA3.items() if k[0] != "o"}, False), ({"rope_type": "yarn", "factor": 4.0}, True)],
    ids=["llama3", "yarn-qwen2"],
)
def test_vllm_takes_max_position_embeddings_as_rlctl_does(entry: dict[str, Any], qwen2: bool, tmp_path: Path) -> None:
    import transformers
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.config import patch_rope_parameters

    llama(entry, tmp_path, legacy=True, qwen2=qwen2, positions=64)  # (rope_scaling without the key, as given)
    assert "original_max_position_embeddings" not in json.loads((tmp_path / "config.json").read_text())["rope_scaling"]
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    patch_rope_parameters(hf)
    arch = types.SimpleNamespace(derived_max_model_len_and_key=(hf.max_position_embeddings, "max_position_embeddings"))
    c = read_config(tmp_path)
    resolved = rope.resolved(c.rope_scaling, c.max_position_embeddings)
    assert resolved is not None and c.rope_scaling is not None
    assert c.rope_scaling.original_max_position_embeddings is None  # (as config.json says it)
    assert hf.rope_parameters["original_max_position_embeddings"] == resolved.original_max_position_embeddings == 64
    assert _get_and_verify_max_len(hf, arch, None, None, False, None) == c.max_positions == 64


@pytest.mark.parametrize(
    ("entry", "qwen2"),
    [(LINEAR, False), (YARN, True), (LLAMA3, False), (None, False)],
    ids=["linear", "yarn-qwen2", "llama3", "none"],
)
def test_vllms_derived_max_model_len_is_rlctls_context(
    entry: dict[str, Any] | None, qwen2: bool, tmp_path: Path
) -> None:
    """vLLM multiplies a linear scaling's max_position_embeddings alone: yarn's original_max_position_embeddings ×
    factor (32 × 4 = 128 here, 64 positions) was rlctl's context, a max_model_len vLLM 0.32 refuses to start with."""
    import transformers
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.config import patch_rope_parameters

    llama(entry, tmp_path, legacy=True, qwen2=qwen2, positions=64)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    patch_rope_parameters(hf)
    arch = types.SimpleNamespace(derived_max_model_len_and_key=(hf.max_position_embeddings, "max_position_embeddings"))
    context = read_config(tmp_path).max_positions
    assert _get_and_verify_max_len(hf, arch, None, None, False, None) == context == (256 if entry is LINEAR else 64)
    if entry is YARN:
        with pytest.raises(ValueError, match="max_model_len"):
            _get_and_verify_max_len(hf, arch, None, 128, False, None)
