"""A PPO checkpoint written while the critic held the policy's lm_head (`rlctl.checkpoint.oldcritic`) resumes into a
critic without one: at its split (dp 1), its critic's and AdamW's state are the old one's without the head's, and the
next step is the old learner's next step; at dp 2 sharded (FSDP2 in a fake 2-rank group: `tests.unit.fake_group`),
each rank holds its rows of them. A new checkpoint holds no lm_head and resumes. The old shard's digest is checked as
written: one edited after it was written is refused as before."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.checkpoint.trainer import load_trainer, save_trainer
from rlctl.config.algorithm import PpoAlgorithm
from rlctl.errors import CheckpointError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.ppo import PpoLearner, ValueModel
from rlctl.rl.samples import Sample
from rlctl.trainers import fsdp
from rlctl.trainers.base import DataParallel
from rlctl.trainers.native import TorchBackend
from tests.unit.trainers.test_fsdp import CFG

ALGO = PpoAlgorithm(kind="ppo", lr=1e-3, critic_lr=1e-2)
WHOLE = ParallelConfig("trainer")


def batch(seed: int) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(4):
        output = torch.randint(3, CFG.vocab_size, (3 + i,), generator=g).tolist()
        prompt = torch.randint(3, CFG.vocab_size, (4,), generator=g).tolist()
        out.append(Sample(f"{seed}-{i}", prompt, output, [-4.0] * len(output), float(i % 2), 0))
    return out


def old_learner(tied: bool, *, head_state: bool) -> PpoLearner:
    """A learner whose critic is a whole copy of the policy, lm_head included (the critic before 2026-12-07), one step
    taken; `head_state`: its lm_head given AdamW state of zero moments, as an unsharded dp > 1 stepped it (its zero
    gradient summed over the ranks), else none (no gradient reached it: dp 1, FSDP2)."""
    torch.manual_seed(0)
    policy = TinyGPT(dataclasses.replace(CFG, tie_word_embeddings=tied))
    learner = PpoLearner(policy, ALGO, critic=ValueModel(copy.deepcopy(policy)), micro_batch_samples=2)
    learner.step(batch(1))
    head = learner.critic.body.lm_head.weight
    if head_state and not tied:
        step = next(iter(learner.critic_opt.state.values()))["step"].clone()
        zero = torch.zeros_like(head)
        learner.critic_opt.state[head] = {"step": step, "exp_avg": zero, "exp_avg_sq": zero.clone()}
    return learner


def save(ckpt: Path, learner: PpoLearner) -> None:
    opts = {"policy": learner.opt, "critic": learner.critic_opt}
    save_trainer(ckpt, model=learner.model, optimizers=opts, modules={"critic": learner.critic},  # type: ignore[arg-type]
                 counters={"version": 1}, split=WHOLE, data_parallel=DataParallel())  # fmt: skip


def load(ckpt: Path, learner: PpoLearner, *, split: ParallelConfig, dp: DataParallel, backend: Any = None) -> None:
    opts = {"policy": learner.opt, "critic": learner.critic_opt}
    load_trainer(ckpt, model=backend or learner.model, optimizers=opts, modules={"critic": learner.critic},
                 split=split, data_parallel=dp, version=1)  # fmt: skip


def without_head(old: PpoLearner) -> tuple[dict[str, torch.Tensor], dict[int, dict[str, Any]]]:
    """The old critic's state and AdamW state as a critic without the lm_head holds them (by the new indices)."""
    state = {k: v.detach().clone() for k, v in old.critic.state_dict().items() if k != "body.lm_head.weight"}
    params = [p for n, p in old.critic.named_parameters() if n != "body.lm_head.weight"]  # (tied: named as embedding)
    return state, {i: old.critic_opt.state[p] for i, p in enumerate(params) if p in old.critic_opt.state}


