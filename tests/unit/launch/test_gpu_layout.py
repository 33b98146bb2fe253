"""GPU slices and the agent layout: disjoint CUDA_VISIBLE_DEVICES per host, refusal when a site is short,
scale-out into a free slice, the agent environment (RLCTL_PARALLEL, threads) and `launch --dry-run` (golden)."""

from __future__ import annotations

import json
import os
import sys
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.buildid import code_digest
from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.config.job import Job
from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError, LaunchError
from rlctl.launch.agentenv import ENV_CODE, ENV_CPUS, ENV_PARALLEL, ENV_VISIBLE, parallel_from_env, threads_for
from rlctl.launch.backends import record_agent, recorded_agents, write_sites
from rlctl.launch.base import AgentHandle, AgentSpec, GpuSlice, LaunchBackend
from rlctl.launch.gpus import GpuPool
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import PlannedAgent, layout
from rlctl.launch.slurm import SlurmBackend
from rlctl.launch.spawn import Spawner, agent_spec
from rlctl.ops.agentplan import planned_agents
from rlctl.ops.client import client_hello
from rlctl.ops.counts import plan_counts, resolve_job
from rlctl.ops.preflight import backends as preflight_backends
from tests.conftest import ROOT, run_cli

GOLDEN = ROOT / "tests" / "golden" / "launch"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RLCTL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with RLCTL_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; review, then refresh with RLCTL_UPDATE_GOLDEN=1"


def site(kind: str, hosts: str, gpus: int, gpu: str = "CPU") -> Site:
    sched: dict[str, Any] = {"kind": kind}
    if kind == "slurm":
        sched["partition"] = "p"
    return Site.model_validate(
        {"datacenter": "d", "scheduler": sched, "gpu": gpu, "nodes": [{"host": hosts, "gpus": gpus}]}
    )


def write_job(
    tmp_path: Path, sites: dict[str, Any], *, at: tuple[tuple[str, int], tuple[str, int]], **over: Any
) -> Job:
    """A job on an inventory of `sites`; `at` = ((trainer site, GPUs), (rollout site, GPUs)); `over` adds sections."""
    (trainer, rollout) = at
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": sites}))
    data: dict[str, Any] = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "gpus",
        "inventory": [str(inv)],
        "model": {"kind": "builtin", "name": "tiny-demo"},
        "task": {"kind": "digits"},
        "placement": {
            "trainer": {"site": trainer[0], "gpus": trainer[1]},
            "rollout": [{"site": rollout[0], "gpus": rollout[1]}],
        },
        **over,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_job(path)


def local_site(gpus: int) -> dict[str, Any]:
    return {
        "datacenter": "d",
        "scheduler": {"kind": "local"},
        "gpu": "CPU",
        "nodes": [{"host": "localhost", "gpus": gpus}],
    }


def ssh_site(hosts: str, gpus: int) -> dict[str, Any]:
    return {"datacenter": "e", "scheduler": {"kind": "ssh"}, "gpu": "CPU", "nodes": [{"host": hosts, "gpus": gpus}]}


def assert_disjoint(agents: list[PlannedAgent]) -> None:
    slices = [a.gpu_slice for a in agents if a.gpu_slice is not None]
    for a, b in combinations(slices, 2):
        assert a.host != b.host or not set(a.gpus) & set(b.gpus), (a, b)


# -- the pool -------------------------------------------------------------------------------------------
def test_pool_fills_hosts_in_the_planners_order_with_contiguous_ids() -> None:
    """Units fill one host before the next, as the planner prices them (`hostfill.rollout_host_order`: one
    weight-sync hop per host spanned); 4 one-GPU units on two free 8-GPU hosts are all on the first."""
    pool = GpuPool("h20", site("ssh", "h20-[01-02]", 8))
    assert [pool.take(1, who=f"rollout-{i}") for i in range(4)] == [GpuSlice("h20-01", (i,)) for i in range(4)]
    pool = GpuPool("h20", site("ssh", "h20-[01-02]", 8))
    got = [pool.take(2, who=f"rollout-{i}") for i in range(4)]
    assert got == [GpuSlice("h20-01", (g, g + 1)) for g in (0, 2, 4, 6)]
    pool.release(got[1])
    assert pool.take(4, who="x") == GpuSlice("h20-02", (0, 1, 2, 3))  # aligned run of 4 on the first host with 4
    assert pool.take(2, who="y") == GpuSlice("h20-01", (2, 3))  # the freed pair: h20-01 comes first
    assert pool.take(1, who="z") == GpuSlice("h20-02", (4,))


def test_pool_on_a_site_the_trainer_shares_fills_units_from_the_last_host() -> None:
    """The trainer's ranks fill the first hosts, rollout units the last ones first: what the planner's
    `rollout_hosts` assumes for a shared site."""
    pool = GpuPool("s", site("ssh", "n[1-3]", 4), shares_trainer=True)
    assert pool.take_ranks(2, who="the trainer") == [GpuSlice("n1", (0,)), GpuSlice("n1", (1,))]
    assert [pool.take(2, who=f"rollout-{i}") for i in range(4)] == [
        GpuSlice("n3", (0, 1)),
        GpuSlice("n3", (2, 3)),
        GpuSlice("n2", (0, 1)),
        GpuSlice("n2", (2, 3)),
    ]
    assert pool.take(2, who="rollout-4") == GpuSlice("n1", (2, 3))


