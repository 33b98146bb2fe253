"""Counting the operators a piece of torch code dispatches: a proxy for the kernels it launches.

A decode step of a small model on a GPU is bound by its kernels' count, not their work (docs/gpu.md), and a
count, unlike a time, is the same on any machine: so the CPU can say how a change moves it. View and
metadata operators (no kernel) are left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

# operators that return views or only change metadata: no kernel
VIEW_OPS = frozenset(
    [
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "transpose",
        "t",
        "permute",
        "expand",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "as_strided",
        "alias",
        "detach",
        "lift_fresh",
    ]
)


class OpCount(TorchDispatchMode):
    """Inside `with OpCount() as c:` every dispatched operator but views is counted in `c.ops` by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name not in VIEW_OPS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def ops_of(fn: Callable[[], object]) -> Counter[str]:
    """The operators `fn()` dispatches, by name (views left out)."""
    with OpCount() as count:
        fn()
    return count.ops
