"""Measured profiles on a fake engine with a fake clock; analytical roofline; profile file round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.engines.base import GenerationEngine, GenRequest, GenResult
from rlctl.hardware import CATALOG
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.planner.costs import decode_cost
from rlctl.profiler.analytical import analytical_profile, decode_step_s, kv_capacity_tokens
from rlctl.profiler.measure import measure_generation
from rlctl.profiler.profile import load_profile, save_profile


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeEngine(GenerationEngine):
    """Each step costs 1 ms + 0.1 ms per running row + 1 µs per context token; admission prefills 10 µs/token."""

    def __init__(self, clock: FakeClock, max_batch_size: int) -> None:
        self.clock = clock
        self.max_batch_size = max_batch_size
        self.running: list[list[int]] = []  # [remaining, context]
        self.waiting: list[GenRequest] = []
        self.events: list[str] = []

    def load_weights(self, state_dict: dict, version: int) -> None:  # type: ignore[type-arg]
        raise AssertionError("not used")

    def add(self, requests: list[GenRequest]) -> None:
        self.waiting += requests

    def step(self) -> list[GenResult]:
        while self.waiting and len(self.running) < self.max_batch_size:
            r = self.waiting.pop(0)
            self.running.append([r.max_new_tokens, len(r.prompt_tokens)])
            self.clock.now += 1e-5 * len(r.prompt_tokens)
            self.events.append("admit")
        ctx = self.running[0][1]
        self.clock.now += 1e-3 + 1e-4 * len(self.running) + 1e-6 * ctx
        for row in self.running:
            row[0] -= 1
        self.running = [r for r in self.running if r[0] > 0]
        self.events.append("step")
        return []

    def partials(self) -> list[GenResult]:
        return []

    def interrupt(self, request_ids: list[str]) -> list[GenResult]:
        return []

    def num_running(self) -> int:
        return len(self.running)

    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def version(self) -> int:
        return 0


def test_measure_generation_recovers_the_fake_cost_model() -> None:
    clock = FakeClock()
    engines: list[FakeEngine] = []

    def factory(bs: int) -> FakeEngine:
        engines.append(FakeEngine(clock, bs))
        return engines[-1]

    e = measure_generation(
        factory,
        contexts=[10, 100],
        batch_sizes=[1, 4, 16],
        kv_capacity_tokens=999,
        steps=4,
        warmup_steps=1,
        clock=clock,
    )
    for ci, ctx in enumerate([10, 100]):
        for bi, bs in enumerate([1, 4, 16]):
            assert e.ptl_s[ci][bi] == pytest.approx(1e-3 + 1e-4 * bs + 1e-6 * ctx)
    assert e.prefill_s_per_token == pytest.approx(1e-5, rel=0.2)
    assert e.kv_capacity_tokens == 999
    assert engines[0].events == ["admit", "step", "step"] + ["step"] * 4


def test_roofline_is_flat_then_linear_and_tp_helps() -> None:
    m, g = BUILTIN_MODELS["qwen2.5-7b"], CATALOG["H800"]
    t1, t8, t256 = (decode_step_s(m, g, tp=1, batch=b, context=4096) for b in (1, 8, 256))
    assert t8 < 1.2 * t1 < t256  # memory-bound at small batch, growing at large batch
    assert decode_step_s(m, g, tp=4, batch=64, context=4096) < decode_step_s(m, g, tp=1, batch=64, context=4096)
    assert kv_capacity_tokens(BUILTIN_MODELS["qwen2.5-72b"], g, tp=1) == 0  # 145 GB of weights do not fit
    assert kv_capacity_tokens(BUILTIN_MODELS["qwen2.5-72b"], g, tp=4) > 0


def test_profile_round_trip_and_interpolation(tmp_path: Path) -> None:
    prof = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h20": (CATALOG["H20"], 8, 1.0)})
    path = tmp_path / "p.yaml"
    save_profile(prof, path)
    back = load_profile(path)
    assert back == prof
    entry = back.sites["h20"].generation[0]
    dc = decode_cost(entry, context=4096, seq_tokens=4096, engine_max_batch=64)
    m, g = BUILTIN_MODELS["qwen2.5-7b"], CATALOG["H20"]
    assert dc.ptl(32) == pytest.approx(decode_step_s(m, g, tp=entry.tp, batch=32, context=4096))
    assert dc.max_batch == 64


def test_a_profile_written_to_an_upper_case_json_name_is_json(tmp_path: Path) -> None:
    # `-o FILE.JSON` was written as YAML: the suffix was compared case-sensitively
    prof = analytical_profile(BUILTIN_MODELS["qwen2.5-7b"], {"h20": (CATALOG["H20"], 8, 1.0)})
    path = tmp_path / "P.JSON"
    save_profile(prof, path)
    assert json.loads(path.read_text())["kind"] == "Profile" and load_profile(path) == prof


def test_a_noisy_measured_grid_never_extrapolates_below_what_was_measured() -> None:
    """A grid measured on a shared machine (CI: a longer context measured at half the shorter one's step time, a
    larger batch faster than a smaller one) is taken non-decreasing in context and batch size, so extrapolating it
    past the last context or batch never gives a step faster than measured (it went non-positive, and the plan of
    tests/vllm/test_vllm_profile.py found every split infeasible)."""
    from rlctl.profiler.profile import GenerationEntry

    short = [1.5e-3, 1.4e-3, 1.7e-3, 2.1e-3, 2.0e-3]
    entry = GenerationEntry(
        tp=1,
        contexts=[16, 64],
        batch_sizes=[1, 2, 4, 8, 16],
        ptl_s=[short, [t / 2 for t in short]],
        prefill_s_per_token=1e-6,
        kv_capacity_tokens=1 << 20,
        engine="vllm",
    )
    for context in (8, 40, 200, 4096):
        dc = decode_cost(entry, context=context, seq_tokens=context, engine_max_batch=64)
        ptl = dc.ptl_s[1:]
        assert (ptl >= min(short)).all() and (ptl[1:] >= ptl[:-1]).all(), (context, ptl)
    assert decode_cost(entry, context=8, seq_tokens=8, engine_max_batch=16).ptl(1) == short[0]
