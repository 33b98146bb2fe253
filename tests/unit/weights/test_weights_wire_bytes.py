"""What crosses the wire is what the planner prices: the checkpoint's dtype, a tied embedding once."""

from pathlib import Path

import pytest
import torch

from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.trainers.base import load_backend, wire_weights
from rlctl.weights import chunks

QWEN2 = TinyGPTConfig(  # every tensor a multiple of the layout's 64-byte alignment: no padding to account for
    architecture="Qwen2ForCausalLM",
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    explicit_head_dim=32,
    tie_word_embeddings=True,
    max_position_embeddings=64,
)


@pytest.mark.parametrize(("dtype", "tied"), [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)])
def test_a_published_version_is_the_planners_weight_bytes(tmp_path: Path, dtype: torch.dtype, tied: bool) -> None:
    cfg = TinyGPTConfig(**{**QWEN2.__dict__, "tie_word_embeddings": tied})
    torch.manual_seed(0)
    TinyGPT(cfg).save_pretrained(tmp_path, dtype=dtype)
    planned = check_hf_dir(tmp_path).arch.weight_bytes  # what `rlctl plan` prices a weight sync with
    backend = load_backend("torch", tmp_path)  # fp32 master weights
    assert all(p.dtype == torch.float32 for p in backend.model.parameters())
    sent = wire_weights(backend.weights(), dtype=dtype, tied=tied)
    layout = chunks.layout_of(sent)
    assert layout.total_bytes == sum(s.nbytes for s in layout.slots) == planned
    assert ("lm_head.weight" in sent) is not tied and {t.dtype for t in sent.values()} == {dtype}
    # a rollout unit (fp32 on a CPU) takes the version as it came
    engine = EmbeddedEngine(TinyGPT.from_pretrained(tmp_path), max_batch_size=2)
    engine.load_weights(chunks.unflatten(chunks.flatten(sent, layout), layout), 1)
    for name, t in engine.model.hf_weights().items():
        assert torch.equal(t, backend.model.state_dict()[name].to(dtype).float()), name


def test_a_snapshot_is_not_the_parameters(tmp_path: Path) -> None:
    torch.manual_seed(0)
    TinyGPT(QWEN2).save_pretrained(tmp_path, dtype=torch.float32)
    backend = load_backend("torch", tmp_path)
    sent = wire_weights(backend.weights(), dtype=torch.float32, tied=True)
    with torch.no_grad():
        backend.model.model.norm.weight.add_(1.0)  # the next optimizer step
    assert not torch.equal(sent["model.norm.weight"], backend.model.model.norm.weight)