def test_pool_ranks_place_whole_tensor_parallel_groups_per_host() -> None:
    """6-GPU hosts, 8 ranks at tp 4: ranks 0-3 and 4-7 (Megatron's tp groups: tp fastest) each on one host, not
    6 + 2 (ranks 4-7 across the network); the leftovers then hold rollout units. 12 ranks at tp 4 do not fit
    (3 groups, room for 2): the refusal names the site, the hosts' GPUs and tp."""
    pool = GpuPool("h6", site("ssh", "h-[1-2]", 6))
    ranks = pool.take_ranks(8, who="the trainer", tp=4)
    assert [(s.host, s.gpus[0]) for s in ranks] == [("h-1", g) for g in range(4)] + [("h-2", g) for g in range(4)]
    assert pool.take(2, who="rollout-0") == GpuSlice("h-1", (4, 5))
    assert pool.take_ranks(2, who="more", tp=2) == [GpuSlice("h-2", (4,)), GpuSlice("h-2", (5,))]
    with pytest.raises(
        LaunchError,
        match=r"site h6: trainer 12 GPU\(s\) at tp 4 need 3 tp group\(s\) of 4 GPUs, each on one host; its hosts "
        r"have 6, 6 GPU\(s\) \(free\): room for 2 group\(s\) \(8 GPUs\)",
    ):
        GpuPool("h6", site("ssh", "h-[1-2]", 6)).take_ranks(12, who="the trainer", tp=4)


def test_pool_ranks_fill_a_host_first_and_refusals_name_site_and_counts() -> None:
    pool = GpuPool("a", site("local", "n[1-2]", 2))
    assert pool.take_ranks(3, who="the trainer") == [GpuSlice("n1", (0,)), GpuSlice("n1", (1,)), GpuSlice("n2", (0,))]
    with pytest.raises(
        LaunchError, match=r"site a: no host has 2 free GPU\(s\) for rollout-0 \(free per host: n1: 0/2, n2: 1/2\)"
    ):
        pool.take(2, who="rollout-0")
    with pytest.raises(LaunchError, match=r"site a: the trainer needs 2 GPU\(s\), 1 free"):
        pool.take_ranks(2, who="the trainer")
    pool.claim(GpuSlice("gone-host", (0,)))  # a host the inventory no longer has: ignored
    assert pool.take(1, who="r") == GpuSlice("n2", (1,))


# -- the layout ---------------------------------------------------------------------------------------
def test_shared_local_site_gives_trainer_and_units_disjoint_slices(tmp_path: Path) -> None:
    job = write_job(tmp_path, {"local": local_site(4)}, at=(("local", 2), ("local", 2)))
    spec = resolve_job(job)
    plan = plan_counts(job, spec)
    assert plan["rollout"] == [{"site": "local", "units": 2, "tp": 1}]  # explicit counts: the job's tp (1)
    agents = planned_agents(plan, job.inventory.sites, spec, master_port=1234)
    got = [(a.name, a.gpu_slice.visible_devices if a.gpu_slice else None, env.get("RANK")) for a, env in agents]
    assert got == [("controller-0", None, None), ("trainer-0", "0", "0"), ("trainer-1", "1", "1"),
                   ("rollout-0", "2", None), ("rollout-1", "3", None)]  # fmt: skip
    assert all(env.get("MASTER_ADDR") == "127.0.0.1" for a, env in agents if a.role == "trainer")
    assert_disjoint([a for a, _ in agents])


def test_the_jobs_trainer_tensor_parallel_is_the_plans_and_reaches_every_rank(tmp_path: Path) -> None:
    trainer = {"backend": "megatron", "tensor_parallel": 2}
    job = write_job(tmp_path, {"local": local_site(6)}, at=(("local", 4), ("local", 2)), trainer=trainer)
    spec = resolve_job(job)
    plan = plan_counts(job, spec)
    assert plan["trainer"]["parallel"] == {"tp": 2, "pp": 1, "dp": 2}  # 4 GPUs = tp 2 × dp 2
    agents = planned_agents(plan, job.inventory.sites, spec, master_port=1)
    ranks = [json.loads(a.parallel.to_json()) for a, _ in agents if a.role == "trainer"]
    assert ranks == [{"role": "trainer", "tp": 2, "pp": 1, "dp": 2, "rank": r} for r in range(4)]
    odd = write_job(tmp_path, {"local": local_site(6)}, at=(("local", 3), ("local", 2)), trainer=trainer)
    with pytest.raises(ConfigError, match=r"tensor_parallel: tp 2 × pp 1 does not divide placement\.trainer\.gpus 3"):
        plan_counts(odd, resolve_job(odd))


