"""Pipeline parallel's overlap on the megatron backend: one GRPO cut's forward + backward at pp 1, pp 2 stage by
stage and pp 2 in chunks (rlctl.trainers.megatron.pipeline), timed in the same run.

    pp1             one gloo rank on core 0, the whole model
    pp2 stage-by-stage   two ranks, one stage each on its own core, the cut as one chunk (m = 1)
    pp2 chunked          the same two ranks, the cut in m = rl.cuts.pipeline_chunks(rows, 2) chunks

The model is a Llama-style TinyGPT checkpoint large enough that compute dominates the messages (10.2M
parameters, 4 layers; 2.8M with --quick); the cut is `ROWS` samples of prompt + output tokens, trained as the
learner's `backward_share` does (`policy_loss` with a token-sum loss, then `backward`). Each timing is the
slowest rank's wall time of one step, after a barrier; the two pp 2 schedules alternate in one process group, so
they share the machine's noise, and the figure is the median over the repeats. `chunked_over_stage_by_stage`
is the overlap's gain; `planned` is what the planner's trainer time charges (rlctl.planner.costs: compute ×
(1 + (pp − 1)/m), over pp stages). Nothing here is asserted: on a shared 2-core machine the figures move.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rlctl.exits import end_after, end_without_finalization
from rlctl.rl.cuts import pipeline_chunks

ROWS = 8  # samples in the cut (the learner's micro_batch_samples), on one data-parallel rank
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 96
MODEL = {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 6}
QUICK_MODEL = {"hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 3}
SCHEDULES = {1: ["pp1"], 2: ["pp2_stage_by_stage", "pp2_chunked"]}  # by pipeline parallel


def run(*, quick: bool) -> dict[str, Any]:
    repeats = 3 if quick else 7
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-pp-") as tmp:
        ckpt = _checkpoint(Path(tmp) / "model", QUICK_MODEL if quick else MODEL)
        step_s: dict[str, list[float]] = {}
        losses: dict[str, float] = {}
        for pp in (1, 2):
            for rank_out in _spawn(pp, Path(tmp), ckpt, repeats):
                step_s.update(rank_out["step_s"])
                losses.update(rank_out["loss"])
    median = {k: statistics.median(v) for k, v in step_s.items()}
    m = pipeline_chunks(ROWS, 2)
    return {
        "model_params": _params(QUICK_MODEL if quick else MODEL),
        "rows": ROWS,
        "tokens_per_row": PROMPT_TOKENS + OUTPUT_TOKENS,
        "chunks": m,
        "repeats": repeats,
        "step_s": median,
        "step_s_all": step_s,
        "chunked_over_stage_by_stage": median["pp2_chunked"] / median["pp2_stage_by_stage"],
        "pp2_chunked_over_pp1": median["pp2_chunked"] / median["pp1"],
        "pp2_stage_by_stage_over_pp1": median["pp2_stage_by_stage"] / median["pp1"],
        # the planner's compute at pp 2 against pp 1: (1 + (pp − 1)/m) / pp
        "planned": {"pp2_chunked_over_pp1": (1 + 1 / m) / 2, "pp2_stage_by_stage_over_pp1": 1.0},
        "loss_max_abs_diff": max(abs(v - losses["pp1"]) for v in losses.values()),
    }


def summary(result: dict[str, Any]) -> str:
    s, p, r = result["step_s"], result["planned"], result
    return "\n".join(
        [
            f"  one GRPO cut ({r['rows']} rows × {r['tokens_per_row']} tokens, "
            f"{r['model_params'] / 1e6:.1f}M parameters), fwd + bwd, median of {r['repeats']}:",
            f"  pp1                 {s['pp1']:.3f} s",
            f"  pp2 stage by stage  {s['pp2_stage_by_stage']:.3f} s  ({r['pp2_stage_by_stage_over_pp1']:.2f} × pp1;"
            f" planned {p['pp2_stage_by_stage_over_pp1']:.2f})",
            f"  pp2 chunked (m {r['chunks']})   {s['pp2_chunked']:.3f} s  ({r['pp2_chunked_over_pp1']:.2f} × pp1;"
            f" planned {p['pp2_chunked_over_pp1']:.3f})",
            f"  chunked / stage by stage: {result['chunked_over_stage_by_stage']:.3f}"
            f"   (losses within {result['loss_max_abs_diff']:.1e})",
        ]
    )


def _params(spec: dict[str, int]) -> int:
    from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

    return sum(p.numel() for p in TinyGPT(_config(spec, TinyGPTConfig)).parameters())


def _config(spec: dict[str, int], cls: Any) -> Any:
    return cls(
        vocab_size=1024,
        num_key_value_heads=spec["num_attention_heads"],
        max_position_embeddings=PROMPT_TOKENS + OUTPUT_TOKENS,
        rope_fp64_angles=False,
        **spec,
    )


def _checkpoint(path: Path, spec: dict[str, int]) -> Path:
    from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

    torch.manual_seed(0)
    return TinyGPT(_config(spec, TinyGPTConfig)).save_pretrained(path)


def _spawn(pp: int, tmp: Path, ckpt: Path, repeats: int) -> list[dict[str, Any]]:
    """Run the `pp` ranks (one per core); each writes its timings as JSON."""
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)  # this repository first
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    rendezvous, outs = tmp / f"pp{pp}.rendezvous", [tmp / f"pp{pp}-{r}.json" for r in range(pp)]
    head = [sys.executable, "-m", "bench.pipeline_parallel", "rank"]
    procs = [
        subprocess.Popen(
            [*head, str(r), str(pp), str(rendezvous), str(ckpt), str(outs[r]), str(repeats)],
            env=env,
            cwd=root,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(pp)
    ]
    errors = [p.communicate(timeout=1800)[1] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("pipeline-parallel rank failed:\n" + "\n".join(e[-3000:] for e in errors))
    return [json.loads(o.read_text()) for o in outs]


def _rank(rank: int, pp: int, rendezvous: Path, ckpt: Path, out: Path, repeats: int) -> None:
    """One rank: the megatron backend's stage of `ckpt`, the cut trained `repeats` times per schedule (after one
    untimed step each)."""
    import torch.distributed as dist

    from rlctl.rl.grpo import policy_loss
    from rlctl.trainers.base import load_backend
    from rlctl.trainers.megatron.backend import MegatronBackend

    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=pp)
    backend = load_backend("megatron", ckpt, pp=pp)
    assert isinstance(backend, MegatronBackend)
    batch = _cut(backend.config.vocab_size)
    step_s: dict[str, list[float]] = {s: [] for s in SCHEDULES[pp]}
    loss: dict[str, float] = {}
    models = {s: _Schedule(backend.model, chunks=1 if s.endswith("stage_by_stage") else None) for s in step_s}
    for i in range(repeats + 1):
        for name, model in models.items():
            backend.model.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            value, _ = policy_loss(model, batch, 0.2, normaliser=1.0)
            value.backward()
            elapsed = torch.tensor(time.perf_counter() - t0)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when its slowest rank does
            if i > 0:
                step_s[name].append(float(elapsed))
            loss[name] = float(value)
    out.write_text(json.dumps({"step_s": step_s, "loss": loss} if rank == 0 else {"step_s": {}, "loss": {}}))
    dist.destroy_process_group()


def _cut(vocab_size: int) -> Any:
    """`ROWS` samples of a GRPO cut: random tokens, behaviour log-probs near the model's, advantages ±1."""
    from rlctl.rl.samples import Sample, make_batch

    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(
            f"p{i // 4}",
            torch.randint(3, vocab_size, (PROMPT_TOKENS,), generator=g).tolist(),
            torch.randint(3, vocab_size, (OUTPUT_TOKENS,), generator=g).tolist(),
            [-float(torch.log(torch.tensor(vocab_size)))] * OUTPUT_TOKENS,
            reward=float(i % 2),
        )
        for i in range(ROWS)
    ]
    return make_batch(samples, [1.0 if i % 2 else -1.0 for i in range(ROWS)])


class _Schedule(torch.nn.Module):
    """The policy's forward with a forced chunk count (None: the runtime's rule; 1: stage by stage)."""

    def __init__(self, policy: Any, *, chunks: int | None) -> None:
        super().__init__()
        self.policy, self.chunks = policy, chunks

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        from rlctl.trainers.megatron import pipeline

        if self.policy.stage.count == 1:
            out: torch.Tensor = self.policy(tokens)
            return out
        b, t = tokens.shape
        positions = torch.arange(t).expand(b, t)
        policy = self.policy
        return pipeline.forward(
            policy.gpt,
            policy.stage,
            tokens,
            positions,
            hidden=policy.config.hidden_size,
            width=policy.config.vocab_size,
            chunks=self.chunks,
        )


def _rank_main(a: list[str]) -> int:
    """A rank's entry: its timings written (or its error said), it ends without the interpreter's finalization
    (`rlctl.exits`: the rank's -6 otherwise)."""
    _rank(int(a[0]), int(a[1]), Path(a[2]), Path(a[3]), Path(a[4]), int(a[5]))
    return 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "rank":
    end_after(lambda: _rank_main(sys.argv[2:]), end=end_without_finalization)
