"""Running one job from the operator's side: resolve, plan, prepare the job directory, start the
agents through a launch backend, watch the controller's status, stop everything.

    resolve_job ─▶ plan_counts (counts.py) ─▶ prepare (job.json, plan.json, secret, SFT warm-up → model/init)
        ─▶ layout (host, GPU slice / SLURM request, threads, tp/pp/dp of every agent; see layout.py)
        ─▶ JobRun.start: stage the job dir to every site (stage.py: copy, verify size + SHA-256)
           ─▶ controller on its site ─(its site's controller.json, read through the site)─▶
              trainer ranks, rollout units: --job-dir <their site's copy> --controller ADDR
        ─▶ JobRun.wait: status RPC every poll_s ─▶ on_progress(status) … controller exits
           (lost without a summary: LaunchError naming `rlctl launch --resume JOB`, or Stopped after a `rlctl
           stop` asked for the end, its forced part the controller's; a trainer rank that ended before the trainer
           joined: LaunchError naming the rank and its log's error line)
        ─▶ the controller's record (summary, metrics, events) fetched to the operator's job dir
        ─▶ summary.json (+ wall_s) ;  JobRun.stop(): every agent, SIGTERM → grace → SIGKILL

`start(resume=True)` first picks the checkpoint to continue from: the newest whose controller part (on the
controller's site) and trainer part (on the trainer's) both verify and belong together (`pick_checkpoint`),
and passes its version to both as RLCTL_RESUME_VERSION (each sets its part of the newer ones aside:
`rlctl.checkpoint.files.set_aside_newer`).

The operator's job dir keeps what launch started (agents.jsonl) and the job index; when the controller
runs elsewhere its site job dir is the job's record, and the launcher mirrors its agent records there
(the controller's Spawner claims GPU slices from them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import re
import secrets
import shlex
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.agents.messages import LAUNCHER_STOP, SIGTERM_FAILURE, STOP_GRACE_S
from rlctl.checkpoint.choose import (
    LATEST_POINTER,
    ResumePoint,
    choose_resume,
    manifest_name,
    split_problem,
    verified_manifest,
)
from rlctl.checkpoint.files import PREFIX
from rlctl.config.inventory import Site
from rlctl.config.job import DatasetTask, Job, JobFile
from rlctl.errors import LaunchError, RlctlError, Stopped, UsageError
from rlctl.launch.agentenv import ENV_RESUME, ENV_RUN, ENV_VISIBLE, ParallelConfig
from rlctl.launch.agentrecords import all_recorded_agents, latest_run_names, readable_agents
from rlctl.launch.backends import AGENTS_FILE, Backends, kind_of, read_sites, record_agent, stop_agents, write_sites
from rlctl.launch.base import LOST, AgentHandle, AgentSpec, exit_text
from rlctl.launch.jobdir import (
    HOME_ENV,
    JobDir,
    event_time,
    json_lines,
    refuse_taken,
    resume_command,
    say_once,
    why_not_made,
)
from rlctl.launch.layout import PlannedAgent, checkpoint_writers, layout, trainer_parallel, unshared_trainer
from rlctl.launch.record import controller_view, event_to_record, fetch_record, record_is_here, record_view
from rlctl.launch.sitefs import HostFiles, LocalFiles, access_hosts, agent_view, host_files, is_remote, site_root
from rlctl.launch.spawn import agent_spec
from rlctl.launch.stage import STAGED_FILE, root_for, stage_all, staging_plan
from rlctl.ops.detach import this_launcher
from rlctl.ops.extend import trained_iterations
from rlctl.ops.inputs import copy_inputs, resolve_inputs
from rlctl.ops.jobdb import LIVE, JobDB, JobRow
from rlctl.rl.reward_pool import load_deadline_s
from rlctl.transport import Connection, Message, make_transport

log = logging.getLogger(__name__)

CONTROLLER_START_S = 120.0  # for the controller to listen, beyond its reward pool's first load (`load_deadline_s`)
ERROR_LOOKBACK_LINES = 400  # how far back in a failed trainer's log its first error is sought (its peers' retries)
TRAINER_POLL_S = 5.0  # how often `wait` asks the trainer ranks' sites whether a rank ended before the job had one
# … and once the trainer joined, whether a rank ended (which one died first, `first_ended_rank`): a poll per rank
# (an SSH command each on an SSH site), so less often; the failure's own sweep decides where these saw none
RANK_SWEEP_S = 30.0
UNREACHABLE_POLL_S = 5.0  # how often `wait` tries a site it cannot reach (its agents run on without the launcher)
UNREACHABLE_SAY_S = 300.0  # … and how often it says so again
# at a run's end its agents on this machine, told to stop by the controller that ended, get this long to leave by
# themselves before `stop` sends TERM (they take about a second; TERMed first, a done job's status said `-15`)
AGENTS_SETTLE_S = 3.0
PORT_FLOOR = 20000  # MASTER_PORT is picked in [PORT_FLOOR, the ephemeral range's start)
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
DRY_RUN_CONTROLLER = "CONTROLLER_ADDR"  # what `--dry-run` shows for the address the controller gets at launch
STOP_REQUESTED = "stop_requested"  # the event `rlctl stop` writes first (rlctl.ops.operate.stop)
UNSTARTED = "resume_unstarted"  # a resume that ended before any agent started: its `resumed` event is void


def resumes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's `resumed` events, less those of resumes that ended before any agent of them started (a refused
    --checkpoint, a site short of slots, a stop while staging): the job went on as it was, from none of them."""
    out: list[dict[str, Any]] = []
    for e in events:
        if e.get("event") == "resumed":
            out.append(e)
        elif e.get("event") == UNSTARTED and out:
            out.pop()
    return out


SUMMARY_ASIDE = re.compile(r"summary\.(\d+)\.json")  # an earlier run's summary, set aside when the next began


def aside_name(job_dir: Path) -> str:
    """Where the next run sets the job's summary.json aside: summary.<n>.json, n one past the highest there."""
    taken = [int(m.group(1)) for p in job_dir.iterdir() if (m := SUMMARY_ASIDE.fullmatch(p.name))]
    return f"summary.{max(taken, default=0) + 1}.json"


def current_run(jobdir: JobDir) -> str | None:
    """The id of the job's latest run (its controller's `agent_started` event); None before one, or for a run
    started by an rlctl that gave none."""
    started = jobdir.read_events("agent_started")
    runs = [e.get("run") for e in started if str(e.get("agent", "")).startswith("controller-")]
    return str(runs[-1]) if runs and runs[-1] is not None else None


def run_summary(jobdir: JobDir, run: str | None) -> dict[str, Any] | None:
    """summary.json when the run `run` wrote it; None when there is none, or when it is another run's (the run
    before, fetched back from the controller's site while this one staged). One that names no run (written by an
    rlctl without run ids), or any when `run` is None, is taken."""
    if not jobdir.summary_json.exists():
        return None
    summary = jobdir.read_json(jobdir.summary_json)
    if not isinstance(summary, dict):
        raise LaunchError(f"{jobdir.summary_json}: not a JSON object but {type(summary).__name__}")
    if run is not None and summary.get("run") not in (None, run):
        log.warning("%s is run %s's, not run %s's: not taken", jobdir.summary_json, summary.get("run"), run)
        return None
    return summary


def stop_requested(jobdir: JobDir, *, since: float) -> bool:
    """Whether `rlctl stop` was asked for the job at or after `since` (time.time()): its `stop_requested` event.
    Only the lines that name it are parsed (the others blank, for the line numbers): a launcher asks before each
    agent it starts. A damaged one is left out and said once (`JobDir.read_events`)."""
    if not jobdir.events.exists():
        return False
    lines = [line if STOP_REQUESTED in line else "" for line in jobdir.events.read_text().splitlines()]
    skipped: list[str] = []
    rows = json_lines(jobdir.events, "\n".join(lines), skipped=skipped)
    say_once(skipped)
    return any(e.get("event") == STOP_REQUESTED and event_time(e) >= since for e in rows)