def test_a_site_with_too_few_gpus_is_refused_before_anything_starts(tmp_path: Path) -> None:
    job = write_job(tmp_path, {"local": local_site(4)}, at=(("local", 2), ("local", 3)))
    plan = plan_counts(job, resolve_job(job))
    with pytest.raises(LaunchError) as e:
        layout(plan, job.inventory.sites, job.spec)
    assert str(e.value) == (
        "site local: trainer 2 rank(s) + 3 rollout unit(s) × tp 1 need 5 GPU(s); "
        "the inventory gives it 4 (localhost: 4)"
    )


def test_tp_units_never_straddle_hosts(tmp_path: Path) -> None:
    sites = {"local": local_site(1), "gen": ssh_site("g[1-3]", 3)}
    job = write_job(tmp_path, sites, at=(("local", 1), ("gen", 6)), rollout={"tensor_parallel": 2})
    plan = plan_counts(job, resolve_job(job))
    assert plan["rollout"] == [{"site": "gen", "units": 3, "tp": 2}]
    units = [a for a in layout(plan, job.inventory.sites, job.spec) if a.role == "rollout"]
    assert [a.gpu_slice for a in units] == [GpuSlice("g1", (0, 1)), GpuSlice("g2", (0, 1)), GpuSlice("g3", (0, 1))]
    # 9 GPUs on the site but only one free per host after 3 units: a 4th tp-2 unit cannot be placed
    plan["rollout"][0]["units"] = 4
    with pytest.raises(LaunchError, match="site gen: no host has 2 free GPU"):
        layout(plan, job.inventory.sites, job.spec)


def test_trainer_over_ssh_hosts_meets_at_rank0s_host(tmp_path: Path) -> None:
    sites = {"tr": ssh_site("t[1-2]", 2), "gen": ssh_site("g1", 1)}
    job = write_job(tmp_path, sites, at=(("tr", 4), ("gen", 1)))
    spec = resolve_job(job)
    agents = planned_agents(plan_counts(job, spec), job.inventory.sites, spec, master_port=1)
    trainers = [(a.gpu_slice, env["MASTER_ADDR"], env["RANK"]) for a, env in agents if a.role == "trainer"]
    assert trainers == [
        (GpuSlice("t1", (0,)), "t1", "0"),
        (GpuSlice("t1", (1,)), "t1", "1"),
        (GpuSlice("t2", (0,)), "t1", "2"),
        (GpuSlice("t2", (1,)), "t1", "3"),
    ]


def test_agent_environment_carries_parallel_config_gpus_and_threads(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        {"local": local_site(4)},
        at=(("local", 2), ("local", 2)),
        rollout={"threads_per_unit": 3},
        trainer={"threads_per_rank": 2},
    )
    spec = resolve_job(job)
    jd = JobDir(tmp_path / "run")
    specs = {
        a.name: agent_spec(jd, a, job.inventory.sites[a.site], env=env)
        for a, env in planned_agents(plan_counts(job, spec), job.inventory.sites, spec, master_port=1)
    }
    r1, t1, c = specs["rollout-1"].env, specs["trainer-1"].env, specs["controller-0"].env
    assert json.loads(r1[ENV_PARALLEL]) == {"role": "rollout", "tp": 1, "pp": 1, "dp": 2, "replica": 1}
    assert json.loads(t1[ENV_PARALLEL]) == {"role": "trainer", "tp": 1, "pp": 1, "dp": 2, "rank": 1}
    assert (r1["OMP_NUM_THREADS"], t1["OMP_NUM_THREADS"], c["OMP_NUM_THREADS"]) == ("3", "2", "1")
    assert specs["rollout-1"].gpu_slice == GpuSlice("localhost", (3,))
    assert specs["rollout-1"].resources.cpus_per_task == 3
    assert [threads_for(spec, r) for r in ("controller", "trainer", "rollout")] == [1, 2, 3]


@pytest.mark.parametrize("gpu", ["CPU", "H100"])
def test_only_agents_that_compute_on_gpus_see_any(tmp_path: Path, gpu: str) -> None:
    """A `gpu: CPU` site's agents and the controller computing on the CPU got no CUDA_VISIBLE_DEVICES, or their
    slots' numbers: on a GPU host they saw its GPUs (torch initialised CUDA there, taking their memory)."""
    job = write_job(tmp_path, {"local": {**local_site(4), "gpu": gpu}}, at=(("local", 2), ("local", 2)))
    spec = resolve_job(job)
    envs = {
        a.name: agent_spec(JobDir(tmp_path / "run"), a, job.inventory.sites[a.site], env=env).env
        for a, env in planned_agents(plan_counts(job, spec), job.inventory.sites, spec, master_port=1)
    }
    got = {name: (env["RLCTL_DEVICE"], env[ENV_VISIBLE]) for name, env in envs.items()}
    if gpu == "CPU":
        assert got == {name: ("cpu", "") for name in envs}
    else:
        assert got == {"controller-0": ("cpu", ""), "trainer-0": ("cuda", "0"), "trainer-1": ("cuda", "1"),
                       "rollout-0": ("cuda", "2"), "rollout-1": ("cuda", "3")}  # fmt: skip


