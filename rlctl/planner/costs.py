"""Cost functions the planner evaluates, built from a profile: decode PTL(BS) and trainer step time.

`DecodeCost` is one instance type (a GPU type at a TP degree) at the workload's context length:
`ptl_s[bs]` seconds per decode step for bs = 1..max_batch (index 0 unused), interpolated from the
profile grid (linear in context and in batch size, extrapolated linearly past the last context and batch size;
below the first context, the first context's). A step costs no less at a longer context or a larger batch, so the
grid is taken non-decreasing along both before that: a measured grid on a shared machine is noisy, and a longer
context measured faster than a shorter one extrapolated to non-positive step times, which made every split of a
plan infeasible (CI, tests/vllm/test_vllm_profile.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, Protocol

import numpy as np

from rlctl.config.hostfill import trainer_slots
from rlctl.models.catalog import ModelArch
from rlctl.profiler.actmem import Activations
from rlctl.profiler.analytical import RANK_WORKING_BYTES
from rlctl.profiler.profile import GenerationEntry, SiteProfile, TrainingEntry
from rlctl.rl.cuts import busiest_padded, cut_lengths, pipeline_chunks

TRAIN_STEP_OVERHEAD_S = 0.05  # optimizer step and bookkeeping per iteration
TRAIN_MEM_FRACTION = 0.9
# what a ring hop between two GPUs of one node carries a second (NVLink through NVSwitch: each GPU's own link)
INTRA_NODE_BYTES_PER_S = 300e9
# … between two ranks of one CPU host (gpu: CPU, a rank a core-slot): processes reducing over gloo through TCP
# loopback (`rlctl.agents.trainer.init_group`), no NVLink. Measured on the 2-core bench machine (2026-12-07, loaded):
# an all-reduce between 2 processes ran at 0.68 GB/s of 1.4 MB (the demo model's gradients), 0.71 of 16 MB and 0.99
# of 100 MB (at 2 ranks a hop carries the whole buffer: busbw = algbw)
CPU_HOST_BYTES_PER_S = 0.8e9


def host_link_bytes_per_s(gpu: str) -> float:
    """What a ring hop between two ranks of one host of `gpu` carries a second (`ring_time_s`)."""
    return CPU_HOST_BYTES_PER_S if gpu == "CPU" else INTRA_NODE_BYTES_PER_S


@dataclass(frozen=True)
class DecodeCost:
    tp: int
    ptl_s: np.ndarray  # index = batch size
    prefill_s_per_token: float
    kv_capacity_tokens: int
    max_batch: int  # min(engine cap, KV bound at the planning context)
    admit_fixed_s: float = 0.0  # fixed cost of a step that admits (prefills) new sequences
    compact_fraction: float | None = None  # lazy row compaction of the engine (None: rows freed at once)

    def ptl(self, bs: int) -> float:
        return float(self.ptl_s[min(max(bs, 1), self.max_batch)])

    def batch_bound(self, seq_tokens: float) -> int:
        """Largest batch whose KV cache fits when every sequence holds `seq_tokens` tokens."""
        return max(1, min(self.max_batch, int(self.kv_capacity_tokens // max(seq_tokens, 1.0))))


def _interp_context(entry: GenerationEntry, context: float) -> np.ndarray:
    ctx = np.asarray(entry.contexts, dtype=float)
    grid = np.maximum.accumulate(np.asarray(entry.ptl_s, dtype=float), axis=0)  # non-decreasing in context
    if len(ctx) == 1 or context <= ctx[0]:
        return grid[0]
    i = int(np.clip(np.searchsorted(ctx, context) - 1, 0, len(ctx) - 2))
    w = (context - ctx[i]) / (ctx[i + 1] - ctx[i])
    return grid[i] + w * (grid[i + 1] - grid[i])  # extrapolates linearly past the last context


def decode_cost(entry: GenerationEntry, *, context: float, seq_tokens: float, engine_max_batch: int) -> DecodeCost:
    """PTL at `context` (mean live context per step), batch bounded by the engine and by KV at `seq_tokens`."""
    row = np.maximum.accumulate(_interp_context(entry, context))  # non-decreasing in batch size
    bs = np.asarray(entry.batch_sizes, dtype=float)
    kv_bound = max(1, int(entry.kv_capacity_tokens // max(seq_tokens, 1.0)))
    cap = max(1, min(engine_max_batch, kv_bound))
    xs = np.arange(cap + 1, dtype=float)
    ptl = np.interp(xs, bs, row)
    if cap > bs[-1] and len(bs) > 1:
        slope = (row[-1] - row[-2]) / (bs[-1] - bs[-2])
        over = xs > bs[-1]
        ptl[over] = row[-1] + slope * (xs[over] - bs[-1])
    ptl[0] = ptl[1] if cap >= 1 else 0.0
    return DecodeCost(
        entry.tp,
        ptl,
        entry.prefill_s_per_token,
        entry.kv_capacity_tokens,
        cap,
        entry.prefill_fixed_s,
        entry.compact_fraction,
    )


class Sharding(NamedTuple):
    """How the trainer runs at a layout (`trainer_layout`): FSDP2 or not, and whether FSDP2 reduce-scatters the
    gradients once an optimizer step (in its last cut) rather than once a cut."""

    fsdp: bool
    reduce_per_step: bool

    def config(self) -> dict[str, bool]:
        """The plan's trainer config keys: {} unsharded, {"fsdp": True} and "reduce_per_step" where it holds."""
        if not self.fsdp:
            return {}
        return {"fsdp": True} | ({"reduce_per_step": True} if self.reduce_per_step else {})


