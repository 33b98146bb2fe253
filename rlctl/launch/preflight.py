"""Can `launch` start this job? Every job field is either read by the runtime or refused here, with one
line naming the field and what to do: `rlctl check JOB` and `rlctl launch JOB` both run it, so a check
that passes means launch can start the job on the sites it names.

What is refused here (and why) is what the runtime cannot honour on this installation: an engine or
trainer backend whose package is missing or that the agents do not run, a model or task that only
describes a workload for planning, a tracker whose package is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from rlctl.config.job import DatasetTask, Job
from rlctl.engines.factory import vllm_available
from rlctl.errors import ConfigError
from rlctl.launch.sitefs import is_remote
from rlctl.rl.dataset import check_task
from rlctl.tracking import check_tracking
from rlctl.trainers.base import megatron_available

RUNNABLE_BUILTIN = "tiny-demo"  # the one built-in model with weights (rlctl.engines.model.TinyGPT)


@dataclass(frozen=True)
class Problem:
    field: str
    message: str
    hint: str | None = None


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def problems(job: Job) -> list[Problem]:
    """Every reason the runtime cannot run `job` as written, first the most fundamental."""
    spec = job.spec
    out: list[Problem] = []
    if spec.model.kind == "arch":
        out.append(
            Problem(
                "model",
                f"kind 'arch' ({spec.model.name}) describes a model for planning only; launch needs weights: "
                "kind 'builtin' or kind 'hf' with a local Hugging Face directory",
            )
        )
    if spec.model.kind == "builtin" and spec.model.name != RUNNABLE_BUILTIN:
        out.append(
            Problem(
                "model",
                f"built-in {spec.model.name!r} is an architecture for planning (no weights here); launch runs "
                f"{RUNNABLE_BUILTIN!r} or kind 'hf' with a local Hugging Face directory",
            )
        )
    if spec.task.kind == "lengths":
        out.append(
            Problem(
                "task",
                "kind 'lengths' describes a workload for planning only; launch needs prompts: "
                "kind 'digits' or kind 'dataset'",
            )
        )
    if spec.rollout.engine == "vllm" and (hint := vllm_available()) is not None:
        out.append(Problem("rollout.engine", "'vllm' needs the vLLM package, which is not installed", hint=hint))
    tp = spec.rollout.tensor_parallel or 1
    if spec.rollout.engine == "embedded" and tp > 1:
        out.append(
            Problem(
                "rollout.tensor_parallel",
                f"{tp}: the embedded engine runs one device per unit; use 1, or engine 'vllm' for tensor parallelism",
            )
        )
    if spec.trainer.backend == "megatron":
        out += _megatron(job)
    out += _trainer_split(job)
    if spec.algorithm.kind == "ppo" and spec.placement.trainer.gpus not in ("auto", 1):
        out.append(
            Problem(
                "placement.trainer.gpus",
                f"{spec.placement.trainer.gpus}: the PPO learner trains on one rank; use 1 or algorithm 'grpo'",
            )
        )
    if spec.transport.streams != 1:
        out.append(
            Problem(
                "transport.streams",
                f"{spec.transport.streams}: the tensor RPC uses one stream per peer; valid: 1",
            )
        )
    if spec.transport.kind == "ucx" and _missing("ucxx"):
        out.append(
            Problem("transport.kind", "'ucx' needs the ucxx package, which is not installed", "pip install rlctl[ucx]")
        )
    if spec.evaluation.heldout_prompts:
        out += _evaluation(job)
    task = spec.task
    if isinstance(task, DatasetTask):
        if spec.model.kind != "hf":
            out.append(
                Problem("task", "kind 'dataset' needs model kind 'hf': its tokenizer turns the prompts into tokens")
            )
        if spec.rollout.dispatch == "oracle":
            out.append(
                Problem("rollout.dispatch", "'oracle' needs the true output lengths, which a dataset does not have")
            )
        if spec.warmup.sft_steps:
            out.append(Problem("warmup.sft_steps", "the SFT warm-up is the built-in digits model's; use 0"))
        out += _raised("task", lambda: check_task(task, job_file=job.path))
    out += _raised("tracking", lambda: check_tracking(spec.tracking, source=str(job.path)))
    return out


def _megatron(job: Job) -> list[Problem]:
    """What the `megatron` trainer backend cannot do here: it runs on CPU sites, GRPO, pp 1 (tp: `_trainer_split`,
    rlctl.trainers.megatron)."""
    spec, out = job.spec, []
    if (hint := megatron_available()) is not None:
        out.append(Problem("trainer.backend", "'megatron' needs megatron-core, which is not installed", hint=hint))
    site = spec.placement.trainer.site
    gpu = job.inventory.sites[site].spec.name
    if gpu != "CPU":
        out.append(
            Problem(
                "trainer.backend",
                f"'megatron' runs on CPU here; site {site!r} has {gpu} GPUs, and the GPU path (CUDA tensors, "
                "megatron's DDP, tp/pp ranks) is not built: use 'torch', or a site whose gpu is CPU",
            )
        )
    if spec.algorithm.kind == "ppo":
        out.append(
            Problem("trainer.backend", "'megatron' trains GRPO here (PPO's critic is built on TinyGPT); use 'torch'")
        )
    return out


# --- trainer.tensor_parallel / trainer.pipeline_parallel -------------------------------------------------
# megatron runs tensor parallel (pp 1) on CPU sites: a tp group's ranks train shards of one replica
# (rlctl.agents.learner, rlctl.trainers.megatron); the `torch` backend holds a whole replica per rank.


def _trainer_split(job: Job) -> list[Problem]:
    """The model split the job asks for that no trainer backend runs here, one line per field."""
    spec, out = job.spec, list[Problem]()
    if (split := spec.trainer.model_split) is None:
        return out
    tp, pp = split
    backend = spec.trainer.backend
    if pp > 1:
        out.append(
            Problem(
                "trainer.pipeline_parallel",
                f"{pp}: no trainer backend runs pipeline stages here (megatron's schedules are not wired in); use 1",
            )
        )
    if tp > 1 and backend != "megatron":
        out.append(
            Problem(
                "trainer.tensor_parallel",
                f"{tp}: the {backend!r} trainer has no model parallelism (each rank holds a whole replica); "
                "use 1, or trainer.backend 'megatron'",
            )
        )
    if tp > 1 and backend == "megatron":
        arch = spec.model.arch
        for what, n in (
            ("num_attention_heads", arch.heads),
            ("num_key_value_heads", arch.kv_heads),
            ("intermediate_size", arch.intermediate),
            ("vocab_size", arch.vocab),
        ):
            if n % tp:
                out.append(
                    Problem("trainer.tensor_parallel", f"{tp} does not divide the model's {what} {n}; use a divisor")
                )
                break
    gpus = spec.placement.trainer.gpus
    if gpus != "auto" and gpus % (tp * pp):
        out.append(
            Problem(
                "trainer.tensor_parallel",
                f"tp {tp} × pp {pp} does not divide placement.trainer.gpus {gpus} (GPUs = tp × pp × dp)",
            )
        )
    return out


def _evaluation(job: Job) -> list[Problem]:
    """The held-out evaluation decodes digits prompts and reads the final checkpoint where launch runs
    (rlctl.launch.evaluation)."""
    spec, out = job.spec, []
    if spec.task.kind != "digits":
        out.append(
            Problem(
                "evaluation.heldout_prompts",
                f"held-out prompts exist for task kind 'digits' only, not {spec.task.kind!r}; use 0",
            )
        )
    site = spec.placement.trainer.site
    if site in job.inventory.sites and is_remote(job.inventory.sites[site]):
        out.append(
            Problem(
                "evaluation.heldout_prompts",
                f"launch evaluates the final checkpoint where it runs, and site {site!r} (the trainer's) is "
                "reached over SSH; use 0, or a trainer site on this machine",
            )
        )
    return out


def _raised(field: str, check: Callable[[], None]) -> list[Problem]:
    """A check that raises ConfigError, as a Problem (its message already names the file and field)."""
    try:
        check()
    except ConfigError as e:
        return [Problem(e.field or field, str(e).removeprefix(f"{e.file}: ").removeprefix(f"{e.field}: "), e.hint)]
    return []


def preflight(job: Job) -> None:
    """Raise a ConfigError (exit 2) naming the first problem, and how many more there are."""
    found = problems(job)
    if not found:
        return
    first = found[0]
    more = f" (and {len(found) - 1} more: {', '.join(p.field for p in found[1:])})" if len(found) > 1 else ""
    raise ConfigError(str(job.path), first.field, first.message + more, hint=first.hint)
