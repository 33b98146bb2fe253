"""An HF checkpoint's config.json of Llama, Qwen2, Qwen3, Qwen3MoE, Qwen2MoE, Mistral and Phi3 decoders:
`TinyGPTConfig`, validated from it (`read_config`, `TinyGPTConfig.from_hf`: anything the model would compute
differently is refused) and written back (`TinyGPTConfig.to_hf`). The directory's other files:
`rlctl.models.weightfiles` (the weight files), `rlctl.models.hfnames` (the tensors' names and shapes),
`rlctl.models.hfdir` (writing a directory, `check_hf_dir`).

Runs: LlamaForCausalLM (`attention_bias` puts a bias on q, k, v and o), Qwen2ForCausalLM (bias on q, k, v; none on o),
Qwen3ForCausalLM (per-head RMSNorm of q and k before RoPE, `q_norm`/`k_norm` [head_dim]; `attention_bias` as Llama's;
`head_dim` 128 where config.json leaves it out), MistralForCausalLM (Llama without biases: Mistral-7B-v0.3, Nemo, Small;
and v0.1, whose `sliding_window` 4096 is below its `max_position_embeddings` 32768: MistralModel attends to a position's
last `window` tokens only, which binds on no sequence of at most `window` tokens, so a job whose context is that short
runs it: `window_refusal`; `sliding_window` written back as read), Phi3ForCausalLM (Phi-3-mini/medium, Phi-4:
Mistral's, Phi-3-mini-4k's window 2047 as v0.1's, its file holding q/k/v as one `qkv_proj` and gate/up as one
`gate_up_proj`, split on reading, fused on writing: `hfnames.fusions`), Qwen3MoeForCausalLM (Qwen3-30B-A3B, 235B-A22B:
Qwen3's attention with routed experts in the layers `MoeConfig.sparse` names, each expert's gate/up/down a tensor of its
own in the file, as transformers 5 writes and reads them), Qwen2MoeForCausalLM (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B:
Qwen2's attention, its q/k/v bias, with Qwen3MoE's routed experts and beside them a shared expert, gated: `MoeConfig`;
`qkv_bias` false, which vLLM's ignores, refused), explicit `head_dim`, grouped-query attention, tied
embeddings (no lm_head in the file), one or several EOS ids, RoPE with any theta, unscaled or scaled as Llama 3.1–3.3
(`llama3`), `linear` or `yarn` (Qwen2.5/Qwen3 long context), and a Phi3's `longrope` (Phi-3-mini-128k, Phi-3.5-mini,
Phi-4-mini) and RoPE on part of each head (`partial_rotary_factor`: Phi-4-mini's 0.75) (`rlctl.models.rope`),
fp32/bf16/fp16 weights (the file's dtype is `torch_dtype`: what the weight plane sends and GPU engines compute in; a CPU
computes in fp32). Refused with one line naming the file and key: other architectures, a Qwen3MoE's
`shared_expert_intermediate_size` (vLLM's would build one, transformers' not), other RoPE scaling (dynamic, …; longrope
and partial RoPE but for a Phi3), Qwen's sliding-window attention (`use_sliding_window`), a model built for sequences
longer than a Mistral or Phi3 `sliding_window` (`window_refusal`), MLP bias, activations other than SiLU, quantized
weights.

Dropout (`attention_dropout`, Phi3's `resid_pdrop` and `embd_pdrop`) is read and not applied: the policy is trained
as the engines sample from it, without dropout (its log-probs are the rollouts' behaviour log-probs). A Phi3's are
written back as read (`Phi3Extras`); the other architectures' exports write none (their config classes read 0.0).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.errors import ConfigError
from rlctl.models import rope
from rlctl.models.catalog import ModelArch
from rlctl.models.moe import QWEN2_MOE_DEFAULTS, MoeConfig, parse_moe
from rlctl.models.rope import PHI3_ROPE_SUPPORTED, ROPE_SUPPORTED, RopeScaling, read_rope
from rlctl.textutil import read_config_bytes, undecodable_at

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.json"
LLAMA, QWEN2, QWEN3 = "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"
MISTRAL, PHI3, QWEN3_MOE = "MistralForCausalLM", "Phi3ForCausalLM", "Qwen3MoeForCausalLM"
QWEN2_MOE = "Qwen2MoeForCausalLM"
MODEL_TYPES = {LLAMA: "llama", QWEN2: "qwen2", QWEN3: "qwen3", MISTRAL: "mistral", PHI3: "phi3", QWEN3_MOE: "qwen3_moe",
               QWEN2_MOE: "qwen2_moe"}  # fmt: skip
MOE_ARCHITECTURES = {QWEN3_MOE: "Qwen3MoE", QWEN2_MOE: "Qwen2MoE"}  # (their names in messages)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_HF_DEFAULT_POSITIONS = {LLAMA: 2048, QWEN2: 32768, QWEN3: 32768, MISTRAL: 4096 * 32, PHI3: 4096, QWEN3_MOE: 32768,
                         QWEN2_MOE: 32768}  # fmt: skip
# sliding_window where config.json has no such key: MistralConfig's (v0.1's), Phi3Config's none
_HF_DEFAULT_WINDOW = {MISTRAL: 4096, PHI3: None}
_HF_DEFAULT_HEAD_DIM = {QWEN3: 128}  # Qwen3Config's own default: not hidden / heads
# where config.json has no such key, its config class's own value (transformers' and vLLM's reading): LlamaConfig's
# num_key_value_heads is num_attention_heads, the others' a number of their own; Qwen's special ids none
_HF_DEFAULT_KV_HEADS = {QWEN2: 32, QWEN3: 32, MISTRAL: 8, QWEN3_MOE: 4, QWEN2_MOE: 16}
_HF_DEFAULT_BOS = {LLAMA: 1, MISTRAL: 1, PHI3: 1}
_HF_DEFAULT_EOS = {LLAMA: 2, MISTRAL: 2, PHI3: 32000}
_HF_DEFAULT_PAD = {PHI3: 32000}
_HF_DEFAULT_RMS_EPS = {PHI3: 1e-5}  # the others' 1e-6
ROPE_FP64_KEY = "rlctl_rope_fp64_angles"  # written by the demo model only; other readers ignore it


@dataclass(frozen=True)
class Phi3Extras:
    """A Phi3 config.json's keys written back as read (as Phi3Config reads them: its defaults where config.json has
    none): longrope's pretraining context (`rope.fit_to_heads`; read by nothing else) and the dropout probabilities
    (rlctl trains without dropout: `rlctl.models.hf`'s docstring). `TinyGPTConfig.phi3_extras` None is what rlctl
    writes of its own: max_position_embeddings and no dropout."""

    original_max_position_embeddings: int
    attention_dropout: float = 0.0
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0


@dataclass
class TinyGPTConfig:
    """HF `LlamaConfig`/`Qwen2Config`/`Qwen3Config`/`MistralConfig`/`Phi3Config` keys (the subset the model computes
    with). Defaults: `tiny-demo`."""

    vocab_size: int = 66
    hidden_size: int = 96
    intermediate_size: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 3  # head size 32: vLLM's CPU attention runs 32, 64, 80, …, not 24
    num_key_value_heads: int = 3
    max_position_embeddings: int = 320
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = 0
    initializer_range: float = 0.02
    architecture: str = LLAMA  # LLAMA, QWEN2, QWEN3, MISTRAL or PHI3 (HF `architectures[0]`)
    explicit_head_dim: int | None = None  # HF `head_dim` where it is not hidden_size / num_attention_heads
    attention_bias: bool = False  # Llama, Qwen3: bias on q, k, v and o (Qwen2 always has q, k, v; Mistral, Phi3 none)
    # Mistral's and Phi3's `sliding_window` as transformers reads config.json (MistralConfig's 4096 where it has none),
    # written back as it is; None for the other architectures (Qwen2's is off: `use_sliding_window` false)
    sliding_window: int | None = None
    torch_dtype: str = "float32"  # the dtype the model is loaded in: what it travels and is served in (an rlctl
    # checkpoint keeps fp32 master weights under its starting model's dtype: rlctl.checkpoint.trainer.HostPolicy)
    # RoPE angles position·θ^(-2i/d) in fp64 (the demo model: its outputs are pinned) or, as
    # transformers and vLLM compute them, in fp32 (HF checkpoints: ~2e-5 apart in logits at position 100)
    rope_fp64_angles: bool = True
    phi3_extras: Phi3Extras | None = None  # a Phi3's keys written back as read (None: rlctl's own, `Phi3Extras`)
    partial_rotary_factor: float = 1.0  # a Phi3's: RoPE on the first `rotary_dim` dimensions of each head only
    # a Qwen3MoE's or Qwen2MoE's experts (None there: its config class's defaults); None for the others
    moe: MoeConfig | None = None

    def __post_init__(self) -> None:
        if self.architecture in MOE_ARCHITECTURES and self.moe is None:
            self.moe = QWEN2_MOE_DEFAULTS if self.architecture == QWEN2_MOE else MoeConfig()
        if self.moe is not None and self.architecture not in MOE_ARCHITECTURES:
            raise ValueError(f"moe is a {' or '.join(MOE_ARCHITECTURES)}'s, not a {self.architecture}'s")
        if self.moe is not None and bool(self.moe.shared_expert_intermediate_size) != (self.architecture == QWEN2_MOE):
            raise ValueError(f"a shared expert is a {QWEN2_MOE}'s (shared_expert_intermediate_size > 0), none other's")
        if self.explicit_head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads (or give explicit_head_dim)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.architecture not in MODEL_TYPES:
            raise ValueError(f"architecture must be one of {', '.join(MODEL_TYPES)}, not {self.architecture!r}")

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head RoPE rotates, its first ones (transformers' int(head_dim × the fraction))."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def longrope_context(self) -> int | None:
        """longrope's pretraining context L (original_max_position_embeddings): a pass over more positions than L
        takes its long_factor, over at most L its short_factor; None for the other scalings."""
        s = self.rope_scaling
        return s.original_max_position_embeddings if s is not None and s.kind == "longrope" else None

    @property
    def max_positions(self) -> int:
        """The longest sequence (prompt + output) the model is run on, as vLLM derives it (`rope.max_positions`):
        max_position_embeddings, times a linear scaling's factor. Every rlctl path holds sequences to it:
        `rlctl check`, the engines, the trainers."""
        return rope.max_positions(self.max_position_embeddings, self.rope_scaling)

    @property
    def binding_window(self) -> int | None:
        """Mistral's `sliding_window` where it binds: MistralModel masks kv ≤ q − window, so a sequence of more than
        `window` tokens has positions that attend to fewer tokens than all before them (rlctl's models attend to
        all: `window_refusal`); None where it is null or at least max_position_embeddings (nothing is cut off)."""
        w = self.sliding_window
        return w if w is not None and w < self.max_position_embeddings else None

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias or self.architecture in (QWEN2, QWEN2_MOE)

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm (weights [head_dim], eps rms_norm_eps) of q and k before RoPE: Qwen3's q_norm, k_norm."""
        return self.architecture in (QWEN3, QWEN3_MOE)

    def sparse_layer(self, layer: int) -> bool:
        """Layer `layer`'s MLP is a Qwen MoE's experts (`MoeConfig.sparse`), not a dense one."""
        return self.moe is not None and self.moe.sparse(layer)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a sequence (HF allows one id, a list, or none)."""
        e = self.eos_token_id
        return () if e is None else (e,) if isinstance(e, int) else tuple(e)

    def to_hf(self) -> dict[str, Any]:
        """config.json contents: loadable by `transformers` (and vLLM) as well as by `from_hf`."""
        d = asdict(self)
        for key in ("architecture", "explicit_head_dim", "rope_fp64_angles", "rope_scaling", "sliding_window",
                    "phi3_extras", "partial_rotary_factor", "moe"):  # fmt: skip
            del d[key]
        if self.architecture in (QWEN2, MISTRAL, PHI3, QWEN2_MOE):  # no such key: their bias is fixed
            del d["attention_bias"]
        return {
            "architectures": [self.architecture],
            "model_type": MODEL_TYPES[self.architecture],
            "hidden_act": "silu",
            "mlp_bias": False,
            "head_dim": self.head_dim,
            **d,
            **({"rope_scaling": self.rope_scaling.to_hf()} if self.rope_scaling is not None else {}),
            **(
                {"use_sliding_window": False, "sliding_window": None} if self.architecture in (QWEN2, QWEN2_MOE) else {}
            ),
            # (a Mistral's null written as null: absent, MistralConfig reads 4096)
            **({"sliding_window": self.sliding_window} if self.architecture == MISTRAL else {}),
            **(_phi3_keys(self) if self.architecture == PHI3 else {}),
            **({"partial_rotary_factor": self.partial_rotary_factor} if self.partial_rotary_factor != 1 else {}),
            **(self.moe.to_hf() if self.moe is not None else {}),
            **({ROPE_FP64_KEY: True} if self.rope_fp64_angles else {}),
        }

    @classmethod
    def from_hf(cls, d: Mapping[str, Any], *, file: str = CONFIG_FILE) -> TinyGPTConfig:
        """Validate an HF config dict; ConfigError naming `file` and the key for anything not supported."""
        return _parse_config(d, file)

    def num_params(self, *, active: bool = False) -> int:
        """Every parameter, or (`active`) those a token computes with: a sparse layer's router, its top
        `num_experts_per_tok` experts of `num_experts` and a Qwen2MoE's shared expert and its gate (memory holds them
        all; a token's FLOPs are the active ones')."""
        h, i, n = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        per_layer = 2 * h * q + 2 * h * kv + 2 * h
        per_layer += (q + 2 * kv if self.qkv_bias else 0) + (h if self.attention_bias else 0)
        per_layer += 2 * self.head_dim if self.qk_norm else 0
        mlps = 0
        for layer in range(n):
            if self.moe is not None and self.moe.sparse(layer):
                experts = self.moe.num_experts_per_tok if active else self.moe.num_experts
                mlps += self.moe.num_experts * h + experts * 3 * h * self.moe.moe_intermediate_size
                shared = self.moe.shared_expert_intermediate_size
                mlps += 3 * h * shared + h if shared else 0
            else:
                mlps += 3 * h * i
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return n * per_layer + mlps + emb + h

    def arch(self, name: str) -> ModelArch:
        """The planner's figures for this model (bytes per parameter from the checkpoint's dtype)."""
        return ModelArch(
            name,
            self.num_hidden_layers,
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.vocab_size,
            self.intermediate_size,
            float(self.num_params()),
            bytes_per_param=DTYPE_BYTES[self.torch_dtype],
            explicit_head_dim=self.explicit_head_dim,
            max_positions=self.max_positions,
            active_params=float(self.num_params(active=True)) if self.has_experts else None,
            qk_norm=self.qk_norm,
            tied=self.tie_word_embeddings,
            **(self._moe_token() if self.has_experts else {}),
        )

    @property
    def has_experts(self) -> bool:
        """Some layer has experts. A Qwen MoE's config with none (`num_experts` 0, a `decoder_sparse_step` past the
        last layer, `mlp_only_layers` naming every layer: valid in HF, every MLP dense) is priced as the dense model
        it builds, as `ArchFigures` describes one (no MoE shape)."""
        return any(self.sparse_layer(layer) for layer in range(self.num_hidden_layers))

    def _moe_token(self) -> dict[str, int]:
        """`ModelArch`'s figures of a sparse layer as a token runs it (its top-k experts' width and a Qwen2MoE's shared
        expert's); every layer is priced so where some are dense (`mlp_only_layers`, `decoder_sparse_step`): an
        upper bound, the width the larger of the two. And its experts' shape (LoRA's adapters on them)."""
        assert self.moe is not None
        width = self.moe.num_experts_per_tok * self.moe.moe_intermediate_size + self.moe.shared_expert_intermediate_size
        dense = sum(not self.moe.sparse(layer) for layer in range(self.num_hidden_layers))
        return {
            "token_intermediate": max(width, self.intermediate_size) if dense else width,
            "experts_per_token": self.moe.num_experts_per_tok,
            "experts": self.moe.num_experts,
            "expert_intermediate": self.moe.moe_intermediate_size,
            "shared_expert_intermediate": self.moe.shared_expert_intermediate_size,
            "dense_layers": dense,
        }


def _phi3_keys(c: TinyGPTConfig) -> dict[str, Any]:
    """The keys Phi3Config writes beside Llama's: its window, longrope's pretraining context and the dropout as read
    (`Phi3Extras`; a config of rlctl's own: the context, no dropout)."""
    extras = c.phi3_extras or Phi3Extras(c.max_position_embeddings)
    return {"sliding_window": c.sliding_window, **asdict(extras)}


def _phi3_extras(d: Mapping[str, Any], positions: int, bad: Callable[[str, str], ConfigError]) -> Phi3Extras | None:
    """A Phi3 config.json's `Phi3Extras` as Phi3Config reads them (its 4096 and no dropout where it has none); None
    where they are what rlctl writes of its own (the context, no dropout), so that its own configs read back equal."""
    context = d.get("original_max_position_embeddings", 4096)
    if type(context) is not int or context <= 0:
        raise bad("original_max_position_embeddings", f"{context!r} is not a positive integer")
    dropout: dict[str, float] = {}
    for key in ("attention_dropout", "resid_pdrop", "embd_pdrop"):
        p = d.get(key, 0.0)
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p <= 1:
            raise bad(key, f"{p!r} is not a dropout probability (a number from 0 to 1)")
        dropout[key] = float(p)
    extras = Phi3Extras(context, **dropout)
    return None if extras == Phi3Extras(positions) else extras


def torch_dtype(c: TinyGPTConfig) -> torch.dtype:
    """The checkpoint's weight dtype as a torch dtype."""
    import torch

    dtype: torch.dtype = getattr(torch, c.torch_dtype)
    return dtype


# ---- config.json ----
def read_config(directory: str | Path) -> TinyGPTConfig:
    """A checkpoint's config.json, read as HF's config class reads it; read once in a command's `reads_once` scope
    while the file is unchanged."""
    from rlctl.models.readonce import kept, stamp

    path = Path(directory) / CONFIG_FILE
    return kept(
        ("config", str(path.absolute()), stamp(path)),
        lambda: _parse_config(read_config_json(directory), str(path)),
    )


def read_config_json(directory: str | Path) -> dict[str, Any]:
    """A checkpoint's config.json as written (a JSON object); ConfigError naming it where it cannot be read or is not
    one. `TinyGPTConfig.from_hf` reads it as `read_config` does."""
    path = Path(directory) / CONFIG_FILE
    try:
        raw = read_config_bytes(path)
    except ValueError as e:
        raise ConfigError(str(path), None, str(e)) from e
    except OSError as e:
        raise ConfigError(str(path), None, f"cannot read: {e.strerror or e}") from e
    try:  # (the byte's offset alone was said: as read_yaml, its line and column)
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), None, f"not UTF-8 text ({undecodable_at(raw, e.start)}); save it as UTF-8") from e
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), None, f"not JSON: {e}") from e
    if not isinstance(d, dict):
        raise ConfigError(str(path), None, "not a JSON object")
    return d


