"""`rlctl pull` across the shaped link: the trainer and controller run on the SSH site in its own network and
mount namespace (its job dir exists only there); after the job, `rlctl pull` brings the newest checkpoint's
policy here over SFTP, every file checked against the checkpoint's manifest, and `transformers` loads it; the
TensorBoard files the controller wrote there came back when the job ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.netsite import on_site, site_workdir

from .conftest import job_yaml, rlctl, rlctl_json
from .test_ops_cross_site import cross_site_inventory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]


def test_pull_brings_the_checkpoint_from_the_namespaced_site_and_transformers_loads_it(services, tmp_path):
    transformers = pytest.importorskip("transformers")
    workdir = site_workdir()
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(workdir))
    job = job_yaml(
        tmp_path / "pull.yaml",
        inventory=[str(inv)],
        trainer="gen",
        rollout="train",
        iterations=3,
        checkpoint={"every_iterations": 2},
        tracking=["tensorboard"],
    )
    job_dir = tmp_path / "run"
    proc = rlctl("launch", str(job), "--job-dir", str(job_dir), "-o", "json", timeout_s=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["iterations"] == 3
    assert not (job_dir / "checkpoints" / "iter-3").exists()  # written on the site only
    site_ckpt = f"{workdir}/jobs/run/checkpoints/iter-3"
    assert on_site(services, f"test -f {site_ckpt}/MANIFEST.trainer.json").returncode == 0
    assert list((job_dir / "tensorboard").glob("events.out.tfevents.*"))  # fetched when the job ended

    code, got = rlctl_json("pull", str(job_dir), timeout_s=180)
    assert code == 0, got
    assert got["version"] == 3 and got["to"] == str(job_dir / "pulled" / "v3") and got["files"] >= 2, got
    assert got["source"].startswith("gen:") and f"@{services['RLCTL_TEST_NETSITE_HOST']}:" in got["source"], got
    model = transformers.AutoModelForCausalLM.from_pretrained(got["to"])
    assert sum(p.numel() for p in model.parameters()) > 0
    assert sorted(p.name for p in Path(got["to"]).iterdir()) == ["config.json", "model.safetensors"]

    older = tmp_path / "v2"
    code, got = rlctl_json("pull", str(job_dir), "--checkpoint", "2", "--to", str(older), timeout_s=180)
    assert code == 0 and got["version"] == 2 and (older / "config.json").exists(), got
    bad = rlctl("pull", str(job_dir), "--checkpoint", "1")  # never written (every 2): one usage line
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr == "rlctl: error: --checkpoint 1: no such checkpoint; this job has v2, v3\n"

    # status --checkpoints reads the trainer part's manifests on its site over SSH (one command): both sound; a
    # weights file cut short there marks v3 damaged, v2 the latest (versus listed sound, its part not checked)
    code, st = rlctl_json("status", str(job_dir), "--checkpoints", timeout_s=120)
    assert code == 0, st
    assert [(c["version"], c["latest"], c["damaged"]) for c in st["checkpoints"]] == [(2, False, None), (3, True, None)]
    cut = on_site(
        services, f"f=$(find {site_ckpt} -name '*.safetensors' | head -1) && truncate -s 10 \"$f\" && echo $f"
    )
    assert cut.returncode == 0 and cut.stdout.strip(), cut.stderr
    code, st = rlctl_json("status", str(job_dir), "--checkpoints", timeout_s=120)
    rows = [(c["version"], c["latest"], c["damaged"]) for c in st["checkpoints"]]
    assert code == 0 and rows[0] == (2, True, None) and rows[1][:2] == (3, False), rows
    assert "does not match MANIFEST.trainer.json" in (rows[1][2] or ""), rows
