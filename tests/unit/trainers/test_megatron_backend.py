"""The `megatron` trainer backend on tiny HF checkpoints (Qwen2 and Llama variants), one gloo rank on CPU:
HF → GPTModel → HF bit for bit, logits against transformers, gradients and one GRPO step against the
`torch` backend, and its published weights pushed into the embedded engine."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.agents.weights import Target, WeightPublisher, fetch_weights, state_dict_of, weight_node
from rlctl.config.job import GrpoAlgorithm, WeightSync
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.engines.hf import load_state_dict
from rlctl.engines.model import TinyGPT
from rlctl.rl.grpo import GrpoLearner
from rlctl.rl.samples import Sample, score, token_logprobs
from rlctl.trainers.base import load_backend
from rlctl.trainers.megatron import names
from rlctl.trainers.native import TorchBackend
from rlctl.transport import InprocTransport
from tests.unit.hf_checkpoints import VARIANTS, write_checkpoint

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("megatron_rank")

# Megatron's local attention (baddbmm, masked softmax) and the SDPA of transformers and the embedded model
# round differently in fp32: over 100 tokens their logits (|logit| ≤ ~7) differ by up to 1.4e-5, while
# transformers' own fp32 logits are up to 1.9e-5 from its fp64 ones (`test_logits_equal_transformers`).
FP32_ATOL = 2e-5
# The bar, against transformers run with megatron's attention kernel order (`GEMM_SCALED`).
PARITY_ATOL = 1e-5
GEMM_SCALED = "rlctl_gemm_scaled_eager"


def _gemm_scaled_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention (materialised scores, additive mask, softmax, probs @ v) with the
    1/√d scale applied inside the score GEMM (`baddbmm(alpha=…)`) as megatron's DotProductAttention does,
    instead of on the rounded scores after it: the one rounding in which the two eager kernels differ."""
    from transformers.models.llama.modeling_llama import repeat_kv

    del dropout, kwargs
    groups = int(module.num_key_value_groups)
    k, v = repeat_kv(key, groups), repeat_kv(value, groups)
    b, h, s, d = query.shape
    q3, k3 = query.reshape(b * h, s, d), k.reshape(b * h, -1, d).transpose(1, 2)
    scores = torch.baddbmm(q3.new_empty(b * h, s, k3.shape[2]), q3, k3, beta=0.0, alpha=scaling).view(b, h, s, -1)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).transpose(1, 2).contiguous(), probs


def _register_gemm_scaled() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(GEMM_SCALED, _gemm_scaled_attention)
    AttentionMaskInterface.register(GEMM_SCALED, eager_mask)  # the additive float mask eager attention takes


_register_gemm_scaled()


