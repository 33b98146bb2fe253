"""`rlctl check JOB --reach` on two real sites (the localhost SLURM cluster and the SSH site in its own network
namespace behind the shaped link): what stops the job — its agents listening on loopback, the SSH site's
python without torch, a trainer whose replica does not fit the memory a slot gets, a SLURM site that lists a node
its partition does not have — each one line naming the site (and host) and what to set, exit 2; with the four
fixed (the SSH site's python found through its `setup` lines), check passes and the job runs."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO, job_yaml, metrics_rows, rlctl, wait_for
from .test_ops_cross_site import cross_site_inventory, site_workdir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

SYSTEM_PYTHON = "/usr/bin/python3"


def system_python_lacks_torch() -> bool:
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import torch"], capture_output=True, timeout=60)
    return probe.returncode != 0


def test_check_reach_names_each_problem_and_the_fixed_job_runs(services, tmp_path, launcher):
    if not Path(SYSTEM_PYTHON).exists() or not system_python_lacks_torch():
        pytest.skip(f"{SYSTEM_PYTHON} is missing or has torch: no python without torch to point the site at")
    path = cross_site_inventory(services, tmp_path / "sites.yaml", Path(site_workdir()))
    inv = yaml.safe_load(path.read_text())
    good = {name: dict(site) for name, site in inv["sites"].items()}
    train, gen = inv["sites"]["train"], inv["sites"]["gen"]
    train["network"] = {**train["network"], "listen_host": "127.0.0.1"}  # unreachable from the other site
    # 1 GB a slot: a trainer replica needs ~2 GB; and a third host, which the partition does not have
    train["nodes"] = [{**train["nodes"][0], "host": "sitea-[1-3]", "memory_gb": 2}]
    gen["python"] = SYSTEM_PYTHON  # no torch (and no rlctl) there
    path.write_text(yaml.safe_dump(inv))
    job = job_yaml(tmp_path / "xsite.yaml", inventory=[str(path)], trainer="train", rollout="gen", iterations=3)

    res = rlctl("check", str(job), "--reach", timeout_s=300)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-2000:]
    assert all(line.startswith("rlctl: error: ") for line in lines), lines
    host = services["RLCTL_TEST_NETSITE_HOST"]
    named = {
        "loopback": [x for x in lines if "sites.train.network.listen_host" in x and "loopback" in x],
        "torch": [x for x in lines if f"site gen host {host}" in x and "cannot import torch" in x],
        "memory": [x for x in lines if "placement.trainer.gpus" in x and "1 GB of its nodes' memory_gb" in x],
        "nodes": [x for x in lines if "site train: the inventory lists sitea-3, which partition sitea does not" in x],
    }
    assert all(len(v) == 1 for v in named.values()), (named, lines)
    # the SLURM node has what the trainer needs
    assert [x for x in lines if "site train" in x] == named["nodes"], lines

    inv["sites"]["train"]["network"] = good["train"]["network"]
    # the test cluster's nodes as they are (tests/services/slurm.sh: RealMemory=4000): one slot of 3.9 GB each,
    # which SLURM grants (--mem-per-cpu 3993M) and the trainer fits
    inv["sites"]["train"]["nodes"] = [{**good["train"]["nodes"][0], "gpus": 1, "memory_gb": 3.9}]
    # the site's setup puts this virtualenv first on PATH: `python3` there is then the one with rlctl and torch
    inv["sites"]["gen"]["python"] = "python3"
    inv["sites"]["gen"]["setup"] = [f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH"]
    path.write_text(yaml.safe_dump(inv))
    res = rlctl("check", str(job), "--reach", timeout_s=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Hosts" in res.stdout and host in res.stdout
    job_dir = tmp_path / "run"
    proc = launcher(str(job), "--job-dir", str(job_dir))
    wait_for("two trained iterations", lambda: len(metrics_rows(job_dir)) >= 2, 240, alive=proc)


def _check_reach_with_the_controller_on_gen(
    services: dict[str, str],
    tmp_path: Path,
    gen_python: Callable[[dict[str, Any]], None],
    *,
    rollout: str,
    edit: Callable[[dict[str, Any]], None] = lambda inv: None,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`rlctl check --reach` of a 3-iteration job on the cross-site inventory, its controller on the SSH site gen
    (whose python `gen_python` sets), the trainer on the SLURM site train, rollout on `rollout`: the result and its
    stderr lines."""
    path = cross_site_inventory(services, tmp_path / "sites.yaml", Path(site_workdir()))
    inv = yaml.safe_load(path.read_text())
    gen_python(inv["sites"]["gen"])
    edit(inv)
    path.write_text(yaml.safe_dump(inv))
    placement = {
        "trainer": {"site": "train", "gpus": 1},
        "rollout": [{"site": rollout, "gpus": 1}],
        "controller_site": "gen",
    }
    job = job_yaml(tmp_path / "ctl.yaml", inventory=[str(path)], trainer="train", rollout=rollout, iterations=3,
                   placement=placement)  # fmt: skip
    res = rlctl("check", str(job), "--reach", timeout_s=300)
    return res, res.stderr.strip().splitlines()


def test_check_reach_asks_the_controllers_site_whether_it_reaches_the_rollout_sites(services, tmp_path):
    """The controller placed on the SSH site in its own network namespace starts rollout units (scale, the
    rebalance rule) from there: the localhost SLURM cluster's controller, at 127.0.0.1 here, is not reachable
    from inside that namespace, and check says so in one line naming both sites."""

    def python3_on_path(gen: dict[str, Any]) -> None:
        gen["python"] = "python3"
        gen["setup"] = [f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH"]

    res, lines = _check_reach_with_the_controller_on_gen(services, tmp_path, python3_on_path, rollout="train")
    host = services["RLCTL_TEST_NETSITE_HOST"]
    named = [x for x in lines if f"site train: cannot be reached from the controller's site gen (host {host})" in x]
    assert res.returncode == 2 and len(named) == 1, lines
    assert "`rlctl scale` and the rebalance rule start rollout units from there" in named[0], named[0]


def test_check_reach_refuses_a_controller_whose_auto_address_routes_toward_a_slurm_node_name(services, tmp_path):
    """The controller on the SSH site with `listen_host: auto`, the SLURM site `auto` too (naming no address): the
    controller's `auto` would route toward the SLURM node name `sitea-1`, which resolves nowhere (the controller
    exited at start: 'no route toward sitea-1'); check says so in one line naming both sites, the host and what
    to set."""

    def tree_under_test(gen: dict[str, Any]) -> None:
        gen["python"] = sys.executable
        gen["setup"] = [f"export PYTHONPATH={REPO}"]  # the tree under test, not the site's install

    def auto(inv: dict[str, Any]) -> None:
        inv["sites"]["train"]["network"]["listen_host"] = "auto"

    res, lines = _check_reach_with_the_controller_on_gen(services, tmp_path, tree_under_test, rollout="gen", edit=auto)
    named = [x for x in lines if "site gen: listen_host auto routes toward site train's host sitea-1" in x]
    assert res.returncode == 2 and len(named) == 1, lines
    assert "does not resolve here" in named[0] and "set sites.train.network.listen_host" in named[0], named[0]
    assert f"(asked on {services['RLCTL_TEST_NETSITE_HOST']})" in named[0], named[0]
