"""A command's reads of an HF model's directory (`rlctl.models.readonce`): `rlctl check` and `rlctl plan` read
config.json and each weight file's header once, and a directory rewritten between two reads is read again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlctl.models import hfdir
from rlctl.models.hf import read_config
from rlctl.models.hfdir import check_hf_dir
from rlctl.models.readonce import reads_once
from rlctl.models.tinygpt import TinyGPT
from tests.conftest import run_cli
from tests.unit.hf_checkpoints import config_reads
from tests.unit.ops.test_preflight import hf_dataset_job
from tests.unit.tiny_models import small_config


def header_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The weight files whose safetensors header `check_hf_dir` reads from now on, once per read."""
    reads: list[Path] = []
    read = hfdir.safetensors_header
    monkeypatch.setattr(hfdir, "safetensors_header", lambda f: reads.append(f) or read(f))
    return reads


@pytest.mark.parametrize(("command", "config_json"), [("check", 2), ("plan", 1)])
def test_a_command_reads_an_hf_models_config_and_headers_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, config_json: int
) -> None:
    """Versus 18 reads of config.json and 10 of the header for `rlctl check` (the job's load, then its architecture,
    context, window, memory, tied head, dataset each reading it), 8 and 7 for `rlctl plan`. (`check` reads
    config.json once more for the tokenizer's EOS: `rlctl.rl.tokenizer` reads it itself.)"""
    job = hf_dataset_job(tmp_path, positions=64, task={"max_prompt_tokens": 16, "max_output_tokens": 16})
    configs, headers = config_reads(monkeypatch), header_reads(monkeypatch)
    got = run_cli(command, str(job.path))
    assert got.exit_code == 0, got.stderr
    assert configs == [tmp_path / "model" / "config.json"] * config_json
    assert headers == [tmp_path / "model" / "model.safetensors"]
    assert run_cli(command, str(job.path)).exit_code == 0  # the next command reads them afresh
    assert len(configs) == 2 * config_json and len(headers) == 2


def test_a_directory_rewritten_between_reads_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a scope: config.json edited in place or replaced, weight files rewritten, each read anew, versus the first
    read's content kept; each caller its own copy of it; outside a scope every call reads."""
    d = tmp_path / "model"
    TinyGPT(small_config(positions=64)).save_pretrained(d)
    config = d / "config.json"
    configs = config_reads(monkeypatch)
    with reads_once():
        first = read_config(d)
        first.max_position_embeddings = 1  # (a caller's change is its own)
        assert read_config(d).max_position_embeddings == 64 and len(configs) == 1
        config.write_text(json.dumps(json.loads(config.read_text()) | {"max_position_embeddings": 128}))
        assert read_config(d).max_position_embeddings == 128
        swapped = d / "swapped.json"
        swapped.write_text(json.dumps(json.loads(config.read_text()) | {"max_position_embeddings": 256}))
        os.replace(swapped, config)  # (an atomic replace: the same size and maybe mtime, another inode)
        assert read_config(d).max_position_embeddings == 256
        assert check_hf_dir(d).arch.layers == 1
        TinyGPT(small_config(positions=256, layers=3)).save_pretrained(d)
        assert check_hf_dir(d).arch.layers == 3
    reads = len(configs)
    read_config(d), read_config(d)
    assert len(configs) == reads + 2
