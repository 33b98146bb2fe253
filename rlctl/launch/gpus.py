"""GPU slices on `local` and `ssh` sites: which host and which GPU ids each agent of a job owns.

    GpuPool(site)             every host of the inventory with ids 0 … gpus-1, all free
      .claim(slice)           ids already taken (agents recorded in agents.jsonl, planned ones)
      .take_ranks(n, who)     n one-GPU slices, packed host by host in inventory order (the trainer)
      .take(n, who)           n GPUs on ONE host (a rollout unit: tensor parallel stays inside a node):
                              the host with the most free GPUs (ties: inventory order), a contiguous
                              run of ids if there is one, else the lowest free ids

Deterministic: the same inventory, plan and claims give the same slices, so `launch --dry-run`
shows what a launch does. SLURM sites get no slices: SLURM binds the GPUs it allocates.
A `gpu: CPU` site is sliced the same way; the ids are only labels there (no CUDA device is used).
"""

from __future__ import annotations

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import kind_of
from rlctl.launch.base import GpuSlice


def uses_slices(site: Site) -> bool:
    """Agents of this site get CUDA_VISIBLE_DEVICES slices from us (SLURM binds its own)."""
    return kind_of(site).slices_gpus


class GpuPool:
    """Free GPU ids per host of one site."""

    def __init__(self, site_name: str, site: Site) -> None:
        self.site_name = site_name
        self.hosts = [h for h, _ in site.hosts]
        self.size = dict(site.hosts)
        self.free: dict[str, set[int]] = {h: set(range(n)) for h, n in site.hosts}

    @property
    def total_free(self) -> int:
        return sum(len(f) for f in self.free.values())

    def free_per_host(self) -> str:
        return ", ".join(f"{h}: {len(self.free[h])}/{self.size[h]}" for h in self.hosts)

    def claim(self, s: GpuSlice) -> None:
        """Mark a slice in use (one recorded before us); ids the inventory no longer has are ignored."""
        if s.host in self.free:
            self.free[s.host] -= set(s.gpus)

    def release(self, s: GpuSlice) -> None:
        if s.host in self.free:
            self.free[s.host] |= {g for g in s.gpus if g < self.size[s.host]}

    def take(self, n: int, *, who: str) -> GpuSlice:
        """`n` GPUs on one host for `who`; LaunchError naming the site and what is free if none has them."""
        assert n >= 1
        fits = [h for h in self.hosts if len(self.free[h]) >= n]
        if not fits:
            raise LaunchError(
                f"site {self.site_name}: no host has {n} free GPU(s) for {who} (free per host: {self.free_per_host()})",
                hint="give the site more GPUs in the inventory, or ask for fewer units / a smaller tensor_parallel",
            )
        host = max(fits, key=lambda h: (len(self.free[h]), -self.hosts.index(h)))
        gpus = _contiguous(sorted(self.free[host]), n) or sorted(self.free[host])[:n]
        self.free[host] -= set(gpus)
        return GpuSlice(host, tuple(gpus))

    def take_ranks(self, n: int, *, who: str) -> list[GpuSlice]:
        """`n` one-GPU slices, filling each host before the next (ranks of a node share its NVLink)."""
        if n > self.total_free:
            raise LaunchError(
                f"site {self.site_name}: {who} needs {n} GPU(s), {self.total_free} free "
                f"(free per host: {self.free_per_host()})",
                hint="give the site more GPUs in the inventory, or ask for fewer trainer GPUs",
            )
        out: list[GpuSlice] = []
        for host in self.hosts:
            for g in sorted(self.free[host]):
                if len(out) == n:
                    break
                out.append(GpuSlice(host, (g,)))
        for s in out:
            self.free[s.host].discard(s.gpus[0])
        return out


def _contiguous(ids: list[int], n: int) -> list[int] | None:
    """The first run of `n` consecutive ids in sorted `ids`, preferring one that starts at a multiple of n."""
    runs = [ids[i : i + n] for i in range(len(ids) - n + 1) if ids[i + n - 1] - ids[i] == n - 1]
    aligned = [r for r in runs if r[0] % n == 0]
    best = aligned or runs
    return best[0] if best else None
