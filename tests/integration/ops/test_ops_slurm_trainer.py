"""A two-rank trainer as one SLURM job on the localhost cluster, launched by `rlctl launch`: its ranks are the job's
tasks and find rank 0 through the first node of the allocation. The cluster's node names (`sitea-1`) resolve
nowhere (NodeHostname `vm`, NodeAddr 127.0.0.1, tests/services/slurm.sh), as on a cluster whose node names are
SLURM's own: the ranks meet at the node's SLURM NodeAddr."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, job_yaml, launched, rlctl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def slurm_inventory(services: dict[str, str], path: Path, *, submitter: str) -> Path:
    sched: dict[str, object] = {
        "kind": "slurm",
        "partition": "sitea",
        "slurm_conf": services["RLCTL_TEST_SLURM_CONF"],
        "time_limit_min": 10,
    }
    if submitter == "sbatch-ssh":
        sched.update(
            submit_host=services["RLCTL_TEST_SSH_HOST"],
            ssh_user="root",
            ssh_port=int(services["RLCTL_TEST_SSH_PORT"]),
            ssh_key_file=services["RLCTL_TEST_SSH_KEY"],
            ssh_known_hosts=services["RLCTL_TEST_SSH_KNOWN_HOSTS"],
        )
    # over SSH the agents get the submit host's environment, not this one's: the tree under test
    setup = [f"export PYTHONPATH={REPO}"] if submitter == "sbatch-ssh" else []
    site = {
        "datacenter": "dc-a",
        "gpu": "CPU",
        "scheduler": sched,
        "nodes": [{"host": "sitea-[1-2]", "gpus": 2}],
        # an address of this machine's that is no loopback (the agents may land on either node)
        "network": {"bandwidth_gbps": 10, "listen_host": services["RLCTL_TEST_NETSITE_GATEWAY"]},
        "setup": setup,
    }
    path.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"train": site}}))
    return path


def two_rank_job(services: dict[str, str], tmp_path: Path, *, submitter: str, iterations: int) -> Path:
    inv = slurm_inventory(services, tmp_path / "sites.yaml", submitter=submitter)
    return job_yaml(
        tmp_path / "two-ranks.yaml",
        inventory=[str(inv)],
        trainer="train",
        rollout="train",
        iterations=iterations,
        placement={"trainer": {"site": "train", "gpus": 2}, "rollout": [{"site": "train", "gpus": 1}]},
    )


@pytest.mark.parametrize("submitter", ["submitit", "sbatch-ssh"])
def test_two_trainer_ranks_in_one_slurm_job_train(services, tmp_path, submitter):
    job = two_rank_job(services, tmp_path, submitter=submitter, iterations=2)
    job_dir = tmp_path / "run"
    proc = launched(job, job_dir, dict(os.environ), 240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["iterations"] == 2 and out["ledger"]["trained"] == out["ledger"]["prompts"] > 0, out
    shown = rlctl("logs", str(job_dir), "trainer/0")  # read on its site (over SSH: staged there, not here)
    assert shown.returncode == 0, shown.stderr
    log = shown.stdout
    # both ranks ran as tasks of the one job, and met at the node's SLURM address (its name resolves nowhere)
    for rank in (0, 1):
        assert f'"rank": {rank}, "role": "trainer"' in log, log[-3000:]
        assert f"trainer-{rank} rlctl.agents.listen: trainer group: node sitea-" in log, log[-3000:]
    assert "its SLURM NodeAddr is 127.0.0.1" in log
