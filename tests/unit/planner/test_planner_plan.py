"""make_plan on small synthetic jobs: rule selection, fixed counts, several rollout sites, missing links."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config import load_job
from rlctl.config import pipeline as pipeline_config
from rlctl.config.hostfill import trainer_slots
from rlctl.config.job import Job
from rlctl.config.pipeline import Pipeline
from rlctl.errors import ConfigError, PlanError
from rlctl.launch.gpus import GpuPool
from rlctl.planner import inputs as plan_inputs
from rlctl.planner import placement as plan_placement
from rlctl.planner import plan as planner
from rlctl.planner import predict as plan_predict
from rlctl.planner import search as plan_search
from rlctl.planner import weightsync as plan_weightsync
from rlctl.planner.curves import units_that_fit
from rlctl.planner.inputs import PlanOptions
from rlctl.planner.plan import make_plan
from rlctl.planner.simjob import simulate_job
from rlctl.planner.view import plan_table
from tests.conftest import ROOT, run_cli

OPTS = PlanOptions(sim_iterations=2)


def write_job(
    tmp: Path,
    *,
    rollout: list[dict[str, Any]],
    links: list[dict[str, Any]],
    rule: str = "paper",
    trainer_gpus: int | str = "auto",
    mode: str = "async",
) -> Path:
    sites = {
        "trn": {
            "datacenter": "a",
            "scheduler": {"kind": "ssh"},
            "gpu": "H800",
            "nodes": [{"host": "t-[1-4]", "gpus": 8}],
        },
        "r20": {
            "datacenter": "b",
            "scheduler": {"kind": "ssh"},
            "gpu": "H20",
            "nodes": [{"host": "r-[1-2]", "gpus": 8}],
        },
        "r100": {
            "datacenter": "c",
            "scheduler": {"kind": "ssh"},
            "gpu": "A100",
            "nodes": [{"host": "s-[1-2]", "gpus": 8}],
        },
    }
    (tmp / "inv.yaml").write_text(
        yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": sites, "links": links})
    )
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "t",
        "inventory": ["inv.yaml"],
        "model": {"kind": "builtin", "name": "qwen2.5-7b"},
        "task": {"kind": "lengths", "median_output_tokens": 700, "max_output_tokens": 5000},
        "batch": {"prompts_per_iteration": 32, "samples_per_prompt": 8},
        "planning": {"rule": rule, "epsilon": 0.05},
        "pipeline": {"mode": mode},
        "placement": {"trainer": {"site": "trn", "gpus": trainer_gpus}, "rollout": rollout},
        # long rows (5,512 tokens) of a 7B: their activations fit beside FSDP2's shards recomputed (`profiler.actmem`)
        "trainer": {"activation_checkpointing": True},
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


LINKS = [{"between": ["trn", "r20"], "bandwidth_gbps": 80}, {"between": ["trn", "r100"], "bandwidth_gbps": 40}]


def _used(plan: dict[str, Any], role: str) -> int:
    return sum(a["gpus_used"] for a in plan["allocation"] if a["role"] == role)


@pytest.mark.parametrize("rule", ["paper", "fewest_gpus"])
def test_allocation_follows_the_job_rule(tmp_path: Path, rule: str) -> None:
    plan = make_plan(load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, rule=rule)), options=OPTS)
    alt = plan["alternatives"][rule]
    assert (_used(plan, "rollout"), _used(plan, "trainer")) == (alt["rollout_gpus"], alt["trainer_gpus"])
    few, paper = plan["alternatives"]["fewest_gpus"], plan["alternatives"]["paper"]
    assert few["rollout_gpus"] + few["trainer_gpus"] <= 16 + 32
    assert few["iteration_s"] <= 1.05 * max(plan["baseline"]["t_gen_s"], plan["baseline"]["t_train_s"]) * (1 + 1e-9)
    assert paper["iteration_s"] > 0


def test_fixed_trainer_count_is_kept(tmp_path: Path) -> None:
    plan = make_plan(
        load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, trainer_gpus=8)), options=OPTS
    )
    assert _used(plan, "trainer") == 8


def test_two_rollout_sites_and_weight_sync_over_the_slower_link(tmp_path: Path) -> None:
    plan = make_plan(
        load_job(write_job(tmp_path, rollout=[{"site": "r20", "gpus": 16}, {"site": "r100", "gpus": 16}], links=LINKS)),
        options=OPTS,
    )
    sites = {a["site"]: a for a in plan["allocation"]}
    assert sites["r20"]["gpus_used"] == 16 and sites["r100"]["gpus_used"] == 16
    weight_bytes = 7.62e9 * 2
    assert plan["predicted"]["weight_sync_s"] >= weight_bytes / (40e9 / 8)  # the 40 Gbps link bounds it
    assert plan["cost"]["cost_units_per_iteration"] > plan["cost"]["gpu_hours_per_iteration"]  # H800 costs 2.85


def test_missing_link_is_a_config_error_naming_the_inventory(tmp_path: Path) -> None:
    """The inventory lacks it: exit 2 naming the file and `links`, versus exit 1 naming neither."""
    job = load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=[]))
    with pytest.raises(ConfigError, match="no link declared between sites 'trn' and 'r20'") as e:
        make_plan(job, options=OPTS)
    assert (e.value.file, e.value.field) == (str(tmp_path / "inv.yaml"), "links")
    assert e.value.exit_code == 2 and "between: [trn, r20]" in str(e.value.hint)


def test_missing_link_beside_fixed_counts_is_check_s_refusal_not_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The planner is advisory there, and check (launch's preflight) refuses the job in plan's line, naming the
    inventory's links: the planner's note is not said again in a warning before it (logged at DEBUG), versus a
    warning while check passed the job and launch started it (the weights routed as if every datacenter were
    linked)."""
    from rlctl.ops.counts import plan_counts
    from rlctl.ops.preflight import problems

    job = load_job(write_job(tmp_path, rollout=[{"site": "r20", "gpus": 16}], links=[], trainer_gpus=8))
    with caplog.at_level("DEBUG", logger="rlctl.ops.counts"):
        counts = plan_counts(job, job.spec)
    assert counts["source"] == "job" and "links: no link declared" in counts["note"]
    assert [r.levelname for r in caplog.records] == ["DEBUG"], caplog.text
    said = [(p.file, p.field) for p in problems(job, plan=counts) if "no link declared" in p.message]
    assert said == [(str(tmp_path / "inv.yaml"), "links")]


