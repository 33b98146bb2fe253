"""The embedded engine's synchronising host↔device operations, per decode step and per admission (`make gpu-check`'s
`engine_syncs`).

torch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`) warns at every operation that makes the host wait
for the device: a copy to or from pageable memory, a blocking copy, `.item()` or `.tolist()` of a device tensor,
`nonzero`, a synchronize. The engine runs waves of admissions, decode steps, finishes and compactions, and each such
warning is filed under the step it came in and, when it came from the step's admission (`_admit`, its prefill
included), under that admission; it names the innermost line of rlctl that made it. Expected on CUDA: one a step
(its read of the sampled tokens and log-probs into the host) and none an admission. Identical waves run first until
one captures no CUDA graph (a capture synchronises: `torch.cuda.graph`). On a CPU nothing synchronises and no
warning comes: the same waves run, and the filing and the verdict are tested with warnings raised on purpose
(tests/unit/devices/test_bench_gpu_syncs.py).
"""

from __future__ import annotations

import re
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import rlctl
from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.tinygpt import TinyGPT

SYNC_WARNING = "called a synchronizing CUDA operation"  # c10/cuda's warn_or_error_on_sync
PACKAGE = str(Path(rlctl.__file__).parent)
MAX_WARMUP_WAVES = 4


@dataclass
class StepSyncs:
    """The ops that synchronised during one `step()`: in its admission (its prefill included) and in the rest."""

    admitted: bool = False  # the step admitted requests (one admission, one prefill)
    admission: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)


def op_of(message: str, stack: list[traceback.FrameSummary]) -> str | None:
    """The op a sync-debug warning names, as the innermost frame of rlctl on the stack where it was raised (`file:line
    function: source`); None for another warning."""
    if SYNC_WARNING not in message:
        return None
    ours = [f for f in stack if f.filename.startswith(PACKAGE)] or stack
    f = ours[-1]
    return f"{Path(f.filename).name}:{f.lineno} {f.name}: {(f.line or '').strip()}"


class SyncLog:
    """The synchronising ops of each step (`steps`), and of anything between steps (`between`); any other warning
    goes on to `shown`, the `warnings.showwarning` that was in place."""

    def __init__(self, shown: Callable[..., None] | None = None) -> None:
        self.steps: list[StepSyncs] = []
        self.between: list[str] = []
        self.into = self.between
        self.shown = shown if shown is not None else warnings.showwarning

    def warned(
        self, message: Warning | str, category: type[Warning], filename: str, lineno: int, *rest: Any, **kw: Any
    ) -> None:
        """`warnings.showwarning`: called where the warning is raised, so the stack is the op's."""
        op = op_of(str(message), traceback.extract_stack()[:-1])
        if op is None:
            self.shown(message, category, filename, lineno, *rest, **kw)
        else:
            self.into.append(op)


@contextmanager
def watching(engine: EmbeddedEngine) -> Iterator[SyncLog]:
    """Every `engine.step()` in the block files its synchronising ops in the log (sync debug mode on CUDA). Only the
    sync warnings are always shown (to the log); the others meet the filters and the handler in place as before."""
    log = SyncLog(warnings.showwarning)
    step, admit = engine.step, engine._admit

    def counted_step() -> Any:
        log.steps.append(s := StepSyncs())
        log.into = s.other
        try:
            return step()
        finally:
            log.into = log.between

    def counted_admit() -> None:
        s, prefills = log.steps[-1], engine.prefills
        log.into = s.admission
        try:
            admit()
        finally:
            log.into, s.admitted = s.other, engine.prefills > prefills

    cuda = engine.device.type == "cuda"
    engine.step, engine._admit = counted_step, counted_admit  # type: ignore[method-assign]
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=f".*{re.escape(SYNC_WARNING)}")
        warnings.showwarning = log.warned
        previous = torch.cuda.get_sync_debug_mode() if cuda else 0
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield log
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(previous)
            del engine.step, engine._admit


