"""A local site's agents run on this machine: what its entry names there (its host, python, work root) must be
what this machine has, or `rlctl check` refuses it, of the inventory alone or of a job on it, in one line naming the
inventory file and the field, exit 2 — before launch writes anything."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config.inventory import Site, load_inventory
from rlctl.errors import ConfigError
from tests.conftest import ROOT, run_cli

DEMO = ROOT / "jobs" / "demo.yaml"


def local_inventory(tmp_path: Path, **fields: Any) -> Path:
    """An inventory of one local site, `local`, as clusters/local.yaml, with `fields` set on it (`scheduler`
    merged into its scheduler entry)."""
    site: dict[str, Any] = {
        "datacenter": "here",
        "scheduler": {"kind": "local", **fields.pop("scheduler", {})},
        "gpu": "CPU",
        "nodes": [{"host": "localhost", "gpus": 4}],
        **fields,
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"local": site}}))
    return path


def checked(tmp_path: Path, inventory: Path) -> list[str]:
    """`rlctl check` of the inventory, then of the demo job on it: each one error line, exit 2."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**yaml.safe_load(DEMO.read_text()), "inventory": [str(inventory)]}))
    lines = []
    for file in (inventory, job):
        res = run_cli("check", str(file))
        assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res
        lines.append(res.stderr.strip())
    return lines


@pytest.mark.parametrize("under", ["empty", "file", "proc"])
def test_a_local_work_root_this_machine_cannot_make_is_refused_naming_the_inventory(tmp_path: Path, under: str) -> None:
    """It passed check; launch then failed at `cannot create …/jobs/run-…: Not a directory`, exit 1, naming neither
    the inventory nor the field; "" put the job's files under the directory launch ran in."""
    (tmp_path / "notes.txt").write_text("mine\n")
    workdir, says = {
        "empty": ("", "String should have at least 1 character"),
        "file": (str(tmp_path / "notes.txt"), f"{tmp_path / 'notes.txt'} is a file, not a directory"),
        "proc": ("/proc/rlctl-not-made", "/proc/rlctl-not-made: cannot make a directory in /proc"),
    }[under]
    inventory = local_inventory(tmp_path, scheduler={"workdir": workdir})
    for line in checked(tmp_path, inventory):
        assert line.startswith(f"rlctl: error: {inventory}: sites.local.scheduler.workdir: {says}"), line
    made = tmp_path / "roots" / "rl"  # one that can be made passes, and is not made by the check
    assert run_cli("check", str(local_inventory(tmp_path, scheduler={"workdir": str(made)}))).exit_code == 0
    assert not (tmp_path / "roots").exists()


@pytest.mark.parametrize("python", ["/nonexistent/python3", "notes.txt", "tmp", "python3.rlctl-none"])
def test_a_local_python_that_cannot_start_is_refused_naming_the_inventory(tmp_path: Path, python: str) -> None:
    """It passed check; launch then failed at `cannot start controller-0: [Errno 2] No such file or directory`,
    exit 1. A file without the x bit, a directory, and a command name not in PATH are refused as well."""
    (tmp_path / "notes.txt").write_text("mine\n")
    given = {"notes.txt": str(tmp_path / "notes.txt"), "tmp": str(tmp_path)}.get(python, python)
    says = "no such command in this machine's PATH" if "/" not in given else "no such file"
    says = "not an executable file" if python in ("notes.txt", "tmp") else says
    inventory = local_inventory(tmp_path, python=given)
    for line in checked(tmp_path, inventory):
        assert line.startswith(f"rlctl: error: {inventory}: sites.local.python: {given}: {says}"), line
    for fine in (sys.executable, "python3"):  # an interpreter of this machine, by path or by name
        assert run_cli("check", str(local_inventory(tmp_path, python=fine))).exit_code == 0


