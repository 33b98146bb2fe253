"""Streaming GRPO step: samples are scored as they arrive, trained in micro-batches as soon as whole
groups are in, and the optimizer steps once per iteration — the same update as training the batch
at the end (sync), because the loss is a weighted token *sum* (each token weighed by its own sample,
`algorithm.loss_aggregation`, `rlctl.rl.grpo.token_weights`) and the gradient is divided by the iteration's
normaliser (its tokens, its samples with output, or samples × max_output_tokens) only at the step.

    add(sample) ─▶ group buffer ──group complete──▶ advantages ─▶ ready
    train_ready(min) ─▶ micro-batch forward/backward (grad accumulates)        [as samples stream in]
    step() ─▶ all-reduce(sum) over ranks, ÷ normaliser, clip, AdamW step at the schedule's rate ─▶ version + 1
              (a gradient norm that is NaN or infinite: no AdamW step, the weights stay; `skipped` says so)

Ranks > 0 follow rank 0: each micro-batch is broadcast, every data-parallel rank takes its slice. The
step's figures (loss, clip fraction, k3 KL of the sampling policy from the trained one) are weighted token sums
all-reduced with the gradients, so rank 0 reports the whole iteration, not its own slice.

Tensor and pipeline parallel (the megatron backend, `rlctl.trainers.base.DataParallel`): the ranks of one
tp × pp group hold shards of one replica, so they share a data-parallel rank and take the same slice in the
same order (the model's forward and backward are collectives over the group); gradients and figures are
summed over the data-parallel group only, and the backend clips by the norm over every shard. Every replica
then takes the same AdamW step from the same summed gradient, so the ranks at one (tp, pp) position hold the
same parameters and optimizer state bit for bit: a checkpoint keeps replica 0's (`rlctl.checkpoint.trainer`).

    rank 0 ─broadcast Chunk(samples)─▶ every rank: its share (a run of the cut's length order: rl.cuts.share_rows)
                                       ─▶ forward/backward (tp collectives)
    rank 0 ─broadcast Step(tokens, normaliser)─▶ every rank: all-reduce over dp ─▶ ÷ normaliser ─▶ clip ─▶ AdamW
    rank 0 ─broadcast CheckpointDue(v)─▶ every rank: `on_checkpoint(v)` (replica 0's ranks write their shard
                                          of checkpoint v, `rlctl.checkpoint.trainer`)
    rank 0 ─broadcast Stop()─▶ every rank returns from `follow`

Each broadcast is one `Command` (a msgspec struct: msgpack in uint8 tensors, `rlctl.trainers.wire`), never a
pickle. PPO (`PpoBatchLearner`) follows the same protocol with the whole batch at the step (its GAE needs all of it);
`make_learner` builds the learner of a job's algorithm on a trainer backend, for the trainer agent and the
profiler alike.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable

import msgspec
import torch
import torch.distributed as dist

from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.pipeline import Batch
from rlctl.devices import sync
from rlctl.models.moeloss import balanced
from rlctl.rl.cuts import share_slice, trainable_cuts
from rlctl.rl.gradsum import sum_gradients
from rlctl.rl.grpo import Counts, group_advantages, loss_normaliser, needs_max_output_tokens, policy_loss
from rlctl.rl.ppo import PpoLearner, ValueModel
from rlctl.rl.samples import Sample, device_of, fill_ref_logprobs, make_batch, row_tokens
from rlctl.rl.schedule import StepLr, finite_step, policy_optimizer, set_lr, trained_parameters
from rlctl.trainers.base import DataParallel, TrainerBackend, Trunk, clip_whole, whole_replicas
from rlctl.trainers.wire import broadcast_value

# token sums of `policy_loss` that the step reports
_SUMMED = (
    "pg_loss_sum",
    "kl_ref_sum",
    "clip_sum",
    "kl_sum",
    "is_weight_sum",
    "is_capped_sum",
    "entropy_sum",
    "tokens",
    "weight_sum",
    "router_aux_sum",
    "aux_loss_sum",
)


# What rank 0 broadcasts to the others (`follow`), one command at a time.
class Chunk(msgspec.Struct, tag="chunk"):
    samples: list[Sample]
    advantages: list[float]
    reduce: bool = True  # its backward reduces the gradients (`DataParallel.reduce_per_step`: the step's last cut)


class Step(msgspec.Struct, tag="step"):
    tokens: int  # the iteration's output tokens
    normaliser: float  # what its gradient is divided by (`rlctl.rl.grpo.loss_normaliser`: tokens, samples, …)


class WholeBatch(msgspec.Struct, tag="batch"):
    samples: list[Sample]


class CheckpointDue(msgspec.Struct, tag="checkpoint"):
    version: int


class Stop(msgspec.Struct, tag="stop"):
    pass


Command = Chunk | Step | WholeBatch | CheckpointDue | Stop


def _broadcast(command: Command | None) -> Command:
    """Rank 0's `command` on every rank (the others pass None)."""
    return broadcast_value(command, Command)  # type: ignore[arg-type]


