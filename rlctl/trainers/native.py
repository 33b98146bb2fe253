"""The `torch` trainer backend: TinyGPT (the embedded engine's own model), a whole replica on every rank — or,
sharded with FSDP2 (`rlctl.trainers.fsdp`), one replica over every rank (made on the meta device and loaded
shard by shard: never whole on one rank).

On a CUDA device the parameters and AdamW state stay fp32 (master weights) and the passes compute in bf16 (under
autocast, or FSDP2's mixed-precision policy); on a CPU everything is fp32. Gradients are summed over the trainer's
process group: NCCL for CUDA tensors, gloo on CPUs (`rlctl.agents.trainer.init_group`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from rlctl.config.runtime import Lora
from rlctl.devices import Compute
from rlctl.errors import ConfigError
from rlctl.models import hfdir, lora
from rlctl.models.tensors import DoesNotFit, check_fit, shapes_of
from rlctl.models.tinygpt import TinyGPT
from rlctl.models.tinyload import pretrained_tensors
from rlctl.trainers import critic, fsdp
from rlctl.trainers.base import DataParallel, TrainerBackend, whole_replicas, wire_weights


class TorchBackend(TrainerBackend):
    def __init__(self, model: TinyGPT, *, sharded: bool = False, reduce_per_step: bool = False) -> None:
        self.model: TinyGPT = model
        self.sharded = sharded
        # LoRA: the adapters' unsharded gradients are small enough to hold always (`costs.holds_grad_sync`)
        self.lora = bool(lora.adapters(model))  # the trained weights are adapters: what is published is merged
        self.reduce_per_step = sharded and (reduce_per_step or self.lora)

    @classmethod
    def load(
        cls,
        model_dir: Path,
        *,
        compute: Compute | None = None,
        shard: bool = False,
        reduce_per_step: bool = False,
        activation_checkpointing: bool = False,
        context: int | None = None,
        adapters: Lora | None = None,
    ) -> TorchBackend:
        """The checkpoint in fp32 on `compute`'s device (default: the CPU), computing in its autocast dtype;
        `shard`: FSDP2 over every rank of the default process group (`reduce_per_step`: reducing the gradients once
        an optimizer step, `DataParallel.reduce_per_step`; always with LoRA); `context`: the longest sequence it
        trains on (`TinyGPT.empty`; None: the model's max_positions).

        Sharded, the model is made on the meta device, sharded, given its shards' memory and filled from the file one
        tensor at a time (`fsdp.load_pretrained`): a rank holds its shards and one full tensor, never the whole
        model (a 72B in fp32: 288 GB, on no GPU) — the reason it is sharded."""
        device = torch.device("cpu") if compute is None else compute.device
        if shard:
            config, tensors = pretrained_tensors(model_dir, context=context)
            model = TinyGPT.on_meta(config, context=context)
        else:
            model = TinyGPT.from_pretrained(model_dir, dtype=torch.float32, device=device, context=context)
        model.autocast_dtype = None if compute is None else compute.autocast_dtype
        model.activation_checkpointing = activation_checkpointing
        if adapters is not None:  # LoRA (`trainer.lora`) on its projections, every other weight frozen
            lora.add_adapters(model, rank=adapters.rank, alpha=adapters.alpha, targets=adapters.targets)
        if shard:
            fsdp.shard(model, cuda=device.type == "cuda")
            model.materialise(device)
            try:
                fsdp.load_pretrained(model, tensors)
            except DoesNotFit as e:  # (as from_pretrained: a tied lm_head the file holds beside the embedding)
                raise ConfigError(str(model_dir), None, str(e)) from e
        return cls(model, sharded=shard, reduce_per_step=reduce_per_step)

    def data_parallel(self) -> DataParallel:
        """Every rank trains its share of each micro-batch; sharded, FSDP reduces the gradients and each rank holds
        (and checkpoints) its own part of the parameters and optimizer state."""
        every = whole_replicas()
        if not self.sharded:
            return every
        return DataParallel(every.rank, every.size, sharded=True, reduce_per_step=self.reduce_per_step)

    def critic_trunk(self) -> TinyGPT:
        """A copy of the policy without its lm_head (`critic.headless_copy`: its `hidden` is the trunk; the head is
        never copied). Sharded: a model of the policy's config on the meta device (`TinyGPT.on_meta`: no memory), its
        lm_head dropped alike (`critic.headless`), for `shard_critic` to shard, give its shards' memory and fill with
        the policy's shards: no rank holds a whole critic."""
        assert not self.lora, "PPO with trainer.lora is refused by rlctl check"
        if not self.sharded:
            return critic.headless_copy(self.model)
        m = self.model
        trunk = critic.headless(TinyGPT.on_meta(m.config, context=m.context))
        trunk.activation_checkpointing = m.activation_checkpointing
        return trunk

    def shard_critic(self, critic: nn.Module) -> None:
        """Sharded: FSDP2 over the policy's ranks, its trunk the policy's shards, its head zeros (`fsdp.shard_critic`,
        on the policy's device)."""
        if self.sharded:
            device = fsdp.local_tensor(next(self.model.parameters())).device
            fsdp.shard_critic(critic, self.model, cuda=device.type == "cuda")

    def weights(self) -> Mapping[str, torch.Tensor]:
        assert not self.sharded, "a sharded policy is never whole on one device: use wire_weights"
        if self.lora:  # each adapted weight merged as it is read (a new tensor), the rest the parameters
            return lora.MergedWeights(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def wire_weights(
        self, *, dtype: torch.dtype, tied: bool, host: bool = True, on_device: bool = False
    ) -> dict[str, torch.Tensor]:
        """Sharded, each full tensor is gathered into host memory whatever `on_device` (a whole model is never on
        one device: the reason it is sharded)."""
        if not self.sharded:
            return wire_weights(self.weights(), dtype=dtype, tied=tied, host=host, on_device=on_device)
        return fsdp.wire_weights(self.model, dtype=dtype, tied=tied, host=host)  # a collective: every rank, in order

    def tensors(self) -> Mapping[str, torch.Tensor]:
        """Sharded: the DTensors of this rank's shards (the delta encoder reads its rows of each, no gather); with
        LoRA each adapted weight's rows merged (`fsdp.merged_shards`: a collective, every rank in order)."""
        if not self.sharded:
            return self.weights()
        return fsdp.merged_shards(self.model) if self.lora else self.model.state_dict()

    def checkpoint_modules(self) -> dict[str, nn.Module]:
        """Sharded, each rank's checkpoint shard holds its part of the fp32 policy (the HF directory holds the
        gathered weights in the checkpoint's dtype). With LoRA, the adapters alone (this rank's part of them,
        sharded): the frozen weights are the job's model, which every rank loads at its start, resumed or not."""
        if self.lora:
            return {"lora": lora.AdapterState(self.model)}
        return {"policy": self.model} if self.sharded else {}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """HF-layout tensors (a tied lm_head may be left out) into the policy, each read from `state_dict` as it is
        copied (a resume's `CheckpointTensors`: one at a time, not the model), as `TinyGPT.load_weights` checks them.
        With LoRA, checked to fit and not copied: the policy's weights are the job's model, frozen, and its trained
        state is its adapters, which a resume restores from the rank's shard (`checkpoint_modules`) — the merged
        model a checkpoint's HF directory holds is their sum, in the checkpoint's dtype."""
        tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
        if self.lora:
            own = {k: tuple(t.shape) for k, t in self.model.state_dict().items() if not lora.is_adapter(k)}
            check_fit(own, shapes_of(state_dict), optional=tied)
        elif self.sharded:
            fsdp.load_full(self.model, state_dict, optional=tied)
        else:
            self.model.load_weights(state_dict)  # (copy_into, a tied lm_head optional)

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        assert not self.sharded, (
            "a sharded policy is saved from the version it published (agents.weights.PublishedModel)"
        )
        if self.lora:  # the merged model (what transformers and the engines load), in fp32 as TinyGPT saves
            tied = self.model.config.tie_word_embeddings
            sd = {k: v for k, v in self.weights().items() if not (tied and k == "lm_head.weight")}
            return hfdir.write_pretrained(directory, sd, self.model.config, tokenizer_from=tokenizer_from)
        return self.model.save_pretrained(directory, tokenizer_from=tokenizer_from)