def prepare(
    jobdir: JobDir,
    spec: JobFile,
    plan: dict[str, Any],
    *,
    source: str,
    job: Job,
    check: Callable[[], None] | None = None,
) -> None:
    """Write what the agents read, and what the job starts from (rlctl.ops.inputs: the starting policy —
    the SFT warm-up, cached across runs, or the user's checkpoint — a dataset's tokenized prompts, its
    reward file). `check` (`StopCheck`: a `rlctl stop` while the launch prepares) ends it by raising, in the warm-up
    and the tokenizing too; the job's record (job.json, plan.json, sites.json) is written once the inputs are built,
    so that a launch stopped (or failed) here leaves no job a `launch --resume` would take for prepared, and a new
    launch into the directory is not refused as one that holds a job."""
    spec = resolve_inputs(spec, job)
    jobdir.secret()
    copy_inputs(jobdir, spec, job, check=check)
    if check is not None:
        check()
    used = {plan["trainer"]["site"], plan["controller_site"], *(g["site"] for g in plan["rollout"])}
    # the inventory's links between the job's sites: the weight plane routes each version's inter-DC copy on them
    links = [sorted(link.between) for link in job.inventory.links if set(link.between) <= used]
    jobdir.write_json(jobdir.plan_json, {**plan, "links": links})
    write_sites(jobdir.path, {n: s for n, s in job.inventory.sites.items() if n in used})
    jobdir.write_job(spec, source=source, mapping=job.mapping if Path(source) == job.path else None)


class StopCheck:
    """What `prepare` calls between its steps and in its long loops (the SFT warm-up, a dataset's tokenizing): a
    `rlctl stop` asked for the job at or after `since` (time.time()) ends the launch there with Stopped, the index
    row `stopped`. The job's events are read at most every `every_s`."""

    def __init__(
        self, jobdir: JobDir, *, since: float, db: JobDB | None, every_s: float = 0.5, source: str | None = None
    ) -> None:
        self.jobdir, self.since, self.db, self.every_s = jobdir, since, db, every_s
        self.source = source  # the job file the launch read: what launches it again
        self._next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        if not stop_requested(self.jobdir, since=self.since):
            return
        name = self.jobdir.id
        log.warning("%s: stopped by the operator while its launch prepared it (nothing started)", name)
        self.jobdir.event("prepare_stopped")
        if self.db is not None:
            self.db.update(name, state="stopped", only_from=LIVE)
        raise Stopped(
            f"job {name} was stopped (`rlctl stop`) while its launch prepared it (SFT warm-up, data); nothing started",
            hint=f"launch it again with `{launch_again(self.source)}`",
        )


def launch_again(source: str | None) -> str:
    """The command that launches a job anew from its job file `source` (a job stopped before it was prepared has
    no job.json: `launch --resume` refuses it)."""
    return f"rlctl launch {shlex.quote(source)}" if source else "rlctl launch JOB.yaml"


