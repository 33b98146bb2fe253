"""The FSDP2 a plan prices a trainer layout with is the FSDP2 the launch runs at it (`costs.trainer_layout`, one
decision for both), and the search simulates each candidate with its own layout's once-a-step reduction."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from rlctl.config import load_job
from rlctl.config.job import Job
from rlctl.errors import ConfigError
from rlctl.planner.costs import Sharding
from rlctl.planner.inputs import profile_for, train_cost
from rlctl.planner.placement import trainer_curve
from rlctl.planner.plan import make_plan, train_workload
from rlctl.planner.split import trainer_sharding
from rlctl.profiler.analytical import analytical_profile
from rlctl.profiler.profile import ProfileFile
from rlctl.profiler.traincost import TrainingPasses
from tests.unit.ops.test_preflight import GPU_CLUSTERS, load
from tests.unit.planner.test_planner_plan import OPTS, write_job

MODELS = ("qwen3-4b", "qwen2.5-7b", "qwen2.5-32b")
GPUS = ("L40S", "H800", "H200")  # 48, 80, 141 GB
DPS = (1, 2, 8, 16)


def torch_job(tmp_path: Path, *, model: str, gpu: str, shard: str, dp: int, kl_coef: float) -> Job:
    """A torch trainer of `dp` ranks on `gpu`s (the h800 site's GPUs replaced), rollout on 12 H20s; rows of up to
    4,512 tokens, one a rank a cut (its token budget), recomputed (activation checkpointing): a rank holds its cut's
    activations (`profiler.actmem`), and with 20,512-token rows no replica fits unsharded on any of the GPUs."""
    job = load(
        tmp_path,
        inventory=GPU_CLUSTERS,
        model={"kind": "builtin", "name": model},
        algorithm={"kind": "grpo", "kl_coef": kl_coef},
        task={"kind": "lengths", "prompt_tokens": 512, "median_output_tokens": 2750, "max_output_tokens": 4000},
        batch={"prompts_per_iteration": 128, "samples_per_prompt": 8, "train_micro_batch_tokens": 4512},
        placement={"trainer": {"site": "h800", "gpus": dp}, "rollout": [{"site": "h20", "gpus": 12}]},
        rollout={"engine": "vllm", "tensor_parallel": 2},
        trainer={"backend": "torch", "shard": shard, "activation_checkpointing": True},
    )
    sites = job.inventory.sites | {"h800": job.inventory.sites["h800"].model_copy(update={"gpu": gpu})}
    job.inventory.sites = sites
    return job


def priced(job: Job, profile: ProfileFile | None, dp: int) -> Sharding | None:
    """The FSDP2 the planner priced the trainer's `dp` ranks with (its trainer curve's configuration); None where
    no layout of them fits."""
    prof = profile_for(job, profile)
    tw = train_workload(job, prof.model.arch, train_cost(job, prof, TrainingPasses()), tokens=1e6)
    try:
        tcurve, slots = trainer_curve(job, prof, tw, t_fixed=dp, profile_file="profile", order_tp=1)
    except ConfigError:  # no layout of the ranks fits (placement.trainer.gpus refused)
        return None
    assert slots is not None
    cfg = tcurve.configs[slots]
    assert cfg is not None and cfg.dp == dp
    return cfg.layout


@pytest.mark.parametrize("profiled", ["analytical", "file without the job's reference"])
def test_the_fsdp2_a_layout_is_priced_with_is_what_the_launch_runs_there(tmp_path: Path, profiled: str) -> None:
    """Over shard modes, models, GPU memories and dp, the trainer configuration the planner prices (its FSDP2 and
    once-a-step reduction) is the one `rlctl launch` writes (`split.trainer_sharding`, `ops.counts.plan_counts`).
    A GRPO job with a KL term holds the reference policy beside the replica; a profile file taken without it priced
    the smaller replica's memory, so a layout unsharded where the launch shards it (a 4B on H800s: 66 GB a replica
    priced whole within 72 GB usable, 82 GB with the reference, which the launch shards over 2 ranks), or reducing
    once a step where the launch reduces every cut (a 4B over 8 L40S with its cut's 10.0 GB of activations: 41.3 GB
    a rank, 43.3 GB with the reference, 43.2 GB usable). Both decisions count a rank's activations alike."""
    seen: set[tuple[bool, bool]] = set()
    for shard, model, gpu in itertools.product(("auto", "fsdp", "none"), MODELS, GPUS):
        profile = None
        for dp in DPS:
            job = torch_job(tmp_path, model=model, gpu=gpu, shard=shard, dp=dp, kl_coef=0.05)
            if profiled != "analytical" and profile is None:
                specs = {s: (x.spec, x.gpus_per_node, x.gpu_cost_per_hour) for s, x in job.inventory.sites.items()}
                profile = analytical_profile(job.spec.model.arch, specs, algorithm="grpo", passes=TrainingPasses())
                assert specs["h800"][0].name == gpu and not profile.training_passes.reference
            layout = priced(job, profile, dp)
            if layout is None:
                continue
            launched = trainer_sharding(job, tp=1, pp=1, dp=dp)
            assert layout.config() == launched, (shard, model, gpu, dp)
            seen.add(layout)
    # the grid reaches every decision: unsharded, FSDP2 a cut, FSDP2 once a step
    assert seen == {Sharding(False, False), Sharding(True, False), Sharding(True, True)}


def test_the_search_simulates_each_candidate_as_the_plan_simulates_its_choice(tmp_path: Path) -> None:
    """An async 7B job on one H800 site, 4 rows a rank a cut: the trainer's FSDP2 reduces once a step, so its learner
    holds a step's last cut to the flush (`reduce_per_step`). The split search simulated its candidates with every
    cut trained as it filled, the plan its choice with the last one held: it chose 16 rollout GPUs by 17.51 s, which
    the plan then priced at 17.61 s, where 24 run at 17.50 s. Each candidate is simulated with its own trainer
    layout's reduction and dp (the learner's budgets are a rank's) now, so the chosen one's figure is the plan's.
    (Rows of up to 1,512 tokens: a rank's share of a cut, 4 rows, keeps its recomputed activations small enough for
    the step's gradients beside them, `profiler.actmem`; 32 rows a rank, 48,384 tokens, fit at no count.)"""
    path = write_job(tmp_path, rollout=[{"site": "trn"}], links=[], rule="simulated")
    job = yaml.safe_load(path.read_text())
    job["batch"] |= {"train_micro_batch_samples": 4, "train_micro_batch_tokens": None}
    job["task"]["max_output_tokens"] = 1000
    path.write_text(yaml.safe_dump(job))
    plan = make_plan(load_job(path), options=OPTS)
    (trainer,) = [a for a in plan["allocation"] if a["role"] == "trainer"]
    assert trainer["config"] == {"tp": 1, "pp": 1, "dp": 8, "fsdp": True, "reduce_per_step": True}
    search = plan["search"]
    (chosen,) = [e for e in search["evaluated"] if e["rollout_gpus"] == search["chosen"]]
    assert chosen["trainer_gpus"] == trainer["gpus_used"]
    assert chosen["iteration_s"] == pytest.approx(plan["predicted"]["iteration_s"]["async"], rel=1e-12)
    best = min(e["iteration_s"] for e in search["evaluated"])
    assert plan["predicted"]["iteration_s"]["async"] == pytest.approx(best)
