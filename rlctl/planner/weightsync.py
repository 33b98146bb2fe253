"""The weight sync a plan predicts: full or delta bytes per update, sent over the way the broadcast routes them
(a declared link, a datacenter's own network, or the fewest-hop path of links), relayed host by host; the slowest
rollout site's time."""

from __future__ import annotations

from rlctl.config.inventory import Inventory, Link
from rlctl.config.job import Job
from rlctl.errors import ConfigError
from rlctl.planner.placement import hosts_spanned, rollout_hosts, site_node_bytes_per_s
from rlctl.planner.simjob import weight_transfer_s

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
    for s, x in per_site.items():
        if x == 0:
            continue
        local = site_node_bytes_per_s(inv.sites[s])
        link_bps, lat = (local, 0.0) if s == t_site else weight_route(inv, t_site, s)
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


def weight_route(inv: Inventory, a: str, b: str) -> tuple[float, float]:
    """Bytes per second and latency (s) of the weights' way from site `a` to site `b` as the broadcast routes them
    (`rlctl.weights.plan`: datacenters joined by the declared links, one copy into each): a link declared between
    the two sites; else, in one datacenter, the slower of the two sites' networks (no inter-DC link crossed); else
    the fewest-hop path of datacenters over the declared links, at its slowest hop's rate (each hop the fastest link
    between its two datacenters) and the sum of its hops' latencies. ConfigError when no path joins them (the
    inventory's `links`: `rlctl check` refuses such a job in the same line, `preflight.sites.link_problems`)."""
    link = inv.link(a, b)
    if link is not None:
        return link.bandwidth_gbps * 1e9 / 8, link.latency_ms / 1e3
    dc_a, dc_b = inv.sites[a].datacenter, inv.sites[b].datacenter
    if dc_a == dc_b:
        return min(site_node_bytes_per_s(inv.sites[a]), site_node_bytes_per_s(inv.sites[b])), 0.0
    fastest: dict[frozenset[str], Link] = {}  # between each pair of datacenters
    for ln in inv.links:
        key = frozenset(inv.sites[s].datacenter for s in ln.between)
        if len(key) == 2 and (key not in fastest or ln.bandwidth_gbps > fastest[key].bandwidth_gbps):
            fastest[key] = ln
    came: dict[str, str | None] = {dc_a: None}  # breadth first from a's datacenter: the path of fewest hops
    todo = [dc_a]
    while todo and dc_b not in came:
        here = todo.pop(0)
        for key in fastest:
            if here in key and (there := next(iter(key - {here}))) not in came:
                came[there] = here
                todo.append(there)
    if dc_b not in came:  # the inventory's omission: named in its files, exit 2
        raise ConfigError(
            ", ".join(dict.fromkeys((inv.origin[a], inv.origin[b]))),
            "links",
            f"no link declared between sites {a!r} and {b!r}, nor a path of links from datacenter {dc_a!r} to "
            f"{dc_b!r}: the trainer's weights reach the rollout over them",
            hint=f"add {{between: [{a}, {b}], bandwidth_gbps: N, latency_ms: N}} under 'links:'",
        )
    hops, dc = [], dc_b
    while (up := came[dc]) is not None:
        hops.append(fastest[frozenset((up, dc))])
        dc = up
    return min(h.bandwidth_gbps for h in hops) * 1e9 / 8, sum(h.latency_ms for h in hops) / 1e3
