"""The profile file (`kind: Profile`): per site, PTL(BS) grids per TP degree and training cost per config.

    apiVersion: rlctl/v1
    kind: Profile
    source: analytical            # or measured
    model: {name: qwen2.5-7b, params: 7.62e9, ...}
    algorithm: grpo
    training_passes: {reference: true, old_logprobs: false, epochs: 1, mini_batches: 1, recompute: false}
    lora: {rank: 16, alpha: 32, ...}  # a LoRA job's trainer.lora (`rlctl profile --job`); null: the policy trained
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
             backend: megatron,       # the trainer backend measured; absent = any (analytical)
             per: padded_token}       # what gpu_s_per_token is per (a measured file without it: real_token)

Documented field by field in docs/profile-format.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from rlctl.config.base import API_VERSION, Strict, check_header, read_yaml, validate
from rlctl.config.model import MOE_FIELDS, ArchFigures, moe_figures
from rlctl.config.runtime import Lora
from rlctl.errors import ConfigError, UsageError
from rlctl.models.catalog import ModelArch
from rlctl.profiler.traincost import TrainingPasses, lora_adapters

log = logging.getLogger(__name__)


class ModelSpec(ArchFigures):
    """The profile's `model`: the architecture profiled (`ArchFigures`, as a job's `kind: arch` model writes it) and
    the bytes of one of its parameters. A MoE's is written by its `active_params` and its experts' shape
    (`MOE_FIELDS`): a LoRA profile's training entries are of an adapter on each expert (`priced_passes`); its
    activations are priced of the job's model."""

    bytes_per_param: PositiveInt = 2

    @classmethod
    def of(cls, arch: ModelArch) -> ModelSpec:
        figures = {
            name: getattr(arch, name)
            for name in cls.model_fields
            if name not in ("head_dim", "qk_norm", "tied", *MOE_FIELDS)
        }
        return cls.model_validate({**figures, "head_dim": arch.explicit_head_dim, **moe_figures(arch)})

    @property
    def arch(self) -> ModelArch:
        return dataclasses.replace(super().arch, bytes_per_param=self.bytes_per_param)


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
    per: Literal["padded_token", "real_token"] = Field(
        "padded_token",
        description="what gpu_s_per_token is per: a token computed, padding included (the roofline's FLOPs a token; "
        "the probe's step over its padded tokens, since 2026-12-08), or a real token (a measured entry of an earlier "
        "rlctl, its probe's padding in the figure: read so where a file's measured entry has no `per`)",
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
    lora: Lora | None = Field(
        None,
        description="the LoRA the training entries are of (a job's trainer.lora: its adapters trained, the policy "
        "frozen; measured, the probe trained them); None: the whole policy trained",
    )
    sites: dict[Annotated[str, Field(min_length=1)], SiteProfile] = Field(min_length=1)


def priced_passes(profile: ProfileFile) -> TrainingPasses:
    """The passes `profile`'s training entries price: its `training_passes` with its LoRA's adapters (`lora`), what
    `rlctl plan` scales a job's passes against (a LoRA profile of a LoRA job: not again)."""
    return profile.training_passes.model_copy(update=lora_adapters(profile.model.arch, profile.lora))


def load_profile(path: Path) -> ProfileFile:
    """The profile file at `path`, validated. A measured training entry (one with a `backend`) written before the
    entries said what their figure is per (`TrainingEntry.per`) is read as per real token, which the planner prices
    as it did then (`planner.costs.train_compute_s`), and a warning line names the file: its figure holds its
    probe's padding, which a figure per padded token does not (priced twice since 2026-12-08, about 1.1 × too long
    on the demo)."""
    data = read_yaml(path)
    check_header(path, data, "Profile")
    older = _older_measured_entries(data)
    profile = validate(path, data, ProfileFile)
    if older and str(path) not in _SAID_PER_REAL_TOKEN:
        _SAID_PER_REAL_TOKEN.add(str(path))  # (`rlctl check` reads the job's profile more than once: said once)
        log.warning(
            "%s: %s: gpu_s_per_token is per real token, its probe's padding in the figure (a profile of an rlctl "
            "before 2026-12-08, no `per` key): priced per real token as then; re-run rlctl profile --job JOB "
            "--source measured for a figure per padded token",
            path,
            ", ".join(older),
        )
    return profile


_SAID_PER_REAL_TOKEN: set[str] = set()  # the files whose older measured entries were said, once a process


def _older_measured_entries(data: Any) -> list[str]:
    """The fields (`sites.S.training`) that hold measured training entries (a `backend` given) with no `per`:
    written before it was recorded, when the probe's figure was per real token. Each is given `per: real_token`
    (in place); what is no mapping is left to validation to refuse."""
    out: list[str] = []
    sites = data.get("sites") if isinstance(data, dict) else None
    for name, site in sites.items() if isinstance(sites, dict) else ():
        training = site.get("training") if isinstance(site, dict) else None
        for entry in training if isinstance(training, list) else ():
            if isinstance(entry, dict) and entry.get("backend") is not None and "per" not in entry:
                entry["per"] = "real_token"
                if f"sites.{name}.training" not in out:
                    out.append(f"sites.{name}.training")
    return out


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


_HEAD_BYTES = 64 * 1024  # a file of only blanks up to this size is an empty one
_PROFILE_MAX_BYTES = 64 * 1024 * 1024  # far past any profile (sites × a few hundred entries of a few lines each)
_YAML_EVENTS = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where built with it: a profile's MiB quickly


def _kind_of_file(path: Path) -> tuple[bool, str | None]:
    """(whether the file holds nothing but blanks, its top-level `kind` where the whole file is one YAML or JSON
    document whose root is a mapping with one `kind` key, else None). The file is streamed through the YAML
    parser's events, never held whole (`-o` naming a dataset of gigabytes read and parsed it whole), and the
    parse stops at what shows it no profile: a dataset's bytes that are no YAML, or its second JSON line. (Past
    64 KiB its head's first `kind` line said, and a JSON-lines dataset whose first row began `{"kind": "Profile"`
    was written over.)"""
    try:
        with path.open("rb") as f:
            head = f.read(_HEAD_BYTES + 1)
        if len(head) <= _HEAD_BYTES and not head.strip():
            return True, None
        with path.open(encoding="utf-8") as text:  # strict: a file that is no UTF-8 is no profile rlctl wrote
            return False, _top_level_kind(yaml.parse(text, Loader=_YAML_EVENTS))
    except (OSError, ValueError, yaml.YAMLError, RecursionError):  # unreadable, no UTF-8, no YAML: no profile
        return False, None


def _top_level_kind(events: Iterable[yaml.Event]) -> str | None:
    """The string of the root mapping's `kind` key, read from the parser's `events` to the stream's end; None for
    a stream of other than one document, a root that is no mapping, or a `kind` missing, given twice or no
    string."""
    docs, depth, key_turn, key = 0, 0, True, None
    kinds: list[str | None] = []
    for ev in events:
        if isinstance(ev, yaml.DocumentStartEvent):
            docs += 1
            if docs > 1:
                return None
        elif isinstance(ev, yaml.CollectionStartEvent):
            if depth == 0 and not isinstance(ev, yaml.MappingStartEvent):
                return None
            if depth == 1 and not key_turn and key == "kind":
                kinds.append(None)  # a collection as its value
            depth += 1
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
            if depth == 1:  # a key or value of the root mapping ended
                key_turn, key = not key_turn, None if key_turn else key
        elif isinstance(ev, yaml.NodeEvent) and depth == 0:  # a scalar (or alias) root
            return None
        elif isinstance(ev, yaml.NodeEvent) and depth == 1:
            value = ev.value if isinstance(ev, yaml.ScalarEvent) else None
            if key_turn:
                key = value
            elif key == "kind":
                kinds.append(value)
            key_turn = not key_turn
    return kinds[0] if len(kinds) == 1 else None


def refuse_overwriting(path: Path, *, named_by: str = "-o") -> None:
    """UsageError, one line, when `path` is a file that holds something other than a profile (a job file, an
    inventory, a dataset): the profile written there replaced it, and the user's file was lost (`rlctl profile ...
    -o jobs/demo.yaml` wrote over the job). An empty file, or an earlier profile (`kind: Profile`), is written over;
    a path not there is `save_profile`'s to make. A directory, or a path below a file, is refused too: `save_profile`
    said so only after a measured profile's minutes. The file is streamed, never held whole (`_kind_of_file`), and a
    file larger than any profile is refused unread."""
    if path.is_dir():
        raise UsageError(f"{named_by} {path}: is a directory", hint=f"give a file name, e.g. {path / 'profile.yaml'}")
    if (above := next((p for p in path.parents if p.exists()), None)) is not None and not above.is_dir():
        raise UsageError(f"{named_by} {path}: {above} is a file, not a directory", hint="name a file in a directory")
    if not path.is_file():
        return
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > _PROFILE_MAX_BYTES:
        what = f"a file of {size} bytes, larger than any profile"
    else:
        blank, kind = _kind_of_file(path)
        if blank or kind == "Profile":
            return
        what = f"a file of kind {kind!r}" if kind else "a file that is no profile"
    raise UsageError(
        f"{named_by} {path}: holds {what}; the profile written there would replace it",
        hint="name another file: a profile is written only over an earlier profile or an empty file",
    )


def save_profile(profile: ProfileFile, path: Path, *, named_by: str = "-o") -> None:
    """Write `profile` to `path` (its folder made). A write refused there (a folder not this user's, a file system
    that refuses it) is the operator's path: UsageError, one line naming `named_by` (`rlctl profile`'s -o), exit 2 as
    `refuse_overwriting`'s lines, versus 'PATH: cannot write profile: [Errno 13] …' naming no option."""
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
        said = e.strerror or str(e)
        if e.filename is not None and str(e.filename) != str(path):  # its folder, made first
            said += f": {e.filename}"
        raise UsageError(f"{named_by} {path}: cannot write the profile: {said}", hint="write elsewhere") from e
