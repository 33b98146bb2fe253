"""A pushed MoE's experts in vLLM 0.32 laid out as its first load lays them (`patch_expert_reload`).

vLLM's unquantized MoE layer readies its experts' tensors in `UnquantizedFusedMoEMethod._setup_kernel`:

    first load   kernel format (convert_to_unquantized_kernel_format), the MoE kernel built, then the experts' own
                 layout (`fused_experts.process_weights_after_loading`: the CPU kernel pads the intermediate width to
                 its block and prepacks for its grouped GEMM)
    a reload     kernel format again, the kernel kept — and the experts' own layout skipped, so vLLM's layerwise
                 reload copies checkpoint-layout experts into the prepacked storage: a pushed Qwen3MoE decodes tokens
                 that are no model's (its very own weights pushed back change them), or the push fails on the padded
                 width ("The size of tensor a (128) must match the size of tensor b (96)": 48 wide, padded to 64)

`patch_expert_reload` makes a reload lay the experts out as the first load did (a no-op for kernels that keep the
checkpoint's layout: the base `process_weights_after_loading` does nothing). vLLM 0.32 only: a release that lays them
out on reload itself would prepack twice (vllm-project/vllm#42821 and #48312 track this class of reload bug).
Every worker calls it before it loads a version (`rlctl.engines.vllm_transfer`, `rlctl.engines.vllm`).
"""

from __future__ import annotations

import threading
from typing import Any

PATCHED_VERSIONS = ("0.32.",)  # the vLLM releases whose reload skips the experts' layout (tests/vllm)
_lock = threading.Lock()
_patched = False


def patch_expert_reload() -> bool:
    """Make this process's vLLM lay out a reloaded MoE layer's experts as its first load does; True where it is
    patched (now or before), False for a vLLM it is not for (another release, or no such method)."""
    global _patched
    with _lock:
        if _patched:
            return True
        import vllm
        from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

        setup = getattr(UnquantizedFusedMoEMethod, "_setup_kernel", None)
        if setup is None or not str(vllm.__version__).startswith(PATCHED_VERSIONS):
            return False

        def setup_kernel(self: Any, layer: Any, w13: Any, w2: Any) -> None:
            reload = self.moe_kernel is not None  # (set by the first load's call)
            setup(self, layer, w13, w2)
            if reload:  # what the first load ran after building the kernel, skipped on a reload by vLLM 0.32
                self.moe_kernel.fused_experts.process_weights_after_loading(layer)

        UnquantizedFusedMoEMethod._setup_kernel = setup_kernel
        _patched = True
        return True