def test_launch_and_check_run_the_allocation_rlctl_plan_prints(tmp_path: Path) -> None:
    """`plan_counts` (the counts of `gpus: auto` that launch runs and check judges) simulated one batch where `rlctl
    plan` simulates four: on two 2-slot sites the plan printed a trainer of 2 ranks and the launch ran 1."""
    from rlctl.ops.counts import plan_counts

    nodes = [{"host": "localhost", "gpus": 2}]
    site = {"datacenter": "a", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": nodes}
    inv = {"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"la": site, "lb": site}}
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    job = yaml.safe_load((ROOT / "jobs/demo.yaml").read_text())
    job["inventory"] = ["inv.yaml"]
    job["placement"] = {"trainer": {"site": "la", "gpus": "auto"}, "rollout": [{"site": "lb", "gpus": "auto"}]}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    j = load_job(tmp_path / "job.yaml")
    printed = {(a["site"], a["role"]): a for a in make_plan(j)["allocation"]}
    counts = plan_counts(j, j.spec)
    assert counts["trainer"]["ranks"] == printed["la", "trainer"]["gpus_used"]
    assert [r["units"] for r in counts["rollout"]] == [printed["lb", "rollout"]["instances"]]


def test_a_site_too_small_for_both_stages_says_what_each_needs(tmp_path: Path) -> None:
    """3 H100s, 7B: the FSDP2 trainer needs all three (its shards and a 5,512-token row's recomputed activations) and
    a rollout unit one. The planner said 'no feasible (x, y): every split has an infinite stage time'."""
    path = write_job(tmp_path, rollout=[{"site": "trn"}], links=[], rule="paper")
    site = {"datacenter": "a", "scheduler": {"kind": "ssh"}, "gpu": "H100", "nodes": [{"host": "h1", "gpus": 3}]}
    inv = {"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"s": site}}
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    job = yaml.safe_load(path.read_text())
    job["placement"] = {"trainer": {"site": "s", "gpus": "auto"}, "rollout": [{"site": "s", "gpus": "auto"}]}
    path.write_text(yaml.safe_dump(job))
    with pytest.raises(PlanError) as e:
        make_plan(load_job(path), options=OPTS)
    assert str(e.value) == (
        "site 's': its 3 GPU(s) cannot hold both stages of qwen2.5-7b: the trainer needs 3 at least and a rollout "
        "unit 1"
    )


@pytest.mark.parametrize(
    ("trainer", "rollout", "line"),
    [
        (4, "auto", "placement.trainer.gpus: site 'local': trainer 4 GPU(s) + a rollout unit 1 need 5"),
        ("auto", 4, "placement.rollout[0].gpus: site 'local': rollout 4 GPU(s) + the trainer 1 at least need 5"),
    ],
)
def test_a_fixed_count_that_leaves_the_other_stage_of_a_shared_site_too_few_is_a_config_error(
    tmp_path: Path, trainer: int | str, rollout: int | str, line: str
) -> None:
    """The demo's 4 slots, all of them fixed for one stage: the job's field, exit 2, as rlctl check says, versus
    'its 4 GPU(s) cannot hold both stages of tiny-demo: the trainer needs 1 at least and a rollout unit 1', exit 1
    (the 4 the rollout's count, not the site's)."""
    demo = yaml.safe_load((ROOT / "jobs" / "demo.yaml").read_text())
    demo["inventory"] = [str(ROOT / "clusters" / "local.yaml")]
    demo["placement"] = {"trainer": {"site": "local", "gpus": trainer}, "rollout": [{"site": "local", "gpus": rollout}]}
    (path := tmp_path / "job.yaml").write_text(yaml.safe_dump(demo))
    res = run_cli("plan", str(path))
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith(f"rlctl: error: {path}: {line}; the inventory gives it 4 (hint: "), res.stderr


def test_weights_reach_a_rollout_site_over_its_datacenters_links_as_the_broadcast_routes_them(tmp_path: Path) -> None:
    """The broadcast joins datacenters, not sites (`rlctl.weights.plan`): a rollout site in the trainer's datacenter
    crosses no link, and one in a datacenter that another site's link reaches takes that link. The planner asked
    for a link from the trainer's site to each ('no link declared', exit 1) where `rlctl check` passed the job."""
    rollout = [{"site": "r20", "gpus": 16}, {"site": "r100", "gpus": 16}]

    def weight_sync_s(datacenters: dict[str, str], links: list[dict[str, Any]]) -> float:
        path = write_job(tmp_path, rollout=rollout, links=links, trainer_gpus=8)
        inv = yaml.safe_load((tmp_path / "inv.yaml").read_text())
        for site, dc in datacenters.items():
            inv["sites"][site]["datacenter"] = dc
        (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
        return float(make_plan(load_job(path), options=OPTS)["predicted"]["weight_sync_s"])

    both = [LINKS[0], {"between": ["trn", "r100"], "bandwidth_gbps": 80}]
    assert weight_sync_s({"r100": "b"}, [LINKS[0]]) == weight_sync_s({"r100": "b"}, both)
    in_a = weight_sync_s({"r20": "a", "r100": "a"}, [])
    assert 0 < in_a < math.inf


def test_one_simulated_iteration_still_gives_steady_state_pipeline_times() -> None:
    job = load_job(ROOT / "jobs/cross-dc-7b.yaml")
    job.spec = job.spec.model_copy(update={"planning": job.spec.planning.model_copy(update={"rule": "paper"})})
    plan = make_plan(job, options=PlanOptions(sim_iterations=1))  # Algorithm 1's split: trainer-bound
    it, pr = plan["predicted"]["iteration_s"], plan["predicted"]
    assert it["async"] < it["stream"] < it["sync"]
    assert it["async"] == pytest.approx(max(pr["t_gen_s"], pr["t_train_s"]), rel=0.05)
    assert it["sync"] == pytest.approx(pr["t_gen_s"] + pr["t_train_s"] + pr["weight_sync_s"], rel=0.05)


def _async_s(tmp: Path, rollout: dict[str, Any], rule: str, trainer_gpus: int | str = "auto") -> dict[str, Any]:
    job = load_job(write_job(tmp, rollout=[rollout], links=[], rule=rule, trainer_gpus=trainer_gpus))
    return make_plan(job, options=OPTS)


def test_the_simulated_rule_splits_a_shared_site_no_slower_than_algorithm_1_or_an_even_split(tmp_path: Path) -> None:
    """An async job on one site: the split the job simulator finds (a unit's next iteration filling its tail) beats
    or ties Algorithm 1's split and the even one, each simulated the same way (their counts fixed)."""
    plan = _async_s(tmp_path, {"site": "trn"}, "simulated")
    assert plan["rule_applied"] == "simulated"
    search = plan["search"]
    best = plan["predicted"]["iteration_s"]["async"]
    assert best == pytest.approx(min(e["iteration_s"] for e in search["evaluated"]))
    chosen = next(e for e in search["evaluated"] if e["rollout_gpus"] == search["chosen"])
    assert _used(plan, "trainer") == chosen["trainer_gpus"] and _used(plan, "rollout") <= chosen["rollout_gpus"]
    paper = plan["alternatives"]["paper"]
    for x, y in ((paper["rollout_gpus"], paper["trainer_gpus"]), (16, 16)):
        fixed = _async_s(tmp_path, {"site": "trn", "gpus": x}, "simulated", trainer_gpus=y)
        assert fixed["rule_applied"] == "paper" and "search" not in fixed  # counts given: nothing to search
        assert best <= fixed["predicted"]["iteration_s"]["async"] * (1 + 1e-9)


def test_a_fixed_trainer_count_on_a_shared_async_site_gets_the_simulated_split_search(tmp_path: Path) -> None:
    """4 trainer ranks fixed on the site rollout shares: the rollout count comes from the same simulated search as
    an `auto` trainer's, over that count's curve, and the plan is no slower than Algorithm 1's split simulated
    alike."""
    plan = _async_s(tmp_path, {"site": "trn"}, "simulated", trainer_gpus=4)
    assert plan["rule_applied"] == "simulated" and plan["search"]["kind"] == "shared_site"
    evaluated = plan["search"]["evaluated"]
    assert {e["trainer_gpus"] for e in evaluated} == {4} and _used(plan, "trainer") == 4
    best = plan["predicted"]["iteration_s"]["async"]
    assert best == pytest.approx(min(e["iteration_s"] for e in evaluated))
    paper = plan["alternatives"]["paper"]
    fixed = _async_s(tmp_path, {"site": "trn", "gpus": paper["rollout_gpus"]}, "simulated", trainer_gpus=4)
    assert best <= fixed["predicted"]["iteration_s"]["async"] * (1 + 1e-9)


@pytest.mark.parametrize("trainer_gpus", [4, 8, 16, "auto"])
def test_the_split_search_finds_the_split_a_scan_of_every_one_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer_gpus: int | str
) -> None:
    """The seeded grid search of the shared site's split against every split simulated: the same iteration (8
    fixed ranks once settled on 24 rollout GPUs at 23.3 s beside 8 at 18.0 s, where the weight sync of a second
    rollout host was priced as a second copy at the intra-site rate: the iteration was not smooth in the split)."""
    plan = _async_s(tmp_path, {"site": "trn"}, "simulated", trainer_gpus=trainer_gpus)
    monkeypatch.setattr(plan_search, "SEARCH_GRID", 10**6)
    scan = _async_s(tmp_path, {"site": "trn"}, "simulated", trainer_gpus=trainer_gpus)
    assert len(scan["search"]["evaluated"]) > len(plan["search"]["evaluated"])
    best = min(e["iteration_s"] for e in scan["search"]["evaluated"])
    assert plan["predicted"]["iteration_s"]["async"] == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_the_simulated_rule_is_algorithm_1_outside_async(tmp_path: Path, mode: str) -> None:
    job = load_job(write_job(tmp_path, rollout=[{"site": "trn"}], links=[], rule="simulated", mode=mode))
    plan = make_plan(job, options=OPTS)
    assert plan["rule_applied"] == "paper" and "search" not in plan
    paper = plan["alternatives"]["paper"]
    assert (_used(plan, "rollout"), _used(plan, "trainer")) == (paper["rollout_gpus"], paper["trainer_gpus"])


def _across(plan: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], float]:
    """(the chosen allocation's entry, the full allocation's, the bound) of a search across datacenters."""
    search = plan["search"]
    assert plan["rule_applied"] == "simulated" and search["kind"] == "across_datacenters"
    ev = search["evaluated"]
    full = max(ev, key=lambda e: (e["rollout_gpus"], e["trainer_gpus"]))
    chosen = next(
        e for e in ev if (e["rollout_gpus"], e["trainer_gpus"]) == (search["chosen"], search["chosen_trainer"])
    )
    return chosen, full, full["iteration_s"] * (1 + search["within"])


def test_the_simulated_rule_across_datacenters_gives_up_gpus_the_full_allocation_s_iteration_does_not_need(
    tmp_path: Path,
) -> None:
    """Trainer and rollout in two datacenters: from all of both sites, each stage keeps the fewest GPUs with which
    the simulated async iteration stays within `within` of the full allocation's, and the plan runs that."""
    plan = make_plan(
        load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, rule="simulated")), options=OPTS
    )
    chosen, full, bound = _across(plan)
    # every GPU of both sites, first: the torch trainer's best on 32 runs 8 (data parallel only; past one host its
    # gradient all-reduce crosses the hosts' network)
    assert (full["rollout_gpus"], full["trainer_gpus"]) == (16, 8)
    assert chosen["iteration_s"] <= bound
    assert chosen["rollout_gpus"] + chosen["trainer_gpus"] < 16 + 8
    assert plan["predicted"]["iteration_s"]["async"] == pytest.approx(chosen["iteration_s"])
    assert (_used(plan, "rollout"), _used(plan, "trainer")) == (chosen["rollout_gpus"], chosen["trainer_gpus"])
    # a stage that gave up GPUs stopped where one fewer (of those simulated beside the other stage's count) was over
    for e in plan["search"]["evaluated"]:
        fewer = (e["rollout_gpus"] < chosen["rollout_gpus"] and e["trainer_gpus"] == chosen["trainer_gpus"]) or (
            e["trainer_gpus"] < chosen["trainer_gpus"] and e["rollout_gpus"] == chosen["rollout_gpus"]
        )
        assert not fewer or e["iteration_s"] > bound, e


