"""A megatron-core GPTModel built from an HF Llama/Qwen2/Qwen3/Mistral/Phi3 config, and the policy module the learner
trains.

    TinyGPTConfig (config.json) ─▶ transformer_config ─▶ GPTModel(local layer spec, use_cpu_initialization)
                                                              ▲ load_hf: names.to_megatron(this tp rank)
    MegatronPolicy(tokens [B, T]) ─▶ logits [B, T, V] fp32     │ export_hf: names.to_hf (this rank's shard)
    MegatronTrunk.hidden(tokens)  ─▶ hidden [B, T, H] fp32     (PPO's critic body: the same GPTModel, no output layer)

The config maps one to one: RMSNorm(eps), SwiGLU (`gated_linear_unit`, SiLU, fc1 = gate ‖ up), RoPE with
the checkpoint's θ over the whole head (`kv_channels` = head_dim, explicit or hidden/heads) or a Phi3's first
partial_rotary_factor of it (`rotary_percent`), and its linear, Llama 3.1 or yarn scaling (`rope.py`: megatron fixes
llama3's bands at Llama 3.1's; longrope and others refused), grouped-query
attention (`num_query_groups` = num_key_value_heads), q/k/v bias (`add_qkv_bias`: Qwen2, Llama/Qwen3
`attention_bias`), Qwen3's per-head q/k RMSNorm before RoPE (`qk_layernorm`: the local spec's q_layernorm and
k_layernorm over head_dim, eps rms_norm_eps), no other linear bias except o_proj's under `attention_bias` (megatron's
`add_bias_linear` would also put one on the MLP: a bias-forcing RowParallelLinear is put in the spec's
`linear_proj` instead), tied embeddings (`share_embeddings_and_output_weights`), the pad token's embedding row given
no gradient by the positions that hold it (transformers' `padding_idx`: `_no_gradient_at_pad`). The core attention is
torch's SDPA (`attention.py`: transformers' default kernel, so the logits match it bit for bit, and no
O(s²) score matrix) in place of megatron's local DotProductAttention. Every dropout is 0 and
every fusion off: the local spec in fp32, as the CPU runs it (`cpu.py` for what that needs). RoPE angles are
fp32, as in transformers; the built-in demo model's fp64 angles (`rlctl_rope_fp64_angles`) are not
reproduced (its logits move by ~2e-5 at position 100).

The GPTModel needs megatron's parallel state (`init_parallel`): tensor/pipeline-parallel groups over the
already-initialised torch.distributed group. Logits are gathered over the tp ranks (`parallel_output=False`),
so every rank computes the same token log-probs and the loss code is the torch backend's. At pp > 1 each rank
builds its stage's part of the GPTModel (`pre_process` on the first stage, `post_process` on the last) and
`pipeline.py` chains the stages inside `forward`, so that every rank of the pipeline still returns the full
logits (the call's rows in chunks that overlap across the stages, GPipe within the call; not megatron's 1F1B:
see there).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlctl.models.hf import TinyGPTConfig, window_refusal
from rlctl.models.hfnames import expected_shapes
from rlctl.models.tensors import check_fit, check_tied, shapes_of
from rlctl.trainers.megatron import cpu, names, pipeline
from rlctl.trainers.megatron.rope import moe_refusal, rope_args, yarn_config

INSTALL_HINT = "pip install 'rlctl[megatron]' (megatron-core==0.16.1)"


def import_megatron() -> Any:
    """megatron.core, imported quietly (it warns at import that Transformer Engine and Apex are missing,
    which is the point of the local spec); ImportError with the install hint when it is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core
            import megatron.core.models.gpt
            import megatron.core.models.gpt.gpt_layer_specs
            import megatron.core.parallel_state
    except ImportError as e:
        raise ImportError(f"trainer backend 'megatron' needs megatron-core: {INSTALL_HINT} ({e})") from e
    return megatron.core


def init_parallel(*, tp: int = 1, pp: int = 1) -> None:
    """Megatron's tp/pp/dp groups over the current torch.distributed group (dp = world ÷ (tp·pp)); once."""
    import torch.distributed as dist

    mcore = import_megatron()
    ps = mcore.parallel_state
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size())
        if have != (tp, pp):
            raise ValueError(f"megatron parallel state is tp {have[0]} pp {have[1]}, not tp {tp} pp {pp}")
        return
    if not dist.is_initialized():
        raise ValueError("megatron-core needs a torch.distributed group: initialise one first (gloo on CPU)")
    with cpu.on_cpu():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    cpu.install_rng_tracker()


