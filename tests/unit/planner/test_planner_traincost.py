"""The training cost model per algorithm: hand-computed FLOPs, the analytical entries, and how the
planner and the simulator use it (profile scaling, streamed vs at-step work, optimizer steps)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlctl.config import load_job
from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
from rlctl.config.job import Job
from rlctl.errors import ConfigError
from rlctl.hardware import CATALOG
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.planner.costs import (
    CPU_HOST_BYTES_PER_S,
    INTRA_NODE_BYTES_PER_S,
    TRAIN_MEM_FRACTION,
    TRAIN_STEP_OVERHEAD_S,
    TrainWorkload,
    dp_reduced_bytes,
    fsdp_gathered_bytes,
    holds_grad_sync,
    rank_bytes,
    ring_time_s,
    shards_state,
    step_cuts,
    train_curve,
    train_time_s,
)
from rlctl.planner.inputs import PlanOptions, profile_for, train_cost
from rlctl.planner.plan import make_plan
from rlctl.planner.simjob import IterationWork, simulate_job
from rlctl.profiler.analytical import ETA_LINK, ETA_TRAIN, analytical_profile, training_entries, training_entry
from rlctl.profiler.traincost import (
    TrainingPasses,
    critic_flop_params,
    flops_per_token,
    forward_units,
    passes_for,
    streamed_units,
    tp_allreduces,
)
from rlctl.rl.cuts import pipeline_chunks

P7 = 7.62e9  # qwen2.5-7b parameters
# its PPO critic's per token (`critic_flop_params`): the trunk without the lm_head's matmul (152,064 × 3,584), and a
# value head of hidden + 1
C7 = P7 - 152064 * 3584 + 3584 + 1
RUNTIME = TrainingPasses()  # rlctl's trainer: 1 epoch, 1 optimizer step, no recompute, engine log-probs


@pytest.mark.parametrize(
    ("algorithm", "passes", "flops"),
    [
        ("grpo", RUNTIME, 6 * P7),  # policy fwd 2P + bwd 4P
        ("grpo", TrainingPasses(reference=True), 8 * P7),  # + reference fwd 2P
        ("ppo", RUNTIME, 6 * P7 + 8 * C7),  # policy 6P + critic 6C + critic values 2C
        ("ppo", TrainingPasses(reference=True), 8 * P7 + 8 * C7),  # + reference 2P
        # verl-style PPO: + old log-probs 2P, recomputation re-runs each update's forward (+2P, +2C)
        ("ppo", TrainingPasses(reference=True, old_logprobs=True, recompute=True), 12 * P7 + 10 * C7),
        # two epochs: both updates twice (2 × 6P, 2 × 6C), the forwards once (ref 2P + values 2C)
        ("ppo", TrainingPasses(reference=True, epochs=2), 14 * P7 + 14 * C7),
        ("grpo", TrainingPasses(epochs=4, mini_batches=8), 24 * P7),  # mini-batches do not add FLOPs
    ],
)
def test_flops_per_token_by_hand(algorithm: str, passes: TrainingPasses, flops: float) -> None:
    """PPO's critic priced by the parameters it computes with (versus 6·P an update and 2·P its values forward, the
    policy's lm_head matmul included, until 2026-12-07: Qwen2.5-7B's PPO with KL 16·P, now 15.43·P)."""
    assert critic_flop_params(BUILTIN_MODELS["qwen2.5-7b"]) == pytest.approx(C7)
    assert flops_per_token(algorithm, passes, P7, critic=C7) == pytest.approx(flops)


@pytest.mark.parametrize(
    ("algorithm", "passes", "allreduces", "before"),
    [
        ("grpo", RUNTIME, 4, 4),  # the policy's update: its forward's 2 and its backward's 2
        ("grpo", TrainingPasses(reference=True), 6, 4 * 8 / 6),  # + the reference forward's 2
        ("ppo", RUNTIME, 10, 4 * (6 * P7 + 8 * C7) / (6 * P7)),  # + the critic's update 4 and values forward 2
        ("ppo", TrainingPasses(reference=True), 12, 4 * (8 * P7 + 8 * C7) / (6 * P7)),
        # recomputation re-runs each update's forward (+2 each), two epochs run both updates twice
        ("ppo", TrainingPasses(recompute=True, epochs=2), 26, 4 * (16 * P7 + 18 * C7) / (6 * P7)),
    ],
)
def test_tensor_parallel_all_reduces_are_each_passs_layers_the_critics_as_the_policys(
    algorithm: str, passes: TrainingPasses, allreduces: float, before: float
) -> None:
    """At tp 2 each pass adds a layer's all-reduces of a token's activations (hidden wide, bf16): an update 4, a
    forward 2. PPO's critic's are the policy's: its layers are the policy's, and what it lacks, the lm_head, is a
    matmul, not an all-reduce; versus every pass's priced as a share of the policy's update by its FLOPs (`before`:
    4 × units / 3, the critic's scaled by C/P ≈ 0.93 for Qwen2.5-7B, a forward 1/3 of an update)."""
    m, g = BUILTIN_MODELS["qwen2.5-7b"], CATALOG["H800"]
    assert tp_allreduces(algorithm, passes) == allreduces
    one = training_entry(m, g, tp=1, pp=1, algorithm=algorithm, passes=passes).gpu_s_per_token
    two = training_entry(m, g, tp=2, pp=1, algorithm=algorithm, passes=passes).gpu_s_per_token
    hop = m.layers * (2 * 1 / 2 * m.hidden * 2) / (ETA_LINK * g.nvlink_gb_per_s * 1e9)  # one all-reduce of each layer
    assert (two - one) / 2 == pytest.approx(allreduces * hop)  # tp × (compute / tp + comm): comm a GPU's
    assert before <= allreduces  # (the old price never more)


def test_the_job_sets_the_reference_forward_and_the_trainer_the_rest() -> None:
    assert passes_for(GrpoAlgorithm(kind="grpo")) == TrainingPasses(reference=False)
    assert passes_for(PpoAlgorithm(kind="ppo", kl_coef=0.001)) == TrainingPasses(reference=True)
    verl = TrainingPasses(reference=False, old_logprobs=True, epochs=2, mini_batches=4)
    got = passes_for(PpoAlgorithm(kind="ppo", kl_coef=0.01), verl)
    assert got.reference and got.old_logprobs and got.optimizer_steps == 8


def test_what_streams_in_rlctls_learners() -> None:
    # GRPO: reference forward + the first epoch's update per micro-batch; later epochs need the batch
    p = TrainingPasses(reference=True, epochs=2)
    assert (streamed_units("grpo", p, params=P7), forward_units("grpo", p, params=P7)) == (4.0, 7.0)
    assert streamed_units("ppo", TrainingPasses(reference=True), params=P7) == 0.0  # GAE whitening: all at the step


def test_analytical_entry_is_flops_over_mfu_and_memory_counts_the_models() -> None:
    m, g = BUILTIN_MODELS["qwen2.5-7b"], CATALOG["H800"]
    grpo = {(e.tp, e.pp): e for e in training_entries(m, g, gpus_per_node=8, algorithm="grpo")}
    ppo = {
        (e.tp, e.pp): e
        for e in training_entries(m, g, gpus_per_node=8, algorithm="ppo", passes=TrainingPasses(reference=True))
    }
    assert grpo[1, 1].gpu_s_per_token == pytest.approx(6 * P7 / (ETA_TRAIN * g.flops))
    assert ppo[1, 1].gpu_s_per_token == pytest.approx((8 * P7 + 8 * C7) / (ETA_TRAIN * g.flops))
    # at tp 2 the compute halves on each of two GPUs, and each all-reduce of a layer is added (`tp_allreduces`): PPO's
    # with KL 12 a layer, GRPO's 4 (see the test below)
    hop = m.layers * (2 * 1 / 2 * m.hidden * 2) / (ETA_LINK * g.nvlink_gb_per_s * 1e9)
    assert ppo[2, 1].gpu_s_per_token == pytest.approx(ppo[1, 1].gpu_s_per_token + 2 * 12 * hop)
    assert grpo[2, 1].gpu_s_per_token == pytest.approx(grpo[1, 1].gpu_s_per_token + 2 * 4 * hop)
    # bf16 weights + grads of policy and critic (4 B each) + the reference as the trainer holds it (fp32, 4 B) + 2 GB;
    # Adam 12 B per trained model. The critic: the policy's trunk without its lm_head (untied: 152,064 × 3,584 fewer,
    # versus priced as the policy until 2026-12-07) and a value head of hidden + 1
    critic = C7  # (its memory as its FLOPs: untied, the embedding is held and counted in both)
    assert not m.tied and (m.vocab, m.hidden) == (152064, 3584)
    assert ppo[1, 1].fixed_bytes_per_gpu == pytest.approx((P7 + critic) * 4 + P7 * 4 + 2e9)
    assert ppo[1, 1].sharded_bytes_per_gpu == pytest.approx((P7 + critic) * 12)
    assert grpo[1, 1].fixed_bytes_per_gpu == pytest.approx(P7 * 4 + 2e9)  # no KL: no reference weights


def test_optimizer_steps_and_scale_enter_the_trainer_time() -> None:
    prof = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)})
    site = prof.sites["h"]
    e = next(x for x in site.training if (x.tp, x.pp) == (1, 1))
    one = TrainWorkload(1e6, 512, 32, P7 * 2)
    t1 = train_time_s(e, 4, one, site=site, node_bytes_per_s=25e9)
    t_scaled = train_time_s(e, 4, TrainWorkload(1e6, 512, 32, P7 * 2, pass_scale=2.0), site=site, node_bytes_per_s=25e9)
    steps = TrainWorkload(1e6, 512, 32, P7 * 2, mini_batches=4, optimizer_steps=4)
    t_steps = train_time_s(e, 4, steps, site=site, node_bytes_per_s=25e9)
    compute = 1e6 * e.gpu_s_per_token / 4
    assert t_scaled - t1 == pytest.approx(compute)
    # a tp 1 replica does not fit an H800: FSDP2 shards it over 4 ranks, beside which the step's unsharded gradients
    # fit (`holds_grad_sync`): it reduce-scatters them once an optimizer step, so each step adds its sync too
    assert t_steps - t1 == pytest.approx(3 * (t1 - compute))  # pp = 1: no bubble to grow
    # a whole tp 2 replica (megatron's) all-reduces its gradients once an optimizer step
    tp2 = next(x for x in site.training if (x.tp, x.pp) == (2, 1))
    whole, whole_steps = (dataclasses.replace(w, shards_state=False) for w in (one, steps))
    t1 = train_time_s(tp2, 4, whole, site=site, node_bytes_per_s=25e9)
    sync_and_step = t1 - 1e6 * tp2.gpu_s_per_token / 8
    assert train_time_s(tp2, 4, whole_steps, site=site, node_bytes_per_s=25e9) - t1 == pytest.approx(3 * sync_and_step)


