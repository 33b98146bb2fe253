"""Running one job from the operator's side: resolve, plan, prepare the job directory, start the
agents through a launch backend, watch the controller's status, stop everything.

    resolve_job ─▶ plan_counts ─▶ prepare (job.json, plan.json, secret, SFT warm-up → model/init)
        ─▶ JobRun.start: controller ─(controller.json)─▶ trainer ranks ─▶ rollout units
        ─▶ JobRun.wait: status RPC every poll_s ─▶ on_progress(status) … controller exits
        ─▶ summary.json (+ wall_s) ;  JobRun.stop(): every agent, SIGTERM → grace → SIGKILL
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.agents.messages import Hello, make
from rlctl.config.job import Job, JobFile, Pipeline
from rlctl.errors import LaunchError, PlanError, TransportError, UsageError
from rlctl.launch.base import AgentHandle, AgentSpec, LaunchBackend
from rlctl.launch.jobdir import JobDir
from rlctl.launch.local import BACKENDS
from rlctl.transport import Connection, make_transport

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
    sites = [placement.trainer.site, *(r.site for r in placement.rollout)]
    remote = sorted({s for s in sites if job.inventory.sites[s].scheduler.kind != "local"})
    if remote:
        raise UsageError(
            f"{job.path}: site(s) {', '.join(remote)} are not local; only the local launch backend exists so far",
            hint="place the job on a site with scheduler kind 'local' (e.g. clusters/local.yaml)",
        )
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
    tp = spec.rollout.tensor_parallel or 1
    if auto:
        assert planned is not None
        alloc = planned["allocation"]
        trainer = int(next(a["gpus_used"] for a in alloc if a["role"] == "trainer"))
        rollout = [{"site": a["site"], "units": int(a["instances"])} for a in alloc if a["role"] == "rollout"]
        source = "planner"
    else:
        trainer = int(placement.trainer.gpus)
        rollout = [{"site": r.site, "units": max(1, int(r.gpus) // tp)} for r in placement.rollout]
        source = "job"
    out: dict[str, Any] = {
        "source": source,
        "trainer": {"site": placement.trainer.site, "ranks": trainer},
        "rollout": rollout,
        "controller_site": placement.controller_site or placement.trainer.site,
    }
    if planned is not None:
        out["planner"] = {k: planned.get(k) for k in ("allocation", "predicted", "rebalance") if k in planned}
    if note:
        out["note"] = note
    return out


def prepare(jobdir: JobDir, spec: JobFile, plan: dict[str, Any], *, source: str) -> None:
    """Write what the agents read, and the starting policy (the SFT warm-up, cached across runs)."""
    jobdir.write_job(spec, source=source)
    jobdir.write_json(jobdir.plan_json, plan)
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
    def __init__(
        self, jobdir: JobDir, spec: JobFile, plan: dict[str, Any], *, backends: dict[str, LaunchBackend] | None = None
    ) -> None:
        self.jobdir, self.spec, self.plan = jobdir, spec, plan
        self.backends = backends if backends is not None else {k: cls() for k, cls in BACKENDS.items()}
        self.handles: list[AgentHandle] = []
        self.controller: AgentHandle | None = None
        self._status_conn: Connection | None = None
        self.t_start = time.monotonic()

    def _spec(self, role: str, replica: int, site: str, env: dict[str, str] | None = None) -> AgentSpec:
        argv = [
            sys.executable,
            "-m",
            "rlctl.agents",
            role,
            "--job-dir",
            str(self.jobdir.path),
            "--replica",
            str(replica),
        ]
        base = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        return AgentSpec(role, replica, site, argv, {**base, **(env or {})}, self.jobdir.log(role, replica))

    def _start(self, spec: AgentSpec) -> AgentHandle:
        kind = "local"  # the only backend so far; SLURM/SSH sites get theirs from the inventory
        h = self.backends[kind].start(spec)
        self.handles.append(h)
        self.jobdir.event("agent_started", agent=spec.name, site=spec.site, backend=kind, ident=h.ident)
        return h

    def start(self) -> None:
        self.t_start = time.monotonic()
        self.jobdir.controller_json.unlink(missing_ok=True)
        self.controller = self._start(self._spec("controller", 0, self.plan["controller_site"]))
        deadline = time.monotonic() + CONTROLLER_START_S
        while not self.jobdir.controller_json.exists():
            code = self._backend(self.controller).poll(self.controller)
            if code is not None:
                raise LaunchError(
                    f"the controller exited with {code} before listening; "
                    f"see {self.jobdir.log('controller', 0)}:\n{self.log_tail('controller', 0)}"
                )
            if time.monotonic() > deadline:
                raise LaunchError(f"the controller did not listen within {CONTROLLER_START_S:.0f} s")
            time.sleep(0.05)
        t = self.plan["trainer"]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(t["ranks"])}
        for rank in range(t["ranks"]):
            self._start(self._spec("trainer", rank, t["site"], {**env, "RANK": str(rank)}))
        n = 0
        for group in self.plan["rollout"]:
            for _ in range(group["units"]):
                self._start(self._spec("rollout", n, group["site"]))
                n += 1

    def _backend(self, h: AgentHandle) -> LaunchBackend:
        return self.backends[h.backend]

    def log_tail(self, role: str, replica: int, lines: int = 15) -> str:
        p = self.jobdir.log(role, replica)
        return "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else "(no log)"

    def status(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The controller's live status, or None when it does not answer."""
        try:
            if self._status_conn is None:
                address = self.jobdir.read_json(self.jobdir.controller_json)["address"]
                transport = make_transport(self.spec.transport.kind, secret=self.jobdir.secret())
                self._status_conn = transport.connect(address, timeout_s=timeout_s)
                self._status_conn.send(make("hello", Hello(role="client", name="launch", pid=os.getpid())))
            reply = self._status_conn.request(make("status"), timeout_s=timeout_s)
            return dict(reply.header)
        except (TransportError, OSError, ValueError, KeyError):
            if self._status_conn is not None:
                self._status_conn.close()
            self._status_conn = None
            return None

    def agent_codes(self) -> dict[str, int | None]:
        return {h.spec.name: self._backend(h).poll(h) for h in self.handles}

    def wait(
        self, *, on_progress: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 1.0
    ) -> dict[str, Any]:
        """Until the controller exits; returns the job summary (summary.json + wall_s)."""
        assert self.controller is not None
        while self._backend(self.controller).poll(self.controller) is None:
            st = self.status() if on_progress is not None else None
            if st is not None and on_progress is not None:
                on_progress(st)
            time.sleep(poll_s)
        code = self._backend(self.controller).poll(self.controller)
        if self._status_conn is not None:
            self._status_conn.close()
        if not self.jobdir.summary_json.exists():
            raise LaunchError(
                f"the controller exited with {code} without a summary; "
                f"see {self.jobdir.log('controller', 0)}:\n{self.log_tail('controller', 0)}"
            )
        summary: dict[str, Any] = self.jobdir.read_json(self.jobdir.summary_json)
        summary["wall_s"] = round(time.monotonic() - self.t_start, 2)
        summary["controller_exit"] = code
        return summary

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop every agent (already-exited ones are just verified) — nothing is left running."""
        by_backend: dict[str, list[AgentHandle]] = {}
        for h in self.handles:
            by_backend.setdefault(h.backend, []).append(h)
        for kind, hs in by_backend.items():
            self.backends[kind].stop(hs, grace_s=grace_s)
        self.jobdir.event("agents_stopped", agents=[h.spec.name for h in self.handles])


def launch_dir(job: Job, spec: JobFile, job_dir: str | Path | None) -> JobDir:
    return JobDir.create(spec.name, explicit=job_dir if job_dir is not None else spec.job_dir)
