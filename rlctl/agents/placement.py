"""Where the job's agents run: the launch plan, the sites' specs, agent name → site, and the rollout slots each
rollout site has left (what the Scaler starts units by)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlctl.agents import migration
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import controller_resources, resources_for, rollout_tp, trainer_job_resources, trainer_parallel
from rlctl.launch.slurm import SlurmResources, gpu_request_for
from rlctl.launch.wholenodes import FIGURES, figure_said, figures_short, node_room, node_shares, whole_nodes_hold


@dataclass
class Placement:
    """Where the job's agents run: the launch plan, the sites' specs and agent name → site (the plan's, and the units
    the Scaler starts: those gone for good leave it, beyond the latest GONE_SITES_KEPT: `Scaler._forget_sites`), and
    the job (its agents' threads and reward workers: the cores and memory their SLURM jobs ask, `layout`'s)."""

    plan: dict[str, Any]
    site_specs: dict[str, Site]
    sites: dict[str, str]
    job: JobFile

    @classmethod
    def read(cls, jobdir: JobDir, job: JobFile) -> Placement:
        plan = jobdir.read_plan(as_placed=True)  # its site's copy: a damaged one said in a line, naming the field
        return cls(plan, read_sites(jobdir.path), sites_by_agent(plan), job)

    @property
    def planned_units(self) -> int:
        return sum(int(g["units"]) for g in self.plan.get("rollout", [])) or 1

    @property
    def rollout_sites(self) -> list[str]:
        return [g["site"] for g in self.plan.get("rollout", [])]

    @property
    def dc_links(self) -> list[list[str]] | None:
        """The inter-datacenter links of the job (pairs of datacenters: plan.json's `dc_links`, `ops.jobprep`), None
        when the plan names none (a job written before links were recorded, or one datacenter): every pair counts
        as linked. A job dir written before `dc_links` (2026-12-06) has its links' site pairs alone (`links`), each
        between two of its sites: their datacenters (sites.json's)."""
        if "dc_links" in self.plan:
            return sorted(sorted(p) for p in {frozenset(p) for p in self.plan["dc_links"]} if len(p) == 2) or None
        dcs = {n: s.datacenter for n, s in self.site_specs.items()}
        pairs = {
            frozenset((dcs[a], dcs[b]))
            for a, b in self.plan.get("links", [])
            if a in dcs and b in dcs and dcs[a] != dcs[b]
        }
        return sorted(sorted(p) for p in pairs) or None

    def decode_cost(self, agent: str) -> migration.Cost | None:
        """The planner's decode cost of the agent's site (plan.json's `planner.allocation`), None when the plan
        does not price it (a site the planner gave no rollout, a plan without a planner)."""
        site = self.sites.get(agent, "")
        rows = self.plan.get("planner", {}).get("allocation", [])
        row = next((a for a in rows if a.get("role") == "rollout" and a.get("site") == site), None)
        return migration.Cost.from_plan(row.get("decode")) if row is not None else None

    def datacenter(self, agent: str) -> str:
        site = self.site_specs.get(self.sites.get(agent, ""))
        return site.datacenter if site is not None else ""

    def free_slots(self, units: list[str], *, whole: bool = True) -> dict[str, int]:
        """Rollout units each rollout site can still start next to `units` (live or pending) and the
        trainer: GPUs left / the site's tp per unit; on an exclusive SLURM site, no more than its nodes hold whole
        (`whole_node_slots`; `whole=False`: its GPUs alone)."""
        used = dict.fromkeys(self.site_specs, 0)
        trainer = self.plan.get("trainer", {})
        if trainer.get("site") in used:
            used[trainer["site"]] += int(trainer.get("ranks", 1))
        for site in (self.sites.get(n, "") for n in units):
            if site in used:
                used[site] += rollout_tp(self.plan, site)
        free = {
            s: (self.site_specs[s].total_gpus - used[s]) // rollout_tp(self.plan, s)
            for s in self.rollout_sites
            if s in self.site_specs
        }
        for s, n in free.items():
            there = sum(self.sites.get(u) == s for u in units)
            if whole and n > 0 and (room := self.whole_node_slots(s, there, most=n)) is not None:
                free[s] = room
        return free

    def whole_node_slots(self, site: str, units: int, *, most: int) -> int | None:
        """Of a SLURM site whose `scheduler.exclusive` gives each of the job's SLURM jobs there its nodes whole (the
        controller's, the trainer's, each rollout unit's), the units that fit its nodes beside the job's (its
        controller and trainer there, `units` rollout units), at most `most`; a unit past them waits for ever for a
        node the job's own jobs hold until it ends. None on other sites, and where it cannot be told (a layout the
        site has none for). Other users' jobs are not known here: a unit that fits may wait for nodes they hold,
        until they end. (`launch.wholenodes`, the rule `check` asks too: each job's GPUs, cores and memory on a node,
        as `layout` asks them, against each node's in the inventory.)"""
        held = self._whole_jobs(site, units, more=most)
        if held is None:
            return None
        rooms, asked = held
        fixed = len(asked) - most
        low, high = 0, most  # the units more that fit: a count fits where any more does (bisected)
        while low < high:
            k = (low + high + 1) // 2
            shares = [s for r in asked[: fixed + k] for s in node_shares(r)]
            low, high = (k, high) if whole_nodes_hold(rooms, shares) else (low, k - 1)
        return low

    def _whole_jobs(
        self, site: str, units: int, *, more: int
    ) -> tuple[list[tuple[int, int, int]], list[SlurmResources]] | None:
        """Of an exclusive SLURM site (`whole_node_slots`): its nodes' room (`node_room`) and the SLURM resources of
        the job's jobs there (its controller, its trainer, `units` rollout units) and of `more` units more, last;
        None on other sites and where a layout cannot be told."""
        spec = self.site_specs[site]
        if not getattr(spec.scheduler, "exclusive", False):  # (a SLURM site's key)
            return None
        tp = rollout_tp(self.plan, site)
        trainer = self.plan.get("trainer", {})
        jobs = [controller_resources(self.job, spec)] if self.plan.get("controller_site") == site else []
        if trainer.get("site") == site:
            ranks, group = int(trainer.get("ranks", 1)), trainer_parallel(self.plan).tp
            jobs.append(trainer_job_resources(self.job, spec, ranks=ranks, tp=group))
        jobs += [resources_for(self.job, "rollout", spec, tasks=1, gpus=tp)] * (units + more)
        hosts = [g for _, g in spec.hosts]
        try:
            asked = [
                SlurmResources.for_spec(
                    r, slots_per_node=spec.gpus_per_node, gpu_request=gpu_request_for(spec), node_gpus=hosts, site=site
                )
                for r in jobs
            ]
        except LaunchError:
            return None
        return node_room(spec), asked

    def whole_nodes_said(self, site: str, units: list[str], *, room: int) -> str:
        """Why at most `room` units more fit an exclusive SLURM site beside `units` (live or pending:
        `whole_node_slots`): its nodes, what of the job's takes them whole, and what of theirs stops one more
        (`figures_short`: their GPUs, cores or memory, or their count)."""
        spec = self.site_specs[site]
        trainer = self.plan.get("trainer", {}).get("site") == site
        there = sum(self.sites.get(u) == site for u in units)
        held = ["the controller"] * (self.plan.get("controller_site") == site) + ["the trainer"] * trainer
        held.append(f"{there} rollout unit(s)")
        hosts = [h for h, _ in spec.hosts]
        nodes = ", ".join(hosts[:8]) + (", …" if len(hosts) > 8 else "")
        return (
            f"site {site}'s scheduler.exclusive gives each of the job's SLURM jobs there its nodes whole: its "
            f"{len(hosts)} node(s) ({nodes}) hold its {', '.join(held)} and {room} unit(s) more"
            f"{self._stops_another(site, there, room=room)}; a unit past them would wait for ever for a node the "
            "job's own jobs hold until it ends"
        )

    def _stops_another(self, site: str, units: int, *, room: int) -> str:
        """': their cores stop another (a unit asks 16 cores of a node; the nodes have 64 cores, 1 core)', or ': each
        holds one job, and none is left for another': what of the site's nodes keeps a unit past `room` (what
        `whole_node_slots` found) out."""
        held = self._whole_jobs(site, units, more=room + 1)
        assert held is not None, (site, "not an exclusive SLURM site whose jobs can be told")
        rooms, asked = held
        short = figures_short(rooms, [s for r in asked for s in node_shares(r)])
        if short is None:
            return ": each holds one job, and none is left for another"
        assert short, (site, room, "one unit more fits: not what whole_node_slots said")
        named = sorted({i for out in short for i in out})

        def said(figures: tuple[int, ...]) -> str:
            return " and ".join(figure_said(figures[i], i) for i in named)

        ask = said(node_shares(asked[-1])[0])
        have = ", ".join(said(r) for r in sorted({tuple(r) for r in rooms}, reverse=True))
        which = " or ".join(" and ".join(FIGURES[i] for i in out) for out in short)
        return f": their {which} stop another (a unit asks {ask} of a node; the nodes have {have})"


def sites_by_agent(plan: dict[str, Any]) -> dict[str, str]:
    """Agent name → site, in the order the launcher starts them (see rlctl.ops.runstart.RunStart.start)."""
    out: dict[str, str] = {}
    trainer = plan.get("trainer", {})
    for rank in range(int(trainer.get("ranks", 1))):
        out[f"trainer-{rank}"] = str(trainer.get("site", ""))
    n = 0
    for group in plan.get("rollout", []):
        for _ in range(int(group["units"])):
            out[f"rollout-{n}"] = str(group["site"])
            n += 1
    return out
