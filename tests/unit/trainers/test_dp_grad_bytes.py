"""The gradient bytes the planner prices a data-parallel step's reduction at (`rlctl.planner.costs.dp_reduced_bytes`)
are those the trainer hands its collectives, counted in a real step of 2 gloo ranks: the unsharded torch trainer and
megatron all-reduce their fp32 gradients once a step (`rlctl.rl.gradsum`), FSDP2 reduce-scatters them in fp32 in
every backward (a cut of the step's samples: `train_micro_batch_samples` rows on each rank)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.config.job import Job
from rlctl.config.pipeline import Batch
from rlctl.models.tinygpt import TinyGPT
from rlctl.planner.costs import dp_reduced_bytes, step_cuts
from rlctl.planner.inputs import profile_for, train_cost
from rlctl.planner.plan import train_workload
from rlctl.profiler.traincost import TrainingPasses
from rlctl.rl.samples import Sample
from tests.unit.ops.test_preflight import gpu_job
from tests.unit.trainers.ranks import ENV, start_rank
from tests.unit.trainers.test_fsdp import CFG, iterations

SCRIPT = Path(__file__).with_name("dp_grad_rank.py")
EVEN = dataclasses.replace(CFG, vocab_size=68)  # every tensor shards evenly over 2 ranks: FSDP2 pads none
MICRO = 3  # a rank's rows a cut: 16 samples in 3 cuts of 6 rows over the 2 ranks (6 cuts of 3 before 2026-12-07)


def collectives(
    tmp_path: Path,
    kind: str,
    *,
    micro: int = MICRO,
    world: int = 2,
    samples: list[Sample] | None = None,
    group: int = 4,
    ppo: bool = False,
) -> list[dict[str, Any]]:
    """Each rank's collectives of one GRPO step of `kind` ('torch', 'fsdp', 'fsdp-step', 'megatron') on `world` gloo
    ranks in cuts of `micro` rows a rank, its full weights after it, and what it trained of each cut (dp_grad_rank.py):
    of `samples` in groups of `group` (else the 4 groups of 4 of `iterations`' first); `ppo`: PPO's step."""
    tmp_path.mkdir(exist_ok=True)
    torch.manual_seed(0)
    TinyGPT(EVEN).save_pretrained(tmp_path / "model")
    torch.save(iterations()[0] if samples is None else samples, tmp_path / "samples.pt")
    argv = [str(tmp_path / "rdv"), kind, str(tmp_path / "model"), str(tmp_path / "samples.pt"), str(micro)]
    env = ENV | {"RLCTL_TEST_GROUP": str(group)} | ({"RLCTL_TEST_PPO": "1"} if ppo else {})
    procs = [start_rank(SCRIPT, [str(r), str(world), *argv, str(tmp_path / f"out-{r}.pt")], env) for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    return [torch.load(tmp_path / f"out-{r}.pt", weights_only=False) for r in range(world)]


def planned_bytes(tmp_path: Path, kind: str) -> float:
    """The planner's figure for this model and batch, as `rlctl plan` prices it (`plan.train_workload`)."""
    job = gpu_job(tmp_path, trainer_gpus=2, backend="megatron" if kind == "megatron" else "torch")
    spec = job.spec
    sharded = kind.startswith("fsdp")
    trainer = spec.trainer.model_copy(update={"shard": "fsdp" if sharded else "none"})
    # cuts of MICRO rows, as the ranks' short samples are cut (the job's 3,262-token rows would fill the default
    # token budget at 2 a cut)
    batch = Batch(prompts_per_iteration=4, samples_per_prompt=4, train_micro_batch_samples=MICRO)
    batch = batch.model_copy(update={"train_micro_batch_tokens": None})
    job = Job(spec.model_copy(update={"trainer": trainer, "batch": batch}), job.inventory, job.path)
    w = train_workload(job, EVEN.arch("tiny"), train_cost(job, profile_for(job, None), TrainingPasses()), tokens=1e4)
    assert w.shards_always == sharded and step_cuts(w, dp=2) == (3, 2 * MICRO)
    return dp_reduced_bytes(w, tp=1, pp=1, dp=2, fsdp=sharded, per_step=kind == "fsdp-step")


@pytest.mark.parametrize(
    ("kind", "collective"),
    [
        ("torch", "all_reduce"),
        ("fsdp", "reduce_scatter_single"),
        ("fsdp-step", "reduce_scatter_single"),
        ("megatron", "all_reduce"),
    ],
)
def test_the_planner_prices_the_gradient_bytes_the_trainer_reduces(tmp_path: Path, kind: str, collective: str) -> None:
    params = sum(p.numel() for p in TinyGPT(EVEN).parameters())
    assert EVEN.arch("tiny").params == params
    for rank in collectives(tmp_path, kind):
        grads = [(name, dtype, n) for name, dtype, n in rank["calls"] if dtype == "torch.float32"]
        assert {name for name, _, _ in grads} == {collective}  # (the step's summed figures: one float64 all-reduce)
        sent = sum(n for _, _, n in grads)
        # fp32: every cut's backward (FSDP2), or once a step (FSDP2 holding gradient sync off but in its last cut's)
        assert sent == 4 * params * (3 if kind == "fsdp" else 1)
        assert planned_bytes(tmp_path, kind) == sent


@pytest.mark.parametrize("kind", ["fsdp", "fsdp-step"])
def test_a_sharded_ppo_step_reduces_its_critic_as_its_policy(tmp_path: Path, kind: str) -> None:
    """PPO with its critic sharded beside the policy (`fsdp.shard_critic`): both reduce-scatter their fp32 gradients
    in every cut's backward (3 cuts), or once a step where the policy's are (`reduce_per_step`), versus the critic's
    all-reduced whole or reduced in every cut whatever the policy does. The critic is the policy's trunk (its tied
    lm_head the embedding) and a value head of 33 parameters, which FSDP2 pads to 2 rows (weight [1, 32] to [2, 32],
    bias [1] to [2]) to shard over 2 ranks."""
    params = sum(p.numel() for p in TinyGPT(EVEN).parameters())
    critic = params + 2 * (EVEN.hidden_size + 1)
    for rank in collectives(tmp_path, kind, ppo=True):
        grads = [(name, n) for name, dtype, n in rank["calls"] if dtype == "torch.float32"]
        assert {name for name, _ in grads} == {"reduce_scatter_single"}
        assert sum(n for _, n in grads) == 4 * (params + critic) * (3 if kind == "fsdp" else 1)


# The step's gradients agree to a few fp32 ulps of each tensor's largest: the FSDP2 ranks sum the same terms in
# another order (cuts of 2·micro rows all reduced at once, a reduce-scatter, versus each replica's own cuts, then an
# all-reduce). Measured: at most 4.8e-7 of the tensor's largest (8 ulps) at micro 3 and 4, where one rank's first cut
# lost is off by 0.57 of it and the cut scaled by 1.001 by 5.7e-4 (280 times the tolerance). The gradients are the
# test: AdamW's first step, lr·g/(|g| + eps), barely moves when a gradient is scaled.
GRAD_RTOL_OF_MAX = 2e-6
LR, ADAM_EPS = 1e-3, 1e-8  # dp_grad_rank.py's learning rate (no warmup); AdamW's eps (`policy_optimizer`)


def adam_slack(g: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """How far apart AdamW's first steps may be on gradients `g` and `ref`: it moves each weight by
    lr·g/(|g| + eps), whose slope eps/(|g| + eps)² is largest, 1/eps, where |g| is smallest: between two gradients
    of one sign no further than lr·|g − ref|·eps/(min |g| + eps)² (mean value theorem), of both signs lr·|g − ref|/eps.
    A near-cancelled gradient (|g| ~ eps: 6e-9 in up_proj.weight[423]) turns its ulps of disagreement into 2.5e-6."""
    least = torch.where(g * ref > 0, torch.minimum(g.abs(), ref.abs()), torch.zeros_like(g))
    return LR * (g - ref).abs() * ADAM_EPS / (least + ADAM_EPS) ** 2


@pytest.mark.parametrize("micro", [3, 4])
def test_a_step_reducing_once_equals_the_unsharded_step(tmp_path: Path, micro: int) -> None:
    """FSDP2 holding gradient sync off in every cut of a streamed step but its last (`DataParallel.reduce_per_step`)
    takes the unsharded step: each rank's full gradients as its optimizer steps equal those of two whole replicas
    that all-reduce once (to `GRAD_RTOL_OF_MAX` of each tensor's largest: fp32 sums in another order), and so do
    its weights after it, every element, to fp32 rounding plus how far AdamW's first step carries the gradients'
    difference (`adam_slack`: lr/eps = 1e5 times it where a gradient all but cancels, versus a fixed 1e-6 that such
    an element broke). Cuts of 3 rows a rank: 6, 6 and the flush's 4; of 4, each 2 groups of 4 a full cut as they
    arrive, so the learner keeps the last back for the flush (versus reducing none)."""
    whole = collectives(tmp_path / "whole", "torch", micro=micro)
    once = collectives(tmp_path / "once", "fsdp-step", micro=micro)
    start = TinyGPT.from_pretrained(tmp_path / "whole" / "model", dtype=torch.float32).state_dict()
    params = sum(t.numel() for t in start.values()) - start["lm_head.weight"].numel()  # tied: one parameter
    grads = whole[0]["grads"]
    assert len(grads) == len(list(TinyGPT(EVEN).parameters()))
    for rank in once:
        sent = [n for name, dtype, n in rank["calls"] if dtype == "torch.float32"]
        assert sum(sent) == 4 * params  # one reduce-scatter of the step's gradients
        assert rank["grads"].keys() == grads.keys()
        for name, g in grads.items():
            atol = GRAD_RTOL_OF_MAX * g.abs().max().item()
            torch.testing.assert_close(rank["grads"][name], g, atol=atol, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
        assert rank["weights"].keys() == whole[0]["weights"].keys()
        for name, w in whole[0]["weights"].items():
            grad = "model.embed_tokens.weight" if name == "lm_head.weight" else name  # tied
            slack = adam_slack(rank["grads"][grad], grads[grad])
            off = (rank["weights"][name] - w).abs() - (1e-6 + 1e-5 * w.abs() + slack)
            assert off.max() <= 0, f"{name}[{off.argmax().item()}]: {off.max().item():.3g} past the tolerance"
    assert not any(torch.equal(start[k], v) for k, v in once[0]["weights"].items() if k.endswith("proj.weight"))


def one_group_of_three() -> list[Sample]:
    """One prompt's 3 samples, of 3, 5 and 7 output tokens, each its own reward: every one has an advantage."""
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, EVEN.vocab_size, (4,), generator=g).tolist()
    outputs = [torch.randint(3, EVEN.vocab_size, (3 + 2 * i,), generator=g).tolist() for i in range(3)]
    return [Sample("0-0", prompt, out, [-4.0] * len(out), float(i), 0) for i, out in enumerate(outputs)]


@pytest.mark.parametrize("kind", ["fsdp", "fsdp-step"])
def test_a_cut_with_fewer_rows_than_ranks_runs_on_every_fsdp2_rank_and_takes_the_dp_1_step(
    tmp_path: Path, kind: str
) -> None:
    """A cut of 1 row at dp 2, the step's last (3 samples in cuts of 1 row a rank: 2 rows as they arrive, the third
    at the flush; per-rank budgets leave fewer rows than ranks in a step's last cut alone): rank 1, whose share of it
    is empty, runs FSDP2's forward and backward (collectives) on the cut's row at weight 0, and adds nothing: the
    step's full gradients equal one unsharded rank's to 1e-6 (a weight-1 row there counts it twice: off by its
    gradient), as do its figures, and rank 1's summed figures of that cut are 0. With gradient sync held off but in the
    step's last cut (`fsdp-step`), that cut is the weight-0 one: its backward is the reduction."""
    samples = one_group_of_three()
    whole = collectives(tmp_path / "whole", "torch", micro=1, world=1, samples=samples, group=3)
    ranks = collectives(tmp_path / kind, kind, micro=1, samples=samples, group=3)
    assert [(rows, ran) for rows, ran, _ in whole[0]["shares"]] == [(1, 1)] * 3
    for rank in ranks:
        assert [(rows, ran) for rows, ran, _ in rank["shares"]] == [(2, 1), (1, 1)]  # both ranks ran the cut of 1
    (_, _, first), (_, _, last) = ranks[1]["shares"]
    assert first["weight_sum"] > 0 and last.keys() == first.keys() and set(last.values()) == {0.0}
    grads = whole[0]["grads"]
    assert ranks[0]["grads"].keys() == ranks[1]["grads"].keys() == grads.keys()
    assert max(g.abs().max().item() for g in grads.values()) > 1e-3  # (it trained)
    for rank in ranks:
        for name, g in grads.items():
            torch.testing.assert_close(rank["grads"][name], g, atol=1e-6, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
    stats, want = ranks[0]["stats"], whole[0]["stats"]
    for k in ("loss", "clip_frac", "kl", "is_weight_mean", "entropy", "grad_norm", "tokens"):  # (summed over ranks)
        assert stats[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
