"""GPU slices on `local` and `ssh` sites: which host and which GPU ids each agent of a job owns.

    GpuPool(site, shares_trainer=…, trainer_tp=…)  every host of the inventory with ids 0 … gpus-1, all free
      .claim(slice)            ids already taken (agents recorded in agents.jsonl, planned ones)
      .take_ranks(n, who, tp)  n one-GPU slices (the trainer), host by host in inventory order, whole tp groups
                               per host (a group's ranks share its NVLink), each group's ids contiguous if it can
      .take(n, who)            n GPUs on ONE host (a rollout unit: tensor parallel stays inside a node): the first
                               host with n free in the rollout's fill order (from the last host where the trainer
                               shares the site), a contiguous aligned run of ids if there is one, else the lowest

Both orders are `rlctl.config.hostfill`'s, the ones the planner prices (a unit on the host it assumed, one
weight-sync hop per host the units span). `scale` takes its units from the same pool, so a unit added later
goes where the planner's `room_for_unit` found room. Deterministic: the same inventory, plan and claims give the same
slices, so `launch --dry-run` shows what a launch does. SLURM sites get no slices: SLURM binds the GPUs it
allocates. A `gpu: CPU` site is sliced the same way; the ids are only labels there (no CUDA device is used).
"""

from __future__ import annotations

from rlctl.config.hostfill import PLACEMENT_HINT, placement_error, ranks_per_host, rollout_host_order
from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import kind_of
from rlctl.launch.base import GpuSlice


def uses_slices(site: Site) -> bool:
    """Agents of this site get CUDA_VISIBLE_DEVICES slices from us (SLURM binds its own)."""
    return kind_of(site).slices_gpus


class GpuPool:
    """Free GPU ids per host of one site."""

    def __init__(self, site_name: str, site: Site, *, shares_trainer: bool = False, trainer_tp: int = 1) -> None:
        """`trainer_tp`: the plan's trainer tp where the trainer shares the site (hosts too small for
        one of its groups are the rollout's first, `hostfill.rollout_host_order`, as the planner prices them)."""
        self.site_name = site_name
        self.hosts = [h for h, _ in site.hosts]
        self.rollout_order = rollout_host_order(
            self.hosts, shares_trainer=shares_trainer, gpus=[g for _, g in site.hosts], trainer_tp=trainer_tp
        )
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
        """`n` GPUs on one host for `who`, the first in the rollout's fill order with `n` free; LaunchError naming
        the site and what is free if none has them."""
        assert n >= 1
        host = next((h for h in self.rollout_order if len(self.free[h]) >= n), None)
        if host is None:
            raise LaunchError(
                f"site {self.site_name}: no host has {n} free GPU(s) for {who} (free per host: {self.free_per_host()})",
                hint="give the site more GPUs in the inventory, or ask for fewer units / a smaller tensor_parallel",
            )
        gpus = _contiguous(sorted(self.free[host]), n) or sorted(self.free[host])[:n]
        self.free[host] -= set(gpus)
        return GpuSlice(host, tuple(gpus))

    def take_ranks(self, n: int, *, who: str, tp: int = 1) -> list[GpuSlice]:
        """`n` one-GPU slices in rank order, filling each host with whole groups of `tp` consecutive ranks before
        the next (a tensor-parallel group's all-reduces stay on one node); LaunchError naming the site, the
        hosts' free GPUs and tp when the groups do not fit."""
        if n > self.total_free:
            raise LaunchError(
                f"site {self.site_name}: {who} needs {n} GPU(s), {self.total_free} free "
                f"(free per host: {self.free_per_host()})",
                hint="give the site more GPUs in the inventory, or ask for fewer trainer GPUs",
            )
        per_host = ranks_per_host([len(self.free[h]) for h in self.hosts], n, tp=tp)
        if per_host is None:
            why = placement_error(self.site_name, [len(self.free[h]) for h in self.hosts], n, tp=tp)
            raise LaunchError(
                str(why),
                hint=PLACEMENT_HINT,
            )
        out: list[GpuSlice] = []
        for host, k in zip(self.hosts, per_host, strict=True):
            while k:
                size = min(tp, k)
                free = sorted(self.free[host])
                gpus = _contiguous(free, size) or free[:size]
                self.free[host] -= set(gpus)
                out += [GpuSlice(host, (g,)) for g in gpus]
                k -= size
        return out


def _contiguous(ids: list[int], n: int) -> list[int] | None:
    """The first run of `n` consecutive ids in sorted `ids`, preferring one that starts at a multiple of n."""
    runs = [ids[i : i + n] for i in range(len(ids) - n + 1) if ids[i + n - 1] - ids[i] == n - 1]
    aligned = [r for r in runs if r[0] % n == 0]
    best = aligned or runs
    return best[0] if best else None
