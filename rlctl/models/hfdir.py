"""An HF checkpoint directory as a whole: writing one (`write_pretrained`: weights, config.json, the tokenizer files
`copy_tokenizer_files` carries) and checking one without loading a tensor (`check_hf_dir`, what `rlctl check` runs), but
a tied model's lm_head and embedding where the files hold both (`tied_head_refusal`).

    <dir>/config.json                   HF keys (`rlctl.models.hf`: anything the model would compute otherwise, refused)
    <dir>/model.safetensors, …          the weights (`rlctl.models.weightfiles`), named as `rlctl.models.hfnames` says
    <dir>/tokenizer.json, …             never read; `copy_tokenizer_files` carries them to a new directory

Torch is imported only where tensors are read or written, so `check_hf_dir` (config, and weight
names and shapes read from the safetensors headers) can run without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.errors import ConfigError
from rlctl.models.catalog import ModelArch
from rlctl.models.hf import CONFIG_FILE, TinyGPTConfig, read_config
from rlctl.models.hfnames import fused_for_file, match_weights
from rlctl.models.readonce import dir_stamp, kept
from rlctl.models.weightfiles import TORCH_FILE, safetensors_header, save_state_dict, torch_bin_header, weight_files

if TYPE_CHECKING:
    import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tokenizer.model.v3",  # Mistral's own tokenizer files, beside its tokenizer.json
    "tekken.json",
    "chat_template.jinja",
    "generation_config.json",
)
TOKENIZER_DIRS = ("additional_chat_templates",)  # transformers' named chat templates (its default.jinja: the one used)
_ST_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def write_pretrained(
    directory: str | Path,
    sd: Mapping[str, torch.Tensor],
    config: TinyGPTConfig,
    *,
    tokenizer_from: str | Path | None = None,
    max_shard_bytes: int | None = None,
    declared_dtype: str | None = None,
) -> Path:
    """An HF checkpoint directory: the model's weights `sd` (as a file holds them: `fused_for_file`; `save_state_dict`),
    config.json naming their dtype (or `declared_dtype`: the dtype the model is to be loaded and served in, for weights
    kept at a higher precision), and the tokenizer files of checkpoint `tokenizer_from` when given. What every
    `save_pretrained` writes."""
    d = Path(directory)
    save_state_dict(fused_for_file(sd, config), d, max_shard_bytes=max_shard_bytes)
    dtype = next((t.dtype for t in sd.values() if t.is_floating_point()), None)
    name = declared_dtype or (str(dtype).removeprefix("torch.") if dtype is not None else "float32")
    (d / CONFIG_FILE).write_text(json.dumps({**config.to_hf(), "torch_dtype": name}, indent=2) + "\n")
    if tokenizer_from is not None:
        copy_tokenizer_files(tokenizer_from, d)
    return d


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy the tokenizer (and generation-config) files of checkpoint `src` into `dst`; their names."""
    s, d = Path(src), Path(dst)
    if s.resolve() == d.resolve():
        return []
    d.mkdir(parents=True, exist_ok=True)
    copied = [n for n in TOKENIZER_FILES if (s / n).is_file()]
    for n in copied:
        shutil.copyfile(s / n, d / n)
    for n in TOKENIZER_DIRS:  # (a checkpoint without them rendered another template than its starting model's)
        if (s / n).is_dir():
            shutil.copytree(s / n, d / n, dirs_exist_ok=True)
            copied.append(n)
    return copied


