"""A SLURM site's own options (`constraint`, `exclusive`, `sbatch_options`) against the real localhost SLURM
(tests/services/slurm.sh): an agent's job through both submitters, and `check --reach`'s probe srun, as SLURM
recorded them (`scontrol show job`; the test cluster's sacct keeps no constraint or comment). `reservation` is
checked in the rendered text only (tests/unit/launch/test_slurm_render.py): a reservation on the test partition's
nodes would hold them from every other test's jobs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.config.schedulers import SlurmScheduler
from rlctl.launch.slurm import SlurmBackend, SlurmResources
from tests.integration.launch.test_slurm_backend import spec, wait_for
from tests.integration.slurmsite import slurm_scheduler

pytestmark = pytest.mark.integration
FEATURE = "rlctl-it"  # slurm.sh's nodes have no features: the fixture gives sitea's one
OPTIONS = {
    "constraint": FEATURE,
    "exclusive": True,
    "sbatch_options": {"comment": "rlctl-test", "nice": 7, "no-requeue": True},
}


def slurm(services: dict[str, str], *args: str) -> str:
    env = {**os.environ, "SLURM_CONF": services["RLCTL_TEST_SLURM_CONF"]}
    proc = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


@pytest.fixture(scope="module")
def featured(services: dict[str, str]) -> None:
    """Partition sitea's nodes offer FEATURE (added at run time; a job asking no constraint runs there as before)."""
    slurm(services, "scontrol", "update", "NodeName=sitea-[1-2]", f"AvailableFeatures={FEATURE}")
    slurm(services, "scontrol", "update", "NodeName=sitea-[1-2]", f"ActiveFeatures={FEATURE}")


def recorded(services: dict[str, str], job_id: str) -> dict[str, str]:
    """The job's fields as `scontrol show job -o` says them (kept for MinJobAge after it ends)."""
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", slurm(services, "scontrol", "show", "job", "-o", job_id)))


def said_options(fields: dict[str, str]) -> tuple[str, ...]:
    # exclusive: no other job's tasks on its nodes (OverSubscribe=NO); --no-requeue: Requeue=0 (else 1)
    return tuple(fields.get(k, "") for k in ("Features", "OverSubscribe", "Comment", "Nice", "Requeue"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("submitter", ["submitit", "sbatch-ssh"])
def test_slurm_records_the_site_s_options_for_an_agent_and_the_probe(
    services: dict[str, str], featured: None, tmp_path: Path, submitter: str
) -> None:
    sched = SlurmScheduler.model_validate({**slurm_scheduler(services, submitter=submitter), **OPTIONS})
    b = SlurmBackend(
        "sitea",
        sched,
        job=f"it-{tmp_path.name}",
        job_dir=tmp_path,
        resources={"trainer": SlurmResources()},
        grace_s=10,
        known_hosts=services["RLCTL_TEST_SSH_KNOWN_HOSTS"],
        python=sys.executable,
    )
    assert b.submitter == submitter
    h = b.start(spec(tmp_path / "out", "exit", f"rlctl-it-{uuid.uuid4().hex}", "0"))
    try:
        assert wait_for("the job to end", lambda: b.poll(h) is not None, 90)
    finally:
        b.close()
    assert said_options(recorded(services, str(h.ident["job_id"]))) == (FEATURE, "NO", "rlctl-test", "7", "0")

    # the probe's step: the same options, less --no-requeue, which srun has not (it refused the step)
    site = Site.model_validate(
        {
            "datacenter": "a",
            "scheduler": sched.model_dump(),
            "gpu": "CPU",
            "nodes": [{"host": "sitea-[1-2]", "gpus": 1}],
        }
    )
    [(_, _, command)] = SlurmBackend.probe_commands(site, 'echo "job=$SLURM_JOB_ID"')
    runner = SlurmBackend.site_runner(site)
    try:
        res = runner.run(command, timeout_s=60)
    finally:
        runner.close()
    assert res.exit_code == 0, res.tail()
    job_id = res.stdout.strip().removeprefix("job=")
    assert job_id.isdigit(), res.stdout
    assert said_options(recorded(services, job_id)) == (FEATURE, "NO", "rlctl-test", "7", "1")
