"""A two-rank trainer as one SLURM job on the localhost cluster, launched by `rlctl launch`: its ranks are the job's
tasks and find rank 0 through the first node of the allocation. The cluster's node names (`sitea-1`) resolve
nowhere (NodeHostname `vm`, NodeAddr 127.0.0.1, tests/services/slurm.sh), as on a cluster whose node names are
SLURM's own: the ranks meet at the node's SLURM NodeAddr. And a rank that dies at start ends the SLURM step
(`srun --kill-on-bad-exit`), so the launch fails naming it instead of its peer waiting in the rendezvous."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.slurmsite import slurm_scheduler

from .conftest import REPO, hooked, job_yaml, launched, rlctl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# rank 0 of the trainer dies at start, in the way a rank does (its error line, exit 1): its MASTER_ADDR resolves
# nowhere (.invalid, RFC 6761); rank 1 finds the real rank-0 address and would wait in the rendezvous for it
RANK0_DIES = """
import os, sys
argv = getattr(sys, "orig_argv", [])
if "rlctl.agents" in argv and "trainer" in argv and os.environ.get("SLURM_PROCID") == "0":
    os.environ["MASTER_ADDR"] = "rank0-dies.invalid"
"""


def slurm_inventory(services: dict[str, str], path: Path, *, submitter: str) -> Path:
    sched = slurm_scheduler(services, submitter=submitter)
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
    if submitter == "sbatch-ssh":  # the submit host is this machine: its python3 is not this virtualenv's
        site["python"] = sys.executable
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


def test_a_rank_dying_at_start_on_the_submitit_path_ends_the_launch_naming_it(services, tmp_path):
    """Without `--kill-on-bad-exit` on submitit's srun, rank 1 waited in the rendezvous until torch's 120 s store
    timeout, the job "running" at iteration 0; now rank 0's exit ends the step and the launch, well before then."""
    job = two_rank_job(services, tmp_path, submitter="submitit", iterations=2)
    env = hooked(tmp_path, RANK0_DIES)
    try:
        proc = launched(job, tmp_path / "run", env, 110)  # under the 120 s a rank waits for the rendezvous
    finally:
        rlctl("stop", str(tmp_path / "run"))  # a launcher killed at the timeout leaves the SLURM jobs behind
    assert proc.returncode == 1, proc.stderr[-3000:]
    msg = proc.stderr.strip().splitlines()[-1]
    assert msg.startswith("rlctl: error: trainer-0 exited with "), msg
    assert "before the job's trainer joined" in msg, msg
    assert ": rank 0: MASTER_ADDR 'rank0-dies.invalid' does not resolve" in msg, msg
