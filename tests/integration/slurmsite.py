"""The localhost SLURM cluster of the integration tests (tests/services/slurm.sh): its `scheduler` entry."""

from __future__ import annotations

from typing import Any


def slurm_scheduler(
    services: dict[str, str], *, submitter: str = "submitit", time_limit_min: int = 10
) -> dict[str, Any]:
    """Partition `sitea`'s scheduler entry: jobs submitted with submitit from here, or (`submitter` "sbatch-ssh")
    with sbatch on the submit host reached over the test sshd."""
    sched: dict[str, Any] = {
        "kind": "slurm",
        "partition": "sitea",
        "slurm_conf": services["RLCTL_TEST_SLURM_CONF"],
        "time_limit_min": time_limit_min,
    }
    if submitter == "sbatch-ssh":
        sched.update(
            submit_host=services["RLCTL_TEST_SSH_HOST"],
            ssh_user="root",
            ssh_port=int(services["RLCTL_TEST_SSH_PORT"]),
            ssh_key_file=services["RLCTL_TEST_SSH_KEY"],
            ssh_known_hosts=services["RLCTL_TEST_SSH_KNOWN_HOSTS"],
        )
    return sched
