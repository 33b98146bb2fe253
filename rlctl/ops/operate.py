"""Operating a running job from any terminal: status, scale, stop — the library behind those verbs.

status: controller (live, one RPC with a deadline) ──none──▶ last metrics row + each site's
        scheduler (squeue / pidfiles over SSH), every site in its own thread with a deadline:
        a dead site is reported "unreachable" and never holds the answer back
scale:  one RPC to the controller; it starts (or drains) the units and answers with their names (`--wait`: its
        status says each new unit's first sample; its events.jsonl may be on another site)
stop:   "shutdown" RPC (graceful: the controller stops its agents, writes summary.json) ─▶ wait
        ─▶ every agent in agents.jsonl stopped on its site (TERM, grace, KILL, verified)
        ─▶ the job's launcher lets go of it (bounded: a `launch --resume` is refused until it has)

Agents are those in the operator's agents.jsonl plus, when the controller runs on another site, those
its Spawner recorded there; its record (summary, metrics, events) is fetched from there when needed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import shlex
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from rlctl import procfs
from rlctl.agents.messages import STOP_GRACE_S
from rlctl.checkpoint.choose import LATEST_POINTER
from rlctl.errors import LaunchError, PeerTimeout, RlctlError, TransportError, UsageError
from rlctl.launch.agentrecords import (
    agents_and_latest_run,
    all_recorded_agents,
    readable_agents,
    readable_agents_and_run,
)
from rlctl.launch.backends import AGENTS_FILE, SITES_FILE, Backends, read_sites, stop_agents
from rlctl.launch.base import LOST, AgentHandle, exit_text
from rlctl.launch.jobdir import JobDir, event_time, record_text, resume_command, row_count
from rlctl.launch.locks import copy_of_running
from rlctl.launch.record import (
    event_to_record,
    failed_here,
    fetch_failure,
    fetch_record,
    record_is_here,
    record_view,
)
from rlctl.ops.client import connect_client
from rlctl.ops.detach import launcher_running, launcher_state
from rlctl.ops.extend import completed_checkpoints, last_row
from rlctl.ops.jobdb import LIVE, JobDB, JobRow
from rlctl.ops.jobprep import launch_again
from rlctl.ops.jobref import JobRef, require_job_dir
from rlctl.ops.runstate import (
    STOP_REQUESTED,
    UNSTARTED,
    current_run,
    ended_run_summary,
    event_or_unrecorded,
    resumes,
)
from rlctl.rl.source import heldout_view
from rlctl.transport import Message

log = logging.getLogger(__name__)

STATUS_DEADLINE_S = 5.0
# the longest a scale waits for the controller's answer (`rlctl scale --timeout`, when shorter): it answers at once, its
# units started in the background
SCALE_ANSWER_S = 30.0


REQUEST_FLOOR_S = 2.0  # the shortest wait for the controller's answer to a stop's shutdown request
LAUNCHER_END_S = 30.0  # how long a stop waits for the job's launcher to end once the agents have


def ask_controller(ref: JobRef, kind: str, body: dict[str, Any] | None = None, *, timeout_s: float) -> dict[str, Any]:
    """One request to the job's controller; TransportError (OSError: no controller.json; LaunchError: one that
    names no address)."""
    jd = ref.jobdir
    if not jd.path.is_dir():  # removed, or on a filesystem not mounted here
        raise TransportError(f"{jd.path}: no such job directory (removed, or not mounted on this machine?)")
    if not jd.controller_json.exists():
        raise TransportError(f"{jd.path}: the controller has not written controller.json (not started?)")
    conn = connect_client(jd, timeout_s=timeout_s, name=f"rlctl-{kind}")
    try:
        return dict(conn.request(Message(kind, dict(body or {})), timeout_s=timeout_s).header)
    finally:
        conn.close()


def _with_deadline(work: dict[str, Any], timeout_s: float) -> dict[str, tuple[str, Any]]:
    """Run each callable in a daemon thread; ("ok", value), ("error", text) or ("timeout", None) per key.

    Daemon threads, not an executor: a thread stuck on a dead host must not keep the CLI from exiting."""
    results: queue.Queue[tuple[str, str, Any]] = queue.Queue()

    def one(key: str, fn: Any) -> None:
        try:
            results.put((key, "ok", fn()))
        except (RlctlError, OSError) as e:
            results.put((key, "error", str(e)))

    for key, fn in work.items():
        threading.Thread(target=one, args=(key, fn), daemon=True).start()
    out: dict[str, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < len(work):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            key, how, value = results.get(timeout=left)
        except queue.Empty:
            break
        out[key] = (how, value)
    for key in work:
        out.setdefault(key, ("timeout", None))
    return out


def _exited(code: int) -> str:
    """'exited 1', 'exited -9 (SIGKILL)'; 'exited (status unknown)' for one that left none its backend could read
    (a local agent SIGKILLed, seen from another terminal, read 'exited 0')."""
    return "exited (status unknown)" if code == LOST else f"exited {exit_text(code)}"


def site_view(
    ref: JobRef, *, timeout_s: float, handles: list[AgentHandle] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every recorded agent's state (or that of `handles`, read already) as its site's scheduler sees it; sites
    that did not answer. A line of agents.jsonl that is no agent record is left out, said once (a line cut short by
    a full disk stays in it: status failed on it for good)."""
    if handles is None:
        handles = readable_agents(ref.jobdir.path)
    sites = read_sites(ref.jobdir.path)
    backends = Backends(sites, job=ref.jobdir.id, job_dir=ref.jobdir.path)
    by_site: dict[str, list[AgentHandle]] = {}
    for h in handles:
        by_site.setdefault(h.spec.site, []).append(h)

    def poll_site(site: str) -> Any:
        b = backends.for_site(site)
        return lambda: {h.spec.name: b.poll(h) for h in by_site[site]}

    t0 = time.monotonic()
    answers = _with_deadline({s: poll_site(s) for s in by_site}, timeout_s)
    agents, down = [], []
    for site, hs in by_site.items():
        how, value = answers[site]
        if how != "ok":
            down.append(site)
        for h in hs:
            code = value.get(h.spec.name) if how == "ok" else None
            state = "unknown" if how != "ok" else "running" if code is None else _exited(code)
            agents.append(
                {
                    "name": h.spec.name,
                    "role": h.spec.role,
                    "site": site,
                    "backend": h.backend,
                    "state": state,
                    "source": h.backend if how == "ok" else f"{how}: {value or f'no answer in {timeout_s:.0f} s'}",
                    "age_s": round(time.monotonic() - t0, 2),
                }
            )
    if not down:
        backends.close()  # a stuck site's connection is abandoned with its daemon thread
    return agents, down


