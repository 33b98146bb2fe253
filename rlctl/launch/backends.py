"""Which backend runs a site's agents, and the job's record of every agent it started.

    site.scheduler.kind ─▶ kind_of ─▶ local: LocalBackend · slurm: SlurmBackend · ssh: SshBackend
    every start ─▶ <job_dir>/agents.jsonl  (one line per agent: name, role, replica, site, backend, ident,
                                            host + gpus of its GPU slice on local / SSH sites)

Whoever starts an agent — `rlctl launch`, the controller scaling out — appends its handle, so
`rlctl stop` (another process, maybe another day) can find and stop every agent of the job on every
site, `rlctl status` can ask each site's scheduler when the controller does not answer, and a unit
added later gets a GPU slice no recorded agent holds.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlctl.config.base import first_error
from rlctl.config.inventory import RECORDED, Site
from rlctl.errors import LaunchError
from rlctl.launch.base import AgentHandle, AgentSpec, GpuSlice, LaunchBackend
from rlctl.launch.local import LocalBackend
from rlctl.launch.recordfiles import append_row, json_file, json_lines, record_text

SITES_FILE = "sites.json"
AGENTS_FILE = "agents.jsonl"
# what a process's handle (its ident) holds, by backend: the fields its poll and stop read, of their type. A
# hand-edited "pgid": "5", or a record without its pgid (a slurm record without its job_id), is said when the record
# is read, versus a TypeError or KeyError when its agent is polled or stopped. (slurm's `stopped` is read as absent
# where it is: `.get`)
PROCESS_IDENT: dict[str, dict[str, type]] = {
    "local": {"pid": int, "pgid": int, "start_ticks": int},
    "ssh": {"host": str, "pid": int, "pgid": int, "start_ticks": int, "exitfile": str},
    "slurm": {"job_id": str},  # as its submit wrote it: sbatch's (or submitit's) job id, a string
}
OLDER_IDENT = {("local", "start_ticks")}  # an older rlctl's local record has none: its agent unchecked (local._reused)


def write_sites(job_dir: Path, sites: dict[str, Site]) -> None:
    """The inventory entries of the job's sites, [{"name", "site"}], for processes that scale or stop it."""
    data = [{"name": n, "site": s.model_dump(mode="json", by_alias=True)} for n, s in sorted(sites.items())]
    (job_dir / SITES_FILE).write_text(json.dumps(data, indent=2) + "\n")


def read_sites(job_dir: Path, *, required: bool = False) -> dict[str, Site]:
    """What `write_sites` wrote ({} before it did; `required`: a job whose sites are needed, LaunchError naming the
    missing file, `sites_missing`); LaunchError naming the file and entry when it is not that."""
    p = job_dir / SITES_FILE
    if not p.exists():
        if required:
            raise sites_missing(job_dir)
        return {}
    data = json_file(p)
    if not isinstance(data, list):
        raise LaunchError(f'{p}: not a list of {{"name", "site"}} entries')
    out = {}
    for i, d in enumerate(data):
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or "site" not in d:
            raise LaunchError(f'{p}: [{i}]: not a {{"name", "site"}} entry')
        try:
            out[d["name"]] = Site.model_validate(d["site"], context=RECORDED)  # as its launch accepted it
        except ValidationError as e:
            field, msg = first_error(e)
            raise LaunchError(f"{p}: [{i}].site.{field}: {msg}") from e
    return out


def sites_missing(job_dir: Path) -> LaunchError:
    """The error of a job dir whose sites.json is gone (deleted by hand; `read_sites` reads it as no sites), naming
    it: else the job's sites read as none ("site 'a' is not in this job's inventory ()")."""
    return LaunchError(
        f"{job_dir / SITES_FILE}: missing (the launch's record of the job's sites: rlctl reaches them through it)",
        hint="put it back from a copy of the job dir",
    )


REMOTE_PYTHON = "python3"  # a host's own, on its PATH


def python_for(site: Site) -> str:
    """The interpreter on the site's hosts: the site's `python`; else python3 on sites reached over SSH (SSH hosts,
    a SLURM cluster's submit host: their own filesystem), this one elsewhere (local processes; SLURM nodes sharing
    this filesystem)."""
    if site.python is not None:
        return site.python
    if kind_of(site).remote(site):  # this interpreter's path is this machine's: a cluster's sbatch ran it there
        return REMOTE_PYTHON
    return kind_of(site).default_python


def kind_of(site: Site) -> type[LaunchBackend]:
    """The backend class of the site's scheduler kind: the one place the kind is looked at (every difference
    between kinds is a hook of this class, `rlctl.launch.base.LaunchBackend`)."""
    from rlctl.launch.slurm import SlurmBackend
    from rlctl.launch.ssh import SshBackend

    classes: dict[str, type[LaunchBackend]] = {"local": LocalBackend, "slurm": SlurmBackend, "ssh": SshBackend}
    return classes[site.scheduler.kind]


def make_backend(site_name: str, site: Site, *, job: str, job_dir: Path) -> LaunchBackend:
    """The backend of one site (one instance per site per process: it holds SSH connections)."""
    return kind_of(site).for_site(site_name, site, job=job, job_dir=job_dir)


