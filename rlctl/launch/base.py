"""The launch-backend interface: start an agent process somewhere, poll it, stop it for sure.

    spec = AgentSpec(role="rollout", replica=1, site="local", argv=[...], env={...}, log_path=...)
    handle = backend.start(spec)      # returns at once; the agent runs detached from the caller
    backend.poll(handle)              # None while running, else the exit code
    backend.stop([handles], grace_s) # SIGTERM to each process group, grace, SIGKILL, verify none left

Backends: `local` (subprocesses in their own process groups, `local.py`); SLURM and SSH backends
implement the same three methods. `rlctl.launch.backends.kind_of(site)` is the one place that maps a
site's scheduler kind to its backend class; everything else that differs between kinds is a hook of that
class, so no caller switches on the kind:

    per agent (instance)   render(spec) · request_summary(spec) · host_for(spec) · close()
    per site (class)       for_site (construct) · work_root · remote · ssh_target · access_hosts · agent_view ·
                           shared_work_root · site_runner · probe_commands · probe_late · reach · site_problems, and
                           the flags slices_gpus, ranks_are_tasks, on_this_machine, default_python

What an agent needs travels with its spec: `resources` (tasks, GPUs and CPU threads per task, which
SLURM requests) and, on `local` / `ssh` sites, `gpu_slice` (the host it runs on and the GPU ids it
owns there, exported as CUDA_VISIBLE_DEVICES; `rlctl.launch.gpus` hands them out).
"""

from __future__ import annotations

import shlex
import signal
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlctl.errors import LaunchError
from rlctl.textutil import home_path

if TYPE_CHECKING:
    from rlctl.config.inventory import Site
    from rlctl.launch.remote import Runner, SshTarget

DEFAULT_WORKDIR = "~/.rlctl"  # the work root on a site reached over SSH that names none

# the exit code `poll` reports for an agent that ended without one the backend can read: SIGKILLed or OOM-killed
# with no parent here to reap it (another terminal's `rlctl status`), a host rebooted, an SSH agent's exit file
# never written. Shown as "status unknown", not "exited 255" (an agent's own exit 255 reads the same: none does)
LOST = 255


def exit_text(code: int | None) -> str:
    """An agent's exit code for a message: `-9 (SIGKILL)` for one a signal ended, `143 (SIGTERM)` for one that
    exited 128 + a signal's number (a shell's, or an agent's own exit on that signal), `an unknown status` for one
    that left none the backend could read (LOST: killed with no parent here to tell, a host rebooted)."""
    if code == LOST:
        return "an unknown status"
    if code is not None and (code < 0 or code > 128):
        try:
            return f"{code} ({signal.Signals(-code if code < 0 else code - 128).name})"
        except ValueError:
            pass
    return str(code)


@dataclass(frozen=True)
class SiteProblem:
    """What stops a site's entry (`LaunchBackend.site_problems`): the field under `sites.<site>`, what is wrong
    with it, what to do."""

    field: str
    message: str
    hint: str


@dataclass(frozen=True)
class Resources:
    """What one spec asks its site for: its tasks (a SLURM trainer's ranks), GPU slots and CPU threads each.

    On a `gpu: CPU` site a GPU slot is a core slot: counted and placed the same way, never requested as GRES."""

    tasks: int = 1
    gpus_per_task: int = 0
    cpus_per_task: int = 1
    mem_mb_per_task: int | None = None  # host memory (the inventory's nodes' memory_gb for its GPU slots)
    # consecutive tasks that share a node (a SLURM trainer's tp group: its all-reduces stay on the node's NVLink)
    group: int = 1


@dataclass(frozen=True)
class GpuSlice:
    """The GPUs one agent owns on one host of a local / SSH site (ids as CUDA_VISIBLE_DEVICES lists them)."""

    host: str
    gpus: tuple[int, ...]

    @property
    def visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))


@dataclass(frozen=True)
class AgentSpec:
    """One agent process to start: what it is, where, and exactly how."""

    role: str  # "controller" | "trainer" | "rollout"
    replica: int
    site: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the backend's base environment
    log_path: Path | None = None
    cwd: Path | None = None
    resources: Resources = Resources()
    gpu_slice: GpuSlice | None = None  # local / SSH sites: where it runs and its GPUs; None: the backend picks

    @property
    def name(self) -> str:
        return f"{self.role}-{self.replica}"


@dataclass
class AgentHandle:
    """A started agent; `ident` is backend-specific (pid/pgid, SLURM job id, host:pidfile)."""

    spec: AgentSpec
    ident: dict[str, Any]
    backend: str


