"""What the fault-injection suite shares: its level, the table it prints, jobs and their books, and the
tools that inject faults into real processes and real links.

    test ──launch (subprocess)──▶ controller, trainer, rollout units (real processes)
      │── inject: SIGKILL a pid · nft: drop a link both ways · nft: redirect a port to a proxy
      │── watch: events.jsonl, metrics.jsonl, the controller's status (a client connection)
      └── record(Row) ──▶ conftest.pytest_terminal_summary prints the table at the end of the run

Level: RLCTL_FAULTS=full (`make faults`) runs every scenario at full size; otherwise (the `integration`
target) a reduced form: fewer kills, the quickest scenarios.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rlctl.agents.appliedlog import unit_rows
from rlctl.launch.jobdir import JobDir
from rlctl.ops.client import connect_client
from rlctl.transport import Connection, Message, auth, framing

REPO = Path(__file__).resolve().parents[2]
RLCTL = [sys.executable, "-m", "rlctl"]
LOCAL = str(REPO / "clusters" / "local.yaml")
FULL = os.environ.get("RLCTL_FAULTS") == "full"
SIGKILL = signal.SIGKILL


def size(reduced: int, full: int) -> int:
    return full if FULL else reduced


# -- the table ----------------------------------------------------------------------------------------
@dataclass
class Row:
    scenario: str
    injections: int
    lost: int
    duplicated: int
    recovery_s: list[float]  # one figure per injection that recovered
    note: str = ""


ROWS: list[Row] = []


def record(row: Row) -> None:
    """Add a scenario's row to the table; every scenario (resumed runs included) must lose and duplicate nothing."""
    assert (row.lost, row.duplicated) == (0, 0), row
    ROWS.append(row)


def table(rows: list[Row]) -> list[str]:
    """The fault table: recovery as median / max over the injections (one figure: that one)."""
    head = ["scenario", "injections", "lost", "duplicated", "recovery s (median / max)", "note"]
    body = []
    for r in rows:
        rec = "-"
        if r.recovery_s:
            med, top = statistics.median(r.recovery_s), max(r.recovery_s)
            digits = 2 if top < 1 else 1
            rec = f"{top:.{digits}f}" if len(r.recovery_s) == 1 else f"{med:.{digits}f} / {top:.{digits}f}"
        body.append([r.scenario, str(r.injections), str(r.lost), str(r.duplicated), rec, r.note])
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    total = sum(r.injections for r in rows)
    level = f"{total} injections; level {'full' if FULL else 'reduced'} (RLCTL_FAULTS=full for the whole suite)"
    return [fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*b) for b in body), level]


# -- jobs ---------------------------------------------------------------------------------------------
def rlctl(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RLCTL, *args], capture_output=True, text=True, timeout=timeout_s)


