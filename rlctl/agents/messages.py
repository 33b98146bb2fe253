"""Wire messages between controller, trainer and rollout agents (the control and sample planes).

Every message is a transport `Message`: a `kind`, a msgpack header (the typed struct below, as
builtins) and raw tensor frames. Who sends what:

    kind             from → to                   header                         tensors
    hello            agent → controller          Hello                          –
    generate         controller → rollout        Generate (requests)            –
    sample           rollout → controller        SampleDone                     [output int32, logprobs f32]
    weights_applied  rollout → controller        WeightsApplied                 –
    weights_skipped  rollout → controller        WeightsApplied                 – (fetched, relayed, overtaken by
                                                                                 a newer version before applied)
    partial          rollout → controller        Partial {parts: [PartialPart…]} [tokens int32, logprobs f32,
                                                                                 versions int32] (each running
                                                                                 sample's output since its last report)
    withdraw         controller → rollout        Withdraw {count}               – (migration: take count requests out)
    withdrawn        rollout → controller        Partial                        as in `partial` (each one's whole
                                                                                 output so far)
    evaluate         controller → rollout        Evaluate (held-out prompts)    –
    evaluated        rollout → controller        Evaluated                      [outputs int32, concatenated]
    samples          controller → trainer        Samples {samples: [Delivered…]} 2 per sample, as in `sample`
    members          controller → trainer        Members {datacenter, dc_links, rollouts: –
                                                  {name: {address, weights, datacenter}}}
    regroup          controller → trainer        Regroup                        – (groups held for a later
                                                                                 iteration belong to the current one)
    trained          trainer → controller        Trained                        –
    checkpoint_written trainer → controller      CheckpointWritten              – (its part of iter-<version>
                                                 {version, checkpoint, error}     is on disk: the controller
                                                                                 writes its own, moves latest)
    checkpointed     controller → trainer        Checkpointed {version}         – (iter-<version> is complete:
                                                                                 the trainer prunes its older parts)
    weights_available trainer → rollout (direct) WeightsAvailable               – (the rollout pulls the
                                                 {version, holders}               version's chunks from a holder's
                                                                                WeightNode, see weights.py)
    heartbeat        agent → controller          Heartbeat                      –
    stop             controller → agent          {}                             –
    ping             controller → agent          {} (every PING_INTERVAL_S: an agent that hears nothing for its job's
                                                 transport.unreachable_timeout_s knows its controller is gone)
    bye              agent → controller          Heartbeat (final figures)      –
    status           client → controller         {}  → reply `status` with the status view
    scale            client → controller         Scale {delta, site}  → reply with the outcome
    shutdown         client → controller         {grace_s?}  → reply {ok, grace_s, checkpoint, stopping?} (stopping: a
                                                 stop before it is under way; answered while the controller ends)

Readers take messages through `recv_checked`, with the kinds they expect (`TO_CONTROLLER`, …):

    conn.recv() ──▶ check(kind expected? header converts to its struct? tensors as the table says?)
                      ok ──▶ the reader's loop         wrong ──▶ log "dropped … from PEER", read on

A malformed message is its sender's fault: it is dropped with a warning naming the peer and never
ends a loop. A stream the transport can no longer frame (bad preamble, bound exceeded) is closed by
the transport; the reader sees that as the peer leaving.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec

from rlctl.errors import ProtocolError
from rlctl.transport import Connection, Message
from rlctl.transport.framing import to_struct

if TYPE_CHECKING:  # torch loads with a message's first tensor frame (`rlctl.transport.framing`), not with this module:
    import torch  # the controller imports it (≈ 2.4 s) only once samples flow, after it listens

log = logging.getLogger(__name__)

S = TypeVar("S", bound=msgspec.Struct)
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class Hello(msgspec.Struct):
    role: Literal["rollout", "trainer", "client"]
    name: str
    version: NonNegInt = 0
    address: str = ""  # where a rollout agent hears `weights_available`
    pid: int = 0
    weights: str = ""  # the agent's weight node (a rollout unit's; a trainer's rank 0 root)
    weight_roots: list[str] = []  # a trainer: every rank's weight node, rank 0 first
    checkpoint: str = ""  # a resumed trainer: the SHA-256 of the checkpoint manifest it restored
    again: bool = False  # a rollout unit's hello on a link it re-established (`ControllerLink`): it joined before


class Request(msgspec.Struct):
    sample_id: str
    prompt_tokens: Annotated[list[int], msgspec.Meta(min_length=1)]
    max_new_tokens: PositiveInt  # output tokens in all, the prefix's included
    priority: float
    iteration: NonNegInt
    attempt: NonNegInt = 0  # the ledger's dispatch count of the sample: its result says which one it answers
    # an interrupted generation to resume (partial rollouts): its tokens, their log-probs and versions
    prefix_tokens: list[int] = []
    prefix_logprobs: list[float] = []
    prefix_versions: list[NonNegInt] = []

    def __post_init__(self) -> None:
        n = len(self.prefix_tokens)
        if not n == len(self.prefix_logprobs) == len(self.prefix_versions) or n >= self.max_new_tokens:
            raise ValueError(
                f"sample {self.sample_id}: a prefix of {n} tokens, {len(self.prefix_logprobs)} log-probs and "
                f"{len(self.prefix_versions)} versions (one each, fewer than max_new_tokens {self.max_new_tokens})"
            )


class Generate(msgspec.Struct):
    requests: list[Request]


class EvalRequest(msgspec.Struct, array_like=True):
    request_id: str
    prompt_tokens: Annotated[list[int], msgspec.Meta(min_length=1)]
    max_new_tokens: PositiveInt


class Evaluate(msgspec.Struct):
    """Controller → unit: decode these held-out prompts greedily, ahead of its rollout work (`evaluation.
    every_iterations`); `version`: the version the controller asks it for (the unit's own, when it asked)."""

    version: NonNegInt
    requests: Annotated[list[EvalRequest], msgspec.Meta(min_length=1)]


class Evaluated(msgspec.Struct):
    """Unit → controller: an evaluation's greedy outputs (one int32 tensor, `lengths[i]` tokens for `ids[i]`, in
    order) and the oldest and newest weight versions that generated any of them."""

    version: NonNegInt
    ids: list[str]
    lengths: list[NonNegInt]
    version_min: NonNegInt
    version_max: NonNegInt
    error: str = ""  # the unit could not run it (nothing else is set then)


class PartialPart(msgspec.Struct, array_like=True):
    """`count` tokens of one running sample, from output index `start` (its tokens, log-probs and versions are the
    next `count` of the message's three tensors)."""

    sample_id: str
    start: NonNegInt
    count: NonNegInt


class Partial(msgspec.Struct):
    """A unit's running generations' new output since its last report: tensors int32 tokens, float32 log-probs,
    int32 versions, the parts' in order."""

    parts: list[PartialPart]
    made_s: float = 0.0  # the unit's monotonic clock when it took the report (0: not given): rates of generating
    # rows a new request could take when it took the report, until another is freed (None: not known, the engine
    # may free rows by preempting): how many generations it may have started since (`ControllerCore._interrupted`)
    free_rows: NonNegInt | None = None


class Withdraw(msgspec.Struct):
    """Controller → unit: take `count` requests out of the engine (waiting ones first, then the running ones with
    the least output) and send them back (`withdrawn`: a Partial of their whole output so far)."""

    count: PositiveInt


class SampleDone(msgspec.Struct):
    sample_id: str
    version: NonNegInt
    finish_reason: str
    num_output_tokens: NonNegInt
    attempt: NonNegInt = 0  # the dispatch (`Request.attempt`, from 1) whose generation this is; 0: not said


class Delivered(msgspec.Struct):
    sample_id: str
    prompt_id: str
    iteration: NonNegInt
    version: NonNegInt
    output_tokens: NonNegInt
    reward: float  # scored beside the controller (rlctl.rl.reward_pool)
    group_size: NonNegInt = 0  # the group's samples that train (fewer when some were filtered); 0: all of them


class Samples(msgspec.Struct):
    samples: list[Delivered]


class Regroup(msgspec.Struct):
    """Groups the trainer holds for a later iteration now belong to `iteration` (a group there was aborted)."""

    groups: list[str]
    iteration: NonNegInt


class Member(msgspec.Struct):
    address: str
    weights: str
    datacenter: str


class Members(msgspec.Struct):
    rollouts: dict[str, Member]
    datacenter: str = ""
    dc_links: list[list[str]] | None = None  # datacenter pairs the inventory links; None = every pair


class WeightsApplied(msgspec.Struct):
    version: NonNegInt
    holder: str | None = None
    encoding: str | None = None
    base_version: NonNegInt | None = None  # a delta's base
    wire_bytes: NonNegInt | None = None
    fetch_s: float | None = None


class WeightsAvailable(msgspec.Struct):
    version: NonNegInt
    holders: Annotated[list[str], msgspec.Meta(min_length=1)]


class Checkpointed(msgspec.Struct):
    version: NonNegInt  # checkpoint iter-<version> is complete (both parts, `latest` moved to it)


class Trained(msgspec.Struct):
    iteration: NonNegInt
    version: NonNegInt
    sample_ids: list[str]
    reward_mean: float
    train_s: float  # compute time of this iteration's step (forward/backward/optimizer)
    tokens: int
    loss: float
    staleness_violations: int  # samples the trainer found older than η (must stay 0)
    busy_s: float
    # mean per-token k3 estimate of KL(sampling policy ‖ trainer policy before this step's update), over the
    # tokens trained: how off-policy the batch was (staleness, engine numerics); not the reference KL
    kl: float = 0.0
    # mean per-token KL to the reference policy that `algorithm.kl_coef` multiplies: GRPO's loss, the k3 estimate
    # of KL(trainer policy ‖ reference); PPO's rewards, the k1 estimate of KL(sampling policy ‖ reference).
    # None when kl_coef is 0 (no reference model)
    kl_ref: float | None = None
    value_loss: float | None = None  # PPO's critic loss, ½·(V − R)² per token; None without a critic (GRPO)
    # a Qwen MoE's (Qwen3MoE or Qwen2MoE) load-balancing loss that its loss adds × router_aux_loss_coef (its
    # config.json's output_router_logits true: rlctl.rl.grpo); None where the loss has no such term
    router_aux_loss: float | None = None
    grad_norm: float = 0.0  # the policy's gradient norm before clipping (algorithm.grad_clip)
    lr: float = 0.0  # the learning rate of this step (algorithm.lr and its schedule)
    # per token trained (groups without signal are not: `no_signal_frac`); NaN when the iteration trained none
    clip_frac: float = 0.0  # share of the tokens whose ratio was outside the clip range
    entropy: float = 0.0  # the policy's mean next-token entropy (nats)
    no_signal_frac: float = 0.0  # share of the iteration's samples in groups whose rewards were all equal
    # this version's trainer checkpoint part is being written in the background: `checkpoint_written` follows
    checkpointing: bool = False
    # the gradient norm was NaN or infinite: no optimizer step (the version holds the weights before it)
    skipped: bool = False


class CheckpointWritten(msgspec.Struct):
    version: NonNegInt
    checkpoint: str = ""  # the trainer part's manifest SHA-256, once it is written; "" with `error`
    error: str = ""  # why the trainer's part could not be written
    full_dir: str = ""  # … when that was a full disk: the directory (a resume needs space freed there first)


class Heartbeat(msgspec.Struct):
    name: str
    state: str
    version: int = 0
    busy_s: float = 0.0
    running: int = 0
    waiting: int = 0
    phase: str = ""  # the busy phase its loop is in ("" waiting for work; rlctl.agents.watchdog)
    phase_s: float = 0.0  # how long that phase had run at this heartbeat


class Scale(msgspec.Struct):
    delta: int
    site: str | None = None


# `rlctl stop` that sets no --grace: how long it gives the controller to end (its answer may ask for more, while the
# trainer may complete a checkpoint: `rlctl.agents.controller_stop.STOP_CHECKPOINT_WAIT_S`)
STOP_GRACE_S = 15.0
# why a controller that got SIGTERM with no stop asked for (a scheduler's time limit, a pre-emption, `kill`) ends the
# run as failed (`ControllerAgent.run`): `checkpoint.auto_resume` resumes it; the launcher's own stop and `rlctl stop`
# (the events `LAUNCHER_STOP` and `stop_requested`) end it `stopped`
SIGTERM_FAILURE = "controller got SIGTERM"
LAUNCHER_STOP = "launcher_stop"  # the event a launcher writes before it stops a run's agents (`JobRun.stop`)


class Shutdown(msgspec.Struct):
    """`rlctl stop`'s request: `grace_s`, how long it waits before it kills the controller (None: not said:
    STOP_GRACE_S, or what the controller answers). The launcher's, with `failed`: the job failed where the
    controller cannot see it (a trainer rank ended before the trainer joined): it ends the job failed with that
    reason, not stopped."""

    grace_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    failed: str | None = None


class Empty(msgspec.Struct):
    """A header that carries nothing (stop, status); extra keys are ignored."""


# The header struct of every kind that crosses the wire between agents.
HEADERS: dict[str, type[msgspec.Struct]] = {
    "hello": Hello,
    "generate": Generate,
    "sample": SampleDone,
    "partial": Partial,
    "withdrawn": Partial,
    "withdraw": Withdraw,
    "weights_applied": WeightsApplied,
    "weights_skipped": WeightsApplied,
    "evaluate": Evaluate,
    "evaluated": Evaluated,
    "samples": Samples,
    "regroup": Regroup,
    "members": Members,
    "trained": Trained,
    "checkpointed": Checkpointed,
    "checkpoint_written": CheckpointWritten,
    "weights_available": WeightsAvailable,
    "heartbeat": Heartbeat,
    "stop": Empty,
    "ping": Empty,
    "bye": Heartbeat,
    "status": Empty,
    "scale": Scale,
    "shutdown": Shutdown,
}

# What each reader accepts (a new kind goes into HEADERS and into its receiver's set).
TO_CONTROLLER = (
    "sample",
    "evaluated",
    "partial",
    "withdrawn",
    "weights_applied",
    "weights_skipped",
    "trained",
    "checkpoint_written",
    "heartbeat",
    "bye",
    "status",
    "scale",
    "shutdown",
)
# what an agent's ControllerLink accepts
FROM_CONTROLLER = ("generate", "withdraw", "evaluate", "samples", "regroup", "members", "checkpointed", "stop", "ping")
TO_WEIGHTS_LISTENER = ("weights_available",)  # a rollout unit's announcement listener


def make(
    kind: str, header: msgspec.Struct | dict[str, Any] | None = None, tensors: list[torch.Tensor] | None = None
) -> Message:
    body = msgspec.to_builtins(header) if isinstance(header, msgspec.Struct) else dict(header or {})
    return Message(kind, body, list(tensors or []))


def parse(msg: Message, typ: type[S], *, peer: str = "") -> S:
    """The header as its typed struct; ProtocolError (naming `peer` when given) if it does not convert."""
    return to_struct(msg.header, typ, what=f"{peer + ': ' if peer else ''}{_short(msg.kind)} header")


def check(msg: Message, *, peer: str, kinds: Collection[str]) -> Message:
    """`msg` if its kind is one of `kinds` and its header and tensors are what HEADERS and the table say;
    ProtocolError naming `peer`, the kind and what is wrong otherwise."""
    if msg.kind not in kinds or msg.kind not in HEADERS:
        raise ProtocolError(f"{peer}: unexpected message kind {_short(msg.kind)}; expected one of {', '.join(kinds)}")
    header = parse(msg, HEADERS[msg.kind], peer=peer)
    rule = _TENSORS.get(msg.kind)
    problem = rule(header, msg.tensors) if rule else (f"{len(msg.tensors)} unexpected tensors" if msg.tensors else "")
    if problem:
        raise ProtocolError(f"{peer}: {msg.kind}: {problem}")
    return msg


def recv_checked(conn: Connection, *, peer: str, kinds: Collection[str], timeout_s: float | None = None) -> Message:
    """The next well-formed message of one of `kinds` from `conn`; malformed ones are logged and skipped.

    Transport errors (peer gone, stream out of sync, timeout) propagate: the reader decides what they mean."""
    while True:
        msg = conn.recv(timeout_s)
        try:
            return check(msg, peer=peer, kinds=kinds)
        except ProtocolError as e:  # declared fault-tolerance point: one peer's bad message, not the loop's end
            log.warning("dropped a malformed message: %s", e)


def _layout(ts: list[torch.Tensor]) -> list[tuple[str, tuple[int, ...]]]:
    """Each tensor's dtype, by name, and shape: what the checks compare, without importing torch here."""
    return [(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in ts]


def _sample_tensors(output_tokens: int, pair: list[torch.Tensor]) -> str:
    """'' if `pair` is [output int32, logprobs float32], both 1-D of `output_tokens` elements."""
    want = [("int32", (output_tokens,)), ("float32", (output_tokens,))]
    got = _layout(pair)
    return "" if got == want else f"tensors {got} do not match [int32, float32] of {output_tokens} tokens"


def _one_sample(h: Any, ts: list[torch.Tensor]) -> str:
    return _sample_tensors(h.num_output_tokens, ts)


def _many_samples(h: Any, ts: list[torch.Tensor]) -> str:
    if len(ts) != 2 * len(h.samples):
        return f"{len(ts)} tensors for {len(h.samples)} samples (2 each)"
    for i, d in enumerate(h.samples):
        problem = _sample_tensors(d.output_tokens, ts[2 * i : 2 * i + 2])
        if problem:
            return f"sample {i}: {problem}"
    return ""


def _partial(h: Any, ts: list[torch.Tensor]) -> str:
    """'' if `ts` is int32 tokens, float32 log-probs and int32 versions, 1-D, as many as the parts count."""
    n = sum(p.count for p in h.parts)
    want = [("int32", (n,)), ("float32", (n,)), ("int32", (n,))]
    got = _layout(ts)
    return "" if got == want else f"tensors {got} do not match [int32, float32, int32] of {n} tokens"


def _evaluated(h: Any, ts: list[torch.Tensor]) -> str:
    if len(h.ids) != len(h.lengths):
        return f"{len(h.ids)} ids and {len(h.lengths)} lengths"
    got = _layout(ts)
    n = sum(h.lengths)
    return "" if got == [("int32", (n,))] else f"tensors {got} do not match [int32] of {n} tokens"


# Kinds that carry tensors, and the check of those tensors against the (converted) header.
_TENSORS: dict[str, Callable[[Any, list[torch.Tensor]], str]] = {
    "sample": _one_sample,
    "samples": _many_samples,
    "partial": _partial,
    "withdrawn": _partial,
    "evaluated": _evaluated,
}


def _short(kind: str) -> str:
    """A peer-supplied kind as it goes into a log line: quoted, at most 40 characters."""
    return repr(kind if len(kind) <= 40 else kind[:37] + "...")
