"""Authentication of a connection, sans I/O (shared by tcp and ucx): the handshake that proves both ends hold
the job's secret, and the per-message tags that prove every message after it came from that peer, unaltered,
in order.

Handshake (HMAC-SHA256 with the per-job secret, both directions, fixed sizes, before any message):

    server → client   "RLH1" | server_nonce (32)                                   ServerHandshake.hello
    client → server   client_nonce (32) | HMAC(secret, "c" | server_nonce | client_nonce)   ClientHandshake.answer
    server → client   "OK" | HMAC(secret, "s" | client_nonce | server_nonce)     ServerHandshake.verdict
                  or  "NO" | 32 zero bytes, and close

Both ends then derive one key per direction, HMAC(secret, "k" | direction | server_nonce | client_nonce):
fresh for every connection, so a message recorded on one connection is worthless on any other.

Every message then carries two 16-byte tags under the direction's key (a subkey per use), both bound to the
message's sequence number: its header's, right after the header — keyed BLAKE2b of sequence | preamble | header —
which the receiver checks before it parses the header or allocates anything the header asks for (a forged header
could otherwise make it allocate up to `Limits.max_message_bytes`); then, when the message has frame bytes, its
frames', after the last frame, over the header's tag and every frame byte: keyed BLAKE2b of sequence | bytes up to
`ONE_SHOT_BYTES`, else AES-256-GMAC (GCM over no plaintext) with the sequence number as its nonce. A message
without frame bytes is all preamble and header: the header's tag is its only one.

    sender   MessageTag(seq) ─ header(preamble, header) ─▶ wire
             .frames(n) ─ update(frame bytes as they are sent) ─▶ tag() ─▶ wire
    receiver MessageTag(seq) ─ open_header(preamble, header, the 16 bytes after it) ─▶ parse it, allocate
             .frames(n) ─ update(… as they arrive) ─▶ verify(the 16 bytes after the frames)

With `transport.encrypt` a message is sealed instead (AES-256-GCM, `Sealer`): its header and its frames
encrypted, each part with its own tag; only the preamble (magic, header length) crosses in clear.

A message that fails (altered, replayed, reordered, from another connection or another job) is a
ProtocolError and closes the connection. A header that fails is refused before its BufferProvider is asked for
anything; frames that fail have already been written into the buffers it gave (the bytes are authenticated
after they land): those buffers hold unauthenticated bytes when `recv` raises. Frames up to `ONE_SHOT_BYTES` are
tagged in one call (≈ 1 µs), as is every header; longer ones are streamed through OpenSSL's GHASH (AES-NI +
carry-less multiply: several GB/s per core), and from `LANE_MIN_BYTES` on a thread of the connection's own,
beside the one that sends or receives the bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from rlctl.errors import AuthError, CredentialsRefused, ProtocolError

HELLO = b"RLH1"
NONCE_BYTES = 32
MAC_BYTES = 32  # a handshake proof (HMAC-SHA256)
VERDICT_BYTES = 2 + MAC_BYTES
TAG_BYTES = 16  # a header's or frames' tag (BLAKE2b or GMAC)
ONE_SHOT_BYTES = 64 << 10  # messages up to this size are tagged in one call
LANE_MIN_BYTES = 4 << 20  # messages from this size are tagged on a thread beside the one moving their bytes
BATCH_BYTES = 1 << 20  # received bytes are handed to the tag in pieces of about this size


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"c" + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, b"s" + client_nonce + server_nonce, hashlib.sha256).digest()


@dataclass(frozen=True)
class SessionKeys:
    """One connection's keys: what this end tags its messages with, and what it checks the peer's with."""

    send: bytes
    recv: bytes

    @staticmethod
    def derive(secret: bytes, server_nonce: bytes, client_nonce: bytes, *, server: bool) -> SessionKeys:
        c2s, s2c = (
            hmac.new(secret, b"k" + d + server_nonce + client_nonce, hashlib.sha256).digest() for d in (b">", b"<")
        )
        return SessionKeys(send=s2c, recv=c2s) if server else SessionKeys(send=c2s, recv=s2c)

    @staticmethod
    def pair(secret: bytes = b"test") -> tuple[SessionKeys, SessionKeys]:
        """Matching keys for two ends joined without a handshake (a socketpair): (client's, server's)."""
        sn, cn = os.urandom(NONCE_BYTES), os.urandom(NONCE_BYTES)
        return SessionKeys.derive(secret, sn, cn, server=False), SessionKeys.derive(secret, sn, cn, server=True)


class ServerHandshake:
    """The listening end: `hello()` to send, then `verdict(answer)` → (bytes to send, keys or None if refused)."""

    HELLO_BYTES = len(HELLO) + NONCE_BYTES
    ANSWER_BYTES = NONCE_BYTES + MAC_BYTES

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._nonce = os.urandom(NONCE_BYTES)

    def hello(self) -> bytes:
        return HELLO + self._nonce

    def verdict(self, answer: bytes) -> tuple[bytes, SessionKeys | None]:
        client_nonce, proof = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
        if len(answer) != self.ANSWER_BYTES or not hmac.compare_digest(
            proof, client_proof(self._secret, self._nonce, client_nonce)
        ):
            return b"NO" + bytes(MAC_BYTES), None
        keys = SessionKeys.derive(self._secret, self._nonce, client_nonce, server=True)
        return b"OK" + server_proof(self._secret, self._nonce, client_nonce), keys


class ClientHandshake:
    """The connecting end: `answer(hello)` to send, then `keys(verdict)` (AuthError when refused or unproven)."""

    HELLO_BYTES = len(HELLO) + NONCE_BYTES

    def __init__(self, secret: bytes, peer: str) -> None:
        self._secret = secret
        self._peer = peer
        self._nonce = os.urandom(NONCE_BYTES)
        self._server_nonce = b""

    def answer(self, hello: bytes) -> bytes:
        if hello[: len(HELLO)] != HELLO or len(hello) != self.HELLO_BYTES:
            raise ProtocolError(f"{self._peer}: not an rlctl endpoint (bad hello)")
        self._server_nonce = hello[len(HELLO) :]
        return self._nonce + client_proof(self._secret, self._server_nonce, self._nonce)

    def keys(self, verdict: bytes) -> SessionKeys:
        if verdict[:2] != b"OK":
            raise CredentialsRefused(
                f"{self._peer}: refused our credentials; check that both sides use this job's secret"
            )
        if not hmac.compare_digest(verdict[2:], server_proof(self._secret, self._server_nonce, self._nonce)):
            raise AuthError(f"{self._peer}: server failed to prove it holds this job's secret")
        return SessionKeys.derive(self._secret, self._server_nonce, self._nonce, server=False)


class MessageTag:
    """The two tags of one message (see the module docstring): its header's, made or checked before anything reads
    the header, then — when the message has frame bytes — its frames' (`frames`, bound to the header's tag)."""

    def __init__(self, tagger: Tagger, seq: int) -> None:
        self._tagger = tagger
        self._seq = seq
        self._header_tag = b""

    def _of_header(self, preamble: bytes, body: bytes) -> bytes:
        h = hashlib.blake2b(self._seq.to_bytes(12, "big"), key=self._tagger.header_key, digest_size=TAG_BYTES)
        h.update(preamble)
        h.update(body)
        self._header_tag = h.digest()
        return self._header_tag

    def header(self, preamble: bytes, body: bytes) -> bytes:
        """The tag that goes right after the header."""
        return self._of_header(preamble, body)

    def open_header(self, preamble: bytes, body: bytes, tag: bytes, *, peer: str, kind: str | None = None) -> None:
        """Check a received header's tag before the header is parsed or sized from (ProtocolError when it fails)."""
        if not hmac.compare_digest(self._of_header(preamble, body), tag):
            raise _refused(peer, kind)

    def frames(self, nbytes: int = 0) -> FramesTag:
        """The tag of this message's `nbytes` frame bytes, after its header's (made or checked first)."""
        assert self._header_tag, "the header's tag comes first"
        tag = FramesTag(self._tagger.key, self._tagger.aes, self._seq, self._tagger.lane(nbytes))
        tag.update(self._header_tag)
        return tag


