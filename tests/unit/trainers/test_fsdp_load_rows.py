"""`fsdp.load_full` moves a rank's rows of each full tensor to the device, not the full tensor: checked in this
process on rank 0 and rank 1 of a 2-rank fake process group (`tests.unit.fake_group`: `load_full` runs no
collective), each move (`Tensor.to`) of the load recorded."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlctl.devices import as_dtensor
from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers import fsdp
from tests.unit.trainers.test_fsdp import CFG


@pytest.mark.parametrize("tied", [True, False])
def test_a_load_moves_this_ranks_rows_alone(fake_rank: int, tied: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = dataclasses.replace(CFG, tie_word_embeddings=tied)  # 67-row vocabulary: 34 rows on rank 0, 33 on rank 1
    torch.manual_seed(0)
    whole = {k: v.detach().clone() for k, v in TinyGPT(cfg).state_dict().items()}
    model = TinyGPT.on_meta(cfg)
    fsdp.shard(model, cuda=False)
    model.materialise(torch.device("cpu"))

    moved: list[int] = []
    to = torch.Tensor.to

    def recorded(self: torch.Tensor, *args: object, **kw: object) -> torch.Tensor:
        moved.append(self.numel())
        return to(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.Tensor, "to", recorded)
    fsdp.load_full(model, whole, optional={"lm_head.weight"} if tied else ())
    monkeypatch.undo()

    own = model.state_dict()
    shards = {k: d.to_local() for k, t in own.items() if (d := as_dtensor(t)) is not None}
    loaded = [k for k in shards if not (tied and k == "lm_head.weight")]  # (tied: copied once, as the embedding)
    assert sorted(moved) == sorted(shards[k].numel() for k in loaded)
    assert sum(moved) < sum(whole[k].numel() for k in loaded)  # (the full tensors: what the load moved before)
    for k in loaded:
        n = whole[k].shape[0]
        start = min(fake_rank * -(-n // 2), n)
        assert torch.equal(shards[k], whole[k][start : start + shards[k].shape[0]]), k
