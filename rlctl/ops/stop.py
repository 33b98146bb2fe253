"""`rlctl stop`: the job's controller asked to end (graceful), then every recorded agent stopped on its site
(forced: TERM, grace, KILL, verified), then the job's launcher let go of it (bounded: a `launch --resume` is refused
until it has). A stop cut short (Ctrl-C) says what it left (`stop_cut_short`); a second stop joins one under way
(`stop_under_way`) rather than forcing the end the first waits out."""

import contextlib
import logging
import os
import shlex
import socket
import time
from collections.abc import Callable
from typing import Any

from rlctl import procfs
from rlctl.agents.messages import STOP_GRACE_S
from rlctl.checkpoint.choose import LATEST_POINTER
from rlctl.errors import LaunchError, RlctlError
from rlctl.launch.agentrecords import (
    agents_and_latest_run,
    all_recorded_agents,
)
from rlctl.launch.backends import Backends, read_sites, stop_agents
from rlctl.launch.base import AgentHandle
from rlctl.launch.jobdir import JobDir, event_time, row_count
from rlctl.launch.record import (
    event_to_record,
    record_is_here,
    record_view,
)
from rlctl.ops.detach import launcher_running, launcher_state
from rlctl.ops.jobdb import LIVE, JobDB
from rlctl.ops.jobref import JobRef, require_job_dir
from rlctl.ops.operate import (
    LAUNCHER_END_S,
    REQUEST_FLOOR_S,
    STATUS_DEADLINE_S,
    ask_controller,
    fetch_job_record,
    job_end,
    site_view,
)
from rlctl.ops.runstate import (
    STOP_REQUESTED,
    UNSTARTED,
    event_or_unrecorded,
    resumes,
)

log = logging.getLogger(__name__)


