"""A Qwen3MoE's (and a Qwen2MoE's) load-balancing loss in the torch trainer's loss, where its config.json sets
output_router_logits: transformers' Qwen3MoeForCausalLM (Qwen2MoeForCausalLM) (CE + router_aux_loss_coef ×
load_balancing_loss_func over the attention mask's tokens) is the oracle for the value and the gradients (fp32,
≤ 1e-5), each `MOE` variant's own."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.models.moeloss import balanced, load_balancing_loss
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import Counts, loss_normaliser, policy_loss
from rlctl.rl.samples import Sample, TokenBatch, make_batch, token_logprobs
from tests.unit.hf_checkpoints import MOE, as_transformers_holds, write_checkpoint

transformers = pytest.importorskip("transformers")

COEF = 0.5  # (Qwen3MoeConfig's 0.001 would leave the term under the tolerance)


def samples() -> list[Sample]:
    """Rows of different prompt and output lengths: the grid pads all but the longest (one output empty)."""
    g = torch.Generator().manual_seed(3)
    shapes = [(5, 9), (9, 2), (3, 0), (4, 6)]
    out = []
    for i, (p, o) in enumerate(shapes):
        prompt, output = (torch.randint(4, 96, (n,), generator=g).tolist() for n in (p, o))
        out.append(Sample(f"p{i}", prompt, output, [0.0] * o, 1.0, 0))
    return out


def with_aux(directory: Path, *, on: bool = True) -> TinyGPT:
    """The checkpoint with output_router_logits `on` and router_aux_loss_coef COEF in its config.json."""
    path = directory / "config.json"
    path.write_text(
        json.dumps(json.loads(path.read_text()) | {"output_router_logits": on, "router_aux_loss_coef": COEF})
    )
    return TinyGPT.from_pretrained(directory)


def transformers_loss(ref: Any, batch: TokenBatch, *, aux: bool = True) -> Any:
    """Qwen3MoeForCausalLM's output with its loss over `batch` (its real tokens the attention mask): the CE of the
    output tokens (labels elsewhere -100), + COEF × aux where `aux`."""
    ref.config.output_router_logits, ref.router_aux_loss_coef = aux, COEF
    labels = torch.full_like(batch.tokens, -100)
    labels[:, 1:][batch.mask] = batch.tokens[:, 1:][batch.mask]
    assert batch.real is not None
    return ref(input_ids=batch.tokens, attention_mask=batch.real.long(), labels=labels)


@pytest.mark.parametrize("variant", list(MOE))
def test_the_policy_loss_gradients_with_the_load_balancing_term_equal_transformers(
    variant: str, tmp_path: Path
) -> None:
    """GRPO's loss on a padded batch (advantage 1, behaviour log-probs the policy's own: its gradient is the output
    tokens' CE's) with the term over every real token, prompt included, padding not (transformers' attention mask):
    each parameter's gradient, the router's included, is transformers' (loss = CE + coef × aux), versus the router's
    gradient without the term."""
    ref = write_checkpoint(variant, tmp_path)
    model = with_aux(tmp_path)
    moe = balanced(model)
    assert moe is not None and moe.router_aux_loss_coef == COEF
    batch = make_batch(samples(), [1.0] * 4)
    assert batch.real is not None and not batch.real.all()  # padded rows
    with torch.no_grad():
        batch.old_logprobs = token_logprobs(model, batch.tokens) * batch.mask
    loss, m = policy_loss(model, batch, 0.2)
    loss.backward()
    out = transformers_loss(ref, batch)
    out.loss.backward()
    assert m["router_aux_sum"] / batch.num_tokens == pytest.approx(out.aux_loss.item(), abs=1e-6)
    assert loss.item() + 1.0 == pytest.approx(COEF * out.aux_loss.item(), abs=1e-6)  # (the policy's term: −ratio, −1)
    grads = {name: p.grad for name, p in model.named_parameters()}
    ref_grads = dict(ref.named_parameters())
    for name, g in as_transformers_holds(grads, model.config).items():
        assert ref_grads[name].grad is not None, name
        torch.testing.assert_close(g, ref_grads[name].grad, atol=1e-5, rtol=1e-4)
    # the term is in those gradients: the router's without it differs by more than the tolerance
    ref.zero_grad()
    transformers_loss(ref, batch, aux=False).loss.backward()
    gate = next(n for n in ref_grads if n.endswith("mlp.gate.weight"))
    assert (ref_grads[gate].grad - as_transformers_holds(grads, model.config)[gate]).abs().max() > 1e-3


def test_the_term_counts_no_padding_and_is_transformers_own_without_any() -> None:
    """`load_balancing_loss` against load_balancing_loss_func on random router logits of 3 layers: with an attention
    mask, the padded rows' logits (whatever they are) change nothing; without padding, the unmasked call's value."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    g = torch.Generator().manual_seed(0)
    real = torch.arange(7)[None, :] < torch.tensor([[7], [4]])
    logits = tuple(torch.randn(14, 6, generator=g) for _ in range(3))
    want = load_balancing_loss_func(logits, 6, 2, real.long())
    got = load_balancing_loss(logits, real, num_experts=6, top_k=2)
    torch.testing.assert_close(got, want)
    noisy = tuple(torch.where(real.reshape(-1, 1), x, 50 * torch.randn(14, 6, generator=g)) for x in logits)
    torch.testing.assert_close(load_balancing_loss(noisy, real, num_experts=6, top_k=2), want)
    every = torch.ones_like(real)
    torch.testing.assert_close(
        load_balancing_loss(logits, every, num_experts=6, top_k=2), load_balancing_loss_func(logits, 6, 2)
    )


def test_without_output_router_logits_the_loss_has_no_term(tmp_path: Path) -> None:
    """Qwen3MoeConfig's default (output_router_logits false): the policy's loss alone, no router_aux figure."""
    write_checkpoint("qwen3moe-dense1-hd32", tmp_path)
    model = with_aux(tmp_path, on=False)
    assert balanced(model) is None
    batch = make_batch(samples(), [1.0] * 4)
    _, m = policy_loss(model, batch, 0.2)
    assert m["router_aux_sum"] == 0.0 == m["aux_loss_sum"]


def test_the_term_through_recomputed_layers_has_the_same_gradients(tmp_path: Path) -> None:
    """Activation checkpointing (the GPU trainer's): each layer recomputed in backward, its router logits an output
    of the recomputed layer, gives the gradients of the pass that keeps its activations."""
    write_checkpoint("qwen3moe-step2-norm-tied", tmp_path)
    grads = []
    for recompute in (False, True):
        model = with_aux(tmp_path).train()
        model.activation_checkpointing = recompute
        batch = make_batch(samples(), [1.0, -1.0, 0.5, 2.0])
        policy_loss(model, batch, 0.2)[0].backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-6, rtol=1e-5)