UNSHARDED = Sharding(False, False)


@dataclass(frozen=True)
class TrainConfig:
    tp: int
    pp: int
    dp: int
    layout: Sharding = UNSHARDED  # the FSDP2 its time was priced with (`trainer_layout`), as the launch runs it

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def as_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp}


class CutSize(NamedTuple):
    """A step's cuts of one size (`StepCuts.sizes`): their rows, the share of the step's tokens in them, and what the
    busiest rank computes of them per token they hold: its share's padded tokens (rows × its longest row,
    `rlctl.rl.cuts.busiest_padded`), summed over those cuts, over their tokens (1/dp where the ranks split them evenly
    and nothing pads)."""

    rows: int
    share: float
    busiest: float


class StepCuts(NamedTuple):
    """An optimizer step's cuts as the learner makes them (`step_cuts`): how many, the rows of the largest, and
    each cut size's `CutSize`."""

    number: int
    rows: int
    sizes: tuple[CutSize, ...]


@dataclass(frozen=True)
class TrainWorkload:
    tokens: float  # trained tokens per iteration (prompt + output, all samples)
    samples: int
    micro_batch_samples: int
    # the trained parameters' gradients as data-parallel ranks sum them: fp32, 4 B a parameter, in each backend
    # and sharding (`dp_reduced_bytes`)
    grad_bytes: float
    # the job's passes relative to those the profile's seconds per token include (traincost.forward_units)
    pass_scale: float = 1.0
    mini_batches: int = 1  # optimizer steps per epoch: a cut holds the samples of one mini-batch at most
    optimizer_steps: int = 1  # per iteration (epochs × mini-batches): one gradient all-reduce each
    # the trainer shards every rank's state over the dp ranks where a replica does not fit (`shards_state`: torch's
    # FSDP2); megatron does not
    shards_state: bool = True
    # trainer.shard 'fsdp': FSDP2 at every dp > 1, not only where a replica does not fit one GPU (`trainer_layout`)
    shards_always: bool = False
    # what an FSDP2 rank holds unsharded besides its shards (`fsdp_gathered_bytes`); 0 where it does not shard
    gathered_bytes: float = 0.0
    # what a rank of a model split holds to publish (`export_bytes`: megatron's full fp32 weights); 0 for torch
    export_bytes: float = 0.0
    lora: bool = False  # the trained parameters are LoRA adapters (`grad_bytes` theirs): FSDP2 reduces once a step
    # the learner's padded-token budget a cut (batch.train_micro_batch_tokens; None: rows only), and the tokens
    # (prompt + output) of one optimizer step's rows it cuts and pads by (the plan's length quantiles; empty: every
    # row the mean, tokens / samples: nothing pads)
    micro_batch_tokens: int | None = None
    row_tokens: tuple[float, ...] = ()
    # a rank's activation memory (`rlctl.profiler.actmem`: the model and the learner's cuts); None: not priced
    activations: Activations | None = None

    def cuts_at(self, dp: int) -> StepCuts:
        """`step_cuts` at `dp` data-parallel ranks, counted once each (a plan's trainer curve prices hundreds of
        layouts on it)."""
        if dp not in self._cuts_by_dp:
            self._cuts_by_dp[dp] = self._count_cuts(dp)
        return self._cuts_by_dp[dp]

    @cached_property
    def _cuts_by_dp(self) -> dict[int, StepCuts]:
        return {}

    def _count_cuts(self, dp: int) -> StepCuts:
        step_samples = math.ceil(self.samples / self.mini_batches)
        share = self.micro_batch_samples  # a rank's rows a cut
        if self.micro_batch_tokens is not None and not self.row_tokens:
            # every row the mean: as many a rank as the budget pads, one at least
            share = max(1, min(share, int(self.micro_batch_tokens // (self.tokens / self.samples))))
        if not self.row_tokens:  # rows of one length: a cut's busiest rank holds ⌈rows / dp⌉ of its rows
            rows = min(share * dp, step_samples)
            return StepCuts(math.ceil(step_samples / rows), rows, (CutSize(rows, 1.0, math.ceil(rows / dp) / rows),))
        size, budget = self.micro_batch_samples, self.micro_batch_tokens
        real: dict[int, float] = {}
        busiest: dict[int, float] = {}
        cuts = cut_lengths(self.row_tokens, size, max_tokens=budget, ranks=dp)
        for c in cuts:
            lengths = [self.row_tokens[i] for i in c]  # (in length order)
            real[len(c)] = real.get(len(c), 0.0) + sum(lengths)
            busiest[len(c)] = busiest.get(len(c), 0.0) + busiest_padded(lengths, size, max_tokens=budget, ranks=dp)
        total = sum(real.values())
        sizes = tuple(CutSize(r, real[r] / total, busiest[r] / real[r]) for r in sorted(real))
        return StepCuts(len(cuts), max(real), sizes)


def workload_activation_bytes(w: ShardInputs, *, tp: int, pp: int, fsdp: bool) -> float:
    """A rank's peak activation memory at tp × pp, any dp (`fsdp`: FSDP2 shards it, no autocast weight copies):
    `Activations.rank_bytes` of the workload's (or the launch's `ShardRule`'s), 0 where it has none."""
    return 0.0 if w.activations is None else w.activations.rank_bytes(tp=tp, pp=pp, fsdp=fsdp)


def shards_state(backend: str, *, shard: str) -> bool:
    """Whether the trainer divides a rank's state over its dp ranks: the `torch` trainer's FSDP2 does (weights,
    gradients and AdamW state: `rlctl.trainers.fsdp`; trainer.shard 'auto' turns it on where a whole replica does
    not fit, `rlctl.planner.split.launch_layout`, so a rank fits sharded or not alike; 'none' never shards); the
    `megatron` trainer runs without megatron's distributed optimizer, so every dp rank holds its tp × pp shard's
    whole state."""
    return backend == "torch" and shard != "none"


def fsdp_gathered_bytes(arch: ModelArch, *, adapter_params: float) -> float:
    """What an FSDP2 rank holds whole during a step besides its shards (`rlctl.trainers.fsdp.shard` wraps every
    decoder layer and the root): the root's parameters (embeddings and lm_head, taken untied: an upper bound),
    gathered for the whole step, and the layer being computed, each in bf16 with its fp32 gradients before the
    reduce-scatter: 6 bytes a parameter. With LoRA (`adapter_params`, `traincost.lora_params`; 0 without) the
    policy's weights are frozen, gathered without gradients (2 bytes), and only the layer's adapters have them. PPO's
    critic gathers its root (embedding, final norm, value head: no lm_head, `rlctl.trainers.critic`) between the
    policy's backward and its next forward, the policy's resharded: the policy's, the larger, bounds the peak."""
    root = 2 * arch.vocab * arch.hidden
    layer = max(arch.params - root, 0.0) / max(arch.layers, 1)
    if adapter_params:
        return 2 * (min(root, arch.params) + layer) + 6 * adapter_params / max(arch.layers, 1)
    return 6 * (min(root, arch.params) + layer)


def export_bytes(arch: ModelArch, *, backend: str, cpu: bool) -> float:
    """What a trainer rank of a tp × pp split holds beyond its state to publish its policy (`held_export_bytes`): a
    `megatron` rank (`MegatronBackend.weights`) the model's full HF tensors in fp32, all-gathered over its tp and pp
    groups after each step and kept until the next gather (rank 0 checkpoints the version it published from them),
    and during a tp gather one tensor's tp parts (at most the largest's: the embedding's or lm_head's V·h, an MLP
    projection's i·h, the query projection's; at pp alone, which receives each tensor whole, an upper bound). 0 for
    `torch`: a whole replica publishes from its own parameters, an FSDP2 rank gathers one tensor at a time into host
    memory (`rlctl.trainers.fsdp.wire_weights`). Priced where megatron splits run, a `gpu: CPU` site (`cpu`); on a
    GPU a rank of a split stops at start (`rlctl.trainers.base.MEGATRON_GPU_SPLIT`): before it may run there, its
    gather must copy each full tensor to the host as it is made (as FSDP2's does), or be priced here too."""
    if backend != "megatron" or not cpu:
        return 0.0
    return 4.0 * (arch.params + max(arch.vocab, arch.intermediate, arch.heads * arch.head_dim) * arch.hidden)


def held_export_bytes(export: float, *, tp: int, pp: int) -> float:
    """`export_bytes` where a rank holds it: at a model split (tp × pp > 1); a whole replica's full tensors are its
    parameters."""
    return export if tp * pp > 1 else 0.0


def rank_bytes(
    entry: TrainingEntry,
    *,
    shards: int,
    gathered_bytes: float = 0.0,
    activation_bytes: float = 0.0,
    export_bytes: float = 0.0,
) -> float:
    """Memory of one trainer rank at this entry's (tp, pp): the one figure the planner prices a layout by and
    `rlctl check` (`rlctl.ops.preflight`) judges a placement by. Unsharded (`shards` 1): the weights and gradients
    of its shard and its whole optimizer state. Sharded over `shards` dp ranks (FSDP2, `shards_state`): all of
    that state divided, plus the rank's fixed working memory (`RANK_WORKING_BYTES`) and `gathered_bytes`
    (`fsdp_gathered_bytes`). Either way plus `activation_bytes`, what its cut's forward keeps for the backward
    (`rlctl.profiler.actmem`: it grows with the cut's tokens; `workload_activation_bytes`), and `export_bytes`, the
    full weights it gathers to publish (`held_export_bytes`)."""
    whole = entry.fixed_bytes_per_gpu + entry.sharded_bytes_per_gpu
    if shards <= 1:
        return whole + activation_bytes + export_bytes
    return RANK_WORKING_BYTES + (whole - RANK_WORKING_BYTES) / shards + gathered_bytes + activation_bytes + export_bytes


def rank_fits(
    entry: TrainingEntry,
    *,
    shards: int,
    hbm_bytes: float,
    gathered_bytes: float = 0.0,
    activation_bytes: float = 0.0,
    export_bytes: float = 0.0,
) -> bool:
    """One trainer rank (`rank_bytes`) fits the usable share of a GPU's `hbm_bytes`."""
    need = rank_bytes(
        entry,
        shards=shards,
        gathered_bytes=gathered_bytes,
        activation_bytes=activation_bytes,
        export_bytes=export_bytes,
    )
    return need <= TRAIN_MEM_FRACTION * hbm_bytes


def replica_fits(entry: TrainingEntry, *, hbm_bytes: float, activation_bytes: float = 0.0) -> bool:
    """A whole replica at this entry's (tp, pp) fits one GPU unsharded (dp = 1): its weights, gradients and
    optimizer state, and its cut's activations (`activation_bytes`, unsharded: `workload_activation_bytes` with
    fsdp False). The torch trainer shards with FSDP2 where it does not (`rlctl.ops.counts.plan_counts`)."""
    return rank_fits(entry, shards=1, hbm_bytes=hbm_bytes, activation_bytes=activation_bytes)


def holds_grad_sync(
    entry: TrainingEntry,
    *,
    dp: int,
    hbm_bytes: float,
    gathered_bytes: float,
    grad_bytes: float,
    lora: bool,
    activation_bytes: float = 0.0,
) -> bool:
    """Whether an FSDP2 rank holds gradient sync off in every backward of an optimizer step but its last, so that
    the step reduce-scatters its gradients once (`rlctl.trainers.base.DataParallel.reduce_per_step`): where the
    whole model's unsharded fp32 gradients (`grad_bytes`: each rank accumulates them meanwhile) fit beside its
    sharded state, gathered layers and activations (`rank_fits`), and always with LoRA (`lora`: the adapters' are
    small). Where they do not, FSDP2 reduce-scatters in every backward (`dp_reduced_bytes`). Decided with FSDP2
    itself at a layout by `trainer_layout`, `rlctl check` judging the rank's memory by it."""
    gathered = gathered_bytes + grad_bytes
    return lora or rank_fits(
        entry, shards=dp, hbm_bytes=hbm_bytes, gathered_bytes=gathered, activation_bytes=activation_bytes
    )


class ShardInputs(Protocol):
    """What decides a trainer layout's FSDP2 and its once-a-step reduction (`trainer_layout`): the planner's
    `TrainWorkload` and the launch's `rlctl.planner.split.shard_rule` hold the same fields, built from the job alike."""

    @property
    def shards_state(self) -> bool: ...
    @property
    def shards_always(self) -> bool: ...
    @property
    def gathered_bytes(self) -> float: ...
    @property
    def grad_bytes(self) -> float: ...
    @property
    def lora(self) -> bool: ...
    @property
    def activations(self) -> Activations | None: ...


@dataclass(frozen=True)
class ShardRule:
    """A job's `ShardInputs` without its workload (`rlctl.planner.split.shard_rule`): what the launch decides by."""

    shards_state: bool
    shards_always: bool
    gathered_bytes: float
    grad_bytes: float
    lora: bool
    activations: Activations | None = None  # a rank's cut's (`rlctl.profiler.actmem`); None: not priced
    export_bytes: float = 0.0  # (`export_bytes`: megatron's full weights, held at a model split)


def trainer_layout(rule: ShardInputs, entry: TrainingEntry, *, dp: int, hbm_bytes: float) -> Sharding:
    """The one decision of FSDP2 and its once-a-step reduction at `entry`'s tp × pp × `dp`, which the planner prices
    (`train_time_s`) and the launch runs (`rlctl.planner.split.launch_layout`), so the two cannot differ.

    FSDP2: where the trainer shards its state (`shards_state`: the `torch` trainer, not `trainer.shard: none`) at
    dp > 1 and no model split, always with `trainer.shard: fsdp` (`shards_always`), with `auto` where a whole
    replica does not fit one GPU (`replica_fits`). Once a step: where an FSDP2 rank holds the step's unsharded fp32
    gradients beside its shards (`holds_grad_sync`). Both count a rank's share of a cut's activations
    (`workload_activation_bytes`): unsharded, with autocast's bf16 weight copies; under FSDP2, without."""
    tp, pp = entry.tp, entry.pp
    fsdp = (
        rule.shards_state
        and dp > 1
        and tp * pp == 1
        and (
            rule.shards_always
            or not replica_fits(
                entry,
                hbm_bytes=hbm_bytes,
                activation_bytes=workload_activation_bytes(rule, tp=tp, pp=pp, fsdp=False),
            )
        )
    )
    held = fsdp and holds_grad_sync(
        entry,
        dp=dp,
        hbm_bytes=hbm_bytes,
        gathered_bytes=rule.gathered_bytes,
        grad_bytes=rule.grad_bytes,
        lora=rule.lora,
        activation_bytes=workload_activation_bytes(rule, tp=tp, pp=pp, fsdp=True),
    )
    return Sharding(fsdp, held)


def step_cuts(w: TrainWorkload, *, dp: int = 1) -> tuple[int, int]:
    """An optimizer step's cuts (one forward and backward each) and the rows of its largest (over its `dp`
    data-parallel ranks, each taking a run of its length order), as the learner cuts a step's rows at `dp`
    (`rlctl.rl.cuts.cut_lengths`): in length order, each rank's share `micro_batch_samples` rows at most, a cut fewer
    when a mini-batch holds fewer, and with `micro_batch_tokens` no more padded tokens (its rows × its longest row)
    than it. The budget was not priced until 2026-12-07: 1,024 rows of about 3,000 tokens in cuts of 32 rows and
    8,192 tokens were priced 32 cuts, which the learner makes 512 (2 rows a cut); and until the budgets became a
    rank's (2026-12-07) a cut held them whatever the dp: 604 cuts of 1,024 rows at a median of 3,262 tokens, 1 to 9
    rows each, at dp 8 as at dp 1."""
    cuts = w.cuts_at(dp)
    return cuts.number, cuts.rows


def dp_reduced_bytes(w: TrainWorkload, *, tp: int, pp: int, dp: int, fsdp: bool, per_step: bool = False) -> float:
    """The gradient bytes a data-parallel rank hands its collectives each optimizer step. Unsharded, its tp × pp
    shard's fp32 gradients, all-reduced once after the step's last backward (`rlctl.rl.gradsum.sum_gradients`: the
    torch trainer's and megatron's, which runs without megatron's DDP; its parameters are fp32). FSDP2 (`fsdp`,
    `trainer_layout`) reduce-scatters the gradients in its reduce dtype (fp32: `rlctl.trainers.fsdp.shard`): once a step
    where it holds gradient sync off but in the step's last backward (`per_step`, `trainer_layout`), else in every
    backward, so once a cut (`step_cuts`)."""
    if dp < 2:
        return 0.0
    if fsdp:
        return w.grad_bytes * (1 if per_step else step_cuts(w, dp=dp)[0])
    return w.grad_bytes / (tp * pp)


def ring_time_s(
    nbytes: float,
    *,
    ranks: int,
    node_bytes_per_s: float | None,
    rings_per_node: int = 1,
    all_reduce: bool = True,
    host_bytes_per_s: float = INTRA_NODE_BYTES_PER_S,
) -> float:
    """Seconds of a ring all-reduce of `nbytes` on each of `ranks` ranks (`all_reduce` False: a reduce-scatter or an
    all-gather, half its traffic), the ring ordered by host as NCCL orders it. Each hop carries 2 (n − 1)/n of the
    bytes, (n − 1)/n for the halves (nccl-tests' doc/PERFORMANCE.md: busbw = algbw · 2 (n − 1)/n, the bytes every
    link moves), and the slowest hop sets the time. Within a node a hop runs at `host_bytes_per_s`
    (`host_link_bytes_per_s`: NVLink's `INTRA_NODE_BYTES_PER_S`, gloo's loopback on a CPU site); where the
    ranks span hosts (`node_bytes_per_s` not None: the inventory's `network.bandwidth_gbps`, a node's NICs) one hop a
    host boundary and direction goes over the network, NCCL's channels spreading it over all the node's NICs, which
    the `rings_per_node` rings crossing at once share (a tp group's ranks each ring their own dp group). A GPU's
    1/gpus_per_node of the NICs, every hop's traffic charged to it, was priced until 2026-12-07: 8 × the time of a
    ring over 8-GPU nodes."""
    if ranks < 2:
        return 0.0
    hop_bytes = (2 if all_reduce else 1) * (ranks - 1) / ranks * nbytes
    bytes_per_s = host_bytes_per_s
    if node_bytes_per_s is not None:
        bytes_per_s = min(bytes_per_s, node_bytes_per_s / rings_per_node)
    return hop_bytes / bytes_per_s


def train_compute_s(entry: TrainingEntry, dp: int, w: TrainWorkload) -> float:
    """An iteration's forward and backward passes on tp·pp·dp GPUs, the pipeline bubble of every learner cut with
    them: `train_time_s` without its reduction and optimizer steps (what `bench.jobsim` replays a run's step with).

    A cut's rows (`step_cuts` at dp): micro_batch_samples a rank, fewer when a mini-batch holds fewer or the token
    budget pads fewer long rows; each data-parallel rank takes a run of its length order (rl.cuts.share_rows) and
    computes it padded to its longest row (rows × longest), and the cut lasts as long as its busiest rank's share
    (`CutSize.busiest`, `rl.cuts.busiest_padded`): the step's tokens × that per token × the seconds per token
    (`gpu_s_per_token`: the probe's per padded token, `rlctl.profiler.measure_train`; the roofline's FLOPs a token,
    which a padded one costs too) over the tp·pp GPUs of a rank. Ranks beyond a cut's rows take none (FSDP2's run a
    row of weight 0) and shorten nothing. Until 2026-12-08 a cut's real tokens were priced, split evenly over
    min(dp, rows) ranks: the demo job's training 13–16 % short at dp 2 (its busiest rank computed 1.46–1.49 × its
    real tokens with every dp-th row, docs/planning.md), the probe's figure per real token hiding the padding at dp 1
    alone. A measured entry of then (`TrainingEntry.per` real_token: its figure holds its probe's padding) is priced
    so still, its cut's real tokens over min(dp, rows) ranks, versus its padding priced twice (about 1.1 × long)."""
    compute = 0.0
    for cut in w.cuts_at(dp).sizes:
        chunks = pipeline_chunks(math.ceil(cut.rows / dp), entry.pp)
        bubble = 0.0 if entry.pipeline_wait_included else (entry.pp - 1) / chunks
        per_gpu = entry.gpu_s_per_token * w.pass_scale / (entry.tp * entry.pp)
        busiest = cut.busiest if entry.per == "padded_token" else 1 / min(dp, cut.rows)
        compute += w.tokens * cut.share * busiest * per_gpu * (1 + bubble)
    return compute


def grad_sync_s(
    entry: TrainingEntry,
    dp: int,
    w: TrainWorkload,
    *,
    layout: Sharding,
    node_bytes_per_s: float | None,
    host_bytes_per_s: float = INTRA_NODE_BYTES_PER_S,
) -> float:
    """One optimizer step's gradient reduction over `dp` ranks at `layout` (`trainer_layout`: FSDP2 reduce-scatters,
    once a cut or, held, once a step; unsharded ranks all-reduce once a step: `dp_reduced_bytes`), `node_bytes_per_s`
    the NICs of a node where the ranks span hosts (None: one host), `host_bytes_per_s` a hop within a host
    (`host_link_bytes_per_s` of the site's GPU). Every tp rank of a host's tp groups rings its own dp group through
    the host's NICs (tp groups sit on one host)."""
    if dp < 2:
        return 0.0
    fsdp, held = layout
    reduced = dp_reduced_bytes(w, tp=entry.tp, pp=entry.pp, dp=dp, fsdp=fsdp, per_step=held)
    return ring_time_s(
        reduced,
        ranks=dp,
        node_bytes_per_s=node_bytes_per_s,
        rings_per_node=entry.tp,
        all_reduce=not fsdp,
        host_bytes_per_s=host_bytes_per_s,
    )


def train_time_s(
    entry: TrainingEntry,
    dp: int,
    w: TrainWorkload,
    *,
    site: SiteProfile,
    node_bytes_per_s: float,
    hosts: int | None = None,
) -> float:
    """One iteration on tp·pp·dp GPUs: compute with the pipeline bubble of every learner cut (`train_compute_s`),
    plus a DP gradient reduction (`grad_sync_s` at the layout `trainer_layout` decides; within a host at the site's
    link, `host_link_bytes_per_s`: a CPU site's ranks over gloo, priced as NVLink's until 2026-12-07) and the
    optimizer's bookkeeping per optimizer step.

    The bubble is the schedule the megatron backend runs (rlctl.trainers.megatron.pipeline): GPipe within
    each cut, whose rows on a data-parallel rank go through the pp stages in m = `pipeline_chunks` chunks,
    and every cut drains the pipeline, so each stage idles pp − 1 of m + pp − 1 chunk-steps: compute ×
    (1 + (pp − 1)/m), however many cuts a mini-batch holds (no 1F1B across them). None on an entry measured
    over the split's ranks (`pipeline_wait_included`): its figure holds the stages' waiting already. `hosts`: the
    hosts the ranks span (`rlctl.config.hostfill.trainer_slots`); default as many as fill hosts of gpus_per_node.
    Infinite where a rank does not fit a GPU (`rank_fits`: its state divided over dp only where `w.shards_state`;
    its cut's activations, `workload_activation_bytes`).
    """
    gpus = entry.tp * entry.pp * dp
    shards = dp if w.shards_state else 1
    tp, pp = entry.tp, entry.pp
    acts = workload_activation_bytes(w, tp=tp, pp=pp, fsdp=shards > 1)
    if not rank_fits(
        entry,
        shards=shards,
        hbm_bytes=site.hbm_bytes,
        gathered_bytes=w.gathered_bytes,
        activation_bytes=acts,
        export_bytes=held_export_bytes(w.export_bytes, tp=tp, pp=pp),
    ):
        return math.inf
    sync = 0.0
    if dp > 1:
        layout = trainer_layout(w, entry, dp=dp, hbm_bytes=site.hbm_bytes)
        across = hosts > 1 if hosts is not None else gpus > site.gpus_per_node
        sync = grad_sync_s(
            entry,
            dp,
            w,
            layout=layout,
            node_bytes_per_s=node_bytes_per_s if across else None,
            host_bytes_per_s=host_link_bytes_per_s(site.gpu),
        )
    return train_compute_s(entry, dp, w) + w.optimizer_steps * (sync + TRAIN_STEP_OVERHEAD_S)


def train_curve(
    site: SiteProfile,
    w: TrainWorkload,
    max_gpus: int,
    *,
    node_bytes_per_s: float,
    split: tuple[int, int] | None = None,
    host_gpus: Sequence[int] | None = None,
    ranks: int | None = None,
    slurm: bool = False,
    order_tp: int = 1,
) -> tuple[np.ndarray, list[TrainConfig | None]]:
    """P_train(y) for y = 0..max_gpus GPU slots of the site: the best (tp, pp, dp) whose ranks, placed on
    `host_gpus` (inventory order; default hosts of gpus_per_node) with every tp group on one host, take at most y
    slots (`hostfill.trainer_slots`: = tp·pp·dp unless a host's leftover below tp is passed over; leftover GPUs
    idle); a split whose groups do not fit the hosts is left out. Exactly `ranks` ranks when the job fixes the
    trainer's count (the launch starts that many); only (tp, pp) = `split` when the job fixes it
    (trainer.tensor_parallel / pipeline_parallel). `slurm`: SLURM places the ranks, as many on each node
    (`hostfill.slurm_layout`): a split with no such layout on the site's nodes is left out. `order_tp`: the tp whose
    passed-over hosts are the rollout's on a shared site (`hostfill.trainer_slots`)."""
    if host_gpus is None:
        host_gpus = [site.gpus_per_node] * -(-max_gpus // site.gpus_per_node)
    best = np.full(max_gpus + 1, math.inf)
    cfg: list[TrainConfig | None] = [None] * (max_gpus + 1)
    for e in site.training:
        if split is not None and (e.tp, e.pp) != split:
            continue
        unit = e.tp * e.pp
        for dp in range(1, max_gpus // unit + 1):
            if ranks is not None and unit * dp != ranks:
                continue
            placed = trainer_slots(host_gpus, unit * dp, tp=e.tp, slurm=slurm, order_tp=order_tp)
            if placed is None or placed[0] > max_gpus:
                continue
            y, hosts = placed
            t = train_time_s(e, dp, w, site=site, node_bytes_per_s=node_bytes_per_s, hosts=hosts)
            if t < best[y]:
                layout = trainer_layout(w, e, dp=dp, hbm_bytes=site.hbm_bytes)  # as `train_time_s` priced it
                best[y], cfg[y] = t, TrainConfig(e.tp, e.pp, dp, layout)
    # a larger budget may leave GPUs idle: carry the best smaller config forward
    for y in range(1, max_gpus + 1):
        if best[y - 1] <= best[y]:
            best[y], cfg[y] = best[y - 1], cfg[y - 1]
    return best, cfg