Busy = Callable[[str], contextlib.AbstractContextManager[None]]  # a follower's busy phases (`Watchdog.busy`)


def _unwatched(phase: str) -> contextlib.AbstractContextManager[None]:
    del phase
    return contextlib.nullcontext()


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class StreamingLearner:
    def __init__(
        self,
        model: torch.nn.Module,  # a trainer backend's policy: tokens → logits (rlctl.trainers)
        cfg: GrpoAlgorithm | PpoAlgorithm,
        *,
        group_size: int,
        micro_batch_samples: int,
        micro_batch_tokens: int | None = None,
        ref_model: torch.nn.Module | None = None,
        data_parallel: DataParallel | None = None,  # default: every rank of the default group a replica
        clip_grad_norm_: Callable[[float], float] | None = None,  # default: over `model`'s parameters
        iterations: int | None = None,  # the job's: where `lr_decay` ends
        max_output_tokens: int | None = None,  # the job's task's: loss_aggregation 'constant' divides by it
    ) -> None:
        self.model, self.cfg, self.ref_model = model, cfg, ref_model
        needs_max_output_tokens(cfg.loss_aggregation, max_output_tokens)
        self.max_output_tokens = max_output_tokens
        self.group_size = group_size
        self.micro, self.micro_tokens = micro_batch_samples, micro_batch_tokens
        self.dp = data_parallel or whole_replicas()
        self.busy: Busy = _unwatched  # the trainer's watchdog marks each micro-batch and step (`Watchdog.busy`)
        self._clip = clip_grad_norm_ or (lambda max_norm: clip_whole(model, max_norm))
        self.opt = policy_optimizer(model, cfg.lr, weight_decay=cfg.weight_decay)
        self.schedule = StepLr.of(cfg, iterations=iterations)
        self.steps = 0  # optimizer steps taken: the version this rank's weights are at
        self._scale = cfg.advantage_std if isinstance(cfg, GrpoAlgorithm) else True
        self._reset()

    def resume_at(self, version: int) -> None:
        """The weights and optimizer state of `version` were restored: the next step is that version's."""
        self.steps = version

    def _reset(self) -> None:
        self.groups: dict[str, list[Sample]] = defaultdict(list)
        self.ready: list[tuple[Sample, float]] = []
        self.count = 0
        self.rewards: list[float] = []
        self.tokens = 0
        self.sequences = 0  # samples with an output token (sequence_mean's normaliser)
        self.no_signal = 0  # samples of groups whose advantages are all 0 (not run without a KL term: `add`)
        self.compute_s = 0.0
        self.sums: dict[str, float] = defaultdict(float)
        self.opt.zero_grad(set_to_none=True)

    def add(self, sample: Sample, *, group_size: int | None = None) -> None:
        """A scored sample arrived; when its group is complete (`group_size` samples: fewer than the job's when
        some were filtered out), its advantages are known.

        A group whose advantages are all 0 (its rewards are equal) is not trained when the loss has no KL term: its
        loss is 0 on every token whatever the weights, so its forward and backward would add exact zeros to the
        gradient. The step's gradient is unchanged (its tokens still count in the normaliser); the figures averaged
        over tokens (clip fraction, KL, entropy) are over the tokens trained, so read them beside `no_signal_frac`
        (a policy collapsing onto one answer per prompt shows first as a rising share of groups without signal)."""
        self.count += 1
        self.rewards.append(sample.reward)
        self.tokens += len(sample.output_tokens)
        self.sequences += bool(sample.output_tokens)
        group = self.groups[sample.prompt_id]
        group.append(sample)
        if len(group) == (group_size or self.group_size):
            adv = group_advantages([s.reward for s in group], [s.prompt_id for s in group], scale=self._scale)
            del self.groups[sample.prompt_id]
            signal = any(adv)
            if not signal:
                self.no_signal += len(group)
            if signal or self.cfg.kl_coef > 0:
                self.ready += list(zip(group, adv, strict=True))

    def train_ready(self, *, flush: bool = False) -> None:
        """Forward/backward on every full micro-batch of ready samples (all of them when flushing).

        Ready samples are cut in length order (the rows and padded-token budgets of each data-parallel rank's share,
        `rlctl.rl.cuts`); the last cut may still grow with the next arrivals, so it waits unless it is full or this
        flushes. Where FSDP2 reduces the gradients once a step (`DataParallel.reduce_per_step`) only the step's last
        cut reduces them, and which is last is known at the flush alone: a full cut that would leave nothing ready
        waits for it too.
        """
        rows = [row_tokens(s) for s, _ in self.ready]
        once = self.dp.reduce_per_step
        cuts, keep = trainable_cuts(
            rows, self.micro, max_tokens=self.micro_tokens, ranks=self.dp.size, flush=flush, reduce_per_step=once
        )
        for n, idx in enumerate(cuts, 1):
            self._micro_step([self.ready[i] for i in idx], reduce=not once or (flush and n == len(cuts)))
        self.ready = [self.ready[i] for i in keep]

    def _micro_step(self, chunk: list[tuple[Sample, float]], *, reduce: bool) -> None:
        with self.busy("train"):  # one phase per micro-batch, as on the ranks that follow (their hang is theirs)
            if _world()[1] > 1:
                _broadcast(Chunk([s for s, _ in chunk], [a for _, a in chunk], reduce))
            self.backward_share(chunk, reduce=reduce)

    def backward_share(self, chunk: list[tuple[Sample, float]], *, reduce: bool = True) -> None:
        """Forward/backward on this data-parallel rank's slice of `chunk` (the same slice on every tp rank). With a
        sharded policy (FSDP) every rank runs every forward and backward (they are collectives): a rank whose slice
        is empty runs the chunk's first row with weight 0 (a cut of fewer rows than ranks: under the per-rank
        budgets only a step's last, the flush's remainder, as every other cut closes at a row a rank at least;
        tests/unit/trainers/test_dp_grad_bytes.py); `reduce` False (`DataParallel.reduce_per_step`), FSDP2 holds
        gradient sync off: the backward accumulates this rank's unsharded gradients, reduced by the step's last
        cut's."""
        t0 = time.monotonic()
        tokens = [row_tokens(s) for s, _ in chunk]
        mine = chunk[
            share_slice(tokens, self.micro, max_tokens=self.micro_tokens, ranks=self.dp.size, rank=self.dp.rank)
        ]
        weight = 1.0
        if not mine and self.dp.sharded and chunk:
            mine, weight = chunk[:1], 0.0
        if mine:
            samples = [s for s, _ in mine]
            if self.cfg.kl_coef > 0:
                fill_ref_logprobs(self.ref_model, samples, temperature=self.cfg.temperature)
            batch = make_batch(samples, [a for _, a in mine])
            self.model.train()
            loss, m = policy_loss(
                self.model,
                batch,
                self.cfg.clip_eps,
                self.cfg.kl_coef,
                temperature=self.cfg.temperature,
                normaliser=1.0,  # a weighted sum: the step divides the whole iteration's by its normaliser
                aggregation=self.cfg.loss_aggregation,
                off_policy=self.cfg.off_policy,
                is_cap=self.cfg.behaviour_cap,
                clip_eps_high=self.cfg.clip_high,
            )
            if self.dp.reduce_per_step:
                self.model.set_requires_gradient_sync(reduce)  # type: ignore[operator]
            (loss * weight).backward()
            for k, v in m.items():
                self.sums[k] += weight * v
        sync(device_of(self.model))  # the backward's kernels ran: `train_s` (the rebalancer's T_train) counts them
        self.compute_s += time.monotonic() - t0

    def step(self) -> dict[str, float]:
        """Train what is left, then one optimizer step over the whole iteration."""
        self.train_ready(flush=True)
        counts = Counts(self.tokens, self.sequences, self.count)  # rank 0's: every sample of the iteration
        normaliser = loss_normaliser(self.cfg.loss_aggregation, counts, max_output_tokens=self.max_output_tokens)
        step = Step(self.tokens, normaliser)
        with self.busy("optimizer step"):
            if _world()[1] > 1:
                _broadcast(step)
            stats = self.apply_step(step)
        stats["reward_mean"] = sum(self.rewards) / max(len(self.rewards), 1)
        stats["samples"] = float(self.count)
        stats["no_signal_frac"] = self.no_signal / max(self.count, 1)
        self._reset()
        return stats

    def apply_step(self, step: Step) -> dict[str, float]:
        """The optimizer step over the iteration's summed gradient, divided by `step.normaliser` (rank 0's, broadcast:
        every rank divides by the same)."""
        t0 = time.monotonic()
        n = step.normaliser
        several = self.dp.size > 1
        params = trained_parameters(self.model)  # (a LoRA policy's frozen weights have no gradient)
        if several and not self.dp.sharded:  # sum over data-parallel ranks: each summed the loss of its share
            sum_gradients(params, self.dp.group)  # (sharded: FSDP summed them in backward)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad /= n
        sums = {k: self.sums[k] for k in _SUMMED}
        if several:
            box = torch.tensor([sums[k] for k in _SUMMED], dtype=torch.float64)
            dist.all_reduce(box, group=self.dp.group)
            sums = dict(zip(_SUMMED, box.tolist(), strict=True))
        grad_norm = self._clip(self.cfg.grad_clip)
        lr = self.cfg.lr * self.schedule.at(self.steps)
        skipped = not finite_step(grad_norm, step=self.steps)  # the same norm on every rank: all skip, or none
        if not skipped:
            set_lr(self.opt, lr)
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        self.model.eval()
        sync(device_of(self.model))  # the optimizer's step ran
        self.compute_s += time.monotonic() - t0
        # the weights of the tokens the loss ran on (not those of groups without signal): their count, or under
        # sequence_mean their samples'; none: the per-token figures are NaN
        trained = sums["weight_sum"] or math.nan
        return {
            # what the gradient is of
            "loss": (sums["pg_loss_sum"] + self.cfg.kl_coef * sums["kl_ref_sum"] + sums["aux_loss_sum"]) / n,
            "kl_ref": sums["kl_ref_sum"] / n,  # KL(θ ‖ reference), k3, as the loss's term (kl_coef > 0: 0 otherwise)
            # a Qwen MoE's load-balancing loss, its passes' weighted mean (`rlctl.rl.grpo`), where its loss has it
            **({"router_aux_loss": sums["router_aux_sum"] / n} if balanced(self.model) is not None else {}),
            "clip_frac": sums["clip_sum"] / trained,
            "kl": sums["kl_sum"] / trained,
            "is_weight_mean": sums["is_weight_sum"] / trained,  # π_prox / μ over the tokens trained (clip: 1)
            "is_capped_frac": sums["is_capped_sum"] / trained,
            "entropy": sums["entropy_sum"] / trained,
            "grad_norm": grad_norm,
            "lr": lr,
            "tokens": float(step.tokens),
            "train_s": self.compute_s,
            "skipped": float(skipped),
        }

    def follow(
        self,
        on_step: Callable[[], None] | None = None,
        *,
        on_checkpoint: Callable[[int], None] | None = None,
    ) -> None:
        """Ranks > 0: do what rank 0 broadcasts until it sends 'stop'; `on_step` after each optimizer step
        (the rank then holds the same weights and optimizer state as the other ranks of its (tp, pp) position,
        bit for bit: gradients are all-reduced over the data-parallel group); `on_checkpoint(version)` when
        rank 0 `announce_checkpoint`s. `self.busy(phase)` wraps its work ("train" per micro-batch, "optimizer
        step"), never its wait for rank 0's next broadcast."""
        busy = self.busy
        while True:
            item = _broadcast(None)
            if isinstance(item, Step):
                with busy("optimizer step"):
                    self.apply_step(item)
                self._reset()
                if on_step is not None:
                    on_step()
            elif isinstance(item, CheckpointDue):
                assert on_checkpoint is not None, "rank 0 checkpoints: this rank must write its shard"
                on_checkpoint(item.version)
            elif isinstance(item, Stop):
                return
            else:
                assert isinstance(item, Chunk), type(item)
                with busy("train"):
                    self.backward_share(list(zip(item.samples, item.advantages, strict=True)), reduce=item.reduce)

    def announce_checkpoint(self, version: int) -> None:
        """Rank 0, between steps: every follower calls its `on_checkpoint(version)`."""
        if _world()[1] > 1:
            _broadcast(CheckpointDue(version))

    def stop_followers(self) -> None:
        if _world()[1] > 1:
            _broadcast(Stop())

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """What each rank's shard of a checkpoint saves besides the policy (`rlctl.checkpoint.trainer`)."""
        return {"policy": self.opt}

    def modules(self) -> dict[str, torch.nn.Module]:
        return {}


