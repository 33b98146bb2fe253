"""`rlctl launch` (and `launch --resume`, `scale +N`) asks a SLURM site's cluster about its constraint and reservation
(sinfo, scontrol: `rlctl.ops.preflight.slurmoptions`) before it makes, stages or submits anything, as `check --reach`
does; on canned answers of the site's submit host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.launch.remote import CommandResult
from rlctl.launch.slurm import SlurmBackend
from tests.conftest import ROOT, run_cli

DEMO = ROOT / "jobs" / "demo.yaml"
SINFO = "g-01|h800,ib\ng-02|h800,nvme\n"  # `sinfo -h -N -p gpu -o '%N|%f'`


class SubmitHost:
    """A SLURM site's submit host: sinfo's features (or sinfo failing), no reservation; every command's first word
    put in `asked`."""

    def __init__(self, asked: list[str], *, sinfo_fails: bool = False) -> None:
        self.asked, self.sinfo_fails = asked, sinfo_fails

    def run(self, command: str, *, timeout_s: float) -> CommandResult:
        self.asked.append(command.split()[0])
        if command.startswith("sinfo -h -N"):
            return CommandResult(1, "", "sinfo: error: slurm_load_partitions: Unable to contact slurm controller")
        if command.endswith("scontrol show reservation -o"):
            return CommandResult(0, "rlctl-user=rl\nrlctl-groups=rl\nNo reservations in the system\n", "")
        return CommandResult(1, "", f"not expected here: {command}")

    def close(self) -> None:
        pass


class Answering(SubmitHost):
    def run(self, command: str, *, timeout_s: float) -> CommandResult:
        if command.startswith("sinfo -h -N") and not self.sinfo_fails:
            self.asked.append("sinfo")
            return CommandResult(0, SINFO, "")
        return super().run(command, timeout_s=timeout_s)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: Answering(said)))
    return said


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def job_file(tmp_path: Path, **scheduler: Any) -> Path:
    """The demo job on a SLURM site `slurm` (partition gpu, `scheduler`'s options), its inventory beside it."""
    inventory = tmp_path / "sites.yaml"
    site = {
        "datacenter": "dc",
        "gpu": "CPU",
        "scheduler": {"kind": "slurm", "partition": "gpu", **scheduler},
        "nodes": [{"host": "g-[01-02]", "gpus": 4}],
        "network": {"listen_host": "auto", "bandwidth_gbps": 10},
    }
    inventory.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"slurm": site}}))
    data = yaml.safe_load(DEMO.read_text())
    data |= {"inventory": [str(inventory)], "warmup": {"sft_steps": 0}}
    data["placement"] = {"trainer": {"site": "slurm", "gpus": 1}, "rollout": [{"site": "slurm", "gpus": 2}]}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_launch_whose_slurm_site_names_a_missing_feature_is_refused_before_anything_is_made(
    tmp_path: Path, home: Path, asked: list[str]
) -> None:
    """sbatch refused it only at the first agent's job ('Invalid feature specification'), after the job dir was made,
    indexed and staged; now one line as check says it, exit 2, nothing made, nothing submitted."""
    path = job_file(tmp_path, constraint="h800&ibx")
    res = run_cli("launch", str(path))
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith(
        f"rlctl: error: {tmp_path / 'sites.yaml'}: sites.slurm.scheduler.constraint: 'h800&ibx': no node of "
        "partition gpu has feature 'ibx' (sinfo): sbatch refuses every agent's job; its nodes' features: h800, ib, "
        "nvme (hint: "
    ), res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert asked == ["sinfo"]  # sinfo alone: no sbatch, no staging
    assert not (tmp_path / "runs").exists() and not home.exists()  # no job dir, no index row


