"""The embedded engine on CUDA: the checkpoint's dtype, every tensor on the device, decode steps as CUDA graphs."""

from pathlib import Path

import torch

from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.tinygpt import TinyGPT
from tests.gpu.conftest import CFG


def requests(n: int, new: int = 24) -> list[GenRequest]:
    return [
        GenRequest(f"r{i}", [1 + (i * 7 + j) % 500 for j in range(3 + i % 9)], new, ignore_eos=True) for i in range(n)
    ]


def test_logits_on_cuda_in_bf16_follow_the_cpu_in_fp32(checkpoint: Path) -> None:
    gpu = TinyGPT.from_pretrained(checkpoint, dtype=None, device="cuda")
    cpu = TinyGPT.from_pretrained(checkpoint)
    assert gpu.lm_head.weight.dtype == torch.bfloat16 and gpu.rope_cos.device.type == "cuda"
    x = torch.randint(0, 512, (4, 64))
    with torch.no_grad():
        a, b = gpu(x.cuda()).float().cpu(), cpu(x)
    assert (a - b).abs().max() < 0.05 * b.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.95


def test_graphs_replay_the_eager_steps(checkpoint: Path) -> None:
    """Replayed graphs of decode steps and prefills give the tokens of the same static-shape steps and prefills run
    eagerly (the code CI runs on the CPU); rows that end at different steps make admissions of a few rows."""
    reqs = [
        GenRequest(r.request_id, r.prompt_tokens, 8 + (5 * i) % 23, ignore_eos=True) for i, r in enumerate(requests(40))
    ]
    model = TinyGPT.from_pretrained(checkpoint, dtype=None, device="cuda")
    graphs = EmbeddedEngine(model, max_batch_size=8, temperature=1.0)
    eager = EmbeddedEngine(model, max_batch_size=8, temperature=1.0, static_shapes=True)
    eager._graphs = eager._prefill_graphs = None  # the same bucketed steps and prefills, launched kernel by kernel
    graphs.add(reqs)
    a = {r.request_id: r.output_tokens for r in graphs.run_until_done()}
    eager.add(reqs)
    b = {r.request_id: r.output_tokens for r in eager.run_until_done()}
    assert graphs._graphs is not None and graphs._graphs.captures > 0
    assert graphs._prefill_graphs is not None and graphs._prefill_graphs.captures > 0
    assert a == b


def test_graphs_of_greedy_rows_beside_sampled_ones_replay_the_eager_steps(checkpoint: Path) -> None:
    """A held-out evaluation's greedy requests (group −1) among sampled ones: the mixed step's own graphs give the
    tokens of the same steps run eagerly (that a greedy row gives the argmax is tested on the CPU, in fp32)."""
    reqs = requests(24)
    batch = [
        GenRequest(f"g{i}", r.prompt_tokens, r.max_new_tokens, group=-1, greedy=True) for i, r in enumerate(reqs[:8])
    ]
    batch += reqs[8:]
    model = TinyGPT.from_pretrained(checkpoint, dtype=None, device="cuda")
    graphs = EmbeddedEngine(model, max_batch_size=8, temperature=1.0)
    eager = EmbeddedEngine(model, max_batch_size=8, temperature=1.0, static_shapes=True)
    eager._graphs = eager._mixed_graphs = eager._prefill_graphs = None
    out = []
    for engine in (graphs, eager):
        engine.add(batch)
        out.append({r.request_id: r.output_tokens for r in engine.run_until_done()})
    assert graphs._mixed_graphs is not None and graphs._mixed_graphs.captures > 0
    assert out[0] == out[1]


def test_a_compiled_step_replays_in_graphs(checkpoint: Path) -> None:
    """`compile_step` on CUDA: the compiled step captured in graphs gives the tokens of the same compiled step run
    eagerly, and its first tokens' log-probs follow the uncompiled step's (bf16: fused kernels round otherwise)."""
    reqs = requests(12)
    model = TinyGPT.from_pretrained(checkpoint, dtype=None, device="cuda")
    out = {}
    for name, kw in (("graphs", {}), ("eager", {"static_shapes": True}), ("plain", {"static_shapes": True})):
        engine = EmbeddedEngine(model, max_batch_size=8, temperature=1.0, compile_step=name != "plain", **kw)
        if name != "graphs":
            engine._graphs = engine._prefill_graphs = None
        engine.add(reqs)
        out[name] = {r.request_id: r for r in engine.run_until_done()}
        if name == "graphs":
            assert engine._graphs is not None and engine._graphs.captures > 0
    assert {k: r.output_tokens for k, r in out["graphs"].items()} == {
        k: r.output_tokens for k, r in out["eager"].items()
    }
    g, p = out["graphs"], out["plain"]
    same = [k for k in p if g[k].output_tokens[0] == p[k].output_tokens[0]]  # a rounding may cross a draw's bound
    assert len(same) >= len(p) - 2, (len(same), len(p))
    assert max(abs(g[k].logprobs[0] - p[k].logprobs[0]) for k in same) < 0.05


def test_batch_independent_sampling_on_cuda(checkpoint: Path) -> None:
    model = TinyGPT.from_pretrained(checkpoint, dtype=torch.float32, device="cuda")
    reqs = requests(6)
    together = EmbeddedEngine(model, max_batch_size=6, temperature=1.0)
    together.add(reqs)
    got = {r.request_id: r.output_tokens for r in together.run_until_done()}
    for r in reqs[:3]:
        alone = EmbeddedEngine(model, max_batch_size=1, temperature=1.0)
        alone.add([r])
        assert alone.run_until_done()[0].output_tokens == got[r.request_id]


def test_weights_load_in_place_under_graphs(checkpoint: Path) -> None:
    torch.manual_seed(1)
    new = TinyGPT(CFG).hf_weights(torch.bfloat16)
    engine = EmbeddedEngine(TinyGPT.from_pretrained(checkpoint, dtype=None, device="cuda"), temperature=0.0)
    engine.add(requests(4, new=8))
    before = {r.request_id: r.output_tokens for r in engine.run_until_done()}
    engine.load_weights(new, 1)  # host tensors, copied into the parameters the captured graphs read
    engine.add(requests(4, new=8))
    after = {r.request_id: r.output_tokens for r in engine.run_until_done()}
    fresh = EmbeddedEngine(TinyGPT.from_pretrained(checkpoint, dtype=None, device="cuda"), temperature=0.0)
    fresh.load_weights(new, 1)
    fresh.add(requests(4, new=8))
    assert after != before and after == {r.request_id: r.output_tokens for r in fresh.run_until_done()}
