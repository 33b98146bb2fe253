"""The namespaced SSH site of the integration tests (tests/services/netsite.sh): its scheduler entry, a work root
only it sees, a shell on one of its hosts, and the bytes through its shaped link."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any


def site_workdir() -> str:
    """A work root for the SSH site that exists only in its private /tmp (unique: job ids repeat across tests)."""
    return f"/tmp/rlctl-site-b/{uuid.uuid4().hex[:12]}"


def ssh_scheduler(services: dict[str, str], workdir: str) -> dict[str, Any]:
    """The site's `scheduler` entry: root over its sshd (port 22 on every host), its known hosts, `workdir`."""
    return {
        "kind": "ssh",
        "user": "root",
        "port": 22,
        "key_file": services["RLCTL_TEST_SSH_KEY"],
        "known_hosts": services["RLCTL_TEST_NETSITE_KNOWN_HOSTS"],
        "workdir": workdir,
    }


def on_site(
    services: dict[str, str], script: str, *, host: str | None = None, timeout_s: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run a shell script on a host of the SSH site (default its first) through its sshd, so in that host's own
    view of the filesystem."""
    argv = [
        "ssh",
        "-i",
        services["RLCTL_TEST_SSH_KEY"],
        "-o",
        f"UserKnownHostsFile={services['RLCTL_TEST_NETSITE_KNOWN_HOSTS']}",
    ]
    argv += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    argv.append(f"root@{host or services['RLCTL_TEST_NETSITE_HOST']}")
    return subprocess.run([*argv, script], capture_output=True, text=True, timeout=timeout_s)


def link_bytes(services: dict[str, str]) -> dict[str, int]:
    """Bytes through the shaped link's two tbf queues so far: toward the site and back from it."""
    ns, dev = services["RLCTL_TEST_NETSITE_NETNS"], services["RLCTL_TEST_NETSITE_DEV"]

    def queue(prefix: list[str], device: str) -> int:
        argv = [*prefix, "tc", "-s", "-j", "qdisc", "show", "dev", device]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True)
        return sum(int(q.get("bytes", 0)) for q in json.loads(out.stdout) if q.get("kind") == "tbf")

    return {"to_site": queue([], dev), "from_site": queue(["ip", "netns", "exec", ns], "eth0")}