@pytest.fixture(params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def tokens(batch: int, length: int, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_hf_to_megatron_to_hf_is_bit_exact(variant: str, tmp_path: Path) -> None:
    write_checkpoint(variant, tmp_path / "in")
    backend = load_backend("megatron", tmp_path / "in")
    out = backend.save_pretrained(tmp_path / "out", tokenizer_from=tmp_path / "in")
    sd, back = load_state_dict(tmp_path / "in"), load_state_dict(out)
    assert sorted(back) == sorted(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    assert (out / "tokenizer.json").exists()
    # the weight plane's names are the embedded model's (a tied lm_head listed too)
    assert list(backend.weights()) == list(TinyGPT.from_pretrained(out).state_dict())


def test_logits_equal_transformers(variant: str, tmp_path: Path) -> None:
    """Within 1e-5 of transformers' eager model with megatron's kernel order (measured: 0, bit for bit: every
    other op, RoPE's fp32 angles included, rounds as transformers does); within fp32 rounding (FP32_ATOL) of
    its default SDPA and eager kernels, and no further from transformers' fp64 logits than its fp32 ones are."""
    ref = write_checkpoint(variant, tmp_path)
    model = load_backend("megatron", tmp_path).model.eval()
    x = tokens(3, 100)
    with torch.no_grad():
        got, want = model(x), ref(input_ids=x).logits
        exact = copy.deepcopy(ref).double()(input_ids=x).logits
        ref.set_attn_implementation("eager")
        eager = ref(input_ids=x).logits
        ref.set_attn_implementation(GEMM_SCALED)
        same_order = ref(input_ids=x).logits
    torch.testing.assert_close(got, same_order, atol=PARITY_ATOL, rtol=0)
    torch.testing.assert_close(same_order, eager, atol=FP32_ATOL, rtol=0)  # the oracle's kernel is eager's
    torch.testing.assert_close(got, eager, atol=FP32_ATOL, rtol=0)
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=0)
    assert (got.double() - exact).abs().max() <= 1.5 * (want.double() - exact).abs().max()
    with torch.no_grad():  # and the embedded engine's model, the `torch` backend
        torch.testing.assert_close(got, TinyGPT.from_pretrained(tmp_path)(x), atol=FP32_ATOL, rtol=0)


def test_gradients_equal_the_torch_backend(variant: str, tmp_path: Path) -> None:
    write_checkpoint(variant, tmp_path)
    mg, ref = load_backend("megatron", tmp_path), TinyGPT.from_pretrained(tmp_path)
    x = tokens(2, 24, seed=1)
    token_logprobs(mg.model, x).sum().backward()
    token_logprobs(ref, x).sum().backward()
    config = ref.config
    grads = names.to_hf({k: p.grad for k, p in mg.model.gpt.named_parameters() if p.grad is not None}, config)
    for name, p in ref.named_parameters():  # tied: one parameter, under the embedding's name
        assert p.grad is not None
        assert (grads[name] - p.grad).abs().max() <= 2e-5 * p.grad.abs().max(), name  # measured ≤ 4.1e-6


def rollouts(model: TinyGPT, *, prompts: int, group: int, seed: int) -> list[Sample]:
    """Groups of sampled-looking outputs with the sampling policy's log-probs (a little off-policy, so the
    clip is active) and rewards that differ within each group."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(prompts):
        prompt = torch.randint(3, 96, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        for i in range(group):
            n = int(torch.randint(2, 12, (1,), generator=g))
            output = torch.randint(3, 96, (n,), generator=g).tolist()
            out.append(Sample(f"p{p}", prompt, output, [0.0] * n, reward=float((i * 7 + p) % 3)))
    for s, lp in zip(out, score(model, out), strict=True):
        s.logprobs = [x + 0.1 * (i % 3 - 1) for i, x in enumerate(lp)]
    return out


def test_one_grpo_step_moves_the_weights_as_the_torch_backend_does(variant: str, tmp_path: Path) -> None:
    write_checkpoint(variant, tmp_path)
    torch_b, mg = TorchBackend.load(tmp_path), load_backend("megatron", tmp_path)
    samples = rollouts(torch_b.model, prompts=3, group=4, seed=0)
    before = torch_b.weights()
    before = {k: v.clone() for k, v in before.items()}
    cfg = GrpoAlgorithm(kind="grpo", lr=1e-3)
    stats = [
        GrpoLearner(b.model, cfg, micro_batch_samples=5).step(copy.deepcopy(samples))  # type: ignore[arg-type]
        for b in (torch_b, mg)
    ]
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"], abs=1e-6)
    assert stats[0]["grad_norm"] == pytest.approx(stats[1]["grad_norm"], rel=1e-5)
    want, got = torch_b.weights(), mg.weights()
    for k in want:  # the same update, up to the fp32 rounding of the gradients (measured ≤ 1e-3 of the step)
        step = (want[k] - before[k]).norm()
        assert step > 0, k
        # except k_proj.bias: its gradient is 0 in exact arithmetic (softmax ignores a shift shared by every
        # key), so AdamW's first step scales fp32 noise up on either backend (measured ≤ 1.6e-2 of the step)
        tolerance = 5e-2 if k.endswith("k_proj.bias") else 2e-3
        assert (got[k] - want[k]).norm() <= tolerance * step, k


def test_published_weights_reach_the_embedded_engine(tmp_path: Path) -> None:
    """After a GRPO step, the backend's weights go through the weight plane (publisher → a unit's weight node)
    into the embedded engine, whose logits are then the Megatron policy's."""
    write_checkpoint("qwen2-tied-hd32", tmp_path)
    mg = load_backend("megatron", tmp_path)
    engine = EmbeddedEngine.from_pretrained(tmp_path)
    samples = rollouts(engine.model, prompts=2, group=4, seed=1)
    GrpoLearner(mg.model, GrpoAlgorithm(kind="grpo", lr=1e-2), micro_batch_samples=8).step(samples)  # type: ignore[arg-type]

    transport, sync = InprocTransport(secret=b"k" * 16), WeightSync(mode="delta", chunk_bytes=4096)
    pub = WeightPublisher(transport, listen="inproc://", sync=sync, timeout_s=10)
    listener = transport.listen("inproc://")
    node = weight_node(transport, "inproc://", sync, timeout_s=10)
    got: list[tuple[int, dict[str, torch.Tensor]]] = []
    unit = threading.Thread(target=lambda: got.append(state_dict_of(fetch_weights(node, listener.accept(10).recv(10)))))
    unit.start()
    pub.set_targets({"rollout-0": Target(listener.address, node.address)})
    pub.publish(1, mg.weights())
    unit.join(timeout=30)
    pub.close()
    listener.close()
    node.close()
    ((version, sd),) = got
    engine.load_weights(sd, version)
    x = tokens(2, 40, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(engine.model(x), mg.model.eval()(x), atol=FP32_ATOL, rtol=0)
        assert not torch.allclose(engine.model(x), TinyGPT.from_pretrained(tmp_path)(x), atol=1e-3)  # it moved
