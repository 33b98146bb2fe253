"""Building a profile file for `rlctl profile`: what to profile (from options or a job), then per site
the analytical roofline or the probe's measurements.

    --cluster/--model/--algorithm/--engine ─┐   (--trainer-backend)
                                            ├─▶ ProfileRequest ─▶ build_profile ─▶ ProfileFile
    --job JOB (model, algorithm, engine,   ─┘        per site: analytical_site, or the probe
               trainer backend, batch, sites)          (in-process on a local site, else remote.py)

A measured site profile holds one generation entry per engine (named, so `rlctl plan` takes the
curve of the job's engine) and one training entry, named by its trainer backend (`torch` or
`megatron`), at tp = pp = 1 (the trainer's data-parallel ranks: one process, a whole model), whose
seconds per token come from a step of rlctl's learner on that backend, on the probe's thread clock. A job
that fixes a megatron split (`trainer.tensor_parallel` / `pipeline_parallel`) also gets an entry at that
split, measured by running its tp·pp ranks: GPU-seconds per token on the wall clock, the stages' waiting
included (`pipeline_wait_included`; measure_split.py says why the tp 1 pp 1 entry keeps the thread clock).
Memory figures are analytical (the roofline's, at each entry's split). A LoRA job's (`trainer.lora`) profile is
of its adapters trained, the file's `lora`: the probe times the job's LoRA step, the roofline and the memory
price its passes, and `rlctl plan` takes the seconds as they are for that job.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlctl.config import Site
from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.base import check_header, read_yaml, validate
from rlctl.config.inventory import InventoryFile, given_once
from rlctl.config.job import Job
from rlctl.config.model import BuiltinModel, HfModel
from rlctl.config.pipeline import Batch
from rlctl.config.runtime import Lora
from rlctl.devices import kind_for
from rlctl.errors import ConfigError, UsageError
from rlctl.launch.backends import kind_of
from rlctl.models.catalog import BUILTIN_MODELS, ModelArch
from rlctl.planner.context import longest_request
from rlctl.profiler.analytical import analytical_site, kv_capacity_tokens, training_entry
from rlctl.profiler.probe import ProbeSpec, check_engines, check_trainer, job_context, measure_here
from rlctl.profiler.profile import GenerationEntry, ModelSpec, ProfileFile, SiteProfile, TrainingEntry
from rlctl.profiler.traincost import TrainingPasses, lora_passes, lora_refusal
from rlctl.textutil import did_you_mean, one_of

Source = Literal["analytical", "measured"]


@dataclass(frozen=True)
class ProfileRequest:
    """What a profile covers: sites, the model (and its weights, for measurements), algorithm, engines."""

    sites: dict[str, Site]
    arch: ModelArch
    model_name: str | None  # a built-in model, or None with `checkpoint`
    checkpoint: Path | None  # an HF checkpoint directory (the embedded engine and vLLM run it)
    algorithm: GrpoAlgorithm | PpoAlgorithm
    batch: Batch
    engines: tuple[str, ...]
    trainer_backend: str = "torch"  # measured: the backend whose training step is timed
    model_split: tuple[int, int] | None = None  # the job's trainer (tp, pp), when it fixes one
    lora: Lora | None = None  # the job's trainer.lora: its adapters trained, the policy frozen
    job_context: int | None = None  # the longest context the job's plan reads a decode curve at (probe.job_context)


def load_sites(paths: list[Path]) -> dict[str, Site]:
    """Sites of inventory files, validated, without resolving links: a profile needs no link, so one
    site's file (`clusters/h20-rollout.yaml`, whose link names a site in another file) is enough."""
    sites: dict[str, Site] = {}
    origin: dict[str, Path] = {}  # the file that declares each site, named where another declares it too
    given_once(paths)
    for path in paths:
        data = read_yaml(path)
        check_header(path, data, "Inventory")
        for name, site in validate(path, data, InventoryFile).sites.items():
            if name in sites:
                raise ConfigError(str(path), f"sites.{name}", f"duplicate site name; already defined in {origin[name]}")
            sites[name], origin[name] = site, path
    if not sites:
        raise ConfigError(", ".join(map(str, paths)), "sites", "no site defined; an inventory needs at least one site")
    return sites


