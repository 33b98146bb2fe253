"""An agent-like program for the launch-backend integration tests (not a test module).

    agent_prog.py OUT_DIR MODE MARKER [EXIT_CODE]
    MODE run    : heartbeat file OUT_DIR/hb.<rank> every 0.2 s; on SIGTERM write graceful.<rank>, exit 0
    MODE ignore : the same, but SIGTERM is ignored (forces the backend to SIGKILL / scancel)
    MODE exit   : write hb.<rank> once, then exit with EXIT_CODE
MARKER is only there so the tests can find leftover processes by their command line.
rank = $SLURM_PROCID (0 outside SLURM); the node name ($SLURMD_NODENAME or hostname) goes in the heartbeat.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    rank = os.environ.get("SLURM_PROCID", "0")
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())

    def beat() -> None:
        tmp = out / f".hb.{rank}.tmp"
        tmp.write_text(json.dumps({"rank": int(rank), "node": node, "pid": os.getpid(), "t": time.time()}))
        tmp.rename(out / f"hb.{rank}")

    def on_term(signum: int, frame: object) -> None:
        if mode == "ignore":
            return
        (out / f"graceful.{rank}").write_text("graceful\n")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    out.mkdir(parents=True, exist_ok=True)
    beat()
    if mode == "exit":
        sys.exit(int(sys.argv[4]))
    while True:
        time.sleep(0.2)
        beat()


if __name__ == "__main__":
    main()