class Backends:
    """One backend per site of a job, created on first use; `close()` ends their connections."""

    def __init__(self, sites: dict[str, Site], *, job: str, job_dir: Path) -> None:
        self.sites, self.job, self.job_dir = sites, job, job_dir
        self._by_site: dict[str, LaunchBackend] = {}
        self._lock = threading.Lock()

    def for_site(self, site: str) -> LaunchBackend:
        with self._lock:
            if site not in self._by_site:
                if not self.sites and not (self.job_dir / SITES_FILE).exists():
                    raise sites_missing(self.job_dir)
                if site not in self.sites:
                    # named by the job's own record (agents.jsonl, plan.json), which the launch's sites.json lacks
                    raise LaunchError(
                        f"{self.job_dir / SITES_FILE}: no site {site!r}, where the job's record places an agent (its "
                        f"sites: {', '.join(self.sites) or 'none'})",
                        hint="the launch's record of the sites is damaged: put it back from a copy of the job dir",
                    )
                self._by_site[site] = make_backend(site, self.sites[site], job=self.job, job_dir=self.job_dir)
            return self._by_site[site]

    def close(self) -> None:
        for b in self._by_site.values():
            close = getattr(b, "close", None)
            if close is not None:
                close()
        self._by_site.clear()


# -- the job's agent record ---------------------------------------------------------------------------
def record_agent(job_dir: Path, handle: AgentHandle) -> None:
    s = handle.spec
    row = {
        "name": s.name,
        "role": s.role,
        "replica": s.replica,
        "site": s.site,
        "backend": handle.backend,
        "ident": handle.ident,
        "log": str(s.log_path) if s.log_path else None,
        "host": s.gpu_slice.host if s.gpu_slice else None,
        "gpus": list(s.gpu_slice.gpus) if s.gpu_slice else None,
    }
    append_row(job_dir / AGENTS_FILE, row)  # on a line of its own, past one cut short (a full disk)


def recorded_agents(job_dir: Path) -> list[AgentHandle]:
    """Every agent ever started for the job (the last record wins for a name started twice)."""
    p = job_dir / AGENTS_FILE
    return agents_from_lines(record_text(p), source=p) if p.exists() else []


def agents_from_lines(
    text: str, *, source: Path | str = AGENTS_FILE, skipped: list[str] | None = None
) -> list[AgentHandle]:
    """The handles of an agents.jsonl text (the last record wins for a name started twice); `source`: the file
    named when a line is not a record (LaunchError; given `skipped`, the line is left out and said there); a last
    line cut short (a writer in it) is skipped."""
    out: dict[str, AgentHandle] = {}
    for n, d in enumerate(json_lines(source, text, skipped=skipped), 1):
        try:
            handle = _agent_handle(d)
        except ValueError as e:
            bad = f"{source}: record {n} is not an agent record: {e}"
            if skipped is None:
                raise LaunchError(bad) from e
            skipped.append(f"{bad}: left out")
            continue
        out[d["name"]] = handle
    return list(out.values())


def _is(value: object, kind: type) -> bool:
    return type(value) is kind  # a bool is no integer (no replica, no pid) either


def _field(value: object, name: str, kind: type) -> str:
    return f"{name} is {json.dumps(value)}, not {'an integer' if kind is int else 'a string'}"


def _agent_handle(d: dict[str, Any]) -> AgentHandle:
    """One agents.jsonl record as a handle; ValueError naming the field (as the record writes it) that is missing or
    of another type: every field a poll or stop reads, versus a record read whole and a TypeError or KeyError later
    (`"site": null` made `rlctl stop` blame sites.json for no site None, and stop nothing)."""
    wanted: dict[str, type] = {"name": str, "role": str, "replica": int, "site": str, "backend": str}
    for name, kind in wanted.items():
        if name not in d:
            raise ValueError(f"no {name}")
        if not _is(d[name], kind):
            raise ValueError(_field(d[name], name, kind))
    gpus, log, ident = d.get("gpus"), d.get("log"), d.get("ident")
    if gpus is not None:
        if not isinstance(gpus, list) or not all(_is(g, int) for g in gpus):
            raise ValueError(f"gpus is {json.dumps(gpus)}, not a list of integers")
        if not _is(d.get("host"), str):
            raise ValueError(_field(d.get("host"), "host", str))
    if log is not None and not _is(log, str):
        raise ValueError(_field(log, "log", str))
    if not isinstance(ident, dict):
        raise ValueError("no ident" if ident is None else f"ident is {json.dumps(ident)}, not a JSON object")
    for k, kind in PROCESS_IDENT.get(d["backend"], {}).items():
        if k not in ident:
            if (d["backend"], k) not in OLDER_IDENT:
                raise ValueError(f"ident has no {k}")
        elif not _is(ident[k], kind):
            raise ValueError(_field(ident[k], f"ident.{k}", kind))
    gpu_slice = GpuSlice(d["host"], tuple(gpus)) if gpus is not None else None
    spec = AgentSpec(d["role"], d["replica"], d["site"], [], log_path=Path(log) if log else None, gpu_slice=gpu_slice)
    return AgentHandle(spec, dict(ident), d["backend"])


def stop_agents(
    backends: Backends, handles: list[AgentHandle], *, grace_s: float, failed: set[str] | None = None
) -> list[str]:
    """Stop every handle on its site's backend; returns one problem line per site that failed (and adds those
    sites to `failed`)."""
    by_site: dict[str, list[AgentHandle]] = {}
    for h in handles:
        by_site.setdefault(h.spec.site, []).append(h)
    problems = []
    for site, hs in by_site.items():
        try:
            backends.for_site(site).stop(hs, grace_s=grace_s)
        except LaunchError as e:
            problems.append(f"site {site}: {e}")
            if failed is not None:
                failed.add(site)
    return problems