def test_the_data_parallel_reduction_is_priced_at_the_bytes_each_backend_reduces() -> None:
    """Every backend sums fp32 gradients, 4 B a parameter (test_dp_grad_bytes.py counts them in a gloo step), where
    the planner priced bf16's 2: a whole replica (megatron's tp 2 split, the torch trainer unsharded) all-reduces them
    once an optimizer step; FSDP2 reduce-scatters them once a step where the step's unsharded fp32 gradients fit
    beside a rank's shards (`holds_grad_sync`), else in every backward: 1,024 samples in 2 cuts at dp 16 (32 rows a
    rank; 32 cuts before the budgets were a rank's, 2026-12-07). 16 H800s over
    2 nodes of 50 GB/s: a ring's network hop at a node's 50 GB/s, shared by the tp ranks' rings (`ring_time_s`)."""
    node_bw = 50e9

    def sync_s(model: str, tp: int, dp: int, w: TrainWorkload) -> float:
        """The seconds `w`'s gradients add to a step of `model` at tp × dp H800s."""
        site = analytical_profile(BUILTIN_MODELS[model], {"h": (CATALOG["H800"], 8, 2.85)}).sites["h"]
        e = next(x for x in site.training if (x.tp, x.pp) == (tp, 1))
        none = dataclasses.replace(w, grad_bytes=0.0)
        t, t_none = (train_time_s(e, dp, x, site=site, node_bytes_per_s=50e9) for x in (w, none))
        return t - t_none

    w = TrainWorkload(1e6, 1024, 32, 4 * P7)
    assert step_cuts(w) == (32, 32)
    assert step_cuts(w, dp=16) == (2, 512)
    assert dp_reduced_bytes(w, tp=1, pp=1, dp=16, fsdp=True) == 2 * 4 * P7
    assert dp_reduced_bytes(w, tp=1, pp=1, dp=16, fsdp=True, per_step=True) == 4 * P7
    # a 7B's 30 GB of gradients fit beside its shards over 16 H800s: once a step, 0.57 s (18.3 s a cut)
    assert sync_s("qwen2.5-7b", 1, 16, w) == pytest.approx(15 / 16 * 4 * P7 / node_bw)
    # a 32B's 131 GB do not (its shards alone fit: 47 GB a rank): a reduce-scatter a cut
    p32 = BUILTIN_MODELS["qwen2.5-32b"].params
    big = TrainWorkload(1e6, 1024, 32, 4 * p32)
    assert sync_s("qwen2.5-32b", 1, 16, big) == pytest.approx(2 * 15 / 16 * 4 * p32 / node_bw)
    # the rule: a rank's memory with the step's gradients (`rank_fits`); with LoRA always (the trainer holds the
    # adapters' gradients whatever the plan: `TorchBackend`)
    site = analytical_profile(BUILTIN_MODELS["qwen2.5-32b"], {"h": (CATALOG["H800"], 8, 2.85)}).sites["h"]
    e32 = next(x for x in site.training if (x.tp, x.pp) == (1, 1))
    held = {"dp": 16, "hbm_bytes": site.hbm_bytes, "gathered_bytes": 0.0, "grad_bytes": 4 * p32}
    assert not holds_grad_sync(e32, **held, lora=False) and holds_grad_sync(e32, **held, lora=True)
    spare = TRAIN_MEM_FRACTION * site.hbm_bytes - rank_bytes(e32, shards=16)
    assert holds_grad_sync(e32, **held | {"grad_bytes": spare}, lora=False)
    assert not holds_grad_sync(e32, **held | {"grad_bytes": spare * 1.01}, lora=False)
    whole = dataclasses.replace(w, shards_state=False)
    assert dp_reduced_bytes(whole, tp=2, pp=1, dp=8, fsdp=False) == 4 * P7 / 2
    assert sync_s("qwen2.5-7b", 2, 8, whole) == pytest.approx(2 * 7 / 8 * 2 * P7 / (node_bw / 2))  # 1.1 s
    # a 4B replica fits an H800 whole: `auto` all-reduces it once a step, `trainer.shard: fsdp` reduce-scatters it
    # once a step (its gradients fit beside the shards): half the all-reduce's traffic
    p4 = BUILTIN_MODELS["qwen3-4b"].params
    auto = TrainWorkload(1e6, 1024, 32, 4 * p4)
    assert sync_s("qwen3-4b", 1, 16, auto) == pytest.approx(2 * 15 / 16 * 4 * p4 / node_bw)
    forced = dataclasses.replace(auto, shards_always=True)
    assert sync_s("qwen3-4b", 1, 16, forced) == pytest.approx(15 / 16 * 4 * p4 / node_bw)


