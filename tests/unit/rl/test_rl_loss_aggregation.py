"""`algorithm.loss_aggregation`: the policy loss (and GRPO's KL-to-reference term) averaged over the batch's tokens
(token_mean, DAPO), over its samples of each sample's token mean (sequence_mean, GRPO's 1/G Σ_i 1/|o_i| Σ_t) or
over samples × the task's max_output_tokens (constant, Dr. GRPO), checked against a reference written plainly
(one forward per sample, a loop over its tokens, the papers' sums), its gradients included, whatever the
micro-batches, and on two gloo ranks as on one."""

from __future__ import annotations

import copy
import multiprocessing as mp
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from pydantic import ValidationError

from rlctl.agents.common import AgentContext
from rlctl.agents.trainer import TrainerAgent
from rlctl.config.algorithm import GrpoAlgorithm, LossAggregation, PpoAlgorithm
from rlctl.config.job import JobFile
from rlctl.launch.jobdir import JobDir
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import GrpoLearner, group_advantages
from rlctl.rl.learner import StreamingLearner
from rlctl.rl.ppo import PpoLearner
from rlctl.rl.samples import Sample, score
from rlctl.rl.tasks import MAX_DIGITS
from rlctl.transport import InprocTransport
from tests.unit.gloo_pair import spawned_pair
from tests.unit.rank_end import end_rank
from tests.unit.tiny_models import small_config

SMALL = small_config(positions=48)
MODES: tuple[LossAggregation, ...] = ("token_mean", "sequence_mean", "constant")
MAX_OUTPUT_TOKENS = 24  # the task's: what `constant` divides by, with the samples
GROUP = 4
CLIP, CLIP_HIGH, BETA = 0.2, 0.28, 0.1


