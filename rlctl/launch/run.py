"""Running one job from the operator's side: resolve, plan, prepare the job directory, start the
agents through a launch backend, watch the controller's status, stop everything.

    resolve_job ─▶ plan_counts ─▶ prepare (job.json, plan.json, secret, SFT warm-up → model/init)
        ─▶ layout (host, GPU slice / SLURM request, threads, tp/pp/dp of every agent; see layout.py)
        ─▶ JobRun.start: controller ─(controller.json)─▶ trainer ranks ─▶ rollout units
        ─▶ JobRun.wait: status RPC every poll_s ─▶ on_progress(status) … controller exits
        ─▶ summary.json (+ wall_s) ;  JobRun.stop(): every agent, SIGTERM → grace → SIGKILL
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.config.inventory import Site
from rlctl.config.job import Job, JobFile, Pipeline
from rlctl.errors import LaunchError, PlanError, TransportError, UsageError
from rlctl.launch.backends import Backends, read_sites, record_agent, recorded_agents, stop_agents, write_sites
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.jobdb import JobDB
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import PlannedAgent, layout
from rlctl.launch.spawn import agent_spec
from rlctl.transport import Connection, Message, make_transport

log = logging.getLogger(__name__)

CONTROLLER_START_S = 120.0


def resolve_job(job: Job, *, iterations: int | None = None, mode: str | None = None) -> JobFile:
    """The job with command-line overrides applied (a new mode takes that mode's default η)."""
    spec = job.spec
    update: dict[str, Any] = {}
    if iterations is not None:
        update["iterations"] = iterations
    if mode is not None and mode != spec.pipeline.mode:
        update["pipeline"] = Pipeline(mode=mode)
    return spec.model_copy(update=update) if update else spec


def plan_counts(job: Job, spec: JobFile) -> dict[str, Any]:
    """Trainer ranks and rollout units per site: the job's explicit counts, or the planner's for `auto`."""
    placement = spec.placement
    auto = placement.trainer.gpus == "auto" or any(r.gpus == "auto" for r in placement.rollout)
    planned: dict[str, Any] | None = None
    note = ""
    try:
        from rlctl.planner.plan import PlanOptions, make_plan

        planned = make_plan(job, options=PlanOptions(sim_iterations=1, curves_in_output=False))
    except Exception as e:  # the planner is advisory when the job gives explicit counts
        note = f"planner unavailable for this job: {type(e).__name__}: {e}"
        log.warning("%s", note)
        if auto:
            raise PlanError(
                f"{job.path}: 'gpus: auto' needs the planner, which failed: {e}",
                hint="give explicit GPU counts in placement",
            ) from e
    alloc = planned["allocation"] if planned is not None else []
    planned_tp = {a["site"]: int(a["config"]["tp"]) for a in alloc if a["role"] == "rollout" and a.get("config")}
    t_config = next((a.get("config") for a in alloc if a["role"] == "trainer"), None)

    def tp_of(site: str) -> int:
        """GPUs per rollout unit: the job's tensor_parallel; else, when the planner chose the counts, its TP."""
        return spec.rollout.tensor_parallel or (planned_tp.get(site, 1) if auto else 1)

    if auto:
        trainer = int(next(a["gpus_used"] for a in alloc if a["role"] == "trainer"))
        rollout = [
            {"site": a["site"], "units": int(a["instances"]), "tp": tp_of(a["site"])}
            for a in alloc
            if a["role"] == "rollout"
        ]
        source = "planner"
    else:
        trainer = int(placement.trainer.gpus)
        rollout = [
            {"site": r.site, "units": max(1, int(r.gpus) // tp_of(r.site)), "tp": tp_of(r.site)}
            for r in placement.rollout
        ]
        source = "job"
    parallel = {"tp": 1, "pp": 1, "dp": trainer}
    if t_config and int(t_config["tp"]) * int(t_config["pp"]) * int(t_config["dp"]) == trainer:
        parallel = {k: int(t_config[k]) for k in ("tp", "pp", "dp")}
    out: dict[str, Any] = {
        "source": source,
        "trainer": {"site": placement.trainer.site, "ranks": trainer, "parallel": parallel},
        "rollout": rollout,
        "controller_site": placement.controller_site or placement.trainer.site,
    }
    if planned is not None:
        out["planner"] = {k: planned.get(k) for k in ("allocation", "predicted", "rebalance") if k in planned}
    if note:
        out["note"] = note
    return out


def prepare(jobdir: JobDir, spec: JobFile, plan: dict[str, Any], *, source: str, job: Job | None = None) -> None:
    """Write what the agents read, and the starting policy (the SFT warm-up, cached across runs)."""
    jobdir.write_job(spec, source=source)
    jobdir.write_json(jobdir.plan_json, plan)
    if job is not None:
        used = {plan["trainer"]["site"], plan["controller_site"], *(g["site"] for g in plan["rollout"])}
        write_sites(jobdir.path, {n: s for n, s in job.inventory.sites.items() if n in used})
    jobdir.secret()
    if (jobdir.init_model / "config.json").exists():
        return
    from rlctl.engines.model import TinyGPT
    from rlctl.rl import sft
    from rlctl.rl.tasks import DigitsTask

    if spec.task.kind != "digits":
        raise UsageError(f"the local runtime runs the digits task; this job's task is {spec.task.kind!r}")
    model = TinyGPT()
    if spec.warmup.sft_steps:
        t0 = time.monotonic()
        model.load_state_dict(sft.warmup(DigitsTask(spec.task), steps=spec.warmup.sft_steps, seed=spec.seed))
        jobdir.event("sft_warmup", steps=spec.warmup.sft_steps, seconds=round(time.monotonic() - t0, 2))
    model.save_pretrained(jobdir.init_model)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class JobRun:
    """One job from the operator's side: start its agents on their sites, watch it, stop it for sure."""

    def __init__(
        self,
        jobdir: JobDir,
        spec: JobFile,
        plan: dict[str, Any],
        *,
        db: JobDB | None = None,
        sites: dict[str, Site] | None = None,
    ) -> None:
        self.jobdir, self.spec, self.plan = jobdir, spec, plan
        self.sites = sites if sites is not None else read_sites(jobdir.path)
        if not self.sites:
            raise LaunchError(f"{jobdir.path}: no sites.json; prepare(…, job=job) writes it")
        self.backends = Backends(self.sites, job=jobdir.path.name, job_dir=jobdir.path)
        self.db = db
        self.handles: list[AgentHandle] = []
        self.controller: AgentHandle | None = None
        self._status_conn: Connection | None = None
        self.t_start = time.monotonic()

    @property
    def id(self) -> str:
        return self.jobdir.path.name

    def render(self, *, master_port: int) -> list[dict[str, Any]]:
        """Per agent, for `launch --dry-run`: where it runs, what it gets, and the exact script / command."""
        out = []
        for a, env in planned_agents(self.plan, self.sites, self.spec, master_port=master_port):
            spec = agent_spec(self.jobdir, a, self.sites[a.site], env=env)
            backend = self.backends.for_site(a.site)
            render = getattr(backend, "render", None)
            request = getattr(backend, "request_summary", None)
            gpus = spec.gpu_slice.visible_devices if spec.gpu_slice else None
            out.append(
                {
                    "agent": spec.name,
                    "site": spec.site,
                    "backend": backend.kind,
                    "host": spec.gpu_slice.host if spec.gpu_slice else None,  # SLURM sites: SLURM places it
                    "cuda_visible_devices": gpus,
                    "gpu_request": request(spec) if request is not None else None,
                    "threads": spec.resources.cpus_per_task,
                    "parallel": a.parallel.short(),
                    "script": render(spec) if render is not None else shlex.join(spec.argv),
                }
            )
        return out

    def _start(self, a: PlannedAgent, env: dict[str, str] | None = None) -> AgentHandle:
        spec: AgentSpec = agent_spec(self.jobdir, a, self.sites[a.site], env=env)
        h = self.backends.for_site(a.site).start(spec)
        record_agent(self.jobdir.path, h)
        self.handles.append(h)
        gpus = spec.gpu_slice.visible_devices if spec.gpu_slice else None
        self.jobdir.event("agent_started", agent=spec.name, site=spec.site, backend=h.backend, ident=h.ident, gpus=gpus)
        return h

    def _register(self, state: str, **info: Any) -> None:
        if self.db is None:
            return
        if state == "launching":
            self.db.put(self.id, job_dir=str(self.jobdir.path), spec=self.spec.model_dump(mode="json", by_alias=True))
        self.db.update(self.id, state=state, info=info or None)

    def start(self) -> None:
        self.t_start = time.monotonic()
        self.jobdir.controller_json.unlink(missing_ok=True)
        self._register("launching", sites=sorted(self.sites))
        agents = planned_agents(self.plan, self.sites, self.spec, master_port=_free_port())  # refuses a short site
        self.controller = self._start(*agents[0])
        deadline = time.monotonic() + CONTROLLER_START_S
        while not self.jobdir.controller_json.exists():
            code = self.poll(self.controller)
            if code is not None:
                raise LaunchError(
                    f"the controller exited with {code} before listening; "
                    f"see {self.jobdir.log('controller', 0)}:\n{self.log_tail('controller', 0)}"
                )
            if time.monotonic() > deadline:
                raise LaunchError(f"the controller did not listen within {CONTROLLER_START_S:.0f} s")
            time.sleep(0.05)
        address = str(self.jobdir.read_json(self.jobdir.controller_json)["address"])
        if self.db is not None:
            self.db.update(self.id, state="running", controller=address)
        for a, env in agents[1:]:
            self._start(a, env)

    def poll(self, h: AgentHandle) -> int | None:
        return self.backends.for_site(h.spec.site).poll(h)

    def log_tail(self, role: str, replica: int, lines: int = 15) -> str:
        p = self.jobdir.log(role, replica)
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else "(no log)"

    def status(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The controller's live status, or None when it does not answer."""
        try:
            if self._status_conn is None:
                self._status_conn = connect_client(self.jobdir, timeout_s=timeout_s, name="launch")
            reply = self._status_conn.request(Message("status", {}), timeout_s=timeout_s)
            return dict(reply.header)
        except (TransportError, OSError, ValueError, KeyError):
            if self._status_conn is not None:
                self._status_conn.close()
            self._status_conn = None
            return None

    def agent_codes(self) -> dict[str, int | None]:
        return {h.spec.name: self.poll(h) for h in self.handles}

    def wait(
        self, *, on_progress: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 1.0
    ) -> dict[str, Any]:
        """Until the controller exits; returns the job summary (summary.json + wall_s)."""
        assert self.controller is not None
        while self.poll(self.controller) is None:
            st = self.status() if on_progress is not None else None
            if st is not None and on_progress is not None:
                on_progress(st)
            time.sleep(poll_s)
        code = self.poll(self.controller)
        if self._status_conn is not None:
            self._status_conn.close()
        if not self.jobdir.summary_json.exists():
            self._register("failed", controller_exit=code)
            raise LaunchError(
                f"the controller exited with {code} without a summary; "
                f"see {self.jobdir.log('controller', 0)}:\n{self.log_tail('controller', 0)}"
            )
        summary: dict[str, Any] = self.jobdir.read_json(self.jobdir.summary_json)
        summary["wall_s"] = round(time.monotonic() - self.t_start, 2)
        summary["controller_exit"] = code
        state = "finished" if summary["state"] == "done" else "stopped" if summary["state"] == "stopped" else "failed"
        self._register(state, controller_exit=code)
        return summary

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop every agent of the job on every site, including units the controller started."""
        handles = recorded_agents(self.jobdir.path)
        problems = stop_agents(self.backends, handles, grace_s=grace_s)
        self.jobdir.event("agents_stopped", agents=[h.spec.name for h in handles], problems=problems)
        if self.db is not None and self.db.get(self.id).state in ("launching", "running"):
            self._register("stopped")
        self.backends.close()
        if problems:
            raise LaunchError("; ".join(problems))


def planned_agents(
    plan: dict[str, Any], sites: dict[str, Site], job: JobFile, *, master_port: int
) -> list[tuple[PlannedAgent, dict[str, str]]]:
    """Every agent to start with the environment its role adds, controller first, in start order.

    Trainer ranks find rank 0 at MASTER_ADDR: the first node of a SLURM allocation ($SLURM_JOB_NODELIST,
    read by the agent), else rank 0's host (127.0.0.1 when every rank runs on one host)."""
    agents = layout(plan, sites, job)
    ranks = int(plan["trainer"]["ranks"])
    env = {"MASTER_PORT": str(master_port), "WORLD_SIZE": str(ranks)}
    trainers = [a for a in agents if a.role == "trainer"]
    hosts = {a.gpu_slice.host for a in trainers if a.gpu_slice is not None}
    t0 = trainers[0].gpu_slice
    master = t0.host if len(hosts) > 1 and t0 is not None else "127.0.0.1"
    out: list[tuple[PlannedAgent, dict[str, str]]] = []
    for a in agents:
        if a.role != "trainer":
            out.append((a, {}))
        elif sites[a.site].scheduler.kind == "slurm":  # one SLURM job whose tasks are the ranks ($SLURM_PROCID)
            out.append((a, env if ranks > 1 else {**env, "MASTER_ADDR": "127.0.0.1"}))
        else:
            out.append((a, {**env, "MASTER_ADDR": master, "RANK": str(a.replica)}))
    return out


def connect_client(jobdir: JobDir, *, timeout_s: float, name: str) -> Connection:
    """A client connection to the job's controller (status, scale, stop requests)."""
    job = jobdir.read_job()
    address = jobdir.read_json(jobdir.controller_json)["address"]
    transport = make_transport(job.transport.kind, secret=jobdir.secret())
    conn = transport.connect(address, timeout_s=timeout_s)
    conn.send(Message("hello", client_hello(name)))
    return conn


def client_hello(name: str) -> dict[str, Any]:
    """The header of a client's `hello` (the client fields of `rlctl.agents.messages.Hello`)."""
    return {"role": "client", "name": name, "pid": os.getpid()}


def launch_dir(job: Job, spec: JobFile, job_dir: str | Path | None) -> JobDir:
    return JobDir.create(spec.name, explicit=job_dir if job_dir is not None else spec.job_dir)
