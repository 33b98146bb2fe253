"""The profile file (`kind: Profile`): per site, PTL(BS) grids per TP degree and training cost per config.

    apiVersion: rlctl/v1
    kind: Profile
    source: analytical            # or measured
    model: {name: qwen2.5-7b, params: 7.62e9, ...}
    algorithm: grpo
    training_passes: {reference: true, old_logprobs: false, epochs: 1, mini_batches: 1, recompute: false}
    sites:
      h20:
        gpu: H20
        gpus_per_node: 8
        cost_per_gpu_hour: 1.0
        generation:               # one entry per tensor-parallel degree (and engine, when measured)
          - tp: 1
            engine: vllm            # measured with; absent = any engine (analytical)
            contexts: [1024, 4096, 16384]
            batch_sizes: [1, 2, 4, ...]
            ptl_s: [[...], [...], [...]]    # ptl_s[context][batch], seconds per decode step
            prefill_s_per_token: 1.2e-5
            prefill_fixed_s: 0.0            # fixed cost of a step that admits new sequences
            kv_capacity_tokens: 1200000     # tokens of KV cache that fit beside the weights
        training:                 # one entry per (tp, pp)
          - {tp: 1, pp: 1, gpu_s_per_token: 3.1e-5, fixed_bytes_per_gpu: ..., sharded_bytes_per_gpu: ...,
             backend: megatron}       # the trainer backend measured; absent = any (analytical)

Documented field by field in docs/profile-format.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from rlctl.config.base import API_VERSION, Strict, check_header, read_yaml, validate
from rlctl.errors import ConfigError, UsageError
from rlctl.models.catalog import ModelArch
from rlctl.profiler.traincost import TrainingPasses


class ModelSpec(Strict):
    name: str
    layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    vocab: PositiveInt
    intermediate: PositiveInt
    params: PositiveFloat
    bytes_per_param: PositiveInt = 2

    @classmethod
    def of(cls, arch: ModelArch) -> ModelSpec:
        return cls(
            name=arch.name,
            layers=arch.layers,
            hidden=arch.hidden,
            heads=arch.heads,
            kv_heads=arch.kv_heads,
            vocab=arch.vocab,
            intermediate=arch.intermediate,
            params=arch.params,
            bytes_per_param=arch.bytes_per_param,
        )

    @property
    def arch(self) -> ModelArch:
        return ModelArch(
            self.name,
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.vocab,
            self.intermediate,
            self.params,
            self.bytes_per_param,
        )


class GenerationEntry(Strict):
    """Decode cost of one instance with `tp` GPUs: a PTL grid over (context, batch size)."""

    tp: PositiveInt
    contexts: list[PositiveInt] = Field(min_length=1)
    batch_sizes: list[PositiveInt] = Field(min_length=1)
    ptl_s: list[list[PositiveFloat]]
    prefill_s_per_token: NonNegativeFloat
    prefill_fixed_s: NonNegativeFloat = 0.0
    kv_capacity_tokens: PositiveInt
    compact_fraction: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="finished rows stay in the batch until this fraction is free (None: freed at once)"
    )
    padded_attention: bool = Field(
        False, description="a step attends over the longest context in the batch (padded), not each row's own"
    )
    engine: Literal["embedded", "vllm"] | None = Field(
        None, description="the engine measured; None = any (analytical roofline, or an imported profile)"
    )

    @model_validator(mode="after")
    def _grid_shape(self) -> GenerationEntry:
        if sorted(set(self.contexts)) != self.contexts:
            raise ValueError("contexts must be strictly increasing")
        if sorted(set(self.batch_sizes)) != self.batch_sizes:
            raise ValueError("batch_sizes must be strictly increasing")
        if len(self.ptl_s) != len(self.contexts) or any(len(r) != len(self.batch_sizes) for r in self.ptl_s):
            raise ValueError(
                f"ptl_s must be {len(self.contexts)} rows (contexts) × {len(self.batch_sizes)} columns (batch_sizes)"
            )
        return self


class TrainingEntry(Strict):
    """Training cost with tensor degree `tp` and pipeline degree `pp` (data parallel = the rest)."""

    tp: PositiveInt
    pp: PositiveInt
    gpu_s_per_token: PositiveFloat = Field(
        description="GPU-seconds per trained token of one iteration: every pass of the profile's training_passes"
    )
    fixed_bytes_per_gpu: NonNegativeFloat = Field(description="memory per GPU not divided by DP (weights, grads)")
    sharded_bytes_per_gpu: NonNegativeFloat = Field(description="memory per GPU at DP=1 that DP shards (optimizer)")
    backend: Literal["torch", "megatron"] | None = Field(
        None, description="the trainer backend measured at this tp, pp; None = any (analytical roofline)"
    )
    pipeline_wait_included: bool = Field(
        False,
        description="timed over this split's tp·pp ranks by wall clock: a stage's waiting for the others is in "
        "gpu_s_per_token, so plan adds no pipeline bubble (a roofline entry or one rank's figure: False)",
    )

    @model_validator(mode="before")
    @classmethod
    def _scaled_is_gone(cls, data: Any) -> Any:
        """`scaled`, which earlier versions of `rlctl profile` wrote: false (measured or modelled as is) means
        what no key means; true (the tp 1 pp 1 figure × the roofline's ratio) is refused: splits are measured."""
        if isinstance(data, dict) and "scaled" in data:
            if data["scaled"] is not False:
                raise ValueError(
                    "scaled: this entry was scaled from tp 1 pp 1 by the roofline (an older rlctl profile); "
                    "measure the split: rlctl profile --job JOB --source measured"
                )
            data = {k: v for k, v in data.items() if k != "scaled"}
        return data


class SiteProfile(Strict):
    gpu: str
    gpus_per_node: PositiveInt
    hbm_bytes: PositiveFloat
    cost_per_gpu_hour: PositiveFloat
    generation: list[GenerationEntry] = Field(default_factory=list)
    training: list[TrainingEntry] = Field(default_factory=list)


class ProfileFile(Strict):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["Profile"]
    source: Literal["analytical", "measured"]
    model: ModelSpec
    algorithm: Literal["grpo", "ppo"] = "grpo"
    training_passes: TrainingPasses = Field(
        default_factory=TrainingPasses, description="the passes the training entries' seconds per token include"
    )
    sites: dict[Annotated[str, Field(min_length=1)], SiteProfile] = Field(min_length=1)


def load_profile(path: Path) -> ProfileFile:
    data = read_yaml(path)
    check_header(path, data, "Profile")
    return validate(path, data, ProfileFile)


def refuse_empty_generation(profile: ProfileFile, sites: Iterable[str], *, path: str) -> None:
    """ConfigError naming the profile file and field when a site the job generates on (`sites`) has an empty
    generation curve there: the planner would find no TP degree to run it at and blame the model's size."""
    for name in sites:
        site = profile.sites.get(name)
        if site is not None and not site.generation:
            raise ConfigError(
                path,
                f"sites.{name}.generation",
                "empty: the job generates on this site and the profile has no generation entry for it "
                "(one per TP degree at which the model fits on its GPU)",
                hint="profile it again (`rlctl profile --job JOB`), or place the job's rollout on another site",
            )


def refuse_empty_training(profile: ProfileFile, site: str, *, path: str) -> None:
    """ConfigError naming the profile file and field when the trainer's site has no training entry there: the
    planner would price no split and blame the trainer's GPU count ('training state does not fit')."""
    entry = profile.sites.get(site)
    if entry is not None and not entry.training:
        raise ConfigError(
            path,
            f"sites.{site}.training",
            "empty: the job trains on this site and the profile has no training entry for it (one per TP × PP split)",
            hint="profile it again (`rlctl profile --job JOB`), or place the job's trainer on another site",
        )


_HEAD_BYTES = 64 * 1024  # a profile's `kind` is among its first keys; a file up to this size is parsed whole
_PROFILE_MAX_BYTES = 64 * 1024 * 1024  # far past any profile (sites × a few hundred entries of a few lines each)
_KIND_LINE = re.compile(  # YAML's top-level `kind: X`, or JSON's `"kind": "X"` leading a line
    r"""^(?:kind:[ \t]*['"]?([^'"\s#]*)|[ \t]*\{?[ \t]*"kind"[ \t]*:[ \t]*"([^"]*)")""", re.MULTILINE
)


def _kind_of_head(path: Path) -> tuple[bool, str | None]:
    """(whether the file holds nothing but blanks, its top-level `kind`), read from at most its first `_HEAD_BYTES`:
    `-o` naming a dataset of gigabytes read and parsed it whole to find it no profile. A file up to that size is
    parsed as YAML (JSON too); past it, its head's top-level `kind:` line (YAML) or `"kind": "…"` key (JSON) says."""
    try:
        with path.open("rb") as f:
            head = f.read(_HEAD_BYTES + 1)
        whole = len(head) <= _HEAD_BYTES
        text = head.decode("utf-8") if whole else head[:_HEAD_BYTES].decode("utf-8", errors="ignore")
        if whole:
            data = yaml.safe_load(text) if text.strip() else None
            kind = data.get("kind") if isinstance(data, dict) else None
            return not text.strip(), kind if isinstance(kind, str) else None
    except (OSError, ValueError, yaml.YAMLError):  # unreadable, no UTF-8, no YAML: no profile rlctl wrote either
        return False, None
    found = _KIND_LINE.search(text)
    return False, (found.group(1) or found.group(2)) if found else None


def refuse_overwriting(path: Path, *, named_by: str = "-o") -> None:
    """UsageError, one line, when `path` is a file that holds something other than a profile (a job file, an
    inventory, a dataset): the profile written there replaced it, and the user's file was lost (`rlctl profile ...
    -o jobs/demo.yaml` wrote over the job). An empty file, or an earlier profile (`kind: Profile`), is written over;
    a directory or a path not there is `save_profile`'s to say or make. Only the file's head is read (`_kind_of_head`),
    and a file larger than any profile is refused unread."""
    if not path.is_file():
        return
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > _PROFILE_MAX_BYTES:
        what = f"a file of {size} bytes, larger than any profile"
    else:
        blank, kind = _kind_of_head(path)
        if blank or kind == "Profile":
            return
        what = f"a file of kind {kind!r}" if kind else "a file that is no profile"
    raise UsageError(
        f"{named_by} {path}: holds {what}; the profile written there would replace it",
        hint="name another file: a profile is written only over an earlier profile or an empty file",
    )


def save_profile(profile: ProfileFile, path: Path) -> None:
    data = profile.model_dump(by_alias=True, mode="json")
    data = {
        "apiVersion": API_VERSION,
        "kind": "Profile",
        **{k: v for k, v in data.items() if k not in ("apiVersion", "kind")},
    }
    try:  # its folder too: a job's planning.profile names a file in one not made yet (`profiles/h800.yaml`)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix.lower() == ".json":  # (as `-o json` is JSON to the other commands; the plan reads it as YAML)
            text = json.dumps(data, indent=2) + "\n"
        else:
            text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=160)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(path), None, f"cannot write profile: {e}") from e
