"""The rollout agent: one SGS data-parallel unit running a generation engine (StreamRL §4.1).

    controller ──generate──▶ inbox ─┐                         ┌─▶ sample (at once, with its version)
    trainer ──weights──▶ inbox ─────┼─▶ main loop ─ engine.step()
                                    │     safe point between steps: load_weights → weights_applied
                                    │       (a version a newer one overtook before it: weights_skipped)
    heartbeat thread ───────────────┘

The main loop never blocks while the engine has work: it drains the inbox, swaps weights if a new
version arrived (only between steps), runs one decode step, and sends every finished sample
immediately (stream generation). With nothing to do it waits on the inbox.

Partial rollouts: every `rollout.partial_report_s` seconds, and after every `rollout.partial_report_steps`
decode steps, the unit sends the controller what each running generation produced since the last report
(`partial`: tokens, log-probs, versions). A generation this
unit does not finish (it is lost) resumes from there on another unit (a request with a prefix).
`withdraw n` (the controller moving work to a unit with free rows) takes n requests out of the engine —
those it would admit last, then the running ones with the least output — and sends them back whole
(`withdrawn`).

Held-out evaluation (`evaluate`, rlctl.agents.evaluation): greedy requests in the same batches as the rollout
work, admitted before any iteration's as rows free (group EVAL_GROUP: they finish soonest, so that as few weight
versions as may decode them) and holding no iteration's back once admitted; their outputs go back together in one
`evaluated` once the last finishes. They are never reported, withdrawn or sent as samples, and the flight record
leaves their tokens out.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from typing import Any

import torch

from rlctl.agents.common import AgentContext, ControllerLink, job_context
from rlctl.agents.flight import FlightRecord
from rlctl.agents.listen import host_of
from rlctl.agents.listen import listen_host as resolve_listen_host
from rlctl.agents.messages import (
    TO_WEIGHTS_LISTENER,
    Evaluate,
    Evaluated,
    Generate,
    Heartbeat,
    Hello,
    Partial,
    PartialPart,
    SampleDone,
    Withdraw,
    make,
    parse,
    recv_checked,
)
from rlctl.agents.watchdog import Watchdog
from rlctl.agents.weights import fetch_weights, state_dict_of, weight_node
from rlctl.devices import Compute
from rlctl.engines import make_engine
from rlctl.engines.base import GenRequest, GenResult, Prefix
from rlctl.engines.compiletools import compile_tools, compile_tools_problem
from rlctl.errors import RlctlError, TransportError
from rlctl.launch.agentenv import parallel_from_env
from rlctl.rl.source import stop_ids
from rlctl.transport import Connection, Listener, Message
from rlctl.weights.node import FetchRefused

log = logging.getLogger(__name__)

EVAL_GROUP = -1  # the admission group of held-out evaluation requests: before any iteration's
FETCH_RETRY_S = 5.0  # a version no holder could deliver is fetched again after this pause
WEIGHTS_REFUSED = "weights_refused"  # the fetch thread's last word to the main loop: every holder refused this unit
# reported with `weights_applied` (or `weights_skipped`: fetched, never applied)
TRANSFER_FIELDS = ("fetch_s", "wire_bytes", "encoding", "base_version", "holder", "xxh3")


def refuse_uncompilable(compute: Compute | None) -> None:
    """RlctlError, one line, as the unit starts, where this host lacks what its compiled step needs (`compiletools`),
    versus inductor's traceback at its first decode step, after it joined and took its share of the samples."""
    gpu = compute is not None and compute.is_cuda
    if (why := compile_tools_problem(compile_tools(), gpu=gpu, there="on this host")) is not None:
        raise RlctlError(f"rollout.compile: true: on {os.uname().nodename}, {why}")


