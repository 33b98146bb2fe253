"""`rlctl profile` and `rlctl plan` end to end on the shipped examples, and their one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, CliResult

Cli = Callable[..., CliResult]


def test_plan_cross_dc_json_has_every_field(cli: Cli, tmp_path: Path) -> None:
    png = tmp_path / "plan.png"
    r = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "-o", "json", "--plot", str(png))
    assert r.exit_code == 0, r.stderr
    p = json.loads(r.stdout)
    roles = {a["site"]: a for a in p["allocation"]}
    assert roles["h800"]["role"] == "trainer" and roles["h20"]["role"] == "rollout"
    for a in p["allocation"]:
        assert {"gpus_used", "gpus_available", "config", "instances"} <= set(a)
        assert 0 < a["gpus_used"] <= a["gpus_available"]
    t = roles["h800"]["config"]
    assert t["tp"] * t["pp"] * t["dp"] == roles["h800"]["gpus_used"]
    assert set(p["stage_curves"]["generation"]["h20"][0]) == {"gpus", "seconds", "tp", "instances"}
    assert len(p["stage_curves"]["training"]["h800"]) >= 100
    assert set(p["predicted"]["iteration_s"]) == {"sync", "stream", "async"}
    it = p["predicted"]["iteration_s"]
    assert it["async"] <= it["stream"] <= it["sync"]
    assert {"alpha", "long_tail_units", "regular_units", "long_tail_batch", "regular_batch"} <= set(p["dispatch"])
    assert "delta_prime_s" in p["rebalance"]
    assert {"paper", "fewest_gpus"} == set(p["alternatives"])
    assert p["cost"]["cost_units_per_1k_samples"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_profile_then_plan_with_it(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "h20.yaml"
    r = cli(
        "profile",
        "--cluster",
        str(ROOT / "clusters/h800-trainer.yaml"),
        "--cluster",
        str(ROOT / "clusters/h20-rollout.yaml"),
        "--model",
        "qwen2.5-7b",
        "--source",
        "analytical",
        "-o",
        str(out),
    )
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    assert text.startswith("apiVersion: rlctl/v1\nkind: Profile\n")
    r = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--profile", str(out), "-o", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["profile_source"] == "analytical"


def test_profile_of_one_site_file_whose_link_names_another_file(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "h20.yaml"
    r = cli("profile", "--cluster", str(ROOT / "clusters/h20-rollout.yaml"), "--model", "qwen2.5-72b", "-o", str(out))
    assert r.exit_code == 0, r.stderr
    from rlctl.profiler.profile import load_profile

    prof = load_profile(out)
    assert list(prof.sites) == ["h20"]
    assert sorted(e.tp for e in prof.sites["h20"].generation) == [2, 4, 8]  # 145 GB of weights: not on one H20


def test_plan_table_on_the_local_demo(cli: Cli) -> None:
    r = cli("plan", str(ROOT / "jobs/demo.yaml"))
    assert r.exit_code == 0, r.stderr
    assert "Allocation of demo" in r.stdout and "δ'" in r.stdout


def test_bad_inputs_exit_2_with_one_line(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("apiVersion: rlctl/v1\nkind: Profile\nsource: guessed\n")
    cases = [
        ("profile", "--cluster", str(ROOT / "clusters/h20-rollout.yaml"), "--model", "qwen2.5-8b"),
        ("profile", "--cluster", str(ROOT / "clusters/local.yaml"), "--model", "tiny-demo", "--site", "nope"),
        ("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--profile", str(bad)),
        ("plan", str(tmp_path / "missing.yaml")),
    ]
    for args in cases:
        r = cli(*args)
        assert r.exit_code == 2, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("rlctl: error: "), r.stderr


def test_options_of_a_measured_profile_are_refused_for_an_analytical_one(cli: Cli, tmp_path: Path) -> None:
    """They were ignored: `--engine vllm` wrote a roofline profile with no engine in it, exit 0."""
    local = ("profile", "--cluster", str(ROOT / "clusters/local.yaml"), "--model", "tiny-demo")
    for extra, named in (
        (("--engine", "vllm"), "--engine"),
        (("--trainer-backend", "megatron"), "--trainer-backend"),
        (("--workdir", str(tmp_path / "w")), "--workdir"),
    ):
        r = cli(*local, *extra)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"rlctl: error: {named}: read by --source measured only"), r.stderr
    assert not (tmp_path / "w").exists()


def test_profile_of_an_empty_model_name_says_so(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--model "$MODEL"` with MODEL unset: the known models, versus '<the directory it ran in>/config.json: cannot
    read' ('' taken for '.')."""
    monkeypatch.chdir(tmp_path)
    r = cli("profile", "--cluster", str(ROOT / "clusters/local.yaml"), "--model", "")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--model: unknown model ''; known: " in r.stderr and "config.json" not in r.stderr, r.stderr


def test_measured_profile_of_a_model_the_engine_cannot_run_is_refused_before_starting_anything(
    cli: Cli, tmp_path: Path
) -> None:
    r = cli(
        "profile",
        "--cluster",
        str(ROOT / "clusters/h20-rollout.yaml"),
        "--model",
        "qwen2.5-7b",
        "--source",
        "measured",
        "--workdir",
        str(tmp_path / "w"),
    )
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "tiny-demo" in r.stderr and "--source analytical" in r.stderr
    assert not (tmp_path / "w").exists()