def test_a_ring_is_as_slow_as_its_slowest_hop() -> None:
    """A ring all-reduce moves 2 (n − 1)/n of its bytes over every hop (nccl-tests' busbw), a reduce-scatter half
    that; the slowest hop sets the time. One node: NVLink's hops alone. 2 nodes of 8 GPUs at 400 Gbit/s a node: the
    network hop at the node's 50 GB/s, where each GPU's 1/8 (6.25 GB/s) was priced; tp 2's two rings share it. A node
    of 3.2 Tbit/s (400 GB/s) outruns NVLink's hops, which set the time then."""
    s = 30e9
    assert ring_time_s(s, ranks=1, node_bytes_per_s=50e9) == 0.0
    assert ring_time_s(s, ranks=8, node_bytes_per_s=None) == pytest.approx(2 * 7 / 8 * s / INTRA_NODE_BYTES_PER_S)
    assert ring_time_s(s, ranks=8, node_bytes_per_s=None, all_reduce=False) == pytest.approx(
        7 / 8 * s / INTRA_NODE_BYTES_PER_S
    )
    assert ring_time_s(s, ranks=16, node_bytes_per_s=50e9) == pytest.approx(2 * 15 / 16 * s / 50e9)  # 1.1 s (9 s)
    assert ring_time_s(s, ranks=16, node_bytes_per_s=50e9, all_reduce=False) == pytest.approx(15 / 16 * s / 50e9)
    assert ring_time_s(s / 2, ranks=8, node_bytes_per_s=50e9, rings_per_node=2) == pytest.approx(2 * 7 / 8 * s / 50e9)
    assert ring_time_s(s, ranks=16, node_bytes_per_s=400e9) == pytest.approx(2 * 15 / 16 * s / 300e9)
    # through train_time_s: 16 H800 ranks of a whole 7B replica (4 B a parameter) over 2 hosts vs one host of 16
    site = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)}).sites["h"]
    e = next(x for x in site.training if (x.tp, x.pp) == (2, 1))
    w = TrainWorkload(1e6, 1024, 32, 4 * P7, shards_state=False)
    t = {
        (hosts, bw): train_time_s(e, 8, w, site=site, node_bytes_per_s=bw, hosts=hosts)
        for hosts, bw in ((1, 50e9), (2, 50e9), (2, 400e9), (2, 800e9))
    }
    assert t[(2, 50e9)] - t[(1, 50e9)] == pytest.approx(2 * 7 / 8 * 2 * P7 * (1 / 25e9 - 1 / 300e9))
    assert t[(2, 400e9)] - t[(1, 50e9)] == pytest.approx(2 * 7 / 8 * 2 * P7 * (1 / 200e9 - 1 / 300e9))
    assert t[(2, 800e9)] == pytest.approx(t[(1, 50e9)])  # 400 GB/s a ring: NVLink's hops are the slower


