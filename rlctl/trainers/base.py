"""The trainer backend interface: one trainer rank's policy model, from an HF checkpoint to HF weights.

    load_backend(job.trainer.backend, model_dir, tp=…, pp=…) ─▶ TrainerBackend
        .model          nn.Module: tokens [B, T] → logits [B, T, V] (fp32 on a CPU; on CUDA the output layer
                        runs in bf16 under autocast, as Megatron's does, and the learner upcasts the logits to
                        fp32 before the log-softmax); the learner's loss, AdamW and gradient all-reduce work on
                        it unchanged (rlctl.rl.grpo)
        .weights()      what the weight plane sends to rollout units: full tensors under the embedded
                        model's names (TinyGPT.state_dict: lm_head.weight present even when tied)
        .load_state_dict(sd)   the inverse of weights(): a resumed checkpoint's policy
        .save_pretrained(dir, tokenizer_from=…)   an HF checkpoint directory (config, weights, tokenizer)
        .data_parallel()  which share of each micro-batch this rank trains, and the group its gradients are
                        summed over (every rank of the trainer, unless tensor/pipeline parallel ranks share a replica)
        .clip_grad_norm_(max_norm)   clip by the norm of the whole model's gradient (over every shard); with
                        `model=` a module made of this rank's shards, such as a PPO critic on `critic_trunk()`
        .critic_trunk()  a copy of the policy without its output layer: `.hidden(tokens)` → final normed hidden
                        states [B, T, hidden], the body of PPO's value model (rlctl.rl.ppo.ValueModel)
        .model_parallel()  (tp, pp): how many ranks share one replica; a checkpoint records it with dp

`torch` (native.py) is TinyGPT itself; `megatron` (megatron/backend.py) is megatron-core's GPTModel behind
rlctl's HF ⇄ Megatron table. Backends are chosen by one small dict, and the megatron one is imported only
when it is chosen (an optional extra).
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlctl.devices import DeviceError

if TYPE_CHECKING:  # torch only where a backend is built: preflight imports this module too
    import torch
    from torch import nn

    from rlctl.config.runtime import Lora
    from rlctl.devices import Compute
    from rlctl.models.hf import TinyGPTConfig

MEGATRON_INSTALL_HINT = "pip install 'rlctl[megatron]' (megatron-core==0.16.1; `make unit` installs it)"
MEGATRON_GPU_SPLIT = (
    "the megatron backend on a GPU runs tensor_parallel 1 × pipeline_parallel 1 (data parallel over NCCL): "
    "tp/pp over NCCL and megatron's DDP and distributed optimizer are not built"
)


@dataclass(frozen=True)
class DataParallel:
    """This rank's place among the model replicas: it trains share `rank` of `size` of every micro-batch,
    and its gradients are summed over `group` (None: torch.distributed's default group, every rank).
    `sharded`: parameters, gradients and optimizer state are sharded over those ranks (FSDP2): the backend
    reduces the gradients, and every rank holds — and checkpoints — its own part of the state. `reduce_per_step`
    (sharded alone): FSDP2 holds gradient sync off in every backward of an optimizer step but its last, so each
    step reduce-scatters the gradients once, not once a cut (each rank holds the unsharded fp32 gradients meanwhile:
    `rlctl.planner.costs.holds_grad_sync` decides where they fit)."""

    rank: int = 0
    size: int = 1
    group: Any = None
    sharded: bool = False
    reduce_per_step: bool = False


def whole_replicas() -> DataParallel:
    """Every rank holds a whole replica: the torch.distributed default group's rank and size (1 of 1 without
    a group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return DataParallel(dist.get_rank(), dist.get_world_size())
    return DataParallel()


def clip_whole(model: nn.Module, max_norm: float) -> float:
    """Clip the gradients of every parameter of `model` (one whole replica, or one sharded by FSDP: the norm is
    over every shard) to norm `max_norm`; the norm before."""
    import torch

    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    full = getattr(norm, "full_tensor", None)  # a DTensor when the gradients are sharded
    return float(full() if full is not None else norm)


class Trunk(Protocol):
    """A PPO critic's body, an nn.Module (`TrainerBackend.critic_trunk`; TinyGPT is one): the final normed hidden
    states of tokens, and the model's config (the value head's width is its hidden_size)."""

    config: TinyGPTConfig

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        """Final normed hidden states [B, T, hidden] (fp32) of tokens [B, T]."""
        ...


class TrainerBackend(ABC):
    """One trainer rank's policy: trained through `model`, published with `weights`, saved as HF."""

    model: nn.Module

    def data_parallel(self) -> DataParallel:
        """Every rank a whole replica (`whole_replicas`)."""
        return whole_replicas()

    def clip_grad_norm_(self, max_norm: float, *, model: nn.Module | None = None) -> float:
        """Scale the gradients of `model` (default: the policy) so that their norm is at most `max_norm`; the
        norm before clipping."""
        return clip_whole(self.model if model is None else model, max_norm)

    @abstractmethod
    def critic_trunk(self) -> Trunk:
        """PPO's critic body: a copy of this rank's part of the policy without its output layer, its weights the
        policy's now. `clip_grad_norm_(…, model=)` clips a module built on it."""

    def shard_critic(self, critic: nn.Module) -> None:
        """Lay out PPO's critic (`rlctl.rl.ppo.ValueModel` on `critic_trunk()`) over the ranks as the policy is, before
        its optimizer is made: nothing unless the backend shards the policy (the torch backend's FSDP2)."""
        del critic

    def model_parallel(self) -> tuple[int, int]:
        """(tensor parallel, pipeline parallel) of this rank's replica: (1, 1), every rank a whole one."""
        return 1, 1

    def wire_weights(
        self, *, dtype: torch.dtype, tied: bool, host: bool = True, on_device: bool = False
    ) -> dict[str, torch.Tensor]:
        """A version as it is published (`wire_weights` of `weights()`): every rank calls it after every step.
        `host=False`: only its layout (meta tensors), for a rank that holds no copy (collectives still run);
        `on_device`: the snapshot stays where the weights are (see `wire_weights`)."""
        return wire_weights(self.weights(), dtype=dtype, tied=tied, host=host, on_device=on_device)

    def tensors(self) -> Mapping[str, torch.Tensor]:
        """This rank's tensors under the HF names, where it computes: what a delta's encoder reads (its part of
        them). Whole tensors (`weights()`) unless the backend shards them."""
        return self.weights()

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """Modules whose state each rank's checkpoint shard holds besides the optimizers' (none: the HF directory
        holds the policy)."""
        return {}

    @abstractmethod
    def weights(self) -> Mapping[str, torch.Tensor]:
        """Full HF-layout tensors under the embedded model's names (detached; may share storage with the
        parameters, as the publisher encodes them before the next optimizer step; a LoRA policy's merged as each is
        read, `lora.MergedWeights`)."""

    @abstractmethod
    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Set the policy to full HF-layout tensors under the embedded model's names (what `weights` gives)."""

    @abstractmethod
    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        """Write an HF checkpoint directory (config.json, weights, the tokenizer files of `tokenizer_from`)."""


def _torch(model_dir: Path, *, tp: int, pp: int, compute: Compute | None, **kw: Any) -> TrainerBackend:
    from rlctl.trainers.native import TorchBackend

    del tp, pp  # data parallel over every rank, whatever the plan's split: a whole replica per rank, or FSDP
    return TorchBackend.load(model_dir, compute=compute, **kw)


def _megatron(model_dir: Path, *, tp: int, pp: int, compute: Compute | None, **kw: Any) -> TrainerBackend:
    from rlctl.trainers.megatron.backend import MegatronBackend

    if compute is not None and compute.is_cuda and (tp, pp) != (1, 1):  # refused by `rlctl check`
        raise DeviceError(
            f"{MEGATRON_GPU_SPLIT}; this rank is one of tp {tp} × pp {pp}",
            hint="set trainer.tensor_parallel and pipeline_parallel to 1 on GPU sites, or use trainer.backend 'torch'",
        )
    assert not kw.get("shard"), "megatron shards by tp/pp: rlctl check refuses trainer.shard fsdp with it"
    return MegatronBackend.load(model_dir, tp=tp, pp=pp, compute=compute, context=kw.get("context"))


BACKENDS: dict[str, Callable[..., TrainerBackend]] = {"torch": _torch, "megatron": _megatron}


def load_backend(
    name: str,
    model_dir: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    compute: Compute | None = None,
    shard: bool = False,
    reduce_per_step: bool = False,
    activation_checkpointing: bool = False,
    context: int | None = None,
    adapters: Lora | None = None,
) -> TrainerBackend:
    """The `name` backend on the HF checkpoint `model_dir`, as tensor/pipeline-parallel rank of tp × pp, computing
    where `compute` says (None: the CPU, fp32); `shard`: FSDP2 over every rank (`torch`; `reduce_per_step`: reducing
    the gradients once an optimizer step, `DataParallel.reduce_per_step`); `context`: the longest sequence it trains
    on (`torch`: its RoPE tables hold that many positions; None: the model's max_positions; both refuse one longer
    than a Mistral sliding window that binds, `hf.window_refusal`)."""
    try:
        build = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown trainer backend {name!r}; known: {', '.join(BACKENDS)}") from None
    kw: dict[str, Any] = {"shard": shard, "context": context}
    if name == "torch":  # `adapters`: LoRA (`trainer.lora`, rlctl.models.lora), the torch backend's alone
        kw |= {"activation_checkpointing": activation_checkpointing, "adapters": adapters}
        kw |= {"reduce_per_step": reduce_per_step}
    else:  # refused by rlctl check
        assert adapters is None, "trainer.lora is the torch backend's"
    return build(Path(model_dir), tp=tp, pp=pp, compute=compute, **kw)


def wire_weights(
    state_dict: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype,
    tied: bool,
    host: bool = True,
    on_device: bool = False,
) -> dict[str, torch.Tensor]:
    """What a version of these weights is on the wire: floating tensors in `dtype` (the checkpoint's), in host
    memory, each a new tensor (a snapshot: the trainer's next step does not change it); with tied embeddings,
    no `lm_head.weight` (the embedding is the one copy). One copy per tensor, straight from the device.
    `host=False`: the same names, dtypes and shapes on the meta device (the layout, no copy). `on_device`: each
    copy is made where the tensor is (a GPU trainer's snapshot in device memory): the publisher then moves each
    tensor into its host buffer in place, so the node never holds a second host copy of the version."""
    import torch

    out = {}
    for name, t in state_dict.items():
        if tied and name == "lm_head.weight":
            continue
        want = dtype if t.is_floating_point() else t.dtype
        if not host:
            out[name] = torch.empty(t.shape, dtype=want, device="meta")
        elif on_device:
            out[name] = t.detach().to(want, copy=True)
        else:
            out[name] = torch.empty(t.shape, dtype=want).copy_(t.detach())
    return out


def megatron_available() -> str | None:
    """None when megatron-core can be imported here, else the install hint (one line). Imports nothing."""
    found = importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None
    return None if found else MEGATRON_INSTALL_HINT
