"""Generation engines: the interface (`base.py`), the embedded CPU engine and the optional vLLM one.

Importing this package is cheap (no torch): build engines with `make_engine(kind, …)` (factory.py).
The classes are still reachable here (`rlctl.engines.EmbeddedEngine`, …), imported on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlctl.engines.factory import ENGINE_BUILDERS, make_engine, vllm_available

if TYPE_CHECKING:
    from rlctl.engines.base import GenerationEngine, GenRequest, GenResult
    from rlctl.engines.embedded import EmbeddedEngine
    from rlctl.engines.vllm import VllmEngine

    ENGINES: dict[str, type[GenerationEngine]]

_LAZY = {
    "GenerationEngine": "rlctl.engines.base",
    "GenRequest": "rlctl.engines.base",
    "GenResult": "rlctl.engines.base",
    "EmbeddedEngine": "rlctl.engines.embedded",
    "VllmEngine": "rlctl.engines.vllm",
}


def __getattr__(name: str) -> Any:
    if name == "ENGINES":  # kind -> class (imports both modules, and torch; not vllm itself)
        return {"embedded": __getattr__("EmbeddedEngine"), "vllm": __getattr__("VllmEngine")}
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENGINES",
    "ENGINE_BUILDERS",
    "EmbeddedEngine",
    "GenRequest",
    "GenResult",
    "GenerationEngine",
    "VllmEngine",
    "make_engine",
    "vllm_available",
]