def test_a_cpu_sites_ranks_reduce_over_gloo_not_nvlink() -> None:
    """A CPU site's trainer ranks are processes of one host reducing over gloo through TCP loopback (0.7–1.0 GB/s
    measured on the bench machine), not GPUs on NVLink: at dp 2 the demo model's 1.4 MB of fp32 gradients take 1.7 ms
    a step, priced 4.6 µs (NVLink's 300 GB/s) until 2026-12-07. Across hosts the slower of loopback and the network."""
    grads = 4 * BUILTIN_MODELS["tiny-demo"].params
    site = analytical_profile(BUILTIN_MODELS["tiny-demo"], {"c": (CATALOG["CPU"], 4, 0.05)}).sites["c"]
    e = next(x for x in site.training if (x.tp, x.pp) == (1, 1))
    w = TrainWorkload(2_600, 64, 32, grads, shards_state=False)  # a replica a rank: all-reduced once a step
    gpu_site = site.model_copy(update={"gpu": "H100"})
    t = {
        (s.gpu, dp, hosts, bw): train_time_s(e, dp, w, site=s, node_bytes_per_s=bw, hosts=hosts)
        for s in (site, gpu_site)
        for dp, hosts, bw in ((1, 1, 1.25e9), (2, 1, 1.25e9), (2, 2, 1.25e9), (2, 2, 0.4e9))
    }
    assert CPU_HOST_BYTES_PER_S < 1e9  # at 2 ranks a hop carries every byte once each way: 2 (n − 1)/n = 1
    assert t[("CPU", 2, 1, 1.25e9)] - t[("H100", 2, 1, 1.25e9)] == pytest.approx(
        grads / CPU_HOST_BYTES_PER_S - grads / INTRA_NODE_BYTES_PER_S
    )
    assert t[("CPU", 2, 2, 1.25e9)] == pytest.approx(t[("CPU", 2, 1, 1.25e9)])  # loopback the slower hop
    assert t[("CPU", 2, 2, 0.4e9)] - t[("CPU", 2, 1, 1.25e9)] == pytest.approx(
        grads / 0.4e9 - grads / CPU_HOST_BYTES_PER_S
    )
    assert t[("CPU", 1, 1, 1.25e9)] == t[("H100", 1, 1, 1.25e9)]  # one rank reduces nothing


