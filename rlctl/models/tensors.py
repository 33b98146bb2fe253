"""An HF checkpoint directory's tensors read one at a time: each from its weight file when it is asked for, in fp32,
and not kept.

    CheckpointTensors(dir)[name] ─▶ safe_open(its file).get_tensor(name)   (model.safetensors, or the index's shard)
                                 ─▶ torch.load(pytorch_model.bin, mmap=True)[name]

What a reader that cuts each tensor to its own part holds at once is that tensor, not the model: a megatron rank
resuming a checkpoint (`rlctl.checkpoint.trainer`) reads its shard so, versus `hf.load_state_dict`'s whole copy
of the model (70B in fp32: 280 GB on every rank of a node).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from rlctl.models import hf


class CheckpointTensors(Mapping[str, torch.Tensor]):
    """The tensors of the checkpoint in `directory` by name, each read when it is asked for (floating ones cast to
    fp32); `shapes` from the files' headers, nothing read. ConfigError as `hf.weight_files` and the header readers
    say it (no weights, a missing shard, a truncated file)."""

    def __init__(self, directory: str | Path) -> None:
        self._files: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._mapped: dict[str, torch.Tensor] = {}  # a pytorch_model.bin's tensors, mapped (read as they are used)
        for f in hf.weight_files(directory):
            if f.name == hf.TORCH_FILE:
                hf.torch_bin_header(f)  # refused in one line where torch cannot map it
                self._mapped = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
                header = {k: ("", tuple(v.shape)) for k, v in self._mapped.items()}
            else:
                header = hf.safetensors_header(f)
            for name, (_, shape) in header.items():
                self._files[name], self._shapes[name] = f, shape

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._mapped:
            t = self._mapped[name]
        else:
            from safetensors import safe_open

            with safe_open(str(self._files[name]), framework="pt") as f:
                t = f.get_tensor(name)
        return t.float() if t.is_floating_point() else t

    def __contains__(self, name: object) -> bool:  # (Mapping's reads the tensor)
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)
