"""A job file's `model`: the built-in demo model, an architecture for planning, or a Hugging Face checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rlctl.config.base import Strict, is_recorded, register_tags
from rlctl.models.catalog import BUILTIN_MODELS, ModelArch
from rlctl.textutil import did_you_mean, one_of

# a MoE's shape (`ArchFigures`), HF's num_experts, num_experts_per_tok and moe_intermediate_size: given together or
# not at all (a dense model); the others only beside them
MOE_SHAPE = ("experts", "experts_per_token", "expert_intermediate")
MOE_FIELDS = (*MOE_SHAPE, "shared_expert_intermediate", "dense_layers")


class BuiltinModel(Strict):
    kind: Literal["builtin"]
    name: str

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in BUILTIN_MODELS:
            raise ValueError(
                f"unknown built-in model {v!r}; known: {one_of(BUILTIN_MODELS)}{did_you_mean(v, BUILTIN_MODELS)}"
            )
        return v

    @property
    def arch(self) -> ModelArch:
        return BUILTIN_MODELS[self.name]


class ArchFigures(Strict):
    """A model's architecture as a file writes it, the figures the cost models take (`ModelArch`): the one description
    a job's `model: {kind: arch, …}` (`ArchModel`) and a profile's `model` (`rlctl.profiler.profile.ModelSpec`, which
    adds `bytes_per_param`) both are."""

    name: str
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    vocab: PositiveInt
    intermediate: PositiveInt
    params: PositiveFloat
    head_dim: PositiveInt | None = Field(
        None,
        description="an attention head's width where it is not hidden / heads (Qwen3, Gemma: HF's head_dim); it sizes "
        "the KV cache and the attention FLOPs. Default hidden // heads",
    )
    active_params: PositiveFloat | None = Field(
        None,
        description="the parameters one token computes with where fewer than params (a MoE: its routers and top-k "
        "experts, Qwen3-30B-A3B's 3.35e9 of 30.5e9); FLOPs are priced by it, memory by params. Default params, or "
        "of a MoE described by its experts, params less the experts a token does not run",
    )
    experts: PositiveInt | None = Field(
        None,
        description="a MoE's routed experts in each sparse layer (HF's num_experts), with experts_per_token and "
        "expert_intermediate: its activations are priced at the width a token runs. Default: a dense model",
    )
    experts_per_token: PositiveInt | None = Field(
        None, description="the experts a token is routed to (HF's num_experts_per_tok), at most experts"
    )
    expert_intermediate: PositiveInt | None = Field(
        None, description="an expert's MLP width (HF's moe_intermediate_size; Qwen3-30B-A3B's 768)"
    )
    shared_expert_intermediate: NonNegativeInt | None = Field(
        None,
        description="the width of a shared expert every token runs beside its top experts (a Qwen2MoE's "
        "shared_expert_intermediate_size). Default: none (0 too, as an HF config without one says it)",
    )
    dense_layers: NonNegativeInt | None = Field(
        None,
        description="how many layers have a dense MLP of intermediate instead of experts (HF's mlp_only_layers, or "
        "the layers decoder_sparse_step skips), fewer than layers. Default: none (0 too, as an empty "
        "mlp_only_layers says it)",
    )
    qk_norm: bool = Field(
        False,
        description="whether each head's q and k are RMS-normed before RoPE (Qwen3's and Qwen3MoE's q_norm and "
        "k_norm): their activations are priced. Default false",
    )
    tied: bool = Field(
        False,
        description="whether lm_head computes with the embedding's weight (HF's tie_word_embeddings; Qwen2.5-0.5B to "
        "3B, Qwen3-0.6B to 4B), counted once in params: autocast's bf16 copy of it is priced. Default false",
    )

    @field_validator("name")
    @classmethod
    def _a_name(cls, v: str) -> str:
        if not v.strip():  # else plans and profiles speak of model '' (a profile's must match the job's by it)
            raise ValueError("the name is empty; give the model a name (a profile is matched to a job's model by it)")
        return v

    @field_validator("shared_expert_intermediate", "dense_layers")
    @classmethod
    def _zero_is_none(cls, v: int | None) -> int | None:
        # an HF config's figure copied as it reads (shared_expert_intermediate_size 0, mlp_only_layers [] counted 0):
        # none, written as none (left out), versus refused by a field whose default is none
        return v or None

    @model_validator(mode="after")
    def _moe_shape(self) -> ArchFigures:
        # ("bool_for_number": first_error's type that names the key in the error's field, `model.experts: …`)
        def bad(key: str, why: str) -> PydanticCustomError:
            return PydanticCustomError("bool_for_number", "{why}", {"key": key, "path": [], "why": why})

        given = [key for key in MOE_FIELDS if getattr(self, key) is not None]
        if given and (missing := [key for key in MOE_SHAPE if getattr(self, key) is None]):
            raise bad(
                missing[0],
                f"missing beside {given[0]}: a MoE is described by {', '.join(MOE_SHAPE)} together (HF's "
                "num_experts, num_experts_per_tok, moe_intermediate_size), a dense model by none of them",
            )
        if not given:
            return self
        assert self.experts is not None and self.experts_per_token is not None
        if self.experts_per_token > self.experts:
            raise bad("experts_per_token", f"{self.experts_per_token} is more than experts {self.experts}")
        if self.dense_layers is not None and self.dense_layers >= self.layers:
            raise bad(
                "dense_layers",
                f"{self.dense_layers} is not fewer than layers {self.layers}; a model without sparse layers is "
                "dense: leave out experts, experts_per_token and expert_intermediate",
            )
        if self.active_params is None and (active := self._moe_active()) <= 0:
            raise bad(
                "params",
                f"{self.params:g} is not more than the {self.params - active:g} parameters of the experts a token "
                "does not run (sparse layers × (experts − experts_per_token) × 3 × hidden × expert_intermediate); "
                "give the model's total count",
            )
        return self

    def _moe_active(self) -> float:
        """A MoE's parameters a token computes with: `params` less the experts its sparse layers do not route it to
        (each a SwiGLU's gate, up and down: 3 × hidden × expert_intermediate), as `TinyGPTConfig.num_params` counts
        them."""
        assert self.experts is not None and self.experts_per_token is not None and self.expert_intermediate
        sparse = self.layers - (self.dense_layers or 0)
        unused = self.experts - self.experts_per_token
        return self.params - sparse * unused * 3 * self.hidden * self.expert_intermediate

    def _moe_token(self) -> dict[str, int]:
        """`ModelArch`'s figures of a sparse layer as a token runs it, as `TinyGPTConfig._moe_token` derives them: its
        top experts' width and a shared expert's (every layer priced so, of the larger width, where some are dense),
        and its experts' shape (LoRA's adapters on them)."""
        if self.experts is None:
            return {}
        assert self.experts_per_token is not None and self.expert_intermediate is not None
        width = self.experts_per_token * self.expert_intermediate + (self.shared_expert_intermediate or 0)
        return {
            "token_intermediate": max(width, self.intermediate) if self.dense_layers else width,
            "experts_per_token": self.experts_per_token,
            "experts": self.experts,
            "expert_intermediate": self.expert_intermediate,
            "shared_expert_intermediate": self.shared_expert_intermediate or 0,
            "dense_layers": self.dense_layers or 0,
        }

    @model_serializer(mode="wrap")
    def _head_dim_only_if_given(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a file written without head_dim (every profile before it, every hidden / heads model) is written the same;
        # a job's model without max_positions (`ArchModel`), active_params or a MoE's shape (`MOE_FIELDS`) likewise
        out: dict[str, Any] = dump(self)
        for key in ("head_dim", "max_positions", "active_params", *MOE_FIELDS):
            if out.get(key) is None:
                out.pop(key, None)
        for key in ("qk_norm", "tied"):  # (written only where true: a file without them is written the same)
            if not out.get(key):
                out.pop(key, None)
        return out

    @property
    def arch(self) -> ModelArch:
        explicit = self.head_dim if self.head_dim is not None and self.head_dim != self.hidden // self.heads else None
        active = self.active_params
        if active is None and self.experts is not None:
            active = self._moe_active()
        return ModelArch(
            self.name,
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.vocab,
            self.intermediate,
            self.params,
            explicit_head_dim=explicit,
            active_params=active,
            qk_norm=self.qk_norm,
            tied=self.tied,
            **self._moe_token(),
        )


def moe_figures(arch: ModelArch) -> dict[str, int | None]:
    """`arch`'s MoE shape as `ArchFigures` writes it (`MOE_FIELDS`; none for a dense model)."""
    if not arch.expert_intermediate:
        return {}
    return {
        "experts": arch.experts,
        "experts_per_token": arch.experts_per_token,
        "expert_intermediate": arch.expert_intermediate,
        "shared_expert_intermediate": arch.shared_expert_intermediate or None,
        "dense_layers": arch.dense_layers or None,
    }