def test_plan_rejects_a_profile_for_another_model(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "tiny.yaml"
    assert (
        cli(
            "profile",
            "--cluster",
            str(ROOT / "clusters/h800-trainer.yaml"),
            "--cluster",
            str(ROOT / "clusters/h20-rollout.yaml"),
            "--model",
            "tiny-demo",
            "-o",
            str(out),
        ).exit_code
        == 0
    )
    r = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--profile", str(out))
    assert r.exit_code == 2 and "qwen2.5-7b" in r.stderr


def test_plan_rejects_a_profile_of_a_site_whose_gpu_the_inventory_has_changed_since(cli: Cli, tmp_path: Path) -> None:
    """The profile's costs are the GPU it profiled: an H20 site's profile priced the site's new A100s as H20s (and
    the plan's table said H20)."""
    job = yaml.safe_load((ROOT / "jobs/cross-dc-7b.yaml").read_text())
    rollout = yaml.safe_load((ROOT / "clusters/h20-rollout.yaml").read_text())
    job["inventory"] = [str(ROOT / "clusters/h800-trainer.yaml"), str(tmp_path / "rollout.yaml")]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "rollout.yaml").write_text(yaml.safe_dump(rollout))
    prof = tmp_path / "p.yaml"
    assert cli("profile", "--job", str(tmp_path / "job.yaml"), "-o", str(prof)).exit_code == 0
    rollout["sites"]["h20"]["gpu"] = "A100"
    (tmp_path / "rollout.yaml").write_text(yaml.safe_dump(rollout))
    r = cli("plan", str(tmp_path / "job.yaml"), "--profile", str(prof))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{prof}: sites.h20.gpu: profiled on 'H20'" in r.stderr and "'A100'" in r.stderr, r.stderr
    assert "rollout.yaml" in r.stderr and "rlctl profile --job" in r.stderr, r.stderr


def _demo_job(tmp_path: Path, *, trainer_gpus: int, rollout_gpus: int, trainer: dict[str, object]) -> Path:
    """jobs/demo.yaml (tiny-demo: 3 heads, 3 layers; a 4-slot local site) with these counts and trainer."""
    data = yaml.safe_load((ROOT / "jobs/demo.yaml").read_text())
    data["inventory"] = [str(ROOT / "clusters/local.yaml")]
    data["placement"] = {
        "trainer": {"site": "local", "gpus": trainer_gpus},
        "rollout": [{"site": "local", "gpus": rollout_gpus}],
    }
    data["trainer"] = trainer
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("counts", "trainer", "line"),
    [
        (
            (2, 3),
            {"backend": "torch"},
            "placement: site 'local': trainer 2 GPU(s) + rollout 3 need 5; the inventory gives it 4",
        ),
        (
            (1, 2),
            {"backend": "torch", "tensor_parallel": 2},
            "trainer.tensor_parallel: 2: the 'torch' trainer has no model parallelism (each rank holds a whole "
            "replica); use 1, or trainer.backend 'megatron'",
        ),
        (
            (2, 2),
            {"backend": "megatron", "tensor_parallel": 2},
            "trainer.tensor_parallel: 2 does not divide the model's num_attention_heads 3; use a divisor",
        ),
        (
            (2, 2),
            {"backend": "megatron", "pipeline_parallel": 2},
            "trainer.pipeline_parallel: 2 does not divide the model's num_hidden_layers 3 (every stage holds as "
            "many); use a divisor",
        ),
    ],
    ids=["over-site", "torch-tp", "megatron-heads", "megatron-layers"],
)
def test_plan_refuses_a_job_field_in_one_line_naming_file_and_field(
    cli: Cli, tmp_path: Path, counts: tuple[int, int], trainer: dict[str, object], line: str
) -> None:
    """A job file the planner cannot plan for a reason of its own fields: exit 2 and the line `rlctl check` gives,
    not exit 1 with no file or field, nor 'training state does not fit' for a 345k-parameter model."""
    job = _demo_job(tmp_path, trainer_gpus=counts[0], rollout_gpus=counts[1], trainer=trainer)
    r = cli("plan", str(job))
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    (err,) = r.stderr.splitlines()
    assert err.startswith(f"rlctl: error: {job}: {line}"), err


def test_plan_prices_a_megatron_split_outside_the_roofline_s_grid(cli: Cli, tmp_path: Path) -> None:
    """pp 3 of tiny-demo's 3 layers is a split megatron runs; the roofline's grid (pp 1, 2, 4, …) had no entry for
    it, and plan said the training state did not fit."""
    job = _demo_job(tmp_path, trainer_gpus=3, rollout_gpus=1, trainer={"backend": "megatron", "pipeline_parallel": 3})
    r = cli("plan", str(job), "-o", "json")
    assert r.exit_code == 0, r.stderr
    (t,) = [a for a in json.loads(r.stdout)["allocation"] if a["role"] == "trainer"]
    assert (t["config"]["tp"], t["config"]["pp"], t["config"]["dp"]) == (1, 3, 1)


def test_plan_plot_refuses_a_users_file_and_writes_over_its_own(cli: Cli, tmp_path: Path) -> None:
    # `--plot p.png` wrote over a user's PNG
    png = tmp_path / "p.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + b"\0" * 17 + b"\0\0\0\0IEND\xaeB`\x82")
    mine = png.read_bytes()
    r = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--plot", str(png))
    assert r.exit_code == 2
    assert r.stderr.startswith(f"rlctl: error: --plot {png}: a file rlctl did not write;"), r.stderr
    assert png.read_bytes() == mine
    png.unlink()
    for _ in range(2):  # its own plot, written again
        r = cli("plan", str(ROOT / "jobs/cross-dc-7b.yaml"), "--plot", str(png))
        assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