def transformer_config(c: TinyGPTConfig, *, tp: int = 1, pp: int = 1, initialise: bool = True) -> Any:
    """megatron-core's TransformerConfig for an HF config (fp32, local modules, no dropout, no fusion); `initialise`
    False: its layers allocate their tensors and run no init method (`perform_initialization`)."""
    names.check_split(c, tp, pp)
    moe_refusal(c)
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        ffn_hidden_size=c.intermediate_size,
        num_attention_heads=c.num_attention_heads,
        num_query_groups=c.num_key_value_heads,
        kv_channels=c.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=c.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=c.qkv_bias,
        qk_layernorm=c.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,  # of the hidden states between stages (pipeline.py)
        use_cpu_initialization=True,
        perform_initialization=initialise,
        params_dtype=torch.float32,
        init_method_std=c.initializer_range,
        cuda_graph_scope=[],  # none (the default, "full", warns that it is deprecated)
    )
    for name, value in yarn_config(c).items():  # (read with getattr: no field of TransformerConfig)
        setattr(config, name, value)
    return config


def layer_spec(c: TinyGPTConfig) -> Any:
    """The local (non-Transformer-Engine) GPT layer spec with RMSNorm (of q and k per head too, for Qwen3) and SDPA
    core attention; o_proj gets its bias under `attention_bias`."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from rlctl.trainers.megatron.attention import sdpa_attention

    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=c.qk_norm)
    spec.submodules.self_attention.submodules.core_attention = sdpa_attention()
    if c.attention_bias:
        spec.submodules.self_attention.submodules.linear_proj = _biased_row_parallel_linear()
    return spec


def _biased_row_parallel_linear() -> type:
    from megatron.core.tensor_parallel import RowParallelLinear

    class BiasedRowParallelLinear(RowParallelLinear):
        """RowParallelLinear with a bias whatever `add_bias_linear` says (HF Llama's o_proj bias)."""

        def __init__(self, *args: Any, bias: bool, **kw: Any) -> None:
            del bias
            super().__init__(*args, bias=True, **kw)

    return BiasedRowParallelLinear


class StagedGPT(nn.Module):
    """This rank's stage (and tp part) of a GPTModel built from an HF config, run on tokens [B, T]: what the
    policy and the critic's trunk share. Build it after `init_parallel`. At pp > 1 a call is a collective over the
    pipeline (`pipeline.forward`): every rank of it calls the model, and `backward` on the result, in the same
    order.

    `initialise` False where every tensor is written next (`load_hf`, `copy_from`: the agents' only builds): the
    layers allocate their tensors and leave them as allocated until then, versus megatron drawing each on the CPU
    for the load to overwrite (the whole tensor at any tp, then this rank's part copied out): a start of 272 MiB of
    fp32 weights took 0.61 s, now 0.19 s; ≈ 6 ns a parameter on one thread, ≈ 7 min of every 70B rank's start.
    Megatron sets a weight's tensor-parallel attributes as it draws it; `_mark_tensor_parallel` sets them without."""

    logits = True  # the output layer (the policy) or the final normed hidden states (a critic's trunk)

    def __init__(
        self,
        c: TinyGPTConfig,
        *,
        tp: int = 1,
        pp: int = 1,
        device: torch.device | None = None,
        autocast_dtype: torch.dtype | None = None,
        initialise: bool = True,
    ) -> None:
        super().__init__()
        ps = import_megatron().parallel_state
        from megatron.core.models.gpt import GPTModel

        self.config, self.tp = c, tp
        # fp32 parameters (the optimizer's master weights) on `device`; the passes compute in `autocast_dtype`
        # there (bf16 on a GPU, as the torch backend: None, fp32, on a CPU)
        self.device = torch.device("cpu") if device is None else device
        self.autocast_dtype = autocast_dtype
        self.stage = names.Stage(ps.get_pipeline_model_parallel_rank() if pp > 1 else 0, pp)
        with cpu.on_cpu(self.device):
            self.gpt = GPTModel(
                config=transformer_config(c, tp=tp, pp=pp, initialise=initialise),
                transformer_layer_spec=layer_spec(c),
                vocab_size=c.vocab_size,
                max_sequence_length=c.max_positions,
                pre_process=self.stage.first,
                post_process=self.stage.last,
                parallel_output=False,
                # the trunk has no output layer, so no copy of the embedding on the last stage to keep in step
                share_embeddings_and_output_weights=c.tie_word_embeddings and self.logits,
                rotary_base=c.rope_theta,  # annotated int; a float θ (1e6, 5e5) is used as is
                **rope_args(c),  # RoPE (on part of each head), scaled linear, as Llama 3.1 or yarn (rope.py)
            )
        if not initialise:
            _mark_tensor_parallel(self.gpt)
        if self.stage.first and c.pad_token_id is not None:
            embedding = self.gpt.embedding.word_embeddings
            embedding.register_forward_hook(functools.partial(_no_gradient_at_pad, pad=c.pad_token_id))
        if not self.logits and self.stage.last:
            self.gpt.output_layer = _HiddenOut()
        self.gpt.to(self.device)  # built in host memory (`use_cpu_initialization`), then moved once

    def _run(self, tokens: torch.Tensor, *, width: int) -> torch.Tensor:
        """The last stage's output [B, T, width] (fp32) on every rank of the pipeline."""
        b, t = tokens.shape
        if t > self.config.max_positions:  # (max_position_embeddings, × a linear scaling's factor)
            raise ValueError(f"sequence of {t} tokens > the model's max_positions {self.config.max_positions}")
        if (why := window_refusal(self.config, t)) is not None:  # (its attention attends to every earlier position)
            raise ValueError(f"sliding_window {why}")
        positions = torch.arange(t, device=tokens.device).expand(b, t)
        # no mask: the SDPA core attention is causal by its layer's mask type (attention.py), so the [T, T]
        # mask megatron's local attention would read (400 MB of bools at 20K tokens) is not built
        if self.stage.count > 1:
            return pipeline.forward(
                self.gpt, self.stage, tokens, positions, hidden=self.config.hidden_size, width=width
            )
        on = self.autocast_dtype is not None
        with cpu.on_cpu(tokens.device), torch.autocast(tokens.device.type, dtype=self.autocast_dtype, enabled=on):
            out: torch.Tensor = self.gpt(tokens, positions, None)
        return out.float()

    def megatron_state(self) -> dict[str, torch.Tensor]:
        """This rank's GPTModel tensors (no `_extra_state` entries)."""
        return {k: v for k, v in self.gpt.state_dict().items() if not k.endswith("_extra_state")}

    def _to_write(self) -> dict[str, torch.Tensor]:
        """`megatron_state`, what a load writes, holding every parameter and buffer of the GPTModel but the RoPE
        tables YarnRotaryEmbedding computes as it is built (its cos and sin, from the config): none of a model built
        without init (`initialise` False) is left as allocated."""
        state = self.megatron_state()
        held = {n for n, _ in self.gpt.named_parameters()} | {n for n, _ in self.gpt.named_buffers()}
        held -= {n for n, _ in self.gpt.named_buffers() if n.startswith("rotary_pos_emb.")}
        assert held <= set(state), f"not in the state a load writes: {sorted(held - set(state))}"
        return state


def _no_gradient_at_pad(
    module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor, *, pad: int
) -> torch.Tensor:
    """The embedding's output with the positions of token `pad` cut from the graph: its row gets no gradient from
    them, as transformers' `nn.Embedding(padding_idx=pad_token_id)` gives none (megatron's VocabParallelEmbedding
    has no padding_idx). The output, not the weight's gradient: a tied output layer's gradient reaches the row."""
    del module
    return torch.where((args[0] == pad).unsqueeze(-1), out.detach(), out)


def _mark_tensor_parallel(gpt: nn.Module) -> None:
    """The attributes megatron gives each tp-split weight as it initialises it (`tensor_model_parallel`, read by
    `MegatronBackend.clip_grad_norm_`; `partition_dim`, `partition_stride`), given to a GPTModel built without:
    the vocabulary's rows, a column-parallel linear's output rows (fc1's in two interleaved halves, gate and up:
    stride 2, `mlp.py`), a row-parallel linear's input columns."""
    from megatron.core import tensor_parallel as mtp

    for name, m in gpt.named_modules():
        if isinstance(m, mtp.VocabParallelEmbedding):
            dim, stride = 0, 1
        elif isinstance(m, mtp.ColumnParallelLinear):
            dim, stride = 0, 2 if name.endswith("mlp.linear_fc1") else 1
        elif isinstance(m, mtp.RowParallelLinear):
            dim, stride = 1, 1
        else:
            continue
        if m.weight is not None:  # (a tied output layer's is the embedding's, passed in)
            mtp.set_tensor_model_parallel_attributes(m.weight, is_parallel=True, dim=dim, stride=stride)


class MegatronPolicy(StagedGPT):
    """A GPTModel that takes and returns what TinyGPT does: tokens [B, T] → fp32 logits [B, T, V] (causal;
    right padding is harmless)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._run(tokens, width=self.config.vocab_size)

    @torch.no_grad()
    def load_hf(
        self, hf: Mapping[str, torch.Tensor], *, rank: int = 0, checked: dict[str, tuple[int, ...]] | None = None
    ) -> None:
        """Copy full HF tensors (a checkpoint of this config) into this tp rank's parameters of its stage, one
        parameter at a time: what it holds beyond them is the whole HF tensors of one parameter (q, k and v of a
        fused qkv) and its part, where `hf` reads each as it is asked for (`rlctl.models.tensors`). Checked against
        this config first, nothing read (`check_fit`: every stage's HF names and full shapes, which the name table
        cuts into this rank's, and a tied lm_head may be there if it is the embedding: `check_tied`): DoesNotFit
        with nothing written, versus a KeyError (a missing tensor) or the copy's RuntimeError (another shape) with
        the parameters before it written, and an unexpected tensor ignored. `checked`: what `check_hf` returned
        for these `hf`, which are not checked again (a resume at another tp × pp checks them before it reads the old
        shards: `rlctl.checkpoint.trainer._load_resplit`)."""
        c, params = self.config, self._to_write()
        shapes = self.check_hf(hf) if checked is None else checked
        meta = {k: torch.empty(shape, device="meta") for k, shape in shapes.items()}
        table = names.to_megatron(meta, c, tp=self.tp, rank=rank, stage=self.stage)
        cut, own = {k: tuple(t.shape) for k, t in table.items()}, {k: tuple(p.shape) for k, p in params.items()}
        if cut != own:  # (the table cuts the shapes checked into this rank's parts: the GPTModel's, or a bug)
            raise AssertionError(
                f"name table and GPTModel disagree: {sorted(k for k in cut | own if cut.get(k) != own.get(k))}"
            )
        for k, p in params.items():
            p.copy_(names.to_megatron(hf, c, tp=self.tp, rank=rank, stage=self.stage, only={k})[k])

    def check_hf(self, hf: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
        """DoesNotFit unless full HF tensors `hf` are a checkpoint of this config (`check_fit`: every stage's HF
        names and full shapes, from the files' headers; a tied lm_head, if there, must be the embedding:
        `check_tied`), nothing written; what `load_hf` checks first, and a resume at another tp × pp before it
        reads the old optimizer shards (`rlctl.checkpoint.trainer._load_resplit`). Returns the full shapes."""
        shapes = expected_shapes(self.config)
        tied = {"lm_head.weight": shapes["model.embed_tokens.weight"]} if self.config.tie_word_embeddings else {}
        check_fit(shapes | tied, shapes_of(hf), optional=tied)
        if tied:
            check_tied(hf)
        return shapes

    def export_hf(self) -> dict[str, torch.Tensor]:
        """This rank's HF-layout shard of its stage's tensors (the full checkpoint when tp = pp = 1), HF names,
        no lm_head when tied."""
        return names.to_hf(self.megatron_state(), self.config, tp=self.tp, stage=self.stage)


class MegatronTrunk(StagedGPT):
    """The policy's GPTModel without its output layer, as TinyGPT.hidden: tokens [B, T] → the final normed hidden
    states [B, T, hidden] (fp32) on every rank; the body of a PPO critic (`rlctl.rl.ppo.ValueModel`). Tied
    embeddings are the input embedding alone here (no copy on the last stage)."""

    logits = False

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._run(tokens, width=self.config.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.hidden(tokens)

    @torch.no_grad()
    def copy_from(self, policy: MegatronPolicy) -> None:
        """This rank's shard of `policy`'s trunk (every tensor but the output layer's), copied."""
        mine, theirs = self._to_write(), policy.megatron_state()
        for k, v in mine.items():
            v.copy_(theirs[k])


class _HiddenOut(nn.Module):
    """A trunk's stand-in for GPTModel's output layer: the final normed hidden states pass through (GPTModel then
    returns them batch-first, as it would the logits)."""

    def forward(
        self, hidden_states: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: Any = None
    ) -> tuple[torch.Tensor, None]:
        del weight, runtime_gather_output
        return hidden_states, None
