"""The starting policy a launch builds from the user's checkpoint directory (model/init, staged to every host of
every site): the files the model is read from and everything beside them but weights in another format, which
nothing reads — a Mistral repo's consolidated.safetensors (a second ~14 GB copy at 7B), a pytorch_model.bin beside
the safetensors."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.config.model import HfModel
from rlctl.launch.jobdir import JobDir
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.ops.inputs import _starting_policy, unread_weights


def checkpoint(d: Path) -> Path:
    TinyGPT(TinyGPTConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2)).save_pretrained(d)
    for name, size in [("consolidated.safetensors", 4096), ("pytorch_model.bin", 2048), ("original.pth", 16)]:
        (d / name).write_bytes(b"\0" * size)
    (d / "tokenizer.model").write_bytes(b"sp")  # not weights: kept, whatever its suffix
    (d / "training_args.bin").write_bytes(b"x")
    return d


def test_weights_the_model_is_not_read_from_stay_out_of_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = checkpoint(tmp_path / "ckpt")
    unread = {"consolidated.safetensors", "pytorch_model.bin", "original.pth", "training_args.bin"}
    assert {f.name for f in unread_weights(src)} == unread
    jd = JobDir(tmp_path / "job")
    with caplog.at_level(logging.INFO, logger="rlctl.ops.inputs"):
        _starting_policy(jd, SimpleNamespace(model=HfModel(kind="hf", path=str(src))))  # type: ignore[arg-type]
    kept = {f.name for f in jd.init_model.iterdir()}
    assert kept == {f.name for f in src.iterdir()} - unread
    assert {"config.json", "model.safetensors", "tokenizer.model"} <= kept
    [line] = [r.getMessage() for r in caplog.records]
    assert "consolidated.safetensors, original.pth, pytorch_model.bin, training_args.bin not taken" in line, line
    assert line.endswith("the one the model is read from (model.safetensors)"), line


def test_a_directory_whose_weights_cannot_be_told_leaves_nothing_out(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "consolidated.safetensors").write_bytes(b"\0")  # no model.safetensors, index or pytorch_model.bin
    assert unread_weights(d) == set()


def test_a_mistral_repo_s_own_tokenizer_files_go_with_every_model_written_from_it(tmp_path: Path) -> None:
    """An export, a checkpoint's model and a pull carry the tokenizer files (`copy_tokenizer_files`): Mistral's
    tekken.json and tokenizer.model.v3 too, versus left behind (its own tokenizer gone from every model written)."""
    from rlctl.models.hfdir import copy_tokenizer_files

    src = checkpoint(tmp_path / "ckpt")
    for name in ("tekken.json", "tokenizer.model.v3"):
        (src / name).write_text("{}")
    copied = copy_tokenizer_files(src, tmp_path / "out")
    assert {"tekken.json", "tokenizer.model.v3", "tokenizer.model"} <= set(copied)
    assert (tmp_path / "out" / "tekken.json").read_text() == "{}"


def test_an_index_beside_the_one_weight_file_read_stays_out_with_its_shards(tmp_path: Path) -> None:
    """model.safetensors beside model.safetensors.index.json and its shards: rlctl (and transformers) read
    model.safetensors, so the shards stay out; the index must go with them, versus kept: vLLM reads the index's
    shards alone where a directory has one (weight_utils.filter_duplicate_safetensors_files), found none in the
    job's model/init and had no weights to load."""
    from rlctl.models import weightfiles

    src = tmp_path / "ckpt"
    model = TinyGPT(TinyGPTConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2))
    weightfiles.save_state_dict(model.state_dict(), tmp_path / "sharded", max_shard_bytes=1 << 16)
    model.save_pretrained(src)
    for f in (tmp_path / "sharded").iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    shards = {f.name for f in src.iterdir() if weightfiles.SHARD_RE.fullmatch(f.name)}
    assert len(shards) > 1 and weightfiles.weight_files(src) == [src / weightfiles.SAFETENSORS_FILE]
    jd = JobDir(tmp_path / "job")
    _starting_policy(jd, SimpleNamespace(model=HfModel(kind="hf", path=str(src))))  # type: ignore[arg-type]
    assert {f.name for f in unread_weights(src)} == shards | {weightfiles.INDEX_FILE}
    kept = {f.name for f in jd.init_model.iterdir()}
    assert weightfiles.SAFETENSORS_FILE in kept and not kept & (shards | {weightfiles.INDEX_FILE}), kept
    assert weightfiles.weight_files(jd.init_model) == [jd.init_model / weightfiles.SAFETENSORS_FILE]
