"""`bench dispatch`'s arithmetic and sizes, without generating: the fraction of the oracle's gain and the prompts
each unit gets (more than its max batch, or the schedule cannot matter)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import bench.dispatch as dispatch
from rlctl.models.tinygpt import TinyGPT


def test_the_fraction_of_the_oracle_gain_is_none_when_the_oracle_gains_less_than_the_noise_floor():
    # bench dispatch --quick before: the oracle 0.9 % faster, skew-aware 0.4 % slower, and a fraction of −0.491
    assert dispatch._fraction({"random": 1.3967, "skew_aware": 1.4026, "oracle": 1.3846}) is None
    assert dispatch._fraction({"random": 1.0, "skew_aware": 1.0, "oracle": 1.0}) is None
    assert dispatch._fraction({"random": 1.0, "skew_aware": 0.95, "oracle": 0.9}) == pytest.approx(0.5)
    floor = 1 - dispatch.ORACLE_GAIN_FLOOR
    assert dispatch._fraction({"random": 1.0, "skew_aware": 1.0, "oracle": floor}) == pytest.approx(0.0)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("quick", [True, False])
def test_each_unit_gets_more_prompts_than_its_max_batch(monkeypatch, quick):
    seen: list[int] = []

    def run_batch(model: Any, task: Any, prompts: list[Any], *rest: Any) -> Any:
        seen.append(len(prompts))
        raise _Stop

    # the run up to its first batch, without the SFT, the PTL measurement or generating: the sizes it takes
    monkeypatch.setattr(dispatch, "warmup", lambda task, steps, seed: TinyGPT().state_dict())
    monkeypatch.setattr(
        dispatch, "measure_generation", lambda *a, **k: SimpleNamespace(ptl_s=[[1e-3] * len(dispatch.PTL_BATCH_SIZES)])
    )
    monkeypatch.setattr(
        dispatch,
        "_generate",
        lambda model, task, prompts, priority: [
            SimpleNamespace(request_id=p.prompt_id, output_tokens=[0]) for p in prompts
        ],
    )
    monkeypatch.setattr(dispatch, "_run_batch", run_batch)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # the run's one thread, not this process's
    with pytest.raises(_Stop):
        dispatch.run(quick=quick)
    (prompts,) = seen
    assert prompts // dispatch.NUM_UNITS > dispatch.MAX_BATCH