def stop(ref: JobRef, *, grace_s: float | None = None, say: Callable[[str], object] = log.info) -> dict[str, Any]:
    """Graceful (controller), then forced (every recorded agent on its site); verifies none is left. A job whose
    index row says it ended (finished, failed, stopped), or whose summary does with no launcher left to record it
    (`job_end`), and of which no agent runs is left as it is: `ended` names its state; nothing is written when its
    launcher is gone, else only the stop request (`launcher`: which one was told not to resume it). `grace_s`: how
    long the controller has to end before it is killed; None: as long as it says in its answer (STOP_GRACE_S, more
    while it completes a checkpoint the trainer reached: `say` tells the operator, and `checkpoint` names it). Then
    it waits, at most LAUNCHER_END_S, for the job's launcher to let go of the job (`launcher` says it did, or not)."""
    jd = ref.jobdir
    # its index row outlived it: said so, as status says it, versus a FileNotFoundError traceback (its stop request
    # written into the directory that is gone); no record is left to find its agents by
    require_job_dir(ref)
    out: dict[str, Any] = {"id": ref.id}
    unrecorded: list[str] = []  # its events that events.jsonl could not take (`event_or_unrecorded`)
    under_way = stop_under_way(jd)  # (before this stop's own request is written)
    # an agent of a job that ended is stopped only when its record tells it from a process that took its pid since
    unsure: dict[str, Any] = {}  # name → process group of those that are not
    running: set[str] = set()
    down = False
    # the index row's end; else, no launcher left to record one (a job dir the index lacks, a launcher that died
    # after its controller wrote the summary), the summary's: a done job's row was written `stopped` over
    ended_as = job_end(ref)
    if ended_as is not None:
        # read once (a remote controller site's record is one SSH fetch), and as the stop reads it: a damaged line
        # is left out here and said by the stop below, where there is one
        recorded = all_recorded_agents(jd.path, [], skipped=[])
        unsure = _unidentified(ref, recorded)
        running, down = _running(ref, recorded)
        unsure = {name: pgid for name, pgid in unsure.items() if name in running}
    if ended_as is not None and not down and running <= set(unsure):
        ended = {**out, "ended": ended_as, "graceful": "-", "agents": [], "problems": []}
        ended["problems"] = [_unsure_line(name, pgid) for name, pgid in unsure.items()]
        if ref.row is None:  # no launcher holds it (`job_end`), and none is recorded
            return ended
        launcher = ref.row.info.get("launcher")
        if launcher_running(launcher) is False:
            return ended
        # a launcher that may still run may be about to resume the run that failed (`checkpoint.auto_resume`: the
        # row says failed and nothing runs until it starts the next run): the request keeps it from doing so, or
        # ends the start it began (`JobRun.start` looks for it before each agent)
        event_to_record(jd.path, event_or_unrecorded(jd, STOP_REQUESTED, unrecorded, then=UNTOLD, stopper=_stopper()))
        if _index_state(ref.row.name) not in LIVE:
            return {**ended, "launcher": launcher_state(launcher, ended=True), "unrecorded": unrecorded}
        # it began the next run before the request: that run is stopped as any live job is (below)
    else:
        # before the controller can end: its launcher must not resume it (`autoresume`); where the controller reads
        # its events too (on its site), so that it ends `stopped`, not failed
        event_to_record(jd.path, event_or_unrecorded(jd, STOP_REQUESTED, unrecorded, then=UNTOLD, stopper=_stopper()))
    try:
        # the request's own bound is no shorter than REQUEST_FLOOR_S: `--grace 0` asked with a 0 s timeout, and a
        # healthy controller read as one that did not answer
        body = {} if grace_s is None else {"grace_s": grace_s}
        asked = min(max(STOP_GRACE_S if grace_s is None else grace_s, REQUEST_FLOOR_S), 10.0)
        answer = ask_controller(ref, "shutdown", body, timeout_s=asked)
        out["graceful"] = "requested"
    except (RlctlError, OSError, ValueError, KeyError) as e:  # an unreadable controller.json included
        out["graceful"] = f"controller did not answer ({e}); forcing"
        if not jd.controller_json.exists() and ref.row is not None and ref.row.state == "launching":
            out["graceful"] = "no controller yet: its launcher, preparing or starting the job, ends the launch"
        elif under_way:  # its listener closed as it ends: waited for as a stop that answered, not forced at once
            out["graceful"] = "requested"
            say(
                f"job {ref.id}: a stop before this one is under way (its controller no longer answers as it ends); "
                "this stop waits for it to end before it forces anything"
            )
        answer = {}
    if grace_s is None:
        grace_s = float(answer.get("grace_s") or STOP_GRACE_S)
    waited_for = answer.get("checkpoint")
    if answer.get("stopping"):  # a stop before this one is under way (its controller was ending): joined, not forced
        on = f" for checkpoint iter-{waited_for}" if waited_for is not None else ""
        say(f"job {ref.id}: already stopping, waiting{on}; this stop waits with it (up to {grace_s:.0f} s)")
    elif waited_for is not None:
        say(
            f"job {ref.id}: the trainer may be completing checkpoint iter-{waited_for}; the controller waits for it "
            f"before it ends (up to {grace_s:.0f} s; --grace bounds the wait)"
        )
    # a record that does not say where the controller's site keeps its own (plan.json, staged.json cut short)
    # stops those recorded here, and says so (sites.json cut short: no agent can be stopped, one error line)
    problems: list[str] = []
    skipped: list[str] = []  # lines of agents.jsonl that are no agent record: the agents read are stopped all the same
    recorded, this_run = agents_and_latest_run(jd.path, problems, skipped=skipped)
    handles = [h for h in recorded if h.spec.name not in unsure]
    # every recorded agent is stopped (an orphan of an earlier run too); those listed as stopped are this run's and
    # those of an earlier run that still ran (or whose site did not say), not every unit any run ever had
    earlier = [h for h in handles if this_run is not None and h.spec.name not in this_run]
    ran = _still_running(ref, earlier)
    sites = read_sites(jd.path)
    record_read = not problems
    problems += skipped
    backends = Backends(sites, job=jd.id, job_dir=jd.path)
    controller = [h for h in handles if h.spec.role == "controller"]
    deadline = time.monotonic() + grace_s
    while out["graceful"] == "requested" and time.monotonic() < deadline:
        try:
            if all(backends.for_site(h.spec.site).poll(h) is not None for h in controller):
                break
        except LaunchError as e:  # its site does not answer: the forced stop below still runs (and says so)
            log.warning("could not poll the controller's site (%s); forcing", e)
            break
        time.sleep(0.3)
    failed: set[str] = set()  # sites the stop could not reach: their agents are not said to be stopped
    problems += stop_agents(backends, handles, grace_s=min(grace_s, 10.0), failed=failed)
    problems += [_unsure_line(name, pgid) for name, pgid in unsure.items()]
    backends.close()
    if record_read:  # (one that cannot be read is said once, above)
        fetch_job_record(ref)
    if waited_for is not None:
        out["checkpoint"] = {"version": waited_for, "outcome": _checkpoint_outcome(jd, int(waited_for))}
    ours = [h for h in handles if this_run is None or h.spec.name in this_run or h.spec.name in ran]
    out["agents"] = [h.spec.name for h in ours if h.spec.site not in failed]
    out["problems"] = problems
    event_or_unrecorded(jd, "stopped_by_operator", unrecorded, agents=out["agents"], problems=problems)
    out["unrecorded"] = unrecorded  # (the stop went on: its agents are stopped all the same)
    if ref.row is not None:
        db = JobDB()
        try:  # only a live job's row: one that ended meanwhile (its launcher wrote finished) keeps that
            db.update(ref.row.name, state="stopped", only_from=LIVE)
        finally:
            db.close()
    launcher = _launcher_end(jd, timeout_s=LAUNCHER_END_S, say=say)
    if launcher is not None:
        out["launcher"] = launcher
        # the job ended on its own as the stop came (its controller had written the summary: it no longer answered,
        # or answered as it ended): its launcher recorded that end over the stop's `stopped`, and said so
        if ref.row is not None and (state := _index_state(ref.row.name)) not in (*LIVE, "stopped"):
            out["graceful"] = f"not needed: the job ended ({state}) as the stop came, as its launcher recorded it"
            out["ended_meanwhile"] = state
    return out