def _mistral_window(d: Mapping[str, Any], bad: Callable[[str, str], ConfigError], default: int | None) -> int | None:
    """A Mistral (or Phi3) config's `sliding_window`: null or a positive integer (absent: `default`, MistralConfig's
    4096, Phi3Config's none). Where it binds (`TinyGPTConfig.binding_window`) a model is built only for sequences it
    does not cut (`window_refusal`)."""
    window = d.get("sliding_window", default)
    if window is not None and (type(window) is not int or window <= 0):
        raise bad("sliding_window", f"{window!r} is not null or a positive integer")
    return window


def window_refusal(c: TinyGPTConfig, context: int) -> str | None:
    """Why a model of `c` may not be built for sequences of `context` tokens, as the `sliding_window` entry of a
    one-line error (None: it may): rlctl's models attend to every earlier position, MistralModel (and vLLM) to the
    last `window` only, which tells them apart on a sequence of more than `window` tokens alone. `rlctl check`
    refuses a job whose context exceeds it first (rlctl.ops.preflight.data.window_problems)."""
    window = c.binding_window
    if window is None or context <= window:
        return None
    model = c.architecture.removesuffix("ForCausalLM") + "Model"  # (transformers' MistralModel, Phi3Model)
    return (
        f"{window} binds (below max_position_embeddings {c.max_position_embeddings}: {model} attends to a "
        f"position's last {window} tokens only, rlctl's models to all before it), and the model is asked to hold "
        f"sequences of {context} tokens; hold the job's context (its longest prompt + max_output_tokens) to ≤ {window}"
    )


