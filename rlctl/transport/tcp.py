"""The TCP transport (default): blocking sockets, the handshake and message tags of `auth.py`, framing from
`framing.py`.

Accepting: one thread per listener accepts sockets and hands each to a handshake thread of its own, so a
peer that connects and says nothing (or slowly) delays only itself; `accept()` returns the connections whose
handshake completed, in that order. A failed handshake is logged (the peer, why) and never reaches `accept()`.

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
so a PeerTimeout there leaves the connection usable. A stall inside a message closes it. A handshake has one
deadline for all of it, not one per read (a peer sending a byte now and then would renew that forever):
`handshake_timeout_s` on the listener (a main stream's wait for its stripe streams included), the caller's
`timeout_s` on `connect` (every stream's connect and handshake).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlctl.errors import AuthError, PeerClosed, PeerTimeout, PeerUnreachable, ProtocolError, RlctlError, TransportError
from rlctl.transport import auth, framing, keeper
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
_SEAL_CHUNK = 1 << 20  # an encrypted connection encrypts / decrypts frames in pieces of this size
_TOKEN_BYTES = 16  # names a connection, so its stripe streams can join it
_STREAMS = struct.Struct("!BQ")  # after "M": number of stripe streams that follow, stripe threshold in bytes
MAX_STREAMS = 16  # TCP streams per connection, the main one included
MAX_HANDSHAKES = 256  # handshakes in progress per listener; a connection beyond them is closed at once


@dataclass(frozen=True)
class TcpConfig:
    limits: framing.Limits = field(default_factory=framing.Limits)
    stall_timeout_s: float = 60.0
    handshake_timeout_s: float = 10.0
    read_ahead_bytes: int = 256 << 10
    socket_buffer_bytes: int | None = None  # None = let the kernel autotune
    num_streams: int = 1  # TCP streams per connection (client side); >1 stripes large frames across them
    stripe_min_bytes: int = 16 << 20  # frames at least this large are striped when num_streams > 1
    encrypt: bool = False  # headers and frames encrypted (AES-256-GCM, `auth.Sealer`): both ends say so; one stream


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


def _send_sliced(sock: socket.socket, view: memoryview, tag: auth.FramesTag | None = None) -> None:
    for off in range(0, view.nbytes, _SEND_SLICE_BYTES):
        piece = view[off : off + _SEND_SLICE_BYTES]
        if tag is not None:
            tag.update(piece)
        sock.sendall(piece)


def _transport_error(e: OSError, peer: str, when: str) -> TransportError:
    """A socket error while connecting as the transport's own, naming the peer (callers catch TransportError: a
    reset here once killed a rollout unit's weight-fetch thread)."""
    if isinstance(e, TimeoutError):
        return PeerTimeout(f"{peer}: timed out {when}")
    return PeerUnreachable(f"{peer}: connection failed {when}: {e}")