def job_status(ref: JobRef, *, timeout_s: float = STATUS_DEADLINE_S) -> tuple[dict[str, Any], bool]:
    """The job's status and whether it is complete (False: exit 3, some part did not answer)."""
    jd = ref.jobdir
    require_job_dir(ref)  # its index row outlived it: said so, not "controller.json not written (not started?)"
    out: dict[str, Any] = {"id": ref.id, "job_dir": str(jd.path)}
    if ref.row is not None:
        out["index_state"] = ref.row.state
        out["launcher"] = launcher_state(
            ref.row.info.get("launcher"),
            ended=ref.row.state not in LIVE,
            job_dir=jd.path,
            source=ref.row.info.get("source"),
        )
    elif (original := copy_of_running(jd)) is not None:  # what status shows is the run of the job dir it copies
        out["copy_of"] = {"job_dir": str(original[0]), "launcher": original[1]}
    t0 = time.monotonic()
    live = _with_deadline({"controller": lambda: ask_controller(ref, "status", timeout_s=timeout_s)}, timeout_s + 1)
    how, value = live["controller"]
    out["controller_latency_s"] = round(time.monotonic() - t0, 3)
    if how == "ok":
        out.update(source="controller", live=value, figures_age_s=value.get("figures_age_s"))
        # a count in either view (the live `iteration` is the trainer's version: iterations trained; an ended job's
        # `last_iteration.iteration` is its last metrics row's own, from 0, as metrics.jsonl and `report` number them)
        out["iterations_done"] = value.get("iteration")
        out.update(ledger=value.get("ledger"), resilience=value.get("resilience"))
        return out, True
    out["controller"] = f"{how}: {value}" if value else how
    out["source"] = "job directory + site schedulers"
    read_sites(jd.path)  # a damaged one fails the status (site_view): said once here, not first as two warnings
    fetch_job_record(ref)
    last = last_row(jd)
    if last is not None:
        out["last_iteration"] = {
            k: last.get(k) for k in ("iteration", "reward_mean", "t_gen_s", "t_train_s", "delta_s")
        }
        if isinstance(last.get("iteration"), int):  # the row's iteration counts from 0; the summary's from 1 (the
            # count, as a live job's `iterations_done`)
            out["iterations_done"] = last["iteration"] + 1
        # a figure that is no number (a row edited by hand) is shown as it is, as the live view shows one (`_f` in
        # rlctl.commands.status), versus failing the whole status; a time that is none (null, text) is no age
        t = last.get("t")
        out["figures_age_s"] = None
        if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
            out["figures_age_s"] = round(time.time() - t, 1)
    if jd.evaluations.exists():  # held-out evaluations during the run (rlctl.agents.evaluation)
        evaluations = jd.read_lines(jd.evaluations)
        for n, e in enumerate(evaluations, 1):  # sorted by version, shown
            if not isinstance(e.get("version"), int | float) or not math.isfinite(e["version"]):
                said = f"{jd.evaluations}: row {n}: 'version' is {e.get('version')!r}, not a number"
                raise RlctlError(said, hint="was it edited?")
        out["heldout"] = heldout_view(evaluations)
    summary = ended_run_summary(jd, current_run(jd))  # not the run before's, left while this one runs
    if summary is not None:
        out["summary"] = {k: v for k, v in summary.items() if k not in ("reward_curve",)}
        # the same totals as a live status: the ledger, resumes and replaced units
        out.update(ledger=out["summary"].get("ledger"), resilience=out["summary"].get("resilience"))
    handles, this_run = readable_agents_and_run(jd.path)
    agents, down = site_view(ref, timeout_s=timeout_s, handles=handles)
    # an earlier run's agent that exited is none of this run's (a unit a scale-in removed, one a resume started under
    # a new name): it was listed, 'exited (status unknown)', runs after; one that still runs, or whose site did not
    # say, is listed (an orphan), as `stop` lists it
    agents = [a for a in agents if this_run is None or a["name"] in this_run or not a["state"].startswith("exited")]
    if _being_prepared(ref) and all(a["state"].startswith("exited") for a in agents):
        # (a resume's: the run before's agents, all exited, are none of this one's; it said `launching, but no agent
        # runs and no summary was written: it ended without one`, a controller error and `partial status`, exit 3)
        out["controller"], out["agents"], out["sites_down"] = PREPARING, [], []
        return out, True
    if not agents and last is None and summary is None and _never_started(jd):
        # a launch ended after it prepared the job, before any agent (a copied job dir, a launcher killed while it
        # staged): complete, and how to start it, versus `partial status` (exit 3) naming no controller.json
        start = resume_command(ref.id if ref.row is not None else jd.path)
        out["controller"] = f"{NEVER_STARTED}; start it with `{start}`"
        out["agents"], out["sites_down"], out["never_started"] = [], [], {"start": start}
        return out, True
    if (
        not agents
        and last is None
        and summary is None
        and (ref.row is None or ref.row.state not in LIVE or launcher_running(ref.row.info.get("launcher")) is False)
        and _never_prepared(jd)
    ):
        # a launch stopped (Ctrl-C) or failed before it wrote job.json, or whose launcher died then (its row left
        # launching: a reboot in the SFT warm-up): complete, and how to launch it anew (a resume refuses it), versus
        # `partial status` (exit 3) naming no controller.json, and `status -w` never ending
        again = launch_again(ref.row.info.get("source") if ref.row is not None else None)
        out["controller"] = f"{NEVER_PREPARED}; launch it anew with `{again}`"
        out["agents"], out["sites_down"], out["never_started"] = [], [], {"start": again}
        return out, True
    _launcher_saw(ref, agents, summary)
    out["agents"], out["sites_down"] = agents, down
    ended = "summary" in out and all(a["state"] != "running" for a in agents)
    if "summary" not in out and _ended_without_summary(ref, agents, down):
        # its controller was killed (SIGKILL, the OOM killer) and its launcher wrote the end it saw: a status that
        # is complete, not `partial status` (exit 3) for as long as the job dir lives
        code = ref.row.info.get("controller_exit") if ref.row is not None else None
        out["ended_without_summary"] = {
            "controller_exit": code,
            "resume": resume_command(ref.id if ref.row is not None else jd.path),
        }
        ended = True
    if ended and how == "error":  # it is not listening because the job is over, not because something broke: the
        # refused connect is not said ("was tcp://…: connect failed: [Errno 111] Connection refused" read as a fault)
        how_ended = out["summary"].get("state", "no state") if "summary" in out else "without a summary"
        out["controller"] = f"exited: the job ended ({how_ended})"
    if ended:  # where `launch --resume --checkpoint V` may take it back to (a damaged job.json: none said)
        with contextlib.suppress(RlctlError):
            versions = completed_checkpoints(jd)
            name = ref.id if ref.row else jd.path
            out["checkpoints"] = {
                "versions": versions,
                "resume": resume_command(name),
                "list": f"rlctl status {shlex.quote(str(name))} --checkpoints",
            }
    return out, ended and not down