def batch(model: TinyGPT, *, seed: int = 1, prompts: int = 3) -> list[Sample]:
    """Groups of GROUP samples of very different lengths (one output empty), off-policy enough that clips bind, with
    reference log-probs of their own (the KL term's)."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [1, 3 + p, 4]
        for g in range(GROUP):
            n = 0 if (p, g) == (1, 2) else rng.choice([1, 2, 5, 9, 20])
            output = [rng.randrange(5, 60) for _ in range(n)]
            (lp,) = score(model, [Sample(f"p{p}", prompt, output, [0.0] * n, 0.0)])
            old = [x + rng.uniform(-0.4, 0.4) for x in lp]
            ref = [x + rng.uniform(-0.5, 0.5) for x in lp]
            out.append(Sample(f"p{p}", prompt, output, old, rng.random(), ref_logprobs=ref))
    return out


def reference(
    model: torch.nn.Module,
    samples: list[Sample],
    advantages: list[float] | list[list[float]],
    mode: LossAggregation,
    *,
    kl_coef: float = BETA,
) -> dict[str, torch.Tensor]:
    """The loss, its KL-to-reference term and the clip fraction as the papers write them: each sample on its own
    forward, each of its tokens' terms in a loop, then 1/#tokens Σ_i Σ_t, 1/G Σ_i 1/|o_i| Σ_t (the samples with a
    token) or 1/(G·L) Σ_i Σ_t."""
    terms, kls, clips = [], [], []  # per sample: its tokens' loss terms, KL terms, clipped or not
    for s, a in zip(samples, advantages, strict=True):
        logp = torch.log_softmax(model(torch.tensor([s.prompt_tokens + s.output_tokens]))[0].float(), dim=-1)
        term, kl, clip = [], [], []
        for t, token in enumerate(s.output_tokens):
            lp = logp[len(s.prompt_tokens) - 1 + t, token]
            adv = a[t] if isinstance(a, list) else a
            ratio = torch.exp(lp - s.logprobs[t])
            pg = torch.maximum(-ratio * adv, -ratio.clamp(1 - CLIP, 1 + CLIP_HIGH) * adv)
            assert s.ref_logprobs is not None
            d = s.ref_logprobs[t] - lp
            k3 = torch.exp(d) - d - 1
            term.append(pg + kl_coef * k3)
            kl.append(k3)
            clip.append(float(not 1 - CLIP <= float(ratio.detach()) <= 1 + CLIP_HIGH))
        terms.append(term)
        kls.append(kl)
        clips.append(clip)

    def aggregate(per_sample: list[list[Any]]) -> Any:
        if mode == "token_mean":
            return sum(sum(x) for x in per_sample) / sum(len(x) for x in per_sample)
        if mode == "sequence_mean":
            kept = [x for x in per_sample if x]
            return sum(sum(x) / len(x) for x in kept) / len(kept)
        return sum(sum(x) for x in per_sample) / (len(per_sample) * MAX_OUTPUT_TOKENS)

    # a fraction, not a loss: under constant the mean over tokens, as under token_mean
    clip_frac = aggregate(clips) if mode != "constant" else sum(map(sum, clips)) / sum(map(len, clips))
    return {"loss": aggregate(terms), "kl_ref": aggregate(kls), "clip_frac": torch.tensor(clip_frac)}


def cfg(mode: LossAggregation, **more: Any) -> GrpoAlgorithm:
    # no gradient clip (the gradient is read as the loss gives it), clip-higher binding, a KL term
    return GrpoAlgorithm(
        kind="grpo", lr=1e-2, grad_clip=1e9, clip_eps=CLIP, clip_eps_high=CLIP_HIGH, loss_aggregation=mode, **more
    )


def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def reference_grads(
    model: TinyGPT, samples: list[Sample], adv: list[float] | list[list[float]], mode: LossAggregation, **kw: Any
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    twin = copy.deepcopy(model)
    figures = reference(twin, samples, adv, mode, **kw)
    figures["loss"].backward()
    return grads_of(twin), {k: v.detach() for k, v in figures.items()}


def assert_same_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, g in got.items():
        torch.testing.assert_close(g, want[name], atol=2e-7, rtol=1e-4, msg=name)


# the batch learner cut into micro-batches of 1, 3 and every row, and the streaming learner fed in arrival order
LEARNERS = ("batch-1", "batch-3", "batch-all", "streaming-2", "streaming-tokens")


@pytest.mark.parametrize("learner", LEARNERS)
@pytest.mark.parametrize("mode", MODES)
def test_the_grpo_gradient_and_figures_are_the_reference_s_whatever_the_micro_batches(
    mode: LossAggregation, learner: str
) -> None:
    torch.manual_seed(0)
    model, ref_model = TinyGPT(SMALL), TinyGPT(SMALL)
    samples = batch(model)
    adv = group_advantages([s.reward for s in samples], [s.prompt_id for s in samples])
    want, figures = reference_grads(model, samples, adv, mode)
    algo = cfg(mode, kl_coef=BETA)
    seen: dict[str, torch.Tensor] = {}
    if learner.startswith("batch"):
        rows = {"batch-1": 1, "batch-3": 3, "batch-all": len(samples)}[learner]
        grpo = GrpoLearner(
            model, algo, ref_model=ref_model, micro_batch_samples=rows, max_output_tokens=MAX_OUTPUT_TOKENS
        )
        stats = grpo.step(copy.deepcopy(samples))
        seen = grads_of(model)  # as the step left them: no clip at grad_clip 1e9
    else:

        def record(max_norm: float) -> float:
            seen.update(grads_of(model))  # divided by the iteration's normaliser, before AdamW
            return 1.0

        tokens = 40 if learner == "streaming-tokens" else None
        streaming = StreamingLearner(
            model,
            algo,
            group_size=GROUP,
            micro_batch_samples=2,
            micro_batch_tokens=tokens,
            ref_model=ref_model,
            clip_grad_norm_=record,
            max_output_tokens=MAX_OUTPUT_TOKENS,
        )
        for s in random.Random(2).sample(samples, len(samples)):  # arrival order ≠ group order
            streaming.add(copy.deepcopy(s))
            streaming.train_ready()
        stats = streaming.step()
    assert_same_grads(seen, want)
    for key in ("loss", "kl_ref", "clip_frac"):
        assert stats[key] == pytest.approx(float(figures[key]), rel=1e-5, abs=1e-7), key
    assert 0 < stats["clip_frac"] < 1 and stats["kl_ref"] > 0  # figures that can tell the modes apart


def test_the_modes_differ_on_this_batch() -> None:
    """What the test above compares is not the same number under three names: the batch's lengths differ enough."""
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    samples = batch(model)
    adv = group_advantages([s.reward for s in samples], [s.prompt_id for s in samples])
    with torch.no_grad():
        losses = [float(reference(model, samples, adv, m)["loss"]) for m in MODES]
    assert min(abs(a - b) for i, a in enumerate(losses) for b in losses[i + 1 :]) > 1e-3 * max(map(abs, losses))


