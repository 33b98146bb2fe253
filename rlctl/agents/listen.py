"""Which address an agent binds and advertises to its peers (controller, trainer, rollout units).

    $RLCTL_LISTEN_HOST (its site's network.listen_host, set by the launcher)  else  job transport.listen_host
    "auto" ─▶ the local address of the route toward the peer that must reach it:
              rollout/trainer: the controller's host; controller: another site (its listen_host, else first host;
              one that does not resolve on the controller's host is one line naming it, and `check --reach` says so)

On one machine every agent can use 127.0.0.1. Across sites each site names the interface its
peers reach (an IP, a hostname, or `auto` when a site's hosts differ and routing already knows).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import subprocess
from urllib.parse import urlsplit

from rlctl.config.hosts import expand_hostlist, loopback, same_host
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError
from rlctl.launch.agentenv import ENV_LISTEN_HOST, ENV_SITE

AUTO = "auto"
log = logging.getLogger(__name__)


def route_source(host: str) -> str:
    """This host's address on the route toward `host` (a UDP connect sends nothing: it only routes)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))
            return str(s.getsockname()[0])
    except OSError as e:
        raise LaunchError(f"listen_host auto: no route toward {host}: {e}") from e


def listen_host(job: JobFile, *, toward: str | None) -> str:
    """The address to bind and advertise; `toward` is the peer host `auto` routes to."""
    value = os.environ.get(ENV_LISTEN_HOST) or job.transport.listen_host
    if value != AUTO:
        return value
    if not toward:
        raise LaunchError("listen_host auto: no peer host to route toward (set an address for this site)")
    return route_source(toward)


def listen_field() -> str:
    """The setting `listen_host` takes the address from, named as an operator sets it: the site's
    `network.listen_host` where it sets one (the launcher exports it as $RLCTL_LISTEN_HOST, over the job's), else
    the job's `transport.listen_host`."""
    if os.environ.get(ENV_LISTEN_HOST):
        site = os.environ.get(ENV_SITE)
        return f"sites.{site}.network.listen_host" if site else "the site's network.listen_host"
    return "transport.listen_host"


def host_of(address: str) -> str:
    """'tcp://10.0.0.1:5000' → '10.0.0.1'."""
    return urlsplit(address).hostname or ""


def controller_peer(sites: dict[str, Site], own_site: str | None) -> tuple[str, str] | None:
    """For a controller with `auto`: where its peers live, (site, host) — another site of the job, by the address
    that site names for its peers (`network.listen_host`, an interface of that site) when it names one, else its
    first host (a scheduler's node name may resolve only through the scheduler, hence the order)."""
    for name, site in sites.items():
        if name != own_site:
            named = site.network.listen_host
            return name, named if named and named != AUTO else site.nodes[0].hosts[0]
    return None


def controller_listen_host(job: JobFile, sites: dict[str, Site], own_site: str | None) -> str:
    """The controller's address to bind and advertise: its site's listen_host, else the job's; `auto`: the route
    toward `controller_peer`, or one line naming the peer that does not route and what to set instead."""
    value = os.environ.get(ENV_LISTEN_HOST) or job.transport.listen_host
    if value != AUTO:
        return value
    peer = controller_peer(sites, own_site)
    if peer is None:
        raise LaunchError("listen_host auto: no peer host to route toward (set an address for this site)")
    return auto_route(own_site or "(local)", *peer)


def auto_route(own_site: str, peer_site: str, host: str) -> str:
    """`route_source(host)` for the controller on `own_site`, `host` being `peer_site`'s; its failure in one line
    naming both sites and the fields that would settle it."""
    try:
        return route_source(host)
    except LaunchError as e:
        raise LaunchError(
            f"site {own_site}: listen_host auto routes toward site {peer_site}'s host {host}, which "
            f"{'does not resolve' if isinstance(e.__cause__, socket.gaierror) else 'has no route'} here "
            f"({e.__cause__})",
            hint=f"set sites.{peer_site}.network.listen_host to an address of {peer_site}'s hosts (a SLURM node name "
            f"may resolve only inside its cluster), or sites.{own_site}.network.listen_host to the address of "
            f"{own_site} that {peer_site} reaches",
        ) from e


def slurm_master_addr(nodelist: str) -> str:
    """Rank 0's address in a SLURM allocation: the first node of `nodelist` ($SLURM_JOB_NODELIST; the step's
    task 0 runs there) by its name when the name resolves here, else by the address SLURM itself reaches that
    node at (its NodeAddr in `scontrol show node`): node names need not be host names (a cluster whose NodeName
    `gpu-17` has NodeHostname `vm` and NodeAddr 10.0.0.17). Rank 0 resolves it the same way, so it listens
    where the others connect (`store_listener`)."""
    first = expand_hostlist(nodelist)[0]
    try:
        socket.getaddrinfo(first, None, type=socket.SOCK_STREAM)
        return first
    except OSError as e:
        unresolved = e
    try:
        res = subprocess.run(["scontrol", "show", "node", "-o", first], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(
            f"trainer group: node {first} (rank 0's) does not resolve ({unresolved}) and scontrol: {e}"
        ) from e
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", res.stdout)
    if res.returncode != 0 or m is None:
        why = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.returncode}"]
        raise LaunchError(
            f"trainer group: node {first} (rank 0's) does not resolve ({unresolved}) and "
            f"`scontrol show node {first}` gives no NodeAddr: {why[0]}",
            hint="set MASTER_ADDR for the trainer (site setup) to rank 0's node address",
        )
    log.info("trainer group: node %s does not resolve here; its SLURM NodeAddr is %s", first, m[1])
    return m[1]


def store_listener(master_addr: str, port: int) -> int | None:
    """A listening socket for the trainer group's rendezvous store on the interface MASTER_ADDR names (torch's
    own store server listens on every interface); its descriptor, for `TCPStore(master_listen_fd=...)`.

    None — torch's default, with a warning — when MASTER_ADDR is a host name that resolves to a loopback
    address here only (a Debian-style /etc/hosts entry, while the other nodes reach this one by its network
    address): binding the loopback would lock them out."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(master_addr, port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        raise LaunchError(f"MASTER_ADDR {master_addr!r} does not resolve: {e}") from e
    ip = str(sockaddr[0])
    # (`loopback`: localhost however written, LOCALHOST too, is the loopback's own name, not such a host name)
    if ipaddress.ip_address(ip).is_loopback and not loopback(master_addr) and not _is_ip(master_addr):
        log.warning(
            "MASTER_ADDR %s resolves to %s here: the trainer group's store listens on every interface", master_addr, ip
        )
        return None
    try:
        sock = socket.create_server((ip, port), family=family)
    except OSError as e:
        raise LaunchError(f"trainer group: cannot listen on {ip}:{port} (MASTER_ADDR {master_addr}): {e}") from e
    return sock.detach()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(same_host(text.strip("[]")))
    except ValueError:
        return False
    return True
