"""Which host a controller with `listen_host: auto` routes toward: another site, by the address that site
names for its peers when it names one (a scheduler's node names may not resolve outside the scheduler)."""

from __future__ import annotations

from rlctl.agents.listen import controller_peer
from rlctl.config.inventory import Site


def site(hosts: str, listen_host: str | None = None) -> Site:
    network = {"bandwidth_gbps": 10} | ({"listen_host": listen_host} if listen_host else {})
    return Site.model_validate(
        {
            "datacenter": "dc",
            "gpu": "CPU",
            "scheduler": {"kind": "local"},
            "nodes": [{"host": hosts, "gpus": 1}],
            "network": network,
        }
    )


def test_controller_routes_toward_the_other_sites_named_address_first() -> None:
    sites = {"gen": site("gen-1", "auto"), "train": site("sitea-[1-2]", "10.250.0.1")}
    assert controller_peer(sites, "gen") == "10.250.0.1"
    assert controller_peer(sites, "train") == "gen-1"  # `auto` names no address: the site's first host
    assert controller_peer({"gen": sites["gen"]}, "gen") is None