def test_data_parallel_ranks_beyond_a_cuts_rows_shorten_nothing() -> None:
    """Each data-parallel rank trains its share of a learner cut (`backward_share`): at dp 64 and a step of 32
    rows half the ranks have none, so the step is no shorter than at dp 32. The planner priced 1/dp at any dp: on
    10,000 H800s it gave a 7B trainer 8,976 ranks for 1,024 samples."""
    prof = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)})
    site = prof.sites["h"]
    e = next(x for x in site.training if (x.tp, x.pp) == (1, 1))
    w = TrainWorkload(1e6, 32, 32, 0.0)  # no gradient bytes: no all-reduce, compute and overhead only
    at = {dp: train_time_s(e, dp, w, site=site, node_bytes_per_s=25e9) for dp in (16, 32, 64)}
    assert at[64] == pytest.approx(at[32]) and at[32] < at[16]
    _, configs = train_curve(site, w, 512, node_bytes_per_s=25e9)
    best = configs[512]
    assert best is not None and best.dp <= 32, best


def test_the_pipeline_bubble_is_the_chunked_schedule_of_every_cut() -> None:
    """pp > 1 as the megatron backend runs it: every learner cut drains the pipeline, its rows on a data-parallel
    rank in m = pipeline_chunks chunks (2 per stage, at most one per row), so compute × (1 + (pp − 1)/m) however
    many cuts there are; the runtime splits by the same function (rlctl.trainers.megatron.pipeline)."""
    assert [pipeline_chunks(rows, 2) for rows in (1, 2, 3, 4, 5, 64)] == [1, 2, 3, 4, 4, 4]
    assert (pipeline_chunks(64, 1), pipeline_chunks(64, 4)) == (1, 8)
    prof = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)})
    site = prof.sites["h"]
    e = next(x for x in site.training if (x.tp, x.pp) == (1, 2))

    def factor(dp: int, w: TrainWorkload) -> float:  # no gradient bytes: no all-reduce, compute and overhead only
        t = train_time_s(e, dp, w, site=site, node_bytes_per_s=25e9) - w.optimizer_steps * TRAIN_STEP_OVERHEAD_S
        return t / (w.tokens * e.gpu_s_per_token / (2 * dp))

    assert factor(4, TrainWorkload(1e6, 512, 32, 0.0)) == pytest.approx(1 + 1 / 4)  # 8 rows per rank: 4 chunks
    assert factor(4, TrainWorkload(1e6, 64, 32, 0.0)) == pytest.approx(1 + 1 / 4)  # fewer cuts: the same bubble
    assert factor(2, TrainWorkload(1e6, 512, 3, 0.0)) == pytest.approx(1 + 1 / 3)  # 3 rows per rank: 3 chunks
    assert factor(32, TrainWorkload(1e6, 512, 1, 0.0)) == pytest.approx(2.0)  # 1 row per rank: stage by stage
    # 128 mini-batches of 4 samples: cuts of 4 rows, 2 per rank
    assert factor(2, TrainWorkload(1e6, 512, 32, 0.0, mini_batches=128, optimizer_steps=128)) == pytest.approx(1.5)


