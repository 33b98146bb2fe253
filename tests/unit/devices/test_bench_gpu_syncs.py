"""gpu-check's `engine_syncs` (bench/gpu_syncs.py): on CUDA, sync debug mode's warnings filed by decode step and by
admission, and the verdict (one a step, none an admission). No CPU op synchronises, so here the warnings are raised
on purpose, by a stand-in for the engine's transfer helper, and by hand-made stacks."""

from __future__ import annotations

import sys
import traceback
import types
import warnings

import pytest
import torch

import rlctl.engines.embedded as embedded
from bench.gpu_syncs import SYNC_WARNING, StepSyncs, SyncLog, measure, op_of, verdict, watching
from rlctl.engines.base import GenRequest
from rlctl.engines.embedded import EmbeddedEngine
from rlctl.models.tinygpt import TinyGPT
from tests.unit.tiny_models import small_config

EMBEDDED = embedded.__file__
READ = "embedded.py:291 step: self._host_out.copy_(self._out)"


@pytest.fixture
def model() -> TinyGPT:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return TinyGPT(small_config(layers=2, heads=4, positions=64)).eval()


def test_a_sync_warning_names_the_innermost_line_of_rlctl() -> None:
    """The op is rlctl's line that called into torch (a torch frame inside it is not rlctl's to change)."""
    stack = [
        traceback.FrameSummary("/x/bench/gpu_syncs.py", 80, "counted_step", line="return step()"),
        traceback.FrameSummary(EMBEDDED, 291, "step", line="  self._host_out.copy_(self._out)  "),
        traceback.FrameSummary("/site-packages/torch/functional.py", 12, "f", line="return g()"),
    ]
    assert op_of(f"{SYNC_WARNING} (Triggered internally at CUDAFunctions.cpp:1.)", stack) == READ
    assert op_of("some other warning", stack) is None
    assert op_of(SYNC_WARNING, stack[:1]) == "gpu_syncs.py:80 counted_step: return step()"  # no rlctl frame


def test_one_read_a_step_and_none_an_admission_pass_and_anything_else_is_named() -> None:
    log = SyncLog()
    log.steps = [StepSyncs(True, [], [READ]), StepSyncs(False, [], [READ])]
    assert verdict(log, reads=1) == []
    assert verdict(log, reads=0) == [f"2 steps synchronised more than 0 times: {READ} ×2"]
    extra = "embedded.py:330 _admit: self._live[idx] = 1"
    log.steps += [StepSyncs(True, [extra], [READ]), StepSyncs(False, [], [READ, "embedded.py:470 _free: x"])]
    assert verdict(log, reads=1) == [
        f"admissions synchronised 1 times: {extra} ×1",
        f"1 steps synchronised more than 1 times: {READ} ×1; embedded.py:470 _free: x ×1",
    ]
    log.steps, log.between = [StepSyncs(False, [], [])], ["a.py:1 f: g()"]
    assert verdict(log, reads=1) == [
        "1 steps synchronised fewer than 1 times (their read unseen: is the mode on?)",
        "between steps: a.py:1 f: g() ×1",
    ]


def test_watching_files_each_sync_under_its_step_and_its_admission(model: TinyGPT, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A stand-in transfer helper that warns as a synchronising copy would: the two copies of each admission (its
    prefill's and its rows' state) land in that step's admission, a finish's and a compaction's in the step, each
    named by the line of the engine that made it; and the watch leaves the engine as it was."""
    to_device = embedded.to_device

    def syncing(*values: list[int], device: torch.device) -> tuple[torch.Tensor, ...]:
        warnings.warn(SYNC_WARNING, UserWarning, stacklevel=1)
        return to_device(*values, device=device)

    monkeypatch.setattr(embedded, "to_device", syncing)
    engine = EmbeddedEngine(model, max_batch_size=4, temperature=1.0)
    engine.add([GenRequest(f"r{i}", [1, 2 + i], 2 + 3 * i, ignore_eos=True) for i in range(6)])
    with watching(engine) as log:
        while engine.has_work():
            engine.step()
    assert "step" not in vars(engine) and "_admit" not in vars(engine)
    admitted = [s for s in log.steps if s.admitted]
    assert len(admitted) >= 2 and engine.compactions > 0
    assert all(len(s.admission) == 2 for s in admitted) and not any(s.admission for s in log.steps if not s.admitted)
    names = {op.split(" ")[1] for s in log.steps for op in [*s.admission, *s.other]}
    assert names == {"_prefill:", "_admit:", "_free:", "_maybe_compact:"}
    failures = verdict(log, reads=0)
    assert failures[0].startswith(f"admissions synchronised {2 * len(admitted)} times: embedded.py:")
    assert "_free:" in failures[1] and "_maybe_compact:" in failures[1]


def test_the_waves_admit_between_steps_and_compact_and_nothing_synchronises_on_the_cpu(model: TinyGPT) -> None:
    r = measure(model, batch=4, prompt=8, new_tokens=16)
    assert r["failures"] == [] and r["admissions"] >= 2 and r["compactions"] > 0 and r["steps"] > r["admissions"]
    assert r["syncs_per_step"] == {"max": 0, "mean": 0.0} and r["syncs_per_admission"] == 0 and r["ops"] == {}


def test_a_check_that_failed_exits_1_with_its_figures_printed(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """`make gpu-check`'s status is the bench's: 1 when the JSON has `failed` (the figures are printed all the same)."""
    import bench.__main__ as main

    for failed in ([], ["engine_syncs: admissions synchronised 1 times"]):
        fake = types.SimpleNamespace(run=lambda quick, f=failed: {"x": 1} | ({"failed": f} if f else {}))
        monkeypatch.setitem(sys.modules, "bench._fake", fake)
        monkeypatch.setitem(main.BENCHES, "fake", "bench._fake")
        assert main.main(["fake", "--json"]) == (1 if failed else 0)
        assert '"x": 1' in capsys.readouterr().out


def test_watching_passes_other_warnings_on_as_before(model: TinyGPT) -> None:
    """Only the sync warnings are filed (and always shown): another goes to the handler that was in place, once per
    place as its filters say, or is raised where the filters make it an error (pytest's here)."""
    engine = EmbeddedEngine(model, max_batch_size=4, temperature=1.0)
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = lambda message, *_, **__: shown.append(str(message))
        with watching(engine) as log:
            for _ in range(2):
                warnings.warn("a deprecated knob", UserWarning, stacklevel=1)
                warnings.warn(SYNC_WARNING, UserWarning, stacklevel=1)
    assert shown == ["a deprecated knob"] and len(log.between) == 2
    with watching(engine) as log, pytest.raises(UserWarning, match="a deprecated knob"):
        warnings.warn("a deprecated knob", UserWarning, stacklevel=1)
