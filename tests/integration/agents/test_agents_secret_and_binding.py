"""A short local job, watched from outside: the per-job secret never appears in what the job writes or
shows (logs, events, metrics, status, the job index), and every socket its processes listen on is bound
to the configured interface (127.0.0.1 here), never to all interfaces.

    rlctl launch (subprocess) ──▶ controller, trainer, rollout units (its process tree)
    while it runs:  /proc/<pid>/fd ∩ /proc/net/tcp{,6} LISTEN  → the addresses they listen on
                    rlctl status DIR -o json, GET /metrics          → kept for the secret check
    after it ends:  every file of the job dir (but `secret`) and of $RLCTL_HOME, launch's stdout/stderr,
                    status and metrics text ──grep──▶ the secret (hex either case, raw bytes, base64)
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), {root}
    while frontier:
        found |= frontier
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
    return found


def listening(pids: set[int]) -> set[tuple[int, str, int]]:
    """(pid, local address, port) of every TCP socket these processes listen on."""
    table: dict[str, tuple[str, int]] = {}
    for name, width in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A":  # LISTEN
                continue
            hexip, hexport = f[1].split(":")
            raw = bytes.fromhex(hexip)
            ip = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))  # /proc prints 32-bit words host-endian
            table[f[9]] = (_ip_text(ip), int(hexport, 16))
    out = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for link in links:
            if link.startswith("socket:[") and link[8:-1] in table:
                out.add((pid, *table[link[8:-1]]))
    return out


def _ip_text(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


def test_secret_never_shown_and_sockets_bound_to_the_configured_interface(tiny_job, tmp_path: Path) -> None:
    job_dir = tmp_path / "run"
    job = tiny_job("async", iterations=3)
    launch = subprocess.Popen(
        [sys.executable, "-m", "rlctl", "launch", str(job), "-o", "json", "--job-dir", str(job_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sockets: set[tuple[int, str, int]] = set()
    shown: list[str] = []
    deadline = time.monotonic() + 240
    try:
        while launch.poll() is None and time.monotonic() < deadline:
            sockets |= listening(descendants(launch.pid))
            controller = job_dir / "controller.json"
            if not shown and controller.exists():
                status = run_cli("status", str(job_dir), "-o", "json")
                port = json.loads(controller.read_text())["metrics_port"]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                    shown += [status.stdout, status.stderr, resp.read().decode()]
            time.sleep(0.2)
        out, err = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == 0, err[-2000:]
    after = run_cli("status", str(job_dir), "-o", "json")
    shown += [out, err, after.stdout, after.stderr]

    # every listening socket of the job: the configured interface only
    assert len({(a, p) for _, a, p in sockets}) >= 4, sockets  # controller, metrics, weight nodes, rollout units
    assert {a for _, a, _ in sockets} == {"127.0.0.1"}, sockets

    secret = bytes.fromhex((job_dir / "secret").read_text().strip())
    needles = [secret.hex().encode(), secret.hex().upper().encode(), secret, base64.b64encode(secret)]
    files = [p for p in job_dir.rglob("*") if p.is_file() and p.name != "secret"]
    files += [p for p in Path(os.environ["RLCTL_HOME"]).rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in files) and (job_dir / "events.jsonl").exists()
    leaks = [str(p) for p in files for n in needles if n in p.read_bytes()]
    leaks += [f"shown text {i}" for i, text in enumerate(shown) for n in needles if n in text.encode()]
    assert shown[0] and leaks == []