UNTOLD = "the job's launcher, where one runs, may resume it"  # a stop request not recorded: not seen there


def stop_under_way(jd: JobDir) -> bool:
    """Whether a `rlctl stop` of the job's current run asked its controller to end and has not finished (its
    `stopped_by_operator` not written yet): a second stop then finds the controller's listener closed as it ends,
    and forced an end the first one was waiting out (a checkpoint being written, cut). Not one whose stop process is
    gone (killed) when the controller did not say it took the request (its own `stop_requested`, `by`): nothing ends
    the job then, and a second stop waited its whole grace for a controller that was not ending. Where the controller
    keeps its events on another site its word is not here yet: such a request is under way still (a second stop,
    the first Ctrl-C'd while the controller completed a checkpoint, forced it and cut the checkpoint)."""
    events = _this_run(jd.read_events(*RUN_STARTS, STOP_REQUESTED, "stopped_by_operator"))
    asked = [i for i, e in enumerate(events) if e.get("event") == STOP_REQUESTED]
    if not asked or any(e.get("event") == "stopped_by_operator" for e in events[asked[-1] :]):
        return False
    operators = [i for i in asked if "by" not in events[i]]
    if not operators:  # the controller's word alone: it ends
        return True
    taken = any("by" in events[i] for i in asked if i > operators[-1])
    return taken or _stopper_runs(events[operators[-1]].get("stopper")) or _events_elsewhere(jd)


def _events_elsewhere(jd: JobDir) -> bool:
    """Whether the job's controller keeps its events on another site (or in another directory), here only once its
    record is fetched: its word that it took a stop (`stop_requested`, `by`) may be there alone, while it ends (a
    checkpoint being completed, its listener closed). True where its record cannot be read (cannot tell)."""
    try:
        view = record_view(jd.path)
    except (RlctlError, OSError):
        return True
    return view is not None and not record_is_here(view[0], view[2], jd.path)