class RolloutAgent:
    def __init__(
        self, ctx: AgentContext, *, replica: int, listen_host: str | None = None, compute: Compute | None = None
    ) -> None:
        self.ctx = ctx
        self.name = f"rollout-{replica}"
        job = ctx.job
        listen_host = listen_host or resolve_listen_host(job, toward=host_of(ctx.controller))
        algo = job.algorithm
        eos = stop_ids(job, ctx.jobdir.init_model) or None
        # the embedded engine's group barrier is its own knob; vLLM pages its KV cache (no barrier needed)
        # on the unit's device, in the checkpoint's dtype on a GPU (rlctl.devices)
        kw: dict[str, Any] = {"group_barrier": job.rollout.group_barrier, "compile_step": job.rollout.compile}
        if job.rollout.engine == "embedded" and job.rollout.compile:
            refuse_uncompilable(compute)
        if compute is not None:
            kw |= {"device": compute.device, "dtype": compute.engine_dtype}
        if job.rollout.engine == "vllm":  # tensor parallel over the unit's GPU slice (the plan's tp)
            kw = {
                "tensor_parallel": int(parallel_from_env().get("tp") or job.rollout.tensor_parallel or 1),
                "on_new_weights": "keep" if job.rollout.on_new_weights == "keep" else "recompute",
            }
        kw["context"] = job_context(job)  # (the checkpoint's max_position_embeddings may be 1,024,000)
        self.engine = make_engine(
            job.rollout.engine,
            ctx.jobdir.init_model,
            max_batch_size=job.rollout.max_batch_size,
            temperature=algo.temperature,
            # a request's sampling noise is a function of (job seed, sample id) only, never of the unit that
            # runs it: a sample requeued to another unit (lost unit, resume) regenerates identically
            seed=job.seed,
            eos_token_ids=eos,
            **kw,
        )
        describe = getattr(self.engine, "describe", None)
        if describe is not None:
            log.info("%s: %s", self.name, describe())
        self.inbox: queue.Queue[Message | None] = queue.Queue()
        self.busy_s = 0.0
        self.samples_sent = 0
        self.holding: set[str] = set()  # sample ids queued or running in the engine
        self.reported: dict[str, int] = {}  # running sample → output tokens the controller has (partial reports)
        self.order: dict[str, tuple[int, float]] = {}  # held sample → (iteration, priority): its admission order
        self.attempt: dict[str, int] = {}  # held sample → the dispatch it was admitted from (`Request.attempt`)
        self.evaluating: dict[str, tuple[int, int]] = {}  # held-out request → (its evaluation's version, index)
        self.evaluations: dict[int, list[GenResult | None]] = {}  # version → its requests' results, in order
        self.eval_tokens: dict[str, int] = {}  # held-out request in the engine → its output tokens so far
        self.report_every = job.rollout.partial_report_s
        self.report_steps = job.rollout.partial_report_steps
        self.last_report = time.monotonic()
        self.steps_unreported = 0  # decode steps since the last report
        self.flight = FlightRecord(ctx.jobdir.flight(self.name))  # what a kill would cost (agents.flight)
        self.state = "starting"
        scheme = job.transport.kind
        # weights arrive on their own connection(s); `inproc://` lets the transport pick a name
        self.listener: Listener = ctx.transport.listen(
            "inproc://" if scheme == "inproc" else f"{scheme}://{listen_host}:0"
        )
        # …and pull versions from the trainer's weight node into this agent's own node
        self.node = weight_node(
            ctx.transport,
            "inproc://" if scheme == "inproc" else f"{scheme}://{listen_host}:0",
            job.weight_sync,
            timeout_s=job.transport.timeout_s,
        )
        # the newest announcement not fetched yet, from any weights connection; one fetcher pulls it (two fetches at
        # once, one per connection after the trainer reconnected, would pull a version twice)
        self.announced: list[Message] = []
        self.announced_cv = threading.Condition()
        self.fetching = True  # until the agent ends
        threading.Thread(target=self._fetch_newest, name="weights-fetch", daemon=True).start()
        threading.Thread(target=self._accept_weights, name="weights-accept", daemon=True).start()
        self.link = ControllerLink(
            ctx,
            Hello(
                role="rollout",
                name=self.name,
                version=self.engine.version,
                address=self.listener.address,
                pid=os.getpid(),
                weights=self.node.address,
            ),
            figures=self.figures,
            inbox=self.inbox,
            reconnect=True,
        )
        # an engine step or a weight load that never returns ends this unit (its work goes to the others)
        self.watchdog = Watchdog(self.name, job.rollout.hang_timeout_s, on_hang=self._hung)

    def figures(self) -> Heartbeat:
        watchdog: Watchdog | None = getattr(self, "watchdog", None)  # made once the link is up
        phase, phase_s = watchdog.current() if watchdog is not None else ("", 0.0)
        return Heartbeat(
            name=self.name,
            state=self.state,
            version=self.engine.version,
            busy_s=self.busy_s,
            running=self.engine.num_running(),
            waiting=self.engine.num_waiting(),
            phase=phase,
            phase_s=phase_s,
        )

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> None:
        self.state = "running"
        pending: tuple[tuple[int, dict[str, torch.Tensor]], dict[str, Any]] | None = None
        while True:
            # 1. take everything that arrived; block only when the engine is idle
            msgs: list[Message | None] = []
            with contextlib.suppress(queue.Empty):
                msgs.append(self.inbox.get_nowait() if self.engine.has_work() else self.inbox.get(timeout=0.5))
            while True:
                try:
                    msgs.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for msg in msgs:
                if msg is None or msg.kind == "stop":
                    self._finish(stopped=msg is not None)
                    return
                if msg.kind == WEIGHTS_REFUSED:  # this unit can never hold a version: it ends (exit 1, that line)
                    self._finish(stopped=False, failed=True)
                    raise TransportError(str(msg.header["error"]))
                if msg.kind == "generate":
                    self._admit(parse(msg, Generate))
                elif msg.kind == "withdraw":
                    self._withdraw(parse(msg, Withdraw).count)
                elif msg.kind == "evaluate":
                    self._evaluate(parse(msg, Evaluate))
                elif msg.kind == "weights":
                    got, transfer = state_dict_of(msg), {k: msg.header.get(k) for k in TRANSFER_FIELDS}
                    if pending is not None and got[0] <= pending[0][0]:
                        self._skipped(got[0], transfer)
                    else:  # newest wins; an older version fetched while the engine stepped is dropped
                        if pending is not None:
                            self._skipped(pending[0][0], pending[1])
                        pending = (got, transfer)
            # 2. safe point: swap weights between engine steps
            if pending is not None:
                (version, sd), transfer = pending
                pending = None
                if version > self.engine.version:
                    with self.watchdog.busy("weight load"):
                        self.engine.load_weights(sd, version)
                    self.link.send(make("weights_applied", {"version": version, **transfer}))
                else:
                    self._skipped(version, transfer)
            # 3. one decode step; the running generations' report when one is due, then every finished sample at
            # once (a kill between a step and the writes that carry its tokens costs a token of each generation
            # they carry: the report, which carries most of them, goes first)
            done: list[GenResult] = []
            if self.engine.has_work():
                t0 = time.monotonic()
                with self.watchdog.busy("engine step"):
                    done = self.engine.step()
                self.flight.stepped(self.engine.step_tokens - self._eval_step_tokens(done))
                self.busy_s += time.monotonic() - t0
                self.steps_unreported += 1
            if (self.report_every and time.monotonic() - self.last_report >= self.report_every) or (
                self.report_steps and self.steps_unreported >= self.report_steps
            ):
                self._report(finished_unsent=sum(r.request_id not in self.evaluating for r in done))
            for res in done:
                if res.request_id in self.evaluating:
                    self._evaluated(res)
                else:
                    self._send_sample(res)

    def _admit(self, gen: Generate) -> None:
        """Queue the requests, except samples the engine already holds: the controller requeues a unit's work
        when it went silent or reconnected, and may hand the same sample back to it. A sample held already goes
        on with its own generation, which now answers the latest dispatch: the result of an earlier one may have
        been taken meanwhile (the ledger refuses a result of an attempt no later than one it took), and the
        sample would then stay dispatched to this unit for ever, its round never trained."""
        fresh = [r for r in gen.requests if r.sample_id not in self.holding]
        self.holding.update(r.sample_id for r in fresh)
        self.reported.update((r.sample_id, len(r.prefix_tokens)) for r in fresh)
        self.order.update((r.sample_id, (r.iteration, r.priority)) for r in fresh)
        self.attempt.update((r.sample_id, r.attempt) for r in gen.requests)
        self.engine.add(
            [
                GenRequest(
                    r.sample_id,
                    list(r.prompt_tokens),
                    r.max_new_tokens,
                    priority=r.priority,
                    group=r.iteration,
                    prefix=Prefix(r.prefix_tokens, r.prefix_logprobs, r.prefix_versions) if r.prefix_tokens else None,
                )
                for r in fresh
            ]
        )

    def _evaluate(self, ev: Evaluate) -> None:
        """Queue a held-out evaluation's greedy requests ahead of the rollout work (one that cannot run is
        answered at once with why)."""
        if ev.version in self.evaluations:
            return
        requests = [
            GenRequest(r.request_id, list(r.prompt_tokens), r.max_new_tokens, group=EVAL_GROUP, greedy=True)
            for r in ev.requests
        ]
        try:
            self.engine.add(requests)
        except ValueError as e:
            empty = torch.zeros(0, dtype=torch.int32)
            self.link.send(make("evaluated", Evaluated(ev.version, [], [], 0, 0, error=str(e)), [empty]))
            return
        self.evaluations[ev.version] = [None] * len(requests)
        self.evaluating.update((r.request_id, (ev.version, i)) for i, r in enumerate(requests))
        self.eval_tokens.update((r.request_id, 0) for r in requests)

    def _eval_step_tokens(self, done: list[GenResult]) -> int:
        """The tokens the last step added to held-out requests (the flight record counts the rollout work's)."""
        if not self.eval_tokens:
            return 0
        added = 0
        for res in itertools.chain(self.engine.partials(), done):
            before = self.eval_tokens.get(res.request_id)
            if before is not None:
                added += len(res.output_tokens) - before
                self.eval_tokens[res.request_id] = len(res.output_tokens)
        return added

    def _evaluated(self, res: GenResult) -> None:
        """One held-out output is in; the evaluation's answer goes once its last is."""
        version, i = self.evaluating.pop(res.request_id)
        self.eval_tokens.pop(res.request_id, None)
        results = self.evaluations[version]
        results[i] = res
        if any(r is None for r in results):
            return
        del self.evaluations[version]
        done = [r for r in results if r is not None]
        versions = [v for r in done for v in r.versions_seen]
        head = Evaluated(
            version,
            [r.request_id for r in done],
            [len(r.output_tokens) for r in done],
            min(versions, default=self.engine.version),
            max(versions, default=self.engine.version),
        )
        tokens = torch.tensor([t for r in done for t in r.output_tokens], dtype=torch.int32)
        self.link.send(make("evaluated", head, [tokens]))

    def _withdraw(self, count: int) -> None:
        """Give `count` requests back: those the engine would admit last, then the running ones with the least
        output (the cheapest to prefill again elsewhere); each with its whole output so far."""
        running = {
            r.request_id: len(r.output_tokens) for r in self.engine.partials() if r.request_id not in self.evaluating
        }
        waiting = sorted(self.holding - set(running), key=lambda i: (-self.order[i][0], self.order[i][1]))
        pick = (waiting + sorted(running, key=running.__getitem__))[:count]
        out = self.engine.interrupt(pick)
        fresh = sum(len(r.output_tokens) - self.reported.get(r.request_id, 0) for r in out)
        for r in out:
            self._forget(r.request_id)
        sent = self._send_outputs("withdrawn", [(r, 0) for r in out])
        self.flight.wrote(fresh, dropped=not sent)

    def _forget(self, sample_id: str) -> None:
        self.holding.discard(sample_id)
        self.reported.pop(sample_id, None)
        self.order.pop(sample_id, None)
        self.attempt.pop(sample_id, None)

    def _send_outputs(
        self, kind: str, outputs: list[tuple[GenResult, int]], made_s: float = 0.0, free_rows: int | None = None
    ) -> bool:
        """A `partial` or `withdrawn` message: each (result, start)'s output from `start` on (`made_s`: when;
        `free_rows`: the engine's then); False when the controller link dropped it."""
        parts, tokens, logprobs, versions = [], [], [], []
        for res, start in outputs:
            parts.append(PartialPart(res.request_id, start, len(res.output_tokens) - start))
            tokens += res.output_tokens[start:]
            logprobs += res.logprobs[start:]
            versions += res.token_versions[start:]
        tensors = [
            torch.tensor(tokens, dtype=torch.int32),
            torch.tensor(logprobs, dtype=torch.float32),
            torch.tensor(versions, dtype=torch.int32),
        ]
        return self.link.send(make(kind, Partial(parts, made_s, free_rows), tensors))

    def _report(self, *, finished_unsent: int = 0) -> None:
        """Tell the controller what each running generation produced since the last report (a report the link
        dropped while it was down goes out again with the next one). Its free rows leave out the rows of the
        `finished_unsent` samples still to be sent: the controller counts a row for each sample that arrives
        after a report (`ControllerCore.reported`); and count the held-out requests' rows, which free without a
        sample to say so (an upper bound, as the controller's use of it needs)."""
        self.last_report = time.monotonic()
        self.steps_unreported = 0
        new = []
        running_evals = 0
        for res in self.engine.partials():
            if res.request_id in self.evaluating:
                running_evals += 1
                continue
            start = self.reported.get(res.request_id, 0)
            if len(res.output_tokens) > start:
                new.append((res, start))
        free = self.engine.rows_free()
        free = None if free is None else free - finished_unsent + running_evals
        if new and self._send_outputs("partial", new, self.last_report, free):
            for res, _ in new:
                self.reported[res.request_id] = len(res.output_tokens)
            self.flight.wrote(sum(len(res.output_tokens) - start for res, start in new))

    def _send_sample(self, res: GenResult) -> None:
        head = SampleDone(
            sample_id=res.request_id,
            version=res.version,
            finish_reason=res.finish_reason,
            num_output_tokens=len(res.output_tokens),
            attempt=self.attempt.get(res.request_id, 0),
        )
        tensors = [torch.tensor(res.output_tokens, dtype=torch.int32), torch.tensor(res.logprobs, dtype=torch.float32)]
        fresh = len(res.output_tokens) - self.reported.get(res.request_id, 0)
        self._forget(res.request_id)
        sent = self.link.send(make("sample", head, tensors))
        self.flight.wrote(fresh, dropped=not sent)
        self.samples_sent += 1

    def _skipped(self, version: int, transfer: dict[str, Any]) -> None:
        """A version this unit's weight node fetched (and serves to the units below it) that its engine will not
        apply: its transfer is still the controller's to book (one that crossed a link is a copy across it)."""
        self.link.send(make("weights_skipped", {"version": version, **transfer}))

    def _hung(self, text: str) -> None:
        """The watchdog's last word before this unit exits: the controller names the hang when it counts it lost."""
        self.state = text
        self.link.send(make("heartbeat", self.figures()))

    def _finish(self, *, stopped: bool, failed: bool = False) -> None:
        self.watchdog.close()
        self.state = "stopped" if stopped else "failed" if failed else "orphaned"
        log.info("%s: %s after %d samples, busy %.1f s", self.name, self.state, self.samples_sent, self.busy_s)
        self.link.close(final=self.figures() if stopped else None)
        with self.announced_cv:
            self.fetching = False
            self.announced_cv.notify_all()
        self.listener.close()
        self.node.close()
        self.flight.close()

    # -- weights plane ------------------------------------------------------------------------------
    def _accept_weights(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except TransportError:
                return  # listener closed
            threading.Thread(target=self._read_weights, args=(conn,), name="weights-reader", daemon=True).start()

    def _read_weights(self, conn: Connection) -> None:
        """Announcements go into one slot (newest wins); the fetcher thread pulls whatever is newest, so a unit
        that falls behind a fast trainer skips versions instead of fetching each in turn."""
        slot, cv = self.announced, self.announced_cv
        while True:
            try:
                msg = recv_checked(conn, peer=conn.peer, kinds=TO_WEIGHTS_LISTENER)
            except TransportError:
                conn.close()
                return
            if msg.kind != "weights_available":
                log.warning("%s: unexpected %r on the weights connection", self.name, msg.kind)
                continue
            self.node.expect(int(msg.header["version"]))  # units below this one wait for it here (a relay)
            with cv:
                if not slot or int(msg.header["version"]) > int(slot[0].header["version"]):
                    slot[:] = [msg]
                cv.notify()

    def _fetch_newest(self) -> None:
        slot, cv = self.announced, self.announced_cv
        while True:
            with cv:
                cv.wait_for(lambda: bool(slot) or not self.fetching)
                if not self.fetching:
                    return
                msg = slot.pop()
            if int(msg.header["version"]) <= self.node_version():
                continue  # already fetched (a newer one arrived while the older was announced)
            try:
                self.inbox.put(fetch_weights(self.node, msg))
            except FetchRefused as e:  # no retry can succeed: the unit ends, saying why (`run`)
                self.inbox.put(Message(WEIGHTS_REFUSED, {"error": f"{self.name}: fetching weights: {e}"}))
                return
            except TransportError as e:
                # every attempt was bounded; the trainer may publish nothing new until this unit catches up
                # (the staleness bound), so the same announcement is tried again unless a newer one comes first
                log.warning(
                    "%s: fetching weights v%s failed (%s); again in %.0f s unless a newer version is announced",
                    self.name,
                    msg.header.get("version"),
                    e,
                    FETCH_RETRY_S,
                )
                with cv:
                    if not cv.wait_for(lambda: bool(slot) or not self.fetching, timeout=FETCH_RETRY_S):
                        slot.append(msg)

    def node_version(self) -> int:
        cur = self.node.store.current
        return -1 if cur is None else cur.version