def _free_port() -> int:
    """The trainer group's MASTER_PORT: free here now, and below the kernel's ephemeral range, from which every
    outgoing connection of the trainer's host takes its local port (a port picked inside it was taken before rank 0
    bound it: "Address already in use", seen in CI). The rank's host may be another machine: there, a port below
    that range is taken only by a service listening on it."""
    low = _ephemeral_low()
    pick = random.SystemRandom()  # not the launcher's seeded generator: two launches here pick apart
    for port in pick.sample(range(PORT_FLOOR, low), k=min(64, max(0, low - PORT_FLOOR))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no free port below the range (or no range to stay below): any free one
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 where it cannot be read)."""
    try:
        return int(Path(EPHEMERAL_RANGE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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
        say: Callable[[str], None] | None = None,
        show: Callable[[str], None] | None = None,
        stop_since: float | None = None,
    ) -> None:
        self.jobdir, self.spec, self.plan = jobdir, spec, plan
        # a `rlctl stop` at or after this time (time.time(); default: now) ends `start` (its launcher's start: an
        # auto-resume is a later run of the same launcher, and the operator's stop meant it too)
        self.stop_since = stop_since if stop_since is not None else time.time() - 0.001
        self.say = say  # where the operator reads progress lines (staging); None: the log only
        self.show = show  # the operator's terminal's live line (the staging bar), when it has one
        self.sites = sites if sites is not None else read_sites(jobdir.path)
        if not self.sites:
            raise LaunchError(f"{jobdir.path}: no sites.json; prepare(…, job=job) writes it")
        self.backends = Backends(self.sites, job=jobdir.id, job_dir=jobdir.path)
        self.db = db
        self.handles: list[AgentHandle] = []
        self._starting = True  # `wait` watches the trainer ranks until the trainer joins (not after `attach`)
        self.controller: AgentHandle | None = None
        self.staged: dict[str, Any] = {}
        self._record: tuple[Site, str, str] | None = None  # the controller's site, host view, site job dir
        self._status_conn: Connection | None = None
        self._unreachable: dict[str, tuple[float, float]] = {}  # site → (since, last said), while `wait` cannot poll it
        self._ended_ranks: dict[str, tuple[int, int, int]] = {}  # trainer rank seen ended → (rank, exit code, sweep)
        self._sweeps = 0  # how many times `wait` asked the trainer ranks' sites
        self.resume_env: dict[str, str] = {}
        self.resumed: ResumePoint | None = None  # the checkpoint `start(resume=True)` continues from
        self.unstarted = False  # a resume that ended before any agent started, the job put back as it was
        self.run_id: str | None = None  # this run's id: its controller writes it into summary.json (ENV_RUN)
        self.t_start = time.monotonic()

    @property
    def id(self) -> str:
        return self.jobdir.id

    def render(self, *, master_port: int) -> list[dict[str, Any]]:
        """Per agent, for `launch --dry-run`: where it runs, what it gets, and the exact script / command."""
        out = []
        for a, env in planned_agents(self.plan, self.sites, self.spec, master_port=master_port):
            site_dir = JobDir(Path(site_root(self.sites[a.site], self.id, here=self.jobdir.path)))
            spec = agent_spec(site_dir, a, self.sites[a.site], env=env, controller=DRY_RUN_CONTROLLER)
            backend = self.backends.for_site(a.site)
            # its devices (`devices` maps slots); "" for one on the CPU (the controller too: it has no slice)
            gpus = spec.env.get(ENV_VISIBLE) if spec.gpu_slice or spec.env.get(ENV_VISIBLE) == "" else None
            out.append(
                {
                    "agent": spec.name,
                    "site": spec.site,
                    "backend": backend.kind,
                    "host": backend.host_for(spec),  # None: SLURM places it
                    "cuda_visible_devices": gpus,
                    "gpu_request": backend.request_summary(spec),
                    "threads": int(spec.env.get("OMP_NUM_THREADS") or spec.resources.cpus_per_task),
                    "parallel": a.parallel.short(),
                    "job_dir": str(site_dir.path),
                    "script": backend.render(spec),
                }
            )
        return out

    def staging_plan(self) -> list[dict[str, Any]]:
        """For `launch --dry-run`: each site's job dir and what is staged there."""
        return staging_plan(self.sites, job_id=self.id, here=self.jobdir.path)

    def site_dir(self, a: PlannedAgent) -> JobDir:
        """The job's directory on the agent's site (its host's view), as staged."""
        host = a.gpu_slice.host if a.gpu_slice is not None else None
        return JobDir(Path(root_for(self.staged[a.site]["roots"], host)))

    def _start(
        self, a: PlannedAgent, env: dict[str, str] | None = None, *, controller: str | None = None
    ) -> AgentHandle:
        if a.role in ("controller", "trainer"):
            env = {**(env or {}), **self.resume_env}
        if a.role == "controller" and self.run_id is not None:
            env = {**(env or {}), ENV_RUN: self.run_id}
        spec: AgentSpec = agent_spec(self.site_dir(a), a, self.sites[a.site], env=env, controller=controller)
        h = self.backends.for_site(a.site).start(spec)
        record_agent(self.jobdir.path, h)
        if self._record is not None and h.spec.role != "controller":  # the controller's Spawner reads these
            self._mirror_record(h)
        self.handles.append(h)
        gpus = spec.gpu_slice.visible_devices if spec.gpu_slice else None
        run = {"run": self.run_id} if h.spec.role == "controller" else {}  # the run `current_run` names
        self.jobdir.event(
            "agent_started", agent=spec.name, site=spec.site, backend=h.backend, ident=h.ident, gpus=gpus, **run
        )
        return h

    def _unstart(self, aside: str, row: JobRow | None) -> None:
        """Undo what `start` changed before it refused to start: the summary of the run before back in place (here
        and on the controller's site), the index row back to `row` (its state, and what the run's `launching` row
        replaced: the job file it came from, its launcher, its agents' exits, when it was launched)."""
        if self._record is not None:
            try:
                fs, root = self._files()
                try:
                    fs.move(f"{root}/{aside}", f"{root}/summary.json")
                finally:
                    fs.close()
            except LaunchError as e:  # (the site that refused the run): the error that ended it is the one said
                log.warning("the summary of the run before stays %s on the controller's site: %s", aside, e)
        LocalFiles().move(str(self.jobdir.path / aside), str(self.jobdir.summary_json))
        if self.resumed is not None:  # its `resumed` event names a checkpoint the job did not go on from
            self.jobdir.event(UNSTARTED, version=self.resumed.version)
        # (`stopped` too where the job had finished: a `rlctl stop` while a resume with --iterations staged left a
        # finished job's row `stopped` beside its summary's `done`. A failed or stopped job the operator stopped
        # while it staged — an auto-resume's included — stays `stopped`, as the stop said; a row the index did not
        # hold stays, `stopped`: the stop's own write to it comes after, and would find none)
        undone = ("launching", "stopped") if row is not None and row.state == "finished" else ("launching",)
        if self.db is not None and row is not None:
            self.db.put_back(row, only_from=undone)
        elif self.db is not None and self.db.remove(self.id, only_from=("launching",)):
            # a job the index did not hold (a copied job dir, an index lost): out of it again, and this run with it
            # (`resume_command` names its directory: the id names no job now)
            self.db = None

    def _register(self, state: str, **info: Any) -> None:
        if self.db is None:
            return
        if state == "failed" and stop_requested(self.jobdir, since=self.stop_since):
            # `rlctl stop` asked for the end first (its controller killed past the grace leaves no summary, a trainer
            # rank killed before it joined): the operator's `stopped`, written after its forced stop, would come
            # second and keep this `failed` (it only replaces a live state)
            state = "stopped"
        if state == "launching":  # one write: a `status --all` in between saw a row without its launcher
            info = {"controller_exit": None, "trainer_exit": None, "agent_exits": None, **info}  # the run before's
            spec = self.spec.model_dump(mode="json", by_alias=True)
            self.db.put(self.id, job_dir=str(self.jobdir.path), spec=spec, info=info)
            return
        self.db.update(self.id, state=state, info=info or None)

    def _files(self) -> tuple[HostFiles, str]:
        """The controller's site job dir and a view of it (the caller closes the view)."""
        assert self._record is not None
        site, host, root = self._record
        return host_files(site, host), root

    def _mirror_record(self, h: AgentHandle) -> None:
        """Append the agent's record to the controller site's agents.jsonl (its Spawner claims slices from it)."""
        line = (self.jobdir.path / AGENTS_FILE).read_text().splitlines()[-1] + "\n"
        fs, root = self._files()
        try:
            fs.append(f"{root}/{AGENTS_FILE}", line)
        finally:
            fs.close()

    def _prepare(
        self, aside: str, *, resume: bool, checkpoint: int | None
    ) -> tuple[list[tuple[PlannedAgent, dict[str, str]]], bool]:
        """What `start` does before the first agent starts: the agents placed, the job staged to its sites, the
        controller's view of it, and for a resume the checkpoint it continues from (`resume_point`); the agents
        and whether the controller's job dir is elsewhere. `aside`: where the run before's summary went."""
        agents = planned_agents(self.plan, self.sites, self.spec, master_port=_free_port())  # refuses a short site
        trainers = [a for a, _ in agents if a.role == "trainer"]
        refuse_unshared_trainer(
            trainers[0].site,
            self.sites[trainers[0].site],
            trainers,
            writers=checkpoint_writers(self.plan, self.spec),
            resume=resume,
        )
        t0 = time.monotonic()
        self.staged = stage_all(self.jobdir.path, self.sites, job_id=self.id, say=self.say, show=self.show)
        copied = {s: sum(v["copied"].values()) for s, v in self.staged.items()}
        self.jobdir.event("staged", seconds=round(time.monotonic() - t0, 2), copied=copied)
        c = agents[0][0]
        site, host, root = controller_view(self.staged, self.sites, c.site, self._controller_host(c))
        remote = is_remote(site) or Path(root) != self.jobdir.path
        if remote:  # the controller's own view of the job: where it is staged (its Spawner's record)
            self._record = (site, host, root)
            fs, _ = self._files()
            try:
                fs.put(self.jobdir.path / STAGED_FILE, f"{root}/{STAGED_FILE}")
                for name in ("controller.json", AGENTS_FILE):  # leftovers of an earlier run of this job id
                    fs.put(self._empty(), f"{root}/{name}")
                if fs.move(f"{root}/summary.json", f"{root}/{aside}"):  # fetched back here while staging: a copy
                    self.jobdir.summary_json.unlink(missing_ok=True)
            finally:
                fs.close()
        if resume:
            self.resumed = self.resume_point(trainer=trainers[0], only=checkpoint)
            self.resume_env = {ENV_RESUME: str(self.resumed.version)}
            skipped = [{"version": v, "why": why} for v, why in self.resumed.skipped]
            self.jobdir.event("resumed", version=self.resumed.version, pointer=self.resumed.pointer, skipped=skipped)
        # `rlctl stop` stops the agents agents.jsonl lists when it reads it: one asked for while this run stages or
        # starts is seen here, before each agent starts and once all have, and ends the run (nothing of it runs on)
        self._stop_if_asked()
        return agents, remote

    def start(self, *, resume: bool = False, checkpoint: int | None = None) -> None:
        """Stage, then start the controller, then (once it listens) the trainer ranks and rollout units.
        `resume`: the controller and trainer continue from the job's latest complete checkpoint
        (`resume_point`; version 0: the job never completed one, it starts over), or from `checkpoint`."""
        self.t_start = time.monotonic()
        self.run_id = secrets.token_hex(6)
        self.jobdir.controller_json.unlink(missing_ok=True)
        # the run before's summary, kept as summary.<n>.json: here it would be taken for this run's end (by `wait`,
        # by `rlctl status`) once this run's controller is gone without one
        aside = aside_name(self.jobdir.path)
        LocalFiles().move(str(self.jobdir.summary_json), str(self.jobdir.path / aside))
        before = None  # the job's index row before this run, None for none (a refused resume puts it back)
        if resume and self.db is not None:
            with contextlib.suppress(RlctlError):
                before = self.db.get(self.id)
        self._register("launching", sites=sorted(self.sites), launcher=this_launcher())
        try:
            agents, remote = self._prepare(aside, resume=resume, checkpoint=checkpoint)
        except BaseException:  # (a site short of slots, staging that failed, a checkpoint refused, Ctrl-C)
            if resume:  # no agent of the run started: the job as it was, its summary and index row, for its next resume
                self.unstarted = True
                self._unstart(aside, before)
            raise
        c = agents[0][0]
        self.controller = self._start(c)
        address = self._controller_address(remote)
        # never over an operator's `stopped`: only a row still `launching` becomes `running`
        if self.db is not None and not self.db.update(
            self.id, state="running", controller=address, only_from=("launching",)
        ):
            self._stopped_while_starting()
        for a, env in agents[1:]:
            self._stop_if_asked()
            self._start(a, env, controller=address)
        self._stop_if_asked()

    def _stop_if_asked(self) -> None:
        if stop_requested(self.jobdir, since=self.stop_since):
            self._stopped_while_starting()

    def _stopped_while_starting(self) -> None:
        """Stop what this run started (the index: stopped) and end `start` with Stopped."""
        started = [h.spec.name for h in self.handles]
        log.warning("%s: stopped by the operator while its run started (started: %s)", self.id, started or "none")
        self.stop()
        hint = f"continue it with `{self.resume_command()}`"
        if not started and self.resumed is not None:  # a resume stopped as it staged: `start` puts the job back as
            # it was (a finished one stays finished: a plain resume is refused; a roll-back's --checkpoint is not kept)
            hint = (
                f"the job is as it was before this resume: continue it with `{self.resume_command()}` (and the "
                "resume's --iterations / --checkpoint, where it had them)"
            )
        raise Stopped(
            f"job {self.id} was stopped (`rlctl stop`) while its launcher started a run; "
            f"{len(started)} agent(s) it had started were stopped",
            hint=hint,
        )

    def attach(self) -> None:
        """Watch a job whose launcher is gone (`rlctl attach`): its controller and agents as the job dir records
        them, its record where the controller keeps it; then `wait` as if this process had started them."""
        handles = readable_agents(self.jobdir.path)
        names = latest_run_names(self.jobdir.path)  # the latest run's (not every run's: a resumed job's names repeat)
        if names is None or not any(h.spec.role == "controller" for h in handles):
            raise LaunchError(f"{self.jobdir.path}: no controller recorded in {AGENTS_FILE}: the job never started")
        self.handles = [h for h in handles if h.spec.name in names]
        self.controller = next(h for h in self.handles if h.spec.role == "controller")
        self._starting = False  # its trainer's start-up was the gone launcher's to watch
        started = [
            event_time(e)
            for e in self.jobdir.read_events("agent_started")
            if e.get("event") == "agent_started" and e.get("agent") == self.controller.spec.name and event_time(e) > 0
        ]
        if started:  # the run's wall time counts from its start, not from this attach
            self.t_start = time.monotonic() - max(0.0, time.time() - started[-1])
        view = record_view(self.jobdir.path)
        if view is not None and not record_is_here(view[0], view[2], self.jobdir.path):
            self._record = view
        self.run_id = current_run(self.jobdir)
        if self.db is not None:
            self.db.update(self.id, info={"launcher": this_launcher()})

    def _empty(self) -> Path:
        p = self.jobdir.path / ".empty"
        p.write_text("")
        return p

    def _controller_host(self, c: PlannedAgent) -> str | None:
        """The host view the controller runs in: an SSH site places it like any spec without a slice."""
        return self.backends.for_site(c.site).host_for(agent_spec(self.jobdir, c, self.sites[c.site]))

    def _controller_address(self, remote: bool) -> str:
        """Wait until the controller listens: its controller.json on its site (read there; copied here)."""
        assert self.controller is not None
        # before it listens, the controller waits for its reward pool's first load (a dataset task's reward), which
        # has a deadline of its own
        task = self.spec.task
        wait_s = CONTROLLER_START_S
        if isinstance(task, DatasetTask):
            wait_s += load_deadline_s(task.reward_timeout_s, task.reward_load_timeout_s)
        deadline = time.monotonic() + wait_s
        while True:
            text = self._read_record("controller.json") if remote else None
            if not remote and self.jobdir.controller_json.exists():
                break
            if text:
                self.jobdir.write_json(self.jobdir.controller_json, json.loads(text))
                break
            code = self.poll(self.controller)
            if code is not None and stop_requested(self.jobdir, since=self.stop_since):
                self._stopped_while_starting()  # `rlctl stop` ended it (a resume loading its checkpoint): no fault
            if code is not None:  # its log's end in the launcher's log; the error one line, with its ERROR line
                tail = self.log_tail("controller", 0)
                log.warning("the end of %s:\n%s", self.controller.spec.log_path, tail)
                raise LaunchError(
                    f"the controller exited with {exit_text(code)} before listening (its log: "
                    f"{self.controller.spec.log_path})" + last_error(tail),
                    hint="fix what its log says, then launch the job again",
                )
            if time.monotonic() > deadline:
                raise LaunchError(f"the controller did not listen within {wait_s:.0f} s")
            time.sleep(0.25 if remote else 0.05)
        return controller_address(self.jobdir)

    def resume_point(self, *, trainer: PlannedAgent, only: int | None = None) -> ResumePoint:
        """The checkpoint a resumed controller and trainer (rank 0: it writes the trainer's part) load: the
        newest whose parts verify on their sites, older ones in turn (`pick_checkpoint`), with what was skipped and
        why (said by `Runs.start`; logged at debug level only: it was said twice). RlctlError (one line) when
        checkpoints exist but none is complete. `only`: that one (`launch --resume --checkpoint`), UsageError when its
        parts do not verify."""
        site = self.sites[trainer.site]
        t_fs = host_files(site, agent_view(site, trainer.gpu_slice.host if trainer.gpu_slice else None))
        try:
            c_fs, c_root = self._files() if self._record is not None else (LocalFiles(), str(self.jobdir.path))
            try:
                point = pick_checkpoint(
                    (c_fs, JobDir(Path(c_root))),
                    (t_fs, self.site_dir(trainer)),
                    split=trainer_parallel(self.plan),
                    only=only,
                )
            finally:
                c_fs.close()
        finally:
            t_fs.close()
        for version, why in point.skipped:  # said to the operator by the run's launcher (`Runs.start`), once
            log.debug("%s: checkpoint v%d not used: %s", self.id, version, why)
        log.info("%s: resuming from checkpoint v%d (%s)", self.id, point.version, point.pointer)
        return point

    def _read_record(self, name: str) -> str | None:
        fs, root = self._files()
        try:
            return fs.read_text(f"{root}/{name}")
        finally:
            fs.close()

    def poll(self, h: AgentHandle) -> int | None:
        return self.backends.for_site(h.spec.site).poll(h)

    def _watch(self, h: AgentHandle) -> int | None:
        """`poll` for `wait`: a site this machine cannot reach (its SSH reset, its login node down) is not the end
        of the agent, whose job runs on there without the launcher: None, said once (and every UNREACHABLE_SAY_S
        while it lasts), and when the site answers again."""
        site = h.spec.site
        try:
            code = self.poll(h)
        except LaunchError as e:
            now = time.monotonic()
            since, said = self._unreachable.get(site, (now, -math.inf))
            if now - said >= UNREACHABLE_SAY_S:
                self._say(
                    f"cannot reach site {site} to watch {h.spec.name} ({e}); the job runs on there: trying again "
                    f"every {UNREACHABLE_POLL_S:g} s (`rlctl stop {shlex.quote(str(self.jobdir.path))}` to end it)"
                    + (f"; unreachable for {now - since:.0f} s" if now > since else "")
                )
                said = now
            self._unreachable[site] = (since, said)
            return None
        if site in self._unreachable:
            since, _ = self._unreachable.pop(site)
            self._say(f"site {site} answers again after {time.monotonic() - since:.0f} s")
        return code

    def _say(self, text: str) -> None:
        log.warning("%s", text)
        if self.say is not None:
            self.say(text)

    def log_tail(self, role: str, replica: int, lines: int = 15) -> str:
        """The end of an agent's log, read on its site."""
        h = next((h for h in self.handles if h.spec.name == f"{role}-{replica}"), None)
        if h is None or h.spec.log_path is None:
            return "(no log)"
        site = self.sites[h.spec.site]
        view = h.ident.get("host") or access_hosts(site)[0]
        fs = host_files(site, view if is_remote(site) else "localhost")
        try:
            tail = fs.tail(str(h.spec.log_path), lines)
        except LaunchError as e:
            return f"(log unreadable: {e})"
        finally:
            fs.close()
        return "\n".join(tail) if tail is not None else "(no log)"

    def status(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The controller's live status, or None when it does not answer."""
        try:
            if self._status_conn is None:
                self._status_conn = connect_client(self.jobdir, timeout_s=timeout_s, name="launch")
            reply = self._status_conn.request(Message("status", {}), timeout_s=timeout_s)
            return dict(reply.header)
        except (RlctlError, OSError, ValueError, KeyError):
            if self._status_conn is not None:
                self._status_conn.close()
            self._status_conn = None
            return None

    def agent_codes(self) -> dict[str, int | None]:
        return {h.spec.name: self.poll(h) for h in self.handles}

    def wait(
        self, *, on_progress: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 1.0
    ) -> dict[str, Any]:
        """Until the controller exits; returns the job summary (summary.json + wall_s). A trainer rank that ends
        before the job's trainer joined the controller (it could not form its group, load the model, see its GPUs)
        ends the wait with a LaunchError naming it and its log's last lines: the controller would wait for it. A
        controller gone without a summary is a LaunchError too, or Stopped once `rlctl stop` asked for the end (its
        forced part killed the controller past the grace). A site this machine cannot reach for a while does not
        end it: the job runs on there (`_watch`)."""
        assert self.controller is not None
        ranks = [h for h in self.handles if h.spec.role == "trainer"]
        trainers = ranks if self._starting else []
        next_check = time.monotonic() + TRAINER_POLL_S
        while (code := self._watch(self.controller)) is None:
            due = bool(ranks) and time.monotonic() >= next_check
            watching = bool(trainers) and due
            st = self.status() if on_progress is not None or watching else None
            if st is not None and on_progress is not None:
                on_progress(st)
            if due:
                next_check = time.monotonic() + (TRAINER_POLL_S if trainers else RANK_SWEEP_S)
            if watching and st is not None:
                if any(a.get("name") == "trainer-0" for a in st.get("agents", [])):
                    trainers = []  # the trainer joined: its end is the controller's to handle (a lost trainer)
                else:
                    self._ended_before_joining(trainers)
            elif due:
                self._note_ended_ranks(ranks)  # which rank ended first, for the controller's `trainer-0 was lost`
            time.sleep(UNREACHABLE_POLL_S if self._unreachable else poll_s)
        if self._status_conn is not None:
            self._status_conn.close()
        if self._record is not None:
            try:
                fetch_record(self.jobdir.path, *self._record)
            except LaunchError as e:
                site = self.plan["controller_site"]
                raise LaunchError(
                    f"the job ended (controller exit {exit_text(code)}); its record on site {site} could not be "
                    f"fetched: {e}",
                    hint=f"`rlctl status {shlex.quote(str(self.jobdir.path))}` fetches it once the site answers",
                ) from e
        found = run_summary(self.jobdir, self.run_id)
        if found is None and stop_requested(self.jobdir, since=self.stop_since):
            # `rlctl stop` killed the controller past its grace (its forced part): the operator's end, not a failure
            # to resume from; exit 1 as for a graceful stop's `did not finish: stopped`
            self._register("stopped", controller_exit=code)
            raise Stopped(
                f"job {self.id} was stopped by `rlctl stop` (forced: its controller ended with {exit_text(code)} "
                f"after the stop request, without a summary; its log: {self.controller.spec.log_path})",
                hint=f"continue it with `{self.resume_command()}`",
            )
        if found is None:
            self._register("failed", controller_exit=code)
            log.warning("the end of %s:\n%s", self.controller.spec.log_path, self.log_tail("controller", 0))
            raise LaunchError(
                f"the controller exited with {exit_text(code)} without a summary (its log: "
                f"{self.controller.spec.log_path})",
                hint=f"continue the job from its latest complete checkpoint: `{self.resume_command()}`",
            )
        if stop_requested(self.jobdir, since=self.stop_since):  # a `rlctl stop` whose request it did not answer
            self._stopped_by_term(found)
        summary = found
        here = str(self.jobdir.path)  # the job dir `status` and `report` name; the summary says the controller's
        if summary.get("job_dir") not in (None, here):  # on its site (an SSH site, a SLURM site's workdir)
            summary["controller_job_dir"] = {"site": self.plan["controller_site"], "path": summary["job_dir"]}
        summary["job_dir"] = here
        summary["wall_s"] = round(time.monotonic() - self.t_start, 2)
        summary["controller_exit"] = code
        if str(summary.get("state", "")).startswith("failed: trainer "):
            self._note_ended_ranks(ranks)
            self._name_first_rank(summary)
        state = "finished" if summary["state"] == "done" else "stopped" if summary["state"] == "stopped" else "failed"
        self._register(state, controller_exit=code)
        return summary

    def _note_ended_ranks(self, ranks: list[AgentHandle]) -> None:
        """Record each trainer rank newly seen ended, with its exit code and the sweep that saw it."""
        ended = [(h, c) for h in ranks if h.spec.name not in self._ended_ranks and (c := self._watch(h)) is not None]
        for h, c in ended:
            self._ended_ranks[h.spec.name] = (h.spec.replica, c, self._sweeps)
        self._sweeps += 1

    def first_ended_rank(self) -> tuple[str, int, int] | None:
        """The trainer rank (name, rank, exit code) that ended first as far as the launcher can tell, or None: of
        those its earliest sweep saw ended, one a signal ended (kill -9, the OOM killer, LOST) before one that
        exited, then a rank other than 0 (the controller hears of rank 0 only: when a peer dies, rank 0 fails on
        its broken group and the controller says `trainer trainer-0 was lost`), then the lowest rank."""
        if not self._ended_ranks:
            return None
        name, (rank, code, _) = min(
            self._ended_ranks.items(),
            key=lambda kv: (kv[1][2], not (kv[1][1] < 0 or kv[1][1] == LOST), kv[1][0] == 0, kv[1][0]),
        )
        return name, rank, code

    def _name_first_rank(self, summary: dict[str, Any]) -> None:
        """The controller's `failed: trainer trainer-0 was lost (…)` names the rank it talks to, which is rarely the
        one that died: prefix the rank that ended first and how (state, event, summary.json), versus naming rank 0
        for a kill of rank 1 before."""
        first = self.first_ended_rank()
        if first is None:
            return
        name, rank, code = first
        state = str(summary["state"]).removeprefix("failed: ")
        then = "; " if name == "trainer-0" else " first; then "  # (rank 0 alone: how the one the controller lost ended)
        summary["state"] = f"failed: trainer rank {rank} ({name}) exited with {exit_text(code)}{then}{state}"
        summary["trainer_ranks_ended"] = {n: c for n, (_, c, _) in self._ended_ranks.items()}
        self.jobdir.event(
            "trainer_rank_ended",
            agent=name,
            rank=rank,
            exit_code=code,
            exit=exit_text(code),
            first=True,
            ended=summary["trainer_ranks_ended"],
        )
        on_disk = run_summary(self.jobdir, self.run_id)
        if on_disk is not None:  # what `rlctl status` and `report` read say so too
            on_disk["state"] = summary["state"]
            on_disk["trainer_ranks_ended"] = summary["trainer_ranks_ended"]
            self.jobdir.write_json(self.jobdir.summary_json, on_disk)

    def _ended_before_joining(self, trainers: list[AgentHandle]) -> None:
        for h in trainers:
            code = self._watch(h)
            if code is None:
                continue
            self._register("failed", trainer_exit=code)
            self._end_failed(f"{h.spec.name} exited with {exit_text(code)} before the job's trainer joined")
            tail = self.log_tail(h.spec.role, h.spec.replica, lines=ERROR_LOOKBACK_LINES)
            log.warning("the end of %s:\n%s", h.spec.log_path, "\n".join(tail.splitlines()[-15:]))
            raise LaunchError(
                f"{h.spec.name} exited with {exit_text(code)} before the job's trainer joined (its log: "
                f"{h.spec.log_path})" + first_error(tail, ranks=int(self.plan["trainer"]["ranks"])),
                hint="fix what its log says, then launch the job again",
            )

    def _end_failed(self, why: str, *, grace_s: float = STOP_GRACE_S) -> None:
        """Tell the controller the job failed (`why`) where it cannot see it, and wait (at most `grace_s`) for it
        to end: its summary says `failed: why`, as the index does. Before, the launcher's stop (SIGTERM) ended it
        and the summary said `stopped`, which `status` showed beside the index's `failed`. A controller that does
        not answer is left to that stop (logged)."""
        assert self.controller is not None
        try:
            conn = connect_client(self.jobdir, timeout_s=5.0, name="launch-failed")
            try:
                conn.request(Message("shutdown", {"failed": why}), timeout_s=5.0)
            finally:
                conn.close()
        except (RlctlError, OSError, ValueError, KeyError) as e:
            log.warning("could not tell the controller the job failed (%s); its summary may say stopped", e)
            return
        deadline = time.monotonic() + grace_s
        while self._watch(self.controller) is None and time.monotonic() < deadline:
            time.sleep(0.2)

    def _settle(self, handles: list[AgentHandle]) -> None:
        """Up to AGENTS_SETTLE_S for the agents on this machine to leave by themselves (the controller that ended
        told them to stop), before `stop` sends TERM. Remote ones are not waited for: each look is an SSH call, and
        only a local agent's exit code is this launcher's to record."""

        def here(h: AgentHandle) -> bool:
            try:
                return self.backends.for_site(h.spec.site).on_this_machine
            except LaunchError:  # a site the job's record lacks: `stop_agents` says it, once the others are stopped
                return False

        left = [h for h in handles if here(h)]
        deadline = time.monotonic() + AGENTS_SETTLE_S
        while left and time.monotonic() < deadline:
            with contextlib.suppress(LaunchError):
                left = [h for h in left if self.poll(h) is None]
            if left:
                time.sleep(0.05)

    def _controller_runs(self) -> bool:
        """Whether this run's controller may still run (its site not answering: it may)."""
        if self.controller is None:
            return False
        try:
            return self.poll(self.controller) is None
        except LaunchError:
            return True

    def time_limit(self) -> str | None:
        """Where this run's controller or trainer reached its site's time limit (SLURM's `--time`, the site's
        `scheduler.time_limit_min`): `site S (controller-0: SLURM job N ran … of its … limit)`; None where neither did
        or its site does not answer. A planned end: `Runs` resumes it without spending `checkpoint.auto_resume`."""
        ends = [
            h for h in self.handles if h.spec.role == "controller" or (h.spec.role, h.spec.replica) == ("trainer", 0)
        ]
        for h in ends:  # (the trainer's ranks are one scheduler job: rank 0's says)
            try:
                said = self.backends.for_site(h.spec.site).at_time_limit(h)
            except LaunchError as e:
                log.info("site %s: cannot tell whether %s reached its time limit: %s", h.spec.site, h.spec.name, e)
                continue
            if said is not None:
                return f"site {h.spec.site} ({h.spec.name}: {said})"
        return None

    def _stopped_by_term(self, summary: dict[str, Any]) -> None:
        """A summary whose controller says it got SIGTERM with no stop asked for (`SIGTERM_FAILURE`), when the
        launcher knows one was (its own stop, a `rlctl stop` whose request the controller did not answer): `stopped`,
        here and in summary.json (a controller on another site cannot see the stop's event)."""
        if summary.get("state") != f"failed: {SIGTERM_FAILURE}":
            return
        summary["state"] = "stopped"
        on_disk = run_summary(self.jobdir, self.run_id)
        if on_disk is not None:
            on_disk["state"] = "stopped"
            self.jobdir.write_json(self.jobdir.summary_json, on_disk)

    def _own_exits(self) -> dict[str, int]:
        """The exit codes of the agents this launcher started as its own processes (a local site's): only their
        parent can read them, so `rlctl status` from another terminal says `exited (status unknown)` without this
        record. The latest agent of each name; one it cannot tell (not its child) is left out."""
        latest = {h.spec.name: h for h in self.handles if self.backends.for_site(h.spec.site).on_this_machine}
        exits = {}
        for name, h in latest.items():
            with contextlib.suppress(LaunchError):
                if (code := self.poll(h)) is not None and code != LOST:
                    exits[name] = code
        return exits

    def _record_exits(self, exits: dict[str, int]) -> None:
        """`_own_exits` where `rlctl status` reads them: this run's summary.json, and the index row (a run that
        ended without a summary)."""
        if not exits:
            return
        summary = run_summary(self.jobdir, self.run_id)
        if summary is not None:
            summary["agent_exits"] = exits
            self.jobdir.write_json(self.jobdir.summary_json, summary)
        if self.db is not None:
            self.db.update(self.id, info={"agent_exits": exits})

    def resume_command(self) -> str:
        """How the user continues this job: by its index id, or its directory when it is not in the index."""
        return resume_command(self.id if self.db is not None else self.jobdir.path)

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Stop every agent of the job on every site, including units the controller started; a line of agents.jsonl
        that is no agent record is one of the problems (LaunchError), once every agent read is stopped."""
        skipped: list[str] = []  # (read strictly, a damaged line stopped none: Ctrl-C left the whole job running)
        handles = all_recorded_agents(self.jobdir.path, skipped=skipped)
        ending = self._controller_runs()
        if self.controller is not None and not ending:
            self._settle(handles)
        if ending:  # its SIGTERM is this stop's: the run ends `stopped`, not failed (`ControllerAgent._stop_meant`)
            row = self.jobdir.event(LAUNCHER_STOP)
            if self._record is not None:  # where the controller reads its events
                event_to_record(self.jobdir.path, row, self._record)
        problems = skipped + stop_agents(self.backends, handles, grace_s=grace_s)
        exits = self._own_exits()
        if self._record is not None:
            try:
                fetch_record(self.jobdir.path, *self._record)
            except LaunchError as e:  # the job's record stays on the controller's site
                problems.append(f"cannot fetch the job's record from site {self.plan['controller_site']}: {e}")
        if ending:  # a controller on another site did not see the event
            summary = run_summary(self.jobdir, self.run_id)
            if summary is not None:
                self._stopped_by_term(summary)
        self._record_exits(exits)
        self.jobdir.event("agents_stopped", agents=[h.spec.name for h in handles], problems=problems, exits=exits)
        if self.db is not None:
            try:
                live = self.db.get(self.id).state in LIVE
            except RlctlError:  # no row: a refused roll-back took out the one its start put
                live = False
            if live:
                self._register("stopped")
        self.backends.close()
        if problems:
            raise LaunchError("; ".join(problems))


def last_error(log_tail: str, *, max_chars: int = 400) -> str:
    """The last ERROR record's message in an agent's log tail as `: <message>` (what a launch error quotes of it:
    the tail itself goes to the launcher's log, never into the one-line error), or "" when it has none."""
    last = next((line for line in reversed(log_tail.splitlines()) if " ERROR " in line), "")
    if not last:
        return ""
    message = last.split(": ", 1)[-1]  # past "<time> ERROR <agent> <logger>"
    return ": " + (message if len(message) <= max_chars else message[: max_chars - 1] + "…")


def first_error(log_text: str, *, ranks: int, max_chars: int = 400) -> str:
    """A trainer's `last_error`: its log's first ERROR record as `: rank R: <message>` (the cause; what follows is
    often its peers failing after it, or a flood of their rendezvous retries), without `rank R` for a single rank;
    "" when it has none."""
    for line in log_text.splitlines():
        m = re.search(r" ERROR \S+-(\d+) \S+: (.*)", line)
        if m:
            message = m[2] if len(m[2]) <= max_chars else m[2][: max_chars - 1] + "…"
            return f": rank {m[1]}: {message}" if ranks > 1 else f": {message}"
    return ""


def pick_checkpoint(
    controller: tuple[HostFiles, JobDir],
    trainer: tuple[HostFiles, JobDir],
    *,
    split: ParallelConfig | None = None,
    only: int | None = None,
) -> ResumePoint:
    """The checkpoint a resume continues from (choose_resume), each part read through its own site's
    view of that site's job dir: the controller's part and `latest.json` on the controller's site, the
    trainer's part on the trainer's; the trainer part must be the one the controller part names (its
    manifest's SHA-256). The checkpoints whose controller manifest is there (the controller writes its part
    last) are tried, newest first: those on disk, not those the job's `checkpoint.every_iterations` makes now (a
    count edited in job.json since left the ones written before out). `split`: the trainer's tp × pp × dp, which
    must be the one the checkpoint was written at (every rank restores the shard of its (tp, pp) position),
    else UsageError. `only`: that checkpoint or a UsageError saying why not (a roll-back the operator named)."""
    c_fs, c_dir = controller
    t_fs, t_dir = trainer
    on_disk = stored_checkpoints(c_fs, c_dir)

    def problem(version: int) -> str | None:
        try:
            c = verified_manifest(c_fs, str(c_dir.checkpoint(version)), "controller")
        except ValueError as e:
            return f"controller part: {e}"
        try:
            t = verified_manifest(t_fs, str(t_dir.checkpoint(version)), "trainer")
        except ValueError as e:
            return f"trainer part: {e}"
        if c.get("trainer_digest") != t["digest"]:
            return "its trainer part is not the one its controller part was written with"
        why = split_problem(t, split) if split is not None else None
        if why is not None:  # not a damaged checkpoint: an older one would not fit either
            old = "no split" in why  # written before the trainer's ranks kept their shards: nothing can load it
            raise UsageError(
                f"{t_dir.checkpoint(version)}: {why}",
                hint="start the job anew with `rlctl launch JOB.yaml`"
                if old
                else "resume the job with the plan it was trained with (its plan.json), or start it anew",
            )
        return None

    if only is not None:
        why = problem(only) if only in on_disk else f"not on the controller's site ({c_dir.checkpoint(only)})"
        if why is not None:
            raise UsageError(f"--checkpoint v{only}: {why}", hint="name another with --checkpoint, or leave it out")
        return ResumePoint(only, f"--checkpoint v{only}")
    pointer = c_fs.read_text(str(c_dir.path / "checkpoints" / LATEST_POINTER))
    return choose_resume(pointer, on_disk, problem)


def stored_checkpoints(fs: HostFiles, jobdir: JobDir) -> list[int]:
    """The versions whose controller part's manifest is in `jobdir`'s checkpoints/iter-N (as `fs` sees it), newest
    first (a resume's set aside in abandoned/ are not)."""
    name = manifest_name("controller")
    found = set()
    for rel in fs.list_files(str(jobdir.checkpoints)):
        top, _, rest = rel.partition("/")
        if rest == name and top.startswith(PREFIX) and top[len(PREFIX) :].isdigit():
            found.add(int(top[len(PREFIX) :]))
    return sorted(found, reverse=True)


def refuse_unshared_trainer(
    name: str, site: Site, trainers: list[PlannedAgent], *, writers: list[int], resume: bool = False
) -> None:
    """The trainer ranks that write checkpoint shards (`writers`: data-parallel replica 0's) write them into the
    job dir they see, and rank 0 seals the part once it sees every shard there; a resumed rank reads the policy
    and its shard there. So on an SSH site whose hosts share no work root the writers must share a host, and on
    resume every rank must (`layout.unshared_trainer`): else UsageError, one line, before any agent starts.
    `rlctl check` refuses the first case too (`rlctl.ops.preflight`)."""
    why = unshared_trainer(name, site, trainers, writers=writers, resume=resume)
    if why is not None:
        raise UsageError(why[0], hint=why[1])


def planned_agents(
    plan: dict[str, Any], sites: dict[str, Site], job: JobFile, *, master_port: int
) -> list[tuple[PlannedAgent, dict[str, str]]]:
    """Every agent to start with the environment its role adds, controller first, in start order.

    Trainer ranks find rank 0 at MASTER_ADDR: the first node of a SLURM allocation ($SLURM_JOB_NODELIST,
    read by the agent: `slurm_master_addr`), else rank 0's host (127.0.0.1 when every rank runs on one host)."""
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
        elif kind_of(sites[a.site]).ranks_are_tasks:  # one SLURM job whose tasks are the ranks ($SLURM_PROCID)
            out.append((a, env if ranks > 1 else {**env, "MASTER_ADDR": "127.0.0.1"}))
        else:
            out.append((a, {**env, "MASTER_ADDR": master, "RANK": str(a.replica)}))
    return out


def refuse_if_finished(jobdir: JobDir, *, state: str | None) -> None:
    """Before `launch --resume`: refuse a job that finished (its last run trained every planned iteration), which a
    resume would only run again (every agent, the held-out evaluation; all of it without a checkpoint). `state`: its
    row's in the job index (None for a job named by a directory the index does not hold); summary.json says it too."""
    summary = run_summary(jobdir, current_run(jobdir))
    done = summary if summary is not None and summary.get("state") == "done" else None
    if done is None and state != "finished":
        return
    planned = jobdir.read_job().iterations
    # its count was raised since it finished (`--iterations`); none trained here is no count known (its controller's
    # site's record not fetched, nor its summary: the index's `finished` stands)
    if 0 < trained_iterations(jobdir) < planned:
        return
    counts = f" ({done.get('iterations')}/{done.get('iterations_planned')} iterations)" if done is not None else ""
    ref = shlex.quote(jobdir.id if state is not None else str(jobdir.path))  # (an id the index lacks names no job)
    raise UsageError(
        f"job {jobdir.id}: finished{counts}; nothing to resume",
        hint=f"`rlctl status {ref}` shows how it ended; to train on from its last checkpoint: "
        f"`rlctl launch --resume {ref} --iterations {2 * planned}`",
    )


def refuse_if_unprepared(jobdir: JobDir, *, source: str | None, nothing: str = "nothing to resume") -> None:
    """Before `launch --resume` (or `attach`, `pull`: `nothing` says "nothing to watch", "nothing to pull"): refuse
    a job whose launch ended before it had prepared it (no job.json: `prepare` writes it last; a `rlctl stop` during
    its SFT warm-up, or its launcher's machine rebooted then), which has nothing to resume (UsageError naming how to
    launch it anew; `source`: its job file, as its index row recorded it). A job.json without its plan.json (deleted
    by hand) is refused too, naming the file: each of these commands reads the plan."""
    if jobdir.job_json.exists():
        if not jobdir.plan_json.exists():
            raise UsageError(
                f"{jobdir.plan_json}: missing (the job's plan, written with its job.json); {nothing}",
                hint=f"put the job dir's plan.json back from a copy, or launch the job anew: `{launch_again(source)}`",
            )
        return
    jobdir.refuse_lost_job_json(nothing=nothing)  # prepared (its plan.json there), its job.json removed
    holder = jobdir.launcher_holder()
    if holder is not None:  # its launch holds it while it prepares (an SFT warm-up, tokenizing): not one that ended
        arg = shlex.quote(jobdir.id)
        raise UsageError(
            f"job {jobdir.id} is being prepared by its launcher ({holder}); {nothing}",
            hint=f"watch it with `rlctl status {arg}`, or end it with `rlctl stop {arg}`",
        )
    again = launch_again(source)
    raise UsageError(
        f"job {jobdir.id} was never prepared (no {jobdir.job_json.name}: its launch was stopped or failed "
        f"before any agent started); {nothing}",
        hint=f"launch it anew: `{again}`",
    )


def refuse_if_id_live(jobdir: JobDir, db: JobDB) -> None:
    """Before a resume of a job the index does not hold (its row is put under its id): UsageError when another job
    of the index runs under that id (launched before ids were made unique, or a copied job dir): the resume would
    take that job's row (`rlctl status ID`, `stop ID` would mean this one) and its sites' job dirs."""
    try:
        row = db.get(jobdir.id)
    except RlctlError:
        return
    here = jobdir.path.resolve()
    if Path(row.job_dir).resolve() == here or row.state not in LIVE or not Path(row.job_dir).is_dir():
        return
    raise UsageError(
        f"job dir {jobdir.path}: its id {jobdir.id} is the indexed job in {row.job_dir}, which is {row.state}; "
        "a resume would take that job's index row and its sites' job dirs",
        hint=f"resume it once that job has ended (`rlctl status {shlex.quote(jobdir.id)}`), or stop it first",
    )


def refuse_if_running(jobdir: JobDir, *, arg: str | None = None) -> None:
    """Before a resume (by the job's launcher, holding its lock: no other launcher watches it): refuse while the
    job's controller answers, naming `rlctl attach` (which watches it again, as its gone launcher did) before `rlctl
    stop`; stop what is left of the run that ended (an orphaned unit, a trainer rank whose peer died), so two runs
    of one job never overlap. `arg`: the job as the hints name it (`JobRef.arg`: its directory where the index lacks
    it: its id names no job there, `rlctl attach ID` failed), else its id."""
    try:
        conn = connect_client(jobdir, timeout_s=3.0, name="resume")
    except (RlctlError, OSError, ValueError, KeyError):  # none answers (an unreadable controller.json: none can)
        pass
    else:
        conn.close()
        name = arg if arg is not None else shlex.quote(jobdir.id)
        raise UsageError(
            f"job {jobdir.id} is running (its controller answers; no launcher watches it)",
            hint=f"`rlctl attach {name}` watches it to its end again; `rlctl stop {name}` ends it",
        )
    backends = Backends(read_sites(jobdir.path), job=jobdir.id, job_dir=jobdir.path)
    skipped: list[str] = []  # a line cut short by a full disk stays in agents.jsonl: read strictly, no resume passed
    try:
        problems = stop_agents(backends, all_recorded_agents(jobdir.path, skipped=skipped), grace_s=5.0)
    finally:
        backends.close()
    for line in skipped:  # an agent whose record was cut short is no one this resume can stop; it ends on its own
        log.warning("%s (an agent recorded there, if it still runs, exits once it finds its controller gone)", line)
    if problems:
        raise LaunchError("cannot stop what is left of the last run: " + "; ".join(problems))


def connect_client(jobdir: JobDir, *, timeout_s: float, name: str) -> Connection:
    """A client connection to the job's controller (status, scale, stop requests); LaunchError naming
    controller.json when it holds no address to connect to."""
    job = jobdir.read_job()
    address = controller_address(jobdir)
    transport = make_transport(job.transport.kind, secret=jobdir.secret(), encrypt=job.transport.encrypt)
    try:
        conn = transport.connect(address, timeout_s=timeout_s)
    except ValueError as e:  # not an address of the job's transport
        raise LaunchError(f"{jobdir.controller_json}: address: {e}") from e
    conn.send(Message("hello", client_hello(name)))
    return conn


def controller_address(jobdir: JobDir) -> str:
    """The address in the job's controller.json (OSError when there is none; LaunchError naming the file when it
    is not {"address": "SCHEME://HOST:PORT", …})."""
    data = jobdir.read_json(jobdir.controller_json)
    address = data.get("address") if isinstance(data, dict) else None
    if not isinstance(address, str):
        raise LaunchError(
            f'{jobdir.controller_json}: no controller address (want {{"address": "tcp://HOST:PORT", …}}, '
            f"got {json.dumps(data)[:80]})"
        )
    return address


def client_hello(name: str) -> dict[str, Any]:
    """The header of a client's `hello` (the client fields of `rlctl.agents.messages.Hello`)."""
    return {"role": "client", "name": name, "pid": os.getpid()}


def launch_dir(job: Job, spec: JobFile, job_dir: str | Path | None) -> JobDir:
    """A fresh launch's job directory, created, with its id (`JobDB.id_for`: its name, unless another job of the index
    has that name) and its row in the index, `launching` (`JobDB.reserve`); one that already holds a job (or is a
    file) is refused (`fresh_dir`), nothing written. `job_dir`: the --job-dir flag; None: the job file's `job_dir`,
    else a new timestamped directory, chosen and made here (one `fresh_dir` chose before preflight may be another
    launch's by now)."""
    if job_dir is None and spec.job_dir is None:  # a new timestamped directory, not one another launch made since
        jd = JobDir.create(spec.name)
    else:
        jd = JobDir.create(spec.name, explicit=fresh_dir(job, spec, job_dir))
    # its job file too: a launch stopped before its launcher took it on (`Runs.preparing` records it) is launched anew
    # from it, as `status` says (it said `rlctl launch JOB.yaml`)
    return reserved(jd, spec, source=str(job.path.absolute()))


def reserved(jd: JobDir, spec: JobFile, *, source: str | None = None) -> JobDir:
    """`jd`, with its id and its row in the index, `launching`, this process its launcher (`JobDB.reserve`), and the
    job file `source` where given (what `status` says to launch anew)."""
    with contextlib.closing(JobDB()) as db:
        db.reserve(
            jd.path,
            spec=spec.model_dump(mode="json", by_alias=True),
            info={"launcher": this_launcher()} | ({"source": source} if source is not None else {}),
            record=jd.name_as,
        )
    return jd


def index_left(path: Path, spec: JobFile, *, source: str) -> str | None:
    """A fresh launch's job dir `path` that its launcher never took on (one `launch --detach` made, its launcher in
    the background stopped as it began, before its index row): in the index, `stopped`, as a launch stopped while it
    prepares leaves its own, so that `rlctl status` and `stop` find it. Its id; None where a row names it already, or
    no directory was made."""
    if not path.is_dir():
        return None
    here = path.resolve()
    with contextlib.closing(JobDB()) as db:
        if any(Path(r.job_dir).resolve() == here for r in db.list()):
            return None
    jd = reserved(JobDir.create(spec.name, explicit=path), spec, source=source)
    with contextlib.closing(JobDB()) as db:
        db.update(jd.id, state="stopped", only_from=LIVE)
    return jd.id


def entries(path: Path) -> set[str] | None:
    """The names in the directory `path`, None where there is none: what `unmake` puts it back to."""
    return {p.name for p in path.iterdir()} if path.is_dir() else None


def unmake(path: Path, before: set[str] | None) -> None:
    """What a fresh launch made in `path` removed: the directory where it made it (`before` None), else the names
    in it that `before` (`entries`, as the launch found it) lacks. One that cannot be removed is said (a warning)."""
    for p in [path] if before is None else [p for p in path.iterdir() if p.name not in before]:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        except OSError as e:
            log.warning("%s: made by the refused launch, left there: %s", p, e)


def unmade_left(path: Path, before: set[str] | None) -> None:
    """What `launch --detach` made in `path` (`before`: as it found it) for a launcher in the background that ended
    before the job ran and left no job there (no index row names it, no job.json, no launcher holds it: refused as
    it prepared, `Runs.unindex`) removed, versus left outside the index (its launcher's log alone)."""
    if not path.is_dir() or (path / "job.json").exists() or JobDir(path).launcher_holder() is not None:
        return
    here = path.resolve()
    with contextlib.closing(JobDB()) as db:
        if any(Path(r.job_dir).resolve() == here for r in db.list()):
            return
    unmake(path, before)


def _resume_taken(path: Path) -> str | None:
    """The command that continues the job a fresh launch's `path` holds (None: none there, or `launch --resume`'s
    own): a finished one's names `--iterations`, without which its resume is refused (`refuse_if_finished`); the
    hint said `rlctl launch --resume DIR` alone."""
    if not (path / "job.json").is_file():
        return None
    jobdir = JobDir(path)
    try:
        refuse_if_finished(jobdir, state=None)
    except UsageError:
        return f"{resume_command(path)} --iterations {2 * jobdir.read_job().iterations}"
    except (RlctlError, OSError):  # a damaged record: the resume says what is wrong with it
        return None
    return None


def fresh_dir(job: Job, spec: JobFile, job_dir: str | Path | None) -> Path:
    """Where a fresh launch of `job` writes (--job-dir `job_dir`, else the job file's `job_dir`, else a new
    timestamped directory); UsageError, one line, when that is a file or holds a job already (`refuse_taken`), or
    cannot be made (`why_not_made`)."""
    explicit = job_dir if job_dir is not None else spec.job_dir
    path = JobDir.choose_path(spec.name, explicit=explicit)
    if explicit is not None:
        refuse_taken(
            path, named_by="--job-dir" if job_dir is not None else f"{job.path}: job_dir", resume=_resume_taken(path)
        )
    elif (why := why_not_made(path)) is not None:  # a new timestamped directory, which no flag or field named
        raise UsageError(
            f"the job's new directory: {why}",
            hint=f"name one with --job-dir (or the job file's job_dir), or set {HOME_ENV} to a directory you may "
            "write in (its runs/ holds them)",
        )
    return path
