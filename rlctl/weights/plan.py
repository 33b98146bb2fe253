"""Broadcast planning: who receives a weight version from whom (pure, no I/O).

    DC-A (trainer)                          DC-B (rollout), dc_chains 2
    root0 ──▶ a1 ──▶ a3                      b1 (designated) ──▶ b2 ──▶ b4
    root1 ──▶ a2                   ▲              └──────────▶ b3 ──▶ b5
      └───────── one copy per inter-DC link ┘

Rules (StreamRL §6 "Weights transmission"):
- datacenters form a tree rooted at the trainer's datacenter(s) over the declared inter-DC
  links (breadth-first, so the fewest links are crossed; neighbours in name order), through datacenters
  that hold units only (no agent runs in any other to relay); exactly one copy crosses each link used,
  to a designated receiver, which re-broadcasts inside its datacenter over `dc_chains` chains (a slow
  unit holds back only its own chain);
- one copy goes into each host (the host its endpoints' addresses name): its first unit relays it to the
  next host and down the host's other units (`_attach`); inside the trainer's datacenter the hosts are dealt
  onto the trainer hosts' chains (`fanout=1`) or trees, and units beside a trainer rank onto that host's ranks;
  a datacenter's inbound copy is sent by the least-loaded holder of the parent datacenter;
- every receiver gets an ordered list of fallback holders to re-attach to when its parent dies:
  its same-DC ancestors (nearest first), then other same-DC nodes that come earlier in the plan
  (never a descendant, so re-attaching cannot form a cycle), then holders in the parent datacenter.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rlctl.config.inventory import Inventory
from rlctl.errors import PlanError


@dataclass(frozen=True)
class Endpoint:
    name: str
    datacenter: str
    address: str = ""


@dataclass
class BroadcastPlan:
    roots: list[Endpoint]
    receivers: list[Endpoint]
    parent: dict[str, str]  # receiver name -> sender name
    fallbacks: dict[str, list[str]]  # receiver name -> holders to re-attach to, best first
    order: list[str] = field(default_factory=list)  # every node, each after its parent

    def children(self, name: str) -> list[str]:
        return [c for c in self.order if self.parent.get(c) == name]

    def endpoint(self, name: str) -> Endpoint:
        for e in (*self.roots, *self.receivers):
            if e.name == name:
                return e
        raise KeyError(name)

    def inter_dc_edges(self) -> list[tuple[str, str]]:
        dc = {e.name: e.datacenter for e in (*self.roots, *self.receivers)}
        return [(p, c) for c, p in self.parent.items() if dc[p] != dc[c]]

    def depth(self, name: str) -> int:
        d = 0
        while name in self.parent:
            name, d = self.parent[name], d + 1
        return d


def dc_parents(source_dcs: list[str], dcs: list[str], links: set[frozenset[str]] | None) -> dict[str, str]:
    """Parent datacenter of each datacenter of `dcs` the sources reach, in BFS order over `links` (None = every pair
    linked), only through datacenters of `dcs`: a datacenter the job has no unit in holds no one to relay a copy on,
    so a path of links through it is not one the weights take. Neighbours are taken in name order, so the tree is
    the same whatever order the units joined in, versus one of two equally short routes chosen by which units
    came first. `planner.weightsync.weight_route` prices the path this gives (it calls it)."""
    parent: dict[str, str] = {}
    seen, todo = set(source_dcs), deque(source_dcs)
    while todo:
        here = todo.popleft()
        for other in sorted(dcs):
            if other not in seen and (links is None or frozenset((here, other)) in links):
                seen.add(other)
                parent[other] = here
                todo.append(other)
    return parent


def _dc_tree(source_dcs: list[str], dcs: list[str], links: set[frozenset[str]] | None) -> dict[str, str]:
    """`dc_parents`; PlanError where a datacenter of `dcs` is not reached."""
    parent = dc_parents(source_dcs, dcs, links)
    missing = [d for d in dcs if d not in parent and d not in source_dcs]
    if missing:
        raise PlanError(f"no inter-DC link path from the trainer datacenter(s) to {', '.join(missing)}")
    return parent


def _host(e: Endpoint) -> str:
    """The host an endpoint's address names (`tcp://10.0.0.5:7300` → 10.0.0.5); one of its own where the
    address names none (an in-process or empty one): its links are then taken for separate ones."""
    host = urlsplit(e.address).hostname if "://" in e.address else None
    return host or f"?{e.name}"


def _attach(senders: list[str], members: list[str], fanout: int, parent: dict[str, str], host: dict[str, str]) -> None:
    """Hang `members` below `senders` (chain heads; a name repeated heads several chains), host by host, so that
    one copy reaches each host (its host link carries it once) and spreads there:

    - members on a sender's host are dealt round-robin onto that host's senders (loopback: as many chains as
      there are senders there, so a slow unit holds back only its own);
    - the members of every other host stay together: the first is that host's relay, the others hang below it,
      and each host's relay goes whole onto one of the chains of the first sender named on a sender host (the
      least loaded in members, ties in order), below that chain's last relay. Several trainer ranks on one host
      then send one copy out of it, not one each; a datacenter's relay repeated `dc_chains` times heads that
      many chains of hosts.

    Each chain (or, fanout > 1, heap-ordered tree) is pipelined. Where every member has a host of its own (or
    no address) this is a round-robin of the members onto the senders, each its own chain."""
    by_host: dict[str, list[str]] = {}
    for m in members:
        by_host.setdefault(host[m], []).append(m)
    senders_on: dict[str, list[int]] = {}  # host → the slots (indices into senders) of the senders there
    for i, s in enumerate(senders):
        senders_on.setdefault(host[s], []).append(i)
    load = [0] * len(senders)
    for h, group in by_host.items():  # a sender's own host: round-robin, as chains on the loopback
        slots = senders_on.get(h)
        if slots is None:
            continue
        for k, i in enumerate(slots):
            share = group[k :: len(slots)]
            _hang(senders[i], share, fanout, parent)
            load[i] += len(share)
    # the chains that carry other hosts' copies: those of the first sender named on each sender host
    carriers = [i for slots in senders_on.values() for i in slots if senders[i] == senders[slots[0]]]
    relays: dict[int, list[str]] = {i: [] for i in carriers}
    for h, group in by_host.items():
        if h in senders_on:
            continue
        i = min(carriers, key=lambda j: (load[j], j))
        relays[i].append(group[0])
        load[i] += len(group)
        _hang(group[0], group[1:], fanout, parent)
    for i, rs in relays.items():
        _hang(senders[i], rs, fanout, parent)


def _hang(sender: str, share: list[str], fanout: int, parent: dict[str, str]) -> None:
    """`share` below `sender`: a pipelined chain (fanout 1) or a fanout-ary heap-ordered tree."""
    nodes = [sender, *share]
    for n in range(1, len(nodes)):
        parent[nodes[n]] = nodes[(n - 1) // fanout]


def plan_broadcast(
    roots: list[Endpoint],
    receivers: list[Endpoint],
    *,
    dc_links: set[frozenset[str]] | None = None,
    fanout: int = 1,
    dc_chains: int = 1,
) -> BroadcastPlan:
    """Plan one broadcast from `roots` (trainer DP ranks holding the version) to `receivers`.

    `dc_chains`: in a datacenter the copy enters through its relay, which feeds up to this many chains (or
    trees) of the other receivers there, dealt round-robin: a slow unit throttles only the units below it in
    its own chain, and the relay's uplink carries `dc_chains` copies (it has the host link's rate, the copy
    arrives at the slower inter-DC rate).

    Receivers are planned in the order given: the first of each datacenter is its designated receiver
    (relay) and chains follow that order, so a caller that keeps the order across versions keeps its
    relays (rlctl.agents.weights.receiver_order)."""
    if not roots:
        raise PlanError("a broadcast needs at least one root (a trainer rank holding the weights)")
    if fanout < 1 or dc_chains < 1:
        raise ValueError(f"fanout and dc_chains must be ≥ 1, got {fanout} and {dc_chains}")
    names = [e.name for e in (*roots, *receivers)]
    if len(set(names)) != len(names):
        raise PlanError(f"endpoint names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
    by_dc: dict[str, list[str]] = {}
    for e in receivers:
        by_dc.setdefault(e.datacenter, []).append(e.name)
    roots_by_dc: dict[str, list[str]] = {}
    for e in roots:
        roots_by_dc.setdefault(e.datacenter, []).append(e.name)
    all_dcs = list(dict.fromkeys([*roots_by_dc, *by_dc]))
    dc_parent = _dc_tree(list(roots_by_dc), all_dcs, dc_links)

    host = {e.name: _host(e) for e in (*roots, *receivers)}
    parent: dict[str, str] = {}
    for dc in roots_by_dc:  # trainer datacenters: chains (or trees) from the roots, host by host
        _attach(roots_by_dc[dc], by_dc.get(dc, []), fanout, parent, host)
    for dc in dc_parent:  # BFS order (as `_dc_tree` found them): a DC's sender is chosen after its parent's chains
        members = by_dc.get(dc, [])
        if not members:
            continue
        load = Counter(parent.values())
        up = dc_parent[dc]
        # the inbound copy comes from a root of the parent DC if it has any (least loaded first)
        holders = roots_by_dc.get(up) or by_dc[up]
        parent[members[0]] = min(holders, key=lambda n: (load[n], holders.index(n)))
        _attach([members[0]] * min(dc_chains, max(1, len(members) - 1)), members[1:], fanout, parent, host)

    order: list[str] = [e.name for e in roots]
    kids: dict[str, list[str]] = {}
    for e in receivers:
        kids.setdefault(parent[e.name], []).append(e.name)
    todo = deque(order)
    while todo:
        for c in kids.get(todo.popleft(), []):
            order.append(c)
            todo.append(c)

    dc_of = {e.name: e.datacenter for e in (*roots, *receivers)}
    fallbacks: dict[str, list[str]] = {}
    for e in receivers:
        pos = order.index(e.name)
        ancestors, a = [], parent[e.name]
        while a in parent:
            a = parent[a]
            if dc_of[a] == e.datacenter or a in roots_by_dc.get(e.datacenter, []):
                ancestors.append(a)
        same_dc = [n for n in reversed(order[:pos]) if dc_of[n] == e.datacenter and n not in ancestors]
        up_dc = dc_parent.get(e.datacenter)
        upstream = [n for n in order[:pos] if up_dc is not None and dc_of[n] == up_dc]
        cands = [*ancestors, *same_dc, *upstream]
        fallbacks[e.name] = [n for n in dict.fromkeys(cands) if n != parent[e.name]]
    return BroadcastPlan(list(roots), list(receivers), parent, fallbacks, order)


def plan_from_inventory(
    inventory: Inventory,
    roots: list[tuple[str, str, str]],
    receivers: list[tuple[str, str, str]],
    *,
    fanout: int = 1,
    dc_chains: int = 1,
) -> BroadcastPlan:
    """Plan from (name, site, address) triples; datacenters and inter-DC links come from the inventory."""

    def endpoints(rows: list[tuple[str, str, str]]) -> list[Endpoint]:
        out = []
        for name, site, address in rows:
            if site not in inventory.sites:
                raise PlanError(f"{name}: unknown site {site!r}; known: {', '.join(inventory.sites)}")
            out.append(Endpoint(name, inventory.site(site).datacenter, address))
        return out

    links: set[frozenset[str]] = set()
    for link in inventory.links:
        a, b = (inventory.site(s).datacenter for s in link.between)
        if a != b:
            links.add(frozenset((a, b)))
    return plan_broadcast(endpoints(roots), endpoints(receivers), dc_links=links, fanout=fanout, dc_chains=dc_chains)
