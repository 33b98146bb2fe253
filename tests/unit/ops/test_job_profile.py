"""`planning.profile`: the profile a job names prices it in `rlctl plan`, `check` and `launch` alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rlctl.config import load_job
from rlctl.ops.counts import plan_counts
from tests.conftest import ROOT, CliResult

Cli = Callable[..., CliResult]


def _job(tmp_path: Path, name: str, **fields: Any) -> Path:
    job = yaml.safe_load((ROOT / "jobs/cross-dc-7b.yaml").read_text())
    job["inventory"] = [str(ROOT / "clusters/h800-trainer.yaml"), str(ROOT / "clusters/h20-rollout.yaml")]
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**job, **fields}))
    return path


def test_launch_plans_auto_counts_with_the_profile_the_job_names(cli: Cli, tmp_path: Path) -> None:
    """`check` and `launch` planned `gpus: auto` from the analytical profile whatever the user had profiled:
    `rlctl plan --profile P` printed one allocation and `launch` ran another."""
    plain = _job(tmp_path, "plain.yaml")
    assert cli("profile", "--job", str(plain), "-o", str(tmp_path / "p.yaml")).exit_code == 0
    profile = yaml.safe_load((tmp_path / "p.yaml").read_text())
    for g in profile["sites"]["h20"]["generation"]:  # rollout 3× slower than the GPU specs say
        g["ptl_s"] = [[3 * t for t in row] for row in g["ptl_s"]]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    priced = _job(tmp_path, "priced.yaml", planning={"profile": "p.yaml"})  # relative to the job file

    analytical = plan_counts(load_job(plain), load_job(plain).spec)
    job = load_job(priced)
    counts = plan_counts(job, job.spec)
    r = cli("plan", str(priced), "-o", "json")
    assert r.exit_code == 0, r.stderr
    printed = {a["site"]: a["gpus_used"] for a in json.loads(r.stdout)["allocation"]}
    assert counts["profile"] == str(tmp_path / "p.yaml") and "profile" not in analytical
    assert counts["trainer"]["ranks"] == printed["h800"] != analytical["trainer"]["ranks"], (printed, analytical)
    over = cli("plan", str(priced), "--profile", str(tmp_path / "p.yaml"), "-o", "json")  # the flag: the same file
    assert json.loads(over.stdout)["allocation"] == json.loads(r.stdout)["allocation"]


def test_a_profile_the_job_names_that_is_not_there_is_one_line(cli: Cli, tmp_path: Path) -> None:
    job = _job(tmp_path, "job.yaml", planning={"profile": "gone.yaml"})
    for command in ("plan", "check"):
        r = cli(command, str(job))
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(
            f"rlctl: error: {job}: planning.profile: no such file '{tmp_path / 'gone.yaml'}' (relative to the job file)"
        ), r.stderr


def test_the_profile_a_job_names_is_written_by_the_command_its_refusal_names(cli: Cli, tmp_path: Path) -> None:
    """A job naming a profile not written yet: `rlctl profile --job` (the hint's command) writes it, and `rlctl plan
    --profile` prices the job with another file meanwhile. Both refused it: the job's missing profile was checked
    before they could read the job."""
    job = _job(tmp_path, "job.yaml", planning={"profile": "p.yaml"})
    refused = cli("plan", str(job))
    hint = f"(hint: write it with `rlctl profile --job {job} -o {tmp_path / 'p.yaml'}`)"
    assert refused.exit_code == 2 and refused.stderr.rstrip().endswith(hint), refused.stderr
    other = tmp_path / "other.yaml"
    assert cli("profile", "--job", str(_job(tmp_path, "plain.yaml")), "-o", str(other)).exit_code == 0
    r = cli("plan", str(job), "--profile", str(other))
    assert r.exit_code == 0, r.stderr
    assert f"profile analytical, {other})" in r.stdout.splitlines()[0]  # the file that priced it, named
    made = cli("profile", "--job", str(job), "-o", str(tmp_path / "p.yaml"))
    assert made.exit_code == 0 and (tmp_path / "p.yaml").is_file(), made.stderr
    assert cli("plan", str(job)).stdout == r.stdout.replace(str(other), str(tmp_path / "p.yaml"))  # the same, twice
    assert json.loads(cli("plan", str(job), "-o", "json").stdout)["profile_file"] == str(tmp_path / "p.yaml")
    assert "profile_file" not in json.loads(cli("plan", str(_job(tmp_path, "plain.yaml")), "-o", "json").stdout)


def test_the_hint_of_a_profile_in_a_folder_not_made_yet_writes_it(cli: Cli, tmp_path: Path) -> None:
    """The refusal's command, run as it says, wrote nothing: "cannot write profile: No such file or directory" (for
    `--source measured`, once every site was measured)."""
    job = _job(tmp_path, "job.yaml", planning={"profile": "profiles/p.yaml"})
    where = tmp_path / "profiles" / "p.yaml"
    assert cli("plan", str(job)).stderr.rstrip().endswith(f"`rlctl profile --job {job} -o {where}`)")
    made = cli("profile", "--job", str(job), "-o", str(where))
    assert made.exit_code == 0 and where.is_file(), made.stderr
    assert cli("plan", str(job)).exit_code == 0


def test_a_profile_of_another_model_is_refused_even_with_explicit_counts(cli: Cli, tmp_path: Path) -> None:
    """With every GPU count fixed the planner is advisory, and a profile that cannot price the job was a warning
    line in `launch` and nothing in `check`; it still prices the plan's predictions and migration costs."""
    other = tmp_path / "other.yaml"
    h20 = str(ROOT / "clusters/h20-rollout.yaml")
    made = cli("profile", "--cluster", h20, "--model", "qwen2.5-7b", "-o", str(other))
    assert made.exit_code == 0, made.stderr
    job = yaml.safe_load((ROOT / "jobs/demo.yaml").read_text())
    job["inventory"] = [str(ROOT / "clusters/local.yaml")]
    job["planning"] = {"profile": str(other)}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    for command in ("check", "launch"):
        r = cli(command, str(tmp_path / "job.yaml"), *(["--job-dir", str(tmp_path / "run")] * (command == "launch")))
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert (
            f"{tmp_path / 'job.yaml'}: planning.profile: {other}: model.name: profile is for 'qwen2.5-7b', job trains "
            "'tiny-demo'" in r.stderr
        ), r.stderr
    assert not (tmp_path / "run").exists()