def test_a_launch_whose_slurm_site_cluster_cannot_be_asked_goes_on(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sinfo failing (its controller not answering): the launch is not made stricter than check, it goes on to make
    the job dir (the site's own error comes later)."""
    said: list[str] = []
    monkeypatch.setattr(
        SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: Answering(said, sinfo_fails=True))
    )

    class Made(Exception):
        pass

    def made(*args: object, **kwargs: object) -> None:
        raise Made

    monkeypatch.setattr("rlctl.ops.launchdir.launch_dir", made)
    with pytest.raises(Made):
        from rlctl.cli import main

        monkeypatch.setattr("sys.argv", ["rlctl", "launch", str(job_file(tmp_path, constraint="h800&ibx"))])
        main()
    assert said == ["sinfo"]


def test_a_launch_whose_slurm_site_sets_neither_asks_its_cluster_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def runner(cls: object, site: object, host: object = None) -> SubmitHost:
        raise AssertionError("the cluster was asked")

    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(runner))

    class Made(Exception):
        pass

    def made(*args: object, **kwargs: object) -> None:
        raise Made

    monkeypatch.setattr("rlctl.ops.launchdir.launch_dir", made)
    from rlctl.cli import main

    monkeypatch.setattr("sys.argv", ["rlctl", "launch", str(job_file(tmp_path, exclusive=False))])
    with pytest.raises(Made):
        main()


def launched(tmp_path: Path, **scheduler: Any) -> Path:
    """A job dir as a launch on the SLURM site left it, stopped before it ran (job.json, plan.json, sites.json)."""
    from rlctl.config import load_job
    from rlctl.launch.backends import write_sites
    from rlctl.launch.jobdir import JobDir

    job = load_job(job_file(tmp_path, **scheduler))
    jd = JobDir.create("demo", explicit=tmp_path / "run")
    jd.write_job(job.spec, source=str(tmp_path / "job.yaml"))
    plan = {"trainer": {"site": "slurm", "ranks": 1}, "controller_site": "slurm", "rollout": []}
    jd.write_json(jd.plan_json, {**plan, "rollout": [{"site": "slurm", "units": 1, "tp": 2}]})
    write_sites(jd.path, dict(job.inventory.sites))
    return jd.path


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_resume_whose_slurm_site_names_a_missing_feature_is_refused_before_anything_is_staged(
    tmp_path: Path, asked: list[str]
) -> None:
    """As launched, in its sites.json (a node's feature gone since, a reservation ended): sbatch refused the first
    agent's job after the resume marked the job launching and staged it; now one line naming sites.json, exit 2."""
    path = launched(tmp_path, constraint="h800&ibx")
    before = snapshot(path)
    res = run_cli("launch", "--resume", str(path))
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith(
        f"rlctl: error: {path / 'sites.json'}: sites.slurm.scheduler.constraint: 'h800&ibx': no node of partition "
        "gpu has feature 'ibx' (sinfo)"
    ), res.stderr
    assert "the job runs on its sites as launched (sites.json)" in res.stderr and res.stderr.count("\n") == 1
    assert asked == ["sinfo"]
    assert {k: v for k, v in snapshot(path).items() if k != ".launcher.lock"} == before


@pytest.mark.parametrize("site", [None, "slurm"])
def test_a_scale_onto_a_slurm_site_whose_reservation_ended_is_refused_before_the_controller_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: list[str], site: str | None
) -> None:
    """Its reservation ended since the launch (SLURM purges it): each unit's sbatch was refused after the controller
    took the request (`did not start`); now one line naming sites.json, exit 2, the controller not asked. A scale
    down asks no cluster."""
    from rlctl.ops import operate

    path = launched(tmp_path, reservation="rl-week")
    told: list[str] = []

    def controller(ref: object, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        told.append(kind)
        return {"removing": ["rollout-0"]}

    monkeypatch.setattr(operate, "ask_controller", controller)
    res = run_cli("scale", str(path), "--rollout", "+1", *(["--site", site] if site else []))
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith(
        f"rlctl: error: {path / 'sites.json'}: sites.slurm.scheduler.reservation: 'rl-week': no such reservation "
        "(scontrol show reservation)"
    ), res.stderr
    assert res.stderr.count("\n") == 1 and asked == ["sinfo", "echo"] and told == []
    asked[:] = []
    assert run_cli("scale", str(path), "--rollout", "-1", "--no-wait").exit_code == 0
    assert asked == [] and told == ["scale"]
