"""`rlctl check` refuses a tied model's checkpoint whose lm_head.weight is not its embedding, in the line the loader
refuses it in at launch (`tensors.check_tied`), reading those two tensors alone: it read the headers, and passed it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from rlctl.config import load_job
from rlctl.errors import ConfigError
from rlctl.models import tensors, weightfiles
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops.preflight import problems
from tests.conftest import run_cli
from tests.unit.ops.test_preflight import hf_dataset_job, only_line, refused
from tests.unit.tiny_models import small_config


def tied_job(tmp_path: Path, *, layout: str) -> tuple[Path, Path]:
    """A dataset job (its path) on a tied model (its directory) whose files hold an lm_head.weight equal to its
    embedding: one model.safetensors, shards or a pytorch_model.bin (`layout`)."""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    d = TinyGPT(dataclasses.replace(small_config(positions=64), tie_word_embeddings=True)).save_pretrained(
        tmp_path / "model"
    )
    whole = weightfiles.load_state_dict(d)
    with_head(d, whole, whole["model.embed_tokens.weight"].clone(), layout=layout)
    return job.path, d


def with_head(d: Path, whole: dict[str, torch.Tensor], lm_head: torch.Tensor, *, layout: str) -> None:
    for f in weightfiles.weight_files(d):
        f.unlink()
    (d / weightfiles.INDEX_FILE).unlink(missing_ok=True)
    tensors = {**whole, "lm_head.weight": lm_head}
    if layout == "torch-bin":
        torch.save(tensors, d / weightfiles.TORCH_FILE)
    else:
        weightfiles.save_state_dict(tensors, d, max_shard_bytes=20_000 if layout == "shards" else None)


@pytest.mark.parametrize("layout", ["one-file", "shards", "torch-bin"])
def test_check_refuses_a_tied_models_lm_head_that_is_not_its_embedding_as_the_loader_does(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, d = tied_job(tmp_path, layout=layout)
    assert problems(load_job(path)) == []  # equal: one tensor, as the loader takes it
    whole = weightfiles.load_state_dict(d)
    lm_head = whole["model.embed_tokens.weight"].clone()
    lm_head[-1, 0] += 1  # the last row of the last block (`TIED_BLOCK_ROWS` 16: 66 rows in 5 blocks)
    with_head(d, whole, lm_head, layout=layout)
    with pytest.raises(ConfigError) as loader:
        TinyGPT.from_pretrained(d)
    (p,) = refused(load_job(path), "model.path")
    assert p.message == str(loader.value)
    assert p.message.startswith(f"{d}: weights do not fit this model: lm_head.weight differs from model.embed_tokens")
    assert only_line(run_cli("check", str(path))) == f"rlctl: error: {path}: model.path: {loader.value}"
    # those two tensors alone read, a block of rows of each at a time, to the last
    monkeypatch.setattr(tensors, "TIED_BLOCK_ROWS", 16)
    read: list[str] = []
    rows = tensors.CheckpointTensors.rows

    def recorded(self: tensors.CheckpointTensors, name: str, start: int, stop: int) -> torch.Tensor:
        read.append(name)
        return rows(self, name, start, stop)

    monkeypatch.setattr(tensors.CheckpointTensors, "rows", recorded)
    monkeypatch.setattr(tensors.CheckpointTensors, "__getitem__", None)  # no tensor read whole
    assert refused(load_job(path), "model.path") == [p]
    assert read == ["lm_head.weight", "model.embed_tokens.weight"] * 5


def test_check_reads_no_tensor_of_an_untied_model_nor_of_a_tied_one_without_lm_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, d = tied_job(tmp_path, layout="one-file")
    whole = weightfiles.load_state_dict(d)
    weightfiles.save_state_dict({k: v for k, v in whole.items() if k != "lm_head.weight"}, d)
    monkeypatch.setattr(tensors.CheckpointTensors, "rows", None)
    monkeypatch.setattr(tensors.CheckpointTensors, "__getitem__", None)
    assert problems(load_job(path)) == []
    untied = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    assert problems(untied) == []
