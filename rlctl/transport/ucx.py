"""The UCX transport (`ucx://host:port`, optional extra `rlctl[ucx]` = ucxx): tag send/recv per frame.

Same message layout and handshake as TCP (`framing.py`), but every part travels as its own UCX
tag message, so each tensor frame is received by UCX straight into the destination tensor:

    preamble (8 B) | header (n B) + header tag (16 B) | frame_0 | frame_1 | ... | frames tag (16 B)
        (empty frames are not sent; no frames tag without frame bytes)
    end of stream: "RLE1" | 0 (8 B) | header tag (16 B)  (`close` with no message half-sent: the peer raises PeerClosed)
    handshake (`auth.py`): hello (36 B) → proof (64 B) → verdict (34 B: "OK"+server proof, or "NO"+zeros)

ucxx is asyncio-based; one event-loop thread per process runs every UCX call and the blocking
methods here wait on it. A receive that times out before the message starts stays posted and
is picked up by the next recv(), so the connection stays usable (as with TCP); each part of a started message must
arrive within `stall_timeout_s`, and each part a send hands to UCX must go within it too. A part that does not
closes the connection by aborting the endpoint, which ends its request with an error, never by cancelling the
request (that can deadlock inside UCX, or crash it: a receive cancelled while its frame arrives); `close` ends a
posted preamble receive the same way.
Without GPUs, run with UCX_TLS=tcp (and e.g. UCX_NET_DEVICES=lo for loopback). An agent on a site whose
inventory says `network.rdma: false` (the launcher's RLCTL_RDMA=0) leaves InfiniBand/RoCE out (UCX_TLS `^ib`)
unless UCX_TLS is set (e.g. by the site's setup lines): UCX would otherwise use an RDMA device the operator said
is not to be used (a fabric that is down, or not the job's).
A UCX listener listens on every interface (ucxx takes a port, no address; UCX_NET_DEVICES narrows
it); the handshake still refuses any peer without the job's secret before reading a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Coroutine
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import numpy as np

from rlctl.errors import AuthError, PeerClosed, PeerTimeout, PeerUnreachable, ProtocolError, TransportError
from rlctl.transport import auth, framing
from rlctl.transport.base import BufferProvider, Connection, Listener, Message, Transport, check_buffers, split_address

T = TypeVar("T")
log = logging.getLogger(__name__)
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
ENV_RDMA = "RLCTL_RDMA"  # "1"/"0": the agent's site has RDMA (its inventory's network.rdma; rlctl.launch.spawn)
NO_RDMA_TLS = "^ib"  # every UCX transport but InfiniBand's and RoCE's (rc, ud, dc)


def transports_for(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """The UCX_TLS an agent sets before UCX starts: NO_RDMA_TLS on a site without RDMA when none is set; None:
    UCX chooses (or the operator did)."""
    if environ.get(ENV_RDMA) == "0" and not environ.get("UCX_TLS"):
        return NO_RDMA_TLS
    return None


def _ucxx() -> Any:
    # ucxx sets UCX_MEMTYPE_CACHE at import, which recent UCX no longer reads: its warning about an unused variable
    # would go to stdout, where `rlctl launch -o json` prints the summary (set the variable to see such warnings)
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    # UCX (and ucxx, through it) logs to stdout: an endpoint's error callback when a peer goes (the controller's
    # exit, seen by the launcher) landed in the middle of `launch -o json`'s summary. Its logs go with ours, to stderr
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    tls = transports_for(os.environ)
    if tls is not None:
        os.environ["UCX_TLS"] = tls
        log.info("ucx: UCX_TLS=%s (the site's network.rdma is false)", tls)
    try:
        import ucxx  # optional extra, imported on first use
    except ImportError as e:
        raise TransportError(
            f"the ucx transport needs the optional ucxx package ({e})", hint="pip install 'rlctl[ucx]' (ucxx-cu12)"
        ) from e
    return ucxx


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _ucxx()
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="ucx-loop", daemon=True).start()
        return _loop


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, _event_loop()).result()


def _is_ucx_error(e: BaseException) -> bool:
    return type(e).__module__.startswith("ucxx")


_END_PREAMBLE = framing.PREAMBLE.pack(framing.END, 0)  # then its tag: the stream ends in order (`close`)
_END_TIMEOUT_S = 5.0  # how long close() waits for the end frame to go out


@dataclass(frozen=True)
class UcxConfig:
    limits: framing.Limits = field(default_factory=framing.Limits)
    stall_timeout_s: float = 60.0
    handshake_timeout_s: float = 10.0


# A UCX tag message shorter than the buffer posted for it completes the receive, the buffer's tail left as it was:
# ucxx reports no received length for a tag receive (its request's wait returns None; only a worker's tag_probe
# tells one, which would mean polling the worker before every part). The message's tags catch it: a header or
# frames tag that fails (a ProtocolError naming the peer), unless the tail left as it was holds the bytes sent for it
# (a fresh zeroed buffer, zeros sent): the message is then exactly the one its tags vouch for.
async def _recv_bytes(ep: Any, n: int, timeout_s: float | None) -> bytes:
    buf = np.empty(n, dtype=np.uint8)
    await _within(ep.recv(buf), timeout_s)
    return buf.tobytes()


async def _send_bytes(ep: Any, data: bytes) -> None:
    await ep.send(np.frombuffer(data, dtype=np.uint8))


async def _within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """`aw` (a UCX send or receive) within `timeout_s`, else TimeoutError; it is never cancelled but goes on until
    the caller closes the endpoint, which ends it: cancelling a UCX request in flight can deadlock inside UCX (its
    progress thread holds the worker's lock waiting for the GIL; the cancel holds the GIL waiting for that lock),
    or crash it (a receive cancelled while a large frame arrives into it: a segfault, both ends in one process)."""
    task = asyncio.ensure_future(aw)
    task.add_done_callback(_settled)
    return await asyncio.wait_for(asyncio.shield(task), timeout_s)


def _settled(task: asyncio.Future[Any]) -> None:
    """Retrieve what a UCX call given up on ended with (the endpoint's abort, most often): the caller has its error."""
    if not task.cancelled():
        task.exception()


class UcxConnection(Connection):
    def __init__(self, ep: Any, peer: str, cfg: UcxConfig, keys: auth.SessionKeys) -> None:
        super().__init__(peer)
        self._out, self._in = auth.Tagger(keys.send), auth.Tagger(keys.recv)
        self._ep = ep
        self._cfg = cfg
        self._pending: asyncio.Future[Any] | None = None  # a posted preamble receive
        self._pre = np.empty(framing.PREAMBLE.size, dtype=np.uint8)
        self._closed = False
        self._close_lock = threading.Lock()

    def _send(self, msg: Message) -> None:
        tensors = framing.wire_tensors(msg.tensors)
        head = framing.encode_header(msg, tensors)
        pre, body = head[: framing.PREAMBLE.size], head[framing.PREAMBLE.size :]
        message = self._out.next()  # tagged here, before the sends: UCX moves the bytes without this thread
        body += message.header(pre, body)  # one UCX message: the header and its tag
        views = [framing.tensor_bytes(t) for t in tensors if t.numel()]
        tag = message.frames() if views else None  # no frame bytes: the header's tag is the message's
        if tag is not None:
            for v in views:
                tag.update(v)

        stall = self._cfg.stall_timeout_s

        async def go() -> None:  # each part within the stall timeout (a UCX request tells no progress before it ends)
            await _within(_send_bytes(self._ep, pre), stall)
            await _within(_send_bytes(self._ep, body), stall)
            for v in views:
                await _within(self._ep.send(v), stall)
            if tag is not None:
                await _within(_send_bytes(self._ep, tag.tag()), stall)

        self._guard(go(), "send")

    def _recv(self, timeout_s: float | None, into: BufferProvider) -> Message:
        if self._closed:
            raise PeerUnreachable(f"{self.peer}: connection is closed")

        async def start() -> None:
            if self._pending is None:
                self._pending = asyncio.ensure_future(self._ep.recv(self._pre))
                self._pending.add_done_callback(_settled)  # ended by close() with no reader: nobody else asks
            await asyncio.wait_for(asyncio.shield(self._pending), timeout_s)
            self._pending = None

        try:
            _run(start())
        except TimeoutError as e:
            raise PeerTimeout(f"{self.peer}: no message within {timeout_s}s") from e
        except Exception as e:
            closed_here = self._closed  # close() from another thread cancelled the posted receive
            self.close()
            if closed_here or isinstance(e, CancelledError):
                raise PeerUnreachable(f"{self.peer}: connection closed on this side") from e
            if _is_ucx_error(e):
                raise PeerUnreachable(f"{self.peer}: connection closed ({e})") from e
            raise
        if self._pre.tobytes() == _END_PREAMBLE:
            self._ended()
        try:
            n = framing.parse_preamble(self._pre.tobytes(), self._cfg.limits, self.peer)
        except ProtocolError:
            self.close()  # the stream is out of sync: nothing after this can be trusted
            raise
        stall = self._cfg.stall_timeout_s

        async def rest() -> Message:
            got = await _recv_bytes(self._ep, n + auth.TAG_BYTES, stall)
            body = got[:n]
            message = self._in.next()
            message.open_header(self._pre.tobytes(), body, got[n:], peer=self.peer)  # before it sizes any buffer
            wh, specs = framing.decode_header(body, self._cfg.limits, self.peer)
            bufs = into(wh.kind, wh.header, specs)
            check_buffers(specs, bufs)
            views = [framing.tensor_bytes(b) for b in bufs if b.numel()]
            if views:  # none: the header's tag was the message's
                tag = message.frames()
                for view in views:
                    await _within(self._ep.recv(view), stall)  # a stall: `_guard` aborts the endpoint, which ends it
                    tag.update(view)
                tag.verify(await _recv_bytes(self._ep, auth.TAG_BYTES, stall), peer=self.peer, kind=wh.kind)
            return Message(wh.kind, wh.header, bufs, msg_id=wh.msg_id, reply_to=wh.reply_to)

        return self._guard(rest(), "receive")

    def _ended(self) -> NoReturn:
        """The peer's end frame (`close`): its tag proves it came after every message the peer sent, so the stream
        ended in order (PeerClosed, as a TCP peer's FIN); a wrong tag is a ProtocolError."""
        message = self._in.next()
        try:
            got = self._guard(_recv_bytes(self._ep, auth.TAG_BYTES, self._cfg.stall_timeout_s), "receive")
            message.open_header(_END_PREAMBLE, b"", got, peer=self.peer, kind="end of stream")
        finally:
            self.close()
        raise PeerClosed(f"{self.peer}: connection closed by peer")

    def _guard(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run on the loop; map failures to the error tree, closing the (out-of-sync) stream."""
        if self._closed:
            coro.close()
            raise PeerUnreachable(f"{self.peer}: connection is closed")
        try:
            return _run(coro)
        except TimeoutError as e:
            self.close()
            raise PeerTimeout(f"{self.peer}: {what} stalled for {self._cfg.stall_timeout_s:g}s") from e
        except ProtocolError:
            self.close()
            raise
        except Exception as e:
            closed_here = self._closed  # close() from another thread ended the endpoint under this call
            if not (closed_here or _is_ucx_error(e) or isinstance(e, CancelledError)):
                raise
            self.close()
            if closed_here:
                raise PeerUnreachable(f"{self.peer}: {what} ended, connection closed on this side ({e})") from e
            raise PeerUnreachable(f"{self.peer}: {what} failed, connection closed ({e})") from e

    def close(self) -> None:
        """Close the endpoint. When no message is half-sent, an end frame goes first, so the peer's next recv raises
        PeerClosed after everything sent before it (a TCP peer's FIN); otherwise (a send failed or still runs on
        another thread) the peer sees a reset."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        in_order = self._send_lock.acquire(blocking=False)  # also keeps any send from starting until the end

        async def shut() -> None:
            if in_order:
                tag = self._out.next().header(_END_PREAMBLE, b"")  # a message of its preamble alone
                with contextlib.suppress(Exception):  # a peer gone already: nothing to tell it
                    await _within(_send_bytes(self._ep, _END_PREAMBLE), _END_TIMEOUT_S)
                    await _within(_send_bytes(self._ep, tag), _END_TIMEOUT_S)
            try:
                await asyncio.wait_for(self._ep.close(), 5)
            except Exception:  # noqa: BLE001 - closing an endpoint whose peer is gone may fail; nothing to do
                self._ep.abort()
            if self._pending is not None:  # a posted preamble receive: the endpoint's end ends it, never a cancel
                await asyncio.wait({self._pending}, timeout=_END_TIMEOUT_S)

        try:
            _run(shut())
        finally:
            if in_order:
                self._send_lock.release()


class UcxListener(Listener):
    """Each endpoint's handshake runs as its own task on the loop, so a silent peer delays only itself; `accept()`
    returns the endpoints that completed it. A failed handshake is logged and closes the endpoint."""

    def __init__(self, host: str, port: int, secret: bytes, cfg: UcxConfig) -> None:
        self._secret = secret
        self._cfg = cfg
        self._queue: asyncio.Queue[tuple[Any, auth.SessionKeys]] = asyncio.Queue()
        self.address = ""

        async def on_connect(ep: Any) -> None:
            peer = f"ucx-peer->{self.address}"
            try:
                keys = await asyncio.wait_for(self._handshake(ep, peer), self._cfg.handshake_timeout_s)
            except Exception as e:  # noqa: BLE001 - any failure refuses this peer only
                log.warning("%s: refused %s: %s", self.address, peer, e or type(e).__name__)
                try:
                    await asyncio.wait_for(ep.close(), 5)
                except Exception:  # noqa: BLE001 - its peer may be gone already
                    ep.abort()
                return
            await self._queue.put((ep, keys))

        async def make() -> Any:
            return _ucxx().create_listener(on_connect, port or None)

        self._listener = _run(make())
        self.address = f"ucx://{host}:{self._listener.port}"

    def accept(self, timeout_s: float | None = None) -> Connection:
        async def next_ep() -> tuple[Any, auth.SessionKeys]:
            return await asyncio.wait_for(self._queue.get(), timeout_s)

        try:
            ep, keys = _run(next_ep())
        except TimeoutError as e:
            raise PeerTimeout(f"{self.address}: no connection within {timeout_s}s") from e
        return UcxConnection(ep, f"ucx-peer->{self.address}", self._cfg, keys)

    async def _handshake(self, ep: Any, peer: str) -> auth.SessionKeys:
        hs = auth.ServerHandshake(self._secret)
        await _send_bytes(ep, hs.hello())
        verdict, keys = hs.verdict(await _recv_bytes(ep, hs.ANSWER_BYTES, None))
        await _send_bytes(ep, verdict)
        if keys is None:
            raise AuthError(f"{peer}: refused, it does not hold this job's secret")
        return keys

    def close(self) -> None:
        self._listener.close()


# ucxx 0.52.0's ApplicationContext.create_endpoint, but for two changes. The exchange ends with the endpoint's error
# (`_unless_endpoint_fails`): a connect to a closed port waited out its timeout. An endpoint whose exchange fails is
# closed. ucxx drops it unclosed, and its stream receive still posted keeps it and its socket for the life of the
# process: a peer that accepts TCP and never answers cost descriptors per connect that timed out (20 connects, after
# gc: 21 -> 41 fds to a port that speaks no UCX, 22 -> 62 to a UCX listener whose loop never runs its handler), so an
# agent retrying it for days ran out. The parts it takes are ucxx's private API; a ucxx that moved them connects
# through its own create_endpoint (each failed connect then leaks again, and a refused one waits out its timeout:
# tests/unit/transport/test_transport_ucx.py).
async def _create_endpoint(host: str, port: int, timeout_s: float) -> Any:
    """A ucxx Endpoint to host:port after ucxx's peer-info exchange (its tags), as ucxx.create_endpoint makes it."""
    ucxx = _ucxx()
    try:
        from ucxx._lib.libucxx import UCXEndpoint
        from ucxx._lib_async.endpoint import Endpoint
        from ucxx._lib_async.exchange_peer_info import exchange_peer_info
        from ucxx._lib_async.utils import hash64bits
        from ucxx.exceptions import UCXMessageTruncatedError

        ctx = ucxx.core._get_ctx()
    except (ImportError, AttributeError) as e:
        log.debug("ucx: connecting through ucxx.create_endpoint (ucxx %s: %s)", ucxx.__version__, e)
        return await ucxx.create_endpoint(host, port, connect_timeout=timeout_s)
    ctx.continuous_ucx_progress()
    ucx_ep = UCXEndpoint.create(ctx.worker, host, port, True)  # True: endpoint errors raise, not end the process
    if not ctx.progress_mode.startswith("thread"):
        ctx.worker.progress()
    msg_tag = hash64bits("msg_tag", os.urandom(16), ucx_ep.handle)  # this side's receive tag, told to the peer
    try:
        try:
            exchange = exchange_peer_info(endpoint=ucx_ep, msg_tag=msg_tag, listener=False, connect_timeout=timeout_s)
            peer = await _unless_endpoint_fails(ucx_ep, exchange, timeout_s)
        except UCXMessageTruncatedError:
            ucx_ep.raise_on_error()  # the peer closed during the exchange: its endpoint error, when there is one
            raise
    except BaseException:
        ucx_ep.close_blocking(period=10**10, max_attempts=1)  # as Endpoint.abort: at most 10 s
        ucx_ep.remove_close_callback()
        raise
    return Endpoint(endpoint=ucx_ep, ctx=ctx, tags={"msg_send": peer["msg_tag"], "msg_recv": msg_tag})


_EP_ERROR_POLL_S = 0.025  # how often a connect's peer-info exchange looks for its endpoint's error


async def _unless_endpoint_fails(ucx_ep: Any, exchange: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """`exchange` (ucxx's peer-info exchange), ended with the endpoint's error as soon as UCX reports one, or with
    TimeoutError after `timeout_s` in all (ucxx bounds its send and its receive by the timeout each: up to twice it).
    Its stream receive is not ended by that error, most times (a refused connect: UCX reports it within ms, and the
    receive stays in progress, even after the endpoint is closed), so a connect to a closed port waited out its whole
    timeout. It is ended as its own timeout ends it, by cancelling the wait (the endpoint has failed: nothing can
    arrive into it)."""
    task = asyncio.ensure_future(exchange)
    deadline = time.monotonic() + timeout_s
    try:
        while not (await asyncio.wait({task}, timeout=_EP_ERROR_POLL_S))[0]:
            ucx_ep.raise_on_error()
            if time.monotonic() >= deadline:
                raise TimeoutError(f"peer-info exchange took over {timeout_s:g}s")
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
            _settled(task)


class UcxTransport(Transport):
    scheme = "ucx"

    def __init__(self, *, secret: bytes, config: UcxConfig | None = None) -> None:
        if not secret:
            raise ValueError("a per-job secret is required (non-empty bytes)")
        _ucxx()
        self._secret = secret
        self.config = config or UcxConfig()

    def listen(self, address: str) -> Listener:
        host, port = split_address(address, self.scheme)
        return UcxListener(host, port, self._secret, self.config)

    def connect(self, address: str, timeout_s: float) -> Connection:
        host, port = split_address(address, self.scheme)

        async def go() -> tuple[Any, auth.SessionKeys]:
            # one deadline for the whole connect: each wait takes what is left of it, so a peer that paces its
            # handshake cannot hold the connect for a multiple of timeout_s
            deadline = time.monotonic() + timeout_s

            def left() -> float:
                return max(0.0, deadline - time.monotonic())

            ep = await _create_endpoint(host, port, timeout_s)
            try:
                hs = auth.ClientHandshake(self._secret, address)
                hello = await _recv_bytes(ep, hs.HELLO_BYTES, left())
                await _within(_send_bytes(ep, hs.answer(hello)), left())
                return ep, hs.keys(await _recv_bytes(ep, auth.VERDICT_BYTES, left()))
            except BaseException:
                ep.abort()  # ends a handshake receive still posted (a timed-out one is never cancelled: `_within`)
                raise

        try:
            ep, keys = _run(go())
        except TimeoutError as e:
            raise PeerTimeout(f"{address}: connect timed out after {timeout_s}s") from e
        except Exception as e:
            if _is_ucx_error(e):
                raise PeerUnreachable(f"{address}: connect failed ({e})") from e
            raise
        return UcxConnection(ep, address, self.config, keys)
