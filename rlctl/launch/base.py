"""The launch-backend interface: start an agent process somewhere, poll it, stop it for sure.

    spec = AgentSpec(role="rollout", replica=1, site="local", argv=[...], env={...}, log_path=...)
    handle = backend.start(spec)      # returns at once; the agent runs detached from the caller
    backend.poll(handle)              # None while running, else the exit code
    backend.stop([handles], grace_s) # SIGTERM to each process group, grace, SIGKILL, verify none left

Backends: `local` (subprocesses in their own process groups, `local.py`); SLURM and SSH backends
implement the same three methods. `rlctl.launch.backends.make_backend(site)` picks one by the
site's scheduler kind.

What an agent needs travels with its spec: `resources` (tasks, GPUs and CPU threads per task, which
SLURM requests) and, on `local` / `ssh` sites, `gpu_slice` (the host it runs on and the GPU ids it
owns there, exported as CUDA_VISIBLE_DEVICES; `rlctl.launch.gpus` hands them out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Resources:
    """What one spec asks its site for: its tasks (a SLURM trainer's ranks), GPU slots and CPU threads each.

    On a `gpu: CPU` site a GPU slot is a core slot: counted and placed the same way, never requested as GRES."""

    tasks: int = 1
    gpus_per_task: int = 0
    cpus_per_task: int = 1
    mem_mb_per_task: int | None = None  # host memory (the inventory's nodes' memory_gb for its GPU slots)


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
    kind: str

    @abstractmethod
    def start(self, spec: AgentSpec) -> AgentHandle:
        """Start the agent; LaunchError if it could not be started."""

    @abstractmethod
    def poll(self, handle: AgentHandle) -> int | None:
        """None while the agent runs, else its exit code (negative: killed by that signal)."""

    @abstractmethod
    def stop(self, handles: list[AgentHandle], *, grace_s: float = 10.0) -> None:
        """Stop every agent and everything it started; LaunchError if anything is left running."""


def site_setup(lines: list[str]) -> list[str]:
    """A site's `setup` lines for a bash script run with `set -u` (activation scripts read unset variables)."""
    return ["set +u", *lines, "set -u"] if lines else []