def test_a_cpu_sites_agents_are_told_their_slots_cores(tmp_path: Path) -> None:
    """Each agent of a `gpu: CPU` local site is told the cores of its GPU slots (RLCTL_CPUS: what vLLM's workers bind
    to at tp > 1), disjoint from every other agent's of its host, versus none: each unit bound every core of the
    host. Nothing where the inventory gives no `cpus`, nor for the controller (its cores are its reward workers')."""
    sites = {"local": {**local_site(4), "nodes": [{"host": "localhost", "gpus": 4, "cpus": 16}]}}
    job = write_job(tmp_path, sites, at=(("local", 2), ("local", 2)), rollout={"tensor_parallel": 2})
    spec = resolve_job(job)
    envs = {
        a.name: agent_spec(JobDir(tmp_path / "run"), a, job.inventory.sites[a.site], env=env).env
        for a, env in planned_agents(plan_counts(job, spec), job.inventory.sites, spec, master_port=1)
    }
    cpus = {name: env.get(ENV_CPUS) for name, env in envs.items()}
    assert cpus == {"controller-0": None, "trainer-0": "0,1,2,3", "trainer-1": "4,5,6,7",
                    "rollout-0": "8,9,10,11,12,13,14,15"}  # fmt: skip
    job = write_job(tmp_path, {"local": local_site(4)}, at=(("local", 2), ("local", 2)))
    spec = resolve_job(job)
    planned = planned_agents(plan_counts(job, spec), job.inventory.sites, spec, master_port=1)
    assert not [a for a, env in planned if ENV_CPUS in agent_spec(JobDir(tmp_path), a, job.inventory.sites[a.site]).env]


def test_the_dry_run_shows_the_controller_on_the_cpu_as_it_shows_a_cpu_agent(tmp_path: Path) -> None:
    """The controller gets CUDA_VISIBLE_DEVICES="" (916b63f), but the dry run's table said '-' for it (its JSON
    null), where a CPU site's agents, told the same, said 'none': it has no GPU slice to show."""
    job = write_job(tmp_path, {"local": local_site(4)}, at=(("local", 2), ("local", 2)))
    res = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"), "-o", "json")
    assert res.exit_code == 0, res.stderr
    rows = {r["agent"]: r for r in json.loads(res.stdout)}
    assert rows["controller-0"]["cuda_visible_devices"] == ""
    res = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"))
    table = {line.split()[0]: line.split("local")[-1].split()[0] for line in res.stdout.splitlines()[3:8]}
    names = ["controller-0", "trainer-0", "trainer-1", "rollout-0", "rollout-1"]
    assert table == dict.fromkeys(names, "none"), res.stdout


def test_parallel_from_env_fills_a_slurm_rank() -> None:
    trainer = '{"role": "trainer", "tp": 2, "pp": 1, "dp": 4}'
    assert parallel_from_env({ENV_PARALLEL: trainer, "SLURM_PROCID": "5"})["rank"] == 5
    assert parallel_from_env({ENV_PARALLEL: '{"role": "trainer", "rank": 1}', "SLURM_PROCID": "5"})["rank"] == 1
    assert parallel_from_env({}) == {}
    with pytest.raises(ValueError, match="RLCTL_PARALLEL is not JSON"):
        parallel_from_env({ENV_PARALLEL: "tp=2"})


def test_launch_side_speaks_the_agents_contract() -> None:
    """The launcher names the agents' variables and client hello without importing `rlctl.agents`."""
    import msgspec

    from rlctl.agents.messages import Hello

    assert msgspec.convert(client_hello("rlctl-status"), Hello).role == "client"


# -- scale-out ----------------------------------------------------------------------------------------
class FakeBackend(LaunchBackend):
    kind = "fake"

    def __init__(self, exited: set[str]) -> None:
        self.started: list[AgentSpec] = []
        self.exited = exited

    def start(self, spec: AgentSpec) -> AgentHandle:
        self.started.append(spec)
        return AgentHandle(spec, {"pid": 1}, self.kind)

    def poll(self, handle: AgentHandle) -> int | None:
        return 0 if handle.spec.name in self.exited else None

    def stop(self, handles: list[AgentHandle], *, grace_s: float = 10.0) -> None:
        pass

    @classmethod
    def for_site(cls, site_name: str, site: Site, *, job: str, job_dir: Path) -> FakeBackend:
        return cls(set())


