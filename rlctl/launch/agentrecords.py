"""The job's agent records (agents.jsonl) read as one: the operator's, and the controller site's where that is
elsewhere (the units its controller started on scale): every agent (`all_recorded_agents`), those a reader can read
(`readable_agents`), the names of the latest run's (`latest_run_names`)."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import AGENTS_FILE, agents_from_lines
from rlctl.launch.base import AgentHandle
from rlctl.launch.jobdir import say_once
from rlctl.launch.record import record_is_here, record_view
from rlctl.launch.recordfiles import record_text
from rlctl.launch.sitefs import host_files

log = logging.getLogger(__name__)


def remote_agent_lines(job_dir: Path, site: Site, host: str, root: str) -> str:
    """The controller site's agents.jsonl ('' when it is the operator's own file or missing)."""
    if record_is_here(site, root, job_dir):
        return ""
    fs = host_files(site, host)
    try:
        return fs.read_text(f"{root}/{AGENTS_FILE}") or ""
    finally:
        fs.close()


def _recorded_text(job_dir: Path, problems: list[str] | None) -> str:
    """The agent records' lines: the operator's agents.jsonl, then the controller site's (when that is elsewhere);
    a controller site that does not answer, or a record here that does not say where it is, leaves only the first,
    with a warning (a line in `problems` instead, when given)."""
    local = job_dir / AGENTS_FILE
    text = record_text(local) if local.exists() else ""
    try:
        view = record_view(job_dir)
        if view is not None:
            text += remote_agent_lines(job_dir, *view)
    except LaunchError as e:
        if problems is None:
            log.warning("the controller site's agent record is unreachable (%s); using the local one", e)
        else:
            problems.append(f"the controller site's agent record is unreachable ({e}); stopped those recorded here")
    return text


def all_recorded_agents(
    job_dir: Path, problems: list[str] | None = None, *, skipped: list[str] | None = None
) -> list[AgentHandle]:
    """Every agent of the job: those the operator's launch started (its agents.jsonl) and those the controller
    started on scale (the controller site's agents.jsonl, when that is elsewhere; `_recorded_text`). A line that is
    no agent record raises LaunchError, or, given `skipped`, is left out and said there (a stop stops every agent it
    can read)."""
    return agents_from_lines(_recorded_text(job_dir, problems), source=job_dir / AGENTS_FILE, skipped=skipped)


def agents_and_latest_run(
    job_dir: Path, problems: list[str], *, skipped: list[str]
) -> tuple[list[AgentHandle], set[str] | None]:
    """`all_recorded_agents` and `latest_run_names` from one reading of the records (a remote controller site's is
    one SSH fetch): what `rlctl stop` stops, and which of them it lists."""
    text = _recorded_text(job_dir, problems)
    return agents_from_lines(text, source=job_dir / AGENTS_FILE, skipped=skipped), run_names(text)


def latest_run_names(job_dir: Path) -> set[str] | None:
    """The names of the agents of the job's latest run: those recorded since its last controller record (in
    agents.jsonl, and on the controller's site where that keeps its own: the units its controller started on scale);
    None when none records a controller. A line that is no record is passed over (its readers say it). Not the
    handles' order: a name a later run records again keeps its first run's place among them."""
    return run_names(_recorded_text(job_dir, []))  # a site that does not answer: the agents recorded here


def run_names(text: str) -> set[str] | None:
    """`latest_run_names` of the records' lines (an agents.jsonl's text)."""
    names: set[str] | None = None
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if not isinstance(d, dict):
                continue
            if d.get("role") == "controller":
                names = set()
            if names is not None and isinstance(d.get("name"), str):
                names.add(d["name"])
    return names


def readable_agents(job_dir: Path) -> list[AgentHandle]:
    """`all_recorded_agents` for a reader that acts on what it can read (status, attach, logs): a line that is no
    agent record (cut short by a full disk, it stays in the file for good) is left out and said once."""
    return readable_agents_and_run(job_dir)[0]


def readable_agents_and_run(job_dir: Path) -> tuple[list[AgentHandle], set[str] | None]:
    """`readable_agents` and `latest_run_names` from one reading of the records (a remote controller site's is one
    SSH fetch)."""
    skipped: list[str] = []
    text = _recorded_text(job_dir, None)
    handles = agents_from_lines(text, source=job_dir / AGENTS_FILE, skipped=skipped)
    say_once(skipped)
    return handles, run_names(text)