PREPARING = "not started yet: its launcher prepares the job (SFT warm-up, tokenizing, staging) or starts its agents"


NEVER_STARTED = "never started: the job is prepared (its job.json and plan.json) but no agent of it ever started"


def _never_started(jd: JobDir) -> bool:
    """A job dir its launch prepared (job.json, plan.json) that records no agent at all (no agents.jsonl, or an
    empty one) and no launcher holds (`_being_prepared` is one a launcher still prepares or starts); the caller
    checks it has no metrics and no summary either (one that trained and lost its agents.jsonl is no such job).
    UsageError, one line, where its job.json is a directory (`refuse_lost_job_json`; a job looked up by its name or id
    was said to be prepared, never started)."""
    if jd.job_json.is_dir():
        jd.refuse_lost_job_json()
    return jd.job_json.is_file() and jd.plan_json.exists() and _no_agent(jd)


def _no_agent(jd: JobDir) -> bool:
    """No agent recorded (no agents.jsonl, or an empty one), no controller.json, and no launcher holds the job."""
    try:
        recorded = record_text(jd.path / AGENTS_FILE).strip()
    except FileNotFoundError:
        recorded = ""
    return not recorded and not jd.controller_json.exists() and jd.launcher_holder() is None


NEVER_PREPARED = "never prepared: its launch was stopped or failed before it wrote the job's job.json, no agent started"


