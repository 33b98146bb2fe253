"""Reachability of a site through its scheduler: local always, SSH login, SLURM controller.

Each probe has a deadline and never raises for an unreachable site: it returns a result row,
so `rlctl check --reach` can report every site and exit 3 when some failed. SSH probes connect as
the launch backends do (`rlctl.launch.remote`), under the one host-key policy of `rlctl.launch.hostkeys`:
a host whose key is unknown is unreachable for `check` exactly as it would be for `launch`.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from rlctl.config.inventory import LocalScheduler, Site, SlurmScheduler, SshScheduler
from rlctl.errors import LaunchError
from rlctl.launch.remote import SshRunner
from rlctl.launch.sitefs import ssh_target


@dataclass
class ReachResult:
    site: str
    ok: bool
    detail: str
    seconds: float


def _ssh_run(site: Site, host: str | None, *, command: str, timeout_s: float) -> str:
    """Run one command on an SSH site's host or a SLURM site's submit host; its stdout, or LaunchError."""
    runner = SshRunner(ssh_target(site, host, connect_timeout_s=timeout_s))
    try:
        res = runner.run(command, timeout_s=timeout_s)
    finally:
        runner.close()
    if res.exit_code != 0:
        raise LaunchError(f"'{command}' exited {res.exit_code}: {res.tail()[:200]}")
    return res.stdout


def _probe_ssh(site: Site, timeout_s: float) -> str:
    hosts = [h for h, _ in site.hosts]
    for host in hosts:
        _ssh_run(site, host, command="true", timeout_s=timeout_s)
    return f"ssh login ok on {len(hosts)} host(s)"


def _probe_slurm(site: Site, sched: SlurmScheduler, timeout_s: float) -> str:
    cmd = f"sinfo -h -p {sched.partition} -o '%D %t'"
    if sched.submit_host:
        out = _ssh_run(site, None, command=cmd, timeout_s=timeout_s)
    else:
        env = dict(os.environ)
        if sched.slurm_conf:
            env["SLURM_CONF"] = sched.slurm_conf
        proc = subprocess.run(
            ["sinfo", "-h", "-p", sched.partition, "-o", "%D %t"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError((proc.stderr.strip() or f"sinfo exited {proc.returncode}").splitlines()[-1])
        out = proc.stdout
    if not out.strip():
        raise RuntimeError(f"partition {sched.partition!r} not found by sinfo")
    states = ", ".join(" ".join(line.split()) for line in out.strip().splitlines())
    return f"slurm partition {sched.partition}: {states} (nodes state)"


def probe_site(name: str, site: Site, *, timeout_s: float = 10.0) -> ReachResult:
    t0 = time.monotonic()
    sched = site.scheduler
    try:
        if isinstance(sched, LocalScheduler):
            detail = "local processes"
        elif isinstance(sched, SshScheduler):
            detail = _probe_ssh(site, timeout_s)
        else:
            detail = _probe_slurm(site, sched, timeout_s)
        ok = True
    except FileNotFoundError as e:  # fault-tolerance point: one row per site, never a crash
        ok, detail = False, f"command not found: {e.filename}"
    except Exception as e:  # noqa: BLE001 - fault-tolerance point, see docstring
        ok, detail = False, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return ReachResult(name, ok, detail, time.monotonic() - t0)