def scale_setup(tmp_path: Path, *, start: list[str]) -> tuple[JobDir, Spawner, FakeBackend]:
    """A prepared job (trainer 1 + 2 units on 4 local GPUs), of which the agents in `start` were launched."""
    job = write_job(tmp_path, {"local": local_site(4)}, at=(("local", 1), ("local", 2)))
    spec = resolve_job(job)
    plan = plan_counts(job, spec)
    jd = JobDir.create("gpus", explicit=tmp_path / "run")
    jd.write_job(spec, source="job.yaml")
    jd.write_json(jd.plan_json, plan)
    write_sites(jd.path, job.inventory.sites)
    for a, env in planned_agents(plan, job.inventory.sites, spec, master_port=1):
        if a.name in start:
            s = agent_spec(jd, a, job.inventory.sites[a.site], env=env)
            record_agent(jd.path, AgentHandle(s, {"pid": 1}, "fake"))
    sp = Spawner(jd, job.inventory.sites, job="gpus")
    fake = FakeBackend(set())
    sp.backends._by_site["local"] = fake
    return jd, sp, fake


def test_scale_out_takes_a_free_slice_and_records_it(tmp_path: Path) -> None:
    jd, sp, fake = scale_setup(tmp_path, start=["controller-0", "trainer-0", "rollout-0"])
    # rollout-1 is planned (GPU 2) but the launcher has not started it yet: the new unit must leave it alone
    assert sp.add_rollout("local", 5) == "rollout-5"
    assert [(s.name, s.gpu_slice) for s in fake.started] == [("rollout-5", GpuSlice("localhost", (3,)))]
    recorded = {h.spec.name: h.spec.gpu_slice for h in recorded_agents(jd.path)}
    assert recorded["rollout-5"] == GpuSlice("localhost", (3,))
    assert sorted(g for s in recorded.values() if s is not None for g in s.gpus) == [0, 1, 3]
    with pytest.raises(LaunchError, match=r"site local: no host has 1 free GPU\(s\) for rollout-6"):
        sp.add_rollout("local", 6)
    assert len(fake.started) == 1


def test_scale_out_reuses_the_slice_of_a_unit_that_exited(tmp_path: Path) -> None:
    _, sp, fake = scale_setup(tmp_path, start=["controller-0", "trainer-0", "rollout-0", "rollout-1"])
    sp.add_rollout("local", 2)  # the last free GPU
    fake.exited.add("rollout-0")  # drained and gone: its GPU 1 is free again
    sp.add_rollout("local", 3)
    started = [(s.name, s.gpu_slice.gpus if s.gpu_slice else None) for s in fake.started]
    assert started == [("rollout-2", (3,)), ("rollout-3", (1,))]
    assert json.loads(fake.started[1].env[ENV_PARALLEL])["dp"] == 3  # rollout-1, -2 and itself


def test_a_unit_started_on_a_plan_edited_since_the_launch_is_refused_naming_the_file_and_field(
    tmp_path: Path,
) -> None:
    # the Spawner reads its site's plan.json at each unit it starts: one edited during the run was a KeyError in the
    # spawn thread (which the Scaler catches only as RlctlError: the start never reported), versus JobDir's line
    jd, sp, fake = scale_setup(tmp_path, start=["controller-0", "trainer-0", "rollout-0"])
    plan = json.loads(jd.plan_json.read_text())
    jd.write_json(jd.plan_json, {**plan, "trainer": {k: v for k, v in plan["trainer"].items() if k != "site"}})
    with pytest.raises(LaunchError) as refused:
        sp.add_rollout("local", 5)
    assert str(refused.value) == f"{jd.plan_json}: trainer.site: None is not a site name"
    assert fake.started == []


def test_a_unit_is_not_started_on_a_plan_whose_trainer_has_no_ranks(tmp_path: Path) -> None:
    # the Spawner reads the launch's shape (`JobDir.read_plan`), not the controller Placement's (`as_placed`, where
    # ranks are 1 when not given): it lays every agent out again from the trainer's ranks
    jd, sp, fake = scale_setup(tmp_path, start=["controller-0", "trainer-0", "rollout-0"])
    plan = json.loads(jd.plan_json.read_text())
    jd.write_json(jd.plan_json, {**plan, "trainer": {k: v for k, v in plan["trainer"].items() if k != "ranks"}})
    with pytest.raises(LaunchError) as refused:
        sp.add_rollout("local", 5)
    assert str(refused.value) == f"{jd.plan_json}: trainer.ranks: None is not a count of 1 or more"
    assert fake.started == []


