"""tests/gpu: the same code paths as CI runs on the CPU, on a CUDA device (`make gpu-check` runs them on a lent
GPU machine). Every test here carries the `gpu` marker and is skipped where torch sees no CUDA device."""

from pathlib import Path

import pytest
import torch

from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

CFG = TinyGPTConfig(  # a small Qwen2 shape: grouped-query attention, tied embeddings, bf16 in the file
    architecture="Qwen2ForCausalLM",
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=512,
    rope_fp64_angles=False,
)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    TinyGPT(CFG).save_pretrained(d, dtype=torch.bfloat16)
    return d


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="no CUDA device (tests/gpu runs on a GPU machine: make gpu-check)")
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