def _until(sock: socket.socket, deadline: float) -> None:
    """Let the socket's next call wait at most until `deadline` (`time.monotonic()`): one bound for a whole exchange
    (a peer sending a byte now and then would renew a per-call timeout forever)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    sock.settimeout(left)


def _recv_exact(sock: socket.socket, n: int, peer: str, *, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            _until(sock, deadline)
        k = sock.recv_into(view[got:])
        if k == 0:
            raise PeerUnreachable(f"{peer}: connection closed during handshake")
        got += k
    return bytes(buf)


class TcpConnection(Connection):
    """One connection = a main stream (headers, small frames) + optional extra stripe streams. With `keys` (every
    connection `connect` and `accept` make) each message carries its tag (`auth.py`); without, the framing alone
    (a stream already trusted: the framing's own tests)."""

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        cfg: TcpConfig,
        extra_socks: tuple[socket.socket, ...] = (),
        stripe_min_bytes: int | None = None,  # both ends must agree: the client's value, sent at connect
        *,
        keys: auth.SessionKeys | None = None,
    ) -> None:
        super().__init__(peer)
        sealed = keys is not None and cfg.encrypt
        self._out = auth.Tagger(keys.send) if keys is not None and not sealed else None
        self._in = auth.Tagger(keys.recv) if keys is not None and not sealed else None
        self._seal_out = auth.Sealer(keys.send) if keys is not None and sealed else None
        self._seal_in = auth.Sealer(keys.recv) if keys is not None and sealed else None
        if sealed and extra_socks:
            raise ValueError("an encrypted connection has one stream")
        self._out_bounce = bytearray(_SEAL_CHUNK + 16) if sealed else bytearray()
        self._out_bounce2 = bytearray(_SEAL_CHUNK + 16) if sealed else bytearray()
        self._in_bounce = bytearray(_SEAL_CHUNK + 16) if sealed else bytearray()
        self._lane: ThreadPoolExecutor | None = None  # encrypts the next piece while one is sent
        self._rlane: ThreadPoolExecutor | None = None  # decrypts a piece while the next one arrives
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
        self._keeper: int | None = None  # the pipe that holds a keeper (`end_in_order_on_exit`)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)

    # -- sending ------------------------------------------------------------------------
    def _send(self, msg: Message) -> None:
        if self._closed:  # before any lane or pool is asked for: close() shut them down
            raise PeerUnreachable(f"{self.peer}: connection is closed")
        tensors = framing.wire_tensors(msg.tensors)
        head = framing.encode_header(msg, tensors)
        views = [framing.tensor_bytes(t) for t in tensors]
        frame_bytes = sum(v.nbytes for v in views)
        total = len(head) + frame_bytes
        tag = None
        if self._out is not None:  # the header's tag right after it; the frames' tag after them, if any
            message = self._out.next()
            cut = framing.PREAMBLE.size
            head += message.header(head[:cut], head[cut:])
            tag = message.frames(frame_bytes) if frame_bytes else None
        try:
            if self._seal_out is not None:
                self._send_sealed(head, views, total)
                return
            if total <= _SMALL_MESSAGE_BYTES:
                if tag is not None:
                    for v in views:
                        tag.update(v)
                self._sock.sendall(b"".join([head, *views, tag.tag() if tag is not None else b""]))
                return
            self._sock.sendall(head)
            for v in views:
                if self._send_pool is not None and v.nbytes >= self._stripe_min:
                    if tag is not None:  # the frame in order, before its parts go out in parallel
                        tag.update(v)
                    parts = self._stripes(v)
                    futs = [
                        self._send_pool.submit(_send_sliced, s, p) for s, p in zip(self._extra, parts[1:], strict=True)
                    ]
                    _send_sliced(self._sock, parts[0])
                    for f in futs:
                        f.result()
                else:
                    _send_sliced(self._sock, v, tag)
            if tag is not None:
                self._sock.sendall(tag.tag())
        except TimeoutError as e:
            self.close()
            raise PeerTimeout(f"{self.peer}: send stalled for {self._cfg.stall_timeout_s:.0f}s") from e
        except OSError as e:
            self.close()
            raise PeerUnreachable(f"{self.peer}: send failed: {e}") from e
        except RuntimeError as e:  # a pool or lane shut down by close() from another thread while this sent
            if not self._closed:
                raise
            raise PeerUnreachable(f"{self.peer}: connection closed on this side during a send") from e

    def _send_sealed(self, head: bytes, views: list[memoryview], total: int) -> None:
        """The preamble in clear, the header sealed (its tag after it), then the frames encrypted piece by piece —
        the next piece on the connection's seal lane while this one is sent — and their tag last."""
        assert self._seal_out is not None
        seal = self._seal_out.next()
        cut = framing.PREAMBLE.size
        sealed_head = head[:cut] + seal.seal_header(head[:cut], head[cut:])
        if total == len(head):  # no frame bytes: the header's tag is the message's
            self._sock.sendall(sealed_head)
            return
        enc = seal.frames_encryptor()
        if total <= _SMALL_MESSAGE_BYTES:
            data = bytearray(sealed_head)
            for v in views:
                data += enc.update(v)
            enc.finalize()
            self._sock.sendall(data + enc.tag)
            return
        self._sock.sendall(sealed_head)
        pieces = [v[at : at + _SEAL_CHUNK] for v in views for at in range(0, v.nbytes, _SEAL_CHUNK)]
        bounces = (self._out_bounce, self._out_bounce2)

        def seal_piece(i: int) -> int:
            return int(enc.update_into(pieces[i], bounces[i % 2]))

        lane = self._seal_lane()
        pending = lane.submit(seal_piece, 0) if pieces else None
        for i in range(len(pieces)):
            assert pending is not None
            n = pending.result()
            pending = lane.submit(seal_piece, i + 1) if i + 1 < len(pieces) else None  # into the other bounce buffer
            self._sock.sendall(memoryview(bounces[i % 2])[:n])
        enc.finalize()
        self._sock.sendall(enc.tag)

    def _seal_lane(self) -> ThreadPoolExecutor:
        if self._lane is None:
            self._lane = ThreadPoolExecutor(1, thread_name_prefix="seal")
        return self._lane

    def _read_sealed(self, dest: memoryview, dec: Any) -> None:
        """A frame's ciphertext into `dest`, piece by piece, each piece decrypted in place on the receive lane while
        the next one arrives."""
        bounce = memoryview(self._in_bounce)

        def unseal(piece: memoryview) -> None:
            n = dec.update_into(piece, self._in_bounce)
            piece[:n] = bounce[:n]

        if dest.nbytes <= _SEAL_CHUNK:  # one piece: nothing to overlap
            self._read_into(dest)
            unseal(dest)
            return
        lane = self._open_lane()
        pending = None
        for at in range(0, dest.nbytes, _SEAL_CHUNK):
            piece = dest[at : at + _SEAL_CHUNK]
            self._read_into(piece)
            if pending is not None:
                pending.result()
            pending = lane.submit(unseal, piece)
        if pending is not None:
            pending.result()

    def _open_lane(self) -> ThreadPoolExecutor:
        if self._rlane is None:
            self._rlane = ThreadPoolExecutor(1, thread_name_prefix="unseal")
        return self._rlane

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
            raise self._ended("connection closed by peer")
        self._end += k

    def _ended(self, what: str) -> PeerUnreachable:
        """The error for a read that found the stream's end: the peer's in-order close (PeerClosed), unless this
        side closed the connection (`close` from another thread wakes a blocked reader the same way)."""
        if self._closed:
            return PeerUnreachable(f"{self.peer}: connection closed on this side")
        return PeerClosed(f"{self.peer}: {what}")

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

    def _read_into(self, dest: memoryview, tag: auth.FramesTag | None = None) -> None:
        n = dest.nbytes
        take = min(n, self._end - self._start)
        if take:
            dest[:take] = self._view[self._start : self._start + take]
            self._start += take
            if tag is not None:
                tag.update(dest[:take])
        got, tagged = take, take
        while got < n:
            k = self._sock.recv_into(dest[got:])
            if k == 0:
                raise self._ended(f"connection closed mid-message ({got}/{n} frame bytes)")
            got += k
            if tag is not None and (got - tagged >= auth.BATCH_BYTES or got == n):  # while they are in cache
                tag.update(dest[tagged:got])
                tagged = got

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
            pre = self._read_exact(framing.PREAMBLE.size)
            n = framing.parse_preamble(pre, self._cfg.limits, self.peer)
            seal = self._seal_in.next() if self._seal_in is not None else None
            message = self._in.next() if self._in is not None else None
            if seal is not None:  # a header is authenticated before it is parsed (and sizes any buffer)
                body = seal.open_header(pre, self._read_exact(n + auth.TAG_BYTES), peer=self.peer)
            elif message is not None:
                got = self._read_exact(n + auth.TAG_BYTES)
                body = got[:n]
                message.open_header(pre, body, got[n:], peer=self.peer)
            else:
                body = self._read_exact(n)
            wh, specs = framing.decode_header(body, self._cfg.limits, self.peer)
            frame_bytes = sum(s.nbytes for s in specs)
            tag = message.frames(frame_bytes) if message is not None and frame_bytes else None
            dec = seal.frames_decryptor() if seal is not None and frame_bytes else None
            bufs = into(wh.kind, wh.header, specs)
            check_buffers(specs, bufs)
            for b in bufs:
                view = framing.tensor_bytes(b)
                if not view.nbytes:  # an empty frame: no bytes on the wire (and a read-only view, not to write)
                    continue
                if self._recv_pool is not None and view.nbytes >= self._stripe_min:
                    parts = self._stripes(view)
                    futs = [
                        self._recv_pool.submit(self._recv_exact_into, s, p)
                        for s, p in zip(self._extra, parts[1:], strict=True)
                    ]
                    self._read_into(parts[0])
                    for f in futs:
                        f.result()
                    if tag is not None:
                        tag.update(view)
                elif dec is not None:
                    self._read_sealed(view, dec)
                else:
                    self._read_into(view, tag)
            if tag is not None:
                tag.verify(self._read_exact(auth.TAG_BYTES), peer=self.peer, kind=wh.kind)
            if dec is not None:
                auth.open_tag(dec, self._read_exact(auth.TAG_BYTES), peer=self.peer, kind=wh.kind)
        except TimeoutError as e:
            self.close()
            raise PeerTimeout(f"{self.peer}: message stalled for {self._cfg.stall_timeout_s:.0f}s") from e
        except (PeerUnreachable, ProtocolError):
            self.close()  # the stream is out of sync: nothing after this can be trusted
            raise
        except OSError as e:
            self.close()
            raise PeerUnreachable(f"{self.peer}: receive failed: {e}") from e
        except RlctlError:  # the BufferProvider's own (the weight plane's, the fan-out's): the message is half-read
            self.close()
            raise
        except Exception as e:  # anything else leaves the stream mid-message just the same: never usable after it
            closed_here = self._closed  # close() from another thread shut down a pool or lane this read used
            self.close()
            if closed_here:
                raise PeerUnreachable(f"{self.peer}: connection closed on this side") from e
            raise ProtocolError(f"{self.peer}: receive failed: {type(e).__name__}: {e}") from e
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

    def end_in_order_on_exit(self) -> bool:
        """A keeper process holds a duplicate of the streams and ends them in order if this process dies
        (`keeper.py`): a kill's close would otherwise reset them when a message had just come in."""
        with self._close_lock:
            if self._keeper is None and not self._closed:
                self._keeper = keeper.keep([self._sock, *self._extra])
        return True

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self._sock, *self._extra):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a receiver blocked in poll()/recv(); ends a kept stream
            sock.close()
        if self._keeper is not None:
            os.close(self._keeper)  # the keeper's duplicate is shut down above: it exits
        for pool in (self._send_pool, self._recv_pool, self._lane, self._rlane):
            if pool is not None:
                pool.shutdown(wait=False)
        for tagger in (self._out, self._in):
            if tagger is not None:
                tagger.close()


