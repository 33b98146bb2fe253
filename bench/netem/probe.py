"""Plain-TCP goodput probe between two lab hosts (the yardstick links are compared against).

    python -m bench.netem.probe recv IP PORT          # prints {"bytes": n, "seconds": s} when the sender is done
    python -m bench.netem.probe send IP PORT NBYTES

The receiver times from the first to the last byte, so connection setup is not counted.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from bench.netem.lab import NetLab


def _recv(ip: str, port: int) -> None:
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((ip, port))
    ls.listen(1)
    print("ready", flush=True)
    conn, _ = ls.accept()
    buf = memoryview(bytearray(4 << 20))
    n, t0 = 0, 0.0
    while k := conn.recv_into(buf):
        if n == 0:
            t0 = time.perf_counter()
        n += k
    print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0}), flush=True)


def _send(ip: str, port: int, nbytes: int) -> None:
    s = socket.create_connection((ip, port), timeout=30)
    block = memoryview(bytearray(1 << 20))
    for off in range(0, nbytes, len(block)):
        s.sendall(block[: min(len(block), nbytes - off)])
    s.close()


def measure_goodput(lab: NetLab, src: str, dst: str, nbytes: int, *, port: int = 5999) -> float:
    """TCP goodput (bytes/s) from host `src` to host `dst` inside `lab`."""
    rx = lab.spawn(
        dst,
        [sys.executable, "-m", "bench.netem.probe", "recv", lab.ip(dst), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rx.stdout is not None
    rx.stdout.readline()
    tx = lab.spawn(src, [sys.executable, "-m", "bench.netem.probe", "send", lab.ip(dst), str(port), str(nbytes)])
    tx.wait(timeout=600)
    res = json.loads(rx.stdout.readline())
    rx.wait(timeout=30)
    return float(res["bytes"]) / float(res["seconds"])


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        _recv(sys.argv[2], int(sys.argv[3]))
    else:
        _send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