def _job(algorithm: dict[str, object]) -> Job:
    job = load_job(Path(__file__).resolve().parents[3] / "jobs" / "cross-dc-7b.yaml")
    spec = job.spec.model_copy(
        update={"algorithm": (PpoAlgorithm if algorithm["kind"] == "ppo" else GrpoAlgorithm).model_validate(algorithm)}
    )
    return Job(spec, job.inventory, job.path)


def test_a_profile_of_other_passes_is_scaled_to_the_jobs() -> None:
    """A PPO profile without reference, planned for a PPO job with KL: ×(8P + 8C)/(6P + 8C) (16/14 with a critic of
    the policy's FLOPs, C = P, until 2026-12-07), the trainer time of the profile built for the job's own passes but
    for the tensor-parallel all-reduces, which are not linear in FLOPs (`tp_allreduces`: the profile's 10 a layer
    scaled by the FLOPs, the job's passes' 12; each entry's seconds that much apart, none at tp 1). Rows of 4,512
    tokens: at 20,512 the policy, critic and reference (36 B a parameter) beside a stage's activations and the full
    logits fit no split of megatron's grid on H800s."""
    job = _job({"kind": "ppo", "kl_coef": 0.01})
    task = job.spec.task.model_copy(update={"max_output_tokens": 4000})
    job = Job(job.spec.model_copy(update={"task": task}), job.inventory, job.path)
    opts = PlanOptions(sim_iterations=1, curves_in_output=False)
    plain = analytical_profile(
        job.spec.model.arch,
        {s: (site.spec, site.gpus_per_node, site.gpu_cost_per_hour) for s, site in job.inventory.sites.items()},
        algorithm="ppo",
    )
    assert train_cost(job, plain, TrainingPasses())["scale_of_profile"] == pytest.approx(
        (8 * P7 + 8 * C7) / (6 * P7 + 8 * C7)
    )
    scale = (8 * P7 + 8 * C7) / (6 * P7 + 8 * C7)
    arch, kl = job.spec.model.arch, TrainingPasses(reference=True)
    for name, site in plain.sites.items():
        gpu = job.inventory.sites[name].spec
        for e in site.training:
            ring = 2 * (e.tp - 1) / e.tp * arch.hidden * 2
            hop = arch.layers / e.pp * ring / (ETA_LINK * gpu.nvlink_gb_per_s * 1e9)  # one all-reduce of each layer
            want = training_entry(arch, gpu, tp=e.tp, pp=e.pp, algorithm="ppo", passes=kl).gpu_s_per_token
            assert want == pytest.approx(scale * e.gpu_s_per_token + e.tp * (12 - 10 * scale) * hop), (e.tp, e.pp)
    scaled = make_plan(job, plain, opts)
    own = make_plan(job, None, opts)
    assert scaled["predicted"]["t_train_s"] == pytest.approx(own["predicted"]["t_train_s"], rel=5e-3)
    assert own["training"]["flops_per_token"] == pytest.approx(8 * P7 + 8 * C7)
    grpo = make_plan(_job({"kind": "grpo"}), None, opts)
    assert grpo["training"]["forward_units"] == 3 and own["training"]["forward_units"] == pytest.approx(4 + 4 * C7 / P7)


def test_a_profile_of_another_algorithm_is_refused() -> None:
    job = _job({"kind": "ppo"})
    grpo_prof = profile_for(_job({"kind": "grpo"}), None)
    with pytest.raises(ConfigError, match="profile is for 'grpo', job runs 'ppo'") as e:
        make_plan(job, grpo_prof, PlanOptions(sim_iterations=1))
    assert e.value.hint == f"run rlctl profile --job {job.path}"