def _never_prepared(jd: JobDir) -> bool:
    """A job dir its launch created but never prepared (no job.json, no plan.json: stopped or failed while it staged
    or warmed up) that records no agent, started none (its events) and no launcher holds; the caller checks it has no
    metrics and no summary."""
    return (
        not jd.job_json.exists() and not jd.plan_json.exists() and _no_agent(jd) and not jd.read_events("agent_started")
    )


def _being_prepared(ref: JobRef) -> bool:
    """A fresh launch, or a resume, before its controller started: its index row says launching, no controller.json
    (a run's start removes the run before's), and a launcher holds the job dir (a launch that died preparing left
    its row failed; one whose launcher holds nothing is not being prepared)."""
    row = ref.row
    jd = ref.jobdir
    return (
        row is not None
        and row.state == "launching"
        and not jd.controller_json.exists()
        and (jd.launcher_holder() is not None)
    )


def _launcher_saw(ref: JobRef, agents: list[dict[str, Any]], summary: dict[str, Any] | None) -> None:
    """An agent its site reads as `exited (status unknown)` (a local agent, seen from a terminal that did not start
    it) whose exit the launcher saw: the code its summary or index row recorded (`0`, `-9 (SIGKILL)`), for the
    latest record of that name (an earlier run's agent of the same name is not this run's)."""
    row_info = ref.row.info if ref.row is not None else {}
    known: dict[str, Any] = dict((summary or {}).get("agent_exits") or row_info.get("agent_exits") or {})
    known.update((summary or {}).get("trainer_ranks_ended") or {})
    controller_exit = (summary or {}).get("controller_exit")
    if controller_exit is None:
        controller_exit = row_info.get("controller_exit")
    latest = {a["name"]: a for a in agents}
    for a in latest.values():
        code = controller_exit if a["role"] == "controller" and controller_exit is not None else known.get(a["name"])
        if a["state"] == _exited(LOST) and isinstance(code, int) and code != LOST:
            a["state"] = _exited(code)
            a["source"] = f"{a['source']} (the launcher saw the exit)"


