"""`rlctl scale +N` (and the rebalance rule's scale-out) on a SLURM site with `scheduler.exclusive: true`: each unit's
SLURM job takes its nodes whole, so the units that fit are the site's nodes the job's own jobs leave, not its GPUs
left ÷ tp (`Placement.whole_node_slots`): nodes with the GPUs, cores and memory each job asks, as `check` compares."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlctl.agents.core import ControllerCore
from rlctl.agents.coretypes import CoreConfig, PromptSpec
from rlctl.agents.placement import Placement
from rlctl.agents.scaling import Scaler
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.config.pipeline import Rebalance
from rlctl.launch.jobdir import JobDir
from rlctl.metrics import JobMetrics
from tests.unit.controller_harness import small_job


class Spawner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def first_free_replica(self) -> int:
        return 1

    def add_rollout(self, site: str, replica: int) -> None:
        self.calls.append((site, replica))


def site(
    *, exclusive: bool, hosts: str = "g-[01-02]", gpus: int = 8, nodes: list[dict[str, Any]] | None = None
) -> Site:
    scheduler = {"kind": "slurm", "partition": "gpu", "exclusive": exclusive}
    nodes = nodes or [{"host": hosts, "gpus": gpus}]
    return Site.model_validate({"datacenter": "d", "gpu": "H100", "scheduler": scheduler, "nodes": nodes})


def scaler(tmp_path: Path, gen: Site, *, controller_site: str = "t", job: JobFile | None = None) -> Scaler:
    """A job whose trainer runs on site t, and one rollout unit of 2 GPUs (rollout-0) on site `gen`."""
    cfg = CoreConfig(iterations=2, prompts_per_iteration=1, samples_per_prompt=1, max_new_tokens=4, mode="async", eta=1)
    core = ControllerCore(cfg, prompts=lambda it: [PromptSpec(f"p{it}", [1], 1)])
    core.join("trainer-0", role="trainer", version=0)
    core.join("rollout-0", role="rollout", version=0)
    plan: dict[str, Any] = {
        "trainer": {"site": "t", "ranks": 1},
        "controller_site": controller_site,
        "rollout": [{"site": "gen", "units": 1, "tp": 2}],
    }
    start = time.monotonic()
    s = Scaler(
        JobDir.create("x", explicit=tmp_path / "job"),
        Rebalance(),
        core=core,
        placement=Placement(plan, {"gen": gen}, {"rollout-0": "gen"}, job or small_job("x", iterations=2)),
        metrics=JobMetrics(),
        post=lambda m: None,
        clock=lambda: start,
    )
    s.spawner = Spawner()  # type: ignore[assignment]
    return s


def test_a_scale_onto_an_exclusive_site_whose_nodes_the_job_holds_is_refused_naming_them(tmp_path: Path) -> None:
    """2 nodes of 8 GPUs, a unit of 2 on one: 7 units' GPUs free, and scale +2 started 2 units whose SLURM jobs took
    the one node left and waited for ever for the other; now one fits, and +2 is refused naming the site's nodes."""
    s = scaler(tmp_path, site(exclusive=True))
    assert s.free_slots() == {"gen": 1}
    reply, _ = s.scale(2, None, reason="operator")
    nodes = "site gen's scheduler.exclusive gives each of the job's SLURM jobs there its nodes whole: its 2 node(s) "
    ever = "a unit past them would wait for ever for a node the job's own jobs hold until it ends"
    assert reply == {
        "error": f"only 1 of 2 units fit on gen: free slots gen 1; {nodes}(g-01, g-02) hold its 1 rollout unit(s) "
        f"and 1 unit(s) more: each holds one job, and none is left for another; {ever}"
    }
    assert s.spawner.calls == []  # type: ignore[union-attr]
    reply, _ = s.scale(1, "gen", reason="operator")
    assert reply == {"adding": ["rollout-1"], "sites": ["gen"]}
    assert s.free_slots() == {"gen": 0}
    reply, _ = s.scale(1, None, reason="operator")
    assert reply == {
        "error": f"only 0 of 1 units fit on gen: free slots gen 0; {nodes}(g-01, g-02) hold its 2 rollout unit(s) "
        f"and 0 unit(s) more: each holds one job, and none is left for another; {ever}"
    }


