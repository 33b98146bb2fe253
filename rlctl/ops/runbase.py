"""What every part of a `JobRun` (rlctl.ops.run) shares: the run's state, its agents' exit codes and logs
(`poll`, `log_tail`, and the error line a launch error quotes of a log: `last_error`, `first_error`), its index row
(`_register`), and its stop (`stop`, `time_limit`)."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from rlctl.agents.messages import LAUNCHER_STOP, SIGTERM_FAILURE
from rlctl.checkpoint.choose import SPLIT_REFUSED, ResumePoint
from rlctl.checkpoint.files import checkpoint_dirs
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError, RlctlError
from rlctl.launch.agentrecords import all_recorded_agents
from rlctl.launch.backends import Backends, read_sites, stop_agents
from rlctl.launch.base import LOST, AgentHandle
from rlctl.launch.jobdir import JobDir, resume_command
from rlctl.launch.record import event_to_record, fetch_record
from rlctl.launch.sitefs import access_hosts, host_files, is_remote
from rlctl.ops.jobdb import LIVE, JobDB
from rlctl.ops.runstate import run_summary, stop_requested, update_summary
from rlctl.transport import Connection

log = logging.getLogger(__name__)

# at a run's end its agents on this machine, told to stop by the controller that ended, get this long to leave by
# themselves before `stop` sends TERM (they take about a second; TERMed first, a done job's status said `-15`)
AGENTS_SETTLE_S = 3.0


class RunBase:
    """One run's state and what its start (`RunStart`), its wait (`RunWait`) and its stop share."""

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
        self.address: str | None = None  # this run's controller's, once it listens (`start`) or as attached
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

    def poll(self, h: AgentHandle) -> int | None:
        return self.backends.for_site(h.spec.site).poll(h)

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

    def resume_command(self) -> str:
        """How the user continues this job: by its index id, or its directory when it is not in the index."""
        return resume_command(self.id if self.db is not None else self.jobdir.path)

    def unloadable_hint(self, said: str) -> str | None:
        """What to do where a trainer rank refused the checkpoint this resume continues from (`said`: its error line,
        which names the checkpoint's directory or a file in it; a shard or the policy damaged, or the state not rebuilt
        at this split): continue from an older checkpoint (`--checkpoint V`, the versions here before it), or at the
        split it was written at where that was the refusal; versus "fix what its log says", which a damaged checkpoint
        leaves nothing to fix in. None where `said` is not of the checkpoint (the trainer failed otherwise)."""
        if self.resumed is None or self.resumed.version == 0:
            return None
        version = self.resumed.version
        rel = self.jobdir.checkpoint(version).relative_to(self.jobdir.path).as_posix()
        if not re.search(rf"(^|[/ ]){re.escape(rel)}(/\S*)?: ", said):  # (a file in it: its policy's)
            return None
        from rlctl.ops.extend import completed_checkpoints  # (extend reads the job dir's events, as a resume does)

        # the older ones a `--checkpoint V` takes: completed (the job's events) and here still, versus any iter-N here
        # (one a crash left half written, which `--checkpoint` refuses in its turn)
        here = self.jobdir.checkpoints
        try:
            done: set[int] | None = set(completed_checkpoints(self.jobdir))
        except RlctlError:  # (job.json unreadable: its keep unknown; every iter-N here, as `--checkpoint` then says)
            done = None
        older = sorted(v for v, _ in checkpoint_dirs(here) if v < version and (done is None or v in done))
        split = "resume it at the split it was written at (`--trainer-split`) or " if SPLIT_REFUSED in said else ""
        if not older and self._record is None:  # (a controller's site elsewhere keeps them there: said as below)
            from rlctl.ops.jobprep import launch_again
            from rlctl.ops.runstart import launched_from  # (runstart's run is built on this module)

            start = f"`{launch_again(launched_from(self.jobdir))}` starts the job over in a new directory"
            split = split.replace(" or ", ", or else ")
            return f"the trainer cannot load checkpoint v{version}, the oldest in {here}: {split}{start}"
        which = f"V: {', '.join(map(str, older[-3:]))} here" if older else "V: an older complete checkpoint's version"
        return (
            f"the trainer cannot load checkpoint v{version}: {split}continue from an older one, "
            f"`{self.resume_command()} --checkpoint V` ({which}; the newer ones are set aside)"
        )

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
        self._update_summary({"state": "stopped"})

    def _update_summary(self, changes: dict[str, Any]) -> None:
        """`update_summary` of this run, as a stop records what it can: a summary.json that does not read, its run's
        end not in the events (LaunchError), is said in one line and left as it is, versus the stop cut short there
        (no agents' exits, no `agents_stopped` event, the index row not `stopped`); one that cannot be opened (a
        symlink loop, another user's: an OSError) alike, versus its traceback."""
        try:
            update_summary(self.jobdir, self.run_id, changes)
        except (LaunchError, OSError) as e:
            log.warning("%s: %s not written into it", said(e), ", ".join(changes))

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
        self._update_summary({"agent_exits": exits})
        if self.db is not None:
            self.db.update(self.id, info={"agent_exits": exits})

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
            except (LaunchError, OSError) as e:  # the record stays on the controller's site (an OSError: a file here
                # it could not write), one of the stop's problems, versus its traceback with the stop's events unwritten
                problems.append(f"cannot fetch the job's record from site {self.plan['controller_site']}: {e}")
        if ending:  # a controller on another site did not see the event
            try:
                summary = run_summary(self.jobdir, self.run_id)
            except (LaunchError, OSError) as e:  # damaged (its run's end not in the events), unreadable: the stop goes
                log.warning("%s: the stop is recorded without it", said(e))  # on without it
                summary = None
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


def said(e: Exception) -> str:
    """An error in one line: an OSError naming a file as `FILE: its reason` (`strerror`), versus Python's
    `[Errno 40] Too many levels of symbolic links: 'FILE'`; any other as it says itself."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    return str(e)


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
