"""`rlctl check --reach` against a real sshd on loopback and a real SLURM controller (tests/services)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult

pytestmark = pytest.mark.integration


def inventory(tmp: Path, services: dict[str, str], *, ssh_port: str | None = None, partition: str = "sitea") -> Path:
    port = ssh_port or services["RLCTL_TEST_SSH_PORT"]
    text = f"""\
apiVersion: rlctl/v1
kind: Inventory
sites:
  here:
    datacenter: a
    scheduler: {{kind: local}}
    gpu: CPU
    nodes: [{{host: localhost, gpus: 2}}]
  trainers:
    datacenter: a
    scheduler: {{kind: slurm, partition: {partition}, slurm_conf: {services["RLCTL_TEST_SLURM_CONF"]}}}
    gpu: H800
    nodes: [{{host: "sitea-[1-2]", gpus: 8}}]
  rollouts:
    datacenter: b
    scheduler: {{kind: ssh, user: root, port: {port}, key_file: {services["RLCTL_TEST_SSH_KEY"]},
                known_hosts: {services["RLCTL_TEST_SSH_KNOWN_HOSTS"]}}}
    gpu: H20
    nodes: [{{host: {services["RLCTL_TEST_SSH_HOST"]}, gpus: 8}}]
links:
  - {{between: [trainers, rollouts], bandwidth_gbps: 80}}
"""
    path = tmp / "sites.yaml"
    path.write_text(text)
    return path


def test_all_sites_reachable(cli: Callable[..., CliResult], services: dict[str, str], tmp_path: Path) -> None:
    res = cli("check", str(inventory(tmp_path, services)), "--reach", "-o", "json")
    assert res.exit_code == 0, res.stderr
    reach = {r["site"]: r for r in json.loads(res.stdout)["reach"]}
    assert all(r["ok"] for r in reach.values()), reach
    assert "slurm partition sitea" in reach["trainers"]["detail"]
    assert "ssh login ok on 1 host" in reach["rollouts"]["detail"]


@pytest.mark.timeout(120)  # a probe that ignored its deadline would hang here
def test_dead_ssh_site_and_missing_partition_give_exit_3(
    cli: Callable[..., CliResult], services: dict[str, str], tmp_path: Path
) -> None:
    path = inventory(tmp_path, services, ssh_port="1", partition="nosuchpart")
    res = cli("check", str(path), "--reach", "--timeout", "5", "-o", "json")
    assert res.exit_code == 3
    reach = {r["site"]: r for r in json.loads(res.stdout)["reach"]}
    assert reach["here"]["ok"]
    assert not reach["rollouts"]["ok"] and not reach["trainers"]["ok"]
    assert "nosuchpart" in reach["trainers"]["detail"]
    assert "unreachable site(s): trainers, rollouts" in res.stderr or "unreachable site(s): rollouts" in res.stderr


def test_table_shows_failure(cli: Callable[..., CliResult], services: dict[str, str], tmp_path: Path) -> None:
    res = cli("check", str(inventory(tmp_path, services, ssh_port="1")), "--reach", "--timeout", "5")
    assert res.exit_code == 3
    assert "FAILED" in res.stdout and "Reachability" in res.stdout