class LaunchBackend(ABC):
    """Starts, polls and stops agents on one site; its class methods answer what a site of its kind is
    (where its files live, how commands reach it) without a connection."""

    kind: ClassVar[str]
    slices_gpus: ClassVar[bool] = True  # rlctl hands out CUDA_VISIBLE_DEVICES slices per host (SLURM binds its own)
    ranks_are_tasks: ClassVar[bool] = False  # a trainer's ranks are the tasks of one scheduler job ($SLURM_PROCID)
    on_this_machine: ClassVar[bool] = False  # agents run as processes of the operator's machine
    default_python: ClassVar[str] = sys.executable  # the interpreter when the site names none

    # ── per agent ──
    @abstractmethod
    def start(self, spec: AgentSpec) -> AgentHandle:
        """Start the agent; LaunchError if it could not be started."""

    @abstractmethod
    def poll(self, handle: AgentHandle) -> int | None:
        """None while the agent runs, else its exit code (negative: killed by that signal; LOST: it ended, with no
        exit status the backend can read)."""

    def queued(self, handle: AgentHandle) -> bool:
        """True while its scheduler has not started it yet (SLURM: pending); a backend without a queue: never."""
        return False

    @abstractmethod
    def stop(self, handles: list[AgentHandle], *, grace_s: float = 10.0) -> None:
        """Stop every agent and everything it started; LaunchError if anything is left running."""

    def identifies(self, handle: AgentHandle) -> bool:
        """The handle tells its agent from a process that took its id after it ended (a pid with its start time,
        a scheduler's job id); False: a record of an older rlctl, whose process group may be someone else's."""
        return True

    def render(self, spec: AgentSpec) -> str:
        """The exact command or script that starts `spec` (`launch --dry-run`)."""
        return shlex.join(spec.argv)

    def request_summary(self, spec: AgentSpec) -> str | None:
        """What the scheduler is asked for (SLURM: nodes, tasks, GPUs, CPUs, memory); None where nothing is."""
        return None

    def host_for(self, spec: AgentSpec) -> str | None:
        """The host `spec` runs on; None where the scheduler places it."""
        return spec.gpu_slice.host if spec.gpu_slice is not None else None

    def at_time_limit(self, handle: AgentHandle) -> str | None:
        """Whether the agent's scheduler job ended, or is ending, at its time limit (a planned end, not a crash):
        what says so (`SLURM job 12 ran 0:01:31 of its 0:02:00 limit`), else None; only a batch scheduler has one."""
        return None

    def close(self) -> None:
        """End the backend's connections (it is not used afterwards)."""
        return None

    # ── per site ──
    @classmethod
    @abstractmethod
    def for_site(cls, site_name: str, site: Site, *, job: str, job_dir: Path) -> LaunchBackend:
        """The backend of one site of job `job` (one instance per site per process: it holds connections)."""

    @classmethod
    def work_root(cls, site: Site) -> str | None:
        """The site's work root as configured (a leading `~`: the site user's home), None when the job's files
        there are the operator's job dir itself (this machine's filesystem, no root named)."""
        workdir = site.scheduler.workdir
        return None if workdir is None else str(home_path(workdir, named="workdir"))

    @classmethod
    def remote(cls, site: Site) -> bool:
        """Whether the site's files are reached over SSH (not this machine's filesystem)."""
        return False

    @classmethod
    def ssh_target(cls, site: Site, host: str | None = None, *, connect_timeout_s: float = 10.0) -> SshTarget:
        """Where `host` of the site (default: its entry point) is reached over SSH."""
        raise LaunchError(f"a {cls.kind} site is not reached over SSH")

    @classmethod
    def access_hosts(cls, site: Site) -> list[str]:
        """The views of the site that need their own copy of the job's files."""
        return ["localhost"]

    @classmethod
    def agent_view(cls, site: Site, agent_host: str | None) -> str:
        """The view (one of `access_hosts`) that holds the files of an agent running on `agent_host`."""
        return cls.access_hosts(site)[0]

    @classmethod
    def shared_work_root(cls, site: Site) -> bool:
        """Whether every host the site runs agents on sees one work root."""
        return True

    @classmethod
    def site_runner(cls, site: Site, host: str | None = None) -> Runner:
        """How a command reaches the site (`host`: one of its SSH hosts; default its entry point)."""
        from rlctl.launch.localrunner import LocalRunner

        return LocalRunner()

    @classmethod
    def probe_commands(cls, site: Site, command: str, *, first: bool = False) -> list[tuple[str, str | None, str]]:
        """Where to run a probe `command` so that it runs where agents do, as (what to call that place, host for
        `site_runner`, the command as run there); `first`: the first such place only."""
        return [("localhost", None, command)]

    @classmethod
    def probe_late(cls, site: Site, timeout_s: float) -> str | None:
        """What a probe (`probe_commands`) past its deadline `timeout_s` says of the site, where the place that ran it
        was reached and the probe may only have waited its turn (a scheduler's queue): the line to say, the site
        then reached; None where a host that took the command and did not end it is as good as down."""
        return None

    @classmethod
    def site_problems(cls, site: Site) -> list[SiteProblem]:
        """What this machine can tell, without asking the site, stops its agents from starting (a local site's work
        root this machine cannot make); the hosts of other sites are asked by `rlctl check --reach`."""
        return []

    @classmethod
    def reach(cls, site: Site, *, timeout_s: float) -> str:
        """Ask the site's scheduler or hosts whether they answer: one line of what was seen; raises if not."""
        return "local processes"


def site_setup(lines: list[str]) -> list[str]:
    """A site's `setup` lines for a bash script run with `set -u` (activation scripts read unset variables)."""
    return ["set +u", *lines, "set -u"] if lines else []
