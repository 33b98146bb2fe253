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


# Qwen3-30B-A3B's and Qwen3-235B-A22B's published config.json (the keys their figures and Qwen3MoeConfig's defaults
# do not give)
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 48,
                 "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                 "intermediate_size": 6144, "tie_word_embeddings": False, "max_position_embeddings": 40960,
                 "rope_theta": 1000000.0, "norm_topk_prob": True, "torch_dtype": "bfloat16"}  # fmt: skip
QWEN3_235B_A22B = {**QWEN3_30B_A3B, "num_hidden_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
                   "moe_intermediate_size": 1536, "intermediate_size": 12288}  # fmt: skip
MOES = {"qwen3-30b-a3b": (QWEN3_30B_A3B, 30_532_122_624, 3_353_032_704),
        "qwen3-235b-a22b": (QWEN3_235B_A22B, 235_093_634_560, 22_190_763_520)}  # fmt: skip


@pytest.mark.parametrize("name", list(MOES))
def test_a_qwen3_moe_counts_transformers_parameters_and_its_active_ones(name: str) -> None:
    """Memory holds every expert (transformers' count on the meta device), a token computes with its router and 8 of
    128 experts in each layer: 3.35e9 of 30.5e9 (the 'A3B'), 22.2e9 of 235.1e9 (the 'A22B'); an HF directory of that
    config.json says the same."""
    transformers = pytest.importorskip("transformers")
    import torch

    config, params, active = MOES[name]
    m = BUILTIN_MODELS[name]
    with torch.device("meta"):
        own = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**config))
    assert m.params == sum(p.numel() for p in own.parameters()) == params
    layers, hidden, width = config["num_hidden_layers"], config["hidden_size"], config["moe_intermediate_size"]
    unused_experts = layers * (128 - 8) * 3 * hidden * width  # each layer's 120 experts a token does not choose
    assert m.active == m.active_params == m.params - unused_experts == active
    arch = TinyGPTConfig.from_hf(config).arch(name)
    assert arch == m and arch.max_positions == m.max_positions


# Qwen1.5-MoE-A2.7B's and Qwen2-57B-A14B's published config.json (base models; the keys their figures do not give)
QWEN15_MOE_A27B = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_hidden_layers": 24,
                   "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
                   "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                   "shared_expert_intermediate_size": 5632, "intermediate_size": 5632, "tie_word_embeddings": False,
                   "max_position_embeddings": 8192, "rope_theta": 1000000.0, "norm_topk_prob": False,
                   "torch_dtype": "bfloat16"}  # fmt: skip
QWEN2_57B_A14B = {**QWEN15_MOE_A27B, "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
                  "num_key_value_heads": 4, "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 2560,
                  "shared_expert_intermediate_size": 20480, "intermediate_size": 18944,
                  "max_position_embeddings": 131072}  # fmt: skip
QWEN2_MOES = {"qwen1.5-moe-a2.7b": (QWEN15_MOE_A27B, 14_315_784_192, 2_689_173_504),
              "qwen2-57b-a14b": (QWEN2_57B_A14B, 57_408_658_944, 14_249_270_784)}  # fmt: skip


@pytest.mark.parametrize("name", list(QWEN2_MOES))
def test_a_qwen2_moe_counts_transformers_parameters_and_its_shared_expert_as_active(name: str) -> None:
    """Memory holds every expert (transformers' count on the meta device: 14.3e9, 57.4e9); a token computes with its
    router, its top 4 of 60 (8 of 64) experts and the shared expert and its gate in each layer: 2.69e9 (the 'A2.7B'),
    14.25e9 (the 'A14B'), versus the shared expert left out of the active ones (1.86e9, 8.08e9). An HF directory of
    that config.json says the same."""
    transformers = pytest.importorskip("transformers")
    import torch

    config, params, active = QWEN2_MOES[name]
    m = BUILTIN_MODELS[name]
    with torch.device("meta"):
        own = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**config))
    assert m.params == sum(p.numel() for p in own.parameters()) == params
    layers, hidden, width = config["num_hidden_layers"], config["hidden_size"], config["moe_intermediate_size"]
    unused = config["num_experts"] - config["num_experts_per_tok"]
    assert m.active == m.active_params == m.params - layers * unused * 3 * hidden * width == active
    shared = sum(p.numel() for n, p in own.named_parameters() if "shared_expert" in n)
    assert shared == layers * (3 * hidden * config["shared_expert_intermediate_size"] + hidden)
    arch = TinyGPTConfig.from_hf(config).arch(name)
    assert arch == m and arch.max_positions == m.max_positions


def test_every_built_in_but_the_demo_is_counted_above() -> None:
    assert set(BUILTIN_MODELS) - {"tiny-demo", *MOES, *QWEN2_MOES} == set(HF)
