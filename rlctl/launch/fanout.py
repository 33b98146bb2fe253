"""Staging inside a site: the job's large files cross the link to the site once and fan out from host to host.

    operator ──SFTP (the inter-DC link, once)──▶ seed host: <file>.part ─▶ <file>
                                                  │ `python -m rlctl.launch.fanout serve` (job secret, tcp)
                              ┌───────────────────┴───────────────────┐
       host 2: `fanout fetch` (byte ranges as they land)       host 3: `fanout fetch` …

The seed serves each file's bytes as they arrive in its `.part` (so the other hosts fetch while the link copy
runs: the site's wall time is the link's, not link + fan-out), or from the whole file once renamed. A fetch
writes `<file>.part`, goes on from the bytes an earlier cut-short fetch left there, computes the SHA-256 as it
writes and renames the file once whole; its report (one JSON line per file) is what the operator verifies.
Deadlines follow progress: the server answers a range once its bytes are there, and gives up on a file whose
`.part` has not grown for `stall_s`.

    python -m rlctl.launch.fanout serve ROOT --advertise HOST          (stdout: {"listening": ADDR}; until stdin ends)
    python -m rlctl.launch.fanout fetch ROOT --source ADDR             (stdin: [[path, size, sha256, mode], ...])

Both read the job's secret from ROOT/secret (staged first, straight to every host), and encrypt their traffic
when ROOT/job.json says `transport.encrypt` (also staged first). See docs/launch.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from rlctl.errors import PeerTimeout, PeerUnreachable, RlctlError
from rlctl.launch.jobdir import JobDir
from rlctl.transport import Connection, Message, TensorSpec, make_transport

log = logging.getLogger(__name__)

PART_SUFFIX = ".part"  # as rlctl.launch.sshrunner writes it
CHUNK_BYTES = 8 << 20
STALL_S = 120.0  # a file whose bytes have not grown for this long: the fetch of it fails
POLL_S = 0.02
PROGRESS_EVERY_BYTES = 64 << 20  # a fetch's progress line at most every this many bytes


class FanoutError(RlctlError):
    """A fan-out fetch failed (the seed gave up on a file, a connection broke, the bytes did not verify)."""


def safe_path(root: Path, rel: str) -> Path:
    """`root/rel` for a relative path with no `..` (a peer's request names files inside the job dir only)."""
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise FanoutError(f"{rel!r}: not a path inside the job dir")
    return root / p


def part_of(path: Path) -> Path:
    """Where the bytes of `path` land until it is whole."""
    return path.parent / (path.name + PART_SUFFIX)


def available(path: Path, size: int) -> int:
    """How many of the file's `size` bytes can be read now: all once the whole file is there, else what its
    `.part` holds (0 when neither is there, or the `.part` is longer than the file: an older copy's)."""
    try:
        if path.stat().st_size == size:
            return size
    except FileNotFoundError:
        pass
    try:
        n = part_of(path).stat().st_size
    except FileNotFoundError:
        return 0
    return n if n <= size else 0


def read_range(path: Path, offset: int, length: int, size: int) -> bytes:
    """Bytes [offset, offset + length) of the file once whole (its size is `size`), else of its `.part`."""
    for p, whole in ((path, True), (part_of(path), False)):
        try:
            with p.open("rb") as f:
                n = os.fstat(f.fileno()).st_size
                if (n != size) if whole else (n < min(offset + length, size)):
                    continue
                f.seek(offset)
                data = f.read(length)
        except FileNotFoundError:
            continue
        if data:
            return data
    raise FanoutError(f"{path}: bytes {offset}+{length} went away (the copy restarted)")


class Server:
    """Serves byte ranges of the files under `root` to authenticated peers, one thread per connection."""

    def __init__(
        self, root: Path, secret: bytes, listen: str, *, stall_s: float = STALL_S, encrypt: bool = False
    ) -> None:
        self.root, self.stall_s = root, stall_s
        self._listener = make_transport("tcp", secret=secret, encrypt=encrypt).listen(listen)
        self.address = self._listener.address
        self._stop = threading.Event()
        self.served = 0
        self.failed = ""  # why the listener ended, when it did before `stop()`
        self._lock = threading.Lock()

    def serve(self) -> None:
        """Accept until `stop()`."""
        while not self._stop.is_set():
            try:
                conn = self._listener.accept(timeout_s=0.2)
            except PeerTimeout:
                continue
            except PeerUnreachable as e:  # the listener itself is gone: nothing more can connect
                if not self._stop.is_set():
                    log.error("fanout: the listener failed: %s", e)
                    self.failed = str(e)
                return
            except RlctlError as e:  # a peer without the secret: one line, go on
                if self._stop.is_set():
                    return
                log.warning("fanout: refused a connection: %s", e)
                continue
            threading.Thread(target=self._one, args=(conn,), name="fanout-peer", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()

    def _one(self, conn: Connection) -> None:
        with conn:
            while not self._stop.is_set():
                try:
                    req = conn.recv(timeout_s=1.0)
                except PeerTimeout:
                    continue
                except PeerUnreachable:
                    return
                try:
                    data = self._range(req.header)
                except (FanoutError, OSError, KeyError, TypeError, ValueError) as e:
                    try:
                        conn.reply(req, Message("error", {"error": str(e)}))
                    except PeerUnreachable:
                        return
                    continue
                with self._lock:
                    self.served += len(data)
                frame = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                try:
                    conn.reply(req, Message("data", {"n": len(data)}, [frame]))
                except PeerUnreachable:
                    return

    def _range(self, h: dict[str, Any]) -> bytes:
        path = safe_path(self.root, str(h["path"]))
        offset, length, size = int(h["offset"]), int(h["length"]), int(h["size"])
        if not 0 <= offset < size or length <= 0:
            raise FanoutError(f"{h['path']}: bad range {offset}+{length} of {size}")
        seen, since = -1, time.monotonic()
        part = part_of(path)
        while True:  # the range's first byte there, or the file stalled
            n = available(path, size)
            if n > offset:
                try:
                    return read_range(path, offset, min(length, n - offset), size)
                except FanoutError:  # its .part renamed (or restarted) between the two looks: look again
                    pass
            if n != seen or not (n or part.exists()):  # the clock runs once the copy of this file has begun
                seen, since = n, time.monotonic()
            elif time.monotonic() - since > self.stall_s:
                raise FanoutError(f"{h['path']}: no new bytes on the seed for {self.stall_s:g} s (at {n} of {size})")
            if self._stop.wait(POLL_S):
                raise FanoutError("the seed is stopping")


def fetch(
    root: Path,
    conn: Connection,
    files: list[tuple[str, int, str, int]],
    *,
    say: Callable[[dict[str, Any]], None],
    chunk_bytes: int = CHUNK_BYTES,
    timeout_s: float = STALL_S + 30.0,
) -> bool:
    """Fetch each (path, size, sha256, mode) into `root` from the seed at the other end of `conn`, reporting through
    `say`: {"progress": bytes} as they land, then {"path", "size", "sha256", "ok"} per file. Returns whether every
    file verified. A file's `.part` from an earlier fetch is kept (hashed, then continued); a resumed file that
    then does not verify is fetched again from its start, once."""
    buf = bytearray(chunk_bytes)
    view = torch.frombuffer(buf, dtype=torch.uint8)
    unreported = 0

    def into(kind: str, header: dict[str, Any], specs: list[TensorSpec]) -> list[torch.Tensor]:
        del kind, header
        if not specs:  # an error
            return []
        if len(specs) != 1 or specs[0].nbytes > chunk_bytes or specs[0].dtype != torch.uint8:
            raise FanoutError(f"the seed sent {specs} for a range of at most {chunk_bytes} bytes")
        return [view[: specs[0].nbytes]]

    def one(rel: str, size: int, sha: str, mode: int, resume: bool) -> tuple[str, bool]:
        """Fetch one file into its `.part`: renamed once it verifies, else removed (the digest and whether an
        earlier fetch's bytes were continued)."""
        nonlocal unreported
        path = safe_path(root, rel)
        part = part_of(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # another version: never served (this host may relay) nor left in its place
        digest = hashlib.sha256()
        have = part.stat().st_size if resume and part.exists() else 0
        have = have if have <= size else 0
        with part.open("r+b" if have else "wb") as f:
            if have:  # the bytes an earlier fetch left: hashed, then continued
                while chunk := f.read(chunk_bytes):
                    digest.update(chunk)
            f.seek(have)
            f.truncate()
            done = have
            while done < size:
                got = conn.request(
                    Message("read", {"path": rel, "offset": done, "length": chunk_bytes, "size": size}),
                    timeout_s,
                    into=into,
                )
                if got.kind == "error":
                    raise FanoutError(f"{rel}: {got.header.get('error')}")
                n = got.tensors[0].numel()
                data = memoryview(buf)[:n]
                f.write(data)
                digest.update(data)
                done += n
                unreported += n
                if unreported >= PROGRESS_EVERY_BYTES:
                    say({"progress": unreported})
                    unreported = 0
        hexdigest = digest.hexdigest()
        if hexdigest != sha:
            part.unlink(missing_ok=True)
            return hexdigest, have > 0
        os.chmod(part, mode)
        os.replace(part, path)
        return hexdigest, have > 0

    ok = True
    for rel, size, sha, mode in files:
        got, resumed = one(rel, size, sha, mode, True)
        if got != sha and resumed:
            got, _ = one(rel, size, sha, mode, False)
        say({"progress": unreported, "path": rel, "size": size, "sha256": got, "ok": got == sha})
        unreported = 0
        ok = ok and got == sha
    return ok


def _secret(root: Path) -> bytes:
    return bytes.fromhex((root / "secret").read_text().strip())


def _encrypt(root: Path) -> bool:
    """The job's `transport.encrypt`, from the resolved job staged in ROOT (both ends read the same file; False
    without one)."""
    jd = JobDir(root)
    return jd.job_json.exists() and jd.read_job().transport.encrypt


def _emit(row: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlctl.launch.fanout", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve ROOT's files to the site's other hosts until stdin ends")
    s.add_argument("root", type=Path)
    s.add_argument("--listen", default="tcp://0.0.0.0:0", help="where to listen (default: every interface)")
    s.add_argument("--advertise", help="the host name the other hosts reach this one at (default: --listen's)")
    s.add_argument("--stall-s", type=float, default=STALL_S)
    f = sub.add_parser("fetch", help="fetch the files named on stdin into ROOT from the seed")
    f.add_argument("root", type=Path)
    f.add_argument("--source", required=True, help="the seed's address (serve's listening line)")
    f.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fanout %(levelname)s %(message)s", stream=sys.stderr)
    try:
        secret, encrypt = _secret(args.root), _encrypt(args.root)
        if args.cmd == "serve":
            server = Server(args.root, secret, args.listen, stall_s=args.stall_s, encrypt=encrypt)
            threading.Thread(target=server.serve, name="fanout-accept", daemon=True).start()
            port = server.address.rsplit(":", 1)[1]
            _emit({"listening": f"tcp://{args.advertise}:{port}" if args.advertise else server.address})
            sys.stdin.read()  # the operator's end of the channel: closed when staging is done (or the operator gone)
            server.stop()
            _emit({"served": server.served, **({"error": server.failed} if server.failed else {})})
            return 1 if server.failed else 0
        files = [(str(p), int(n), str(h), int(m)) for p, n, h, m in json.loads(sys.stdin.read())]
        with make_transport("tcp", secret=secret, encrypt=encrypt).connect(args.source, timeout_s=30.0) as conn:
            ok = fetch(args.root, conn, files, say=_emit, chunk_bytes=args.chunk_bytes)
        return 0 if ok else 1
    except (RlctlError, OSError, ValueError) as e:
        _emit({"error": str(e)})
        return 1


if __name__ == "__main__":
    sys.exit(main())
