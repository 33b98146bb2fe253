"""The training cost model per RL algorithm: which model passes one iteration runs per trained token.

A forward of a model of P parameters costs 2·P FLOPs per token (matmuls; attention is left out), its
backward 4·P: an update (forward + backward) is 6·P, 8·P with activation recomputation (the forward
runs again before the backward). Counted in *forward units* (one forward of the policy, 2·P):

    GRPO  policy update                      (3 + recompute) · epochs
          + reference forward                 1   when the job has a KL term (kl_coef > 0)
          + old log-prob forward              1   if the trainer re-scores samples (rlctl: no)
    PPO   policy update                       (3 + recompute) · epochs
          + critic update                     (3 + recompute) · epochs · C/P
          + critic values forward (for GAE)   C/P
          + reference / old log-prob forwards as for GRPO

C: the parameters the critic computes a token with (`critic_flop_params`): the policy's without its lm_head's matmul
(V·h; rlctl's critic is the policy's trunk and a value head, `rlctl.trainers.critic`), where until 2026-12-07 C = P
(StreamRL §7's critic of the policy's size). E.g. rlctl's GRPO: 3 units (6·P), with KL 4 (8·P); rlctl's PPO with KL:
4 + 4·C/P (Qwen2.5-7B: 7.71, 15.4·P, versus 8); verl-style PPO with KL, old log-probs and recomputation:
2 + 4 + 5·C/P.

With LoRA (`trainer.lora`: A adapter parameters, the policy's weights frozen) the backward computes no weight
gradient of the policy's: an update is the forward (2·P + 2·A), the activations' gradients (2·P + 2·A) and the
adapters' weight gradients (2·A), 2 + 3·A/P units rather than 3 (≈ 2/3 of a full update's FLOPs; a recomputed
forward adds 1 + A/P). The reference and old log-prob forwards are as above. A MoE's P and A are those a token
computes with (its top-k experts' and their adapters': `lora_params(active=True)`); memory holds every adapter.

What rlctl's trainer does (the defaults, `TrainingPasses()`): one epoch, one optimizer step per
iteration (gradients accumulate over micro-batches), no recomputation, the engine's log-probs as the
behaviour policy; GRPO trains micro-batches as groups stream in, PPO trains at the step (GAE and the
whitened advantages need the whole batch). Epochs, mini-batches, recomputation and an old log-prob
pass are planner/profile parameters for trainers that run them; the job cannot ask for them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt

from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.base import Strict
from rlctl.config.runtime import TARGETS, Lora
from rlctl.models.catalog import ModelArch

AlgorithmKind = Literal["grpo", "ppo"]
TRAINED_MODELS: dict[str, int] = {"grpo": 1, "ppo": 2}  # models with gradients and optimizer state
UPDATE_UNITS = 3  # forward + backward = 3 forwards
LORA_UPDATE_UNITS = 2  # forward + the activations' gradients, before the adapters' share (`update_units`)
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")  # (a MoE's: in each expert)


class TrainingPasses(Strict):
    """What one iteration's training runs beyond the algorithm's own models (see the module docstring)."""

    reference: bool = False  # a reference forward: the job's algorithm has kl_coef > 0
    old_logprobs: bool = False  # the policy re-scores the samples before updating (rlctl: the engine's)
    epochs: PositiveInt = 1  # passes of the update over the batch per iteration
    mini_batches: PositiveInt = 1  # optimizer steps per epoch
    recompute: bool = False  # activation recomputation: one more forward per update
    # LoRA (`trainer.lora`): the adapters' parameters, the only ones with gradients and optimizer state (the policy's
    # weights frozen); 0: the whole policy is trained. Not written (`exclude`): a profile's come from its `lora`
    adapter_params: NonNegativeFloat = Field(0.0, exclude=True)
    # of them, those one token computes with, where fewer (a MoE's: its top-k experts' adapters); FLOPs are priced by
    # it, memory by adapter_params. None: all of them
    adapter_active_params: NonNegativeFloat | None = Field(None, exclude=True)

    @property
    def optimizer_steps(self) -> int:
        return self.epochs * self.mini_batches

    @property
    def active_adapters(self) -> float:
        """The adapter parameters a token's FLOPs are of (`adapter_active_params`, else `adapter_params`)."""
        return self.adapter_params if self.adapter_active_params is None else self.adapter_active_params


