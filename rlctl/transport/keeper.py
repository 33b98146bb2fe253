"""A socket keeper: a small process that holds a duplicate of a connection's sockets, so that when its owner dies
(SIGKILL, the OOM killer, a crash) the stream still ends in order — everything the owner wrote is delivered, then
end-of-stream — instead of in a reset that throws away what the owner's kernel had not sent yet.

    owner process ──writes──▶ socket ◀──dup── keeper (blocked reading a pipe only the owner holds open)
    owner dies  ──▶ pipe EOF ──▶ keeper: shutdown(WR) (FIN after the queued bytes), drain until the peer closes

Why: when a process dies, the kernel closes its sockets, and a socket closed with unread bytes in its receive
queue (a ping just in) ends in a reset, which drops the unsent part of its send queue. A rollout unit reports its
generations' progress after every few decode steps; the controller can bound what a lost unit had generated
unreported by that step count only if every report the unit wrote arrived (`ControllerCore._interrupted`). The
keeper holds the socket open past the owner's death, so no close with unread bytes happens until it has sent FIN.

The owner's own close (`TcpConnection.close`) shuts the sockets down, which ends the stream at once whoever
holds a duplicate; it then closes the pipe, and the keeper exits.

Run as a script by its path, not as a module: it imports only the standard library (the package would import
torch), and starts in tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

LINGER_S = 30.0  # after the owner is gone, how long the keeper waits for the peer to close its end


def keep(socks: list[socket.socket]) -> int:
    """Start a keeper holding `socks`; returns the pipe's write end, which the owner holds open while it lives
    (non-inheritable: another child of the owner does not hold it) and closes to let the keeper go."""
    read_end, write_end = os.pipe()
    fds = [s.fileno() for s in socks]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__)), str(read_end), *map(str, fds)],
            pass_fds=(read_end, *fds),
            # not the owner's stdio: an SSH channel stays open while any process holds its pipes
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    threading.Thread(target=proc.wait, name="keeper-reaper", daemon=True).start()  # no zombie once it ends
    return write_end


def _main(argv: list[str]) -> None:
    pipe, fds = int(argv[1]), [int(a) for a in argv[2:]]
    socks = [socket.socket(fileno=fd) for fd in fds]
    with contextlib.suppress(OSError):
        while os.read(pipe, 64):  # nothing is ever written: EOF when the owner closed it or died
            pass
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_WR)  # FIN, after every byte the owner queued
    # read (and drop) what the peer still sends until it closes its end, so that closing here sends no reset
    deadline = time.monotonic() + LINGER_S
    for s in socks:
        with contextlib.suppress(OSError):
            while (left := deadline - time.monotonic()) > 0:
                s.settimeout(left)
                if not s.recv(1 << 16):
                    break
        s.close()


if __name__ == "__main__":
    _main(sys.argv)