# -- launch --dry-run (golden) ------------------------------------------------------------------------
def test_dry_run_on_gpu_sites_matches_golden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURM trainer on 8-GPU H800 nodes (GPUs per task) + SSH rollout on H20 hosts with tp=2 slices; what
    `rlctl check` refuses in this planning-scale job comes first, marked."""
    # the golden is the same with or without the optional extras installed (vLLM runs on the SSH site: not asked here)
    monkeypatch.setattr(preflight_backends, "megatron_available", lambda: None)  # the optional extras installed
    # and with or without the key the shipped h20 site logs in with (~/.ssh/id_ed25519) in this machine's home
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("")
    monkeypatch.setenv("HOME", str(home))
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "gpu-demo",
        "inventory": [str(ROOT / "clusters" / "h800-trainer.yaml"), str(ROOT / "clusters" / "h20-rollout.yaml")],
        "model": {"kind": "builtin", "name": "qwen2.5-7b"},
        "task": {"kind": "lengths", "prompt_tokens": 512, "median_output_tokens": 2750, "max_output_tokens": 20000},
        "iterations": 10,
        "batch": {"prompts_per_iteration": 128, "samples_per_prompt": 8},
        "placement": {"trainer": {"site": "h800", "gpus": 16}, "rollout": [{"site": "h20", "gpus": 12}]},
        "rollout": {"engine": "vllm", "tensor_parallel": 2, "threads_per_unit": 4},
        "trainer": {"backend": "megatron", "threads_per_rank": 8},
    }
    path = tmp_path / "gpu-demo.yaml"
    path.write_text(yaml.safe_dump(job))
    res = run_cli("launch", str(path), "--dry-run", "--job-dir", "/shared/runs/gpu-demo")
    assert res.exit_code == 0, res.stderr
    text = res.stdout.replace(sys.executable, "python3")  # SLURM sites run this interpreter (shared FS)
    assert f"export {ENV_CODE}={code_digest()}\n" in text  # every agent's, the code of this checkout: not golden
    check_golden("dry_run_gpu.txt", text.replace(code_digest(), "CODE"))
    head = text.split("\n# 8 agents;", 1)[0].splitlines()
    assert head[0].startswith("# would be refused by `rlctl check` (3)")  # megatron's planned tp 2: not refused
    assert [line.split(":", 1)[0] for line in head[1:]] == ["#   model", "#   task", "#   trainer.backend"]
    assert "#SBATCH --gpus-per-task=1" in text and "export CUDA_VISIBLE_DEVICES=2,3" in text
    assert "gres" not in text and "--gpus-per-node" not in text


def test_dry_run_on_cpu_slurm_site_requests_no_gpu(tmp_path: Path) -> None:
    """The test clusters say `gpu: CPU`: a GPU request would leave their jobs pending forever."""
    sites = {"train": {**local_site(2), "scheduler": {"kind": "slurm", "partition": "sitea", "submit_host": "login"},
                       "nodes": [{"host": "sitea-[1-2]", "gpus": 2}]},
             "gen": ssh_site("g1", 2)}  # fmt: skip
    job = write_job(tmp_path, sites, at=(("train", 2), ("gen", 2)))
    res = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"), "-o", "json")
    assert res.exit_code == 0, res.stderr
    rows = {r["agent"]: r for r in json.loads(res.stdout)}
    assert "--gpus" not in rows["trainer-0"]["script"] and "--gres" not in rows["trainer-0"]["script"]
    assert rows["trainer-0"]["gpu_request"] == "1 node(s) × 2 task(s), no GPU request, 1 cpu(s)/task"
    assert (rows["rollout-1"]["host"], rows["rollout-1"]["cuda_visible_devices"]) == ("g1", "")  # no GPU: CPU


def test_dry_run_shows_the_slurm_site_s_own_options_in_every_agent_s_script(tmp_path: Path) -> None:
    sched = {
        "kind": "slurm",
        "partition": "sitea",
        "submit_host": "login",
        "constraint": "cpu&ib",
        "exclusive": True,
        "reservation": "rl",
        "sbatch_options": {"comment": "rl run", "mail-type": "END"},
    }
    sites = {"train": {**local_site(2), "scheduler": sched, "nodes": [{"host": "sitea-[1-2]", "gpus": 2}]},
             "gen": ssh_site("g1", 2)}  # fmt: skip
    job = write_job(tmp_path, sites, at=(("train", 2), ("gen", 2)))
    res = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"), "-o", "json")
    assert res.exit_code == 0, res.stderr
    scripts = {r["agent"]: r["script"] for r in json.loads(res.stdout) if r["site"] == "train"}
    assert sorted(scripts) == ["controller-0", "trainer-0"], scripts
    for script in scripts.values():
        assert (
            "#SBATCH --constraint='cpu&ib'\n#SBATCH --reservation=rl\n#SBATCH --exclusive\n"
            "#SBATCH --comment='rl run'\n#SBATCH --mail-type=END\nset -u\n"
        ) in script


@pytest.mark.parametrize(("workers", "every", "node_cpus", "cores"), [(4, 0, None, 5), (4, 10, None, 6), (4, 0, 3, 3)])
def test_a_slurm_controller_asks_a_core_for_each_of_its_reward_workers(
    tmp_path: Path, workers: int, every: int, node_cpus: int | None, cores: int
) -> None:
    """The controller scores the samples in `task.reward_workers` processes (and the held-out evaluations' one during
    the run): its sbatch asked for --cpus-per-task=1, so SLURM confined it and every worker to one core. Its own
    threads stay 1 (OMP_NUM_THREADS); a node's cores bound the request."""
    nodes = [{"host": "sitea-[1-2]", "gpus": 2, **({"cpus": node_cpus} if node_cpus else {})}]
    sites = {"train": {**local_site(2), "scheduler": {"kind": "slurm", "partition": "sitea", "submit_host": "login"},
                       "nodes": nodes},
             "gen": ssh_site("g1", 2)}  # fmt: skip
    job = write_job(tmp_path, sites, at=(("train", 2), ("gen", 2)))
    spec = resolve_job(job)
    plan = plan_counts(job, spec)
    task = DatasetTask.model_construct(kind="dataset", path="d.jsonl", reward_workers=workers)
    evaluation = spec.evaluation.model_copy(update={"heldout_prompts": 8, "every_iterations": every})
    spec = spec.model_copy(update={"task": task, "evaluation": evaluation})
    agents = {a.name: (a, env) for a, env in planned_agents(plan, job.inventory.sites, spec, master_port=1)}
    a, env = agents["controller-0"]
    train = job.inventory.sites["train"]
    script = SlurmBackend.for_site("train", train, job="j", job_dir=tmp_path / "run").render_sbatch(
        agent_spec(JobDir(tmp_path / "run"), a, train, env=env)
    )
    assert f"#SBATCH --cpus-per-task={cores}\n" in script
    assert "export OMP_NUM_THREADS=1\n" in script


