"""Reachability of a site through its scheduler: local always, SSH login, SLURM controller.

Each probe has a deadline and never raises for an unreachable site: it returns a result row,
so `rlctl check --reach` can report every site and exit 3 when some failed.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rlctl.config.inventory import LocalScheduler, Site, SlurmScheduler, SshScheduler


@dataclass
class ReachResult:
    site: str
    ok: bool
    detail: str
    seconds: float


def _ssh_run(
    host: str,
    *,
    user: str | None,
    port: int,
    key_file: str | None,
    command: str,
    timeout_s: float,
    proxy_jump: str | None = None,
) -> str:
    """Run one command over SSH (fabric) and return its stdout; raises OSError-like errors on failure."""
    from fabric import Connection  # imported lazily: only SSH sites need it

    kwargs: dict[str, object] = {
        "look_for_keys": key_file is None,
        "allow_agent": key_file is None,
        "banner_timeout": timeout_s,
        "auth_timeout": timeout_s,
    }
    if key_file:
        kwargs["key_filename"] = str(Path(key_file).expanduser())
    gateway = Connection(proxy_jump, connect_timeout=timeout_s) if proxy_jump else None
    with Connection(
        host, user=user, port=port, connect_timeout=timeout_s, connect_kwargs=kwargs, gateway=gateway
    ) as conn:
        res = conn.run(command, hide=True, warn=True, timeout=timeout_s, in_stream=False)
        if res.exited != 0:
            raise RuntimeError(f"'{command}' exited {res.exited}: {res.stderr.strip()[:200]}")
        return str(res.stdout)


def _probe_ssh(site: Site, sched: SshScheduler, timeout_s: float) -> str:
    hosts = [h for h, _ in site.hosts]
    for host in hosts:
        _ssh_run(
            host,
            user=sched.user,
            port=sched.port,
            key_file=sched.key_file,
            command="true",
            timeout_s=timeout_s,
            proxy_jump=sched.proxy_jump,
        )
    return f"ssh login ok on {len(hosts)} host(s)"


def _probe_slurm(sched: SlurmScheduler, timeout_s: float) -> str:
    cmd = f"sinfo -h -p {sched.partition} -o '%D %t'"
    if sched.submit_host:
        out = _ssh_run(
            sched.submit_host,
            user=sched.ssh_user,
            port=sched.ssh_port,
            key_file=sched.ssh_key_file,
            command=cmd,
            timeout_s=timeout_s,
        )
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
            detail = _probe_ssh(site, sched, timeout_s)
        else:
            detail = _probe_slurm(sched, timeout_s)
        ok = True
    except FileNotFoundError as e:  # fault-tolerance point: one row per site, never a crash
        ok, detail = False, f"command not found: {e.filename}"
    except Exception as e:  # noqa: BLE001 - fault-tolerance point, see docstring
        ok, detail = False, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return ReachResult(name, ok, detail, time.monotonic() - t0)