class FramesTag:
    """The tag of a message's frames, fed the header's tag then the frame bytes in order (see the module docstring).
    With a `lane` (a one-thread executor: OpenSSL releases the GIL) the bytes are tagged there, in order, while the
    caller sends or receives the next ones; the views passed must stay unchanged until `tag()`."""

    def __init__(self, key: bytes, aes: algorithms.AES, seq: int, lane: ThreadPoolExecutor | None = None) -> None:
        self._key, self._aes = key, aes
        self._nonce = seq.to_bytes(12, "big")
        self._parts: list[bytes | bytearray | memoryview] | None = []  # small messages: gathered (not copied)
        self._size = 0
        self._stream: Any = None
        self._lane = lane
        self._last: Future[None] | None = None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._lane is not None:
            self._last = self._lane.submit(self._update, data)
        else:
            self._update(data)

    def _update(self, data: bytes | bytearray | memoryview) -> None:
        if self._parts is not None:
            self._size += len(data) if not isinstance(data, memoryview) else data.nbytes
            if self._size <= ONE_SHOT_BYTES:
                self._parts.append(data)
                return
            self._stream = Cipher(self._aes, modes.GCM(self._nonce)).encryptor()
            for p in self._parts:
                self._stream.authenticate_additional_data(p)
            self._parts = None
        self._stream.authenticate_additional_data(data)

    def tag(self) -> bytes:
        if self._last is not None:
            self._last.result()  # every update before it has run (one thread, in order)
        if self._parts is not None:  # small: keyed BLAKE2b, which (unlike OpenSSL's GCM) keeps the GIL on small inputs
            h = hashlib.blake2b(self._nonce, key=self._key, digest_size=TAG_BYTES)
            for p in self._parts:
                h.update(p)
            return h.digest()
        self._stream.finalize()
        return bytes(self._stream.tag)

    def verify(self, tag: bytes, *, peer: str, kind: str) -> None:
        if not hmac.compare_digest(self.tag(), tag):
            raise _refused(peer, kind)


