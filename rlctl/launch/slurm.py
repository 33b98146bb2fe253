"""The `slurm` launch backend: one SLURM job per agent spec (a role's ranks are the job's tasks).

Two ways in, chosen by the site's `submit_host`:

    submit_host unset ─▶ submitit (we are on a login node): SlurmExecutor + CommandFunction(argv)
    submit_host set   ─▶ our own sbatch script, streamed over SSH to `sbatch --parsable` there

Both scripts export the spec's environment, ask for the spec's resources (its tasks on as few nodes
as fit, `--cpus-per-task` = its threads, GPUs per the site's `gpu_request`: `--gpus-per-task=N`,
`--gres=gpu:N`, or none on `gpu: CPU` sites) with the site's own options (`site_options`: its constraint,
reservation, exclusive and sbatch_options), start every rank with `srun` (rank = $SLURM_PROCID,
world = $SLURM_NTASKS) and ask SLURM for a TERM `grace_s` before the time limit. `render()` returns
the exact script without submitting (`rlctl launch --dry-run`).

Status never depends on accounting alone:  squeue ─(job left the queue)─▶ scontrol show job
─(purged after MinJobAge)─▶ sacct ─▶ unknown.

Stop (graceful, then forced, then verified):

    scancel --signal=TERM ID ─▶ wait ≤ grace_s ─▶ scancel ID ─▶ wait until it left squeue
    (TERM goes to the job's steps = the agents. Not `--full`: srun takes a TERM as "kill the step
     now" and SIGKILLs the agents; measured on slurm 22.05. The batch shell forwards a TERM it gets
     at the time limit the same way.)
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlctl.config.hostfill import PLACEMENT_HINT, placement_error, slurm_layout
from rlctl.config.hosts import expand_hostlist
from rlctl.config.inventory import Site
from rlctl.config.schedulers import SlurmScheduler
from rlctl.errors import LaunchError
from rlctl.launch.base import DEFAULT_WORKDIR, AgentHandle, AgentSpec, LaunchBackend, Resources, site_setup
from rlctl.launch.localrunner import LocalRunner
from rlctl.launch.remote import CommandResult, RemoteState, Runner, SshTarget, setup_first
from rlctl.launch.sshrunner import SshRunner

log = logging.getLogger(__name__)

_STATES = {
    "PENDING": RemoteState.PENDING,
    "CONFIGURING": RemoteState.PENDING,
    "REQUEUED": RemoteState.PENDING,
    "REQUEUE_HOLD": RemoteState.PENDING,
    "REQUEUE_FED": RemoteState.PENDING,
    "RESV_DEL_HOLD": RemoteState.PENDING,
    "RUNNING": RemoteState.RUNNING,
    "SIGNALING": RemoteState.RUNNING,
    "RESIZING": RemoteState.RUNNING,
    "SUSPENDED": RemoteState.RUNNING,
    "STOPPED": RemoteState.RUNNING,
    "COMPLETING": RemoteState.COMPLETING,
    "STAGE_OUT": RemoteState.COMPLETING,
    "COMPLETED": RemoteState.FINISHED,
    "FAILED": RemoteState.FAILED,
    "TIMEOUT": RemoteState.FAILED,
    "NODE_FAIL": RemoteState.FAILED,
    "BOOT_FAIL": RemoteState.FAILED,
    "OUT_OF_MEMORY": RemoteState.FAILED,
    "DEADLINE": RemoteState.FAILED,
    "SPECIAL_EXIT": RemoteState.FAILED,
    "CANCELLED": RemoteState.CANCELLED,
    "PREEMPTED": RemoteState.CANCELLED,
    "REVOKED": RemoteState.CANCELLED,
}


def map_state(slurm_state: str) -> RemoteState:
    """`RUNNING` → running; `CANCELLED by 0`, `CANCELLED+` (sacct) → cancelled; anything else unknown."""
    word = slurm_state.strip().split(" ")[0].rstrip("+").upper()
    return _STATES.get(word, RemoteState.UNKNOWN)


GpuRequest = Literal["per_task", "gres", "none"]
# how much sooner than `--signal=TERM@grace_s` asks SLURM may send it: it checks time limits about once a minute
TERM_EARLY_S = 60


def _sched(site: Site) -> SlurmScheduler:
    assert isinstance(site.scheduler, SlurmScheduler), site.scheduler.kind
    return site.scheduler


def _submit_target(sched: SlurmScheduler, *, known_hosts: str | None, connect_timeout_s: float) -> SshTarget:
    assert sched.submit_host
    return SshTarget(
        sched.submit_host,
        user=sched.ssh_user,
        port=sched.ssh_port,
        key_file=sched.ssh_key_file,
        known_hosts=known_hosts,
        connect_timeout_s=connect_timeout_s,
    )


def _runner(sched: SlurmScheduler, *, known_hosts: str | None, connect_timeout_s: float, setup: list[str]) -> Runner:
    """Where the site's SLURM client tools run: its submit host over SSH, else here; with its SLURM_CONF, each
    command after the site's `setup` lines (sbatch, squeue, scancel are often on PATH only after a `module load`)."""
    env = {"SLURM_CONF": sched.slurm_conf} if sched.slurm_conf else None
    if sched.submit_host:
        target = _submit_target(sched, known_hosts=known_hosts, connect_timeout_s=connect_timeout_s)
        return SshRunner(target, env, setup)
    return LocalRunner(env, setup)