@dataclass
class _Joining:
    """The stripe streams that joined a main stream so far (by its token), `complete` once all have."""

    streams: int
    socks: list[socket.socket] = field(default_factory=list)
    complete: threading.Event = field(default_factory=threading.Event)


class TcpListener(Listener):
    def __init__(self, sock: socket.socket, secret: bytes, cfg: TcpConfig) -> None:
        self._sock = sock
        self._secret = secret
        self._cfg = cfg
        host, port = sock.getsockname()[:2]
        self.address = f"tcp://{host}:{port}"
        self._lock = threading.Lock()
        self._pending: dict[bytes, _Joining] = {}  # main streams waiting for their stripe streams, by token
        self._ready: queue.Queue[TcpConnection | None] = queue.Queue()
        self._slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._closed = False
        threading.Thread(target=self._accept_loop, name=f"accept {self.address}", daemon=True).start()

    def accept(self, timeout_s: float | None = None) -> Connection:
        """The next connection whose handshake completed (with its stripe streams, if it asked for them)."""
        try:
            conn = self._ready.get(timeout=timeout_s)
        except queue.Empty as e:
            raise PeerTimeout(f"{self.address}: no connection within {timeout_s}s") from e
        if conn is None:
            self._ready.put(None)  # for every other waiter
            raise PeerUnreachable(f"{self.address}: the listener is closed")
        return conn

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, addr = self._sock.accept()
            except OSError:  # closed
                self._ready.put(None)
                return
            peer = f"tcp://{addr[0]}:{addr[1]}"
            if not self._slots.acquire(blocking=False):
                log.warning("%s: %d handshakes in progress; closed %s", self.address, MAX_HANDSHAKES, peer)
                sock.close()
                continue
            threading.Thread(target=self._handshake, args=(sock, peer), name=f"handshake {peer}", daemon=True).start()

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        """Authenticate one socket and learn its role: a connection's main stream, or a stripe stream joining
        one; what completes a connection goes to `accept()`. One deadline (`handshake_timeout_s`) bounds all of it,
        a main stream's wait for its stripe streams included: a peer that sends a byte now and then holds its
        slot no longer than a silent one. A failure is logged and closes the socket."""
        deadline = time.monotonic() + self._cfg.handshake_timeout_s
        try:
            try:
                conn = self._stream(sock, peer, deadline)
            except TimeoutError as e:
                raise PeerTimeout(f"{peer}: handshake timed out after {self._cfg.handshake_timeout_s}s") from e
            if conn is not None:
                self._ready.put(conn)
        except (TransportError, OSError) as e:
            if not self._closed:
                log.warning("%s: %s", self.address, e)  # the error names the peer
            sock.close()
        finally:
            self._slots.release()

    def _stream(self, sock: socket.socket, peer: str, deadline: float) -> TcpConnection | None:
        """The connection whose main stream `sock` is, once its stripe streams joined it; None for a stripe stream
        (its main stream's handshake thread completes the connection)."""
        keys = self._server_handshake(sock, peer, deadline)
        role = _recv_exact(sock, 1, peer, deadline=deadline)
        if role == b"J":
            self._join(sock, peer, _recv_exact(sock, _TOKEN_BYTES, peer, deadline=deadline))
            return None
        if role not in (b"M", b"E"):
            raise ProtocolError(f"{peer}: unknown stream role {role!r}")
        if (role == b"E") != self._cfg.encrypt:
            raise ProtocolError(
                f"{peer}: it {'encrypts' if role == b'E' else 'does not encrypt'} its traffic and this end "
                f"{'does not' if role == b'E' else 'does'}: both ends take the job's transport.encrypt"
            )
        extra, stripe_min = _STREAMS.unpack(_recv_exact(sock, _STREAMS.size, peer, deadline=deadline))
        if extra >= MAX_STREAMS or (role == b"E" and extra):
            most = 0 if role == b"E" else MAX_STREAMS - 1  # an encrypted connection has one stream
            raise ProtocolError(f"{peer}: asks for {extra} stripe streams; at most {most}")
        token = os.urandom(_TOKEN_BYTES)
        joining = _Joining(extra)
        if extra:
            with self._lock:
                self._pending[token] = joining  # before the token goes out: its stripe streams may follow at once
        try:
            _until(sock, deadline)
            sock.sendall(token)
            if extra and not joining.complete.wait(max(0.0, deadline - time.monotonic())):
                raise PeerTimeout(
                    f"{peer}: {len(joining.socks)} of its {extra} stripe streams joined within "
                    f"{self._cfg.handshake_timeout_s}s"
                )
            if self._closed:
                raise PeerUnreachable(f"{self.address}: the listener is closed")
        except BaseException:
            with self._lock:
                self._pending.pop(token, None)  # no stripe stream joins it after this
            for s in joining.socks:
                s.close()
            raise
        with self._lock:
            self._pending.pop(token, None)
        _tune(sock, self._cfg)
        return TcpConnection(sock, peer, self._cfg, tuple(joining.socks), stripe_min, keys=keys)

    def _join(self, sock: socket.socket, peer: str, token: bytes) -> None:
        """Hand a stripe stream to the main stream its token names (that one's handshake thread waits for it)."""
        _tune(sock, self._cfg)
        with self._lock:
            joining = self._pending.get(token)
            if joining is None or len(joining.socks) == joining.streams:
                raise ProtocolError(f"{peer}: stripe stream for an unknown connection")
            joining.socks.append(sock)
            if len(joining.socks) == joining.streams:
                joining.complete.set()

    def _server_handshake(self, sock: socket.socket, peer: str, deadline: float) -> auth.SessionKeys:
        hs = auth.ServerHandshake(self._secret)
        try:
            _until(sock, deadline)
            sock.sendall(hs.hello())
            verdict, keys = hs.verdict(_recv_exact(sock, hs.ANSWER_BYTES, peer, deadline=deadline))
            _until(sock, deadline)
            sock.sendall(verdict)
        except TimeoutError as e:
            raise PeerTimeout(f"{peer}: handshake timed out after {self._cfg.handshake_timeout_s}s") from e
        except OSError as e:
            raise PeerUnreachable(f"{peer}: handshake failed: {e}") from e
        if keys is None:
            raise AuthError(f"{peer}: refused, it does not hold this job's secret")
        return keys

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
        self._sock.close()
        with self._lock:
            for joining in self._pending.values():
                for s in joining.socks:
                    s.close()
                joining.complete.set()  # its main stream's handshake thread sees the listener closed
            self._pending.clear()


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
        if self.config.encrypt and n > 1:
            raise ValueError("an encrypted connection has one stream (num_streams 1)")
        role = b"E" if self.config.encrypt else b"M"
        deadline = time.monotonic() + timeout_s  # one bound for all of it: every stream's connect and handshake
        main, keys = self._open(address, timeout_s, deadline, role + _STREAMS.pack(n - 1, self.config.stripe_min_bytes))
        extra: list[socket.socket] = []
        try:
            token = _recv_exact(main, _TOKEN_BYTES, address, deadline=deadline)
            for _ in range(n - 1):
                extra.append(self._open(address, timeout_s, deadline, b"J" + token)[0])
        except BaseException as e:
            for s in (main, *extra):
                s.close()
            if isinstance(e, OSError):  # a reset or a timeout of the socket itself (TransportError is not one)
                raise _transport_error(e, address, "opening its streams") from e
            raise
        for s in (main, *extra):
            _tune(s, self.config)
        return TcpConnection(main, address, self.config, tuple(extra), keys=keys)

    def _open(
        self, address: str, timeout_s: float, deadline: float, role: bytes
    ) -> tuple[socket.socket, auth.SessionKeys]:
        host, port = split_address(address, self.scheme)
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("deadline passed")
            sock = socket.create_connection((host, port), timeout=left)
        except TimeoutError as e:
            raise PeerTimeout(f"{address}: connect timed out after {timeout_s}s") from e
        except OSError as e:
            raise PeerUnreachable(f"{address}: connect failed: {e}") from e
        try:
            keys = self._client_handshake(sock, address, timeout_s, deadline)
            _until(sock, deadline)
            sock.sendall(role)
        except BaseException as e:
            sock.close()
            if isinstance(e, OSError):
                raise _transport_error(e, address, "after the handshake") from e
            raise
        return sock, keys

    def _client_handshake(self, sock: socket.socket, peer: str, timeout_s: float, deadline: float) -> auth.SessionKeys:
        hs = auth.ClientHandshake(self._secret, peer)
        try:
            hello = _recv_exact(sock, hs.HELLO_BYTES, peer, deadline=deadline)
            _until(sock, deadline)
            sock.sendall(hs.answer(hello))
            verdict = _recv_exact(sock, auth.VERDICT_BYTES, peer, deadline=deadline)
        except TimeoutError as e:
            raise PeerTimeout(f"{peer}: handshake timed out after {timeout_s}s") from e
        except PeerUnreachable as e:
            raise AuthError(f"{peer}: closed the connection during authentication ({e})") from e
        except OSError as e:
            raise PeerUnreachable(f"{peer}: handshake failed: {e}") from e
        return hs.keys(verdict)
