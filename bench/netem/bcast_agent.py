"""A stand-alone weight-plane process driven over stdin/stdout, for tests, benchmarks and netns labs.

    python -m bench.netem.bcast_agent --listen tcp://10.0.0.1:0 [--chunk-bytes N] [--pace-bytes-per-s R]
        [--anchor-every K] [--keep-versions N]

stdin, one JSON command per line:
    {"cmd": "publish", "version": 1, "bytes": 268435456, "seed": 0, "change_frac": 0.02, "anchor": false}
    {"cmd": "fetch", "version": 1, "holders": ["tcp://...", ...], "want_full": false, "newer_ok": false}
    {"cmd": "served"}                      (what this node has served its children so far)
    {"cmd": "quit"}
stdout, one JSON event per line:
    {"event": "listening", "address": ...}
    {"event": "published" | "current", "version": v, "xxh3": x, "seconds": s, "encoding": e, ...}
        ("current" adds received_encoding and received_bytes: what the fetch took off the wire)
    {"event": "served", "served": [[version, encoding, base_version, child, bytes], ...]}
    {"event": "progress", "version": v, "chunks": n, "of": m}      (receivers, as chunks land)
    {"event": "error", "error": "..."}
The per-job secret comes from the environment (RLCTL_JOB_SECRET, hex). The process keeps
serving its children until it reads "quit" or stdin closes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

import torch

from rlctl.errors import RlctlError
from rlctl.transport import make_transport
from rlctl.weights.node import WeightNode
from rlctl.weights.versions import WeightSyncConfig

SECRET_ENV = "RLCTL_JOB_SECRET"


def synthetic_weights(total_bytes: int, *, version: int, seed: int, change_frac: float) -> dict[str, torch.Tensor]:
    """bf16 'layers' of total_bytes; each version flips the low mantissa bits of a change_frac subset."""
    g = torch.Generator().manual_seed(seed)
    n = total_bytes // 2
    layer = max(1, min(n, 4 << 20))
    w = (torch.randn(n, generator=g) * 0.02).to(torch.bfloat16)
    bits = w.view(torch.int16)
    for v in range(2, version + 1):
        gv = torch.Generator().manual_seed(seed * 1000 + v)
        # unique: with repeated indices an in-place indexed update is not deterministic
        idx = torch.unique(torch.randint(0, n, (int(n * change_frac),), generator=gv))
        bits[idx] ^= torch.randint(1, 4, (idx.numel(),), generator=gv, dtype=torch.int16)
    return {f"layer{i}": w[i : i + layer] for i in range(0, n, layer)}


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _watch(node: WeightNode, version: int, stop: threading.Event) -> None:
    last = -1
    while not stop.wait(0.02):
        hv = node.store.versions.get(version)
        if hv is None:
            continue
        n = sum(p.num_have for p in hv.payloads.values())
        if n != last:
            last = n
            _emit("progress", version=version, chunks=n, of=sum(len(p.refs) for p in hv.payloads.values()))


class AgentProcess:
    """Drives one agent process (started by the caller, e.g. NetLab.spawn) over its pipes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None and proc.stdout is not None, "start it with stdin/stdout=PIPE, text=True"
        self.proc = proc
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.address = str(self.wait("listening", timeout_s=60)["address"])

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._events.put(json.loads(line))
        self._events.put({"event": "exited", "returncode": self.proc.wait()})

    def command(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def wait(self, *events: str, timeout_s: float = 300) -> dict[str, Any]:
        """Next event among `events` (skipping others); an "error" or exit raises RlctlError."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ev = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RlctlError(f"agent {self.proc.pid}: no {'/'.join(events)} within {timeout_s}s") from None
            if ev["event"] in events:
                return ev
            if ev["event"] in ("error", "exited"):
                raise RlctlError(f"agent {self.proc.pid}: {ev}")

    def quit(self) -> None:
        if self.proc.poll() is None:
            self.command(cmd="quit")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def agent_argv(listen: str, **options: Any) -> list[str]:
    """Command line of an agent; options are the long flags without dashes (chunk_bytes=...)."""
    argv = [sys.executable, "-m", "bench.netem.bcast_agent", "--listen", listen]
    for k, v in options.items():
        if v is not None:
            argv += [f"--{k.replace('_', '-')}", str(v)]
    return argv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.netem.bcast_agent")
    ap.add_argument("--listen", required=True)
    ap.add_argument("--chunk-bytes", type=int, default=WeightSyncConfig.chunk_bytes)
    ap.add_argument("--pace-bytes-per-s", type=float, default=None)
    ap.add_argument("--chunk-timeout-s", type=float, default=WeightSyncConfig.chunk_timeout_s)
    ap.add_argument("--anchor-every", type=int, default=None, help="periodic full anchors (default: on demand)")
    ap.add_argument("--keep-versions", type=int, default=WeightSyncConfig.keep_versions)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = WeightSyncConfig(
        chunk_bytes=args.chunk_bytes,
        bucket_bytes=max(args.chunk_bytes, WeightSyncConfig.bucket_bytes),
        send_bytes_per_s=args.pace_bytes_per_s,
        chunk_timeout_s=args.chunk_timeout_s,
        anchor_every=args.anchor_every,
        keep_versions=args.keep_versions,
    )
    transport = make_transport("tcp", secret=bytes.fromhex(os.environ[SECRET_ENV]))
    with WeightNode(transport, args.listen, cfg) as node:
        _emit("listening", address=node.address)
        for line in sys.stdin:
            cmd = json.loads(line)
            t0 = time.perf_counter()
            try:
                if cmd["cmd"] == "quit":
                    break
                if cmd["cmd"] == "publish":
                    sd = synthetic_weights(
                        cmd["bytes"],
                        version=cmd["version"],
                        seed=cmd.get("seed", 0),
                        change_frac=cmd.get("change_frac", 0.02),
                    )
                    hv = node.publish(cmd["version"], sd, anchor=cmd.get("anchor", False))
                    _emit(
                        "published",
                        version=hv.version,
                        xxh3=hv.weights_xxh3,
                        seconds=time.perf_counter() - t0,
                        encoding=sorted(hv.payloads),
                        payload_bytes={k: p.data.numel() for k, p in hv.payloads.items()},
                    )
                elif cmd["cmd"] == "fetch":
                    stop = threading.Event()
                    threading.Thread(target=_watch, args=(node, cmd["version"], stop), daemon=True).start()
                    try:
                        hv = node.fetch(
                            cmd["version"],
                            cmd["holders"],
                            want_full=cmd.get("want_full", False),
                            newer_ok=cmd.get("newer_ok", False),
                        )
                    finally:
                        stop.set()
                    tried = [[a, r] for v, a, r in node.attempts if v == hv.version]
                    _emit(
                        "current",
                        version=hv.version,
                        xxh3=hv.weights_xxh3,
                        seconds=time.perf_counter() - t0,
                        encoding=sorted(hv.payloads),
                        received_encoding=hv.received_encoding,
                        received_bytes=hv.received_bytes,
                        attempts=tried,
                    )
                elif cmd["cmd"] == "served":
                    _emit("served", served=[dataclasses.astuple(s) for s in node.served])
            except RlctlError as e:
                _emit("error", error=str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
