"""Which address an agent binds and advertises to its peers (controller, trainer, rollout units).

    $RLCTL_LISTEN_HOST (its site's network.listen_host, set by the launcher)  else  job transport.listen_host
    "auto" ─▶ the local address of the route toward the peer that must reach it:
              rollout/trainer: the controller's host; controller: another site (its listen_host, else first host)

On one machine every agent can use 127.0.0.1. Across sites each site names the interface its
peers reach (an IP, a hostname, or `auto` when a site's hosts differ and routing already knows).
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError
from rlctl.launch.agentenv import ENV_LISTEN_HOST

AUTO = "auto"


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


def host_of(address: str) -> str:
    """'tcp://10.0.0.1:5000' → '10.0.0.1'."""
    return urlsplit(address).hostname or ""


def controller_peer(sites: dict[str, Site], own_site: str | None) -> str | None:
    """For a controller with `auto`: where its peers live — another site of the job, by the address that
    site names for its peers (`network.listen_host`, an interface of that site) when it names one, else
    its first host (a scheduler's node name may resolve only through the scheduler, hence the order)."""
    for name, site in sites.items():
        if name != own_site:
            named = site.network.listen_host
            return named if named and named != AUTO else site.nodes[0].hosts[0]
    return None