def _ended_without_summary(ref: JobRef, agents: list[dict[str, Any]], down: list[str]) -> bool:
    """Whether the job's run ended with no summary written: every agent is known to have exited, its controller
    among them, and no launcher watches it (its index row says it ended, or its launcher is gone)."""
    if down or not any(a["role"] == "controller" for a in agents):
        return False
    if not all(a["state"].startswith("exited") for a in agents) or ref.jobdir.launcher_holder() is not None:
        return False
    row = ref.row
    return row is None or row.state not in LIVE or launcher_running(row.info.get("launcher")) is False


def row_now(row: JobRow | None) -> JobRow | None:
    """`row` as the index holds it now (itself when the index no longer does)."""
    if row is None:
        return None
    db = JobDB()
    try:
        return db.get(row.name)
    except RlctlError:
        return row
    finally:
        db.close()


def job_end(ref: JobRef) -> str | None:
    """How the job ended, from its record alone (no site asked), None while it may run: its index row's state once
    its launcher recorded the end; else, with no launcher left to go on with it (to resume a failed run), the state
    of its latest run's summary. A job its launcher watches runs until that launcher records its end. The row is
    read again at each call (a follower asks for minutes: the `ref` it resolved is the job as it was then)."""
    row = row_now(ref.row)
    if row is not None and row.state not in LIVE:
        return row.state
    if ref.jobdir.launcher_holder() is not None:
        return None
    if row is not None and launcher_running(row.info.get("launcher")) is not False:
        return None
    summary = ended_run_summary(ref.jobdir, current_run(ref.jobdir))
    return None if summary is None else str(summary.get("state", "ended"))


def fetch_job_record(ref: JobRef) -> list[str]:
    """Bring the controller's record (summary, metrics, events) here when it runs on another site; a fetch that
    fails leaves what is here, said in one warning naming where it failed, with the error's hint: the job dir here
    (its record that does not say where the controller keeps its own, a lock or file there that cannot be opened or
    written: another user's job dir, a read-only mount) or the controller's site (one that does not answer), versus
    every failure said as the site's ('cannot fetch the record from the controller's site', the hint dropped)."""
    jd = ref.jobdir
    try:
        view = record_view(jd.path)
    except (RlctlError, OSError) as e:
        log.warning(
            "job %s: cannot fetch the record: its job dir here does not say where it is: %s", ref.id, fetch_failure(e)
        )
        return []
    if view is None:
        return []
    try:
        return fetch_record(jd.path, *view)
    except (RlctlError, OSError) as e:
        where = (
            "into its job dir here" if failed_here(jd.path, e) else f"from the controller's site ({view[1]}:{view[2]})"
        )
        log.warning("job %s: cannot fetch the record %s: %s", ref.id, where, fetch_failure(e))
        return []