def passes_for(algorithm: GrpoAlgorithm | PpoAlgorithm, trainer: TrainingPasses | None = None) -> TrainingPasses:
    """The passes of a job's algorithm on `trainer` (default: rlctl's trainer), training the whole policy; the job
    sets `reference` (LoRA's adapters: `lora_passes`)."""
    return (trainer or TrainingPasses()).model_copy(update={"reference": algorithm.kl_coef > 0, "adapter_params": 0.0})


def lora_passes(
    algorithm: GrpoAlgorithm | PpoAlgorithm,
    *,
    arch: ModelArch,
    lora: Lora | None,
    trainer: TrainingPasses | None = None,
) -> TrainingPasses:
    """`passes_for` a job training `lora`'s adapters on `arch` (None: the whole policy) on `trainer`."""
    return passes_for(algorithm, trainer).model_copy(update=lora_adapters(arch, lora))


def lora_adapters(arch: ModelArch, lora: Lora | None) -> dict[str, float | None]:
    """`TrainingPasses`' adapters of `lora` on `arch`: every one held (`adapter_params`), those a token runs priced
    (`adapter_active_params`: a MoE's top-k experts'; None where a token runs them all, as before it was kept)."""
    held, active = lora_params(arch, lora), lora_params(arch, lora, active=True)
    return {"adapter_params": held, "adapter_active_params": active if active != held else None}


