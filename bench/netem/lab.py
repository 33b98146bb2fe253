"""Emulated datacenters on one Linux box: network namespaces as hosts, `tc tbf` as link rates.

    host ns  <p>h0 ─eth0══tbf(host rate)══╗                      ╔══ <p>h2  ...
    host ns  <p>h1 ─eth0══════════════════╣ br0 in <p>d0 ─uplink═╬═ br0 in <p>w (WAN switch) ═╦═ br0 in <p>d1
                                          ╚ (each port also shaped toward the host)          (uplinks shaped
                                                                                               both directions)

- every host has one NIC shaped to `host_rate_mbit` in both directions (host egress and the
  switch port toward the host), so a host can neither send nor receive faster than its NIC;
- every datacenter reaches the others through its uplink to one WAN switch, shaped to
  `inter_dc_rate_mbit` both ways: with two datacenters this is one inter-DC link;
- all hosts share one subnet (10.<net>.<dc+1>.<host+1>/16), no routing needed.

Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2. `NetLab` is a context manager that
always tears down what it built; on entry it also removes namespaces left behind by an earlier
run that crashed (recognised by the `rlx` name prefix and a dead owner pid). netem (delay) is not
available in every kernel, so only rates are emulated.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl import procfs
from rlctl.errors import RlctlError

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]  # lab processes run here: `python -m bench.netem.…` resolves
PREFIX = "rlx"
STATE_DIR = Path("/run/rlctl-netem")
_CMD_TIMEOUT_S = 15


class NetLabError(RlctlError):
    """The emulated network could not be built (not root, iproute2 missing, kernel refused)."""


@dataclass(frozen=True)
class LabSpec:
    datacenters: dict[str, list[str]]  # datacenter name -> host names (unique across datacenters)
    host_rate_mbit: float = 2000.0
    inter_dc_rate_mbit: float = 500.0
    host_burst_bytes: int = 2 << 20
    inter_dc_burst_bytes: int = 1 << 20
    subnet_octet: int = 231


@dataclass
class Host:
    name: str
    datacenter: str
    netns: str
    ip: str


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=_CMD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetLabError(f"{' '.join(argv)}: {e}") from e
    if check and res.returncode != 0:
        raise NetLabError(f"{' '.join(argv)}: {res.stderr.strip()}", hint="the netem harness needs root and iproute2")
    return res


def _delete_netns(names: list[str]) -> None:
    """Stop every process inside (they belong to the lab) and delete the namespaces."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = []
        for ns in names:
            out = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
            pids += [int(p) for p in out if p.isdigit()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if not pids:
            break
        time.sleep(0.3)
    for ns in names:
        _run(["ip", "netns", "del", ns], check=False)


def cleanup_stale() -> list[str]:
    """Delete namespaces of earlier labs whose owner process is gone; returns their prefixes."""
    owners: dict[str, int] = {}
    if STATE_DIR.is_dir():
        for f in STATE_DIR.glob(f"{PREFIX}*.json"):
            with contextlib.suppress(ValueError, OSError):
                owners[f.stem] = int(json.loads(f.read_text())["pid"])
    listed = [line.split()[0] for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines() if line]
    stale: list[str] = []
    for prefix in {n[: len(PREFIX) + 6] for n in listed if n.startswith(PREFIX)} | set(owners):
        if prefix in owners and procfs.alive(owners[prefix]):
            continue
        _delete_netns([n for n in listed if n.startswith(prefix)])
        with contextlib.suppress(OSError):
            (STATE_DIR / f"{prefix}.json").unlink()
        stale.append(prefix)
    if stale:
        log.warning("removed stale netem labs: %s", ", ".join(sorted(stale)))
    return stale


@dataclass
class NetLab:
    """Builds the topology of `spec` on enter and removes it (and every process in it) on exit."""

    spec: LabSpec
    prefix: str = field(default_factory=lambda: PREFIX + secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    def __enter__(self) -> NetLab:
        if os.geteuid() != 0:
            raise NetLabError("the netem harness needs root (network namespaces, tc)")
        cleanup_stale()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"{self.prefix}.json").write_text(json.dumps({"pid": os.getpid()}))
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- building -----------------------------------------------------------------------
    def _ns(self, name: str) -> str:
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _tbf(self, ns: str, dev: str, rate_mbit: float, burst_bytes: int, *, op: str = "add") -> None:
        _run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "tc",
                "qdisc",
                op,
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{rate_mbit}mbit",
                "burst",
                str(burst_bytes),
                "latency",
                "100ms",
            ]
        )

    def _build(self) -> None:
        s, p = self.spec, self.prefix
        wan = self._ns(f"{p}w")
        _run(["ip", "-n", wan, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", wan, "link", "set", "br0", "up"])
        for d, (dc, names) in enumerate(s.datacenters.items()):
            sw = self._ns(f"{p}d{d}")
            _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", sw, "link", "set", "br0", "up"])
            _run(["ip", "-n", sw, "link", "add", "uplink", "type", "veth", "peer", "name", f"d{d}", "netns", wan])
            _run(["ip", "-n", sw, "link", "set", "uplink", "master", "br0", "up"])
            _run(["ip", "-n", wan, "link", "set", f"d{d}", "master", "br0", "up"])
            self._tbf(sw, "uplink", s.inter_dc_rate_mbit, s.inter_dc_burst_bytes)  # DC -> WAN
            self._tbf(wan, f"d{d}", s.inter_dc_rate_mbit, s.inter_dc_burst_bytes)  # WAN -> DC
            for h, name in enumerate(names):
                if name in self.hosts:
                    raise ValueError(f"host {name!r} appears in two datacenters")
                ns, ip = self._ns(f"{p}h{d}x{h}"), f"10.{s.subnet_octet}.{d + 1}.{h + 1}"
                _run(["ip", "-n", sw, "link", "add", f"h{h}", "type", "veth", "peer", "name", "eth0", "netns", ns])
                _run(["ip", "-n", sw, "link", "set", f"h{h}", "master", "br0", "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0"])
                _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                self._tbf(ns, "eth0", s.host_rate_mbit, s.host_burst_bytes)  # host send
                self._tbf(sw, f"h{h}", s.host_rate_mbit, s.host_burst_bytes)  # host receive
                self.hosts[name] = Host(name, dc, ns, ip)
        log.info("netem lab %s up: %s", p, {h.name: h.ip for h in self.hosts.values()})

    # -- using ----------------------------------------------------------------------------
    def ip(self, host: str) -> str:
        return self.hosts[host].ip

    def spawn(self, host: str, argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside `host`'s namespace (from the repository root unless `cwd` is given);
        it is stopped on exit if still running."""
        popen.setdefault("cwd", REPO_ROOT)
        proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].netns, *argv], **popen)
        self._procs.append(proc)
        return proc

    def _switch_port(self, host: str) -> tuple[str, str]:
        """The namespace and device of `host`'s port on its datacenter's switch (its queue sends to the host)."""
        d, x = self.hosts[host].netns.removeprefix(f"{self.prefix}h").split("x")
        return f"{self.prefix}d{d}", f"h{x}"

    def set_host_rate(self, host: str, rate_mbit: float) -> None:
        """Reshape one host's NIC, both directions, to `rate_mbit` (a slow unit; the spec's rate restores it)."""
        for ns, dev in ((self.hosts[host].netns, "eth0"), self._switch_port(host)):
            self._tbf(ns, dev, rate_mbit, self.spec.host_burst_bytes, op="replace")

    def _queue_bytes(self, ns: str, dev: str) -> int:
        """Bytes the shaping queue of `dev` in `ns` has sent so far."""
        out = _run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev", dev])
        return sum(int(q.get("bytes", 0)) for q in json.loads(out.stdout) if q.get("kind") == "tbf")

    def received_bytes(self, host: str) -> int:
        """Bytes sent so far into `host` (its switch port's egress queue: what the host received)."""
        return self._queue_bytes(*self._switch_port(host))

    def inter_dc_bytes(self) -> int:
        """Bytes sent so far from all datacenters into the WAN (sum over uplink egress queues)."""
        return sum(self._queue_bytes(f"{self.prefix}d{d}", "uplink") for d in range(len(self.spec.datacenters)))

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=3)
        self._procs.clear()
        _delete_netns(list(reversed(self._namespaces)))
        self._namespaces.clear()
        with contextlib.suppress(OSError):
            (STATE_DIR / f"{self.prefix}.json").unlink()