def _pick_sites(known: dict[str, Site], names: list[str] | None) -> dict[str, Site]:
    for s in names or []:
        if s not in known:
            raise UsageError(f"--site: unknown site {s!r}; known: {one_of(known)}{did_you_mean(s, known)}")
    return {s: known[s] for s in (names or known)}


def request_from_options(
    cluster: list[Path],
    *,
    model: str,
    algorithm: str,
    sites: list[str] | None,
    engines: list[str] | None,
    trainer_backend: str | None = None,
) -> ProfileRequest:
    """`--model` is a built-in name or an HF checkpoint directory; the algorithm has no KL term; the trainer
    backend is `torch` unless given."""
    if model in BUILTIN_MODELS:
        arch, name, checkpoint = BUILTIN_MODELS[model], model, None
    elif model and _is_dir(Path(model)):  # not '': Path('') is '.', the directory rlctl runs in
        from rlctl.models.hfdir import check_hf_dir

        checkpoint = Path(model).resolve()
        arch, name = check_hf_dir(checkpoint).arch, None
    elif model and ("/" in model or Path(model).exists()):  # a path, not a name: what is wrong with it, not the names
        what = "is not a directory" if Path(model).exists() else "no such directory"
        raise UsageError(
            f"--model {model}: {what}; a Hugging Face checkpoint is a directory holding config.json and the weights",
            hint="give the checkpoint's directory, or a built-in model's name (`rlctl profile --help` lists them)",
        )
    else:
        raise UsageError(
            f"--model: unknown model {model!r}; known: {one_of(BUILTIN_MODELS)}, or a Hugging Face checkpoint "
            f"directory{did_you_mean(model, BUILTIN_MODELS)}"
        )
    algo = PpoAlgorithm(kind="ppo") if algorithm == "ppo" else GrpoAlgorithm(kind="grpo")
    return ProfileRequest(
        _pick_sites(load_sites(cluster), sites),
        arch,
        name,
        checkpoint,
        algo,
        Batch(),
        tuple(engines or ["embedded"]),
        trainer_backend or "torch",
    )


def request_from_job(
    job: Job, *, sites: list[str] | None, engines: list[str] | None, trainer_backend: str | None = None
) -> ProfileRequest:
    """The job's model, algorithm (its KL term included), rollout engine, trainer backend (unless given), LoRA,
    batch shape, sites and the longest context its plan reads a decode curve at (its task's longest request)."""
    spec = job.spec
    placed = [spec.placement.trainer.site, *(r.site for r in spec.placement.rollout)]
    known = {s: job.inventory.sites[s] for s in dict.fromkeys(placed)}
    model = spec.model
    checkpoint = Path(model.path) if isinstance(model, HfModel) else None
    name = model.name if isinstance(model, BuiltinModel) else None
    arch = model.arch
    # LoRA on adapters the model's figures do not give (a MoE's experts, described by active_params alone): `plan`'s
    # and `check`'s line, versus a profile priced on one dense MLP's adapters a layer
    if spec.trainer.lora is not None and (why := lora_refusal(arch, spec.trainer.lora)) is not None:
        raise ConfigError(str(job.path), "trainer.lora.target_modules", why)
    return ProfileRequest(
        _pick_sites(known, sites),
        arch,
        name,
        checkpoint,
        spec.algorithm,
        spec.batch,
        tuple(engines or [spec.rollout.engine]),
        trainer_backend or spec.trainer.backend,
        spec.trainer.model_split,
        spec.trainer.lora,
        job_context(*longest_request(spec.task)),
    )