# ---- the check `rlctl check` runs ----
@dataclass(frozen=True)
class HfModelInfo:
    """What `check_hf_dir` found: the validated config, the planner figures and the weight files."""

    path: Path
    config: TinyGPTConfig
    arch: ModelArch
    weight_files: list[Path] = field(default_factory=list)
    tokenizer_files: list[str] = field(default_factory=list)

    @property
    def weight_file_bytes(self) -> int:
        """The weight files' bytes as they are on disk, what staging copies: `arch.weight_bytes` is the declared
        dtype's (the wire, the engines, memory), and an rlctl checkpoint declares the job's dtype while it holds
        fp32 tensors (an unsharded trainer's master weights: twice a bf16 job's figure)."""
        return sum(f.stat().st_size for f in self.weight_files)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_id_hint(given: str, directory: Path) -> str | None:
    """What to do about a model.path (`given`, resolved to `directory`) that does not exist and reads as a Hugging Face
    Hub id (`Qwen/Qwen2.5-0.5B`): rlctl reads a local directory and downloads nothing, so name the id's snapshot in the
    local Hub cache where it is there, else how to download it."""
    if not _HUB_ID.fullmatch(given) or os.path.isdir(directory.parent):  # (a local path or its typo: `models/lama`)
        return None
    # where huggingface_hub keeps it (its constants): HF_HUB_CACHE, the older HUGGINGFACE_HUB_CACHE, HF_HOME/hub,
    # else $XDG_CACHE_HOME (~/.cache)/huggingface/hub
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    repo = Path(hub) / f"models--{given.replace('/', '--')}"
    ref = repo / "refs" / "main"
    snapshots = sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())
    if ref.is_file() and (repo / "snapshots" / ref.read_text().strip()).is_dir():
        snapshots = [repo / "snapshots" / ref.read_text().strip()]
    if len(snapshots) == 1:
        return (
            f"{given!r} reads as a Hub id, which rlctl does not download; the local Hub cache holds it: {snapshots[0]}"
        )
    return (
        f"{given!r} reads as a Hub id, which rlctl does not download: give a local directory, e.g. "
        f"`hf download {given} --local-dir DIR` where the Hub is reachable"
    )


def check_hf_dir(directory: str | Path, *, name: str | None = None) -> HfModelInfo:
    """Validate an HF checkpoint directory without loading tensors: config.json (supported
    architecture and options), the weight files, and every tensor's name, shape and dtype (from
    the safetensors headers). Raises ConfigError (one line: file, key, what is supported).
    `name` names the ModelArch (default: the directory's name). Read once in a command's `reads_once` scope while
    the directory's files are unchanged."""
    d = Path(directory)
    try:
        if not d.is_dir():
            said = "not a directory" if d.exists() else "no such directory"
            raise ConfigError(str(d), None, f"{said} (a Hugging Face checkpoint directory is expected)")
        key = ("hf_dir", str(d.absolute()), name, dir_stamp(d))  # (in a command's scope: read once, unchanged)
        return kept(key, lambda: _check_hf_dir(d, name))
    except OSError as e:  # a directory this user may not read, a file that went away
        raise ConfigError(str(d), None, f"cannot read: {e.strerror or e}") from e


def _check_hf_dir(d: Path, name: str | None) -> HfModelInfo:
    config = read_config(d)
    files = weight_files(d)
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        header = torch_bin_header(f) if f.name == TORCH_FILE else safetensors_header(f)
        for tensor, (dtype, shape) in header.items():
            if dtype not in _ST_DTYPES:
                raise ConfigError(
                    str(f), None, f"tensor {tensor}: dtype {dtype} is not supported; supported: F32, BF16, F16"
                )
            shapes[tensor] = shape
    match_weights(shapes, config, where=str(d))
    tokenizer = [n for n in TOKENIZER_FILES if (d / n).is_file()]
    return HfModelInfo(d, config, config.arch(name or d.resolve().name), files, tokenizer)


def tied_head_refusal(directory: str | Path) -> str | None:
    """Why a model of tie_word_embeddings: true cannot load the checkpoint in `directory`, the line the loader refuses
    it in at launch (`tensors.check_tied`, said as `TinyGPT.from_pretrained` says it): its files hold an lm_head.weight
    other than its model.embed_tokens.weight. Those two tensors are read (`tensors.check_tied_files`), where the
    config ties them and the files hold an lm_head; None where nothing is wrong, or the model is not tied."""
    if not read_config(directory).tie_word_embeddings:
        return None
    from rlctl.models.tensors import CheckpointTensors, DoesNotFit, check_tied_files

    try:
        check_tied_files(CheckpointTensors(directory))
    except DoesNotFit as e:
        return f"{directory}: {e}"
    return None
