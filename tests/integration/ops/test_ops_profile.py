"""`rlctl profile --source measured` on a SLURM site and on the SSH site in its network namespace: the
probe runs through each site's launch backend, and the profile holds what it measured there."""

from __future__ import annotations

import json

import pytest
import yaml

from .conftest import rlctl
from .test_ops_cross_site import cross_site_inventory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_measured_profile_through_slurm_and_ssh(services, tmp_path):
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", tmp_path / "gen-workdir")
    workdir, out = tmp_path / "probe", tmp_path / "profile.yaml"
    proc = rlctl(
        "profile", "--cluster", str(inv), "--model", "tiny-demo", "--source", "measured",
        "--workdir", str(workdir), "-o", str(out), timeout_s=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prof = yaml.safe_load(out.read_text())
    assert prof["source"] == "measured" and set(prof["sites"]) == {"train", "gen"}
    for name, site in prof["sites"].items():
        (entry,) = site["generation"]
        ptl = entry["ptl_s"]  # [context][batch size], seconds per decode step
        assert all(0 < v < 0.5 for row in ptl for v in row), (name, ptl)
        assert ptl[0][-1] > ptl[0][0], f"{name}: a step of the largest batch should cost more than of one row"
        print(f"\n{name}: PTL(1) {ptl[0][0] * 1e3:.2f} ms, PTL({entry['batch_sizes'][-1]}) {ptl[0][-1] * 1e3:.2f} ms")
    started = [json.loads(line) for line in (workdir / "agents.jsonl").read_text().splitlines()]
    assert {a["site"]: a["backend"] for a in started} == {"train": "slurm", "gen": "ssh"}
    assert (workdir / "gen.probe.log").exists() and (workdir / "train.probe.log").exists()
