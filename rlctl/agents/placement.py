"""Where the job's agents run: the launch plan, the sites' specs, agent name → site, and the rollout slots each
rollout site has left (what the Scaler starts units by)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlctl.agents import migration
from rlctl.config.inventory import Site
from rlctl.launch.backends import read_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import rollout_tp


@dataclass
class Placement:
    """Where the job's agents run: the launch plan, the sites' specs and agent name → site (the plan's, and the units
    the Scaler starts: those gone for good leave it, beyond the latest GONE_SITES_KEPT: `Scaler._forget_sites`)."""

    plan: dict[str, Any]
    site_specs: dict[str, Site]
    sites: dict[str, str]

    @classmethod
    def read(cls, jobdir: JobDir) -> Placement:
        plan = jobdir.read_plan(as_placed=True)  # its site's copy: a damaged one said in a line, naming the field
        return cls(plan, read_sites(jobdir.path), sites_by_agent(plan))

    @property
    def planned_units(self) -> int:
        return sum(int(g["units"]) for g in self.plan.get("rollout", [])) or 1

    @property
    def rollout_sites(self) -> list[str]:
        return [g["site"] for g in self.plan.get("rollout", [])]

    @property
    def dc_links(self) -> list[list[str]] | None:
        """The inter-datacenter links of the job's sites (pairs of datacenters), None when the plan names no
        links (a job written before links were recorded, or one datacenter): every pair counts as linked."""
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

    def free_slots(self, units: list[str]) -> dict[str, int]:
        """Rollout units each rollout site can still start next to `units` (live or pending) and the
        trainer: GPUs left / the site's tp per unit."""
        used = dict.fromkeys(self.site_specs, 0)
        trainer = self.plan.get("trainer", {})
        if trainer.get("site") in used:
            used[trainer["site"]] += int(trainer.get("ranks", 1))
        for site in (self.sites.get(n, "") for n in units):
            if site in used:
                used[site] += rollout_tp(self.plan, site)
        return {
            s: (self.site_specs[s].total_gpus - used[s]) // rollout_tp(self.plan, s)
            for s in self.rollout_sites
            if s in self.site_specs
        }


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