class ArchModel(ArchFigures):
    """A model described by its architecture only: for planning (`rlctl plan`), not for launching."""

    kind: Literal["arch"]
    max_positions: PositiveInt | None = Field(
        None,
        description="the model's context (HF's max_position_embeddings): `rlctl plan` refuses a task asking more "
        "prompt + output tokens. Default: not checked",
    )

    @property
    def arch(self) -> ModelArch:
        return dataclasses.replace(super().arch, max_positions=self.max_positions)


class HfModel(Strict):
    """A local Hugging Face checkpoint directory (Qwen3, Qwen3MoE, Qwen2, Llama, Mistral or Phi3 architecture):
    config.json, safetensors (single or sharded), tokenizer files. `path` is relative to the job file; `load_job` checks
    the directory (rlctl.models.hfdir.check_hf_dir) and the planner's figures come from its config.json."""

    kind: Literal["hf"]
    path: str
    name: str | None = None

    @field_validator("path")
    @classmethod
    def _a_path(cls, v: str) -> str:
        if not v.strip():  # else read as the job file's own directory, and said to lack config.json
            raise ValueError("the path is empty; give the Hugging Face checkpoint directory (relative to the job file)")
        return v

    @field_validator("name")
    @classmethod
    def _a_name(cls, v: str | None, info: ValidationInfo) -> str | None:
        # the architecture's name, which the profile the planner makes of it refuses empty (`ArchFigures`): a
        # pydantic traceback from `rlctl plan`, versus this line. Not in a job's record (`RECORDED`): one an older
        # rlctl launched so reads as launched
        if v is not None and not v.strip() and not is_recorded(info):
            raise ValueError("the name is empty; give the model a name, or leave it out for the directory's name")
        return v

    @property
    def arch(self) -> ModelArch:
        from rlctl.models.hfdir import check_hf_dir

        return check_hf_dir(self.path, name=self.name).arch


Model = Annotated[BuiltinModel | ArchModel | HfModel, Field(discriminator="kind")]
register_tags("model", Model)
