"""A resume at another trainer split (`launch --resume --trainer-split`) and plan.json's planner section: made for the
new split by the planner, or its trainer figures dropped where they cannot be (`ops.trainersplit._repriced`)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.agents.placement import Placement, sites_by_agent
from rlctl.config import load_job
from rlctl.config.job import Job
from rlctl.config.model import HfModel
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import plan_sites
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.ops import counts
from rlctl.ops.jobprep import recorded_links
from rlctl.ops.trainersplit import resplit_plan
from rlctl.planner.plan import make_plan


def megatron_job(
    tmp_path: Path,
    *,
    tp: int = 2,
    gpus: int = 4,
    name: str = "job.yaml",
    across: bool = False,
    model: dict[str, Any] | None = None,
    gbps: float = 10,
    uplink: bool = False,
) -> Job:
    """A 7B megatron job at tp `tp` on `gpus` H200s of site t, its rollout on 4 of site r: one datacenter, or
    (`across`) t in datacenter a, r in b, joined by a `gbps` link between t and r, or (`uplink`) between r and a2,
    another site of a that the job does not use. `model`: another than the 7B. (H200s: a tp 2 rank holds its
    shard's whole state, 63.0 GB, and its share of a cut's activations, 8,192 tokens (two 4,096-token rows in the
    default budget): 56.0 GB with the full fp32 logits, `profiler.actmem`; 118.9 GB, more than an H100's 72 GB
    usable, within an H200's 126.9 GB.)"""
    site = {"gpu": "H200", "scheduler": {"kind": "ssh"}}
    inv = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": {
            "t": {**site, "datacenter": "a" if across else "d", "nodes": [{"host": "ht", "gpus": 8}]},
            "r": {**site, "datacenter": "b" if across else "d", "nodes": [{"host": "hr", "gpus": 8}]},
            **({"a2": {**site, "datacenter": "a", "nodes": [{"host": "ha2", "gpus": 8}]}} if uplink else {}),
        },
        "links": [{"between": ["a2" if uplink else "t", "r"], "bandwidth_gbps": gbps, "latency_ms": 2}]
        if across
        else [],
    }
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inv))
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "split",
        "inventory": ["inv.yaml"],
        "model": model or {"kind": "builtin", "name": "qwen2.5-7b"},
        "task": {"kind": "lengths", "prompt_tokens": 256, "median_output_tokens": 1000, "max_output_tokens": 4000},
        "batch": {"prompts_per_iteration": 16, "samples_per_prompt": 4},
        "placement": {"trainer": {"site": "t", "gpus": gpus}, "rollout": [{"site": "r", "gpus": 4}]},
        "rollout": {"tensor_parallel": 1},
        "trainer": {"backend": "megatron", "tensor_parallel": tp},
        "warmup": {"sft_steps": 0},
    }
    (tmp_path / name).write_text(yaml.safe_dump(job))
    return load_job(tmp_path / name)


def resplit(job: Job, plan: dict[str, Any], asked: dict[str, int]) -> dict[str, Any]:
    new = resplit_plan(plan, asked, spec=job.spec, sites=job.inventory.sites, arch=job.spec.model.arch)
    assert new is not None
    return new


def test_a_resplit_plans_predictions_are_the_planners_for_the_new_split(tmp_path: Path) -> None:
    """tp 2 dp 2 resumed at tp 4 dp 1: plan.json's planner section is the planner's plan of the job at tp 4 on 4 GPUs
    (its trainer row, predicted times, rebalance advice: what `rlctl plan` says of the job file asking that split),
    versus the launch's rows for tp 2 kept beside the new split (its t_train_s, iteration and δ, δ')."""
    job = megatron_job(tmp_path)
    plan = counts.plan_counts(job, job.spec)
    new = resplit(job, plan, {"tp": 4, "dp": 1})
    section = new["planner"]
    row = next(a for a in section["allocation"] if a["role"] == "trainer")
    assert (row["config"], row["gpus_used"]) == ({"tp": 4, "pp": 1, "dp": 1}, 4)

    direct = make_plan(megatron_job(tmp_path, tp=4, name="tp4.yaml"))  # the planner's own figures for tp 4 on 4 GPUs
    pred = section["predicted"]
    assert pred["t_train_s"] == pytest.approx(direct["predicted"]["t_train_s"], rel=1e-12)
    assert row["predicted_s"] == pytest.approx(pred["t_train_s"], rel=1e-12)
    assert pred["t_train_s"] != pytest.approx(plan["planner"]["predicted"]["t_train_s"], rel=1e-3)  # tp 2's
    assert section == counts.planner_section(direct)
    rb = section["rebalance"]  # δ of the new split's iteration and trainer step (async at η > 0: simulated)
    assert rb["basis"] == "simulated_async"
    assert rb["delta_s"] == pytest.approx(pred["iteration_s"]["async"] - pred["t_train_s"], rel=1e-12)
    assert rb != plan["planner"]["rebalance"]


