"""`rlctl check --reach` against the real localhost SLURM (tests/services/slurm.sh): a SLURM site whose constraint
names a feature no node of its partition has, and whose reservation does not exist — both refused by sbatch only as
the launch submits, after the staging. Each is one line naming the inventory file, the field, the value and what is
valid there (the partition's features, the reservations), exit 2, for a job and for its inventory alike; fixed, the
check passes. One reservation is made, of one core for five minutes, deleted as its test ends: one on the test
partition's nodes would hold them from other tests' jobs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.slurmsite import slurm_scheduler

from .conftest import REPO, job_yaml, rlctl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
FEATURE = "rlctl-it"  # slurm.sh's nodes have no features: the fixture gives sitea's one (as test_slurm_site_options)


@pytest.fixture(scope="module")
def featured(services: dict[str, str]) -> None:
    """Partition sitea's nodes offer FEATURE (added at run time; a job asking no constraint runs there as before)."""
    env = {**os.environ, "SLURM_CONF": services["RLCTL_TEST_SLURM_CONF"]}
    for what in ("AvailableFeatures", "ActiveFeatures"):
        subprocess.run(
            ["scontrol", "update", "NodeName=sitea-[1-2]", f"{what}={FEATURE}"], env=env, check=True, timeout=30
        )


def inventory(services: dict[str, str], path: Path, *, submitter: str, **options: Any) -> Path:
    site = {
        "datacenter": "dc-a",
        "gpu": "CPU",
        "python": sys.executable,
        "scheduler": {**slurm_scheduler(services, submitter=submitter), **options},
        "nodes": [{"host": "sitea-[1-2]", "gpus": 2}],
        "network": {"bandwidth_gbps": 10, "listen_host": "auto"},
        # over SSH the probe gets the submit host's environment, not this one's: the tree under test
        "setup": [f"export PYTHONPATH={REPO}"] if submitter == "sbatch-ssh" else [],
    }
    path.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"train": site}}))
    return path


@pytest.mark.parametrize("submitter", ["submitit", "sbatch-ssh"])  # sinfo and scontrol here, or on the submit host
def test_check_reach_names_a_missing_feature_and_reservation_in_one_line_each(
    services: dict[str, str], featured: None, tmp_path: Path, submitter: str
) -> None:
    missing = f"rlctl-none-{uuid.uuid4().hex[:8]}"
    nothing = f"rlctl-none-{uuid.uuid4().hex[:8]}"  # never made
    options = {"constraint": f"[{FEATURE}|{missing}]", "reservation": nothing}
    inv = inventory(services, tmp_path / "sites.yaml", submitter=submitter, **options)
    job = job_yaml(tmp_path / "job.yaml", inventory=[str(inv)], trainer="train", rollout="train", iterations=2)

    for checked in (job, inv):
        res = rlctl("check", str(checked), "--reach", timeout_s=150)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2, res.stderr[-2000:]
        assert all(line.startswith(f"rlctl: error: {inv}: sites.train.scheduler.") for line in lines), lines
        constraint = [x for x in lines if ".scheduler.constraint: " in x]
        reservation = [x for x in lines if ".scheduler.reservation: " in x]
        assert len(constraint) == 1 and len(reservation) == 1 and len(lines) == 2, lines
        assert f"no node of partition sitea has feature '{missing}' (sinfo)" in constraint[0], constraint
        assert f"its nodes' features: {FEATURE}" in constraint[0], constraint
        assert f"'{nothing}': no such reservation (scontrol show reservation)" in reservation[0], reservation
        assert "srun" not in res.stderr  # not the probe's raw refusal

    inventory(services, inv, submitter=submitter, constraint=f"[{FEATURE}*1]")  # fixed: a feature there, no reservation
    for checked in (job, inv):
        res = rlctl("check", str(checked), "--reach", timeout_s=150)
        assert res.returncode == 0, res.stderr[-2000:]


def test_launch_refuses_a_missing_feature_before_making_or_submitting_anything(
    services: dict[str, str], featured: None, tmp_path: Path
) -> None:
    """`rlctl launch` alone (no `check --reach` first): sbatch refused the first agent's job ('Invalid feature
    specification') after the job dir was made, indexed and staged; now check's line, exit 2, before any of it."""
    missing = f"rlctl-none-{uuid.uuid4().hex[:8]}"
    inv = inventory(services, tmp_path / "sites.yaml", submitter="submitit", constraint=f"{FEATURE}&{missing}")
    name = f"it-{uuid.uuid4().hex[:8]}"
    job = job_yaml(tmp_path / f"{name}.yaml", inventory=[str(inv)], trainer="train", rollout="train", iterations=2)
    home, run = tmp_path / "home", tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "rlctl", "launch", str(job), "--job-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RLCTL_HOME": str(home)},
    )
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rlctl: error: {inv}: sites.train.scheduler.constraint: "), lines
    assert f"no node of partition sitea has feature '{missing}' (sinfo)" in lines[0], lines
    assert not run.exists() and not home.exists()  # no job dir, no index row
    env = {**os.environ, "SLURM_CONF": services["RLCTL_TEST_SLURM_CONF"]}
    queued = subprocess.run(["squeue", "-h", "-o", "%j"], env=env, capture_output=True, text=True, timeout=30)
    assert queued.returncode == 0 and queued.stdout.strip() == "", queued.stdout  # nothing submitted


def test_check_reach_says_a_time_limit_past_the_reservation_s_end(services: dict[str, str], tmp_path: Path) -> None:
    """sbatch starts a job with --time=60 in a reservation that ends in five minutes, and SLURM ends it then
    (ResvOverRun 0, slurm.sh's default): one line on time_limit_min with the minutes left by the cluster's clock; a
    limit within them passes, the probe's step run in the reservation."""
    env = {**os.environ, "SLURM_CONF": services["RLCTL_TEST_SLURM_CONF"]}
    name = f"rlctl-it-{uuid.uuid4().hex[:8]}"
    made = ["scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now", "Duration=5"]
    made += ["Users=root", "Nodes=sitea-1", "CoreCnt=1"]  # one core: other tests' jobs still fit
    subprocess.run(made, env=env, check=True, timeout=30, capture_output=True)
    try:
        inv = inventory(services, tmp_path / "sites.yaml", submitter="submitit", reservation=name, time_limit_min=60)
        res = rlctl("check", str(inv), "--reach", timeout_s=150)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
        assert lines[0].startswith(f"rlctl: error: {inv}: sites.train.scheduler.time_limit_min: 60 is past the end of "
                                   f"reservation '{name}'"), lines  # fmt: skip
        assert "(ResvOverRun 0): at most 4 min in, not 60" in lines[0] or "at most 5 min in" in lines[0], lines
        inventory(services, inv, submitter="submitit", reservation=name, time_limit_min=3)
        res = rlctl("check", str(inv), "--reach", timeout_s=150)
        assert res.returncode == 0, res.stderr[-2000:]
    finally:
        subprocess.run(["scontrol", "delete", f"reservation={name}"], env=env, timeout=30, capture_output=True)