class PpoBatchLearner:
    """PPO with a critic (`rlctl.rl.ppo`): rewards are still scored as samples arrive, but GAE and the
    whitened advantages need the whole batch, so training happens at the step. Ranks > 0 follow rank 0 as
    the streaming learner's do: the whole batch is broadcast at the step, and every rank trains its share
    (`PpoLearner.step`).

    rank 0 ─broadcast WholeBatch(samples)─▶ every rank: `train_batch(samples)` (GAE, forward/backward, all-reduce
                                           over dp, clip, AdamW on policy and critic)
    rank 0 ─broadcast CheckpointDue(v) / Stop()─▶ as StreamingLearner
    """

    def __init__(
        self,
        model: torch.nn.Module,  # a trainer backend's policy: tokens → logits (rlctl.trainers)
        cfg: PpoAlgorithm,
        *,
        critic: Trunk | ValueModel,  # the value model, or its body: `TrainerBackend.critic_trunk()`
        micro_batch_samples: int,
        micro_batch_tokens: int | None = None,
        ref_model: torch.nn.Module | None = None,
        data_parallel: DataParallel | None = None,  # default: every rank of the default group a replica
        clip_grad_norm_: Callable[[torch.nn.Module, float], float] = clip_whole,  # (policy or critic, max norm)
        iterations: int | None = None,  # the job's: where `lr_decay` ends
        max_output_tokens: int | None = None,  # the job's task's: loss_aggregation 'constant' divides by it
    ) -> None:
        self.inner = PpoLearner(
            model,
            cfg,
            critic=critic if isinstance(critic, ValueModel) else ValueModel(critic),
            ref_model=ref_model,
            micro_batch_samples=micro_batch_samples,
            micro_batch_tokens=micro_batch_tokens,
            data_parallel=data_parallel,
            clip_grad_norm_=clip_grad_norm_,
            iterations=iterations,
            max_output_tokens=max_output_tokens,
        )
        self.samples: list[Sample] = []
        self.busy: Busy = _unwatched  # as StreamingLearner's: the whole batch's training is one "train" phase

    def resume_at(self, version: int) -> None:
        """As `StreamingLearner.resume_at`."""
        self.inner.steps = version

    @property
    def count(self) -> int:
        return len(self.samples)

    def add(self, sample: Sample, *, group_size: int | None = None) -> None:
        del group_size  # PPO's advantages are per sample (GAE): groups do not matter
        self.samples.append(sample)

    def train_ready(self, *, flush: bool = False) -> None:
        del flush  # nothing to do before the whole batch is in

    def step(self) -> dict[str, float]:
        with self.busy("train"):
            if _world()[1] > 1:
                _broadcast(WholeBatch(self.samples))
            stats = self.train_batch(self.samples)
        self.samples = []
        return stats

    def train_batch(self, samples: list[Sample]) -> dict[str, float]:
        """Every rank: one PPO step on the whole batch, this rank training its data-parallel share."""
        stats = self.inner.step(samples)
        stats["train_s"] = stats["seconds"]
        return stats

    def follow(
        self,
        on_step: Callable[[], None] | None = None,
        *,
        on_checkpoint: Callable[[int], None] | None = None,
    ) -> None:
        """Ranks > 0: as `StreamingLearner.follow`, a whole batch per step (one "train" phase)."""
        busy = self.busy
        while True:
            item = _broadcast(None)
            if isinstance(item, WholeBatch):
                with busy("train"):
                    self.train_batch(item.samples)
                if on_step is not None:
                    on_step()
            elif isinstance(item, CheckpointDue):
                assert on_checkpoint is not None, "rank 0 checkpoints: this rank must write its shard"
                on_checkpoint(item.version)
            else:
                assert isinstance(item, Stop), type(item)
                return

    def announce_checkpoint(self, version: int) -> None:
        """Rank 0, between steps: every follower calls its `on_checkpoint(version)`."""
        if _world()[1] > 1:
            _broadcast(CheckpointDue(version))

    def stop_followers(self) -> None:
        if _world()[1] > 1:
            _broadcast(Stop())

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.inner.opt, "critic": self.inner.critic_opt}

    def modules(self) -> dict[str, torch.nn.Module]:
        return {"critic": self.inner.critic}