def test_an_exclusive_site_s_controller_holds_a_node_and_a_shared_site_counts_gpus(tmp_path: Path) -> None:
    assert scaler(tmp_path / "a", site(exclusive=True), controller_site="gen").free_slots() == {"gen": 0}
    assert scaler(tmp_path / "b", site(exclusive=False)).free_slots() == {"gen": 7}  # GPUs left ÷ tp, as before
    assert scaler(tmp_path / "c", site(exclusive=True, hosts="g-[01-04]")).free_slots() == {"gen": 3}


def test_a_unit_is_counted_only_on_a_node_with_the_cores_it_asks(tmp_path: Path) -> None:
    """2 nodes of 8 GPUs, one of 64 cores and one of 8, units of 16 threads: rollout-0's job holds the one node with
    16 cores, and a unit more (its GPUs alone compared, scale +1 started one) waits for ever; `check` compares cores
    and memory too (`noderoom.fit(whole=True)`), and scale now does."""
    job = small_job("x", iterations=2)
    job = job.model_copy(update={"rollout": job.rollout.model_copy(update={"threads_per_unit": 16})})
    nodes = [{"host": "g-01", "gpus": 8, "cpus": 64}, {"host": "g-02", "gpus": 8, "cpus": 8}]
    s = scaler(tmp_path / "a", site(exclusive=True, nodes=nodes), job=job)
    assert s.free_slots() == {"gen": 0}
    nodes = [{"host": "g-01", "gpus": 8, "cpus": 64}, {"host": "g-02", "gpus": 8, "cpus": 16}]
    assert scaler(tmp_path / "b", site(exclusive=True, nodes=nodes), job=job).free_slots() == {"gen": 1}


def test_the_refusal_says_which_of_the_nodes_figures_stops_another_unit(tmp_path: Path) -> None:
    """rollout-0 (2 GPUs, 16 threads) holds g-01 whole; the nodes left lack a unit's cores, its GPUs, or one each,
    and the line names what (`wholenodes.figures_short`, the rule `whole_node_slots` asks), versus the site's nodes
    alone said (the operator left to find that a node had 8 cores); a figure of 1 is said '1 GPU', '1 core', versus
    '1 GPUs', '1 cores'."""
    job = small_job("x", iterations=2)
    job = job.model_copy(update={"rollout": job.rollout.model_copy(update={"threads_per_unit": 16})})
    first = {"host": "g-01", "gpus": 8, "cpus": 64}
    cases = {
        "cores": ([first, {"host": "g-02", "gpus": 8, "cpus": 8}], "16 cores", "64 cores, 8 cores"),
        "GPUs": ([first, {"host": "g-02", "gpus": 1, "cpus": 64}], "2 GPUs", "8 GPUs, 1 GPU"),
        "GPUs or cores": (
            [first, {"host": "g-02", "gpus": 1, "cpus": 64}, {"host": "g-03", "gpus": 8, "cpus": 8}],
            "2 GPUs and 16 cores",
            "8 GPUs and 64 cores, 8 GPUs and 8 cores, 1 GPU and 64 cores",
        ),
        "GPUs and cores": (
            [first, {"host": "g-02", "gpus": 1, "cpus": 1}],
            "2 GPUs and 16 cores",
            "8 GPUs and 64 cores, 1 GPU and 1 core",
        ),
    }
    for i, (which, (nodes, ask, have)) in enumerate(cases.items()):
        s = scaler(tmp_path / str(i), site(exclusive=True, nodes=nodes), job=job)
        reply, _ = s.scale(1, "gen", reason="operator")
        said = f"their {which} stop another (a unit asks {ask} of a node; the nodes have {have}); a unit past them"
        assert f"1 rollout unit(s) and 0 unit(s) more: {said}" in reply["error"], which