def launch(*args: str) -> subprocess.Popen[str]:
    """`rlctl launch ARGS` in the background (stdout/stderr to files next to nothing: pipes are read at the end)."""
    return subprocess.Popen([*RLCTL, "launch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written right now
            continue
    return out


def events(job_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    # (one row per unit of a version's `weights_applied` / `weights_skipped`, as the controller wrote them before)
    return [e for e in unit_rows(lines(job_dir / "events.jsonl")) if kind is None or e["event"] == kind]


def metrics_rows(job_dir: Path) -> list[dict[str, Any]]:
    return lines(job_dir / "metrics.jsonl")


def wait_for(
    what: str, cond: Callable[[], Any], timeout_s: float, *, alive: subprocess.Popen[str] | None = None
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            _, err = alive.communicate()
            raise AssertionError(f"the launcher exited ({alive.returncode}) while waiting for {what}:\n{err[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


def joined(job_dir: Path) -> dict[str, dict[str, Any]]:
    """agent → its last agent_joined event (pid, version, datacenter)."""
    return {e["agent"]: e for e in events(job_dir, "agent_joined")}


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: this VM's pid 1 does not always reap orphans at once)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def processes_mentioning(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains `marker` (e.g. a job directory)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes() and pid_alive(int(d.name)):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


class StatusClient:
    """The controller's live status over one client connection (reconnected when it breaks)."""

    def __init__(self, job_dir: Path) -> None:
        self.jobdir = JobDir(job_dir)
        self.conn: Connection | None = None

    def __call__(self, timeout_s: float = 10.0) -> dict[str, Any] | None:
        try:
            if self.conn is None:
                self.conn = connect_client(self.jobdir, timeout_s=timeout_s, name="faults")
            return dict(self.conn.request(Message("status", {}), timeout_s=timeout_s).header)
        except (OSError, ValueError, KeyError, Exception):  # noqa: BLE001 - any failure: no answer this time
            self.close()
            return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[int, dict[str, Any] | None, str]:
    """Wait for a launcher started with `-o json`: (exit code, its summary or None, stderr)."""
    out, err = proc.communicate(timeout=timeout_s)
    try:
        return proc.returncode, json.loads(out), err
    except ValueError:
        return proc.returncode, None, err


def stop_launcher(proc: subprocess.Popen[str]) -> None:
    """SIGTERM a launcher still running (its `finally` stops the job's agents), then make sure it is gone."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


# -- the network: nft rules (the link between the namespaces, a port redirected to a proxy) ------------
NFT_TABLE = "rlctl_faults"


def have_nft() -> bool:
    return shutil.which("nft") is not None


def nft(script: str, *, netns: str | None = None) -> None:
    pre = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*pre, "nft", "-f", "-"], input=script, text=True, check=True, capture_output=True, timeout=30)


def nft_drop_table(*, netns: str | None = None) -> None:
    pre = ["ip", "netns", "exec", netns] if netns else []
    subprocess.run([*pre, "nft", "delete", "table", "inet", NFT_TABLE], capture_output=True, timeout=30)
    subprocess.run([*pre, "nft", "delete", "table", "ip", NFT_TABLE], capture_output=True, timeout=30)


class LinkDown:
    """The inter-DC link dead both ways: every packet arriving over it is dropped by its receiver (silently,
    as a broken link in between would; a drop at the sender's own qdisc is reported to its TCP stack, which
    then gives up on the connection within seconds, unlike a real outage)."""

    def __init__(self, *, dev: str, netns: str, netns_dev: str = "eth0") -> None:
        self.dev, self.netns, self.netns_dev = dev, netns, netns_dev
        self.down_at: float | None = None
        self.up_at: float | None = None

    @staticmethod
    def _rules(dev: str) -> str:
        return (
            f"table inet {NFT_TABLE} {{\n chain linkdown {{\n"
            f'  type filter hook input priority -300; policy accept;\n  iifname "{dev}" drop\n }}\n}}\n'
        )

    def down(self) -> None:
        nft(self._rules(self.dev))
        nft(self._rules(self.netns_dev), netns=self.netns)
        self.down_at = time.monotonic()

    def up(self) -> None:
        nft_drop_table()
        nft_drop_table(netns=self.netns)
        self.up_at = time.monotonic()


PROXY_MARK = 0x2A  # the proxy's own upstream connections carry this mark, so the redirect spares them


class Redirect:
    """New TCP connections to 127.0.0.1:`port` go to 127.0.0.1:`to` instead (nft nat, output hook), except the
    ones marked PROXY_MARK (the proxy's own way to the real port). Connections already open are untouched."""

    def __init__(self, port: int, to: int) -> None:
        self.port, self.to = port, to

    def __enter__(self) -> Redirect:
        nft(
            f"table ip {NFT_TABLE} {{\n chain to_proxy {{\n  type nat hook output priority -100; policy accept;\n"
            f"  ip daddr 127.0.0.1 tcp dport {self.port} meta mark != {PROXY_MARK:#x} redirect to :{self.to}\n"
            " }\n}\n"
        )
        return self

    def __exit__(self, *exc: object) -> None:
        nft_drop_table()


def listening_ports(pid: int) -> set[int]:
    """TCP ports `pid` listens on (its sockets' inodes matched against /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table_ in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table_).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


@dataclass
class Proxy:
    """A TCP proxy on 127.0.0.1 in front of `upstream_port`. `flip` (when set) is called with each connection's
    server → client bytes as they pass and may change them; `silent` makes it a black hole: it accepts and
    never answers nor forwards."""

    upstream_port: int
    flip: Callable[[int, bytearray], None] | None = None
    silent: bool = False
    port: int = 0
    accepted: int = 0
    _sock: socket.socket | None = None
    _held: list[socket.socket] = field(default_factory=list)
    _closing: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Proxy:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        assert self._sock is not None
        self._sock.close()
        for s in self._held:
            s.close()

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closing.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._held.append(client)
            if self.silent:
                continue
            up = socket.socket()
            up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, PROXY_MARK)
            up.connect(("127.0.0.1", self.upstream_port))
            self._held.append(up)
            n = self.accepted
            threading.Thread(target=self._pump, args=(client, up, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, n), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, conn_no: int | None) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                buf = bytearray(data)
                if conn_no is not None and self.flip is not None:
                    self.flip(conn_no, buf)
                dst.sendall(buf)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def skip_without_nft() -> None:
    if not have_nft():
        msg = "nft is not installed: `bash tests/faults/tools.sh` installs it (the faults target runs it)"
        if os.environ.get("RLCTL_REQUIRE_SERVICES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


class ChunkFlip:
    """For a Proxy in front of a weight node: flips one bit in the middle of the first `chunk` frame of every other
    connection (server → client: connections 1, 3, 5, …), `connections` flips in all, so the bytes still frame
    correctly and only the frames' tag (and the chunk's checksum behind it) can tell; the connection after a
    flipped one goes through untouched, so every flipped fetch can complete on its next attempt. Records
    (connection, version, chunk index, time) of every flip."""

    # server → client before the first message: "RLH1" + nonce, the verdict ("OK" + proof), the connection token
    HANDSHAKE_BYTES = auth.ServerHandshake.HELLO_BYTES + auth.VERDICT_BYTES + 16

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self.flips: list[tuple[int, int, int, float]] = []
        self._streams: dict[int, _Stream] = {}

    def __call__(self, conn_no: int, piece: bytearray) -> None:
        st = self._streams.setdefault(conn_no, _Stream(self.HANDSHAKE_BYTES))
        start = st.seen
        st.seen += len(piece)
        if conn_no > 2 * self.connections - 1 or conn_no % 2 == 0 or st.flipped:
            return
        if st.target is None:
            st.buf += piece
            st.find_chunk()
        if st.target is not None and start <= st.target < st.seen:
            piece[st.target - start] ^= 0x10
            st.flipped = True
            self.flips.append((conn_no, st.version, st.index, time.time()))


@dataclass
class _Stream:
    pos: int  # where the next message starts (absolute offset in the stream)
    seen: int = 0
    buf: bytearray = field(default_factory=bytearray)
    target: int | None = None  # the absolute offset of the byte to flip
    version: int = -1
    index: int = -1
    flipped: bool = False

    def find_chunk(self) -> None:
        limits = framing.Limits()
        while len(self.buf) >= self.pos + framing.PREAMBLE.size:
            n = framing.parse_preamble(bytes(self.buf[self.pos : self.pos + framing.PREAMBLE.size]), limits, "proxy")
            body = self.pos + framing.PREAMBLE.size
            if len(self.buf) < body + n:
                return
            wh, specs = framing.decode_header(bytes(self.buf[body : body + n]), limits, "proxy")
            frames = body + n + auth.TAG_BYTES  # after the header's tag
            if wh.kind == "chunk" and specs and specs[0].nbytes:
                self.target = frames + specs[0].nbytes // 2
                self.version, self.index = int(wh.header["version"]), int(wh.header["index"])
                return
            frame_bytes = sum(s.nbytes for s in specs)
            self.pos = frames + frame_bytes + (auth.TAG_BYTES if frame_bytes else 0)  # the frames' tag, if any