def make_learner(
    backend: TrainerBackend,
    algorithm: GrpoAlgorithm | PpoAlgorithm,
    batch: Batch,
    *,
    ref: torch.nn.Module | None,
    iterations: int | None = None,
    max_output_tokens: int | None = None,
) -> StreamingLearner | PpoBatchLearner:
    """The trainer's learner for `algorithm` on a backend's policy (and reference model), with the backend's
    data-parallel place and gradient clipping (and, for PPO, a critic on the backend's `critic_trunk`);
    `iterations`, the job's, is where a decaying learning rate ends (needed with `lr_decay` linear or cosine);
    `max_output_tokens`, the job's task's, what `loss_aggregation: constant` divides by (needed with it)."""
    if isinstance(algorithm, PpoAlgorithm):
        critic = ValueModel(backend.critic_trunk())
        backend.shard_critic(critic)  # (FSDP2: as the policy, before its optimizer is made over its parameters)
        return PpoBatchLearner(
            backend.model,
            algorithm,
            critic=critic,
            ref_model=ref,
            micro_batch_samples=batch.train_micro_batch_samples,
            micro_batch_tokens=batch.train_micro_batch_tokens,
            data_parallel=backend.data_parallel(),
            clip_grad_norm_=lambda module, max_norm: backend.clip_grad_norm_(max_norm, model=module),
            iterations=iterations,
            max_output_tokens=max_output_tokens,
        )
    return StreamingLearner(
        backend.model,
        algorithm,
        group_size=batch.samples_per_prompt,
        micro_batch_samples=batch.train_micro_batch_samples,
        micro_batch_tokens=batch.train_micro_batch_tokens,
        ref_model=ref,
        data_parallel=backend.data_parallel(),
        clip_grad_norm_=backend.clip_grad_norm_,
        iterations=iterations,
        max_output_tokens=max_output_tokens,
    )
