"""FSDP2 for the torch trainer over gloo on 2 CPU ranks — the sharding code the GPU path runs over NCCL: GRPO
steps equal the unsharded steps, and a sharded checkpoint resumes bit for bit (each rank its own part)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from rlctl.models.hf import MoeConfig
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.rl.samples import Sample
from tests.unit.tiny_models import misfits
from tests.unit.trainers.ranks import ENV, start_rank

SCRIPT = Path(__file__).with_name("fsdp_rank.py")
CFG = TinyGPTConfig(  # 7-row vocabulary shards unevenly over 2 ranks; tied embeddings are one sharded parameter
    architecture="Qwen2ForCausalLM",
    vocab_size=67,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
    max_position_embeddings=64,
)


def iterations() -> list[list[Sample]]:
    g = torch.Generator().manual_seed(5)
    out = []
    for it in range(3):
        batch = []
        for i in range(16):  # 4 prompts × 4 samples in cuts of 3 rows a rank: at dp 2, 6, 6 and the flush's 4
            prompt = torch.randint(3, 67, (4,), generator=g).tolist()
            output = torch.randint(3, 67, (3 + (i * 5 + it) % 11,), generator=g).tolist()
            batch.append(Sample(f"{it}-{i // 4}", prompt, output, [-4.0] * len(output), float((i + it) % 3), 0))
        out.append(batch)
    return out


def run(
    tmp_path: Path,
    *,
    world: int,
    phase: str,
    job: Path,
    model: Path,
    samples: Path,
    lora: str | None = None,
    micro: int = 3,
    extra: dict[str, str] | None = None,
) -> dict[str, list]:
    """`lora`: 'RANK,ALPHA' of adapters on every projection; `micro`: samples a micro-batch; `extra`: more of the
    ranks' environment (fsdp_rank.py)."""
    rendezvous = tmp_path / f"rdv-{world}-{phase}"
    out = tmp_path / f"out-{world}-{phase}.pt"
    env = {**ENV, "PATH": "/usr/bin:/bin", "RLCTL_TEST_MICRO": str(micro)} | ({"RLCTL_TEST_LORA": lora} if lora else {})
    env |= extra or {}
    argv = [str(rendezvous), phase, str(model), str(samples), str(job), str(out)]
    procs = [start_rank(SCRIPT, [str(r), str(world), *argv], env) for r in range(world)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    return torch.load(out, weights_only=False)


# Qwen3: sharded per-head q/k norms; Qwen3MoE: routed experts (top 1 of 16, layer 1 dense), some of which one rank's
# tokens choose and the other's not: every expert's gradient is reduced on every rank all the same (versus a gloo
# collective mismatch, one rank reducing more gradients than the other)
MOE = MoeConfig(num_experts=16, num_experts_per_tok=1, moe_intermediate_size=32, mlp_only_layers=(1,))
# Qwen2MoE: those experts beside a shared expert (every rank's tokens run it) and its gate
MOES = {"Qwen3MoeForCausalLM": MOE, "Qwen2MoeForCausalLM": dataclasses.replace(MOE, shared_expert_intermediate_size=48)}


@pytest.fixture(scope="module", params=["Qwen2ForCausalLM", "Qwen3ForCausalLM", *MOES])
def inputs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("fsdp")
    torch.manual_seed(0)
    moe = MOES.get(request.param)
    TinyGPT(dataclasses.replace(CFG, architecture=request.param, moe=moe)).save_pretrained(d / "model")
    torch.save(iterations(), d / "samples.pt")
    return d / "model", d / "samples.pt"


def assert_same_steps(whole: dict[str, list], sharded: dict[str, list], start: dict[str, torch.Tensor]) -> None:
    """The sharded run's weights after each of its 3 steps equal the unsharded run's (within 1e-3 of each tensor's
    largest change since `start`), and so do its gradient norms."""
    for it in range(3):
        for name, w in whole["weights"][it].items():
            step = (w - start[name]).abs().max()
            torch.testing.assert_close(sharded["weights"][it][name], w, atol=1e-6 + 1e-3 * float(step), rtol=1e-4)
    assert sharded["grad_norms"] == pytest.approx(whole["grad_norms"], rel=1e-4)


def test_sharded_steps_equal_the_unsharded_steps(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    model, samples = inputs
    whole = run(tmp_path, world=1, phase="run", job=tmp_path / "job1", model=model, samples=samples)
    sharded = run(tmp_path, world=2, phase="run", job=tmp_path / "job2", model=model, samples=samples)
    start = TinyGPT.from_pretrained(model).hf_weights()
    assert_same_steps(whole, sharded, start)
    # each version went out as a delta its ranks encoded from their own shards, and the root's buffer holds the
    # weights a gather gives
    assert sharded["published"] == [True] * 3 and sharded["encodings"] == [["delta", "full"]] * 3
    assert not any(torch.equal(start[k], v) for k, v in sharded["weights"][2].items() if k.endswith("proj.weight"))


def test_a_moes_load_balancing_term_takes_the_same_steps_sharded(tmp_path: Path) -> None:
    """A Qwen3MoE whose config.json sets output_router_logits: each rank's pass takes the load-balancing term over its
    own rows, weighed by their share of the whole batch's normaliser, and FSDP2 sums the ranks' gradients. 2 ranks
    given 1 row each of every 2-row micro-batch (`train_micro_batch_samples` 1: a rank's) take the steps 1 rank takes
    in 1-row micro-batches (each term over the same row), and report the same term, versus none trained (1 rank in
    2-row micro-batches, a term over 2 rows, differs from both: by 2e-3 in a router weight after 3 steps, against a
    tolerance of 2e-6)."""
    torch.manual_seed(0)
    aux = dataclasses.replace(MOE, output_router_logits=True, router_aux_loss_coef=0.1)
    TinyGPT(dataclasses.replace(CFG, architecture="Qwen3MoeForCausalLM", moe=aux)).save_pretrained(tmp_path / "model")
    torch.save(iterations(), tmp_path / "samples.pt")
    paths = {"model": tmp_path / "model", "samples": tmp_path / "samples.pt"}
    whole = run(tmp_path, world=1, phase="run", job=tmp_path / "job1", micro=1, **paths)
    sharded = run(tmp_path, world=2, phase="run", job=tmp_path / "job2", micro=1, **paths)
    assert_same_steps(whole, sharded, TinyGPT.from_pretrained(tmp_path / "model").hf_weights())
    assert all(a is not None and a > 1.0 for a in whole["router_aux"])  # (1: every expert chosen alike)
    assert sharded["router_aux"] == pytest.approx(whole["router_aux"], rel=1e-5)


def test_a_sharded_checkpoint_resumes_bit_for_bit(tmp_path: Path, inputs: tuple[Path, Path]) -> None:
    model, samples = inputs
    job = tmp_path / "job"
    ran = run(tmp_path, world=2, phase="run", job=job, model=model, samples=samples)
    files = sorted(p.name for p in (job / "iter-2" / "ranks").iterdir())
    assert files == ["rank-0.pt", "rank-1.pt"]  # every rank wrote its part of the sharded state
    resumed = run(tmp_path, world=2, phase="resume", job=job, model=model, samples=samples)
    for name, w in ran["weights"][2].items():
        assert torch.equal(resumed["weights"][0][name], w), name
    assert resumed["grad_norms"][0] == ran["grad_norms"][2]
    # the checkpoint's HF directory is the version published at iteration 2: the gathered weights then
    from rlctl.models.weightfiles import load_state_dict

    saved = load_state_dict(job / "iter-2" / "model")
    assert all(torch.equal(saved[k], ran["weights"][1][k]) for k in saved)


def test_a_cpu_trainer_on_a_machine_with_a_gpu_shards_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FSDP2 without a mesh makes one of the machine's accelerator (CUDA wherever a GPU is visible) and moves the
    parameters there: a `gpu: CPU` site's sharded trainer on a GPU host would have put every rank on cuda:0, its
    gloo group then all-gathering CUDA tensors. The mesh is the model's device's: here the accelerator is made to
    say CUDA (torch is a CPU build: a CUDA mesh could not be made), and the shards stay on the CPU."""
    import torch.distributed as dist

    from rlctl.trainers import fsdp

    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        model = TinyGPT(CFG)
        fsdp.shard(model, cuda=False)
        assert {fsdp.local_tensor(p).device.type for p in model.parameters()} == {"cpu"}
        model(torch.randint(0, 67, (2, 5))).sum().backward()
    finally:
        dist.destroy_process_group()


def test_a_full_load_that_does_not_fit_the_model_is_refused_before_any_tensor_is_copied(tmp_path: Path) -> None:
    """`fsdp.load_full` (a sharded rank's resume) of tensors with one missing, one unexpected, one of another shape,
    or all three: DoesNotFit in one line naming them (`check_fit`) and every shard as it was, bit for bit, versus a
    missing tensor alone refused, an unexpected one ignored and one of another shape ending the load halfway (a
    RuntimeError of the copy, the tensors before it new). A tied lm_head may be left out, or be the embedding; one
    other than the embedding is refused (`check_tied`)."""
    import torch.distributed as dist

    from rlctl.models.tensors import DoesNotFit
    from rlctl.trainers import fsdp

    untied = dataclasses.replace(CFG, tie_word_embeddings=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        for cfg in (untied, CFG):
            torch.manual_seed(0)
            model, other = TinyGPT(cfg), TinyGPT(cfg)
            fsdp.shard(model, cuda=False)
            before = {k: fsdp.local_tensor(v).clone() for k, v in model.state_dict().items()}
            whole = {k: v + 1 for k, v in other.hf_weights().items()}
            for bad, said in misfits(whole, list(before)):
                with pytest.raises(DoesNotFit, match=f"^{re.escape(said)}$"):
                    fsdp.load_full(model, bad, optional={"lm_head.weight"} if cfg.tie_word_embeddings else ())
                assert all(torch.equal(fsdp.local_tensor(v), before[k]) for k, v in model.state_dict().items())
        embed = whole["model.embed_tokens.weight"]
        with pytest.raises(DoesNotFit, match=r"lm_head\.weight differs from model\.embed_tokens\.weight"):
            fsdp.load_full(model, {**whole, "lm_head.weight": embed + 1}, optional={"lm_head.weight"})
        assert all(torch.equal(fsdp.local_tensor(v), before[k]) for k, v in model.state_dict().items())
        for tensors in (whole, {**whole, "lm_head.weight": embed.clone()}):
            fsdp.load_full(model, tensors, optional={"lm_head.weight"})
            got = {k: fsdp.local_tensor(v) for k, v in model.state_dict().items()}
            assert all(torch.equal(got[k], v) for k, v in whole.items()) and torch.equal(got["lm_head.weight"], embed)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ppo")
    torch.manual_seed(0)
    TinyGPT(CFG).save_pretrained(d / "model")
    torch.save(iterations(), d / "samples.pt")
    return d / "model", d / "samples.pt"


@pytest.mark.parametrize("extra", [{}, {"RLCTL_TEST_ROWS": "13", "RLCTL_TEST_ONCE": "1"}], ids=["every-cut", "once"])
def test_ppo_with_its_critic_sharded_takes_the_unsharded_steps(
    tmp_path: Path, dense: tuple[Path, Path], extra: dict[str, str]
) -> None:
    """PPO at dp 2 with the policy and its critic sharded (FSDP2 on the same mesh) updates both as dp 1 does (within
    1e-5), versus a critic left whole beside a sharded policy (refused by `rlctl check` before). 'once': the gradients
    reduced in the step's last backward alone (`reduce_per_step`), and 13 rows a step: cuts of 6, 6 and 1, the last
    of which rank 1 runs with weight 0 (its passes are collectives)."""
    model, samples = dense
    ppo = {"RLCTL_TEST_PPO": "1"} | extra
    whole = run(tmp_path, world=1, phase="run", job=tmp_path / "job1", model=model, samples=samples, extra=ppo)
    sharded = run(tmp_path, world=2, phase="run", job=tmp_path / "job2", model=model, samples=samples, extra=ppo)
    start = TinyGPT.from_pretrained(model).hf_weights()
    for it in range(3):
        for name, w in whole["weights"][it].items():
            torch.testing.assert_close(sharded["weights"][it][name], w, atol=1e-5, rtol=1e-5)
        for name, v in whole["critics"][it].items():
            torch.testing.assert_close(sharded["critics"][it][name], v, atol=1e-5, rtol=1e-5)
    assert sharded["grad_norms"] == pytest.approx(whole["grad_norms"], rel=1e-5)
    assert sharded["critics"][2]["head.weight"].abs().min() > 0  # trained, from zeros
    assert not any(torch.equal(start[k], v) for k, v in sharded["weights"][2].items() if k.endswith("proj.weight"))


def test_a_sharded_ppo_checkpoint_resumes_its_critic_bit_for_bit(tmp_path: Path, dense: tuple[Path, Path]) -> None:
    model, samples = dense
    job, ppo = tmp_path / "job", {"RLCTL_TEST_PPO": "1"}
    ran = run(tmp_path, world=2, phase="run", job=job, model=model, samples=samples, extra=ppo)
    resumed = run(tmp_path, world=2, phase="resume", job=job, model=model, samples=samples, extra=ppo)
    for part in ("policy", "module.critic", "optimizer.critic", "optimizer.policy"):  # as saved at iteration 2
        assert_equal(resumed["state"][part], ran["state"][part], part)
    for name, w in ran["weights"][2].items():
        assert torch.equal(resumed["weights"][0][name], w), name
    for name, v in ran["critics"][2].items():
        assert torch.equal(resumed["critics"][0][name], v), name


def assert_equal(a: object, b: object, where: str) -> None:
    """Nested dicts of tensors equal bit for bit."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ppo-untied")
    torch.manual_seed(0)
    TinyGPT(dataclasses.replace(CFG, tie_word_embeddings=False)).save_pretrained(d / "model")
    torch.save(iterations(), d / "samples.pt")
    return d / "model", d / "samples.pt"


@pytest.mark.parametrize(("world", "model_of"), [(1, "dense"), (3, "dense"), (3, "untied")])
def test_a_sharded_ppo_checkpoint_resumes_at_another_dp(
    tmp_path: Path, request: pytest.FixtureRequest, world: int, model_of: str
) -> None:
    """Saved at dp 2 (the critic and its AdamW state sharded as the policy's), resumed at dp 1 or 3
    (`rlctl.checkpoint.refsdp`): the same whole state, and the next step the saved run's (within 1e-5). 'untied': the
    critic holds no lm_head (`rlctl.trainers.critic`), the policy one apart from its embedding."""
    model, samples = request.getfixturevalue(model_of)
    job, ppo = tmp_path / "job", {"RLCTL_TEST_PPO": "1"}
    ran = run(tmp_path, world=2, phase="run", job=job, model=model, samples=samples, extra=ppo)
    resumed = run(tmp_path, world=world, phase="resume", job=job, model=model, samples=samples, extra=ppo)
    for part in ("policy", "module.critic", "optimizer.critic", "optimizer.policy"):
        assert_equal(resumed["state"][part], ran["state"][part], part)
    for name, w in ran["weights"][2].items():
        torch.testing.assert_close(resumed["weights"][0][name], w, atol=1e-5, rtol=1e-5)
    for name, v in ran["critics"][2].items():
        torch.testing.assert_close(resumed["critics"][0][name], v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("world", "model_of"), [(2, "untied"), (3, "untied"), (3, "dense")])
def test_a_sharded_ppo_checkpoint_of_a_critic_with_an_lm_head_resumes_without_it(
    tmp_path: Path, request: pytest.FixtureRequest, world: int, model_of: str
) -> None:
    """Saved at dp 2 by a critic holding the policy's lm_head (as until 2026-12-07: its rows in each shard, its
    optimizer index among the critic's), resumed by one without (`rlctl.checkpoint.oldcritic`) at dp 2 or 3: the
    critic's state and AdamW state are the saved ones without the head (none of which it held: it never stepped), and
    the next step is the saved run's (within 1e-5), versus refused as another model's critic."""
    model, samples = request.getfixturevalue(model_of)
    job, ppo = tmp_path / "job", {"RLCTL_TEST_PPO": "1"}
    ran = run(
        tmp_path,
        world=2,
        phase="run",
        job=job,
        model=model,
        samples=samples,
        extra=ppo | {"RLCTL_TEST_OLD_CRITIC": "1"},
    )
    resumed = run(tmp_path, world=world, phase="resume", job=job, model=model, samples=samples, extra=ppo)
    head = "body.lm_head.weight"
    assert head in ran["state"]["module.critic"]
    want = {k: v for k, v in ran["state"]["module.critic"].items() if k != head}
    assert_equal(resumed["state"]["module.critic"], want, "module.critic")

    def by_order(states: dict[int, object]) -> dict[int, object]:  # (the head had no state: the others in order)
        return dict(enumerate(st for _, st in sorted(states.items())))

    moments = by_order(ran["state"]["optimizer.critic"])
    assert_equal(by_order(resumed["state"]["optimizer.critic"]), moments, "optimizer.critic")
    for part in ("policy", "optimizer.policy"):
        assert_equal(resumed["state"][part], ran["state"][part], part)
    for name, v in resumed["critics"][0].items():
        torch.testing.assert_close(v, ran["critics"][2][name], atol=1e-5, rtol=1e-5)
    assert head not in resumed["critics"][0]


def test_a_sharded_reference_and_critic_keep_nothing_gathered_after_their_no_grad_forwards(tmp_path: Path) -> None:
    """PPO's advantages run the reference (its scores) and the critic (GAE's values) forward without a backward: their
    FSDP2 roots (embeddings, norms, lm_head) are resharded after (`rlctl.rl.samples.release_gathered`), versus
    gathered until the critic's first backward and, the reference's, for good (FSDP2 keeps a root gathered after a
    forward for the backward it expects: 4·V·h bytes of bf16 each, ≈ 2.2 GB a rank at Qwen2.5-7B)."""
    import torch.distributed as dist

    from rlctl.config.algorithm import PpoAlgorithm
    from rlctl.rl.ppo import PpoLearner, ValueModel
    from rlctl.trainers import fsdp

    def gathered(m: torch.nn.Module) -> bool:
        return bool(m._get_fsdp_state()._fsdp_param_group.is_unsharded)  # type: ignore[operator]

    untied = dataclasses.replace(CFG, tie_word_embeddings=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        policy, ref, critic = TinyGPT(untied), TinyGPT(untied), ValueModel(TinyGPT(untied))
        for m in (policy, ref):
            fsdp.shard(m, cuda=False)
        fsdp.shard_critic(critic, policy, cuda=False)
        learner = PpoLearner(
            policy, PpoAlgorithm(kind="ppo", lr=1e-3, kl_coef=0.1), critic=critic, ref_model=ref, micro_batch_samples=4
        )
        learner.advantages(iterations()[0])
        assert not gathered(ref) and not gathered(critic)
        learner.step(iterations()[1])  # and a step: both roots gathered for their backwards, then freed by FSDP2
        assert not gathered(ref) and not gathered(critic) and not gathered(policy)
    finally:
        dist.destroy_process_group()