def scale(ref: JobRef, delta: int, *, site: str | None, timeout_s: float = SCALE_ANSWER_S) -> dict[str, Any]:
    """The controller's answer to a request to add (`delta` > 0) or drain rollout units, waited for `timeout_s`."""
    if delta == 0:
        raise RlctlError("--rollout must be non-zero, e.g. +1 or -1")
    require_job_dir(ref)  # its index row outlived it: said so, versus `launch it anew: rlctl launch JOB.yaml`
    # its controller is gone: "did not answer" misled (a job dir the index lacks: its summary says how it ended)
    if (ended := job_end(ref)) is not None:
        # a finished job's plain resume is refused (nothing left to run); one the index lacks goes by its directory
        resume = resume_command(ref.id if ref.row is not None else ref.jobdir.path)
        if not ref.jobdir.job_json.exists():  # its launch stopped before it prepared the job: a resume refuses it
            go_on = f"launch it anew: `{launch_again(ref.row.info.get('source') if ref.row is not None else None)}`"
        elif ended in ("finished", "done"):
            go_on = f"train it on with `{resume} --iterations N`"
        else:
            go_on = f"continue it with `{resume}`"
        raise UsageError(f"job {ref.id} ended ({ended}): nothing to scale", hint=go_on)
    if _being_prepared(ref):  # no controller to ask yet: said so, versus `the controller did not answer: …
        # controller.json (not started?) (hint: is the job running?)`, exit 1
        raise UsageError(
            f"job {ref.id} is being prepared by its launcher (SFT warm-up, tokenizing, staging); nothing to scale yet",
            hint=f"scale it once it runs: `rlctl status {shlex.quote(ref.id)}` says when",
        )
    if delta > 0 and (ref.jobdir.path / SITES_FILE).exists():
        _refuse_unit_sites(ref, site)
    try:
        return ask_controller(ref, "scale", {"delta": delta, "site": site}, timeout_s=timeout_s)
    except (TransportError, OSError) as e:
        # (it hinted "is the job running?" of a job `rlctl status` said ran: a controller stuck, or cut off from here)
        within = f" within {timeout_s:.0f} s" if isinstance(e, PeerTimeout) else ""
        raise RlctlError(
            f"job {ref.id}: the controller did not answer the scale request{within} ({e})",
            hint=f"`rlctl status {ref.arg}` says whether the job runs; if it does, its controller may be stuck: "
            f"`rlctl logs {ref.arg} controller` shows its log",
        ) from e


def _refuse_unit_sites(ref: JobRef, site: str | None) -> None:
    """The SLURM sites a unit added may start on (`site`, else the job's rollout sites) asked about their constraint
    and reservation (as launched: one ended since), as `check --reach` asks them: a wrong one refused in its line,
    exit 2, before the controller is asked; versus each unit's sbatch refused after the request was taken (the
    unit `did not start`)."""
    from rlctl.ops.preflight import refuse
    from rlctl.ops.preflight.slurmoptions import ASK_S, launched_option_problems

    rollout = [str(g["site"]) for g in ref.jobdir.read_plan()["rollout"]]
    named = rollout if site is None else [s for s in rollout if s == site]  # another: the controller says why
    refuse(str(ref.jobdir.path), launched_option_problems(ref.jobdir.path, named, timeout_s=ASK_S))


def scale_progress(
    ref: JobRef, names: list[str], *, timeout_s: float = STATUS_DEADLINE_S
) -> tuple[dict[str, float], dict[str, str]]:
    """Of `names` (units a scale asked for), as the controller counts them (its status reply): seconds from the
    request to each one's first sample, and the error of each whose start failed. The events.jsonl here is not
    the one it writes when it keeps its job dir on another site (a SLURM site's workdir, an SSH site), which
    reaches here only when the job's record is fetched. TransportError: it did not answer; RlctlError: it does
    not count them (a controller older than this rlctl)."""
    reply = ask_controller(ref, "status", timeout_s=timeout_s)
    if "first_sample_s" not in reply:
        raise RlctlError(
            f"job {ref.id}: its controller does not report new units' first samples (started by an older rlctl)",
            hint=f"use `rlctl scale --no-wait` and watch `rlctl status {ref.arg}`",
        )
    firsts, failed = reply["first_sample_s"], reply.get("failed_starts", {})
    return {n: float(firsts[n]) for n in names if n in firsts}, {n: str(failed[n]) for n in names if n in failed}


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
