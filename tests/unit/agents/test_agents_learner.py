"""The streaming learner trains micro-batches as groups arrive; its step equals training the batch at the end."""

import random

import pytest
import torch

from rlctl.config.algorithm import GrpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.grpo import GrpoLearner
from rlctl.rl.learner import StreamingLearner
from rlctl.rl.samples import Sample, score
from tests.unit.tiny_models import small_config

SMALL = small_config(positions=48)


def batch(model: TinyGPT, rng: random.Random, *, prompts: int, group: int) -> list[Sample]:
    out = []
    for p in range(prompts):
        prompt = [1, 3 + p, 4]
        for _ in range(group):
            output = [rng.randrange(5, 60) for _ in range(rng.choice([1, 2, 3, 5, 8, 20, 40]))]
            (lp,) = score(model, [Sample(f"p{p}", prompt, output, [0.0] * len(output), 0.0)])
            out.append(Sample(f"p{p}", prompt, output, [x - 0.05 for x in lp], rng.random()))
    return out


# the job file's other update settings: Dr. GRPO's advantages, an upper clip that binds (the behaviour log-probs
# are 0.05 below: ratios ≈ 1.05), decay, a tight gradient clip, warm-up
KNOBS = {
    "advantage_std": False,
    "clip_eps_high": 0.02,
    "weight_decay": 0.05,
    "grad_clip": 0.1,
    "lr_warmup_iterations": 3,
}


def twin(model: TinyGPT) -> TinyGPT:
    out = TinyGPT(SMALL)
    out.load_state_dict(model.state_dict())
    return out


