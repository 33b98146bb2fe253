"""Which host a controller with `listen_host: auto` routes toward: another site, by the address that site
names for its peers when it names one (a scheduler's node names may not resolve outside the scheduler); where
the ranks of a SLURM trainer find rank 0 (the first node, by name or by its SLURM NodeAddr); and which setting an
agent's listen address came from."""

from __future__ import annotations

import socket
import subprocess

import pytest

from rlctl.agents.listen import controller_listen_host, controller_peer, listen_field, listen_host, slurm_master_addr
from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError
from rlctl.launch.agentenv import ENV_LISTEN_HOST, ENV_SITE
from tests.conftest import ROOT


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
    assert controller_peer(sites, "gen") == ("train", "10.250.0.1")
    assert controller_peer(sites, "train") == ("gen", "gen-1")  # `auto` names no address: the site's first host
    assert controller_peer({"gen": sites["gen"]}, "gen") is None


def test_a_controller_whose_auto_peer_does_not_resolve_says_which_and_what_to_set(monkeypatch) -> None:
    """The controller on an SSH site, the trainer on a SLURM site naming no listen_host: `auto` routes toward
    a SLURM node name, which resolves nowhere outside the cluster."""

    def no_such_host(host: str) -> str:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "gethostbyname", no_such_host)
    monkeypatch.setenv("RLCTL_LISTEN_HOST", "auto")
    sites = {"gen": site("10.250.0.2", "auto"), "train": site("sitea-[1-2]")}
    placement = {"trainer": {"site": "train", "gpus": 1}, "rollout": [{"site": "gen", "gpus": 1}]}
    job = JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "j",
            "inventory": ["sites.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits"},
            "placement": placement,
        }
    )
    with pytest.raises(LaunchError) as e:
        controller_listen_host(job, sites, "gen")
    assert str(e.value) == (
        "site gen: listen_host auto routes toward site train's host sitea-1, which does not resolve here "
        "([Errno -2] Name or service not known)"
    )
    assert e.value.hint == (
        "set sites.train.network.listen_host to an address of train's hosts (a SLURM node name may resolve only "
        "inside its cluster), or sites.gen.network.listen_host to the address of gen that train reaches"
    )
    monkeypatch.setenv("RLCTL_LISTEN_HOST", "10.250.0.2")  # a named address: nothing to route
    assert controller_listen_host(job, sites, "gen") == "10.250.0.2"


def test_rank0_is_reached_by_its_node_name_when_that_resolves(monkeypatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(socket.AF_INET, 1, 6, "", ("10.0.0.17", 0))])
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("scontrol asked"))
    assert slurm_master_addr("gpu-[17-18]") == "gpu-17"


def test_rank0_is_reached_at_its_slurm_node_addr_when_its_name_does_not_resolve(monkeypatch) -> None:
    """The test cluster's nodes: NodeName sitea-N, NodeHostname vm, NodeAddr 127.0.0.1 (a name SLURM's alone)."""
    asked: list[list[str]] = []

    def no_such_host(*_: object, **__: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    def scontrol(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        out = "NodeName=sitea-1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=vm Version=23.11\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    monkeypatch.setattr(subprocess, "run", scontrol)
    assert slurm_master_addr("sitea-[1-2]") == "127.0.0.1"
    assert asked == [["scontrol", "show", "node", "-o", "sitea-1"]]


def test_rank0_unresolvable_and_unknown_to_scontrol_is_one_line_naming_the_node(monkeypatch) -> None:
    def no_such_host(*_: object, **__: object) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    def scontrol(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "Node sitea-1 not found\n")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    monkeypatch.setattr(subprocess, "run", scontrol)
    with pytest.raises(LaunchError) as e:
        slurm_master_addr("sitea-[1-2]")
    assert str(e.value) == (
        "trainer group: node sitea-1 (rank 0's) does not resolve ([Errno -2] Name or service not known) and "
        "`scontrol show node sitea-1` gives no NodeAddr: Node sitea-1 not found"
    )


def test_the_setting_named_is_the_one_the_address_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    # `rlctl status` told the operator to set transport.listen_host while the site's network.listen_host (exported
    # by the launcher) decided: setting it changed nothing
    job = load_job(ROOT / "jobs" / "demo.yaml").spec
    job = job.model_copy(update={"transport": job.transport.model_copy(update={"listen_host": "192.0.2.2"})})
    monkeypatch.delenv(ENV_LISTEN_HOST, raising=False)
    monkeypatch.setenv(ENV_SITE, "train")
    assert (listen_host(job, toward=None), listen_field()) == ("192.0.2.2", "transport.listen_host")
    monkeypatch.setenv(ENV_LISTEN_HOST, "127.0.0.1")
    assert (listen_host(job, toward=None), listen_field()) == ("127.0.0.1", "sites.train.network.listen_host")
    monkeypatch.delenv(ENV_SITE)
    assert listen_field() == "the site's network.listen_host"
