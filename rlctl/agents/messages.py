"""Wire messages between controller, trainer and rollout agents (the control and sample planes).

Every message is a transport `Message`: a `kind`, a msgpack header (the typed struct below, as
builtins) and raw tensor frames. Who sends what:

    kind             from → to                   header                         tensors
    hello            agent → controller          Hello                          –
    generate         controller → rollout        Generate (requests)            –
    sample           rollout → controller        SampleDone                     [output int32, logprobs f32]
    weights_applied  rollout → controller        {version, holder, encoding,   –
                                                  wire_bytes, fetch_s}
    samples          controller → trainer        {samples: [Delivered…]}        2 per sample, as in `sample`
    members          controller → trainer        {datacenter, rollouts: {name:  –
                                                  {address, weights, datacenter}}}
    trained          trainer → controller        Trained                        –
    weights_available trainer → rollout (direct) {version, holders}             – (the rollout pulls the
                                                                                version's chunks from a holder's
                                                                                WeightNode, see weights.py)
    heartbeat        agent → controller          Heartbeat                      –
    stop             controller → agent          {}                             –
    bye              agent → controller          Heartbeat (final figures)      –
    status           client → controller         {}  → reply `status` with the status view
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import torch

from rlctl.transport import Message

S = TypeVar("S", bound=msgspec.Struct)


class Hello(msgspec.Struct):
    role: str  # "rollout" | "trainer" | "client"
    name: str
    version: int = 0
    address: str = ""  # where a rollout agent hears `weights_available`
    pid: int = 0
    weights: str = ""  # the agent's weight node (a rollout unit's; a trainer's rank 0 root)
    weight_roots: list[str] = []  # a trainer: every rank's weight node, rank 0 first
    checkpoint: str = ""  # a resumed trainer: the SHA-256 of the checkpoint manifest it restored


class Request(msgspec.Struct):
    sample_id: str
    prompt_tokens: list[int]
    max_new_tokens: int
    priority: float
    iteration: int


class Generate(msgspec.Struct):
    requests: list[Request]


class SampleDone(msgspec.Struct):
    sample_id: str
    version: int
    finish_reason: str
    num_output_tokens: int


class Delivered(msgspec.Struct):
    sample_id: str
    prompt_id: str
    iteration: int
    version: int
    output_tokens: int


class Trained(msgspec.Struct):
    iteration: int
    version: int
    sample_ids: list[str]
    reward_mean: float
    train_s: float  # compute time of this iteration's step (forward/backward/optimizer)
    tokens: int
    loss: float
    staleness_violations: int  # samples the trainer found older than η (must stay 0)
    busy_s: float
    reward_failures: int = 0  # reward calls that raised, timed out or returned a wrong type, so far
    # mean per-token k3 estimate of KL(sampling policy ‖ trainer policy before this step's update), over the
    # iteration's tokens: how off-policy the batch was (staleness, engine numerics); not the reference KL
    kl: float = 0.0
    checkpoint: str = ""  # this version's trainer checkpoint part was written: its manifest's SHA-256


class Heartbeat(msgspec.Struct):
    name: str
    state: str
    version: int = 0
    busy_s: float = 0.0
    running: int = 0
    waiting: int = 0


def make(
    kind: str, header: msgspec.Struct | dict[str, Any] | None = None, tensors: list[torch.Tensor] | None = None
) -> Message:
    body = msgspec.to_builtins(header) if isinstance(header, msgspec.Struct) else dict(header or {})
    return Message(kind, body, list(tensors or []))


def parse(msg: Message, typ: type[S]) -> S:
    """The header as its typed struct; a malformed header is a ProtocolError at the caller's edge."""
    return msgspec.convert(msg.header, typ)