@pytest.mark.parametrize("rows", [1, 5, 100])
@pytest.mark.parametrize("mode", MODES)
def test_the_ppo_policy_gradient_is_the_reference_s_whatever_the_micro_batches(
    mode: LossAggregation, rows: int
) -> None:
    """PPO's policy loss takes the aggregation on its per-token advantages (GAE, whitened); its critic stays a token
    mean, and its `kl_ref` (the rewards' KL) is averaged as the figures are."""
    torch.manual_seed(0)
    model, ref_model = TinyGPT(SMALL), TinyGPT(SMALL)
    samples = batch(model)
    algo = PpoAlgorithm(
        kind="ppo",
        grad_clip=1e9,
        clip_eps=CLIP,
        clip_eps_high=CLIP_HIGH,
        kl_coef=BETA,
        loss_aggregation=mode,
    )
    seen: dict[str, torch.Tensor] = {}

    def record(module: torch.nn.Module, max_norm: float) -> float:
        if module is model:
            seen.update(grads_of(model))
        return 1.0

    ppo = PpoLearner(
        model,
        algo,
        ref_model=ref_model,
        micro_batch_samples=rows,
        clip_grad_norm_=record,
        max_output_tokens=MAX_OUTPUT_TOKENS,
    )
    adv, _ = ppo.advantages(copy.deepcopy(samples))
    want, figures = reference_grads(model, samples, adv, mode, kl_coef=0.0)  # β is in PPO's rewards, not its loss
    stats = ppo.step(copy.deepcopy(samples))
    assert_same_grads(seen, want)
    assert stats["loss"] == pytest.approx(float(figures["loss"]), rel=1e-5, abs=1e-7)
    assert stats["clip_frac"] == pytest.approx(float(figures["clip_frac"]), rel=1e-5, abs=1e-7)
    k1 = [[o - r for o, r in zip(s.logprobs, s.ref_logprobs or [], strict=True)] for s in samples]
    if mode == "sequence_mean":
        means = [sum(x) / len(x) for x in k1 if x]
        assert stats["kl_ref"] == pytest.approx(sum(means) / len(means), rel=1e-5)
    else:
        assert stats["kl_ref"] == pytest.approx(sum(map(sum, k1)) / sum(map(len, k1)), rel=1e-5)


def test_constant_needs_the_task_s_max_output_tokens_when_a_learner_is_built() -> None:
    model = TinyGPT(SMALL)
    with pytest.raises(ValueError, match="loss_aggregation 'constant' divides by samples × max_output_tokens"):
        StreamingLearner(model, cfg("constant"), group_size=GROUP, micro_batch_samples=2)
    with pytest.raises(ValueError, match="max_output_tokens"):
        GrpoLearner(model, cfg("constant"))
    with pytest.raises(ValueError, match="max_output_tokens"):
        PpoLearner(model, PpoAlgorithm(kind="ppo", loss_aggregation="constant"))
    StreamingLearner(model, cfg("sequence_mean"), group_size=GROUP, micro_batch_samples=2)  # needs no maximum


def test_the_field_defaults_to_the_token_mean_and_refuses_another_value_naming_the_valid_ones() -> None:
    assert GrpoAlgorithm(kind="grpo").loss_aggregation == PpoAlgorithm(kind="ppo").loss_aggregation == "token_mean"
    with pytest.raises(ValidationError, match="'token_mean', 'sequence_mean' or 'constant'"):
        GrpoAlgorithm(kind="grpo", loss_aggregation="seq_mean")  # type: ignore[arg-type]