def test_under_constant_aggregation_the_term_is_scaled_by_the_batch_s_fill_ratio(tmp_path: Path) -> None:
    """`loss_aggregation: constant` divides by samples × max_output_tokens, so a pass's share of the load-balancing
    term (Σ w_t / N) sums over the batch to its fill ratio, trained output tokens ÷ (samples × max_output_tokens), not
    1 as under token_mean: the loss adds coef × aux × that ratio (rlctl.rl.grpo's module doc; the math unchanged)."""
    write_checkpoint("qwen3moe-dense1-hd32", tmp_path)
    model = with_aux(tmp_path)
    batch = make_batch(samples(), [0.0] * 4)  # advantage 0, no reference: the loss is the load-balancing term alone
    with torch.no_grad():
        batch.old_logprobs = token_logprobs(model, batch.tokens) * batch.mask
    most = 20
    n = loss_normaliser("constant", Counts.of(samples()), max_output_tokens=most)
    assert n == 4 * most
    loss, m = policy_loss(model, batch, 0.2, aggregation="constant", normaliser=n)
    whole, _ = policy_loss(model, batch, 0.2)  # token_mean: the shares sum to 1
    aux = whole.item() / COEF
    fill = batch.num_tokens / n  # 17 of 80
    assert fill == pytest.approx(17 / 80)
    assert loss.item() == pytest.approx(COEF * aux * fill, rel=1e-5)
    assert m["router_aux_sum"] / n == pytest.approx(aux * fill, rel=1e-5)  # `router_aux_loss`, as the learner reports
