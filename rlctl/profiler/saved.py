"""The bytes a forward keeps for its backward, counted as it runs: what `rlctl.profiler.actmem`'s formula prices,
measured (tests/unit/profiler/test_actmem.py holds the formula to it; bench/gpu_actmem.py reports it on a CPU).

    with count_saved(model) as saved:
        loss = loss_of(model, batch)
    loss.backward()
    saved.nbytes    # each storage once (a view of one already saved is not counted again)

The model's parameters and buffers are left out: they are held whether or not a step runs. Autocast's bf16 copies
of them are new storages, and are counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class SavedBytes:
    """The storages saved for backward, by address, less those of `fixed_ptrs` (the model's own)."""

    def __init__(self, fixed_ptrs: set[int]) -> None:
        self._fixed = fixed_ptrs
        self._storages: dict[int, int] = {}

    @property
    def nbytes(self) -> int:
        return sum(self._storages.values())

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in self._fixed:
            self._storages[s.data_ptr()] = s.nbytes()
        return t


@contextmanager
def count_saved(model: torch.nn.Module) -> Iterator[SavedBytes]:
    """Counts what autograd saves for backward inside the block (`torch.autograd.graph.saved_tensors_hooks`, the
    tensors kept as they are), less `model`'s parameters and buffers as they are on entry."""
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved = SavedBytes(fixed)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, _unpack):
        yield saved


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t
