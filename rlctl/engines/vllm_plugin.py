"""vLLM's `vllm.general_plugins` entry point (pyproject): registers rlctl's weight-transfer backend in every
vLLM process — the engine's and, at tensor parallel > 1, each worker's — before its workers build their
weight-transfer engines. Cheap and idempotent (vLLM may load plugins more than once), and a no-op on a vLLM
without the weight-transfer API; imports nothing of rlctl's engine until vLLM builds the backend."""

from __future__ import annotations

BACKEND = "rlctl"  # WeightTransferConfig(backend=…)


def register() -> bool:
    """Register the backend with this process's vLLM; True when the installed vLLM has the weight-transfer
    API (`start_weight_update` → `update_weights` → `finish_weight_update`), False when it has not."""
    try:
        from vllm.distributed.weight_transfer.base import WeightTransferEngine
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        from vllm.model_executor.model_loader.reload import (  # noqa: F401  (what the backend runs)
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
    except ImportError:
        return False
    if not hasattr(WeightTransferEngine, "start_weight_update"):  # the two-phase API of older releases
        return False
    try:  # never in the way of a vLLM process that does not use it
        if BACKEND not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(BACKEND, "rlctl.engines.vllm_transfer", "RlctlWeightTransfer")
    except Exception:  # noqa: BLE001 - a vLLM whose registry differs: rlctl reloads weights instead
        return False
    return True