@pytest.mark.parametrize("field,budget", [(16, 16), (1000, 9 * MAX_DIGITS + 1)], ids=["field", "digits-cap"])
def test_the_trainer_agent_gives_its_learner_the_task_s_max_output_tokens(
    tmp_path: Path, field: int, budget: int
) -> None:
    """The trainer agent's learner (the torch, FSDP and megatron backends' alike: `make_learner`) divides by the most
    output tokens a request asks for under `constant`: the task's max_output_tokens, or the digits task's cap below it
    (an answer of 9 letters a digit and EOS; versus the field, which no output reaches). Built without it, the agent
    failed at its start."""
    job = JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "agg",
            "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "algorithm": {"kind": "grpo", "loss_aggregation": "constant"},
            "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": field},
            "iterations": 1,
            "batch": {"prompts_per_iteration": 1, "samples_per_prompt": 2},
            "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 1}]},
            "transport": {"kind": "inproc", "timeout_s": 10},
            "warmup": {"sft_steps": 0},
        }
    )
    jd = JobDir.create("agg", explicit=tmp_path / "job")
    jd.write_job(job, source="test")
    TinyGPT().save_pretrained(jd.init_model)
    agent = TrainerAgent(AgentContext(jd, job, InprocTransport(secret=jd.secret()), "inproc://controller-agg"))
    learner = agent.learner
    assert isinstance(learner, StreamingLearner) and learner.max_output_tokens == budget


# ---------------------------------------------------------------- two gloo ranks


def _rank(rank: int, init: str, state: dict[str, torch.Tensor], samples: list[Sample], out: mp.Queue[Any]) -> None:
    """Per mode: the streaming learner (rank 0 adds every sample, rank 1 follows, each trains its slice of each
    micro-batch) and the batch learner (each rank its own groups: rank 0 two, rank 1 one), each rank's gradient as
    the optimizer would take it."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        for mode in MODES:
            model = TinyGPT(SMALL)
            model.load_state_dict(state)
            seen: dict[str, torch.Tensor] = {}

            def record(max_norm: float, model: TinyGPT = model, seen: dict[str, torch.Tensor] = seen) -> float:
                seen.update(grads_of(model))
                return 1.0

            learner = StreamingLearner(
                model,
                cfg(mode),
                group_size=GROUP,
                micro_batch_samples=3,
                clip_grad_norm_=record,
                max_output_tokens=MAX_OUTPUT_TOKENS,
            )
            if rank == 1:
                learner.follow()
            else:
                for s in copy.deepcopy(samples):
                    learner.add(s)
                    learner.train_ready()
                learner.step()
                learner.stop_followers()
            out.put(("streaming", mode, rank, {k: v.tolist() for k, v in seen.items()}))
            model = TinyGPT(SMALL)
            model.load_state_dict(state)
            mine = [s for s in copy.deepcopy(samples) if (s.prompt_id == "p2") == (rank == 1)]
            GrpoLearner(model, cfg(mode), micro_batch_samples=3, max_output_tokens=MAX_OUTPUT_TOKENS).step(mine)
            out.put(("batch", mode, rank, {k: v.tolist() for k, v in grads_of(model).items()}))
    finally:
        dist.destroy_process_group()
    end_rank(out)


@pytest.mark.timeout(180)
def test_two_ranks_take_the_gradient_of_one(tmp_path: Path) -> None:
    """Every rank divides by the whole batch's normaliser (the streaming learner's, broadcast by rank 0 with the
    step; the batch learner's, its counts all-reduced), not its own share's: the summed gradient is one rank's."""
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    samples = batch(model)
    adv = group_advantages([s.reward for s in samples], [s.prompt_id for s in samples])
    got = spawned_pair(_rank, tmp_path / "rendezvous", state, samples, results=2 * 2 * len(MODES), timeout_s=150)
    wants = {mode: reference_grads(model, samples, adv, mode, kl_coef=0.0)[0] for mode in MODES}
    assert sorted((kind, mode, rank) for kind, mode, rank, _ in got) == sorted(
        (kind, mode, rank) for kind in ("streaming", "batch") for mode in MODES for rank in (0, 1)
    )
    for _, mode, _, grads in got:
        assert_same_grads({k: torch.tensor(v) for k, v in grads.items()}, wants[mode])
