"""A sharded `torch` trainer's load (`TorchBackend.load(shard=True)`) over gloo on 2 CPU ranks: made on the meta
device, sharded, filled from the checkpoint one tensor at a time (no rank holds the whole model), it is the model
the whole load makes, bit for bit — tied and untied, with LoRA's initial adapters, and PPO's critic (the policy's
trunk without its lm_head, a zero value head)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlctl.config.runtime import Lora
from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.native import TorchBackend
from tests.unit.trainers.ranks import ENV, start_rank
from tests.unit.trainers.test_fsdp import CFG

SCRIPT = Path(__file__).with_name("load_rank.py")


def sharded_load(tmp_path: Path, model: Path, *, lora: str | None, extra: dict[str, str] | None = None) -> dict:
    env = {**ENV, "PATH": "/usr/bin:/bin"} | ({"RLCTL_TEST_LORA": lora} if lora else {}) | (extra or {})
    out = tmp_path / "out.pt"
    procs = [start_rank(SCRIPT, [str(r), "2", str(tmp_path / "rdv"), str(model), str(out)], env) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("lora", [None, "4,8"])
def test_a_sharded_load_is_the_whole_load_bit_for_bit(tmp_path: Path, tied: bool, lora: str | None) -> None:
    torch.manual_seed(0)
    TinyGPT(dataclasses.replace(CFG, tie_word_embeddings=tied)).save_pretrained(tmp_path / "model")
    adapters = Lora(rank=4, alpha=8.0) if lora else None
    whole = TorchBackend.load(tmp_path / "model", adapters=adapters).model
    got = sharded_load(tmp_path, tmp_path / "model", lora=lora)

    want = {k: v.detach() for k, v in whole.state_dict().items()}
    assert got["policy"].keys() == want.keys()
    for name, w in want.items():
        assert torch.equal(got["policy"][name], w), name
    assert any(k.endswith("lora_A") for k in want) == bool(lora)
    for name, b in whole.named_buffers():  # the RoPE tables: recomputed, nothing loads them
        assert torch.equal(got["buffers"][name], b), name
    if lora:
        return
    critic = got["critic"]
    assert critic["head.weight"].count_nonzero() == 0 and critic["head.bias"].count_nonzero() == 0
    trunk = {k: w for k, w in want.items() if k != "lm_head.weight"}  # (the critic holds no lm_head, tied or not)
    assert critic.keys() == {*(f"body.{k}" for k in trunk), "head.weight", "head.bias"}
    for name, w in trunk.items():
        assert torch.equal(critic[f"body.{name}"], w), name


def test_no_rank_holds_the_whole_model_or_critic_while_it_loads(tmp_path: Path) -> None:
    """Each of 2 ranks' peak resident memory rises by its half of the fp32 model and one full tensor as it loads
    (measured 0.67–0.71 × the model here), versus the whole model before sharding (1.16 ×; a 72B's 288 GB on every
    GPU); and by its half of the critic as PPO's critic is made (measured 0.42–0.47 ×, versus 0.84–0.87 × with a
    whole uninitialised trunk made first: its untouched pages not resident, so less than the 1.5 × it holds)."""
    big = dataclasses.replace(
        CFG, vocab_size=4096, hidden_size=1024, intermediate_size=2048, num_hidden_layers=6, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    model = TinyGPT(big)
    model_bytes = sum(p.numel() * 4 for p in model.parameters())  # 260 MB
    model.save_pretrained(tmp_path / "model")
    del model
    got = sharded_load(tmp_path, tmp_path / "model", lora=None, extra={"RLCTL_TEST_PEAK_ONLY": "1"})
    load, critic = zip(*got["load_peak_bytes"], strict=True)
    assert max(load) < 0.9 * model_bytes, (load, model_bytes)
    assert max(critic) < 0.65 * model_bytes, (critic, model_bytes)
