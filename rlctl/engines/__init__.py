"""Generation engines: the interface (`base.py`), the embedded CPU engine and the optional vLLM one."""

from rlctl.engines.base import GenerationEngine, GenRequest, GenResult
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.engines.vllm import VllmEngine

ENGINES: dict[str, type[GenerationEngine]] = {"embedded": EmbeddedEngine, "vllm": VllmEngine}

__all__ = ["ENGINES", "EmbeddedEngine", "GenRequest", "GenResult", "GenerationEngine", "VllmEngine"]