def _parse_config(d: Mapping[str, Any], file: str) -> TinyGPTConfig:
    def bad(key: str, msg: str) -> ConfigError:
        return ConfigError(file, key, msg)

    def num(key: str, default: Any = None, *, kind: type = int) -> Any:
        v = d.get(key, default)
        if v is None:
            raise bad(key, "missing; a Llama, Qwen, Mistral or Phi3 config.json has it")
        ok = isinstance(v, int | float) and not isinstance(v, bool) if kind is float else type(v) is int
        if not ok or v <= 0:
            raise bad(key, f"{v!r} is not a positive {'number' if kind is float else 'integer'}")
        return float(v) if kind is float else v

    def token_id(key: str, default: int | None = None, *, many: bool = False) -> Any:
        v = d.get(key, default)
        ids = v if many and isinstance(v, list) else [v]
        if v is not None and not all(type(t) is int and t >= 0 for t in ids):
            raise bad(key, f"{v!r} is not a token id{' or a list of them' if many else ''}")
        return v

    archs = d.get("architectures")
    arch = archs[0] if isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str) else None
    if archs is None:  # (a config saved as `Qwen2Config()` is: its model_type names it, as AutoModelForCausalLM reads)
        arch = next((a for a, t in MODEL_TYPES.items() if t == d.get("model_type")), None)
        if arch is None:
            why = "no model_type that names one"
            if "model_type" in d:
                why = f"model_type {d['model_type']!r} is none of theirs"
            *some, last = (json.dumps([a]) for a in MODEL_TYPES)
            raise bad(
                "architectures",
                f'missing, and {why}; add "architectures": {", ".join(some)} or {last}, as the checkpoint\'s model is',
            )
    if arch is None or arch not in MODEL_TYPES:
        raise bad("architectures", f"{archs!r} is not supported; supported: {', '.join(MODEL_TYPES)}")
    if d.get("model_type", MODEL_TYPES[arch]) != MODEL_TYPES[arch]:
        raise bad("model_type", f"{d['model_type']!r} does not match {arch} (expected {MODEL_TYPES[arch]!r})")
    if d.get("hidden_act", "silu") != "silu":
        raise bad("hidden_act", f"{d['hidden_act']!r} is not supported; supported: silu")
    if d.get("mlp_bias", False):
        raise bad("mlp_bias", "true is not supported; supported: false")
    if d.get("quantization_config") is not None:
        raise bad("quantization_config", "quantized checkpoints are not supported; give fp32/bf16/fp16 weights")
    if d.get("use_sliding_window", False):
        raise bad("use_sliding_window", "sliding-window attention is not supported; supported: false")
    positions = num("max_position_embeddings", _HF_DEFAULT_POSITIONS[arch])
    window = _mistral_window(d, bad, _HF_DEFAULT_WINDOW[arch]) if arch in _HF_DEFAULT_WINDOW else None
    layer_types = d.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise bad("layer_types", f"{layer_types!r} is not a list of layer types")
    if any(t != "full_attention" for t in layer_types):
        kinds = sorted({str(t) for t in layer_types})
        raise bad("layer_types", f"{kinds} is not supported; supported: full_attention only")
    phi3 = arch == PHI3
    theta, scaling = read_rope(d, bad, supported=PHI3_ROPE_SUPPORTED if phi3 else f": {ROPE_SUPPORTED}", phi3=phi3)
    dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise bad(
            "dtype" if "dtype" in d else "torch_dtype",
            f"{dtype!r} is not supported; supported: {', '.join(DTYPE_BYTES)}",
        )

    hidden, heads = num("hidden_size"), num("num_attention_heads")
    kv_heads, head_dim = _heads(d, arch, hidden, heads, num, bad)
    bias = d.get("attention_bias", False)
    if not isinstance(bias, bool):
        raise bad("attention_bias", f"{bias!r} is not true or false")
    tie = d.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise bad("tie_word_embeddings", f"{tie!r} is not true or false")
    fraction = rope.rotary_fraction(d, bad) if phi3 else 1.0
    extras = _phi3_extras(d, positions, bad) if phi3 else None
    pretrained = positions if extras is None else extras.original_max_position_embeddings  # longrope's
    explicit = head_dim is not None and head_dim * heads != hidden
    dims = head_dim or hidden // heads
    scaling = rope.fit_to_heads(d, scaling, fraction, head_dim=dims, explicit=explicit, context=pretrained, bad=bad)
    vocab, pad = num("vocab_size"), token_id("pad_token_id", _HF_DEFAULT_PAD.get(arch))
    if pad is not None and pad >= vocab:  # (the embedding's padding row: transformers' model refuses to be built)
        said = "" if "pad_token_id" in d else f" ({arch.removesuffix('ForCausalLM')}Config's default where it has none)"
        row = f"is not a row of the embedding (vocab_size {vocab}); give an id below it, or null"
        raise bad("pad_token_id", f"{pad}{said} {row}")
    moe = parse_moe(d, bad, num, shared=arch == QWEN2_MOE) if arch in MOE_ARCHITECTURES else None
    if arch == QWEN2_MOE and d.get("qkv_bias", True) is not True:  # (vLLM's Qwen2MoeAttention: a bias whatever it says)
        raise bad("qkv_bias", f"{d['qkv_bias']!r} is not supported; supported: true (Qwen2MoeConfig's and vLLM's)")
    return TinyGPTConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=num("intermediate_size"),
        num_hidden_layers=num("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        rms_norm_eps=num("rms_norm_eps", _HF_DEFAULT_RMS_EPS.get(arch, 1e-6), kind=float),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=tie,
        bos_token_id=token_id("bos_token_id", _HF_DEFAULT_BOS.get(arch)),
        eos_token_id=token_id("eos_token_id", _HF_DEFAULT_EOS.get(arch), many=True),
        pad_token_id=pad,
        initializer_range=num("initializer_range", 0.02, kind=float),
        architecture=arch,
        explicit_head_dim=head_dim if head_dim is not None and head_dim * heads != hidden else None,
        attention_bias=bias and arch in (LLAMA, QWEN3, QWEN3_MOE),  # Qwen2, Mistral, Phi3's bias is fixed: no key
        sliding_window=window,
        torch_dtype=dtype,
        rope_fp64_angles=d.get(ROPE_FP64_KEY) is True,
        phi3_extras=extras,
        partial_rotary_factor=fraction,
        moe=moe,
    )