class Tagger:
    """One direction of a connection: the tags of its next message (sequence numbers 0, 1, 2, …); a message with at
    least `LANE_MIN_BYTES` of frames has them tagged on this direction's lane thread (started on first use)."""

    def __init__(self, key: bytes) -> None:
        # one subkey per use, never the same key for two: headers' BLAKE2b, frames' BLAKE2b, frames' GMAC
        self.header_key = hmac.digest(key, b"blake2b-header", "sha256")
        self.key = hmac.digest(key, b"blake2b", "sha256")
        self.aes = algorithms.AES(hmac.digest(key, b"aes-gmac", "sha256"))
        self._seq = 0
        self._lane: ThreadPoolExecutor | None = None
        self._closed = False

    def next(self) -> MessageTag:
        tag = MessageTag(self, self._seq)
        self._seq += 1
        return tag

    def lane(self, nbytes: int) -> ThreadPoolExecutor | None:
        """The lane thread for a message's `nbytes` of frames; None: tagged inline."""
        if nbytes < LANE_MIN_BYTES or self._closed:  # closed: tagged inline, and the send fails on its socket
            return None
        if self._lane is None:
            self._lane = ThreadPoolExecutor(1, thread_name_prefix="tag")
        return self._lane

    def close(self) -> None:
        """Stop the lane thread; a message tagged after this (a send racing the connection's close) is tagged
        inline, never on the stopped lane."""
        self._closed = True
        if self._lane is not None:
            self._lane.shutdown(wait=False)
            self._lane = None


class Sealer:
    """One direction of an encrypted connection (`transport.encrypt`): message n is sealed under the direction's
    own subkey (AES-256-GCM) in two parts, each with its own nonce (n and a part byte): its header — encrypted,
    the preamble (magic and header length) as additional data, its tag right after it, so the receiver parses
    only a header it has authenticated — then, when the message has frame bytes, its frames, encrypted with the
    header's tag as additional data (bound to that header), their tag last. It replaces the message's
    GMAC/BLAKE2b tag (`Tagger`) on such a connection: of a message, only the preamble crosses in clear."""

    HEADER, FRAMES = b"h", b"f"

    def __init__(self, key: bytes) -> None:
        self._aes = algorithms.AES(hmac.digest(key, b"aes-gcm-seal", "sha256"))
        self._seq = 0

    def next(self) -> Seal:
        seal = Seal(self._aes, self._seq)
        self._seq += 1
        return seal


class Seal:
    """The two GCM parts of one sealed message (see `Sealer`)."""

    def __init__(self, aes: algorithms.AES, seq: int) -> None:
        self._aes = aes
        self._seq = seq.to_bytes(11, "big")
        self.header_tag = b""

    def _cipher(self, part: bytes) -> Cipher[modes.GCM]:
        return Cipher(self._aes, modes.GCM(self._seq + part))

    def seal_header(self, preamble: bytes, body: bytes) -> bytes:
        """The header's ciphertext followed by its tag."""
        enc = self._cipher(Sealer.HEADER).encryptor()
        enc.authenticate_additional_data(preamble)
        out = enc.update(body) + enc.finalize()
        self.header_tag = enc.tag
        return out + enc.tag

    def open_header(self, preamble: bytes, sealed: bytes, *, peer: str) -> bytes:
        """The header of `sealed` (ciphertext then tag), authenticated; ProtocolError when it fails."""
        from cryptography.exceptions import InvalidTag

        dec = self._cipher(Sealer.HEADER).decryptor()
        dec.authenticate_additional_data(preamble)
        body = dec.update(sealed[:-TAG_BYTES])
        try:
            dec.finalize_with_tag(sealed[-TAG_BYTES:])
        except InvalidTag:
            raise _refused(peer, None) from None
        self.header_tag = sealed[-TAG_BYTES:]
        return body

    def frames_encryptor(self) -> Any:
        enc = self._cipher(Sealer.FRAMES).encryptor()
        enc.authenticate_additional_data(self.header_tag)
        return enc

    def frames_decryptor(self) -> Any:
        dec = self._cipher(Sealer.FRAMES).decryptor()
        dec.authenticate_additional_data(self.header_tag)
        return dec


def open_tag(decryptor: Any, tag: bytes, *, peer: str, kind: str) -> None:
    """Check a sealed message's frames' tag once they are decrypted (ProtocolError when it fails)."""
    from cryptography.exceptions import InvalidTag

    try:
        decryptor.finalize_with_tag(tag)
    except InvalidTag:
        raise _refused(peer, kind) from None


def _refused(peer: str, kind: str | None) -> ProtocolError:
    """A message whose tag did not check out (tagged or sealed; `kind` None: a sealed header)."""
    what = f"message {kind[:40]!r}" if kind is not None else "a message's header"
    return ProtocolError(
        f"{peer}: {what} failed authentication (altered, replayed, or not from this connection's peer)"
    )