# sbatch's options srun has not: `srun: unrecognized option '--requeue'`, and no step (measured on slurm 22.05)
SBATCH_ONLY = frozenset({"requeue", "no-requeue", "get-user-env", "ignore-pbs", "kill-on-invalid-dep", "batch"})


def site_options(sched: SlurmScheduler, *, srun: bool = False) -> list[str]:
    """The site's own long options for every job it runs (sbatch's, submitit's; with `srun`, the probe's step, less
    `SBATCH_ONLY`), shell-quoted: its `constraint`, `reservation`, `exclusive`, then its `sbatch_options` as given."""
    given: list[tuple[str, str | bool]] = [
        ("constraint", sched.constraint or ""),
        ("reservation", sched.reservation or ""),
        ("exclusive", sched.exclusive),
        *sched.sbatch_options.items(),
    ]
    return [
        f"--{k}" if v is True else f"--{k}={shlex.quote(v)}" for k, v in given if v and not (srun and k in SBATCH_ONLY)
    ]


def gpu_request_for(site: Site) -> GpuRequest:
    """How the site's jobs ask for GPUs: its scheduler's `gpu_request`; `auto` = --gpus-per-task on a
    real GPU type, nothing on `gpu: CPU` (a cluster without GRES would leave such a job pending forever)."""
    sched = _sched(site)
    if sched.gpu_request != "auto":
        return sched.gpu_request
    return "none" if site.spec.name == "CPU" else "per_task"