def _heads(
    d: Mapping[str, Any],
    arch: str,
    hidden: int,
    heads: int,
    num: Callable[..., Any],
    bad: Callable[[str, str], ConfigError],
) -> tuple[int, int | None]:
    """`num_key_value_heads` and `head_dim` (None: hidden / heads) as the architecture's config class reads them where
    config.json leaves them out (or gives num_key_value_heads null: num_attention_heads, but for MistralConfig, which
    refuses it, and Qwen2MoeConfig, whose model cannot be built from it); ConfigError (`bad`) where they do not fit
    `heads` and `hidden`."""
    if "num_key_value_heads" in d and d["num_key_value_heads"] is None and arch not in (MISTRAL, QWEN2_MOE):
        kv_heads = heads
    else:
        kv_heads = num("num_key_value_heads", _HF_DEFAULT_KV_HEADS.get(arch, heads))
    if heads % kv_heads:
        cls = arch.removesuffix("ForCausalLM") + "Config"
        said = "" if "num_key_value_heads" in d else f" ({cls}'s default where config.json has none)"
        raise bad("num_key_value_heads", f"{kv_heads}{said} does not divide num_attention_heads {heads}")
    head_dim = d.get("head_dim", _HF_DEFAULT_HEAD_DIM.get(arch))
    if head_dim is None and hidden % heads:
        raise bad("hidden_size", f"{hidden} is not a multiple of num_attention_heads {heads}; give head_dim")
    if head_dim is not None and (type(head_dim) is not int or head_dim <= 0 or head_dim % 2):
        raise bad("head_dim", f"{head_dim!r} is not a positive even integer")
    return kv_heads, head_dim