def lora_params(arch: ModelArch, lora: Lora | None, *, active: bool = False) -> float:
    """The parameters of `lora`'s adapters on `arch` (0 without LoRA): rank × (in + out) of each target projection
    (A is [rank, in], B [out, rank]) of every layer, as `rlctl.models.lora.add_adapters` puts them on TinyGPT. A MoE's
    sparse layer has gate/up/down in each of its `experts` (of `expert_intermediate`) and in a shared expert, each
    adapted, its routers never (`gate`, `shared_expert_gate`); its dense layers' of `intermediate`. `active`: those
    one token computes with, its `experts_per_token` experts' (and the shared expert's)."""
    if lora is None:
        return 0.0
    q, kv, h = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim, arch.hidden

    def adapters(sides: dict[str, int]) -> int:  # the targets' among projections of (in + out) `sides`
        return lora.rank * sum(n for t, n in sides.items() if t in lora.targets)

    def mlp(width: int) -> int:  # a SwiGLU MLP's of `width` (0: none)
        return adapters({"gate_proj": h + width, "up_proj": h + width, "down_proj": width + h}) if width else 0

    attention = adapters({"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h})
    if not arch.expert_intermediate:  # a dense model
        return float(arch.layers * (attention + mlp(arch.intermediate)))
    experts = arch.experts_per_token if active else arch.experts
    sparse = experts * mlp(arch.expert_intermediate) + mlp(arch.shared_expert_intermediate)
    dense = mlp(arch.intermediate)
    return float(arch.layers * attention + arch.dense_layers * dense + (arch.layers - arch.dense_layers) * sparse)


def lora_refusal(arch: ModelArch, lora: Lora | None) -> str | None:
    """Why `lora_params` cannot count `lora`'s adapters on `arch`: its gate/up/down on a MoE known by its active
    parameters alone (a `kind: arch` model without its experts' shape), each expert's adapters of a width not given;
    None where it can (a dense model, a MoE's shape known, attention targets alone)."""
    mlp = [t for t in lora.targets if t in MLP_TARGETS] if lora is not None else []
    if not mlp or arch.expert_intermediate or arch.active >= arch.params:
        return None
    attention = ", ".join(t for t in TARGETS if t not in MLP_TARGETS)
    return (
        f"{', '.join(mlp)} of MoE {arch.name!r}, described by active_params alone, are adapted in each of its experts, "
        f"whose width it does not give; valid for it: {attention}, or describe its experts (model.experts, "
        "experts_per_token, expert_intermediate)"
    )


def trained_models(algorithm: str) -> int:
    return TRAINED_MODELS[algorithm]


def critic_params(arch: ModelArch) -> float:
    """PPO's critic's parameters (`rlctl.rl.ppo.ValueModel`): the policy's trunk without its lm_head (the torch
    trainer's `rlctl.trainers.critic`, megatron's `MegatronTrunk`) and a value head of hidden + 1. Tied, the lm_head
    is the embedding, which the trunk keeps (`params` counts it once): the policy's count. Until 2026-12-07 priced as
    the policy's whatever the tie: an untied model's V·h more (Qwen2.5-7B: 545 M, 16 B each as trained)."""
    head = 0.0 if arch.tied else arch.vocab * arch.hidden
    return max(arch.params - head, 0.0) + arch.hidden + 1


def critic_flop_params(arch: ModelArch) -> float:
    """The parameters PPO's critic computes a token with (a forward's FLOPs: 2 each): the policy's (`active`) less its
    lm_head's matmul, V·h, and the value head's hidden + 1. Tied too: `params` counts a tied V·h once, for the head's
    matmul (the embedding's lookup is none), and the critic runs no head (versus `critic_params`, its memory, which
    keeps a tied model's embedding)."""
    return max(arch.active - arch.vocab * arch.hidden, 0.0) + arch.hidden + 1


def trained_params(arch: ModelArch, algorithm: str) -> float:
    """The parameters with gradients and AdamW state (a full fine-tune's): the policy's, and PPO's critic's
    (`critic_params`)."""
    return arch.params + (trained_models(algorithm) - 1) * critic_params(arch)


def grad_bytes(arch: ModelArch, algorithm: str, *, adapter_params: float) -> float:
    """A trainer's gradients, fp32 as every backend holds and reduces them: the trained models' (`trained_params`), or
    with LoRA (`adapter_params` > 0) the adapters' alone (the frozen policy's have none). What the plan prices the DP
    reduction on (`plan.train_workload`), decides FSDP2's once-a-step reduction by (`split.trainer_sharding`) and
    `rlctl check` holds in memory (`preflight.memory`)."""
    return 4 * (adapter_params or trained_params(arch, algorithm))


def update_units(passes: TrainingPasses, *, params: float) -> float:
    """Forward units of one update of one trained model of `params` parameters (see the module docstring): 3 (+ 1
    recomputed forward), or with LoRA (`passes.adapter_params`) 2 + 3·A/P (+ 1 + A/P)."""
    if not passes.adapter_params:
        return float(UPDATE_UNITS + passes.recompute)
    a = passes.active_adapters / params
    return (LORA_UPDATE_UNITS + passes.recompute) * (1 + a) + a


def forward_units(algorithm: str, passes: TrainingPasses, *, params: float, critic: float | None = None) -> float:
    """Forward passes of the policy's size per trained token in one iteration (FLOPs = 2·P·units): PPO's critic's
    passes scaled by `critic` / `params` (`critic` its `critic_flop_params`; given for PPO), a critic trained whole
    (no adapters) whatever the policy's."""
    update = update_units(passes, params=params) * passes.epochs
    forwards = float(passes.reference + passes.old_logprobs)
    if algorithm == "ppo":
        assert critic is not None, "PPO's FLOPs need its critic's parameters (critic_flop_params)"
        # its update and its values forward for GAE
        update += (UPDATE_UNITS + passes.recompute) * passes.epochs * critic / params
        forwards += critic / params
    return float(update + forwards)


# a decoder layer's all-reduces of a token's activations under Megatron-style tensor parallelism (no sequence
# parallel): a forward's 2 (the attention's and the MLP's row-parallel outputs), a backward's 2 more (their
# column-parallel inputs' gradients)
TP_ALLREDUCES_FORWARD = 2
TP_ALLREDUCES_UPDATE = 4


def tp_allreduces(algorithm: str, passes: TrainingPasses) -> float:
    """A layer's tensor-parallel all-reduces per trained token in one iteration (each of the token's activations,
    hidden wide): an update's 4 (+ 2 for a recomputed forward), a forward's 2. PPO's critic's update and values
    forward as the policy's: its layers are the policy's, of the same width and number, and what it lacks, the
    lm_head, is a matmul, not an all-reduce (versus its FLOPs' C/P, `critic_flop_params`). With LoRA an update
    all-reduces the activations' gradients as a full one does (the weights' gradients need none)."""
    update = (TP_ALLREDUCES_UPDATE + TP_ALLREDUCES_FORWARD * passes.recompute) * passes.epochs
    forwards = TP_ALLREDUCES_FORWARD * (passes.reference + passes.old_logprobs)
    if algorithm == "ppo":  # its critic's update and its values forward for GAE
        update *= 2
        forwards += TP_ALLREDUCES_FORWARD
    return float(update + forwards)


def flops_per_token(algorithm: str, passes: TrainingPasses, params: float, *, critic: float | None = None) -> float:
    return 2.0 * params * forward_units(algorithm, passes, params=params, critic=critic)


def streamed_units(algorithm: str, passes: TrainingPasses, *, params: float) -> float:
    """The forward units rlctl's learner runs as samples stream in (before the whole batch is there):
    GRPO's first epoch (reference forward and policy update per micro-batch); nothing for PPO."""
    if algorithm == "ppo":
        return 0.0
    return float(passes.reference + passes.old_logprobs + update_units(passes, params=params))