def test_the_search_generates_the_batches_once_per_rollout_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulated batches' generation depends on the rollout units alone: a search that simulates one rollout
    count beside several trainer counts generates its batches once (and the plan: its own, and one more unit's)."""
    calls = []
    generate = plan_predict.simulate_generation
    monkeypatch.setattr(plan_predict, "simulate_generation", lambda *a, **k: (calls.append(1), generate(*a, **k))[1])
    plan = make_plan(
        load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, rule="simulated")), options=OPTS
    )
    evaluated = plan["search"]["evaluated"]
    counts = {e["rollout_gpus"] for e in evaluated}
    assert len(counts) < len(evaluated)  # some rollout count beside several trainers
    # at most once per count (two counts of the same units, 6 and 7 GPUs of tp 2: once), not once per evaluation
    assert len(calls) <= OPTS.sim_iterations * (len(counts) + 2) < OPTS.sim_iterations * (len(evaluated) + 2)


def test_across_datacenters_a_fixed_count_is_kept_and_the_other_stage_searched(tmp_path: Path) -> None:
    job = write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, rule="simulated", trainer_gpus=8)
    plan = make_plan(load_job(job), options=OPTS)
    chosen, full, bound = _across(plan)
    assert {e["trainer_gpus"] for e in plan["search"]["evaluated"]} == {8} and _used(plan, "trainer") == 8
    assert full["rollout_gpus"] == 16 and chosen["iteration_s"] <= bound
    fixed = write_job(tmp_path, rollout=[{"site": "r20", "gpus": 8}], links=LINKS, rule="simulated", trainer_gpus=8)
    plan = make_plan(load_job(fixed), options=OPTS)
    assert plan["rule_applied"] == "paper" and "search" not in plan  # both given: nothing to search


# a fixed 3-GPU trainer (the fewest a 7B's shards and recomputed activations fit; 2 before activations were priced,
# slow enough then to hold the iteration, so that r20 gave up GPUs: at 3 it does not)
@pytest.mark.parametrize(("trainer_gpus", "fixed", "auto"), [("auto", "r20", "r100"), (3, "r100", "r20")])
def test_across_datacenters_a_fixed_rollout_site_holds_its_count_and_the_others_are_searched(
    tmp_path: Path, trainer_gpus: int | str, fixed: str, auto: str
) -> None:
    """One rollout site's count fixed, another's `auto`: the fixed site comes first in the fill order and holds its
    count in every allocation tried; the auto site gives up the GPUs the iteration does not need (before, it was
    given all of them, unsearched)."""
    rollout = [{"site": fixed, "gpus": 4}, {"site": auto}]
    job = write_job(tmp_path, rollout=rollout, links=LINKS, rule="simulated", trainer_gpus=trainer_gpus)
    plan = make_plan(load_job(job), options=OPTS)
    chosen, full, bound = _across(plan)
    sites = {a["site"]: a["gpus_used"] for a in plan["allocation"] if a["role"] == "rollout"}
    assert sites[fixed] == 4 and full["rollout_gpus"] == 4 + 16 and chosen["iteration_s"] <= bound
    tried = {e["rollout_gpus"] for e in plan["search"]["evaluated"]}
    assert min(tried) >= 4 and len(tried) > 1, tried  # never below the fixed count; the auto site searched
    assert sites[auto] == plan["search"]["chosen"] - 4
    if trainer_gpus != "auto":  # every allocation tried holds the trainer's fixed count
        assert {e["trainer_gpus"] for e in plan["search"]["evaluated"]} == {3} and _used(plan, "trainer") == 3


@pytest.mark.parametrize("rule", ["paper", "fewest_gpus"])
def test_algorithm_1_never_leaves_a_fixed_rollout_site_short(tmp_path: Path, rule: str) -> None:
    rollout = [{"site": "r20"}, {"site": "r100", "gpus": 4}]
    plan = make_plan(load_job(write_job(tmp_path, rollout=rollout, links=LINKS, rule=rule)), options=OPTS)
    assert {a["site"]: a["gpus_used"] for a in plan["allocation"] if a["role"] == "rollout"}["r100"] == 4


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_across_datacenters_the_simulated_rule_is_algorithm_1_outside_async(tmp_path: Path, mode: str) -> None:
    job = write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, rule="simulated", mode=mode)
    plan = make_plan(load_job(job), options=OPTS)
    assert plan["rule_applied"] == "paper" and "search" not in plan


def test_in_async_the_rebalance_advice_prices_one_more_unit_on_the_simulated_iteration(tmp_path: Path) -> None:
    """The stage makespans overstate generation when iterations overlap: the plan's δ is the trainer's wait in the
    simulated iteration and δ' what one more unit saves of it; a unit that saves nothing is not advised."""
    few = make_plan(load_job(write_job(tmp_path, rollout=[{"site": "r20", "gpus": 2}], links=LINKS)), options=OPTS)
    rb, pr = few["rebalance"], few["predicted"]
    assert rb["basis"] == "simulated_async" and rb["free_gpus"] == 14
    assert rb["delta_s"] == pytest.approx(pr["iteration_s"]["async"] - pr["t_train_s"])
    assert 0 < rb["delta_prime_s"] <= rb["delta_s"] and rb["add_unit"]  # 2 H20s cannot keep up with the trainer
    # the table says who adds it (it said "add one now", though the plan had just chosen its units)
    table = plan_table(few)
    assert "one more pays (δ ≥ δ'): `rlctl scale JOB --rollout +1` during the run, or rebalance.auto: true" in table
    args = table.split("`rlctl ", 1)[1].split("`", 1)[0].replace("JOB", "no-such-job").split()
    said = run_cli(*args).stderr  # the command as printed parses (it said `scale JOB +1`, which does not)
    assert said.startswith("rlctl: error: no job 'no-such-job' in the index"), said
    auto = _edit(write_job(tmp_path, rollout=[{"site": "r20", "gpus": 2}], links=LINKS), _rebalance_auto)
    few = make_plan(load_job(auto), options=OPTS)
    assert few["rebalance"]["auto"] and "the controller's rule (rebalance.auto) adds it" in plan_table(few)
    full = make_plan(
        load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, rule="simulated")), options=OPTS
    )
    rb = full["rebalance"]
    assert rb["free_gpus"] > 0 and rb["delta_prime_s"] < 0.01 * full["predicted"]["iteration_s"]["async"]
    assert not rb["add_unit"] and "not needed" in rb["reason"]  # the search left those GPUs out: they save nothing
    sync = make_plan(load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, mode="sync")), options=OPTS)
    assert sync["rebalance"]["basis"] == "stage_times"


