"""The one place where megatron-core is made to run without CUDA (the CPU path and the tests).

megatron-core 0.16.1 with the local layer spec and `use_cpu_initialization` builds on CPU, but its
forward still asks CUDA for things it does not need there:

    RotaryEmbedding.get_emb            inv_freq.to(torch.cuda.current_device())      every forward
    YarnRotaryEmbedding (RoPE 'yarn')  the same, as it is built and every forward
    tensor_parallel gather/all-gather  torch.empty(…, device=torch.cuda.current_device())  tp > 1, parallel_output=False
    CudaRNGStatesTracker.fork          torch.cuda.get_rng_state()/set_rng_state()    around attention dropout
    LanguageModule.setup_embeddings…   weight.data.cuda() before the embedding group's all-reduce   pp > 1, tied

`on_cpu()` answers `torch.cuda.current_device()` with "cpu" and makes `Tensor.cuda()` return the tensor
itself for the duration of a megatron call (when CUDA is unavailable, or the call's model computes on the CPU
of a machine that has CUDA: a `gpu: CPU` site's trainer on a GPU host), and `install_rng_tracker()`
puts a tracker whose `fork` does nothing in place of megatron's CUDA RNG tracker: every dropout is 0 in
rlctl's config, so no random number is drawn inside a fork. Megatron's local DotProductAttention, which
would also ask CUDA for its score buffer (`GlobalMemoryBuffer`) and for a default causal mask, is not in
rlctl's layer spec (`attention.py` runs SDPA, causal without a mask). Nothing else is patched; on a machine
with CUDA neither function changes anything.

Exercised on CPU with it: tp = 1, tp = 2, pp = 2 and tp 2 × pp 2 over gloo, in the tests and in jobs
(`trainer.tensor_parallel`, `trainer.pipeline_parallel`): GPTModel stages built with pre/post_process, the
tied embedding's copy on the last stage. Not exercised without a GPU: megatron's DDP wrapper and distributed
optimizer (they allocate CUDA buffers), Transformer Engine layers, fused kernels, CUDA graphs, and megatron's
pipeline schedules and p2p communication (`forward_backward_pipelining_*`, `p2p_communication`: rlctl chains
the stages itself, `pipeline.py`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

_lock = threading.Lock()
_depth = 0  # nesting of on_cpu() blocks, over all threads
_saved_current_device: Callable[[], Any] = torch.cuda.current_device
_saved_tensor_cuda: Callable[..., Any] = torch.Tensor.cuda


def needs_shim() -> bool:
    return not torch.cuda.is_available()


@contextlib.contextmanager
def on_cpu(device: torch.device | None = None) -> Iterator[None]:
    """Run a megatron-core call on CPU: `torch.cuda.current_device()` returns "cpu" and `Tensor.cuda()` the
    tensor itself inside (re-entrant; restored when the outermost block exits). `device`: where the call's model
    computes; a no-op when it is a CUDA device, or not given and CUDA is available (else megatron's rotary table
    would move to cuda:0, beside a CPU model's activations)."""
    global _depth, _saved_current_device, _saved_tensor_cuda
    if not needs_shim() and (device is None or device.type != "cpu"):
        yield
        return
    with _lock:
        if _depth == 0:
            _saved_current_device, _saved_tensor_cuda = torch.cuda.current_device, torch.Tensor.cuda
            torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
            torch.Tensor.cuda = _stay_on_cpu  # type: ignore[method-assign,assignment]
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.cuda.current_device = _saved_current_device
                torch.Tensor.cuda = _saved_tensor_cuda  # type: ignore[method-assign]


def _stay_on_cpu(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
    del args, kw
    return self


def _cpu_device() -> str:
    return "cpu"


def install_rng_tracker() -> None:
    """Replace megatron's CUDA RNG tracker by one whose `fork` is a no-op (CPU only; idempotent)."""
    if not needs_shim():
        return
    from megatron.core.tensor_parallel import random

    if isinstance(random._CUDA_RNG_STATE_TRACKER, _NoForkTracker):
        return

    random._CUDA_RNG_STATE_TRACKER = _NoForkTracker()
    random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


class _NoForkTracker:
    """Megatron's tracker interface without CUDA RNG states: dropout is off, so nothing is forked."""

    def is_initialized(self) -> bool:
        return True

    def get_states(self) -> dict[str, Any]:
        return {}

    def set_states(self, states: dict[str, Any]) -> None:
        del states

    def add(self, name: str, seed: int) -> None:
        del name, seed

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        del name
        yield