@pytest.mark.parametrize(
    ("rows", "tokens", "knobs"), [(4, None, {}), (32, 96, {}), (3, 40, {}), (5, None, KNOBS)], ids=str
)
def test_streaming_step_equals_the_batch_step(rows: int, tokens: int | None, knobs: dict) -> None:
    torch.manual_seed(0)
    base = TinyGPT(SMALL)
    samples = batch(base, random.Random(1), prompts=5, group=4)
    cfg = GrpoAlgorithm(kind="grpo", lr=1e-2, **knobs)
    at_end = TinyGPT(SMALL)
    at_end.load_state_dict(base.state_dict())
    GrpoLearner(at_end, cfg, micro_batch_samples=rows, micro_batch_tokens=tokens).step(samples)

    streamed = TinyGPT(SMALL)
    streamed.load_state_dict(base.state_dict())
    learner = StreamingLearner(streamed, cfg, group_size=4, micro_batch_samples=rows, micro_batch_tokens=tokens)
    for s in random.Random(2).sample(samples, len(samples)):  # arrival order ≠ group order
        learner.add(s)
        learner.train_ready()
    assert learner.compute_s > 0  # micro-batches ran before the step, as samples arrived
    stats = learner.step()
    assert stats["samples"] == len(samples) and stats["tokens"] == sum(len(s.output_tokens) for s in samples)
    for (name, a), b in zip(at_end.state_dict().items(), streamed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    moved = max(
        float((a - b).abs().max())
        for a, b in zip(base.state_dict().values(), streamed.state_dict().values(), strict=True)
    )
    assert moved > 1e-4  # the step did something to compare


def test_a_group_with_samples_filtered_out_trains_as_the_batch_of_what_it_kept() -> None:
    """Groups of 4 of which some arrive with 3 (a sample filtered out: its reward held the trainer): the learner
    completes each at the size it is told and steps as the batch learner does on the same samples."""
    torch.manual_seed(0)
    base = TinyGPT(SMALL)
    full = batch(base, random.Random(1), prompts=4, group=4)
    kept = [s for i, s in enumerate(full) if not (i % 4 == 3 and s.prompt_id in ("p0", "p2"))]
    cfg = GrpoAlgorithm(kind="grpo", lr=1e-2)
    at_end = TinyGPT(SMALL)
    at_end.load_state_dict(base.state_dict())
    GrpoLearner(at_end, cfg, micro_batch_samples=4).step(kept)
    streamed = TinyGPT(SMALL)
    streamed.load_state_dict(base.state_dict())
    learner = StreamingLearner(streamed, cfg, group_size=4, micro_batch_samples=4)
    for s in kept:
        learner.add(s, group_size=3 if s.prompt_id in ("p0", "p2") else 4)
        learner.train_ready()
    assert not learner.groups  # every group complete at its own size
    learner.step()
    for (name, a), b in zip(at_end.state_dict().items(), streamed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


def test_groups_without_signal_are_not_run_and_the_step_is_the_batch_step() -> None:
    """Two of five groups score every sample alike: their advantages are 0, so the streaming learner runs no
    forward or backward for them, and its step still equals the batch learner's, which trains every sample (their
    tokens count in the normaliser). With a KL term the loss has a gradient there: every group trains, and those
    without signal are still counted."""
    torch.manual_seed(0)
    base = TinyGPT(SMALL)
    samples = batch(base, random.Random(1), prompts=5, group=4)
    for s in samples:
        if s.prompt_id in ("p1", "p3"):
            s.reward = 1.0
    cfg = GrpoAlgorithm(kind="grpo", lr=1e-2)
    at_end, streamed = twin(base), twin(base)
    GrpoLearner(at_end, cfg, micro_batch_samples=4).step(samples)
    learner = StreamingLearner(streamed, cfg, group_size=4, micro_batch_samples=4)
    trained: list[str] = []
    run = learner.backward_share
    learner.backward_share = lambda chunk, **kw: (trained.extend(s.prompt_id for s, _ in chunk), run(chunk, **kw))  # type: ignore[method-assign]
    for s in samples:
        learner.add(s)
        learner.train_ready()
    stats = learner.step()
    assert sorted(set(trained)) == ["p0", "p2", "p4"] and len(trained) == 12
    assert stats["no_signal_frac"] == 8 / 20 and stats["samples"] == 20
    for (name, a), b in zip(at_end.state_dict().items(), streamed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)

    with_kl = StreamingLearner(
        TinyGPT(SMALL), GrpoAlgorithm(kind="grpo", kl_coef=0.1), group_size=4, micro_batch_samples=4, ref_model=base
    )
    for s in samples:
        with_kl.add(s)
    assert with_kl.no_signal == 8 and len(with_kl.ready) == 20  # counted, and trained: the KL term has a gradient


def test_a_step_whose_gradient_is_not_finite_is_skipped_and_the_next_one_trains() -> None:
    """A NaN in one parameter's gradient (an overflow, say): the step leaves the weights and AdamW's moments as they
    were and says `skipped`; the next iteration, with finite gradients, steps as a learner that never saw it."""
    torch.manual_seed(0)
    base = TinyGPT(SMALL)
    rng = random.Random(1)
    first, second = batch(base, rng, prompts=2, group=4), batch(base, rng, prompts=2, group=4)
    cfg = GrpoAlgorithm(kind="grpo", lr=1e-2)
    model, clean = twin(base), twin(base)
    learner = StreamingLearner(model, cfg, group_size=4, micro_batch_samples=4)
    poison = model.lm_head.weight.register_hook(lambda g: torch.full_like(g, float("nan")))
    for s in first:
        learner.add(s)
    stats = learner.step()
    poison.remove()
    assert stats["skipped"] == 1.0 and stats["grad_norm"] != stats["grad_norm"]  # NaN
    for (name, a), b in zip(base.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # not one weight moved
    assert learner.opt.state == {} and learner.steps == 1  # no AdamW moment was touched; the version advanced

    reference = StreamingLearner(clean, cfg, group_size=4, micro_batch_samples=4)
    reference.resume_at(1)  # the same step number: the same learning rate
    for lrn in (learner, reference):
        for s in second:
            lrn.add(s)
    assert learner.step()["skipped"] == 0.0 and reference.step()["skipped"] == 0.0
    for (name, a), b in zip(clean.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_train_time_stops_once_the_device_has_run_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A micro-batch's and the optimizer step's seconds were read as soon as their kernels were queued: on a GPU
    before they ran, so `train_s` (the rebalancer's T_train) left out the backward passes and the AdamW step."""
    import types

    from rlctl.rl import grpo, learner

    events: list[object] = []

    def clock() -> float:
        events.append("clock")
        return float(len(events))

    for module in (learner, grpo):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=clock))
        monkeypatch.setattr(module, "sync", lambda device: events.append(("sync", str(device))), raising=False)
    torch.manual_seed(0)
    model = TinyGPT(SMALL)
    samples = batch(model, random.Random(1), prompts=1, group=4)
    streaming = StreamingLearner(model, GrpoAlgorithm(kind="grpo"), group_size=4, micro_batch_samples=4)
    for s in samples:
        streaming.add(s)
    streaming.train_ready()
    assert events == ["clock", ("sync", "cpu"), "clock"]  # the micro-batch
    events.clear()
    assert streaming.step()["train_s"] > 0
    assert events == ["clock", ("sync", "cpu"), "clock"]  # the optimizer step
    events.clear()
    GrpoLearner(model, GrpoAlgorithm(kind="grpo"), micro_batch_samples=2).step(samples)
    assert events == ["clock", ("sync", "cpu"), "clock"]


def test_sync_waits_for_a_cuda_device_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlctl.devices import sync

    waited: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", waited.append)
    for device in (torch.device("cpu"), torch.device("meta"), torch.device("cuda", 1)):
        sync(device)
    assert waited == [torch.device("cuda", 1)]