@pytest.mark.parametrize(
    ("node", "mem_per_cpu"),
    [
        # 8 GPUs, 64 cores, 512 GB: 8 GB (7629 MiB) a core, as a rank at its default 8 threads gets; the controller's
        # 5 cores (4 reward workers) ask 5 × that
        ({"gpus": 8, "cpus": 64, "memory_gb": 512}, 7629),
        # no cpus, so no core's share: one slot's 5 GB in all (each of 5 cores asked a slot's, the whole 10 GB node)
        ({"gpus": 2, "memory_gb": 10}, 953),
        ({"gpus": 2, "cpus": 16}, None),  # no memory_gb: no memory request, as for the agents
    ],
)
def test_a_slurm_controller_asks_a_bounded_share_of_a_node_s_memory(
    tmp_path: Path, node: dict[str, int], mem_per_cpu: int | None
) -> None:
    """The controller's sbatch asked for no memory, where the agents' ask --mem-per-cpu: on a cluster without
    DefMemPerCPU SLURM gives such a job the whole node's memory, and a GPU job waits for that node while the
    controller runs. It now asks each of its cores' share of a node's memory, at most a node's."""
    sites = {"train": {**local_site(2), "scheduler": {"kind": "slurm", "partition": "sitea", "submit_host": "login"},
                       "nodes": [{"host": "sitea-[1-2]", **node}]},
             "gen": ssh_site("g1", 2)}  # fmt: skip
    job = write_job(tmp_path, sites, at=(("train", 2), ("gen", 2)))
    spec = resolve_job(job)
    task = DatasetTask.model_construct(kind="dataset", path="d.jsonl", reward_workers=4)
    spec = spec.model_copy(update={"task": task})
    agents = {
        a.name: (a, env) for a, env in planned_agents(plan_counts(job, spec), job.inventory.sites, spec, master_port=1)
    }
    a, env = agents["controller-0"]
    train = job.inventory.sites["train"]
    script = SlurmBackend.for_site("train", train, job="j", job_dir=tmp_path / "run").render_sbatch(
        agent_spec(JobDir(tmp_path / "run"), a, train, env=env)
    )
    mem = [line for line in script.splitlines() if line.startswith("#SBATCH --mem")]
    assert mem == ([f"#SBATCH --mem-per-cpu={mem_per_cpu}"] if mem_per_cpu else []), mem
    assert "#SBATCH --cpus-per-task=5\n" in script


def test_scale_out_on_a_shared_site_continues_the_planners_fill_order(tmp_path: Path) -> None:
    """Trainer ranks on n1, the planned units from the last host (n3), a unit `scale` adds next on n3, then n2: the
    hosts the planner's `room_for_unit` and weight-sync hops count, in the order `GpuPool.take` and layout() share."""
    three = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "n[1-3]", "gpus": 2}]}
    job = write_job(tmp_path, {"local": three}, at=(("local", 2), ("local", 1)))
    spec = resolve_job(job)
    plan = plan_counts(job, spec)
    agents = layout(plan, job.inventory.sites, spec)
    assert [(a.name, a.gpu_slice) for a in agents if a.gpu_slice] == [
        ("trainer-0", GpuSlice("n1", (0,))),
        ("trainer-1", GpuSlice("n1", (1,))),
        ("rollout-0", GpuSlice("n3", (0,))),
    ]
    jd = JobDir.create("gpus", explicit=tmp_path / "run")
    jd.write_job(spec, source="job.yaml")
    jd.write_json(jd.plan_json, plan)
    write_sites(jd.path, job.inventory.sites)
    for a, env in planned_agents(plan, job.inventory.sites, spec, master_port=1):
        record_agent(jd.path, AgentHandle(agent_spec(jd, a, job.inventory.sites[a.site], env=env), {"pid": 1}, "fake"))
    sp = Spawner(jd, job.inventory.sites, job="gpus")
    sp.backends._by_site["local"] = fake = FakeBackend(set())
    sp.add_rollout("local", 1)
    sp.add_rollout("local", 2)
    assert [(s.name, s.gpu_slice) for s in fake.started] == [
        ("rollout-1", GpuSlice("n3", (1,))),
        ("rollout-2", GpuSlice("n2", (0,))),
    ]


