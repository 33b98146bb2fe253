"""The localhost SSH site of the integration tests (tests/services/sshd.sh): root over the test sshd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlctl.config.inventory import Site


def ssh_site(
    services: dict[str, str], *, gpus: int = 1, known_hosts: Path | None = None, workdir: Path | None = None
) -> Site:
    """Site `b`: one host (the test sshd's) of `gpus` GPUs, reached as root with the test key, checked against
    `known_hosts` (the test sshd's own where not given), with its work root at `workdir` where given."""
    scheduler: dict[str, Any] = {
        "kind": "ssh",
        "user": "root",
        "port": int(services["RLCTL_TEST_SSH_PORT"]),
        "key_file": services["RLCTL_TEST_SSH_KEY"],
        "known_hosts": str(known_hosts) if known_hosts else services["RLCTL_TEST_SSH_KNOWN_HOSTS"],
    }
    if workdir is not None:
        scheduler["workdir"] = str(workdir)
    return Site.model_validate(
        {
            "datacenter": "b",
            "gpu": "CPU",
            "nodes": [{"host": services["RLCTL_TEST_SSH_HOST"], "gpus": gpus}],
            "scheduler": scheduler,
        }
    )