def test_a_resplit_whose_profile_cannot_be_had_drops_the_trainer_figures_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The job's planning.profile gone since the launch: the planner section keeps the rollout rows (the controller's
    decode costs: `Placement.decode_cost` reads them as before) and the trainer row at the new config and GPUs, its
    figures (predicted_s, `predicted`, `rebalance`) dropped, said in one line; versus tp 2's figures kept."""
    job = megatron_job(tmp_path)
    plan = counts.plan_counts(job, job.spec)
    gone = str(tmp_path / "gone.json")
    spec = job.spec.model_copy(update={"planning": job.spec.planning.model_copy(update={"profile": gone})})
    with caplog.at_level(logging.WARNING, logger="rlctl.ops.trainersplit"):
        new = resplit_plan(plan, {"tp": 4, "dp": 1}, spec=spec, sites=job.inventory.sites, arch=job.spec.model.arch)
    assert new is not None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(
        "the plan's predictions were not redone for the trainer at tp4 pp1 dp1"
    )
    assert "gone.json" in said[0]
    old_rows = plan["planner"]["allocation"]
    trainer = {k: v for k, v in old_rows[0].items() if k != "predicted_s"} | {
        "config": {"tp": 4, "pp": 1, "dp": 1},
        "gpus_used": 4,
    }
    assert new["planner"] == {"allocation": [trainer, *old_rows[1:]]}
    placed = Placement(new, job.inventory.sites, sites_by_agent(new), spec)
    unit = next(a for a, s in placed.sites.items() if s == "r")
    assert placed.decode_cost(unit) is not None