@pytest.mark.parametrize(("tied", "head_state"), [(True, False), (False, False), (False, True)])
def test_an_old_critics_checkpoint_resumes_at_its_split_and_steps_as_the_old_learner(
    tmp_path: Path, tied: bool, head_state: bool
) -> None:
    old = old_learner(tied, head_state=head_state)
    save(tmp_path / "iter-1", old)
    shard = torch.load(tmp_path / "iter-1" / "ranks" / "rank-0.pt", weights_only=True)
    assert "body.lm_head.weight" in shard["module.critic"]  # (shaped as the old one's)
    want_state, want_adam = without_head(old)

    torch.manual_seed(1)
    new = PpoLearner(TinyGPT(old.model.config), ALGO, micro_batch_samples=2)
    load(tmp_path / "iter-1", new, split=WHOLE, dp=DataParallel())
    got = new.critic.state_dict()
    assert got.keys() == want_state.keys()
    assert all(torch.equal(got[k], v) for k, v in want_state.items())
    adam = new.critic_opt.state_dict()["state"]
    assert adam.keys() == want_adam.keys()
    for i, st in want_adam.items():
        assert all(torch.equal(adam[i][m], st[m]) for m in ("step", "exp_avg", "exp_avg_sq")), i

    old.step(batch(2))
    new.step(batch(2))
    for k, v in new.critic.state_dict().items():
        torch.testing.assert_close(v, old.critic.state_dict()[k], rtol=0, atol=1e-7, msg=k)
    for k, v in new.model.state_dict().items():
        torch.testing.assert_close(v, old.model.state_dict()[k], rtol=0, atol=1e-7, msg=k)

    save(tmp_path / "iter-2", new)  # a new checkpoint: no lm_head, and it resumes
    shard = torch.load(tmp_path / "iter-2" / "ranks" / "rank-0.pt", weights_only=True)
    assert not any("lm_head" in k for k in shard["module.critic"])
    assert len(shard["optimizer.critic"]["param_groups"][0]["params"]) == len(list(new.critic.parameters()))
    again = PpoLearner(TinyGPT(old.model.config), ALGO, micro_batch_samples=2)
    load(tmp_path / "iter-2", again, split=WHOLE, dp=DataParallel())
    assert all(torch.equal(again.critic.state_dict()[k], v) for k, v in new.critic.state_dict().items())


def test_an_old_critics_shard_edited_after_it_was_written_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "iter-1"
    save(ckpt, old_learner(False, head_state=False))
    rel = "ranks/rank-0.pt"
    shard = torch.load(ckpt / rel, weights_only=True)
    shard["optimizer.critic"]["state"][0]["exp_avg"] += 1
    torch.save(shard, ckpt / rel)
    manifest = json.loads((ckpt / "MANIFEST.trainer.json").read_text())  # listed as it is now: the digest refuses it
    data = (ckpt / rel).read_bytes()
    manifest["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "MANIFEST.trainer.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    new = PpoLearner(TinyGPT(dataclasses.replace(CFG, tie_word_embeddings=False)), ALGO)
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(ckpt))}: {rel}: its optimizer state is not the one"):
        load(ckpt, new, split=WHOLE, dp=DataParallel())


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[Path, PpoLearner]]:
    """Old critics' checkpoints written unsharded at dp 1 (before a test's fake group: rank 0 of 1 writes), by tied."""
    out = {}
    for tied in (True, False):
        old = old_learner(tied, head_state=not tied)
        save(ckpt := tmp_path_factory.mktemp(f"tied-{tied}") / "iter-1", old)
        out[tied] = ckpt, old
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_an_old_critics_checkpoint_resumes_sharded_at_dp_2(
    unsharded: dict[bool, tuple[Path, PpoLearner]], fake_rank: int, tied: bool
) -> None:
    ckpt, old = unsharded[tied]
    want_state, want_adam = without_head(old)
    model = TinyGPT.on_meta(old.model.config)
    fsdp.shard(model, cuda=False)
    model.materialise(torch.device("cpu"))
    backend = TorchBackend(model, sharded=True)
    critic = ValueModel(backend.critic_trunk())
    backend.shard_critic(critic)
    dp = backend.data_parallel()
    new = PpoLearner(model, ALGO, critic=critic, data_parallel=dp)
    load(ckpt, new, split=dataclasses.replace(WHOLE, dp=2, fsdp=True), dp=dp, backend=backend)

    def rows(t: torch.Tensor) -> torch.Tensor:
        per = -(-t.shape[0] // 2)
        return t[min(fake_rank * per, t.shape[0]) :][:per]

    got = critic.state_dict()
    assert got.keys() == want_state.keys()
    for k, v in want_state.items():
        assert torch.equal(fsdp.local_tensor(got[k]), rows(v)), k
    adam = new.critic_opt.state
    params = list(critic.parameters())
    assert {i for i, p in enumerate(params) if p in adam} == set(want_adam)
    for i, st in want_adam.items():
        for m in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(fsdp.local_tensor(adam[params[i]][m]), rows(st[m])), (i, m)