@dataclass(frozen=True)
class SlurmResources:
    """What one agent spec asks SLURM for. `gpus_per_task=0` asks for no GPU (CPU-only sites, the controller);
    else `gpu_request` says how: `--gpus-per-task=N` (SLURM binds N GPUs to each task) or, for clusters
    without cons_tres, `--gres=gpu:N×tasks_per_node` per node."""

    nodes: int = 1
    tasks_per_node: int = 1  # at most, per node: `tasks` need not be a multiple of it
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    gpu_request: GpuRequest = "per_task"
    mem_per_cpu_mb: int | None = None
    # in all (--ntasks; None: nodes × tasks_per_node): a spec's ranks need not fill every node, and nodes ×
    # tasks_per_node would then start a rank the job does not have
    tasks: int | None = None

    @classmethod
    def for_spec(
        cls,
        res: Resources,
        *,
        slots_per_node: int,
        gpu_request: GpuRequest,
        tp: int | None = None,
        node_gpus: Sequence[int] | None = None,
        site: str = "",
    ) -> SlurmResources:
        """The spec's tasks on as few nodes as the site's node size (GPU slots) allows; a task's GPUs on one node.
        `tp` (default `res.group`: a trainer's tensor-parallel degree) consecutive tasks share a node: as many
        tasks on every node, a multiple of tp dividing the tasks (`hostfill.slurm_layout`; SLURM's block
        distribution then puts each group on one node); LaunchError naming the site, ranks, tp and node size when
        none fits `node_gpus` (the site's nodes; default as many of `slots_per_node` as it takes)."""
        slots = max(1, res.gpus_per_task)
        if slots > slots_per_node:
            raise LaunchError(f"a task needs {slots} GPUs; the site's nodes have {slots_per_node}")
        tp = res.group if tp is None else tp
        hosts = list(node_gpus) if node_gpus is not None else [slots_per_node] * max(1, res.tasks)
        layout = slurm_layout(hosts, res.tasks, tp=tp, gpus_per_task=slots)
        if layout is None:
            raise LaunchError(
                str(placement_error(site or "?", hosts, res.tasks, tp=tp, slurm=True)), hint=PLACEMENT_HINT
            )
        nodes, tasks_per_node = layout
        gpus = res.gpus_per_task if gpu_request != "none" else 0
        mem = None if res.mem_mb_per_task is None else max(1, res.mem_mb_per_task // max(1, res.cpus_per_task))
        request = gpu_request if gpus else "per_task"
        return cls(nodes, tasks_per_node, res.cpus_per_task, gpus, request, mem, tasks=max(1, res.tasks))

    @property
    def ntasks(self) -> int:
        return self.tasks if self.tasks is not None else self.nodes * self.tasks_per_node

    @property
    def gpu_option(self) -> str | None:
        """The sbatch option asking for the GPUs, None when none are asked for."""
        if not self.gpus_per_task or self.gpu_request == "none":
            return None
        if self.gpu_request == "gres":
            return f"--gres=gpu:{self.gpus_per_task * self.tasks_per_node}"
        return f"--gpus-per-task={self.gpus_per_task}"

    def summary(self) -> str:
        """`2 nodes × 8 tasks, --gpus-per-task=1, 4 cpus/task` for `launch --dry-run`."""
        gpus = self.gpu_option or "no GPU request"
        spread = f"{self.nodes} node(s) × {self.tasks_per_node} task(s)"
        if self.ntasks != self.nodes * self.tasks_per_node:
            spread = f"{self.ntasks} tasks on {self.nodes} node(s), ≤ {self.tasks_per_node} each"
        return f"{spread}, {gpus}, {self.cpus_per_task} cpu(s)/task"


@dataclass(frozen=True)
class SlurmStatus:
    state: RemoteState
    slurm_state: str  # as SLURM printed it, "" when no tool knew the job
    nodes: list[str]
    reason: str
    exit_code: int | None
    source: str  # squeue | scontrol | sacct | none


class SlurmBackend(LaunchBackend):
    kind = "slurm"
    slices_gpus = False  # SLURM binds each task's GPUs itself
    ranks_are_tasks = True  # the trainer is one SLURM job whose tasks are its ranks ($SLURM_PROCID)

    @classmethod
    def for_site(cls, site_name: str, site: Site, *, job: str, job_dir: Path) -> SlurmBackend:
        # each spec's own resources say what to ask for (the trainer: one job, its tasks the ranks)
        sched = _sched(site)
        return cls(
            site_name,
            sched,
            job=job,
            job_dir=job_dir,
            slots_per_node=site.gpus_per_node,
            node_gpus=[g for _, g in site.hosts],
            gpu_request=gpu_request_for(site),
            known_hosts=sched.ssh_known_hosts,
            python=site.python,
            setup=site.setup,
        )

    @classmethod
    def work_root(cls, site: Site) -> str | None:
        sched = _sched(site)
        if sched.submit_host:  # the submit host's filesystem, which the nodes share
            return sched.workdir or DEFAULT_WORKDIR
        return super().work_root(site)

    @classmethod
    def remote(cls, site: Site) -> bool:
        return bool(_sched(site).submit_host)

    @classmethod
    def ssh_target(cls, site: Site, host: str | None = None, *, connect_timeout_s: float = 10.0) -> SshTarget:
        sched = _sched(site)
        if not sched.submit_host:
            raise LaunchError("a SLURM site without a submit_host is not reached over SSH")
        return _submit_target(sched, known_hosts=sched.ssh_known_hosts, connect_timeout_s=connect_timeout_s)

    @classmethod
    def access_hosts(cls, site: Site) -> list[str]:
        submit = _sched(site).submit_host
        return [submit] if submit else ["localhost"]

    @classmethod
    def site_runner(cls, site: Site, host: str | None = None) -> Runner:
        sched = _sched(site)
        return _runner(sched, known_hosts=sched.ssh_known_hosts, connect_timeout_s=10.0, setup=site.setup)

    @classmethod
    def probe_commands(cls, site: Site, command: str, *, first: bool = False) -> list[tuple[str, str | None, str]]:
        """One step on one node of the partition, with the GPU a unit would get, charged as the agents' jobs are
        (the site's account and qos: a cluster that enforces them refuses a step without), on the nodes they get
        (the site's own options, `site_options`)."""
        sched = _sched(site)
        gpus = {"per_task": "--gpus-per-task=1 ", "gres": "--gres=gpu:1 "}.get(gpu_request_for(site), "")
        charge = f"--account={shlex.quote(sched.account)} " if sched.account else ""
        charge += f"--qos={shlex.quote(sched.qos)} " if sched.qos else ""
        charge += "".join(f"{o} " for o in site_options(sched, srun=True))  # the nodes and terms its jobs get
        srun = f"srun --partition={shlex.quote(sched.partition)} {charge}--nodes=1 --ntasks=1 {gpus}--time=5 bash -c "
        return [(f"a node of partition {sched.partition}", None, srun + shlex.quote(command))]

    @classmethod
    def probe_late(cls, site: Site, timeout_s: float) -> str | None:
        """The probe's srun ran on the submit host and its step got no node in time: the partition is busy (or slow
        to start it), not the site down; sinfo still answers there."""
        partition = _sched(site).partition
        return (
            f"the probe (srun) did not start within {timeout_s:g} s: is the partition busy, its step waiting for a "
            f"node? `squeue -p {partition}` shows what waits there; check again when it has a free node, or with a "
            "longer --timeout"
        )

    @classmethod
    def _sinfo(cls, site: Site, fields: str, *, timeout_s: float) -> str:
        """sinfo's lines (`-o fields`) of the site's partition, where jobs are submitted (LaunchError when it fails)."""
        runner = cls.site_runner(site)
        try:
            res = runner.run(f"sinfo -h -p {shlex.quote(_sched(site).partition)} -o '{fields}'", timeout_s=timeout_s)
        finally:
            runner.close()
        if res.exit_code != 0:
            raise LaunchError(f"sinfo exited {res.exit_code}: {res.tail()[:200]}")
        return res.stdout

    @classmethod
    def reach(cls, site: Site, *, timeout_s: float) -> str:
        """The partition's node states, from sinfo where jobs are submitted."""
        partition = _sched(site).partition
        out = cls._sinfo(site, "%D %t", timeout_s=timeout_s)
        if not out.strip():
            raise LaunchError(f"partition {partition!r} not found by sinfo")
        states = ", ".join(" ".join(line.split()) for line in out.strip().splitlines())
        return f"slurm partition {partition}: {states} (nodes state)"

    @classmethod
    def partition(cls, site: Site, *, timeout_s: float) -> tuple[list[str], int | None]:
        """The names of the nodes of the site's partition and its MaxTime in seconds (None: no limit), from sinfo
        where jobs are submitted (LaunchError when sinfo fails). Partitions given as a list (`a,b`): the longest
        MaxTime, as SLURM starts the job in a partition whose limit it fits."""
        nodes: set[str] = set()
        limits: set[int | None] = set()
        for line in cls._sinfo(site, "%l %N", timeout_s=timeout_s).splitlines():
            limit, _, words = line.strip().partition(" ")
            if limit:
                limits.add(_seconds(limit))
                nodes.update(h for word in words.split() for h in _hosts(word))
        known = [t for t in limits if t is not None]
        return sorted(nodes), (max(known) if known and None not in limits else None)

    @classmethod
    def node_cpus(cls, site: Site, *, timeout_s: float) -> int | None:
        """The most CPUs a node of the site's partition has, from sinfo where jobs are submitted (LaunchError when
        sinfo fails); None where it says no plain figure (`32+`: nodes of several sizes, the largest not said)."""
        said = cls._sinfo(site, "%c", timeout_s=timeout_s).split()
        return max(int(w) for w in said) if said and all(w.isdigit() for w in said) else None

    def __init__(
        self,
        site_name: str,
        sched: SlurmScheduler,
        *,
        job: str,
        job_dir: Path,
        resources: dict[str, SlurmResources] | None = None,
        slots_per_node: int = 1,
        node_gpus: Sequence[int] | None = None,
        gpu_request: GpuRequest = "none",
        grace_s: int = 30,
        known_hosts: str | None = None,
        python: str | None = None,
        setup: list[str] | None = None,
        command_timeout_s: float = 30.0,
    ) -> None:
        """`job_dir` must be on a filesystem the nodes share (submitit's pickles, every log).

        A spec's SLURM resources come from its own `resources` (placed on nodes of `slots_per_node` GPU
        slots, GPUs asked for as `gpu_request` says); `resources[role]` overrides that for a role."""
        self.site = site_name
        self.slots_per_node = slots_per_node
        self.node_gpus = list(node_gpus) if node_gpus is not None else None  # the inventory's nodes (GPUs each)
        self.gpu_request: GpuRequest = gpu_request
        self.sched = sched
        self.job = job
        self.job_dir = job_dir
        self.resources = resources or {}
        self.grace_s = grace_s
        self.python = shlex.quote(python or sys.executable)
        self.setup = list(setup or [])
        self.command_timeout_s = command_timeout_s
        self.runner = _runner(
            sched, known_hosts=known_hosts, connect_timeout_s=min(command_timeout_s, 15.0), setup=self.setup
        )

    @property
    def submitter(self) -> str:
        return "sbatch-ssh" if self.sched.submit_host else "submitit"

    def job_name(self, spec: AgentSpec) -> str:
        return f"rlctl-{self.job}-{spec.role}"

    def _res(self, spec: AgentSpec) -> SlurmResources:
        if spec.role in self.resources:
            return self.resources[spec.role]
        try:
            return SlurmResources.for_spec(
                spec.resources,
                slots_per_node=self.slots_per_node,
                gpu_request=self.gpu_request,
                node_gpus=self.node_gpus,
                site=self.site,
            )
        except LaunchError as e:
            site = f"site {self.site}: "  # a placement line names the site already
            raise LaunchError(f"{site}{spec.name}: {str(e).removeprefix(site)}", hint=e.hint) from e

    def request_summary(self, spec: AgentSpec) -> str:
        return self._res(spec).summary()

    def _log_path(self, spec: AgentSpec) -> Path:
        return spec.log_path or self.job_dir / "logs" / f"{spec.name}.log"

    def _mkdir(self, spec: AgentSpec) -> str:
        """What makes the spec's log directory before sbatch (its --output is there)."""
        return f"mkdir -p {shlex.quote(str(self._log_path(spec).parent))}"

    def _submitit_folder(self, spec: AgentSpec) -> Path:
        return self.job_dir / "slurm" / spec.name

    # ---------------------------------------------------------------- render
    def render(self, spec: AgentSpec) -> str:
        """The exact batch script `start(spec)` submits (for --dry-run and the job directory)."""
        if self.submitter == "submitit":
            ex = self._executor(spec)
            return str(ex._make_submission_file_text(ex._submitit_command_str, "dry-run"))
        return self.render_sbatch(spec)

    def render_sbatch(self, spec: AgentSpec) -> str:
        res, s = self._res(spec), self.sched
        head = f"# rlctl job {self.job}: {spec.name} on site {self.site}"
        submit = f"{self._mkdir(spec)} && sbatch --parsable"
        lines = ["#!/bin/bash"]
        if self.setup:  # sbatch runs after them too: the command as the submit host's shell gets it
            lines += [f"{head}, submitted on {self.runner.where} by bash (stdin: this file):"]
            lines += [f"#   {line}" for line in setup_first(self.setup, submit).splitlines()]
        else:
            lines += [f"{head} (submit: sbatch --parsable < this file)"]
        lines += [
            # sbatch splits an #SBATCH line as a shell would (a job dir named `my run` made two arguments)
            f"#SBATCH --job-name={shlex.quote(self.job_name(spec))}",
            f"#SBATCH --partition={shlex.quote(s.partition)}",
        ]
        lines += [f"#SBATCH --account={shlex.quote(s.account)}"] if s.account else []
        lines += [f"#SBATCH --qos={shlex.quote(s.qos)}"] if s.qos else []
        lines += [
            f"#SBATCH --nodes={res.nodes}",
            f"#SBATCH --ntasks={res.ntasks}",
            f"#SBATCH --ntasks-per-node={res.tasks_per_node}",
            f"#SBATCH --cpus-per-task={res.cpus_per_task}",
        ]
        lines += [f"#SBATCH {res.gpu_option}"] if res.gpu_option else []
        lines += [f"#SBATCH --mem-per-cpu={res.mem_per_cpu_mb}"] if res.mem_per_cpu_mb else []
        lines += [
            f"#SBATCH --time={s.time_limit_min}",
            # `%` starts a filename pattern there (%j, …): a literal one is `%%`
            f"#SBATCH --output={shlex.quote(str(self._log_path(spec)).replace('%', '%%'))}",
            "#SBATCH --open-mode=append",
            f"#SBATCH --signal=B:TERM@{self.grace_s}",
        ]
        lines += [f"#SBATCH --chdir={shlex.quote(str(spec.cwd))}"] if spec.cwd else []
        lines += [f"#SBATCH {o}" for o in site_options(s)]
        lines += ["set -u"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())]
        lines += site_setup(self.setup)
        lines += [
            "# every rank: rank = $SLURM_PROCID, world size = $SLURM_NTASKS, hosts = $SLURM_JOB_NODELIST",
            # srun takes --cpus-per-task from sbatch no more (SLURM 22.05): without it each rank got one core
            f"srun --label --unbuffered --kill-on-bad-exit=1 --cpus-per-task={res.cpus_per_task} "
            f"{shlex.join(spec.argv)} &",
            "srun_pid=$!",
            "# a TERM to srun kills the step at once: the batch shell takes it and hands it to the agents",
            "trap 'scancel --signal=TERM \"$SLURM_JOB_ID\"' TERM",
            'wait "$srun_pid"; rc=$?',
            'while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; rc=$?; done',
            'exit "$rc"',
            "",
        ]
        return "\n".join(lines)

    def _executor(self, spec: AgentSpec) -> Any:
        import submitit

        res, s = self._res(spec), self.sched
        try:
            ex = submitit.SlurmExecutor(folder=str(self._submitit_folder(spec) / "%j"), python=self.python)
        except RuntimeError as e:  # no srun here: not a login node
            raise LaunchError(
                f"site {self.site}: cannot use submitit here: {e}",
                hint="set scheduler.submit_host to submit over SSH from a login node",
            ) from e
        setup = [f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())]
        setup += [f"cd {shlex.quote(str(spec.cwd))}"] if spec.cwd else []
        setup += self.setup
        params: dict[str, Any] = {
            "job_name": self.job_name(spec),
            "partition": s.partition,
            "time": s.time_limit_min,
            "nodes": res.nodes,
            "ntasks_per_node": res.tasks_per_node,
            "cpus_per_task": res.cpus_per_task,
            "signal_delay_s": self.grace_s,
            "setup": setup,
            "stderr_to_stdout": True,
            # one rank exiting non-zero ends the step (its peers would wait in the rendezvous), as the sbatch path's
            # and its cores: srun takes --cpus-per-task from sbatch no more (SLURM 22.05), one core a rank without
            "srun_args": ["--kill-on-bad-exit=1", f"--cpus-per-task={res.cpus_per_task}"],
            # TERM to the steps (the agents), not submitit's USR2 "checkpoint and requeue"
            "additional_parameters": {"signal": f"TERM@{self.grace_s}"},
        }
        if res.ntasks != res.nodes * res.tasks_per_node:  # else nodes × ntasks_per_node would start a rank too many
            params["additional_parameters"]["ntasks"] = res.ntasks
        params.update({"account": s.account} if s.account else {})
        params.update({"qos": s.qos} if s.qos else {})
        # the site's own options, as the sbatch path's (`site_options`); submitit quotes each value and writes `true`
        # as the option alone
        params.update({"constraint": s.constraint} if s.constraint else {})
        params.update({"exclusive": True} if s.exclusive else {})
        params["additional_parameters"].update({"reservation": s.reservation} if s.reservation else {})
        params["additional_parameters"].update(s.sbatch_options)
        if res.gpu_option is not None and res.gpu_request == "gres":
            params["gres"] = res.gpu_option.removeprefix("--gres=")
        elif res.gpu_option is not None:
            params["gpus_per_task"] = res.gpus_per_task
        params.update({"mem_per_cpu": f"{res.mem_per_cpu_mb}MB"} if res.mem_per_cpu_mb else {})
        ex.update_parameters(**params)
        return ex

    # ---------------------------------------------------------------- start
    def start(self, spec: AgentSpec) -> AgentHandle:
        job_id = self._submit_submitit(spec) if self.submitter == "submitit" else self._submit_sbatch(spec)
        log.info("site %s: %s submitted as SLURM job %s (%s)", self.site, spec.name, job_id, self.submitter)
        ident = {"job_id": job_id, "submitter": self.submitter, "job_name": self.job_name(spec), "stopped": False}
        return AgentHandle(spec, ident, self.kind)

    def _submit_submitit(self, spec: AgentSpec) -> str:
        import submitit
        from submitit.core.utils import FailedJobError, FailedSubmissionError

        ex = self._executor(spec)
        self._submitit_folder(spec).mkdir(parents=True, exist_ok=True)
        log_path = self._log_path(spec)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # the agent's output goes to its log in the job directory, as sbatch's --output does (submitit's
        # folder keeps only its own wrapper's output); `exec` keeps the agent the process SLURM signals
        argv = ["bash", "-c", 'exec "$@" >>"$0" 2>&1', str(log_path), *spec.argv]
        try:
            with _env_overlay({"SLURM_CONF": self.sched.slurm_conf} if self.sched.slurm_conf else {}):
                job = ex.submit(submitit.helpers.CommandFunction(argv, verbose=True))
        # sbatch's refusal (its exit status non-zero) is FailedJobError: submitit raises FailedSubmissionError only
        # where sbatch said no job id
        except (FailedSubmissionError, FailedJobError, OSError) as e:
            raise LaunchError(f"site {self.site}: sbatch (submitit) refused {spec.name}: {e}") from e
        return str(job.job_id)

    def _submit_sbatch(self, spec: AgentSpec) -> str:
        script = self.render_sbatch(spec)
        res = self.runner.run(
            f"{self._mkdir(spec)} && sbatch --parsable", timeout_s=self.command_timeout_s, stdin=script
        )
        job_id = res.stdout.strip().split(";")[0]
        if res.exit_code != 0 or not job_id.isdigit():
            raise LaunchError(f"site {self.site}: sbatch on {self.runner.where} refused {spec.name}: {res.tail()}")
        return job_id

    # ---------------------------------------------------------------- status
    def _run(self, command: str) -> CommandResult:
        return self.runner.run(command, timeout_s=self.command_timeout_s)

    def status(self, handle: AgentHandle) -> SlurmStatus:
        job_id = str(handle.ident["job_id"])
        st = self._query(job_id)
        if handle.ident.get("stopped") and st.state in (RemoteState.FINISHED, RemoteState.FAILED):
            # we stopped it: the agents exiting on our TERM is a cancellation, whatever their exit code
            return SlurmStatus(RemoteState.CANCELLED, st.slurm_state, st.nodes, st.reason, st.exit_code, st.source)
        return st

    def _query(self, job_id: str) -> SlurmStatus:
        q = shlex.quote(job_id)
        res = self._run(f"squeue -h -j {q} -o '%T %N %r'")
        out = res.stdout.strip()
        if res.exit_code == 0 and out:
            state, nodes, reason = [*out.splitlines()[0].split(" ", 2), "", ""][:3]
            return SlurmStatus(map_state(state), state, _hosts(nodes), reason, None, "squeue")
        res = self._run(f"scontrol show job -o {q}")  # finished jobs stay here for MinJobAge
        if res.exit_code == 0 and "JobState=" in res.stdout:
            f = dict(re.findall(r"(?:^|\s)(JobState|NodeList|Reason|ExitCode)=(\S*)", res.stdout))
            state = f.get("JobState", "")
            code, hosts = _exit_code(f.get("ExitCode", "")), _hosts(f.get("NodeList", ""))
            return SlurmStatus(map_state(state), state, hosts, f.get("Reason", ""), code, "scontrol")
        res = self._run(f"sacct -X -n -P -j {q} -o State,NodeList,ExitCode")
        rows = [r for r in res.stdout.strip().splitlines() if r]
        if res.exit_code == 0 and rows:
            state, nodes, code_s = [*rows[-1].split("|"), "", ""][:3]
            return SlurmStatus(map_state(state), state, _hosts(nodes), "", _exit_code(code_s), "sacct")
        log.warning("site %s: no SLURM tool knows job %s (%s)", self.site, job_id, res.tail())
        return SlurmStatus(RemoteState.UNKNOWN, "", [], res.tail(), None, "none")

    def poll(self, handle: AgentHandle) -> int | None:
        st = self.status(handle)
        if st.state.active or st.state is RemoteState.UNKNOWN:
            return None
        if st.state is RemoteState.FINISHED:
            return 0
        if st.state is RemoteState.CANCELLED:
            return -15
        return st.exit_code or 1

    def queued(self, handle: AgentHandle) -> bool:
        return self.status(handle).state is RemoteState.PENDING

    def at_time_limit(self, handle: AgentHandle) -> str | None:
        """SLURM's TERM comes `grace_s` before the job's `--time` (up to TERM_EARLY_S sooner: SLURM checks limits
        about once a minute), and the agents exit on it: a job that ran that long, or that SLURM ended TIMEOUT (only
        that, under a limit no longer than grace_s + TERM_EARLY_S, which every run is within)."""
        job_id = str(handle.ident["job_id"])
        state, run_s, limit_s = self._times(job_id)
        early = self.grace_s + TERM_EARLY_S  # a limit no longer than that: any run ends within it (TIMEOUT says)
        if run_s is not None and limit_s is not None and limit_s > early and run_s >= limit_s - early:
            return f"SLURM job {job_id} ran {_clock(run_s)} of its {_clock(limit_s)} limit"
        if state == "TIMEOUT":
            return f"SLURM job {job_id} ended TIMEOUT"
        return None

    def _times(self, job_id: str) -> tuple[str, int | None, int | None]:
        """The job's state, run time and time limit (s), from squeue while it is queued, else scontrol, else sacct."""
        q = shlex.quote(job_id)
        res = self._run(f"squeue -h -j {q} -o '%T %M %l'")
        fields = res.stdout.split()
        if res.exit_code == 0 and len(fields) == 3:
            return fields[0], _seconds(fields[1]), _seconds(fields[2])
        res = self._run(f"scontrol show job -o {q}")
        if res.exit_code == 0 and "JobState=" in res.stdout:
            f = dict(re.findall(r"(?:^|\s)(JobState|RunTime|TimeLimit)=(\S*)", res.stdout))
            return f.get("JobState", ""), _seconds(f.get("RunTime", "")), _seconds(f.get("TimeLimit", ""))
        res = self._run(f"sacct -X -n -P -j {q} -o State,ElapsedRaw,TimelimitRaw")
        rows = [r.split("|") for r in res.stdout.strip().splitlines() if r.count("|") == 2]
        if res.exit_code == 0 and rows:
            state, elapsed, limit_min = rows[-1]
            limit = int(limit_min) * 60 if limit_min.isdigit() else None
            return state.split(" ")[0], int(elapsed) if elapsed.isdigit() else None, limit
        return "", None, None

    # ---------------------------------------------------------------- stop
    def stop(self, handles: list[AgentHandle], *, grace_s: float = 10.0) -> None:
        live: list[AgentHandle] = []
        for h in handles:
            state = self._query(str(h.ident["job_id"])).state
            if not state.active:
                continue
            h.ident["stopped"] = True
            live.append(h)
            job = shlex.quote(str(h.ident["job_id"]))
            if state is RemoteState.PENDING:  # nothing runs yet; `scancel --signal` would wait for it to start
                self._run(f"scancel {job}")
                continue
            try:
                res = self.runner.run(f"scancel --signal=TERM {job}", timeout_s=10.0)
                failed = res.exit_code != 0
            except LaunchError as e:  # raced with a state change and blocked
                res, failed = CommandResult(1, "", str(e)), True
            if failed:
                log.info("site %s: scancel --signal=TERM %s: %s; cancelling", self.site, job, res.tail())
                self._run(f"scancel {job}")
        live = self._wait_gone(live, grace_s)
        for h in live:
            log.warning("site %s: job %s ignored TERM for %.0f s; scancel", self.site, h.ident["job_id"], grace_s)
            self._run(f"scancel {shlex.quote(str(h.ident['job_id']))}")
        left = self._wait_gone(live, 60.0)  # scancel: TERM, KillWait, KILL, epilog
        if left:
            ids = ", ".join(str(h.ident["job_id"]) for h in left)
            raise LaunchError(f"site {self.site}: SLURM job(s) {ids} still in the queue after scancel")

    def _wait_gone(self, handles: list[AgentHandle], timeout_s: float) -> list[AgentHandle]:
        deadline = time.monotonic() + timeout_s
        while True:
            handles = [h for h in handles if self._query(str(h.ident["job_id"])).state.active]
            if not handles or time.monotonic() >= deadline:
                return handles
            time.sleep(0.2)

    def close(self) -> None:
        self.runner.close()


def _hosts(nodelist: str) -> list[str]:
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    try:
        return expand_hostlist(nodelist)
    except ValueError:
        return [nodelist]


def _seconds(text: str) -> int | None:
    """SLURM's `[days-][hours:]minutes:seconds` (squeue's `1:31`, scontrol's `00:01:31`, `1-00:00:00`) in
    seconds; None for UNLIMITED, INVALID, or anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _clock(seconds: int) -> str:
    """`H:MM:SS` (hours may pass 24)."""
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _exit_code(text: str) -> int | None:
    """SLURM's `ExitCode=143:0` (code:signal) → 143; a signal alone → -signal."""
    m = re.match(r"^(\d+):(\d+)$", text.strip())
    if not m:
        return None
    code, sig = int(m[1]), int(m[2])
    return code if code or not sig else -sig


_env_lock = threading.Lock()


@contextmanager
def _env_overlay(env: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a block (submitit calls sbatch with os.environ)."""
    with _env_lock:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