def test_a_profile_of_another_model_is_refused_with_a_hint_that_profiles_the_jobs_model() -> None:
    """The hint named `--model ARCH`, which for an HF model is its folder's base name (`--model model`), a name
    `rlctl profile` refuses; `--job JOB` profiles the job's own model, algorithm and sites."""
    job = _job({"kind": "grpo"})
    arch = BUILTIN_MODELS["qwen2.5-32b"]
    sites = {s: (site.spec, site.gpus_per_node, site.gpu_cost_per_hour) for s, site in job.inventory.sites.items()}
    other = analytical_profile(arch, sites, algorithm="grpo")
    with pytest.raises(ConfigError, match=r"profile is for 'qwen2\.5-32b', job trains 'qwen2\.5-7b'") as e:
        make_plan(job, other, PlanOptions(sim_iterations=1))
    assert e.value.hint == f"run rlctl profile --job {job.path}"


def test_ppo_trains_at_the_step_so_stream_is_no_better_than_sync() -> None:
    n = 4

    def work(at_step_s: float) -> IterationWork:
        return IterationWork(np.linspace(10 / n, 10, n), np.ones(n), 6.0, 1, at_step_s=at_step_s)

    stream = simulate_job([work(0.0)] * 6, mode="stream", weight_sync_s=1.0).iteration_s()
    ppo_stream = simulate_job([work(6.0)] * 6, mode="stream", weight_sync_s=1.0).iteration_s()
    ppo_sync = simulate_job([work(6.0)] * 6, mode="sync", weight_sync_s=1.0).iteration_s()
    assert stream == pytest.approx(10 + 1.5 + 1)
    assert ppo_stream == pytest.approx(ppo_sync) == pytest.approx(10 + 6 + 1)
    half = simulate_job([work(3.0)] * 6, mode="stream", weight_sync_s=1.0).iteration_s()
    assert half == pytest.approx(10 + 0.75 + 3 + 1)  # the last micro-batch's streamed share, then the step


def test_plan_json_reports_the_training_cost() -> None:
    p = make_plan(_job({"kind": "grpo", "kl_coef": 0.1}), None, PlanOptions(sim_iterations=1))
    t = p["training"]
    assert t["passes"]["reference"] is True and t["forward_units"] == 4 and t["streamed_fraction"] == 1.0
    yaml.safe_dump(t)  # plain data


def test_a_figure_timed_over_the_splits_ranks_gets_no_pipeline_bubble() -> None:
    """A measured split's seconds per token hold its stages' waiting (rlctl profile --source measured: wall
    clock over tp·pp ranks); a roofline entry's do not, so plan adds the bubble of (pp − 1)/chunks per cut."""
    prof = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h": (CATALOG["H800"], 8, 2.85)})
    site = prof.sites["h"]
    e = next(x for x in site.training if (x.tp, x.pp) == (2, 4))
    w = TrainWorkload(1e6, 512, 32, P7 * 2)  # cuts of 32 rows on one replica, 2 chunks per stage: bubble 3/8
    modelled = train_time_s(e, 1, w, site=site, node_bytes_per_s=25e9)
    measured = train_time_s(
        e.model_copy(update={"pipeline_wait_included": True}), 1, w, site=site, node_bytes_per_s=25e9
    )
    compute = 1e6 * e.gpu_s_per_token / 8
    assert modelled - measured == pytest.approx(compute * 3 / 8)


def test_a_rank_holds_its_state_whole_unless_the_trainer_shards_it_with_fsdp() -> None:
    """torch's FSDP2 divides weights, gradients and optimizer state over dp (`rlctl.trainers.fsdp`) and holds the
    root and one layer gathered; megatron (no distributed optimizer) and trainer.shard 'none' hold it whole on every
    rank, as `rlctl check` judges them. 7B at tp 1: 32.5 GB of weights and gradients and 91.4 GB of optimizer
    state, 124 GB a rank whole: no dp fits an 80 GB H800; at dp 8 torch needs 2 + 121.9 / 8 + 7.9 = 25.2 GB."""
    arch = BUILTIN_MODELS["qwen2.5-7b"]
    prof = analytical_profile(arch, {"h": (CATALOG["H800"], 8, 2.85)})
    site = prof.sites["h"]
    e = next(x for x in site.training if (x.tp, x.pp) == (1, 1))
    whole_gb = (e.fixed_bytes_per_gpu + e.sharded_bytes_per_gpu) / 1e9
    assert rank_bytes(e, shards=1) / 1e9 == pytest.approx(whole_gb) == pytest.approx(123.9, abs=0.05)
    gathered = fsdp_gathered_bytes(arch, adapter_params=0.0)
    assert gathered / 1e9 == pytest.approx(6 * (2 * 152064 * 3584 + (7.62e9 - 2 * 152064 * 3584) / 28) / 1e9)
    assert rank_bytes(e, shards=8, gathered_bytes=gathered) / 1e9 == pytest.approx(
        2 + (whole_gb - 2) / 8 + gathered / 1e9
    )
    assert rank_bytes(e, shards=8, gathered_bytes=gathered) / 1e9 == pytest.approx(25.2, abs=0.05)
    assert shards_state("torch", shard="auto") and shards_state("torch", shard="fsdp")
    assert not shards_state("torch", shard="none") and not shards_state("megatron", shard="auto")
    sharded = TrainWorkload(1e6, 512, 32, P7 * 2, gathered_bytes=gathered)
    whole = TrainWorkload(1e6, 512, 32, P7 * 2, shards_state=False)
    assert np.isfinite(train_time_s(e, 8, sharded, site=site, node_bytes_per_s=25e9))
    assert train_time_s(e, 8, whole, site=site, node_bytes_per_s=25e9) == float("inf")
    # 2 ranks: 2 + 61 + 7.9 = 70.9 GB, under 90 % of 80 GB (72 GB); 1 rank holds all of it
    assert rank_bytes(e, shards=2, gathered_bytes=gathered) / 1e9 == pytest.approx(70.9, abs=0.05)
    assert np.isfinite(train_time_s(e, 2, sharded, site=site, node_bytes_per_s=25e9))
    assert train_time_s(e, 1, sharded, site=site, node_bytes_per_s=25e9) == float("inf")
    tp2 = next(x for x in site.training if (x.tp, x.pp) == (2, 1))  # half the state: 63 GB a rank, whole
    assert np.isfinite(train_time_s(tp2, 4, whole, site=site, node_bytes_per_s=25e9))


