"""The TCP transport (default): blocking sockets, HMAC handshake, framing from `framing.py`.

Receiving: a small read-ahead buffer serves preambles and headers (few syscalls for small
messages); tensor bytes already read ahead are copied once into the destination, the rest is
read with `recv_into` straight into the destination tensor's memory.

Several streams (`TcpConfig.num_streams` > 1, chosen by the client): the connection opens k extra
sockets, each authenticated and joined to the main one by a token; frames of at least
`stripe_min_bytes` (the client's value, sent at connect so both ends agree) are split into k+1
contiguous parts sent and received in parallel, one worker thread per extra stream and direction.
Headers and small frames always use the main stream, so message order is the main stream's.

Timeouts: the socket keeps one fixed timeout (`stall_timeout_s`, the longest a started message or
a send may stall); waiting for the *start* of a message uses poll() with the caller's timeout,
so a PeerTimeout there leaves the connection usable. A stall inside a message closes it.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import select
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rlctl.errors import AuthError, PeerTimeout, PeerUnreachable, ProtocolError
from rlctl.transport import framing
from rlctl.transport.base import (
    BufferProvider,
    Connection,
    Listener,
    Message,
    Transport,
    check_buffers,
    split_address,
)

log = logging.getLogger(__name__)

_SEND_SLICE_BYTES = 4 << 20  # sendall() deadlines apply per slice, so the stall timeout is per slice
_SMALL_MESSAGE_BYTES = 64 << 10  # below this, header and frames go out in one syscall
_TOKEN_BYTES = 16  # names a connection, so its stripe streams can join it
_STREAMS = struct.Struct("!BQ")  # after "M": number of stripe streams that follow, stripe threshold in bytes
MAX_STREAMS = 16  # TCP streams per connection, the main one included


@dataclass(frozen=True)
class TcpConfig:
    limits: framing.Limits = field(default_factory=framing.Limits)
    stall_timeout_s: float = 60.0
    handshake_timeout_s: float = 10.0
    read_ahead_bytes: int = 256 << 10
    socket_buffer_bytes: int | None = None  # None = let the kernel autotune
    num_streams: int = 1  # TCP streams per connection (client side); >1 stripes large frames across them
    stripe_min_bytes: int = 16 << 20  # frames at least this large are striped when num_streams > 1


def _tune(sock: socket.socket, cfg: TcpConfig) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if cfg.socket_buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.socket_buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, cfg.socket_buffer_bytes)
    sock.settimeout(cfg.stall_timeout_s)


def _wait_readable(sock: socket.socket, timeout_s: float | None, poller: select.poll | None = None) -> bool:
    if poller is None:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000))))


def _send_sliced(sock: socket.socket, view: memoryview) -> None:
    for off in range(0, view.nbytes, _SEND_SLICE_BYTES):
        sock.sendall(view[off : off + _SEND_SLICE_BYTES])


def _recv_exact(sock: socket.socket, n: int, peer: str) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise PeerUnreachable(f"{peer}: connection closed during handshake")
        got += k
    return bytes(buf)


class TcpConnection(Connection):
    """One connection = a main stream (headers, small frames) + optional extra stripe streams."""

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        cfg: TcpConfig,
        extra_socks: tuple[socket.socket, ...] = (),
        stripe_min_bytes: int | None = None,  # both ends must agree: the client's value, sent at connect
    ) -> None:
        super().__init__(peer)
        self._sock = sock
        self._extra = extra_socks
        self._stripe_min = cfg.stripe_min_bytes if stripe_min_bytes is None else stripe_min_bytes
        # one worker per extra stream, per direction (one sender thread + one receiver thread)
        self._send_pool = ThreadPoolExecutor(len(extra_socks)) if extra_socks else None
        self._recv_pool = ThreadPoolExecutor(len(extra_socks)) if extra_socks else None
        self._cfg = cfg
        self._buf = bytearray(cfg.read_ahead_bytes)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # unread read-ahead bytes are _buf[_start:_end]
        self._closed = False
        self._close_lock = threading.Lock()
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)

    # -- sending ------------------------------------------------------------------------
    def _send(self, msg: Message) -> None:
        tensors = framing.wire_tensors(msg.tensors)
        head = framing.encode_header(msg, tensors)
        views = [framing.tensor_bytes(t) for t in tensors]
        total = len(head) + sum(v.nbytes for v in views)
        try:
            if total <= _SMALL_MESSAGE_BYTES:
                self._sock.sendall(b"".join([head, *views]))
                return
            self._sock.sendall(head)
            for v in views:
                if self._send_pool is not None and v.nbytes >= self._stripe_min:
                    parts = self._stripes(v)
                    futs = [
                        self._send_pool.submit(_send_sliced, s, p) for s, p in zip(self._extra, parts[1:], strict=True)
                    ]
                    _send_sliced(self._sock, parts[0])
                    for f in futs:
                        f.result()
                else:
                    _send_sliced(self._sock, v)
        except TimeoutError as e:
            self.close()
            raise PeerTimeout(f"{self.peer}: send stalled for {self._cfg.stall_timeout_s:.0f}s") from e
        except OSError as e:
            self.close()
            raise PeerUnreachable(f"{self.peer}: send failed: {e}") from e

    # -- receiving ----------------------------------------------------------------------
    def _fill(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif self._end == len(self._buf):
            n = self._end - self._start
            self._buf[:n] = self._buf[self._start : self._end]
            self._start, self._end = 0, n
        k = self._sock.recv_into(self._view[self._end :])
        if k == 0:
            raise PeerUnreachable(f"{self.peer}: connection closed by peer")
        self._end += k

    def _fill_when_idle(self) -> None:
        """Block until the next message's first bytes arrive; the stall timeout does not apply yet."""
        while True:
            try:
                self._fill()
                return
            except TimeoutError:
                continue  # idle connection, no message started: keep waiting

    def _read_exact(self, n: int) -> bytes:
        if n > len(self._buf):
            big = bytearray(n)
            self._read_into(memoryview(big))
            return bytes(big)
        while self._end - self._start < n:
            if self._start + n > len(self._buf):  # make room at the end
                m = self._end - self._start
                self._buf[:m] = self._buf[self._start : self._end]
                self._start, self._end = 0, m
            self._fill()
        out = bytes(self._view[self._start : self._start + n])
        self._start += n
        return out

    def _read_into(self, dest: memoryview) -> None:
        n = dest.nbytes
        take = min(n, self._end - self._start)
        if take:
            dest[:take] = self._view[self._start : self._start + take]
            self._start += take
        got = take
        while got < n:
            k = self._sock.recv_into(dest[got:])
            if k == 0:
                raise PeerUnreachable(f"{self.peer}: connection closed mid-message ({got}/{n} frame bytes)")
            got += k

    def _recv(self, timeout_s: float | None, into: BufferProvider) -> Message:
        if self._closed:
            raise PeerUnreachable(f"{self.peer}: connection is closed")
        if self._start == self._end:
            try:
                if timeout_s is None:
                    self._fill_when_idle()  # no poll(): one syscall fewer per message
                elif not _wait_readable(self._sock, timeout_s, self._poller):
                    raise PeerTimeout(f"{self.peer}: no message within {timeout_s}s")
            except PeerUnreachable:
                self.close()
                raise
            except (OSError, ValueError) as e:
                self.close()
                raise PeerUnreachable(f"{self.peer}: connection is closed ({e})") from e
        try:
            n = framing.parse_preamble(self._read_exact(framing.PREAMBLE.size), self._cfg.limits, self.peer)
            wh, specs = framing.decode_header(self._read_exact(n), self._cfg.limits, self.peer)
            bufs = into(wh.kind, wh.header, specs)
            check_buffers(specs, bufs)
            for b in bufs:
                view = framing.tensor_bytes(b)
                if self._recv_pool is not None and view.nbytes >= self._stripe_min:
                    parts = self._stripes(view)
                    futs = [
                        self._recv_pool.submit(self._recv_exact_into, s, p)
                        for s, p in zip(self._extra, parts[1:], strict=True)
                    ]
                    self._read_into(parts[0])
                    for f in futs:
                        f.result()
                elif view.nbytes:
                    self._read_into(view)
        except TimeoutError as e:
            self.close()
            raise PeerTimeout(f"{self.peer}: message stalled for {self._cfg.stall_timeout_s:.0f}s") from e
        except (PeerUnreachable, ProtocolError):
            self.close()  # the stream is out of sync: nothing after this can be trusted
            raise
        except OSError as e:
            self.close()
            raise PeerUnreachable(f"{self.peer}: receive failed: {e}") from e
        return Message(wh.kind, wh.header, bufs, msg_id=wh.msg_id, reply_to=wh.reply_to)

    def _stripes(self, view: memoryview) -> list[memoryview]:
        n, k = view.nbytes, 1 + len(self._extra)
        return [view[i * n // k : (i + 1) * n // k] for i in range(k)]

    def _recv_exact_into(self, sock: socket.socket, dest: memoryview) -> None:
        got = 0
        while got < dest.nbytes:
            k = sock.recv_into(dest[got:])
            if k == 0:
                raise PeerUnreachable(f"{self.peer}: stripe stream closed mid-message")
            got += k

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self._sock, *self._extra):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a receiver blocked in poll()/recv()
            sock.close()
        for pool in (self._send_pool, self._recv_pool):
            if pool is not None:
                pool.shutdown(wait=False)


class TcpListener(Listener):
    def __init__(self, sock: socket.socket, secret: bytes, cfg: TcpConfig) -> None:
        self._sock = sock
        self._secret = secret
        self._cfg = cfg
        host, port = sock.getsockname()[:2]
        self.address = f"tcp://{host}:{port}"
        self._pending: dict[bytes, tuple[socket.socket, str, int, int, list[socket.socket]]] = {}

    def accept(self, timeout_s: float | None = None) -> Connection:
        """Next complete connection: its main stream and, if the client asked for them, its stripe
        streams (which arrive as further authenticated connections naming the main one's token)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if not _wait_readable(self._sock, left):
                    raise PeerTimeout(f"{self.address}: no connection within {timeout_s}s")
                sock, addr = self._sock.accept()
            except (OSError, ValueError) as e:  # ValueError: the listener was closed
                raise PeerUnreachable(f"{self.address}: accept failed: {e}") from e
            peer = f"tcp://{addr[0]}:{addr[1]}"
            try:
                self._server_handshake(sock, peer)
                role = _recv_exact(sock, 1, peer)
                if role == b"M":  # a main stream announcing its stripe streams and threshold
                    extra, stripe_min = _STREAMS.unpack(_recv_exact(sock, _STREAMS.size, peer))
                    if extra >= MAX_STREAMS:
                        raise ProtocolError(f"{peer}: asks for {extra} stripe streams; at most {MAX_STREAMS - 1}")
                    token = os.urandom(_TOKEN_BYTES)
                    sock.sendall(token)
                    _tune(sock, self._cfg)
                    if extra == 0:
                        return TcpConnection(sock, peer, self._cfg)
                    self._pending[token] = (sock, peer, extra, stripe_min, [])
                    continue
                token = _recv_exact(sock, _TOKEN_BYTES, peer)
                if role != b"J" or token not in self._pending:
                    raise ProtocolError(f"{peer}: stripe stream for an unknown connection")
            except BaseException:
                sock.close()
                raise
            _tune(sock, self._cfg)
            main, main_peer, extra, stripe_min, joined = self._pending[token]
            joined.append(sock)
            if len(joined) == extra:
                del self._pending[token]
                return TcpConnection(main, main_peer, self._cfg, tuple(joined), stripe_min)

    def _server_handshake(self, sock: socket.socket, peer: str) -> None:
        sock.settimeout(self._cfg.handshake_timeout_s)
        nonce = os.urandom(framing.NONCE_BYTES)
        try:
            sock.sendall(framing.HELLO + nonce)
            answer = _recv_exact(sock, framing.NONCE_BYTES + framing.MAC_BYTES, peer)
            client_nonce, proof = answer[: framing.NONCE_BYTES], answer[framing.NONCE_BYTES :]
            if not hmac.compare_digest(proof, framing.client_proof(self._secret, nonce, client_nonce)):
                sock.sendall(b"NO")
                log.warning("refused %s: wrong job secret", peer)
                raise AuthError(f"{peer}: refused, it does not hold this job's secret")
            sock.sendall(b"OK" + framing.server_proof(self._secret, nonce, client_nonce))
        except TimeoutError as e:
            raise PeerTimeout(f"{peer}: handshake timed out after {self._cfg.handshake_timeout_s}s") from e
        except OSError as e:
            raise PeerUnreachable(f"{peer}: handshake failed: {e}") from e

    def close(self) -> None:
        self._sock.close()


class TcpTransport(Transport):
    scheme = "tcp"

    def __init__(self, *, secret: bytes, config: TcpConfig | None = None) -> None:
        if not secret:
            raise ValueError("a per-job secret is required (non-empty bytes)")
        self._secret = secret
        self.config = config or TcpConfig()

    def listen(self, address: str) -> Listener:
        host, port = split_address(address, self.scheme)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise PeerUnreachable(f"{address}: cannot listen: {e}") from e
        return TcpListener(sock, self._secret, self.config)

    def connect(self, address: str, timeout_s: float) -> Connection:
        n = self.config.num_streams
        if not 1 <= n <= MAX_STREAMS:
            raise ValueError(f"num_streams must be 1..{MAX_STREAMS}, got {n}")
        main = self._open(address, timeout_s, b"M" + _STREAMS.pack(n - 1, self.config.stripe_min_bytes))
        extra: list[socket.socket] = []
        try:
            token = _recv_exact(main, _TOKEN_BYTES, address)
            for _ in range(n - 1):
                extra.append(self._open(address, timeout_s, b"J" + token))
        except BaseException:
            for s in (main, *extra):
                s.close()
            raise
        for s in (main, *extra):
            _tune(s, self.config)
        return TcpConnection(main, address, self.config, tuple(extra))

    def _open(self, address: str, timeout_s: float, role: bytes) -> socket.socket:
        host, port = split_address(address, self.scheme)
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except TimeoutError as e:
            raise PeerTimeout(f"{address}: connect timed out after {timeout_s}s") from e
        except OSError as e:
            raise PeerUnreachable(f"{address}: connect failed: {e}") from e
        try:
            self._client_handshake(sock, address, timeout_s)
            sock.sendall(role)
        except BaseException:
            sock.close()
            raise
        return sock

    def _client_handshake(self, sock: socket.socket, peer: str, timeout_s: float) -> None:
        sock.settimeout(timeout_s)
        try:
            hello = _recv_exact(sock, len(framing.HELLO) + framing.NONCE_BYTES, peer)
            if hello[: len(framing.HELLO)] != framing.HELLO:
                raise ProtocolError(f"{peer}: not an rlctl endpoint (bad hello)")
            nonce, mine = hello[len(framing.HELLO) :], os.urandom(framing.NONCE_BYTES)
            sock.sendall(mine + framing.client_proof(self._secret, nonce, mine))
            verdict = _recv_exact(sock, 2, peer)
            if verdict != b"OK":
                raise AuthError(f"{peer}: refused our credentials; check that both sides use this job's secret")
            proof = _recv_exact(sock, framing.MAC_BYTES, peer)
        except TimeoutError as e:
            raise PeerTimeout(f"{peer}: handshake timed out after {timeout_s}s") from e
        except PeerUnreachable as e:
            raise AuthError(f"{peer}: closed the connection during authentication ({e})") from e
        except OSError as e:
            raise PeerUnreachable(f"{peer}: handshake failed: {e}") from e
        if not hmac.compare_digest(proof, framing.server_proof(self._secret, nonce, mine)):
            raise AuthError(f"{peer}: server failed to prove it holds this job's secret")
