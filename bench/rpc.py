"""Tensor RPC over loopback: rlctl tcp vs a raw socket loop vs pickle over multiprocessing.connection.

One 256 MiB tensor (64 MiB with --quick) is sent from this process to a server process, which
acknowledges with one small message; time = send start → ack received, best of `repeats`, the
methods taking turns (raw, rlctl, …, raw, rlctl, …) so that all of them see the same load on
this shared machine.

- raw:     `sendall` of the tensor's memoryview / `recv_into` a preallocated buffer (the practical limit);
- rlctl:   `Connection.send(Message(..., [tensor]))`; the server receives into a preallocated
           tensor (`recv(into=...)`, how the weight plane receives) and, separately, into fresh
           tensors (the default; page faults of a new 256 MiB buffer included);
- rlctl 2 streams: `TcpConfig(num_streams=2)`, the tensor striped over two sockets;
- rlctl untagged: the same framing on a connection without keys (no handshake, no per-message tags):
           `auth_overhead` = rlctl / untagged − 1, the cost of authenticating every message (`transport/auth.py`);
- rlctl encrypted: `transport.encrypt` (`TcpConfig(encrypt=True)`: frames AES-256-GCM): `encrypt_overhead` =
           encrypted / rlctl − 1;
- pickle:  `pickle.dumps(tensor)` sent with `multiprocessing.connection` `send_bytes`, `pickle.loads` on
           receipt (plain `send(tensor)` would pass a shared-memory handle, not bytes).

Small messages: request/reply round trips per second with a 1-field header and no tensors,
rlctl (authenticated, untagged, encrypted) vs multiprocessing.connection, in blocks of `ROUND_TRIP_BLOCK`
round trips, the methods taking turns (the order rotating each round), the median block per method: the
load on this shared machine drifts within seconds, and one method timed after another measured it, not the
method (`auth_overhead_round_trips` = untagged / authenticated − 1 came out −0.28 so). When ucxx is installed,
the rlctl ucx transport is measured too, alone (UCX_TLS=tcp over loopback; 2 repeats, it is slow on this machine).
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import pickle
import socket
import statistics
import time
from multiprocessing.connection import Client, Listener
from typing import Any

import torch

from rlctl.transport import Connection, Message, TcpConfig, TcpTransport, TensorSpec, make_transport, tcp
from rlctl.transport.framing import tensor_bytes

SECRET = b"bench-rpc-secret"
ROUND_TRIP_BLOCK = 100  # small-message round trips a method makes in one turn
RPS_METHODS = ("rlctl", "rlctl_untagged", "rlctl_encrypted", "pickle")  # the round-trip rates `run` reports
UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_TCP_CM_REUSEADDR": "y", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def _raw_server(port_q: Any, nbytes: int, repeats: int) -> None:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port_q.put(ls.getsockname()[1])
    conn, _ = ls.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = torch.empty(nbytes, dtype=torch.uint8)
    view = tensor_bytes(buf)
    for _ in range(repeats):
        got = 0
        while got < nbytes:
            got += conn.recv_into(view[got:])
        conn.sendall(b"k")
    conn.close()


def _rlctl_server(
    port_q: Any,
    nbytes: int,
    repeats: int,
    preallocated: bool,
    kind: str = "tcp",
    tagged: bool = True,
    encrypt: bool = False,
) -> None:
    torch.set_num_threads(1)
    lst: Any
    if tagged:
        lst = make_transport(kind, secret=SECRET, encrypt=encrypt).listen(f"{kind}://127.0.0.1:0")
        port_q.put(lst.address)
        conn = lst.accept()
    else:  # the framing alone: no handshake, no tags (the baseline of `auth_overhead`)
        lst = socket.create_server(("127.0.0.1", 0))
        port_q.put(f"tcp://127.0.0.1:{lst.getsockname()[1]}")
        sock, _ = lst.accept()
        tcp._tune(sock, TcpConfig())
        conn = tcp.TcpConnection(sock, "bench-client", TcpConfig())
    buf = torch.empty(nbytes, dtype=torch.uint8)

    def into(kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
        return [buf]

    for _ in range(repeats):
        msg = conn.recv(into=into if preallocated else None)
        conn.reply(msg, Message("ack"))
    while True:  # small-message round trips until the client closes
        try:
            msg = conn.recv()
        except Exception:  # noqa: BLE001 - the client closing ends the benchmark
            break
        conn.reply(msg, Message("pong", {"i": msg.header["i"]}))
    lst.close()


def _pickle_server(port_q: Any, repeats: int) -> None:
    with Listener(("127.0.0.1", 0), authkey=SECRET) as lst:
        port_q.put(lst.address)
        with lst.accept() as conn:
            for _ in range(repeats):
                pickle.loads(conn.recv_bytes())
                conn.send_bytes(b"k")
            while True:
                try:
                    i = conn.recv()
                except EOFError:
                    break
                conn.send(i)


def _start(target: Any, *args: Any) -> tuple[Any, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(q, *args), daemon=True)
    p.start()
    return p, q.get(timeout=60)


class _Raw:
    """Plain socket: one `sendall` of the whole buffer or of 4 MiB slices (alternating), `recv_into`."""

    def __init__(self, t: torch.Tensor, repeats: int) -> None:
        self.proc, port = _start(_raw_server, t.numel(), repeats)
        self.sock = socket.create_connection(("127.0.0.1", port))
        # as rlctl does: without it Nagle + delayed ACK can hold the last segment for ~40 ms
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.view = tensor_bytes(t)
        self.count = 0

    def once(self) -> float:
        t0 = time.perf_counter()
        if self.count % 2:
            for off in range(0, len(self.view), 4 << 20):
                self.sock.sendall(self.view[off : off + (4 << 20)])
        else:
            self.sock.sendall(self.view)
        self.sock.recv(1)
        self.count += 1
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sock.close()
        self.proc.join(30)


class _Rlctl:
    def __init__(
        self,
        t: torch.Tensor,
        repeats: int,
        *,
        preallocated: bool,
        kind: str = "tcp",
        streams: int = 1,
        tagged: bool = True,
        encrypt: bool = False,
    ) -> None:
        self.proc, addr = _start(_rlctl_server, t.numel(), repeats, preallocated, kind, tagged, encrypt)
        if not tagged:
            sock = socket.create_connection(("127.0.0.1", int(addr.rsplit(":", 1)[1])))
            tcp._tune(sock, TcpConfig())
            self.conn: Connection = tcp.TcpConnection(sock, addr, TcpConfig())
        elif kind == "tcp":
            cfg = TcpConfig(num_streams=streams, encrypt=encrypt)
            self.conn = TcpTransport(secret=SECRET, config=cfg).connect(addr, timeout_s=30)
        else:
            self.conn = make_transport(kind, secret=SECRET).connect(addr, timeout_s=30)
        self.t, self.pings = t, 0

    def once(self) -> float:
        t0 = time.perf_counter()
        self.conn.request(Message("tensor", {"name": "w"}, [self.t]), timeout_s=120)
        return time.perf_counter() - t0

    def round_trips(self, n: int) -> float:
        """Seconds for `n` small-message round trips."""
        t0 = time.perf_counter()
        for i in range(self.pings, self.pings + n):
            self.conn.request(Message("ping", {"i": i}), timeout_s=30)
        self.pings += n
        return time.perf_counter() - t0

    def close(self) -> None:
        self.conn.close()
        self.proc.join(30)


class _Pickle:
    def __init__(self, t: torch.Tensor, repeats: int) -> None:
        self.proc, addr = _start(_pickle_server, repeats)
        self.conn = Client(addr, authkey=SECRET)
        self.t = t

    def once(self) -> float:
        t0 = time.perf_counter()
        # pickle explicitly: Connection.send(tensor) would use torch's ForkingPickler reduction,
        # which passes a shared-memory handle instead of bytes (same-host only, not a wire format)
        self.conn.send_bytes(pickle.dumps(self.t, protocol=pickle.HIGHEST_PROTOCOL))
        self.conn.recv_bytes()
        return time.perf_counter() - t0

    def round_trips(self, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            self.conn.send(i)
            self.conn.recv()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.conn.close()
        self.proc.join(30)


def _best_interleaved(methods: dict[str, Any], repeats: int) -> dict[str, float]:
    """Best time per method, the methods taking turns so that they see the same machine load."""
    best = dict.fromkeys(methods, float("inf"))
    for _ in range(repeats):
        for name, m in methods.items():
            best[name] = min(best[name], m.once())
    return best


def _round_trips_interleaved(methods: dict[str, Any], round_trips: int) -> dict[str, float]:
    """Small-message round trips per second per method: blocks of `ROUND_TRIP_BLOCK` (`round_trips` in all per
    method), the methods taking turns and the first of each turn rotating, the median block's rate."""
    block = min(ROUND_TRIP_BLOCK, round_trips)
    names = list(methods)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(max(1, round_trips // block)):
        k = turn % len(names)
        for name in names[k:] + names[:k]:
            rates[name].append(block / methods[name].round_trips(block))
    return {name: statistics.median(r) for name, r in rates.items()}


def run(*, quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    nbytes = (64 if quick else 256) << 20
    repeats, round_trips = (3, 2000) if quick else (9, 10000)
    t = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    methods: dict[str, Any] = {
        "raw": _Raw(t, repeats),
        "rlctl": _Rlctl(t, repeats, preallocated=True),
        "rlctl_untagged": _Rlctl(t, repeats, preallocated=True, tagged=False),
        "rlctl_fresh": _Rlctl(t, repeats, preallocated=False),
        "rlctl_2_streams": _Rlctl(t, repeats, preallocated=True, streams=2),
        "pickle": _Pickle(t, repeats),
        "rlctl_encrypted": _Rlctl(t, repeats, preallocated=True, encrypt=True),
    }
    best = _best_interleaved(methods, repeats)
    rps = _round_trips_interleaved({k: methods[k] for k in RPS_METHODS}, round_trips)
    for m in methods.values():
        m.close()
    raw_s, rl_s, untagged_s, rl_fresh_s, rl2_s, pk_s, enc_s = (best[k] for k in methods)
    rl_rps, untagged_rps, pk_rps = rps["rlctl"], rps["rlctl_untagged"], rps["pickle"]
    gb = nbytes / 1e9
    ucx: dict[str, Any] | str = "not measured: ucxx is not installed (pip install 'rlctl[ucx]')"
    if importlib.util.find_spec("ucxx") is not None:
        for key, value in UCX_ENV.items():  # read by UCX at its first use, here and in the spawned server
            os.environ.setdefault(key, value)
        u = _Rlctl(t, 2, preallocated=True, kind="ucx")
        ucx_s = min(u.once(), u.once())
        ucx_rps = round_trips // 10 / u.round_trips(round_trips // 10)
        u.close()
        ucx = {
            "env": {k: os.environ[k] for k in UCX_ENV},
            "gb_per_s": gb / ucx_s,
            "ratio_vs_raw": raw_s / ucx_s,
            "round_trips_per_s": ucx_rps,
        }
    return {
        "bytes": nbytes,
        "raw_gb_per_s": gb / raw_s,
        "rlctl_tcp_gb_per_s": gb / rl_s,
        "rlctl_tcp_fresh_buffer_gb_per_s": gb / rl_fresh_s,
        "pickle_gb_per_s": gb / pk_s,
        "ratio_vs_raw": raw_s / rl_s,
        "ratio_vs_raw_fresh_buffer": raw_s / rl_fresh_s,
        "rlctl_tcp_2_streams_gb_per_s": gb / rl2_s,
        "ratio_vs_raw_2_streams": raw_s / rl2_s,
        "ratio_vs_pickle": pk_s / rl_s,
        # what tagging every message costs (auth.py): the authenticated path over the same framing without tags
        "rlctl_tcp_untagged_gb_per_s": gb / untagged_s,
        "auth_overhead": rl_s / untagged_s - 1,
        "rlctl_round_trips_per_s": rl_rps,
        "rlctl_untagged_round_trips_per_s": untagged_rps,
        "auth_overhead_round_trips": untagged_rps / rl_rps - 1,
        # `transport.encrypt` (frames AES-256-GCM): against the authenticated path and the framing alone
        "rlctl_tcp_encrypted_gb_per_s": gb / enc_s,
        "encrypt_overhead": enc_s / rl_s - 1,
        "encrypt_overhead_vs_untagged": enc_s / untagged_s - 1,
        "rlctl_encrypted_round_trips_per_s": rps["rlctl_encrypted"],
        "pickle_round_trips_per_s": pk_rps,
        "ucx": ucx,
    }


def auth_costs(*, nbytes: int = 256 << 20, repeats: int = 7, round_trips: int = 5000) -> dict[str, Any]:
    """What authenticating and encrypting cost, alone (the GPU check runs it where there are cores to spare):
    the framing without keys, authenticated and encrypted, taking turns (the tensors and, in blocks, the small
    round trips); `auth_overhead` and `encrypt_overhead` as in `run`, and the machine's CPU count beside them."""
    torch.set_num_threads(1)
    t = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    methods: dict[str, Any] = {
        "untagged": _Rlctl(t, repeats, preallocated=True, tagged=False),
        "tagged": _Rlctl(t, repeats, preallocated=True),
        "encrypted": _Rlctl(t, repeats, preallocated=True, encrypt=True),
    }
    best = _best_interleaved(methods, repeats)
    rps = _round_trips_interleaved(methods, round_trips)
    for m in methods.values():
        m.close()
    gb = nbytes / 1e9
    return {
        "cpus": os.cpu_count(),
        "bytes": nbytes,
        "untagged_gb_per_s": round(gb / best["untagged"], 3),
        "tagged_gb_per_s": round(gb / best["tagged"], 3),
        "encrypted_gb_per_s": round(gb / best["encrypted"], 3),
        "auth_overhead": round(best["tagged"] / best["untagged"] - 1, 4),
        "encrypt_overhead": round(best["encrypted"] / best["tagged"] - 1, 4),
        "auth_overhead_round_trips": round(rps["untagged"] / rps["tagged"] - 1, 4),
        "round_trips_per_s": {k: round(v) for k, v in rps.items()},
    }


def summary(result: dict[str, Any]) -> str:
    r = result
    u = r["ucx"]
    ucx_line = (
        f"  ucx ({u['env']['UCX_TLS']}): {u['gb_per_s']:.2f} GB/s, ratio_vs_raw {u['ratio_vs_raw']:.3f}, "
        f"{u['round_trips_per_s']:.0f} round trips/s"
        if isinstance(u, dict)
        else f"  ucx: {u}"
    )
    return (
        f"{r['bytes'] / 2**20:.0f} MiB over loopback: raw {r['raw_gb_per_s']:.2f} GB/s, "
        f"rlctl tcp {r['rlctl_tcp_gb_per_s']:.2f} GB/s (fresh buffer {r['rlctl_tcp_fresh_buffer_gb_per_s']:.2f}), "
        f"pickle {r['pickle_gb_per_s']:.2f} GB/s\n"
        f"  ratio_vs_raw {r['ratio_vs_raw']:.3f} (fresh buffer {r['ratio_vs_raw_fresh_buffer']:.3f}, "
        f"2 streams {r['ratio_vs_raw_2_streams']:.3f}), "
        f"ratio_vs_pickle {r['ratio_vs_pickle']:.2f}\n"
        f"  small round trips/s: rlctl {r['rlctl_round_trips_per_s']:.0f}, pickle {r['pickle_round_trips_per_s']:.0f}\n"
        f"  auth_overhead {r['auth_overhead']:.3f} (untagged {r['rlctl_tcp_untagged_gb_per_s']:.2f} GB/s), "
        f"{r['auth_overhead_round_trips']:.3f} on small round trips "
        f"(untagged {r['rlctl_untagged_round_trips_per_s']:.0f}/s)\n"
        f"  encrypted {r['rlctl_tcp_encrypted_gb_per_s']:.2f} GB/s: encrypt_overhead {r['encrypt_overhead']:.3f} over "
        f"the authenticated path ({r['encrypt_overhead_vs_untagged']:.3f} over the framing alone), "
        f"{r['rlctl_encrypted_round_trips_per_s']:.0f} round trips/s\n" + ucx_line
    )
