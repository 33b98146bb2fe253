"""The weight sync a plan predicts: full or delta bytes per update, sent over the way the broadcast routes them
(a declared link, a datacenter's own network, or the broadcast tree's path of links: `weights.plan.dc_parents` over
the links between the job's sites, through datacenters it has rollout in), relayed host by host; the slowest rollout
site's time."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from rlctl.config.inventory import Inventory
from rlctl.config.job import Job
from rlctl.errors import ConfigError
from rlctl.planner.placement import hosts_spanned, rollout_hosts, site_node_bytes_per_s
from rlctl.planner.simjob import weight_transfer_s
from rlctl.weights.plan import dc_parents

DELTA_FRACTION = 0.1  # bytes of a lossless delta relative to full weights (DESIGN §7), between anchors


def slowest_weight_sync_s(job: Job, per_site: dict[str, int], *, order_tp: int = 1) -> float:
    """The slowest rollout site's weight sync (s) of `per_site` rollout GPUs; `order_tp`: the trainer tp the
    shared site's rollout host order follows (`host_order_tp`)."""
    spec = job.spec
    inv = job.inventory
    t_site = spec.placement.trainer.site
    full = job.spec.model.arch.weight_bytes
    every = spec.weight_sync.anchor_every
    if spec.weight_sync.mode == "full":
        size = full
    elif every is None:  # full copies only on demand (joins, resumes): every update is a delta
        size = full * DELTA_FRACTION
    else:
        size = full * (1 / every + (1 - 1 / every) * DELTA_FRACTION)
    worst = 0.0
    job_sites, unit_sites = weight_sites(job, [s for s, x in per_site.items() if x > 0])
    for s, x in per_site.items():
        if x == 0:
            continue
        local = site_node_bytes_per_s(inv.sites[s])
        try:
            route = (
                (local, 0.0)
                if s == t_site
                else weight_route(inv, t_site, s, job_sites=job_sites, unit_sites=unit_sites)
            )
        except ConfigError:
            if set(unit_sites) >= {r.site for r in spec.placement.rollout}:
                raise  # every rollout site has units and no path joins this one: the job's omission
            # this allocation leaves empty a datacenter the copy is relayed through: the weight plane cannot route
            # it as priced (it would route as if every pair of datacenters were linked); the search passes it over
            return math.inf
        link_bps, lat = route
        # one relay per host after the first: 12 GPUs of 8-GPU hosts are 2 hosts, one hop
        hosts = rollout_hosts(inv.sites[s], shared=s == t_site, trainer_tp=order_tp)
        hops = hosts_spanned(hosts, x) - 1
        # another datacenter's relay heads chains_per_datacenter chains of the other hosts (`weights/plan.py`), which
        # share its host's link; in the trainer's datacenter (its site or another there) the trainer's ranks head the
        # chains, one of hosts per trainer host
        chains = (
            1 if inv.sites[s].datacenter == inv.sites[t_site].datacenter else spec.weight_sync.chains_per_datacenter
        )
        worst = max(
            worst,
            weight_transfer_s(
                size,
                link_bytes_per_s=link_bps,
                latency_s=lat,
                local_bytes_per_s=local,
                num_local_hops=hops,
                chunk_bytes=spec.weight_sync.chunk_bytes,
                relay_chains=chains,
            ),
        )
    return worst


def weight_sites(job: Job, rollout_sites: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the job's sites: the controller's, the trainer's and `rollout_sites`, whose links the job dir records and
    the weights cross, `Inventory.links_among`; the sites that hold the weight plane's units: the trainer's and
    `rollout_sites`, the only datacenters a copy is relayed through, `weights.plan.dc_parents`)."""
    p = job.spec.placement
    units = list(dict.fromkeys([p.trainer.site, *rollout_sites]))
    return list(dict.fromkeys([p.controller_site or p.trainer.site, *units])), units


def weight_route(
    inv: Inventory, a: str, b: str, *, job_sites: Collection[str], unit_sites: Collection[str]
) -> tuple[float, float]:
    """Bytes per second and latency (s) of the weights' way from site `a` to site `b` as the broadcast routes them
    (`rlctl.weights.plan`: datacenters joined by the links that count for a job on `job_sites`, those between two
    of its datacenters from whichever of their sites, `Inventory.dc_links_among`, the pairs the job dir records; a
    tree through the datacenters of `unit_sites` alone, `dc_parents`; one copy into each): a link declared between
    the two sites; else, in one datacenter, the slower of the two sites' networks (no inter-DC link crossed); else
    the tree's path of datacenters, at its slowest hop's rate (each hop the fastest of the job's links between its
    two datacenters) and the sum of its hops' latencies. ConfigError when no such path joins them
    (the inventory's `links`: `rlctl check` refuses such a job in the same line, `preflight.sites.link_problems`),
    versus a path through any datacenter over any declared link, which the weight plane does not take (it routed as
    if every pair of datacenters were linked)."""
    links = inv.links_among(job_sites)
    link = next((ln for ln in links if set(ln.between) == {a, b}), None)
    if link is not None:
        return link.bandwidth_gbps * 1e9 / 8, link.latency_ms / 1e3
    dc_a, dc_b = inv.sites[a].datacenter, inv.sites[b].datacenter
    if dc_a == dc_b:
        return min(site_node_bytes_per_s(inv.sites[a]), site_node_bytes_per_s(inv.sites[b])), 0.0
    fastest = inv.dc_links_among(job_sites)  # between each pair of datacenters: the pairs the job dir records
    dcs = list(dict.fromkeys(inv.sites[s].datacenter for s in [a, b, *unit_sites]))
    came = dc_parents([dc_a], dcs, set(fastest))
    if dc_b not in came:  # the inventory's omission: named in its files, exit 2
        relays = set(dcs)
        every = {frozenset(inv.sites[s].datacenter for s in ln.between) for ln in inv.links}
        other = dc_parents([dc_a], sorted({inv.sites[s].datacenter for s in inv.sites}), every)
        through = []  # the datacenters a path over every declared link crosses that the job holds no unit in
        dc = dc_b
        while dc in other and (dc := other[dc]) != dc_a:
            through.append(dc)
        why = ""
        if set(through) - relays:
            empty = ", ".join(repr(d) for d in reversed(through) if d not in relays)
            why = f" (the path through datacenter {empty} is not one: the job has no rollout there to relay the copy)"
        raise ConfigError(
            ", ".join(dict.fromkeys((inv.origin[a], inv.origin[b]))),
            "links",
            f"no link declared between sites {a!r} and {b!r}, nor a path of links from datacenter {dc_a!r} to "
            f"{dc_b!r}{why}: the trainer's weights reach the rollout over them",
            hint=f"add {{between: [{a}, {b}], bandwidth_gbps: N, latency_ms: N}} under 'links:'",
        )
    hops, dc = [], dc_b
    while dc != dc_a:
        up = came[dc]
        hops.append(fastest[frozenset((up, dc))])
        dc = up
    return min(h.bandwidth_gbps for h in hops) * 1e9 / 8, sum(h.latency_ms for h in hops) / 1e3