def verdict(log: SyncLog, *, reads: int) -> list[str]:
    """What the log shows wrong, each naming the ops: a step that synchronised other than `reads` times outside its
    admission (1 on CUDA, its read; 0 on a CPU), an admission that synchronised, a sync between steps. Empty: none."""
    failures = []
    admissions = Counter(op for s in log.steps for op in s.admission)
    if admissions:
        failures.append(f"admissions synchronised {admissions.total()} times: {_ops(admissions)}")
    more = [s.other for s in log.steps if len(s.other) > reads]
    if more:
        ops = Counter(op for ops in more for op in ops)
        failures.append(f"{len(more)} steps synchronised more than {reads} times: {_ops(ops)}")
    fewer = sum(len(s.other) < reads for s in log.steps)
    if fewer:
        failures.append(f"{fewer} steps synchronised fewer than {reads} times (their read unseen: is the mode on?)")
    if log.between:
        failures.append(f"between steps: {_ops(Counter(log.between))}")
    return failures


def _ops(ops: Counter[str]) -> str:
    return "; ".join(f"{op} ×{n}" for op, n in ops.most_common())


def measure(model: TinyGPT, *, batch: int, prompt: int, new_tokens: int) -> dict[str, Any]:
    """Waves of requests through an engine of `batch` rows, counted after identical warm-up waves: steps, admissions
    and compactions, the syncs a step and an admission, the ops (with their counts), and the verdict's `failures`
    (also when the waves made fewer than two admissions or no compaction: then they did not test what they claim)."""
    engine = EmbeddedEngine(model, max_batch_size=batch, temperature=1.0)
    vocab = model.config.vocab_size
    waves = [
        [
            GenRequest(
                f"w{w}-{i}",
                [10 + (7 * i + j) % min(30, vocab - 10) for j in range(2 + (i + w) % prompt)],
                1 + (5 * i + 3 * w) % max(1, new_tokens // 2),
                ignore_eos=True,
            )
            for i in range(batch)
        ]
        for w in range(3)
    ]
    for _ in range(MAX_WARMUP_WAVES):
        before = _graph_state(engine)
        _run(engine, waves)
        if _graph_state(engine) == before:  # the last wave warmed and captured nothing: the next replays
            break
    prefills, compactions = engine.prefills, engine.compactions
    with watching(engine) as log:
        _run(engine, waves)
    cuda = engine.device.type == "cuda"
    failures = verdict(log, reads=1 if cuda else 0)
    admissions, compacted = engine.prefills - prefills, engine.compactions - compactions
    if admissions < 2 or compacted == 0:
        failures.append(f"the waves made {admissions} admissions and {compacted} compactions: the check needs both")
    per_step = [len(s.other) for s in log.steps]
    ops = Counter(op for s in log.steps for op in [*s.admission, *s.other])
    return {
        "steps": len(log.steps),
        "admissions": admissions,
        "compactions": compacted,
        "syncs_per_step": {"max": max(per_step, default=0), "mean": round(sum(per_step) / max(1, len(per_step)), 3)},
        "syncs_per_admission": round(sum(len(s.admission) for s in log.steps) / max(1, admissions), 3),
        "ops": dict(ops.most_common()),
        "failures": failures,
    }


def _run(engine: EmbeddedEngine, waves: list[list[GenRequest]]) -> None:
    """Each wave added once half the rows are free and nothing waits (the rows drained: compactions), then the rest."""
    for wave in waves:
        engine.add(wave)
        while engine.num_waiting() or engine.num_running() > engine.max_batch_size // 2:
            engine.step()
    while engine.has_work():
        engine.step()


def _graph_state(engine: EmbeddedEngine) -> list[tuple[int, int]]:
    graphs = (engine._graphs, engine._mixed_graphs, engine._prefill_graphs)
    return [(g.captures, len(g._warm)) for g in graphs if g is not None]
