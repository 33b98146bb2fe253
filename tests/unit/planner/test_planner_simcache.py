"""`SimCache`: a search simulates each allocation once by what its simulation depends on (the rollout units, their
weight sync, the trainer's step), and the plan it picks and every figure it reports are those of simulating every
allocation afresh, as the planner did before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.planner import write_cluster
from rlctl.config import load_job
from rlctl.planner import plan as planner
from rlctl.planner import predict
from rlctl.planner.inputs import PlanOptions
from rlctl.planner.plan import make_plan
from rlctl.planner.predict import SimCache
from rlctl.planner.simjob import simulate_job
from tests.unit.planner.test_planner_plan import LINKS, OPTS, write_job


class _Forgets(dict[Any, float]):
    """A cache of simulated iterations that keeps none: every allocation simulated afresh (the planner before)."""

    def __setitem__(self, key: Any, value: float) -> None:
        pass


JOBS: dict[str, Callable[[Path], tuple[Path, PlanOptions]]] = {
    "across, one rollout site": lambda d: (
        write_job(d, rollout=[{"site": "r20"}], links=LINKS, rule="simulated"),
        OPTS,
    ),
    "across, two rollout sites": lambda d: (
        write_job(d, rollout=[{"site": "r20"}, {"site": "r100"}], links=LINKS, rule="simulated"),
        OPTS,
    ),
    "shared site": lambda d: (write_job(d, rollout=[{"site": "trn"}], links=LINKS, rule="simulated"), OPTS),
    "shared site, 4 trainer GPUs": lambda d: (
        write_job(d, rollout=[{"site": "trn"}], links=LINKS, rule="simulated", trainer_gpus=4),
        OPTS,
    ),
    "16 GPUs over 4 datacenters (bench planner)": lambda d: (write_cluster(d, 16), PlanOptions(sim_iterations=2)),
}


@pytest.mark.parametrize("case", list(JOBS))
def test_the_plan_is_the_one_simulating_every_allocation_afresh_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    path, opts = JOBS[case](tmp_path)
    job = load_job(path)
    plan = make_plan(job, options=opts)
    monkeypatch.setattr(planner, "SimCache", lambda: SimCache(iterations=_Forgets()))
    afresh = make_plan(job, options=opts)
    assert plan == afresh  # the allocation, every simulated allocation's figure, the predicted times, the advice


def test_a_search_simulates_no_allocation_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Across datacenters, rollout counts that leave GPUs idle (5, 6 and 7 H20s of tp 2 units) run the same units,
    and trainer counts whose fastest configuration is another's run the same step: each is simulated once, and the
    plan's own async iteration is the search's (the old planner simulated each of the search's allocations and then
    the plan's again)."""
    seen: list[tuple[int, float, float, float, str]] = []

    def spy(works: Any, **kw: Any) -> Any:
        w = works[0]  # the batches' shares are the cache's own objects: one per set of rollout units
        seen.append((id(w.shares), kw["weight_sync_s"], w.train_s, w.at_step_s, kw["mode"]))
        return simulate_job(works, **kw)

    monkeypatch.setattr(predict, "simulate_job", spy)
    plan = make_plan(
        load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, rule="simulated")), options=OPTS
    )
    evaluated = plan["search"]["evaluated"]
    assert len(seen) == len(set(seen))
    assert sum(m == "async" for *_, m in seen) < len(evaluated)  # some evaluations are the same simulation
