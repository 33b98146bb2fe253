"""A rollout unit's start imports what generating needs and no more: not torch's compiler stack (torch._dynamo,
sympy) nor DTensor (torch.distributed.tensor), which its model's construction on the meta device and the weight
plane's FSDP checks pulled in — about 3 s of CPU per unit on 2 cores (every `scale +1`, every replacement)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("torch._dynamo", "torch.distributed.tensor", "sympy")


def test_a_rollout_units_imports_and_empty_model_leave_the_compiler_stack_unloaded() -> None:
    code = (
        "import sys, torch\n"
        "import rlctl.agents.rollout\n"
        "from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig\n"
        "m = TinyGPT.empty(TinyGPTConfig(tie_word_embeddings=True), dtype=torch.bfloat16, device='cpu')\n"
        "assert m.lm_head.weight is m.model.embed_tokens.weight and m.rope_cos.dtype == torch.bfloat16\n"
        "assert m.lm_head.weight.dtype == torch.bfloat16 and m.rope_cos.shape[0] == m.config.max_position_embeddings\n"
        f"print(sorted(name for name in {HEAVY!r} if name in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_model_built_empty_initialises_its_parameters_when_built_normally_again() -> None:
    """The initialisers are skipped only inside `empty` (they are restored after it)."""
    import torch

    from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

    TinyGPT.empty(TinyGPTConfig(), dtype=torch.float32, device="cpu")
    torch.manual_seed(0)
    a = TinyGPT(TinyGPTConfig())
    torch.manual_seed(0)
    b = TinyGPT(TinyGPTConfig())
    w, std = a.model.embed_tokens.weight, a.config.initializer_range
    assert torch.equal(w, b.model.embed_tokens.weight) and 0.5 * std < float(w.detach().std()) < 2 * std