def test_a_kl_jobs_reference_policy_is_priced_at_the_bytes_the_trainer_holds(tmp_path: Path) -> None:
    """The trainer makes the reference as it makes the policy (`rlctl.agents.trainer`: the torch backend, fp32 on its
    device): 4 bytes a parameter, where the planner and `rlctl check` priced 2 (bf16)."""
    import torch

    from rlctl.models.hfdir import check_hf_dir
    from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
    from rlctl.profiler.analytical import training_entry
    from rlctl.trainers.base import load_backend

    cfg = TinyGPTConfig(architecture="Qwen2ForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, explicit_head_dim=32,
                        tie_word_embeddings=True, max_position_embeddings=64)  # fmt: skip
    TinyGPT(cfg).save_pretrained(tmp_path, dtype=torch.bfloat16)  # a bf16 checkpoint
    arch = check_hf_dir(tmp_path).arch
    reference = load_backend("torch", tmp_path).model
    held = sum(p.numel() * p.element_size() for p in reference.parameters())
    priced = [
        training_entry(arch, CATALOG["H100"], tp=1, pp=1, algorithm="grpo", passes=RUNTIME.model_copy(update=up))
        for up in ({"reference": True}, {})
    ]
    assert priced[0].fixed_bytes_per_gpu - priced[1].fixed_bytes_per_gpu == held == 4 * arch.params


def test_activation_checkpointing_is_priced_as_a_recomputed_forward_an_update() -> None:
    """The torch trainer with `trainer.activation_checkpointing` runs every layer's forward again in the backward
    (`TinyGPT.hidden`): GRPO's update is 4 forward units, not 3 (8P FLOPs a token against 6P), and a profile priced
    without it scales by 4/3; the plan priced it at 3 (its memory, `profiler.actmem`, at the recomputed figure).
    Megatron recomputes nothing (check refuses the field with it)."""
    job = _job({"kind": "grpo"})
    torch_job = Job(
        job.spec.model_copy(update={"trainer": job.spec.trainer.model_copy(update={"backend": "torch"})}),
        job.inventory,
        job.path,
    )
    on = job.spec.trainer.model_copy(update={"backend": "torch", "activation_checkpointing": True})
    recomputed = Job(job.spec.model_copy(update={"trainer": on}), job.inventory, job.path)
    plain = analytical_profile(
        job.spec.model.arch,
        {s: (site.spec, site.gpus_per_node, site.gpu_cost_per_hour) for s, site in job.inventory.sites.items()},
    )
    assert train_cost(torch_job, plain, TrainingPasses())["flops_per_token"] == pytest.approx(6 * P7)
    cost = train_cost(recomputed, plain, TrainingPasses())
    assert cost["flops_per_token"] == pytest.approx(8 * P7) and cost["scale_of_profile"] == pytest.approx(4 / 3)
    assert train_cost(recomputed, profile_for(recomputed, None), TrainingPasses())["scale_of_profile"] == 1.0
    megatron = job.spec.trainer.model_copy(update={"activation_checkpointing": True})
    assert train_cost(Job(job.spec.model_copy(update={"trainer": megatron}), job.inventory, job.path), plain,
                      TrainingPasses())["forward_units"] == 3  # fmt: skip
