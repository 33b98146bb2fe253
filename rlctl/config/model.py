"""A job file's `model`: the built-in demo model, an architecture for planning, or a Hugging Face checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from rlctl.config.base import Strict, is_recorded, register_tags
from rlctl.models.catalog import BUILTIN_MODELS, ModelArch
from rlctl.textutil import did_you_mean, one_of


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
        "experts, Qwen3-30B-A3B's 3.35e9 of 30.5e9); FLOPs are priced by it, memory by params. Default params",
    )

    @field_validator("name")
    @classmethod
    def _a_name(cls, v: str) -> str:
        if not v.strip():  # else plans and profiles speak of model '' (a profile's must match the job's by it)
            raise ValueError("the name is empty; give the model a name (a profile is matched to a job's model by it)")
        return v

    @model_serializer(mode="wrap")
    def _head_dim_only_if_given(self, dump: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a file written without head_dim (every profile before it, every hidden / heads model) is written the same;
        # a job's model without max_positions (`ArchModel`) likewise
        out: dict[str, Any] = dump(self)
        for key in ("head_dim", "max_positions", "active_params"):
            if out.get(key) is None:
                out.pop(key, None)
        return out

    @property
    def arch(self) -> ModelArch:
        explicit = self.head_dim if self.head_dim is not None and self.head_dim != self.hidden // self.heads else None
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
            active_params=self.active_params,
        )


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
