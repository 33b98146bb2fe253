"""A `JobRun`'s start (rlctl.ops.run): the agents placed, the job staged to its sites, for a resume the
checkpoint it continues from (`resume_point`), the controller started and waited for until it listens, then the
trainer ranks and rollout units; `attach` to a run a gone launcher started; and what `launch --dry-run` renders
of it (`render`, `staging_plan`)."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import secrets
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from rlctl.checkpoint.choose import ResumePoint
from rlctl.config.task import DatasetTask
from rlctl.errors import LaunchError, RlctlError, Stopped
from rlctl.launch.agentenv import ENV_RESUME, ENV_RUN, ENV_VISIBLE
from rlctl.launch.agentrecords import latest_run_names, readable_agents
from rlctl.launch.backends import AGENTS_FILE, record_agent
from rlctl.launch.base import AgentHandle, AgentSpec, exit_text
from rlctl.launch.jobdir import JobDir, event_time
from rlctl.launch.layout import PlannedAgent, checkpoint_writers, trainer_parallel
from rlctl.launch.record import controller_view, fetching, record_is_here, record_view, summary_lock
from rlctl.launch.recordfiles import record_text
from rlctl.launch.sitefs import HostFiles, LocalFiles, agent_view, host_files, is_remote, site_root
from rlctl.launch.spawn import agent_spec
from rlctl.launch.stage import STAGED_FILE, root_for, stage_all, staging_plan
from rlctl.ops.agentplan import planned_agents, refuse_unshared_trainer
from rlctl.ops.client import controller_address
from rlctl.ops.detach import this_launcher
from rlctl.ops.jobchanges import refuse_fixed_edits
from rlctl.ops.jobdb import JobRow
from rlctl.ops.jobprep import launch_again
from rlctl.ops.resumepoint import pick_checkpoint, refuse_lost_checkpoints
from rlctl.ops.runbase import RunBase, last_error
from rlctl.ops.runstate import UNSTARTED, aside_name, current_run, stop_requested
from rlctl.rl.reward_pool import load_deadline_s

log = logging.getLogger(__name__)

CONTROLLER_START_S = 120.0  # for the controller to listen, beyond its reward pool's first load (`load_deadline_s`)
PORT_FLOOR = 20000  # MASTER_PORT is picked in [PORT_FLOOR, the ephemeral range's start)
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
DRY_RUN_CONTROLLER = "CONTROLLER_ADDR"  # what `--dry-run` shows for the address the controller gets at launch


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


def run_before(name: str) -> str:
    """Where a run's start sets the run before's `name` (controller.json; agents.jsonl on the controller's site)
    aside, until the run starts (a refused resume puts it back: `RunStart._unstart`; a run started removes it:
    `RunStart._drop_run_before`)."""
    return f".{name}.run-before"


class RunStart(RunBase):
    """A run's start: stage, then the controller, then (once it listens) the trainer ranks and rollout units."""

    _before_here = False  # this start set the run before's controller.json here aside (`run_before`)
    _before_on_site: tuple[str, ...] = ()  # and these of its record on the controller's site

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
        and on the controller's site), its controller.json (here and there) and agents.jsonl (there: the units its
        controller started, which `rlctl status` lists and `rlctl stop` or the next resume stops, recorded there
        alone) back from where `start` set them aside (`run_before`), versus the copy here removed and the site's
        emptied for good by a resume that never started; the index row back to `row` (its state, and what the run's
        `launching` row replaced: the job file it came from, its launcher, its agents' exits, when it was launched).
        The summary put back (here and on the site) under the lock a fetch of the record holds (`fetching`), and here
        under the summary lock too (`summary_lock`: the launcher's writes of it): a `rlctl status` that read no
        summary here before it and wrote the controller's copy after it wrote over the launcher's keys (held-out
        figures)."""
        with fetching(self.jobdir.path):
            if self._record is not None:
                try:
                    fs, root = self._files()
                    try:
                        fs.move(f"{root}/{aside}", f"{root}/summary.json")
                        for name in self._before_on_site:
                            fs.move(f"{root}/{run_before(name)}", f"{root}/{name}")
                    finally:
                        fs.close()
                except LaunchError as e:  # (the site that refused the run): the error that ended it is the one said
                    kept = ", ".join([aside, *(run_before(name) for name in self._before_on_site)])
                    log.warning("the record of the run before stays aside on the controller's site (%s): %s", kept, e)
            with summary_lock(self.jobdir.path):
                LocalFiles().move(str(self.jobdir.path / aside), str(self.jobdir.summary_json))
            if self._before_here:
                controller = self.jobdir.controller_json
                LocalFiles().move(str(self.jobdir.path / run_before(controller.name)), str(controller))
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

    def _files(self) -> tuple[HostFiles, str]:
        """The controller's site job dir and a view of it (the caller closes the view)."""
        assert self._record is not None
        site, host, root = self._record
        return host_files(site, host), root

    def _set_run_before_aside(self, fs: HostFiles, root: str, aside: str) -> None:
        """The run before's record on the controller's site out of this run's way (its controller.json and
        agents.jsonl emptied, its summary set aside as `aside`), and the copies of it fetched back here while this
        run staged removed, all under the lock a fetch of the record holds (`fetching`; the summary here under the
        summary lock too: `summary_lock`): a fetch that read the site's copy before wrote it here after (the run
        before's summary, taken for this run's end; its controller.json, whose address a `rlctl status` or `stop`
        asked until this run's controller listened), versus the site's controller.json emptied after staging with no
        lock held and the copy here removed only as the run started. `fs`: a view of the controller's site job dir
        `root`."""
        with fetching(self.jobdir.path), tempfile.TemporaryDirectory(prefix="rlctl-empty-") as tmp:
            empty = Path(tmp) / "empty"  # what each is emptied from: not a file of the job dir's
            empty.write_text("")
            for name in ("controller.json", AGENTS_FILE):  # leftovers of an earlier run of this job id: aside first
                if fs.move(f"{root}/{name}", f"{root}/{run_before(name)}"):  # (a refused resume puts them back)
                    self._before_on_site += (name,)
                fs.put(empty, f"{root}/{name}")
            self.jobdir.controller_json.unlink(missing_ok=True)
            if fs.move(f"{root}/summary.json", f"{root}/{aside}"):
                with summary_lock(self.jobdir.path):
                    self.jobdir.summary_json.unlink(missing_ok=True)

    def _mirror_record(self, h: AgentHandle) -> None:
        """Append the agent's record to the controller site's agents.jsonl (its Spawner claims slices from it)."""
        line = record_text(self.jobdir.path / AGENTS_FILE).splitlines()[-1] + "\n"
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
                self._set_run_before_aside(fs, root, aside)  # fetched back here while staging: copies
            finally:
                fs.close()
        if resume:
            self.resumed = self.resume_point(trainer=trainers[0], only=checkpoint)
            # a hand edit of job.json the checkpoint cannot run on (none: the run starts over, and takes it). The
            # launcher refused it before (`resume_job`, `Runs._resume_after`) for the checkpoint the job's events name;
            # only here is the one its sites hold known (events not fetched: a job the launcher's events say completed
            # none). A refusal here comes after the summary is set aside and staging: `start` puts the job back
            refuse_fixed_edits(self.jobdir, resumed=self.resumed.version)
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
        self._before_here, self._before_on_site = False, ()
        # the run before's summary, kept as summary.<n>.json: here it would be taken for this run's end (by `wait`,
        # by `rlctl status`) once this run's controller is gone without one. Moved under the lock a fetch of the
        # record holds (`fetching`), versus a `rlctl status` fetching meanwhile writing the controller's copy of the
        # run before's summary back after the move, and the summary lock (`summary_lock`), versus a `rlctl stop`'s
        # write of the summary it read before (`update_summary`). (The launcher lock held here is taken without
        # waiting, and no holder of the fetch lock takes it: the two cannot deadlock). Its controller.json with it
        # (`_set_run_before_aside` again once the run staged, where the controller's record is on another site)
        try:
            self.jobdir.check_secret()  # a damaged one refused before anything moves or any agent starts
            with fetching(self.jobdir.path), summary_lock(self.jobdir.path):
                controller = self.jobdir.controller_json  # aside, not removed: a refused resume puts it back
                before_here = self.jobdir.path / run_before(controller.name)
                self._before_here = LocalFiles().move(str(controller), str(before_here))
                aside = aside_name(self.jobdir.path)
                LocalFiles().move(str(self.jobdir.summary_json), str(self.jobdir.path / aside))
        except BaseException:  # ended as it took the locks (Ctrl-C while a `status -w` fetch from a site that does
            # not answer held one; a lock that cannot be opened): nothing changed, the job as it was (job.json's count
            # put back: `resume_job`), versus a run taken as started
            self.unstarted = resume
            raise
        before = None  # the job's index row before this run, None for none (a refused resume puts it back)
        if resume and self.db is not None:
            with contextlib.suppress(RlctlError):
                before = self.db.get(self.id)
        try:  # (the row as the first step of it: one the index refuses, or a Ctrl-C as it is written, leaves the job
            # as it was too, versus a run taken as started: the summary set aside, a --trainer-split's plan.json kept)
            self._register("launching", sites=sorted(self.sites), launcher=this_launcher())
            agents, remote = self._prepare(aside, resume=resume, checkpoint=checkpoint)
        except BaseException:  # (a site short of slots, staging that failed, a checkpoint refused, Ctrl-C)
            if resume:  # no agent of the run started: the job as it was, its summary and index row, for its next resume
                self.unstarted = True
                self._unstart(aside, before)
            raise
        c = agents[0][0]
        self.controller = self._start(c)
        address = self.address = self._controller_address(remote)
        # never over an operator's `stopped`: only a row still `launching` becomes `running`
        if self.db is not None and not self.db.update(
            self.id, state="running", controller=address, only_from=("launching",)
        ):
            self._stopped_while_starting()
        for a, env in agents[1:]:
            self._stop_if_asked()
            self._start(a, env, controller=address)
        self._stop_if_asked()
        self._drop_run_before()

    def _drop_run_before(self) -> None:
        """Once every agent of the run started: the run before's files this start set aside (`run_before`), here
        and on the controller's site, removed. Only a start refused before its controller started puts them back
        (`_unstart`); after, nothing reads them (the units the site's agents.jsonl listed were stopped before the
        resume started: `refuse_if_running`, `Runs`' stop of a failed run), versus a stale copy of the run before's
        controller.json (a gone controller's address) and agents.jsonl kept beside the job's own until the next
        start replaced them. A copy that cannot be removed stays, logged: the run has started."""
        try:
            if self._before_here:
                (self.jobdir.path / run_before(self.jobdir.controller_json.name)).unlink(missing_ok=True)
            if self._before_on_site:
                fs, root = self._files()
                try:
                    fs.remove(root, [run_before(name) for name in self._before_on_site])
                finally:
                    fs.close()
        except (LaunchError, OSError) as e:
            log.warning("%s: the run before's record set aside as this run started stays: %s", self.id, e)

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
            # it was (a finished one stays finished: a plain resume is refused; a roll-back's --checkpoint is not kept;
            # a --trainer-split's plan.json put back)
            hint = (
                f"the job is as it was before this resume: continue it with `{self.resume_command()}` (and the "
                "resume's --iterations / --checkpoint / --trainer-split, where it had them)"
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
        with contextlib.suppress(LaunchError, OSError):  # none yet: it has not listened (its `wait` says so)
            self.address = controller_address(self.jobdir)
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
        if self._record is None and only is None:  # the controller parts here: lost ones refused, not started over
            refuse_lost_checkpoints(self.jobdir, start_over=launch_again(launched_from(self.jobdir)))
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
                    start_over=launch_again(launched_from(self.jobdir)),
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


def launched_from(jobdir: JobDir) -> str | None:
    """The job file the job was launched from (its absolute path, as job.json keeps it), None where job.json names
    none (a job launched from a mapping, or by an rlctl that kept none) or does not read."""
    try:
        data = jobdir.read_json(jobdir.job_json)
    except (OSError, RlctlError):
        return None
    source = data.get("source_file") if isinstance(data, dict) else None
    path = source.get("path") if isinstance(source, dict) else None
    return path if isinstance(path, str) else None