def build_profile(req: ProfileRequest, *, source: Source, workdir: Path | None = None) -> ProfileFile:
    passes = lora_passes(req.algorithm, arch=req.arch, lora=req.lora)
    kind = req.algorithm.kind
    if source == "measured":
        check_measurable(req)
    specs = {s: _probe_spec(req, site) for s, site in req.sites.items()} if source == "measured" else {}
    for s, spec in specs.items():  # refuse before starting anything (vLLM, megatron: looked for here on local sites)
        here = kind_of(req.sites[s]).on_this_machine
        check_engines(spec, vllm_here=here)
        check_trainer(spec, here=here)
    out: dict[str, SiteProfile] = {}
    for s, site in req.sites.items():
        if source == "analytical":
            out[s] = analytical_site(
                req.arch,
                site.spec,
                gpus_per_node=site.gpus_per_node,
                cost_per_gpu_hour=site.gpu_cost_per_hour,
                algorithm=kind,
                passes=passes,
            )
            continue
        if kind_of(site).on_this_machine:
            result = measure_here(specs[s])
        else:
            from rlctl.profiler.remote import measure_on_site  # launch backends: only when needed

            where = workdir or Path("runs") / f"profile-{time.strftime('%Y%m%d-%H%M%S')}"
            sys.stderr.write(f"site {s}: measuring through its {site.scheduler.kind} backend (work dir {where})\n")
            result = measure_on_site(s, site, specs[s], workdir=where)
        out[s] = SiteProfile(
            gpu=site.spec.name,
            gpus_per_node=site.gpus_per_node,
            hbm_bytes=site.spec.hbm_bytes,
            cost_per_gpu_hour=site.gpu_cost_per_hour,
            generation=[GenerationEntry.model_validate(g) for g in result["generation"]],
            training=_measured_training(req, s, site, result, passes=passes),
        )
    return ProfileFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Profile",
            "source": source,
            "model": ModelSpec.of(req.arch),
            "algorithm": kind,
            "training_passes": passes,
            "lora": req.lora,
            "sites": out,
        }
    )


def _measured_training(
    req: ProfileRequest, name: str, site: Site, result: dict[str, Any], *, passes: TrainingPasses
) -> list[TrainingEntry]:
    """The measured tp = pp = 1 entry and, when the probe ran the job's megatron split, the split's measured
    entry (memory analytical); the split's cost relative to one rank in the same harness goes to stderr."""

    def entry(tp: int, pp: int, gpu_s_per_token: float) -> TrainingEntry:
        memory = training_entry(req.arch, site.spec, tp=tp, pp=pp, algorithm=req.algorithm.kind, passes=passes)
        measured = {"gpu_s_per_token": gpu_s_per_token, "backend": req.trainer_backend, "per": "padded_token"}
        return memory.model_copy(update={**measured, "pipeline_wait_included": (tp, pp) != (1, 1)})

    out = [entry(1, 1, float(result["training"]["gpu_s_per_token"]))]
    if (split := _split(req)) is not None:
        measured, single = result["training_split"]["split"], result["training_split"]["single"]
        assert (measured["tp"], measured["pp"]) == split, (measured, split)
        at_split, one = float(measured["gpu_s_per_token"]), float(single["gpu_s_per_token"])
        out.append(entry(*split, at_split))
        sys.stderr.write(
            f"site {name}: training at tp {split[0]} pp {split[1]}, measured over its {split[0] * split[1]} ranks: "
            f"{at_split:.3g} GPU-s/token (wall clock), {at_split / one:.2f}× tp 1 pp 1 in the same harness "
            f"({one:.3g}); the tp 1 pp 1 entry: {out[0].gpu_s_per_token:.3g} (one rank's thread clock)\n"
        )
    return out


def _split(req: ProfileRequest) -> tuple[int, int] | None:
    """The megatron split the probe measures over its ranks: the job's, unless it is tp 1 pp 1 or torch's."""
    if req.trainer_backend != "megatron" or req.model_split in (None, (1, 1)):
        return None
    return req.model_split


def _probe_spec(req: ProfileRequest, site: Site) -> ProbeSpec:
    return ProbeSpec(
        req.model_name,
        None if req.checkpoint is None else str(req.checkpoint),
        req.engines,
        kv_capacity_tokens(req.arch, site.spec, tp=1),
        req.algorithm,
        req.batch,
        req.trainer_backend,
        _split(req),
        kind_for(site.spec.name),  # on the site's GPUs, as its agents compute
        req.lora,
        req.job_context,
    )


def check_measurable(req: ProfileRequest) -> None:
    """UsageError if the model cannot be measured at all (a job's `kind: arch` model has no weights)."""
    if req.model_name is None and req.checkpoint is None:
        raise UsageError(
            f"model {req.arch.name!r} is described by its architecture only: nothing to run",
            hint="use --source analytical",
        )


def _is_dir(path: Path) -> bool:
    """`is_dir`, but a path this user may not look at is one line naming it."""
    try:
        return path.is_dir()
    except OSError as e:
        raise UsageError(f"--model {path}: cannot read: {e.strerror or e}") from e
