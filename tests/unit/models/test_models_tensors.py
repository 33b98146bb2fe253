"""`CheckpointTensors` reads what `hf.load_state_dict` reads (fp32), from each layout of a checkpoint directory: one
model.safetensors, an index and its shards, a pytorch_model.bin; its shapes from the headers alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlctl.models import hf
from rlctl.models.tensors import CheckpointTensors
from rlctl.models.tinygpt import TinyGPT
from tests.unit.tiny_models import small_config


@pytest.mark.parametrize("layout", ["one-file", "shards", "torch-bin"])
def test_each_tensor_is_the_whole_reads(tmp_path: Path, layout: str) -> None:
    torch.manual_seed(0)
    d = TinyGPT(small_config()).save_pretrained(tmp_path / "model")
    sd = {k: v.to(torch.bfloat16) for k, v in hf.load_state_dict(d).items()}  # read back in fp32
    for f in hf.weight_files(d):
        f.unlink()
    if layout == "torch-bin":
        torch.save(sd, d / hf.TORCH_FILE)
    else:
        hf.save_state_dict(sd, d, max_shard_bytes=20_000 if layout == "shards" else None)
    assert (d / hf.INDEX_FILE).exists() == (layout == "shards")
    whole, tensors = hf.load_state_dict(d), CheckpointTensors(d)
    assert list(tensors) == list(whole) and len(tensors) == len(whole) and "lm_head.bias" not in tensors
    assert tensors.shapes() == {k: tuple(v.shape) for k, v in whole.items()}
    for k, v in whole.items():
        assert tensors[k].dtype == torch.float32 and torch.equal(tensors[k], v), k