def _stopper() -> dict[str, Any]:
    """This stop's process, in its request (`stop_under_way` of a later stop asks whether it still runs): its host,
    pid space (`procfs.pid_space`), pid and start time."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid_space": procfs.pid_space(),
        "pid": pid,
        "start_ticks": procfs.start_ticks(pid),
    }


def _stopper_runs(stopper: Any) -> bool:
    """Whether the stop process `_stopper` recorded still runs; True where this machine cannot tell (another host;
    another pid space under this host name, a container of another machine, whose stop was read here as gone and
    its request as no stop under way: a second stop forced the end the first was waiting out; no /proc; a request
    written before stops recorded themselves). A request without a pid space, an older rlctl's, goes by its host
    alone (`procfs.pids_here`)."""
    if not isinstance(stopper, dict) or not procfs.pids_here(stopper.get("host"), stopper.get("pid_space")):
        return True
    if stopper.get("start_ticks") is None:
        return True
    pid = stopper.get("pid")
    return isinstance(pid, int) and procfs.start_ticks(pid) == stopper["start_ticks"]


def stop_cut_short(ref: JobRef, *, since: float) -> str:
    """What a `rlctl stop` begun at `since` (time.time()) and cut short (Ctrl-C) left, from the job's events: nothing
    asked; its request written but the stop not seen through (the controller may not have it, and the launcher will
    not resume the job: a second stop finishes it); or every agent stopped while it waited for the launcher."""
    name = shlex.quote(ref.id if ref.row is not None else str(ref.jobdir.path))
    events = ref.jobdir.read_events(STOP_REQUESTED, "stopped_by_operator")
    events = [e for e in events if event_time(e) >= since - 0.001]  # (ms in events)
    if not any(e.get("event") == STOP_REQUESTED and "by" not in e for e in events):
        return f"job {ref.id} was not asked to stop (`rlctl status {name}`)"
    if any(e.get("event") == "stopped_by_operator" for e in events):
        return f"job {ref.id}: every agent stopped; its launcher was still ending (`rlctl status {name}`)"
    return (
        f"the stop of job {ref.id} was asked for but not seen through (its launcher will not resume the job); "
        f"`rlctl stop {name}` again finishes it, `rlctl status {name}` says where the job stands"
    )


RUN_STARTS = ("controller_listening", "agent_started")  # the events `_this_run` starts a run's events at


def _this_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events since the job's controller last started listening, or its launcher last started it (its
    `agent_started`, which names its run: written here where a controller on another site keeps its own events until
    they are fetched); all of them when none says either here."""
    starts = [
        i
        for i, e in enumerate(events)
        if e.get("event") == "controller_listening" or (e.get("event") == "agent_started" and "run" in e)
    ]
    return events[starts[-1] if starts else 0 :]


def _launcher_end(jd: JobDir, *, timeout_s: float, say: Callable[[str], object]) -> str | None:
    """Wait, at most `timeout_s`, for the job's launcher to let go of the job: once the controller is gone it stops
    what is left, fetches the job's record and writes the job's end to the index, and until then it holds the
    job's launcher lock (a `launch --resume` right after the stop was refused: `has a launcher already`). What
    became of it; None when no launcher held the job."""
    holder = jd.launcher_holder()
    if holder is None:
        return None
    t0 = time.monotonic()
    told = False
    while jd.launcher_holder() is not None:
        waited = time.monotonic() - t0
        if waited >= timeout_s:
            return f"{holder}: still running after {timeout_s:g} s (a `launch --resume` is refused until it ends)"
        if waited >= 2.0 and not told:
            say(f"waiting for the job's launcher ({holder}) to end (up to {timeout_s:g} s)")
            told = True
        time.sleep(0.1)
    return f"{holder}: ended {time.monotonic() - t0:.1f} s after the agents (waited for it)"


def _still_running(ref: JobRef, handles: list[AgentHandle]) -> set[str]:
    """Those of `handles` that run, or whose site did not say (asked only when there are any)."""
    if not handles:
        return set()
    agents, _ = site_view(ref, timeout_s=STATUS_DEADLINE_S, handles=handles)
    return {a["name"] for a in agents if a["state"] in ("running", "unknown")}