def test_in_async_at_staleness_0_the_rebalance_advice_reads_the_stage_times_as_the_controller_does(
    tmp_path: Path,
) -> None:
    # the controller's rule reads the period and the trainer's wait only at η > 0 (Scaler.rebalance); the plan priced
    # δ on the simulated async iteration whenever the mode was async, a δ the controller never measures at η = 0
    job = _edit(write_job(tmp_path, rollout=[{"site": "r20", "gpus": 2}], links=LINKS), _staleness_0)
    plan = make_plan(load_job(job), options=OPTS)
    rb, pr = plan["rebalance"], plan["predicted"]
    assert rb["basis"] == "stage_times" and rb["delta_s"] == pytest.approx(pr["t_gen_s"] - pr["t_train_s"])


def _staleness_0(job: dict[str, Any]) -> None:
    job["pipeline"] = {**job.get("pipeline", {}), "staleness": 0}


def _rebalance_auto(job: dict[str, Any]) -> None:
    job["rebalance"] = {"auto": True}


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """`path` (a YAML file) changed in place by `change`."""
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_async_iteration_is_the_pipeline_s_steady_state_not_its_last_iteration_s_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An async iteration's tail shares its units' engines with the next η iterations; the last simulated ones have
    none, their gaps are about T_train, and averaging them in made the plan fast (cross-dc-7b on 20 H20 + 26 H800:
    62 s with one batch, for 83 s). The plan's figure is the mean period of a long run of the same batch (16
    iterations, none of them the last)."""
    job = load_job(ROOT / "jobs/cross-dc-7b.yaml")
    placement = job.spec.placement
    trainer = placement.trainer.model_copy(update={"gpus": 128})
    rollout = [placement.rollout[0].model_copy(update={"gpus": 20})]
    # the default budgets, a data-parallel rank's (until 2026-12-07 they bounded a whole cut: 1 to 3 rows of its
    # 3,262-token rows, most ranks idle, a trainer-bound iteration; the test cut by 32 rows alone then); 128 H800s:
    # a rank holds a 20,512-token row's activations at tp 4 pp 4 alone (`profiler.actmem`), 26 hold no split of it
    job.spec = job.spec.model_copy(
        update={"placement": placement.model_copy(update={"trainer": trainer, "rollout": rollout})}
    )
    seen: list[tuple[Any, dict[str, Any]]] = []

    def spy(works: Any, **kw: Any) -> Any:
        seen.append((works, kw))
        return simulate_job(works, **kw)

    monkeypatch.setattr(plan_predict, "simulate_job", spy)
    plan = make_plan(job, options=PlanOptions(sim_iterations=1, curves_in_output=False))
    works, kw = next((w, kw) for w, kw in seen if kw["mode"] == "async")  # the plan's own (then rebalance's)
    ends = simulate_job([works[0]] * 17, mode="async", weight_sync_s=kw["weight_sync_s"], eta=kw["eta"]).train_end_s
    steady_s = (ends[15] - ends[1]) / 14
    assert steady_s > 3 * plan["predicted"]["t_train_s"]  # generation-bound: a gap of about T_train would show
    assert plan["predicted"]["iteration_s"]["async"] == pytest.approx(steady_s, rel=0.01)


def _six_gpu_hosts(tmp: Path, *, rollout_gpus: int | str, rollout_tp: int | None = None) -> Path:
    """r20 as 4 hosts of 6 H20s; rollout on it with `rollout_gpus` (and the job's TP, if given), trainer 8 H800s."""
    job = write_job(tmp, rollout=[{"site": "r20", "gpus": rollout_gpus}], links=LINKS, trainer_gpus=8, mode="sync")
    _edit(tmp / "inv.yaml", lambda inv: inv["sites"]["r20"].update(nodes=[{"host": "r-[1-4]", "gpus": 6}]))
    if rollout_tp is not None:
        _edit(job, lambda j: j.update(rollout={"tensor_parallel": rollout_tp}))
    return job


def test_tensor_parallel_units_are_only_those_that_fit_on_a_host(tmp_path: Path) -> None:
    """A TP group stays inside a node (`GpuPool.take`): 4 hosts of 6 GPUs hold 4 units of TP 4 (16 of the 24 GPUs),
    not ⌊24 / 4⌋ = 6; every unit of the plan is placed by the launcher's pool, and no unit is advised that has no
    host to go to."""
    assert units_that_fit([6] * 4, 4, 24).tolist() == [0] * 4 + [1] * 6 + [2] * 6 + [3] * 6 + [4] * 3
    assert units_that_fit([8, 8], 4, 12)[12] == 3 and units_that_fit([6, 8], 4, 20)[20] == 3
    job = load_job(_six_gpu_hosts(tmp_path, rollout_gpus=24, rollout_tp=4))
    plan = make_plan(job, options=PlanOptions(sim_iterations=1, curves_in_output=False))
    (r20,) = [a for a in plan["allocation"] if a["role"] == "rollout"]
    assert r20["config"] == {"tp": 4, "dp": 4} and r20["gpus_used"] == 16
    pool = GpuPool("r20", job.inventory.sites["r20"])
    assert len({pool.take(4, who=f"rollout-{i}").host for i in range(r20["instances"])}) == 4
    rb = plan["rebalance"]
    assert rb["free_gpus"] == 8 and not rb["add_unit"] and rb["reason"].startswith("no rollout site has room")


@pytest.mark.parametrize("tp", [3, 8, 16])
def test_a_rollout_tp_the_profile_does_not_price_is_refused_naming_the_field(tmp_path: Path, tp: int) -> None:
    """qwen2.5-7b's 28 heads split at tp 1, 2, 4 on a node: a job's tp 3, 8 or 16 is its rollout.tensor_parallel's
    error, exit 2 (it was 'model qwen2.5-7b does not fit on H20 at any TP degree ≤ 8', exit 1: it fits at tp 1)."""
    job = load_job(_six_gpu_hosts(tmp_path, rollout_gpus="auto", rollout_tp=tp))
    with pytest.raises(ConfigError) as e:
        make_plan(job, options=OPTS)
    assert (e.value.file, e.value.field) == (str(job.path), "rollout.tensor_parallel")
    assert e.value.detail == (
        f"{tp}: the analytical profile prices the units of qwen2.5-7b on site 'r20' at tp 1, 2, 4 only; use one of them"
    )


def test_a_fixed_rollout_count_below_one_unit_of_a_priced_tp_is_the_count_s_error(tmp_path: Path) -> None:
    """2 GPUs at tp 4 (a tp the profile prices): the count holds no unit. It was the tp's error, in words that were not
    true ('4: the analytical profile prices the units … at tp 1, 2 only': the tps that fit in 2 GPUs), and check said
    it beside the count's own line."""
    job = load_job(_six_gpu_hosts(tmp_path, rollout_gpus=2, rollout_tp=4))
    with pytest.raises(ConfigError) as e:
        make_plan(job, options=OPTS)
    assert (e.value.file, e.value.field) == (str(job.path), "placement.rollout[0].gpus")
    assert e.value.detail == "2 is not a multiple of rollout.tensor_parallel 4: 0 unit(s) and 2 GPU(s) idle; use 4"


def test_fewest_gpus_does_not_choose_among_plans_of_fixed_counts(tmp_path: Path) -> None:
    """Of the plans of the trainer's tp classes `best_plan` takes the fastest; rule fewest_gpus the fewest GPUs within
    ε, and only when some count is auto: with every count fixed the plans hold the same GPUs (the ranks, the counts),
    and rule and ε are refused by check as unread (it took a slower plan that happened to use fewer GPUs before)."""

    def plan(iteration_s: float, gpus: int) -> dict[str, Any]:
        return {"predicted": {"iteration_s": {"async": iteration_s}}, "allocation": [{"gpus_used": gpus}]}

    fast, fewer = plan(10.0, 16), plan(10.4, 12)
    job = load_job(write_job(tmp_path, rollout=[{"site": "r20", "gpus": 8}], links=LINKS, rule="fewest_gpus"))
    assert planner.best_plan(job, [fast, fewer]) is fewer  # the trainer's count is auto
    fixed = load_job(
        write_job(tmp_path, rollout=[{"site": "r20", "gpus": 8}], links=LINKS, rule="fewest_gpus", trainer_gpus=8)
    )
    assert planner.best_plan(fixed, [fast, fewer]) is fast


def test_weight_sync_counts_a_hop_per_host_after_the_first(tmp_path: Path) -> None:
    """12 GPUs of 8-GPU hosts are 2 hosts: the weights take one intra-site hop, as 16 GPUs do (⌊12 / 8⌋ − 1 = 0
    left it out); 8 GPUs are one host, no hop."""
    job = load_job(write_job(tmp_path, rollout=[{"site": "r20", "gpus": 12}], links=LINKS))
    one, two, full = (plan_weightsync.slowest_weight_sync_s(job, {"r20": x}) for x in (8, 12, 16))
    assert one < two == full


def test_weight_sync_in_another_datacenter_shares_the_relay_s_host_link_among_its_chains(tmp_path: Path) -> None:
    """r20 (here 3 hosts of 8, 10 Gbps, behind an 80 Gbps link): its relay heads weight_sync.chains_per_datacenter
    chains of the other hosts, which share the relay's host link: 24 GPUs (two hosts after the relay's) sync at
    half the rate with two chains as with one; 16 GPUs (one host after it) make one chain either way."""
    job = write_job(tmp_path, rollout=[{"site": "r20", "gpus": 24}], links=LINKS)
    _edit(tmp_path / "inv.yaml", lambda inv: inv["sites"]["r20"]["nodes"][0].update(host="r-[1-3]"))
    syncs = {}
    for chains in (1, 2):
        _edit(job, lambda j: j.update(weight_sync={"chains_per_datacenter": chains}))  # noqa: B023
        loaded = load_job(job)
        syncs[chains] = [plan_weightsync.slowest_weight_sync_s(loaded, {"r20": x}) for x in (8, 16, 24)]
    assert syncs[1][0] == syncs[2][0] < syncs[1][1] == syncs[2][1] < syncs[1][2]
    assert syncs[2][2] == pytest.approx(2 * syncs[1][2], rel=0.01)


def test_weight_sync_of_a_site_in_the_trainer_s_datacenter_takes_no_relay_chains(tmp_path: Path) -> None:
    """The runtime's relay and its chains_per_datacenter chains are a datacenter's without a trainer rank
    (`weights/plan.py`); a rollout site in the trainer's datacenter, another site than the trainer's, gets chains from
    the trainer's ranks, as the trainer's own site does. The planner priced it per site: 24 GPUs of r20 in datacenter
    'a' synced twice as slowly with two chains as with one (the count the runtime never reads there)."""
    job = write_job(tmp_path, rollout=[{"site": "r20", "gpus": 24}], links=LINKS)
    _edit(tmp_path / "inv.yaml", lambda inv: inv["sites"]["r20"].update(datacenter="a"))
    _edit(tmp_path / "inv.yaml", lambda inv: inv["sites"]["r20"]["nodes"][0].update(host="r-[1-3]"))
    syncs = {}
    for chains in (1, 2):
        _edit(job, lambda j: j.update(weight_sync={"chains_per_datacenter": chains}))  # noqa: B023
        loaded = load_job(job)
        syncs[chains] = [plan_weightsync.slowest_weight_sync_s(loaded, {"r20": x}) for x in (8, 16, 24)]
    assert syncs[1] == syncs[2]
    assert syncs[1][1] < syncs[1][2]  # the third host is one more hop of the one chain


def test_the_dispatch_report_s_site_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    """Two rollout sites with as many units each: the report is on the first in the placement, in every process
    (it was the first of a set of names, whose order moves with PYTHONHASHSEED: 'r20' under seed 2)."""
    rollout = [{"site": "r100", "gpus": 8}, {"site": "r20", "gpus": 8}]
    job = write_job(tmp_path, rollout=rollout, links=LINKS, trainer_gpus=8, mode="sync")
    _edit(job, lambda j: j.update(rollout={"tensor_parallel": 1}))  # 8 units on each site
    code = (
        "import sys; from pathlib import Path; from rlctl.config import load_job; "
        "from rlctl.planner.inputs import PlanOptions; from rlctl.planner.plan import make_plan; "
        "p = make_plan(load_job(Path(sys.argv[1])), options=PlanOptions(sim_iterations=1, curves_in_output=False)); "
        "print(p['dispatch']['site'], *(a['instances'] for a in p['allocation'][1:]))"
    )
    for seed in ("0", "1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, str(job)], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == ["r100", "8", "8"], (seed, out.stderr)


# -- tensor-parallel trainer groups, each on one host (`rlctl.config.hostfill`) ------------------------------
# megatron (no activation checkpointing) at tp 4: a rank's share of a cut one 5,512-token row of write_job's (or two
# of half that), whose activations fit beside its state; the default 8,192 tokens a rank do not (75.2 GB at tp 1)
ROW_A_RANK = {"prompts_per_iteration": 32, "samples_per_prompt": 8, "train_micro_batch_tokens": 5512}


def _six_gpu_trainer(
    tmp: Path, *, trainer_gpus: int | str, rollout: list[dict[str, Any]], hosts: str = "t-[1-4]"
) -> Path:
    """trn as hosts of 6 H800s, the trainer at tp 4 (megatron) with `trainer_gpus`, rollout as given (sync mode)."""
    job = write_job(tmp, rollout=rollout, links=LINKS, trainer_gpus=trainer_gpus, mode="sync")
    trn = {"nodes": [{"host": hosts, "gpus": 6}], "network": {"bandwidth_gbps": 400}}  # dp pays across hosts
    _edit(tmp / "inv.yaml", lambda inv: inv["sites"]["trn"].update(trn))
    _edit(job, lambda j: j.update(trainer={"backend": "megatron", "tensor_parallel": 4}, batch=ROW_A_RANK))
    return job


def test_the_trainer_curve_holds_only_counts_whose_tp_groups_each_fit_a_host(tmp_path: Path) -> None:
    """4 hosts of 6 GPUs at tp 4 hold 4 groups (16 GPUs), not 6: 20 or 24 ranks would put a group on two hosts
    (its tensor-parallel all-reduces over the network). Every point of the trainer curve places (`GpuPool`), and
    the full allocation the paper rule starts from is 16 ranks."""
    job = load_job(_six_gpu_trainer(tmp_path, trainer_gpus="auto", rollout=[{"site": "r20"}]))
    plan = make_plan(job, options=PlanOptions(sim_iterations=1))
    points = plan["stage_curves"]["training"]["trn"]
    assert max(p["tp"] * p["pp"] * p["dp"] for p in points) == 16
    hosts = [g for _, g in job.inventory.sites["trn"].hosts]
    for p in points:
        ranks = p["tp"] * p["pp"] * p["dp"]
        placed = trainer_slots(hosts, ranks, tp=p["tp"])
        assert placed is not None and placed[0] <= p["gpus"], p
    (t,) = [a for a in plan["allocation"] if a["role"] == "trainer"]
    assert t["config"]["tp"] == 4 and t["gpus_used"] <= 16
    pool = GpuPool("trn", job.inventory.sites["trn"])
    slices = pool.take_ranks(t["gpus_used"], who="the trainer", tp=4)
    assert all(len({s.host for s in slices[i : i + 4]}) == 1 for i in range(0, len(slices), 4))


def test_a_fixed_trainer_count_whose_tp_groups_cannot_each_fit_a_host_is_refused(tmp_path: Path) -> None:
    """The job file's count at its tp: a config error naming the file and field (`rlctl plan` exits 2, as check)."""
    job = load_job(_six_gpu_trainer(tmp_path, trainer_gpus=12, rollout=[{"site": "r20"}], hosts="t-[1-2]"))
    with pytest.raises(ConfigError) as e:
        make_plan(job, options=OPTS)
    assert str(e.value) == (
        f"{job.path}: placement.trainer.gpus: site trn: trainer 12 GPU(s) at tp 4 need 3 tp group(s) of 4 GPUs, each "
        "on one host; its hosts have 6, 6 GPU(s) (free): room for 2 group(s) (8 GPUs)"
    )


def test_rollout_on_a_shared_site_gets_the_slots_the_trainers_tp_groups_leave(tmp_path: Path) -> None:
    """8 ranks at tp 4 on 6-GPU hosts take hosts 1 and 2 (4 each); host 1's 2 others count as the trainer's (units
    fill from host 4, reaching them last), host 2's as the rollout's: 14 GPUs, not 24 − 8 = 16. The launcher's
    pool places every unit of the plan where the planner put it: hosts 4, 3, then 2."""
    job = load_job(_six_gpu_trainer(tmp_path, trainer_gpus=8, rollout=[{"site": "trn"}]))
    _edit(job.path, lambda j: j.update(rollout={"tensor_parallel": 1}))
    job = load_job(job.path)
    plan = make_plan(job, options=PlanOptions(sim_iterations=1, curves_in_output=False))
    (r,) = [a for a in plan["allocation"] if a["role"] == "rollout"]
    assert r["config"]["tp"] == 1 and r["gpus_used"] <= 14
    pool = GpuPool("trn", job.inventory.sites["trn"], shares_trainer=True)
    pool.take_ranks(8, who="the trainer", tp=4)
    units = [pool.take(1, who=f"rollout-{i}").host for i in range(r["instances"])]
    assert units == (["t-4"] * 6 + ["t-3"] * 6 + ["t-2"] * 2)[: r["instances"]]


# 100 Gbit/s a host: tp 4's dp 2 all-reduces less over the network than tp 2's dp 4, which at 400 (a ring's network
# hop at the host's whole NICs, not a GPU's 1/6) costs less than tp 4's extra tensor-parallel all-reduces
SIX_GPU_HOSTS = {"nodes": [{"host": "t-[1-4]", "gpus": 6}], "network": {"bandwidth_gbps": 100}}


def _trainer_of(plan: dict[str, Any]) -> tuple[dict[str, int], float]:
    (t,) = [a for a in plan["allocation"] if a["role"] == "trainer"]
    return t["config"], t["predicted_s"]


# (a 32B's state at 8 ranks, 67.6 GB a rank at tp 4 pp 2, leaves no room for a cut's activations: not planned)
@pytest.mark.parametrize("model", ["qwen2.5-7b"])
def test_a_fixed_trainer_count_on_its_own_site_gets_its_fastest_split(tmp_path: Path, model: str) -> None:
    """8 ranks on 6-GPU hosts: tp 2 takes 8 slots, tp 4 (faster here) 10, its groups passing over host 1's
    leftover. On a site the trainer has to itself the slots beyond its ranks cost nothing: the plan, hence the
    launch (`counts.plan_counts`), runs the fastest split, not the one of fewest slots."""
    job = write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS, trainer_gpus=8, mode="sync")
    _edit(tmp_path / "inv.yaml", lambda inv: inv["sites"]["trn"].update(SIX_GPU_HOSTS))
    _edit(job, lambda j: j.update(trainer={"backend": "megatron"}, model={"kind": "builtin", "name": model}))
    plan = make_plan(load_job(job), options=PlanOptions(sim_iterations=1))
    points = plan["stage_curves"]["training"]["trn"]
    assert {p["tp"] for p in points} == {2, 4}
    config, seconds = _trainer_of(plan)
    assert seconds == pytest.approx(min(p["seconds"] for p in points), rel=1e-12)
    assert config["tp"] == 4 and config["tp"] * config["pp"] * config["dp"] == 8


@pytest.mark.parametrize(("rollout_gpus", "tp"), [(14, 4), (16, 2)])
def test_a_fixed_trainer_count_beside_a_fixed_rollout_gets_the_fastest_split_that_fits(
    tmp_path: Path, rollout_gpus: int, tp: int
) -> None:
    """The same 8 ranks on 24 GPUs the rollout shares: beside 14 rollout GPUs tp 4's 10 slots fit (the faster),
    beside 16 only tp 2's 8 do."""
    job = write_job(tmp_path, rollout=[{"site": "trn", "gpus": rollout_gpus}], links=LINKS, trainer_gpus=8, mode="sync")
    _edit(tmp_path / "inv.yaml", lambda inv: inv["sites"]["trn"].update(SIX_GPU_HOSTS))
    _edit(job, lambda j: j.update(trainer={"backend": "megatron"}))
    plan = make_plan(load_job(job), options=PlanOptions(sim_iterations=1, curves_in_output=False))
    config, _ = _trainer_of(plan)
    assert config["tp"] == tp and config["tp"] * config["pp"] * config["dp"] == 8, config


def _slurm_trainer(tmp: Path, *, trainer_gpus: int | str) -> Path:
    """trn as a SLURM partition of four 8-GPU nodes, the trainer at tp 4 (megatron)."""
    job = write_job(tmp, rollout=[{"site": "r20"}], links=LINKS, trainer_gpus=trainer_gpus, mode="sync")
    _edit(tmp / "inv.yaml", lambda inv: inv["sites"]["trn"].update(scheduler={"kind": "slurm", "partition": "p"}))
    _edit(job, lambda j: j.update(trainer={"backend": "megatron", "tensor_parallel": 4}, batch=ROW_A_RANK))
    return job


def test_a_slurm_trainer_is_priced_and_refused_as_its_sbatch_places_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLURM starts as many ranks on each node, a multiple of tp dividing them (`hostfill.slurm_layout`): at tp 4 on
    four 8-GPU nodes 20 ranks have no such layout (hosts filled in order would take 8 + 8 + 4), so a fixed 20 is
    refused and the curve holds no 20 or 28; 12 ranks are 3 nodes of 4, their slots the ranks."""
    seen: dict[str, Any] = {}
    orig = plan_placement.train_stage_curve

    def keep(*a: Any, **k: Any) -> Any:
        seen["curve"] = orig(*a, **k)
        return seen["curve"]

    monkeypatch.setattr(plan_placement, "train_stage_curve", keep)
    make_plan(load_job(_slurm_trainer(tmp_path, trainer_gpus="auto")), options=PlanOptions(sim_iterations=1))
    assert trainer_slots([8] * 4, 12, tp=4, slurm=True) == (12, 3)
    ranks = {c.tp * c.pp * c.dp for c in seen["curve"].configs if c is not None}
    assert ranks and not ranks & {20, 28}
    plan = make_plan(load_job(_slurm_trainer(tmp_path, trainer_gpus=12)), options=OPTS)
    assert _trainer_of(plan)[0] == {"tp": 4, "pp": 1, "dp": 3}
    fixed = load_job(_slurm_trainer(tmp_path, trainer_gpus=20))
    field = r": placement\.trainer\.gpus: "
    with pytest.raises(ConfigError, match=field + r"site trn: trainer 20 GPU\(s\) at tp 4 on SLURM need as many ranks"):
        make_plan(fixed, options=OPTS)


@pytest.mark.parametrize(
    ("hosts", "units"),
    [([2, 8], ["t-1"] * 2), ([2, 8, 2, 8], ["t-3"] * 2 + ["t-1"] * 2 + ["t-4"] * 8)],
)
def test_a_host_too_small_for_a_trainer_group_is_the_rollouts_on_a_shared_site(
    tmp_path: Path, hosts: list[int], units: list[str]
) -> None:
    """8 ranks at tp 4 pass over a 2-GPU host whole (`ranks_per_host`): its GPUs are the rollout's, not slots the
    trainer moved past. Hosts [2, 8]: the trainer on t-2, 2 one-GPU units on t-1 (the plan said no feasible split);
    the planner prices the units on the hosts the launcher's pool puts them on, in the same order."""
    job = write_job(tmp_path, rollout=[{"site": "trn"}], links=LINKS, trainer_gpus=8, mode="sync")
    nodes = [{"host": f"t-{i}", "gpus": g} for i, g in enumerate(hosts, 1)]
    _edit(tmp_path / "inv.yaml", lambda inv: inv["sites"]["trn"].update(nodes=nodes))
    trainer = {"backend": "megatron", "tensor_parallel": 4}
    _edit(job, lambda j: j.update(trainer=trainer, rollout={"tensor_parallel": 1}, batch=ROW_A_RANK))
    loaded = load_job(job)
    plan = make_plan(loaded, options=PlanOptions(sim_iterations=1, curves_in_output=False))
    (r,) = [a for a in plan["allocation"] if a["role"] == "rollout"]
    assert (r["gpus_used"], r["instances"]) == (len(units), len(units))
    pool = GpuPool("trn", loaded.inventory.sites["trn"], shares_trainer=True, trainer_tp=4)
    assert {s.host for s in pool.take_ranks(8, who="the trainer", tp=4)} == {"t-2"}
    assert [pool.take(1, who=f"rollout-{i}").host for i in range(r["instances"])] == units


@pytest.mark.parametrize("hosts", [[2, 8], [2, 8, 2, 8]])
def test_where_the_planner_chooses_the_trainers_tp_a_host_too_small_for_its_groups_is_the_rollouts(
    tmp_path: Path, hosts: list[int]
) -> None:
    """The job above with trainer.tensor_parallel unset: the planner's tp 4 split prices the 2-GPU hosts as the
    rollout's as the job's tp 4 does, and the plan is the job's-tp-4 plan (tp 2 pp 4 was chosen, tp 4's groups
    charged the 2-GPU hosts: on hosts [2, 8] no GPU left for rollout). Each class of tps giving one host order is
    planned on its own (`trainer_tp_classes`); the launch orders the rollout by the plan's tp."""
    nodes = [{"host": f"t-{i}", "gpus": g} for i, g in enumerate(hosts, 1)]
    plans = []
    for trainer in ({"backend": "megatron"}, {"backend": "megatron", "tensor_parallel": 4}):
        tmp = tmp_path / str(len(plans))
        tmp.mkdir()
        job = write_job(tmp, rollout=[{"site": "trn"}], links=LINKS, trainer_gpus=8, mode="sync")
        _edit(tmp / "inv.yaml", lambda inv: inv["sites"]["trn"].update(nodes=nodes))
        _edit(job, lambda j, t=trainer: j.update(trainer=t, rollout={"tensor_parallel": 1}, batch=ROW_A_RANK))
        plans.append(make_plan(load_job(job), options=PlanOptions(sim_iterations=1, curves_in_output=False)))
    unset, tp4 = plans
    assert unset["allocation"] == tp4["allocation"] and unset["predicted"] == tp4["predicted"]
    assert _trainer_of(unset)[0]["tp"] == 4
    classes = {tuple(c["tps"]): c["chosen"] for c in unset["trainer_tp_classes"]}
    assert classes == {(1, 2): False, (4,): True}  # tp 1 and 2 fit in 2-GPU hosts, tp 4 passes over them
    assert "trainer_tp_classes" not in tp4


# -- several `auto` rollout sites of different GPU types ---------------------------------------------------
def _split_s(curves: dict[str, dict[int, float]], split: dict[str, int]) -> float:
    """The combined generation time of `split` (GPUs per site) on the plan's stage curves: rates add up."""
    rate = sum(1 / curves[s][g] for s, g in split.items() if g)
    return 1 / rate if rate else math.inf


def test_auto_rollout_sites_of_different_gpus_get_the_split_that_finishes_soonest(tmp_path: Path) -> None:
    """H20s (r20) and A100s (r100), both `auto`; the A100s priced so low that they come first in the fill order. The
    rollout GPUs the plan chooses are split as finishes generation soonest on the planner's own curves (no other
    split of the same total is faster), not all A100s first while the H20s wait. (The fewest GPUs within ε: a part of
    the sites' GPUs, where the split matters.)"""
    job = write_job(tmp_path, rollout=[{"site": "r20"}, {"site": "r100"}], links=LINKS, rule="fewest_gpus", mode="sync")
    _edit(tmp_path / "inv.yaml", lambda inv: inv["sites"]["r100"].update(cost_per_gpu_hour=0.05))
    plan = make_plan(load_job(job), options=PlanOptions(sim_iterations=1))
    curves = {
        s: {0: math.inf} | {p["gpus"]: p["seconds"] for p in points}
        for s, points in plan["stage_curves"]["generation"].items()
    }
    chosen = {a["site"]: a["gpus_used"] for a in plan["allocation"] if a["role"] == "rollout"}
    total = sum(chosen.values())
    assert 0 < total < 32  # a part of the sites' GPUs: the split matters
    best = min(_split_s(curves, {"r20": g, "r100": total - g}) for g in range(max(0, total - 16), min(16, total) + 1))
    assert _split_s(curves, chosen) == pytest.approx(best, rel=1e-9), chosen
    assert chosen["r20"] > 0


def test_growing_lengths_are_planned_at_the_runs_middle_iteration(tmp_path: Path) -> None:
    """Linear growth (median × (1 + growth × i), the cap kept): 21 iterations at 0.1 are planned at iteration 10,
    twice the median; a job whose lengths grow needs more rollout than one whose lengths stay."""
    path = write_job(tmp_path, rollout=[{"site": "r20", "gpus": "auto"}], links=LINKS)
    data = yaml.safe_load(path.read_text())

    def plan(growth: float) -> tuple[Any, dict[str, Any]]:
        data["iterations"] = 21
        data["task"]["growth_per_iteration"] = growth
        path.write_text(yaml.safe_dump(data))
        job = load_job(path)
        return plan_inputs.length_model(job), make_plan(job)

    (flat, flat_plan), (grown, grown_plan) = plan(0.0), plan(0.1)
    assert (flat.median, flat.cap) == (700, 5000)
    assert (grown.median, grown.cap) == pytest.approx((1400, 5000))
    assert grown_plan["predicted"]["t_gen_s"] > flat_plan["predicted"]["t_gen_s"]  # the tail, at the cap, the same


def test_a_staleness_past_the_simulated_iterations_is_simulated_as_that_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From η = the simulated iterations on, no simulated iteration waits for weights: a larger η (a job of 10^6
    iterations at staleness 1024, the most its 256 samples an iteration take: MAX_SAMPLES_AHEAD) changes no figure
    and is simulated as that many, where it made `plan` and `check` run for minutes (simulate_job runs each engine
    over i + η shares: η 1000 took 18 s, 10000 over 120 s)."""
    seen: list[tuple[int, dict[str, Any]]] = []

    def spy(works: Any, **kw: Any) -> Any:
        seen.append((len(works), kw))
        assert len(works) <= 4 * plan_predict.MIN_SIM_ITERATIONS, f"{len(works)} works: minutes to simulate"
        return simulate_job(works, **kw)

    monkeypatch.setattr(plan_predict, "simulate_job", spy)
    path = write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS)
    opts = PlanOptions(sim_iterations=1, curves_in_output=False)
    ref = make_plan(load_job(_edit(path, lambda j: j.update(pipeline={"mode": "async", "staleness": 6}))), options=opts)
    seen.clear()
    huge = load_job(_edit(path, lambda j: j.update(iterations=10**6, pipeline={"mode": "async", "staleness": 1024})))
    plan = make_plan(huge, options=opts)
    n, kw = next((n, kw) for n, kw in seen if kw["mode"] == "async")
    steady = plan_predict.MIN_SIM_ITERATIONS
    assert (n, kw["eta"], kw["drain"]) == (2 * steady, steady, steady)
    assert plan["predicted"] == ref["predicted"]


def test_a_recorded_staleness_past_the_samples_created_ahead_is_simulated_as_the_controller_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller creates rounds at most MAX_SAMPLES_AHEAD samples ahead of the trainer (`rounds_ahead`): a job
    whose η is past that (one an older rlctl launched: `load_job` refuses it since) is priced at the rounds it runs
    ahead, versus at its η (1024 × 128 samples at η 8: priced 6 iterations ahead, the simulated ones, run 2 ahead).
    The bound is scaled down to this job's 256 samples an iteration: 512 samples, 2 rounds."""
    seen: list[dict[str, Any]] = []

    def spy(works: Any, **kw: Any) -> Any:
        seen.append(kw)
        return simulate_job(works, **kw)

    monkeypatch.setattr(plan_predict, "simulate_job", spy)
    monkeypatch.setattr(pipeline_config, "MAX_SAMPLES_AHEAD", 512)
    job = load_job(write_job(tmp_path, rollout=[{"site": "r20"}], links=LINKS))
    recorded = job.spec.model_copy(update={"pipeline": Pipeline(mode="async", staleness=6)})
    make_plan(Job(recorded, job.inventory, job.path), options=PlanOptions(sim_iterations=1, curves_in_output=False))
    asynchronous = next(kw for kw in seen if kw["mode"] == "async")
    assert (asynchronous["eta"], asynchronous["drain"]) == (2, 2)


def _relabel(tmp: Path, datacenters: dict[str, str], *, extra: dict[str, str] | None = None) -> None:
    """inv.yaml's sites moved into `datacenters`; `extra`: new sites (name → datacenter), each a copy of r20."""
    inv = yaml.safe_load((tmp / "inv.yaml").read_text())
    for site, dc in (extra or {}).items():
        inv["sites"][site] = {**inv["sites"]["r20"], "datacenter": dc, "nodes": [{"host": f"{site}-1", "gpus": 8}]}
    for site, dc in datacenters.items():
        inv["sites"][site]["datacenter"] = dc
    (tmp / "inv.yaml").write_text(yaml.safe_dump(inv))


def test_a_route_through_a_datacenter_the_job_has_no_rollout_in_is_refused_as_the_weight_plane_cannot_take_it(
    tmp_path: Path,
) -> None:
    """Rollout on r100 (datacenter c) alone, links trn–r20 and r20–r100: datacenter b holds no unit of the job to
    relay the copy (`weights.plan.dc_parents`), so plan refuses it in the inventory's `links` line, naming b; versus
    pricing a → b → c while the weight plane routed as if a and c were linked (an unpriced direct link)."""
    links = [LINKS[0], {"between": ["r20", "r100"], "bandwidth_gbps": 40}]
    job = load_job(write_job(tmp_path, rollout=[{"site": "r100", "gpus": 8}], links=links, trainer_gpus=8))
    with pytest.raises(ConfigError, match="path through datacenter 'b' is not one: the job has no rollout") as e:
        make_plan(job, options=OPTS)
    assert (e.value.file, e.value.field) == (str(tmp_path / "inv.yaml"), "links")


def test_a_link_from_a_site_the_job_does_not_use_joins_its_datacenters_and_is_priced(tmp_path: Path) -> None:
    """r20 and r100 share datacenter b, the job's rollout is on r20, the one link is trn–r100 (b's uplink declared
    from r100): it joins a and b (`Inventory.links_among`: a link is between datacenters), so plan prices r20's copy
    over it (40 Gb/s, 1 ms), the same as with the link declared from r20, versus refusing the job ('a link from a
    site the job does not use is not one') that passed before 2026-12-06."""
    rollout = [{"site": "r20", "gpus": 8}]
    path = write_job(tmp_path, rollout=rollout, links=[LINKS[1]], trainer_gpus=8)
    _relabel(tmp_path, {"r100": "b"})
    job = load_job(path)
    sites, units = plan_weightsync.weight_sites(job, ["r20"])
    assert sites == ["trn", "r20"]
    assert plan_weightsync.weight_route(job.inventory, "trn", "r20", job_sites=sites, unit_sites=units) == (
        40e9 / 8,
        0.001,
    )
    priced = make_plan(job, options=OPTS)["predicted"]["weight_sync_s"]
    own = write_job(tmp_path, rollout=rollout, links=[{**LINKS[1], "between": ["trn", "r20"]}], trainer_gpus=8)
    _relabel(tmp_path, {"r100": "b"})
    assert 0 < priced == make_plan(load_job(own), options=OPTS)["predicted"]["weight_sync_s"] < math.inf


def test_of_two_links_between_the_same_datacenters_the_route_takes_the_fastest(tmp_path: Path) -> None:
    """trn–r100 (40 Gb/s) and trn2–r100 (80 Gb/s, 3 ms), neither from r20 nor trn2 a site of the job, both join a
    and b: r20's copy is priced over the fastest (`Inventory.dc_links_among`), its latency with it; a link declared
    between the two sites themselves (trn–r100 for r100) is taken before it."""
    links = [LINKS[1], {"between": ["trn2", "r100"], "bandwidth_gbps": 80, "latency_ms": 3}]
    path = write_job(tmp_path, rollout=[{"site": "r20", "gpus": 8}], links=links, trainer_gpus=8)
    _relabel(tmp_path, {"r100": "b"}, extra={"trn2": "a"})
    job = load_job(path)
    sites, units = plan_weightsync.weight_sites(job, ["r20"])
    route = plan_weightsync.weight_route(job.inventory, "trn", "r20", job_sites=sites, unit_sites=units)
    assert route == (80e9 / 8, 0.003)
    assert plan_weightsync.weight_route(job.inventory, "trn", "r100", job_sites=sites, unit_sites=units) == (
        40e9 / 8,
        0.001,
    )


def test_of_two_equally_short_routes_plan_prices_the_one_the_broadcast_tree_takes(tmp_path: Path) -> None:
    """a reaches d over b (a–b 80, b–d 10 Gb/s) or over c (80, 80): the weight plane's tree goes through b, first
    by name (`dc_parents`), and plan prices that 10 Gb/s hop; versus the route through c (the first declared)."""
    links = [
        {"between": ["trn", "r100"], "bandwidth_gbps": 80},
        {"between": ["r100", "rd"], "bandwidth_gbps": 80},
        {"between": ["trn", "r20"], "bandwidth_gbps": 80},
        {"between": ["r20", "rd"], "bandwidth_gbps": 10, "latency_ms": 3},
    ]
    rollout = [{"site": s, "gpus": 8} for s in ("r20", "r100", "rd")]
    path = write_job(tmp_path, rollout=rollout, links=links, trainer_gpus=8)
    _relabel(tmp_path, {}, extra={"rd": "d"})
    job = load_job(path)
    sites, units = plan_weightsync.weight_sites(job, ["r20", "r100", "rd"])
    route = plan_weightsync.weight_route(job.inventory, "trn", "rd", job_sites=sites, unit_sites=units)
    assert route == (10e9 / 8, 0.004)


def test_an_allocation_that_leaves_the_relay_datacenter_empty_is_priced_out(tmp_path: Path) -> None:
    """Links trn–r20 and r20–r100: 8 GPUs on r100 and none on r20 leave no unit in b to relay the copy to c, a
    weight sync the search passes over (inf, none of its iterations run), versus priced a → b → c; with units on
    r20 too it is the path's. The auto plan still chooses an allocation that holds both."""
    links = [LINKS[0], {"between": ["r20", "r100"], "bandwidth_gbps": 40}]
    job = load_job(write_job(tmp_path, rollout=[{"site": "r20"}, {"site": "r100"}], links=links, trainer_gpus=8))
    assert plan_weightsync.slowest_weight_sync_s(job, {"r20": 0, "r100": 8}) == math.inf
    assert 0 < plan_weightsync.slowest_weight_sync_s(job, {"r20": 8, "r100": 8}) < math.inf
    plan = make_plan(job, options=OPTS)
    assert 0 < plan["predicted"]["weight_sync_s"] < math.inf
    assert {a["site"] for a in plan["allocation"] if a["role"] == "rollout" and a["gpus_used"]} >= {"r20"}