def test_a_resplit_whose_auto_rollout_site_the_plan_gave_no_units_drops_the_figures_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rollout site placed `auto` that the plan gave no units (its group absent from plan.json): the figures
    dropped in the one line, versus a KeyError's traceback before the planner ran."""
    job = megatron_job(tmp_path)
    plan = counts.plan_counts(job, job.spec)
    rollout = [r.model_copy(update={"gpus": "auto"}) for r in job.spec.placement.rollout]
    spec = job.spec.model_copy(update={"placement": job.spec.placement.model_copy(update={"rollout": rollout})})
    plan = {**plan, "rollout": []}
    with caplog.at_level(logging.WARNING, logger="rlctl.ops.trainersplit"):
        new = resplit_plan(plan, {"tp": 4, "dp": 1}, spec=spec, sites=job.inventory.sites, arch=job.spec.model.arch)
    assert new is not None and "predicted" not in new["planner"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "KeyError: 'r'" in said[0], said


def launched(tmp_path: Path, job: Job, *, figures: bool = True) -> JobDir:
    """`job`'s dir as its launch writes it (`ops.jobprep.prepare`): job.json naming its job file, plan.json with the
    links (`jobprep.recorded_links`; `figures` False: without their figures, as a launch before 2026-12-07 wrote
    it), sites.json; an HF model's copy in model/init (`ops.inputs.copy_inputs`)."""
    plan = counts.plan_counts(job, job.spec)
    jd = JobDir.create("split", explicit=tmp_path / "jobdir")
    if isinstance(job.spec.model, HfModel):
        shutil.copytree(job.spec.model.path, jd.init_model)
    jd.write_job(job.spec, source=str(job.path))
    used = set(plan_sites(plan))
    links = recorded_links(job.inventory, used)
    if not figures:
        del links["link_figures"]
    jd.write_json(jd.plan_json, {**plan, **links})
    write_sites(jd.path, {n: s for n, s in job.inventory.sites.items() if n in used})
    return jd


def test_a_resplit_dry_run_shows_the_predicted_iteration_at_the_old_split_and_the_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch --resume --trainer-split tp=4 --dry-run`: its line and `-o json` give the plan's predicted
    iteration in the job's mode at tp 2 and at tp 4 (the planner's, `_repriced`), nothing written."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    job = megatron_job(tmp_path)
    jd = launched(tmp_path, job)
    plan = jd.read_plan()
    before = jd.plan_json.read_text()
    now = resplit(job, plan, {"tp": 4})["planner"]["predicted"]["iteration_s"]["async"]
    was = plan["planner"]["predicted"]["iteration_s"]["async"]
    assert f"{now:.1f}" != f"{was:.1f}"  # (the line tells them apart)
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=4", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == (
        "trainer on site t: tp2 pp1 dp2 (4 ranks) → tp4 pp1 dp2 (8 ranks): the resume writes it to plan.json (dry "
        f"run: nothing written); predicted iteration (async) {was:.1f} s → {now:.1f} s"
    )
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=4", "--dry-run", "-o", "json")
    assert r.exit_code == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["predicted_iteration"] == {"mode": "async", "was_s": was, "now_s": pytest.approx(now, rel=1e-12)}
    assert jd.plan_json.read_text() == before


def test_a_resplit_of_a_job_across_datacenters_launched_before_link_figures_prices_its_links_from_the_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Trainer and rollout in two datacenters, joined by a link the inventory declares and plan.json records as a
    pair of sites alone (a job dir written before `link_figures`): the resume's predictions are made over that
    link's figures, read from the inventory file the job names (`jobchanges.launched_inventory`): the planner's for
    the job file at tp 4, versus no route between the datacenters (sites.json alone), the figures dropped. The
    inventory file gone: dropped, in one line."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = launched(tmp_path, megatron_job(tmp_path, across=True), figures=False)
    assert "link_figures" not in jd.read_plan()
    direct = make_plan(megatron_job(tmp_path, tp=4, gpus=8, name="tp4.yaml", across=True))["predicted"]
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=4", "--dry-run", "-o", "json")
    assert r.exit_code == 0, r.stderr
    assert not [m for m in caplog.messages if "not redone" in m]
    now = json.loads(r.stdout)["predicted_iteration"]["now_s"]
    assert now == pytest.approx(direct["iteration_s"]["async"], rel=1e-12)
    (tmp_path / "inv.yaml").unlink()
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=4", "--dry-run", "-o", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["predicted_iteration"]["now_s"] is None
    said = [m for m in caplog.messages if "not redone" in m]
    assert len(said) == 1 and said[0].startswith(
        "the plan's predictions were not redone for the trainer at tp4 pp1 dp2"
    )


def test_a_resplit_prices_the_job_dirs_copy_of_an_hf_model_not_the_folder_it_was_launched_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An HF model's folder holding another (bigger) model since the launch, then deleted: the resume's planner
    figures are made for the job dir's copy (model/init, the one the run trains), the same both times and the
    planner's for the model as launched at tp 4; versus the folder's model priced (another model's figures), then
    the figures dropped ('no such directory')."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))

    def save(heads: int, hidden: int) -> None:
        shutil.rmtree(tmp_path / "hf", ignore_errors=True)
        c = TinyGPTConfig(
            vocab_size=64,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=4,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=4256,  # the job's 256 prompt + 4000 output tokens (`rlctl.planner.context`)
        )
        TinyGPT(c).save_pretrained(tmp_path / "hf")

    save(4, 64)
    model = {"kind": "hf", "path": "hf"}
    jd = launched(tmp_path, megatron_job(tmp_path, model=model))
    direct = make_plan(megatron_job(tmp_path, tp=4, gpus=8, name="tp4.yaml", model=model))["predicted"]
    expected = direct["iteration_s"]["async"]

    def now_s() -> Any:
        r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=4", "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)["predicted_iteration"]["now_s"]

    save(8, 256)  # another model in the folder since
    bigger = make_plan(megatron_job(tmp_path, tp=4, gpus=8, name="tp4.yaml", model=model))["predicted"]
    assert bigger["iteration_s"]["async"] != pytest.approx(expected, rel=1e-6)  # (the two models' figures differ)
    assert now_s() == pytest.approx(expected, rel=1e-12)
    shutil.rmtree(tmp_path / "hf")  # and gone
    assert now_s() == pytest.approx(expected, rel=1e-12)
    assert not [m for m in caplog.messages if "not redone" in m]


@pytest.mark.parametrize("uplink", [False, True])
def test_a_resplit_of_a_job_across_datacenters_prices_its_links_as_launched_not_as_the_inventory_says_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, uplink: bool
) -> None:
    """The link between the trainer's datacenter and the rollout's (between their sites, or from a2, a site the job
    does not use: its datacenter recorded too) at 10 Gbps at the launch, which plan.json records (`link_figures`):
    the inventory's link slowed to 1 Gbps since, then the file gone, the resume's predictions are the planner's at
    tp 4 over the launch's 10 Gbps both times; versus the inventory files as they are now (priced at 1 Gbps, then the
    figures dropped)."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = launched(tmp_path, megatron_job(tmp_path, across=True, uplink=uplink))
    pair, dcs = (["a2", "r"], ["a", "b"]) if uplink else (["r", "t"], ["b", "a"])
    assert jd.read_plan()["link_figures"] == [
        {"between": pair, "datacenters": dcs, "bandwidth_gbps": 10.0, "latency_ms": 2.0}
    ]
    tp4 = {"tp": 4, "gpus": 8, "name": "tp4.yaml", "across": True, "uplink": uplink}
    slow = make_plan(megatron_job(tmp_path, **tp4, gbps=1))["predicted"]["iteration_s"]["async"]
    launch = make_plan(megatron_job(tmp_path, **tp4))["predicted"]["iteration_s"]["async"]
    assert slow != pytest.approx(launch, rel=1e-3)  # (the link's figures count)
    megatron_job(tmp_path, across=True, uplink=uplink, gbps=1)  # the job's inventory file now: 1 Gbps

    def now_s() -> Any:
        r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=4", "--dry-run", "-o", "json")
        assert r.exit_code == 0, r.stderr
        return json.loads(r.stdout)["predicted_iteration"]["now_s"]

    assert now_s() == pytest.approx(launch, rel=1e-12)
    (tmp_path / "inv.yaml").unlink()
    assert now_s() == pytest.approx(launch, rel=1e-12)
    assert not [m for m in caplog.messages if "not redone" in m]
