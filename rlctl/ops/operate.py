"""Operating a running job from any terminal: status, scale, stop — the library behind those verbs.

status: controller (live, one RPC with a deadline) ──none──▶ last metrics row + each site's
        scheduler (squeue / pidfiles over SSH), every site in its own thread with a deadline:
        a dead site is reported "unreachable" and never holds the answer back
scale:  one RPC to the controller; it starts (or drains) the units and answers with their names (`--wait`: its
        status says each new unit's first sample; its events.jsonl may be on another site)
stop:   "shutdown" RPC (graceful: the controller stops its agents, writes summary.json) ─▶ wait
        ─▶ every agent in agents.jsonl stopped on its site (TERM, grace, KILL, verified)
        ─▶ the job's launcher lets go of it (bounded: a `launch --resume` is refused until it has);
        `rlctl.ops.stop`, on this module's controller RPC, site view and record fetch

Agents are those in the operator's agents.jsonl plus, when the controller runs on another site, those
its Spawner recorded there; its record (summary, metrics, events) is fetched from there when needed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import shlex
import threading
import time
from typing import Any

from rlctl.errors import PeerTimeout, RlctlError, TransportError, UsageError
from rlctl.launch.agentrecords import (
    readable_agents,
    readable_agents_and_run,
)
from rlctl.launch.backends import AGENTS_FILE, SITES_FILE, Backends, read_sites
from rlctl.launch.base import LOST, AgentHandle, exit_text
from rlctl.launch.jobdir import JobDir, resume_command
from rlctl.launch.locks import copy_of_running
from rlctl.launch.record import (
    failed_here,
    fetch_failure,
    fetch_record,
    record_view,
)
from rlctl.launch.recordfiles import record_text
from rlctl.ops.client import connect_client
from rlctl.ops.detach import launcher_running, launcher_state
from rlctl.ops.extend import completed_checkpoints, last_row
from rlctl.ops.jobdb import LIVE, JobDB, JobRow
from rlctl.ops.jobprep import launch_again
from rlctl.ops.jobref import JobRef, require_job_dir
from rlctl.ops.runstate import (
    current_run,
    ended_run_summary,
    run_warnings,
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
        _with_warnings(out, jd)
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
    _with_warnings(out, jd)
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


def _with_warnings(out: dict[str, Any], jd: JobDir) -> None:
    """The warnings its launcher said as the job's latest run started (a trainer rank this rlctl prices past its
    GPU), where it recorded any (`runstate.run_warnings`): the status of that run shows them, versus said once on the
    launcher's output (a detached one's: launcher.log) and seen nowhere after."""
    if warnings := run_warnings(jd):
        out["warnings"] = warnings


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