def test_dry_run_of_a_slurm_trainer_asks_as_many_ranks_on_each_node_whole_tp_groups(tmp_path: Path) -> None:
    """12 ranks at tp 4 on 8-GPU SLURM nodes: 3 nodes × 4 (exact --ntasks-per-node; SLURM's block distribution puts
    ranks 0-3, 4-7, 8-11 each on one node), not 2 × 6 with ranks 4-7 on both nodes."""
    sites = {"train": {**local_site(8), "scheduler": {"kind": "slurm", "partition": "sitea", "submit_host": "login"},
                       "nodes": [{"host": "sitea-[1-4]", "gpus": 8}]},
             "gen": ssh_site("g1", 2)}  # fmt: skip
    job = write_job(
        tmp_path, sites, at=(("train", 12), ("gen", 2)), trainer={"backend": "megatron", "tensor_parallel": 4}
    )
    res = run_cli("launch", str(job.path), "--dry-run", "--job-dir", str(tmp_path / "run"), "-o", "json")
    assert res.exit_code == 0, res.stderr
    rows = {r["agent"]: r for r in json.loads(res.stdout)}
    assert rows["trainer-0"]["gpu_request"] == "3 node(s) × 4 task(s), no GPU request, 1 cpu(s)/task"
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks=12\n#SBATCH --ntasks-per-node=4\n" in rows["trainer-0"]["script"]


def test_layout_puts_units_first_on_hosts_too_small_for_a_trainer_group(tmp_path: Path) -> None:
    """Hosts of 2, 8, 2, 8 GPUs shared by 8 ranks at tp 4 (on the 8-GPU host t-2) and 4 one-GPU units: the 2-GPU
    hosts are the rollout's first, from the last (t-3, then t-1), as the planner prices them
    (`hostfill.rollout_host_order` with the job's trainer.tensor_parallel), not t-4 first."""
    nodes = [{"host": f"t-{i}", "gpus": g} for i, g in enumerate([2, 8, 2, 8], 1)]
    sites = {"t": {**ssh_site("t-1", 2), "nodes": nodes}}
    job = write_job(
        tmp_path,
        sites,
        at=(("t", 8), ("t", 4)),
        trainer={"backend": "megatron", "tensor_parallel": 4},
        rollout={"tensor_parallel": 1},
    )
    spec = resolve_job(job)
    agents = layout(plan_counts(job, spec), job.inventory.sites, spec)
    assert {a.gpu_slice.host for a in agents if a.role == "trainer" and a.gpu_slice} == {"t-2"}
    assert [a.gpu_slice.host for a in agents if a.role == "rollout" and a.gpu_slice] == ["t-3", "t-3", "t-1", "t-1"]
    assert_disjoint(agents)


def test_layout_orders_the_rollout_by_the_plans_trainer_tp_where_the_job_leaves_it_out(tmp_path: Path) -> None:
    """The same hosts of 2, 8, 2, 8 GPUs with the job's trainer.tensor_parallel unset and a plan whose trainer runs
    tp 4 (the planner chose it, pricing the 2-GPU hosts as the rollout's: `inputs.trainer_tp_classes`): the pool
    follows the plan's tp, t-3 and t-1 first, not tp 1's order from t-4."""
    nodes = [{"host": f"t-{i}", "gpus": g} for i, g in enumerate([2, 8, 2, 8], 1)]
    sites = {"t": {**ssh_site("t-1", 2), "nodes": nodes}}
    job = write_job(tmp_path, sites, at=(("t", 8), ("t", 4)), rollout={"tensor_parallel": 1})
    spec = resolve_job(job)
    assert spec.trainer.model_split is None
    plan = {
        "trainer": {"site": "t", "ranks": 8, "parallel": {"tp": 4, "pp": 1, "dp": 2}},
        "rollout": [{"site": "t", "units": 4, "tp": 1}],
        "controller_site": "t",
    }
    agents = layout(plan, job.inventory.sites, spec)
    assert {a.gpu_slice.host for a in agents if a.role == "trainer" and a.gpu_slice} == {"t-2"}
    assert [a.gpu_slice.host for a in agents if a.role == "rollout" and a.gpu_slice] == ["t-3", "t-3", "t-1", "t-1"]
    assert_disjoint(agents)


def test_the_dry_run_s_staging_table_heads_every_column() -> None:
    """Its last column (the staging's checks, or 'no copy' in the operator's job dir) had no header."""
    import re

    from rlctl.commands.launching.views import staging_table

    note = "the operator's job dir: no copy"
    table = staging_table([{"site": "s", "hosts": ["h"], "job_dir": "~/j", "files": [], "note": note}])
    title, head, rule = table.splitlines()[:3]
    assert title == "Staging"
    columns = [head[m.start() : m.end()].strip() for m in re.finditer(r"-+", rule)]
    assert columns == ["site", "hosts", "job dir on the site", "staged there", "how"], columns
