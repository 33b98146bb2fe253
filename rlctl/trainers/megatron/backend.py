"""The `megatron` trainer backend: megatron-core's GPTModel, loaded from and exported to HF layout.

    HF checkpoint ──names.to_megatron(tp rank, pp stage)──▶ GPTModel (this rank's shard) ──learner (rlctl.rl.grpo)
    weights():  names.to_hf (this rank's HF shard of its stage) ──all-gather over the tp group──▶ the stage's
                full HF tensors ──broadcast by each stage over the pp group──▶ full HF tensors on every rank

What runs on CPU (megatron-core 0.16.1, torch 2.13 CPU, gloo; `cpu.py` is the shim that allows it):
  - tp = 1: GPTModel forward and backward, trained by the learner's own GRPO or PPO loss, AdamW, gradient
    clipping and gradient all-reduce over the trainer's ranks (data parallel: every rank a full replica, as the
    `torch` backend); the job path runs this (`trainer.backend: megatron`).
  - PPO's critic (`critic_trunk`): a second GPTModel of this rank's shard without the output layer
    (`model.MegatronTrunk`: the final normed hidden states come out where the logits do, on every rank, through
    the pipeline at pp > 1; tied embeddings are its input embedding only, so there is no copy on the last
    stage to keep in step) under a value head whole on every rank; `clip_grad_norm_(…, model=critic)` counts
    the head once. It trains, checkpoints (each rank's shard of it beside its optimizers) and resumes at every
    split below, as the policy does (tests/unit/trainers/test_megatron_ppo*.py, test_megatron_resume.py).
  - tp > 1 in a job (`trainer.tensor_parallel`, the plan's tp × pp × dp reaching each rank as
    RLCTL_PARALLEL; tp 2 over two gloo processes is tested: tests/unit/trainers/test_megatron_tp*.py and
    tests/integration/agents/test_agents_megatron_job.py): megatron's parallel state, column/row-parallel
    layers, vocab-parallel embedding, logits gathered over the tp group. The learner gives the ranks of a
    tp group the same samples (`data_parallel`: they share a data-parallel rank), sums gradients over the
    data-parallel group only, clips by the norm over every shard (`clip_grad_norm_`), and AdamW steps each
    rank's shard. `weights()` gathers the shards into full HF tensors, the same bytes on every tp rank, which
    every rank publishes and rank 0 checkpoints (a second call before the next step answers from the
    gather, so rank 0's checkpoint needs no collective the other ranks are not in); each rank of
    data-parallel replica 0 checkpoints its own optimizer shard beside it (the other replicas hold the same),
    and a resumed rank loads its shard of the HF weights, read one tensor at a time (`rlctl.models.tensors`), and
    then the optimizer shard of its (tp, pp) position (`rlctl.checkpoint.trainer`).
  - pp > 1 in a job (`trainer.pipeline_parallel`; pp 2 and tp 2 × pp 2 are tested:
    tests/unit/trainers/test_megatron_pp.py and the job test): each rank builds its stage of the GPTModel and
    `pipeline.py` chains the stages inside `model(tokens)`, the cut's rows in chunks that overlap across the
    stages (GPipe within each learner cut: a stage idles (pp − 1)/m of the cut's time at m chunks; megatron's
    1F1B schedules are not used), so every rank returns the full logits and the learner is the same as at
    tp. The ranks of a pipeline share a data-parallel rank too; tied embeddings keep a copy on the last stage
    whose gradient is summed with the first stage's over megatron's embedding group before clipping, so both
    copies step alike.
Not run here: megatron's DDP wrapper and distributed optimizer (CUDA buffers; gradients are summed by the
learner over gloo instead), megatron's pipeline schedules, sequence parallel, Transformer Engine, and
megatron's own (distributed) checkpoint format: a checkpoint is the HF directory plus the optimizer shard of
each rank of data-parallel replica 0; resumed at another tp × pp, each rank rebuilds its AdamW state from the
old shards (`rlctl.checkpoint.resplit`; not a PPO critic's: refused).
On a GPU (tp = pp = 1): the GPTModel's fp32 parameters and AdamW state on the rank's device, the passes under
bf16 autocast (the agent's `Compute`, as the torch backend), gradients summed by the learner over the trainer's
group (NCCL); a rank of a tp or pp split stops at start (`MEGATRON_GPU_SPLIT`). gpu-check's `megatron` piece
compares it with the torch backend on the device; preflight refuses a GPU trainer site until that has run on
a GPU (docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from rlctl.devices import Compute
from rlctl.errors import ConfigError
from rlctl.models import hf, hfdir
from rlctl.models.hfnames import expected_shapes, match_weights
from rlctl.models.tensors import CheckpointTensors, DoesNotFit, ModelTensors
from rlctl.trainers.base import DataParallel, TrainerBackend, clip_whole
from rlctl.trainers.megatron import names
from rlctl.trainers.megatron.model import MegatronPolicy, MegatronTrunk, StagedGPT, import_megatron, init_parallel


class Exported(Mapping[str, torch.Tensor]):
    """A whole model's HF tensors (tp = pp = 1), each made from the GPTModel's as it is read (`names.to_hf` of that
    name alone): the embedding, norms and projections are the parameters themselves, but q, k and v are copies (a
    fused qkv's rows interleave by query group), so a reader of one tensor at a time (the wire snapshot, a
    checkpoint's host copy, the delta encoder) holds one layer's, versus every layer's fp32 q, k and v made at once
    on the rank's device at every publish and checkpoint. A tied lm_head is the embedding."""

    def __init__(self, policy: MegatronPolicy) -> None:
        self._state, self._config = policy.megatron_state(), policy.config
        tied = ["lm_head.weight"] if policy.config.tie_word_embeddings else []  # (the embedded model lists both)
        self._names = [*expected_shapes(policy.config), *tied]
        self._known = set(self._names)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._known:
            raise KeyError(name)
        hf_name = "model.embed_tokens.weight" if name == "lm_head.weight" and self._config.tie_word_embeddings else name
        return names.to_hf(self._state, self._config, only={hf_name})[hf_name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class MegatronBackend(TrainerBackend):
    def __init__(self, policy: MegatronPolicy) -> None:
        self.model: MegatronPolicy = policy
        self.config = policy.config
        self.tp, self.stage = policy.tp, policy.stage
        # the last all-gathered weights and the parameters' in-place version counters they were taken at:
        # rank 0 asks again for the checkpoint of a version it just published, when the other tp ranks are
        # not in the collective (they publish only)
        self._gathered: tuple[tuple[int, ...], dict[str, torch.Tensor]] | None = None

    @classmethod
    def load(
        cls, model_dir: Path, *, tp: int = 1, pp: int = 1, compute: Compute | None = None, context: int | None = None
    ) -> MegatronBackend:
        """This rank's shard of the HF checkpoint `model_dir` in a GPTModel, fp32 on `compute`'s device (default:
        the CPU) and computing in its autocast dtype (bf16 on a GPU); forms megatron's parallel state (tp × pp
        over the torch.distributed group, which must exist: NCCL for CUDA tensors). ValueError when tp or pp
        does not split the model (`names.check_split`); ConfigError where `context`, the longest sequence it trains
        on (None: the model's max_positions), is longer than a Mistral sliding window that binds (its attention, as
        the torch backend's, attends to every earlier position: `hf.window_refusal`)."""
        config = hf.read_config(model_dir)
        held = config.max_positions if context is None else min(context, config.max_positions)
        if (why := hf.window_refusal(config, held)) is not None:
            raise ConfigError(str(Path(model_dir) / hf.CONFIG_FILE), "sliding_window", why)
        names.check_split(config, tp, pp)
        sd = CheckpointTensors(model_dir)  # each tensor read as its parameter is loaded: one at a time, not the model
        only = match_weights(sd.shapes(), config, where=str(model_dir))  # (not an older Llama's inv_freq buffers)
        init_parallel(tp=tp, pp=pp)
        policy = MegatronPolicy(
            config,
            tp=tp,
            pp=pp,
            device=None if compute is None else compute.device,
            autocast_dtype=None if compute is None else compute.autocast_dtype,
            initialise=False,  # every tensor is the checkpoint's, written next
        )
        try:
            policy.load_hf(
                ModelTensors(sd, config, only=only),
                rank=import_megatron().parallel_state.get_tensor_model_parallel_rank(),
            )
        except DoesNotFit as e:  # (what match_weights passes: a tied lm_head the file holds beside the embedding)
            raise ConfigError(str(model_dir), None, str(e)) from e
        return cls(policy)

    def shard(self) -> dict[str, torch.Tensor]:
        """This rank's HF-layout shard of its pipeline stage's tensors (see names.py); the whole checkpoint
        when tp = pp = 1."""
        return self.model.export_hf()

    def weights(self) -> Mapping[str, torch.Tensor]:
        """Full HF tensors (tp = pp = 1: each made as it is read, `Exported`). With tp or pp > 1 a collective over
        the tp and pp groups (every rank calls it once per new set of parameters); asked again before the parameters
        change, it answers from the last gather.
        What a rank holds for it (`rlctl.planner.costs.export_bytes`): the full tensors in fp32, kept until the next
        gather, which lets the last ones go first and joins one tensor's tp parts at a time (versus the last
        gather's tensors and every tensor's tp parts held beside the new ones: three times the model's fp32 bytes)."""
        if self.tp == 1 and self.stage.count == 1:
            return Exported(self.model)
        versions = tuple(p._version for p in self.model.parameters())
        if self._gathered is None or self._gathered[0] != versions:
            self._gathered = None  # (a caller's reference to the last ones' dict keeps them, not this)
            stage = self.shard() if self.tp == 1 else self._tp_gathered(self.shard())
            self._gathered = versions, self._from_stages(stage) if self.stage.count > 1 else stage
        out = dict(self._gathered[1])
        if self.config.tie_word_embeddings:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]  # the embedded model lists both
        return out

    def model_parallel(self) -> tuple[int, int]:
        return self.tp, self.stage.count

    def data_parallel(self) -> DataParallel:
        """Megatron's data-parallel rank, size and group: the ranks of one tp group share a replica."""
        ps = import_megatron().parallel_state
        return DataParallel(
            ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), ps.get_data_parallel_group()
        )

    def critic_trunk(self) -> MegatronTrunk:
        """A second GPTModel of this rank's shard, without the output layer, holding the policy's weights now."""
        trunk = MegatronTrunk(
            self.config,
            tp=self.tp,
            pp=self.stage.count,
            device=self.model.device,
            autocast_dtype=self.model.autocast_dtype,
            initialise=False,  # every tensor is the policy's, written next
        )
        trunk.copy_from(self.model)
        return trunk

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, *, model: nn.Module | None = None) -> float:
        """Clip by the norm of the whole model's gradient: the squares of every tp-split parameter summed
        over the tp and pp groups, each replicated one (norms, row-parallel biases) counted once per stage.
        At pp > 1 with tied embeddings the gradient is only whole once the two copies' (first stage: the
        embedding, last stage: the output layer) are summed over megatron's embedding group, which this does
        first, so that both copies step alike; the copy is counted once in the norm. Qwen3's q/k norms (replicated,
        each rank's gradient the part of its own heads: names.py) are summed over the tp group first as well, as
        megatron's finalize_model_grads does, so that every tp rank steps them alike. A parameter of `model`
        outside its GPTModels (a critic's value head) is held whole by every rank and counted once. At
        tp = pp = 1 this is torch's own clip."""
        model = self.model if model is None else model
        if self.tp == 1 and self.stage.count == 1:
            return clip_whole(model, max_norm)
        ps = import_megatron().parallel_state
        staged = [m for m in model.modules() if isinstance(m, StagedGPT)]
        ends = self.stage.count > 1 and (self.stage.first or self.stage.last)
        for m in staged:
            if ends and m.gpt.share_embeddings_and_output_weights:  # a critic's trunk holds no copy
                shared = m.gpt.shared_embedding_or_output_weight()
                assert shared.grad is not None  # the learner fills missing gradients with zeros before it clips
                dist.all_reduce(shared.grad, group=ps.get_embedding_group())
        if self.tp > 1 and self.config.qk_norm:
            for m in staged:
                for name, p in m.gpt.named_parameters():
                    if p.grad is not None and name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
                        dist.all_reduce(p.grad, group=ps.get_tensor_model_parallel_group())
        sharded = {id(p) for m in staged for p in m.parameters()}
        # on the stage's device: the gradients' squares add into them, and NCCL all-reduces no host tensor
        square = torch.zeros((), dtype=torch.float32, device=self.model.device)
        grads, whole = [], torch.zeros((), dtype=torch.float32, device=self.model.device)
        for p in model.parameters():
            if p.grad is None:
                continue
            grads.append(p.grad)
            if id(p) not in sharded:
                whole += p.grad.float().pow(2).sum()
                continue
            counted = getattr(p, "tensor_model_parallel", False) or ps.get_tensor_model_parallel_rank() == 0
            if counted and not getattr(p, "shared", False):  # `shared`: the last stage's copy of the embedding
                square += p.grad.float().pow(2).sum()
        dist.all_reduce(square, group=ps.get_model_parallel_group())
        norm = float((square + whole).sqrt())  # + 0 for a policy: its norm as before, bit for bit
        scale = min(max_norm / (norm + 1e-6), 1.0)  # as torch.nn.utils.clip_grad_norm_
        if scale < 1.0:
            for g in grads:
                g.mul_(scale)
        return norm

    @torch.no_grad()
    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Full HF tensors (the embedded model's names; a tied lm_head, if there, must be the embedding) into this
        rank's shard, each read from `state_dict` as its parameter is loaded; DoesNotFit with nothing written where
        they are not this model's (`MegatronPolicy.load_hf`)."""
        self.model.load_hf(state_dict, rank=import_megatron().parallel_state.get_tensor_model_parallel_rank())

    def _from_stages(self, mine: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full HF tensors (HF order) from each stage's: every tensor broadcast over the pp group by its stage."""
        ps = import_megatron().parallel_state
        group = ps.get_pipeline_model_parallel_group()
        ranks = dist.get_process_group_ranks(group)  # global rank of each stage, in stage order
        out = {}
        for name, shape in expected_shapes(self.config).items():
            owner = names.stage_of(name, self.config, self.stage.count)
            if owner == self.stage.index:
                t = mine[name]
            else:  # on the stage's device: NCCL broadcasts no host tensor
                t = torch.empty(shape, dtype=torch.float32, device=self.model.device)
            dist.broadcast(t, ranks[owner], group=group)
            out[name] = t
        return out

    def _tp_gathered(self, shard: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stage's full HF tensors from every tp rank's `shard` (`names.gather_hf`'s), all-gathered over the tp
        group one tensor at a time: each tensor's parts are joined, and let go, before the next is gathered."""
        group = import_megatron().parallel_state.get_tensor_model_parallel_group()
        out = {}
        for name in list(shard):
            t = shard.pop(name)  # (this rank's part: a copy of q, k, v, free once joined)
            if (dim := names.shard_dim(name)) is None:
                out[name] = t
                continue
            parts = [torch.empty_like(t) for _ in range(self.tp)]
            dist.all_gather(parts, t, group=group)
            out[name] = torch.cat(parts, dim=dim)
            del parts
        return out

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        """An fp32 HF checkpoint, as TinyGPT.save_pretrained writes it. At tp or pp > 1 it reuses the weights the last
        `weights()` gathered (a collective every rank joins when it publishes), so rank 0 must publish a version
        before it checkpoints it, as the trainer does: rank 0 alone saving would not be a collective."""
        sd = {k: v.detach().cpu() for k, v in self.weights().items()}  # from a GPU's memory: one copy each
        if self.config.tie_word_embeddings:
            del sd["lm_head.weight"]
        return hfdir.write_pretrained(directory, sd, self.config, tokenizer_from=tokenizer_from)