@pytest.mark.parametrize(
    ("nodes", "field", "says"),
    [
        ([{"host": "localhost,otherhost", "gpus": 4}], "nodes[0].host", "2 hosts (localhost, otherhost): "),
        ([{"host": "localhost", "gpus": 2}, {"host": "127.0.0.1", "gpus": 2}], "nodes", "2 hosts (localhost, 127.0"),
        ([{"host": "otherhost.invalid", "gpus": 4}], "nodes[0].host", "'otherhost.invalid' is not this machine"),
    ],
)
def test_a_local_site_on_hosts_other_than_this_machine_one_is_refused(
    tmp_path: Path, nodes: list[dict[str, Any]], field: str, says: str
) -> None:
    """It passed check, and its agents were recorded on "otherhost" but ran here: on a CUDA site trainer-0 (slot 0
    of localhost) and rollout-0 (slot 0 of otherhost) both got CUDA_VISIBLE_DEVICES=0."""
    inventory = local_inventory(tmp_path, nodes=nodes)
    for line in checked(tmp_path, inventory):
        assert line.startswith(f"rlctl: error: {inventory}: sites.local.{field}: {says}"), line
    # this machine, by another name; with the root's trailing dot too (its name, as the GPU-twice check reads it:
    # `localhost.` was this machine there, and refused here as 'not this machine')
    for host in ("127.0.0.1", socket.gethostname(), "localhost.", f"{socket.gethostname()}.", "LOCALHOST."):
        r = run_cli("check", str(local_inventory(tmp_path, nodes=[{"host": host, "gpus": 4}])))
        assert r.exit_code == 0, (host, r.stderr)


def test_two_local_sites_on_one_gpu_of_this_machine_are_refused_whatever_they_call_it(tmp_path: Path) -> None:
    """Device 0 listed by a local site on localhost and one on 127.0.0.1 passed: GPUs were told apart by host name."""
    site = {"datacenter": "here", "scheduler": {"kind": "local"}, "gpu": "H100"}
    sites = {"a": site | {"nodes": [{"host": "localhost", "gpus": 1}]}}
    sites["b"] = site | {"nodes": [{"host": "127.0.0.1", "gpus": 1}]}
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": sites}))
    res = run_cli("check", str(inventory))
    assert res.exit_code == 2 and res.stderr == (
        f"rlctl: error: {inventory}: sites.b.nodes: GPU 0 of this machine is listed by site 'a' too; give each site "
        "its own GPUs of a host (nodes[].devices)\n"
    )
    sites["b"]["nodes"][0]["devices"] = [1]  # its own GPU of this machine
    inventory.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": sites}))
    assert run_cli("check", str(inventory)).exit_code == 0


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "localhost.", "127.0.0.2", "0:0::1", "::ffff:127.0.0.1", "127.1", "127.0.1"]
)
def test_a_local_site_and_an_ssh_site_on_localhost_sharing_a_gpu_are_refused(tmp_path: Path, host: str) -> None:
    """A local site's GPU key became "this machine": an SSH site reached at localhost listing the same device no
    longer matched it (it did when both said localhost). Loopback was known by spelling only: an SSH site at
    localhost., 127.0.0.2 (127.0.0.0/8 is loopback), 0:0::1 or ::ffff:127.0.0.1 passed on the local site's GPU; and
    127.1 or 127.0.1 (127.0.0.1 to inet_aton, so to ssh) did, read as a host name."""
    node = {"datacenter": "here", "gpu": "H100", "nodes": [{"host": "localhost", "gpus": 1}]}
    sites = {"a": node | {"scheduler": {"kind": "local"}}, "b": node | {"scheduler": {"kind": "ssh"}}}
    sites["b"] = sites["b"] | {"nodes": [{"host": host, "gpus": 1}]}
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": sites}))
    res = run_cli("check", str(inventory))
    assert res.exit_code == 2 and "sites.b.nodes: GPU 0 of this machine is listed by site 'a' too" in res.stderr


def test_a_local_site_and_an_ssh_site_naming_this_machine_by_an_address_sharing_a_gpu_are_refused(
    tmp_path: Path,
) -> None:
    """Both said host 10.250.0.1 (an address of this machine): the local site's GPU was keyed "this machine" only,
    the SSH site's by the address, and the two passed on one GPU (they were refused when both were keyed by name)."""
    node = {"datacenter": "here", "gpu": "H100", "nodes": [{"host": "10.250.0.1", "gpus": 1}]}
    sites = {"a": node | {"scheduler": {"kind": "local"}}, "b": node | {"scheduler": {"kind": "ssh"}}}
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": sites}))
    with pytest.raises(ConfigError, match=re.escape("sites.b.nodes: GPU 0 of 10.250.0.1 is listed by site 'a' too")):
        load_inventory([inventory])


def test_one_address_listed_twice_in_ipv4_shorthand_is_refused() -> None:
    """127.1 is 127.0.0.1 (inet_aton, and so ssh, reads it so): a site listing both had its slots counted twice."""
    node = {"datacenter": "here", "gpu": "H100", "scheduler": {"kind": "ssh"}}
    site = node | {"nodes": [{"host": "127.0.0.1", "gpus": 1}, {"host": "127.1", "gpus": 1}]}
    with pytest.raises(ValueError, match=re.escape("host 127.1 is listed twice (as 127.0.0.1 too: one host")):
        Site.model_validate(site)
