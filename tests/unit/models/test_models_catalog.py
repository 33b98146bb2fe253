"""The built-in architectures `rlctl plan` prices by name: each one's parameter count is what its architecture's own
count (`TinyGPTConfig.num_params`, the one an HF directory's config.json gets) makes of its figures, so a plan by
name and a plan of the checkpoint directory price the same weights."""

from __future__ import annotations

import pytest

from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.models.hf import LLAMA, MISTRAL, PHI3, QWEN2, QWEN3, TinyGPTConfig

# the HF fields the figures leave out: architecture and tied embeddings (config.json's)
HF = {
    "qwen2.5-7b": (QWEN2, False),
    "qwen2.5-32b": (QWEN2, False),
    "qwen2.5-72b": (QWEN2, False),
    "qwen3-4b": (QWEN3, True),
    "qwen3-8b": (QWEN3, False),
    "qwen3-14b": (QWEN3, False),
    "qwen3-32b": (QWEN3, False),
    "llama3.1-8b": (LLAMA, False),
    "llama3.1-70b": (LLAMA, False),
    "mistral-7b": (MISTRAL, False),
    "mistral-nemo-12b": (MISTRAL, False),
    "phi4-14b": (PHI3, False),
}


@pytest.mark.parametrize("name", sorted(HF))
def test_a_built_in_architecture_counts_its_parameters_as_its_config_would(name: str) -> None:
    m = BUILTIN_MODELS[name]
    arch, tied = HF[name]
    config = TinyGPTConfig(
        vocab_size=m.vocab,
        hidden_size=m.hidden,
        intermediate_size=m.intermediate,
        num_hidden_layers=m.layers,
        num_attention_heads=m.heads,
        num_key_value_heads=m.kv_heads,
        tie_word_embeddings=tied,
        architecture=arch,
        explicit_head_dim=m.explicit_head_dim,
    )
    assert m.params == pytest.approx(config.num_params(), rel=2e-3), (m.params, config.num_params())


def test_every_built_in_but_the_demo_is_counted_above() -> None:
    assert set(BUILTIN_MODELS) - {"tiny-demo"} == set(HF)
