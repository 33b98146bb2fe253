"""The controller's dispatch (`Dispatch`): each event of the inbox (a hello, a peer's message, its connection's
end, the scaler's and the reward pool's posts) handed to the core or the part that owns it; a message not its
sender's to send, or naming a version the job is not at, dropped saying why (`SENDERS`, `_wrong`)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any, cast

from rlctl.agents.controller_base import Peer
from rlctl.agents.controller_members import Membership
from rlctl.agents.controller_rows import Rows
from rlctl.agents.controller_stop import StopRequests
from rlctl.agents.messages import STOP_GRACE_S, CheckpointWritten, Heartbeat, Partial, SampleDone, Trained, parse
from rlctl.agents.views import status
from rlctl.errors import PeerClosed
from rlctl.transport import Message

log = logging.getLogger(__name__)

# who may send what to the controller (a kind not listed here is dropped from anyone)
SENDERS: dict[str, frozenset[str]] = {
    "sample": frozenset({"rollout"}),
    "evaluated": frozenset({"rollout"}),
    "partial": frozenset({"rollout"}),
    "withdrawn": frozenset({"rollout"}),
    "weights_applied": frozenset({"rollout"}),
    "weights_skipped": frozenset({"rollout"}),
    "trained": frozenset({"trainer"}),
    "checkpoint_written": frozenset({"trainer"}),
    "heartbeat": frozenset({"rollout", "trainer"}),
    "bye": frozenset({"rollout", "trainer"}),
    "status": frozenset({"client", "rollout", "trainer"}),
    "scale": frozenset({"client"}),
    "shutdown": frozenset({"client"}),
}


def _parts(msg: Message, report: Partial) -> list[tuple[str, int, list[int], list[float], list[int]]]:
    """The parts of a partial report (`report`, the header of a `partial` or `withdrawn` message `msg`): sample id,
    start, tokens, log-probs, versions."""
    tokens, logprobs, versions = (t.tolist() for t in msg.tensors)
    out, at = [], 0
    for p in report.parts:
        end = at + p.count
        out.append((p.sample_id, p.start, tokens[at:end], logprobs[at:end], versions[at:end]))
        at = end
    return out


class Dispatch(Membership, StopRequests, Rows):
    """Each inbox event handed to the part that acts on it."""

    def _handle(self, what: str, who: Any, payload: Any) -> None:
        if what == "hello":
            self._hello(who, payload)
            return
        if what == "spawned":
            self.scaler.spawned(who, payload)
            return
        if what == "not_joining":
            gone, queued = payload
            self.scaler.not_joining(gone, now=time.monotonic(), queued=queued)
            return
        if what == "unjoined_stopped":
            self.scaler.unjoined_stopped(who, payload)
            return
        if what == "scored":
            attempt, reward = payload
            self._send(self.core.scored(who, attempt=attempt, reward=reward))
            return
        if what == "unscored":  # a sample still waiting for this call would wait for ever: the job fails, saying so
            why = self.task.reward_failure()
            self.core.failed = self.core.failed or self.core.reward_lost(who, attempt=payload, why=why)
            return
        if what == "eval_scored" and self.evaluator is not None:
            why = self.task.reward_failure() if payload is None else None
            if why is not None:  # not the job ending: the pool that scores its evaluations stopped for good
                self.core.failed = self.core.failed or f"the held-out evaluation of v{who} cannot be scored ({why})"
            self.evaluator.scored(who, payload)
            return
        peer = self.peers.get(who)
        if peer is None:
            return
        if what == "closed":
            conn, err, heard = payload
            if conn is not peer.conn:  # the end of a connection this agent already replaced
                return
            if peer.state == "running" and peer.role != "client":
                closed = isinstance(err, PeerClosed)  # in order
                # a send that failed before the reader heard the end (and closed the connection, ending the
                # read) says why; a reset or a bad message the reader heard first says it itself
                reason = str(err)
                if not closed and peer.broken is not None and peer.broken_since <= heard:
                    reason = peer.broken
                self._lose(who, reason, at=heard, closed=closed)
            if peer.role == "client":
                del self.peers[who]
            return
        msg, heard = cast("tuple[Message, float]", payload)
        peer.last_seen = time.monotonic()
        if peer.state == "unreachable":
            self._rejoin(peer, version=peer.figures.version, new_connection=False)
        self._message(peer, msg, heard)

    def _message(self, peer: Peer, msg: Message, heard: float) -> None:
        """Act on a message from `peer` (heard at `heard`), or drop it saying why (`_wrong`): in the loop, and for
        the kinds a stopping controller still books (`_shutdown`)."""
        who = peer.name
        if (why := self._wrong(peer, msg)) is not None:
            log.warning("controller: dropped %s from %s: %s", msg.kind, who, why)
            return
        if msg.kind == "sample":
            s = parse(msg, SampleDone)
            self.scaler.sampled(who)
            refused = self.core.ledger.refused
            self._send(
                self.core.sample(
                    who,
                    sample_id=s.sample_id,
                    version=s.version,
                    output_tokens=s.num_output_tokens,
                    payload=msg.tensors,
                    reward=None,
                    attempt=s.attempt or None,
                )
            )
            if self.core.ledger.refused > refused:
                log.warning("controller: dropped sample %r from %s: not dispatched to it", s.sample_id[:80], who)
            else:
                self._score(s.sample_id, msg.tensors)
        elif msg.kind == "partial":
            report = parse(msg, Partial)
            for sample_id, start, tokens, logprobs, versions in _parts(msg, report):
                self.core.partial(
                    who,
                    sample_id=sample_id,
                    start=start,
                    tokens=tokens,
                    logprobs=logprobs,
                    versions=versions,
                    made_s=report.made_s,
                    heard_s=heard,
                )
            self.core.reported(who, free_rows=report.free_rows)
        elif msg.kind == "withdrawn":
            self._send(
                self.core.withdrawn(who, [(sid, t, lp, v) for sid, _, t, lp, v in _parts(msg, parse(msg, Partial))])
            )
            for m in self.core.migrations:
                self.jobdir.event("migrated", **m)
                log.info("controller: %(samples)d samples (%(tokens)d tokens so far) moved from %(from)s to %(to)s", m)
            self.core.migrations.clear()
        elif msg.kind in ("weights_applied", "weights_skipped"):
            version = int(msg.header["version"])
            node = self.book.nodes.get(str(msg.header.get("holder", "")))
            holder = node.agent if node is not None else ""
            fields = {
                "source": holder,
                "encoding": msg.header.get("encoding"),
                "base": msg.header.get("base_version"),
                "bytes": msg.header.get("wire_bytes"),
                "fetch_s": msg.header.get("fetch_s"),
                "xxh3": msg.header.get("xxh3"),
            }
            self.applied.add(msg.kind, who, version, fields, now=heard)
            self._flush_applied(heard)  # (the version's row, when this unit was the last live one to report it)
            self._transfer(who, version, msg.header, applied=msg.kind == "weights_applied")
            if msg.kind == "weights_applied":
                self._send(self.core.weights_applied(who, version))
                self._evaluate(who, version)
        elif msg.kind == "evaluated":
            if self.evaluator is not None:
                self.evaluator.answered(who, msg)
        elif msg.kind == "trained":
            self._trained(parse(msg, Trained))
        elif msg.kind == "checkpoint_written":
            self._send(self._checkpoint(parse(msg, CheckpointWritten)))
        elif msg.kind in ("heartbeat", "bye"):
            peer.figures = parse(msg, Heartbeat)
            if msg.kind == "bye":
                peer.state = "stopped"
                if self.evaluator is not None:  # a unit retired after a drain: what it was evaluating is lost
                    self.evaluator.lost(who)
        elif msg.kind == "status":
            self._reply_status(peer, msg)
        elif msg.kind == "scale":
            reply, outs = self.scaler.scale(int(msg.header["delta"]), msg.header.get("site"), reason="manual")
            self._send(outs)
            self._reply(peer, msg, reply)
        elif msg.kind == "shutdown" and msg.header.get("failed"):  # the launcher's: the loop ends, failed
            self.core.failed = self.core.failed or str(msg.header["failed"])
            self._reply(peer, msg, {"ok": True, "grace_s": STOP_GRACE_S, "checkpoint": None})
        elif msg.kind == "shutdown":
            self._reply(peer, msg, self._stop_asked(peer.name, msg.header.get("grace_s")))
        else:
            log.warning("controller: unexpected %r from %s", msg.kind, who)

    def _score(self, sample_id: str, tensors: list[Any]) -> None:
        """Score a finished sample (its output tokens are its payload's first tensor): at once when the task's
        verifier is in-line, else when the reward pool answers (an event on the inbox, for this attempt only)."""
        attempt = self.core.awaiting_reward(sample_id)
        if attempt is None:
            return
        entry = self.core.ledger.entries[sample_id]
        future = self.task.score(sample_id, entry.prompt_id, tensors[0].tolist())
        if future.done() and not future.cancelled():  # (one cancelled at once: the reward pool had failed)
            self._send(self.core.scored(sample_id, attempt=attempt, reward=future.result()))
        else:  # a call cancelled: given up on (`unwanted`), or the pool closed (at the job's end, or it failed)

            def post(f: Future[float]) -> None:
                if f.cancelled():
                    self.inbox.put(("unscored", sample_id, attempt))
                else:
                    self.inbox.put(("scored", sample_id, (attempt, f.result())))

            future.add_done_callback(post)

    def _wrong(self, peer: Peer, msg: Message) -> str | None:
        """Why a well-formed message (its header passed `messages.check`) is not for the controller to act on:
        not its sender's to send, or naming a version or iteration the job is not at. None when it is."""
        if peer.role not in SENDERS.get(msg.kind, ()):
            return f"a {peer.role} does not send it (only: {', '.join(sorted(SENDERS.get(msg.kind, ())))})"
        if msg.kind in ("weights_applied", "weights_skipped"):
            version = int(msg.header["version"])
            if not self.core.known(peer.name):
                return "not a rollout unit of this job"
            # a unit may apply the version the trainer just published before the trainer's `trained` is here
            if version > self.core.trainer_version + 1:
                return f"version {version}: the trainer has published up to {self.core.trainer_version + 1}"
        if msg.kind == "trained":
            iteration, version = int(msg.header["iteration"]), int(msg.header["version"])
            if iteration != self.core.trainer_version or version != iteration + 1:
                return (
                    f"iteration {iteration} → version {version}, and the trainer is at version "
                    f"{self.core.trainer_version} (expected iteration {self.core.trainer_version} → "
                    f"{self.core.trainer_version + 1})"
                )
            buffers = self.core.buffers
            if not buffers.ready(iteration):
                return (
                    f"iteration {iteration} is not complete: {buffers.capacity - buffers.free(iteration)} of its "
                    f"{buffers.capacity} groups were delivered"
                )
        if msg.kind == "bye" and not self._told_to_stop(peer.name):
            # a stopped agent is never watched again: what it held would wait for ever. Still running, it is
            # counted lost as any other when its connection ends or it falls silent
            return "it was not told to stop"
        if msg.kind == "checkpoint_written" and int(msg.header["version"]) not in self.writing:
            return f"no checkpoint of version {msg.header['version']} is being written"
        return None

    def _reply_status(self, peer: Peer, request: Message) -> None:
        self._reply(peer, request, status(self.snapshot(), now=time.monotonic()))
