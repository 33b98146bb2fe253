"""The weight files of an HF checkpoint directory: which they are (`weight_files`), their tensors' names, dtypes and
shapes read from their headers without reading a tensor (`safetensors_header`, `torch_bin_header`), and reading and
writing a state dict as them (`load_state_dict`, `save_state_dict`).

    <dir>/model.safetensors             one weight file, or
    <dir>/model.safetensors.index.json  {"weight_map": {tensor: shard}} + model-0000i-of-0000n.safetensors
    <dir>/pytorch_model.bin             only where the `safetensors` package is missing (weights_only load)

Torch is imported only where tensors are read or written, so that the headers can be read without it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.errors import ConfigError

if TYPE_CHECKING:
    import torch

SAFETENSORS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_MAX_HEADER_BYTES = 100 << 20


def weight_files(directory: str | Path) -> list[Path]:
    """The weight files of a checkpoint directory: [model.safetensors], the index's shards, or
    [pytorch_model.bin]. ConfigError when there are none or a shard is missing."""
    d = Path(directory)
    if (d / SAFETENSORS_FILE).exists():
        return [d / SAFETENSORS_FILE]
    if (d / INDEX_FILE).exists():
        shards = sorted(set(_weight_map(d).values()))
        for s in shards:
            if not (d / s).exists():
                raise ConfigError(str(d / INDEX_FILE), "weight_map", f"shard {s} is missing from {d}")
        return [d / s for s in shards]
    if (d / TORCH_FILE).exists():
        return [d / TORCH_FILE]
    raise ConfigError(str(d), None, f"no weights: expected {SAFETENSORS_FILE}, {INDEX_FILE} + shards, or {TORCH_FILE}")


def _weight_map(d: Path) -> dict[str, str]:
    try:
        wm = json.loads((d / INDEX_FILE).read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(str(d / INDEX_FILE), "weight_map", f"unreadable: {e}") from e
    if not isinstance(wm, dict) or not all(isinstance(v, str) and "/" not in v for v in wm.values()):
        raise ConfigError(str(d / INDEX_FILE), "weight_map", "not a map of tensor name → shard file in this directory")
    return wm


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name → (dtype, shape) from a .safetensors file's JSON header, without reading tensors.
    The header's data offsets are checked against the file's size, so that a truncated copy is refused
    here (check, launch) rather than by safetensors in the trainer."""
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= _MAX_HEADER_BYTES:
                raise ValueError(f"header length {n}")
            header = json.loads(f.read(n))
            data_bytes = os.fstat(f.fileno()).st_size - 8 - n
        header.pop("__metadata__", None)
        tensors = {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()}
        end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ConfigError(str(path), None, f"not a safetensors file: {e}") from e
    if end != data_bytes:
        what = "truncated" if end > data_bytes else "not a whole safetensors file"
        declared = f"its header declares {end} bytes of tensor data, the file holds {data_bytes}"
        raise ConfigError(str(path), None, f"{what}: {declared}; copy the checkpoint again")
    return tensors


_TORCH_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def torch_bin_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name → (dtype, shape) of a pytorch_model.bin, mapped, not read (`torch.load(mmap=True)`): a truncated
    or damaged copy is refused here (check, launch) rather than by torch in the trainer, as a safetensors file's is
    (`safetensors_header`). One saved in torch's pre-1.6 format cannot be mapped: it is refused, naming the fix."""
    import torch

    try:
        sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # whatever torch says of a file it cannot read is the one line said
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            str(path),
            None,
            f"cannot read it as a PyTorch state dict ({why}); copy the checkpoint again, or save it "
            "as safetensors (model.save_pretrained(DIR, safe_serialization=True))",
        ) from e
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ConfigError(str(path), None, "not a state dict (tensor name → tensor)")
    return {str(k): (_TORCH_DTYPES.get(str(v.dtype).removeprefix("torch."), str(v.dtype)), tuple(v.shape))
            for k, v in sd.items()}  # fmt: skip


def load_state_dict(directory: str | Path, *, to_fp32: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in `directory` (one file or all shards); floating tensors
    cast to fp32 unless `to_fp32=False`."""
    import torch

    sd: dict[str, torch.Tensor] = {}
    for f in weight_files(directory):
        if f.name == TORCH_FILE:
            sd.update(torch.load(f, map_location="cpu", weights_only=True))
            continue
        try:
            from safetensors.torch import load_file
        except ImportError as e:
            raise ConfigError(str(f), None, "reading it needs the safetensors package: pip install safetensors") from e
        sd.update(load_file(str(f)))
    if to_fp32:
        sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
    return sd


def save_state_dict(
    sd: Mapping[str, torch.Tensor], directory: str | Path, *, max_shard_bytes: int | None = None
) -> list[Path]:
    """Write `sd` as model.safetensors, or as HF shards + index when it exceeds `max_shard_bytes`
    (without the `safetensors` package: one pytorch_model.bin). Earlier weight files are removed so
    the directory never holds two checkpoints. Returns the files written."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for old in [
        d / SAFETENSORS_FILE,
        d / INDEX_FILE,
        d / TORCH_FILE,
        *(p for p in d.iterdir() if SHARD_RE.fullmatch(p.name)),
    ]:
        old.unlink(missing_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in sd.items()}
    try:
        from safetensors.torch import save_file
    except ImportError:
        import torch

        torch.save(tensors, d / TORCH_FILE)
        return [d / TORCH_FILE]
    shards = _pack(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(tensors, str(d / SAFETENSORS_FILE), metadata={"format": "pt"})
        return [d / SAFETENSORS_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, keys in zip(names, shards, strict=True):
        save_file({k: tensors[k] for k in keys}, str(d / name), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
        "weight_map": {k: name for name, keys in zip(names, shards, strict=True) for k in keys},
    }
    (d / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return [d / n for n in names]


def _pack(tensors: Mapping[str, torch.Tensor], max_shard_bytes: int | None) -> list[list[str]]:
    """Tensor names in order, cut into shards of ≤ max_shard_bytes (a larger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    used = 0
    for k, t in tensors.items():
        size = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(k)
        used += size
    return shards
