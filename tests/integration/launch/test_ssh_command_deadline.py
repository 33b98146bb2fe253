"""An SSH command past its deadline ends on the host too, against the real sshd (tests/services/sshd.sh): our
deadline only closes the channel, which sshd signals nothing on (no pty). The "remote" host is this machine, so
the test looks at /proc for what the command left running."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import pytest

from rlctl.errors import CommandTimeout
from rlctl.launch.sitefs import ssh_target
from rlctl.launch.sshrunner import SshRunner
from tests.integration.sshsite import ssh_site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def marker_pids(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (zombies excluded: dead, only not yet reaped)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                held = marker.encode() in (d / "cmdline").read_bytes()
                state = (d / "stat").read_text().rsplit(") ", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if held and state not in ("Z", "X"):
                pids.append(int(d.name))
    return pids


@pytest.mark.parametrize(
    "body",
    [
        "import time; time.sleep(300)",  # a hung command (a `sha256sum` on a stuck disk, an `srun` never placed)
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)",  # SIGKILL after grace
    ],
)
def test_a_timed_out_command_ends_on_the_host_too(services: dict[str, str], body: str) -> None:
    marker = f"rlctl-it-{uuid.uuid4().hex}"
    site = ssh_site(services)
    runner = SshRunner(ssh_target(site, connect_timeout_s=10))
    try:
        with pytest.raises(CommandTimeout, match="did not finish within 2 s"):
            runner.run(f"{sys.executable} -c '{body}' {marker} & wait", timeout_s=2)
        assert marker_pids(marker)  # ours was the deadline met: the host's comes later
        deadline = time.monotonic() + 20.0  # the host's deadline, its grace, and slack for a loaded machine
        while marker_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker_pids(marker) == []
    finally:
        if left := marker_pids(marker):  # (the old code's survivors, not left running past the test)
            cleaner = SshRunner(ssh_target(site, connect_timeout_s=10))
            cleaner.run("kill -KILL " + " ".join(map(str, left)), timeout_s=20)
            cleaner.close()
        runner.close()