def _checkpoint_outcome(jd: JobDir, version: int) -> str:
    """What became of the checkpoint a stop waited for, from the controller's events: completed; abandoned (the
    stop's grace ended first); not written (the controller ended, saying neither: the trainer, holding its iteration,
    had not begun that step; told to stop, it began none); or not known, when the controller ended before it could
    say (killed past the stop's grace: no `job_end`), with the checkpoint a resume takes instead (`_resume_takes`).
    Before, that last case said "not written" too, of a write the trainer had begun."""
    ends = ("checkpoint", "checkpoint_abandoned", "job_end")
    events = jd.read_events(STOP_REQUESTED, *ends, *RUN_STARTS, "resumed", UNSTARTED)  # (`_resume_takes`'s too)
    asked = next(
        (i for i in range(len(events) - 1, -1, -1) if events[i].get("event") == "stop_requested" and "by" in events[i]),
        None,
    )
    if asked is None:
        return "not known (the controller's events do not say)"
    ended = False
    for e in events[asked:]:
        if e.get("event") == "checkpoint" and e.get("version") == version:
            return "completed"
        abandoned = e.get("versions")  # (null or text, from an edited row: not saying which; `in` was a TypeError)
        if e.get("event") == "checkpoint_abandoned" and isinstance(abandoned, list) and version in abandoned:
            latest = e.get("latest")
            return f"abandoned: a resume takes {'none' if latest is None else f'iter-{latest}'}"
        ended = ended or e.get("event") == "job_end"
    if ended:
        return "not written: the trainer had not begun that step (told to stop, it began none)"
    return f"not known: the controller ended before the trainer said; a resume takes {_resume_takes(jd, events)}"


def _resume_takes(jd: JobDir, events: list[dict[str, Any]]) -> str:
    """The checkpoint a resume would take, as this job dir knows it: its `latest` pointer (the controller moves it
    once a checkpoint is complete), else (the controller keeps it on another site) the newest `checkpoint` event
    since the controller last started, else the one that run resumed from (its launcher's `resumed` event). An event
    whose version is no number (null, text: an edited row) is passed over, as `row_count` reads one."""
    try:
        pointer = jd.read_json(jd.checkpoints / LATEST_POINTER)
        return f"the latest complete checkpoint (iter-{int(pointer['version'])})"
    except (OSError, LaunchError, ValueError, TypeError, KeyError):
        pass
    done = [
        v
        for e in _this_run(events)
        if e.get("event") == "checkpoint" and (v := row_count(e.get("version"))) is not None
    ]
    if done:
        return f"the latest complete checkpoint (iter-{done[-1]})"
    resumed = [v for e in resumes(events) if (v := row_count(e.get("version"))) is not None]
    if resumed and resumed[-1]:
        return f"the latest complete checkpoint (iter-{resumed[-1]})"
    return "the latest complete checkpoint (this job dir names none)"


def _index_state(name: str) -> str:
    db = JobDB()
    try:
        return db.get(name).state
    finally:
        db.close()


def _running(ref: JobRef, handles: list[AgentHandle]) -> tuple[set[str], bool]:
    """Those of `handles` that still run, and whether some site did not answer (they may): an index row that says
    the job ended while an orphan of it runs on is no reason to leave that one running."""
    agents, down = site_view(ref, timeout_s=STATUS_DEADLINE_S, handles=handles)
    return {a["name"] for a in agents if a["state"] == "running"}, bool(down)


def _unidentified(ref: JobRef, handles: list[AgentHandle]) -> dict[str, Any]:
    """Name → process group of those of `handles` whose record cannot tell them from a process that took their
    id since (an older rlctl's agents.jsonl): not signalled once the job ended."""
    jd = ref.jobdir
    backends = Backends(read_sites(jd.path), job=jd.id, job_dir=jd.path)
    out = {}
    try:
        for h in handles:
            with contextlib.suppress(LaunchError):  # a site not in the inventory: the stop itself says so
                if not backends.for_site(h.spec.site).identifies(h):
                    out[h.spec.name] = h.ident.get("pgid")
    finally:
        backends.close()
    return out


def _unsure_line(name: str, pgid: Any) -> str:
    return (
        f"{name}: not stopped: its record (an older rlctl's) has no start time to tell its process group {pgid} from "
        f"one that took the id since the job ended (if it is the job's: kill -- -{pgid})"
    )
