"""A job's sites.json read back as its launch accepted it (`RECORDED`): the inventory bounds added since 75431a5
hold a new inventory, not the record of a job an older rlctl launched, which `rlctl stop`, status, pull, attach and
launch --resume all read (`read_sites`). A login name starting with '-' stays refused there too: stop runs ssh with
it, where it is an option."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rlctl.config.inventory import Site, load_inventory
from rlctl.errors import ConfigError, LaunchError
from rlctl.launch.backends import read_sites

SSH = {"datacenter": "d", "scheduler": {"kind": "ssh", "user": "rl"}, "gpu": "H20", "nodes": [{"host": "h", "gpus": 1}]}
CPU = {"datacenter": "d", "scheduler": {"kind": "local"}, "gpu": "CPU", "nodes": [{"host": "h", "gpus": 1}]}
SPEC = {"name": "X1", "bf16_tflops": 100.0, "hbm_gb": 80.0, "hbm_tb_per_s": 2.0}


def _spec(**figures: Any) -> dict[str, Any]:
    return {**SSH, "gpu": None, "gpu_spec": {**SPEC, **figures}}


def _node(**fields: Any) -> dict[str, Any]:
    return {**CPU, "nodes": [{"host": "h", "gpus": 1, **fields}]}


def _hosts(*hosts: str) -> dict[str, Any]:
    return {**SSH, "nodes": [{"host": h, "gpus": 1} for h in hosts]}


# (a site an older rlctl launched, the refusal a new inventory gets: e7a8554, 914b48f, f21de19, cdbbb01, fd9c41e,
# 10237cc, 55fce8a, 859994e, 4c93e74)
CASES = {
    "cpus": (_node(cpus=10**9), "less than or equal to 4096"),
    "memory_gb": (_node(memory_gb=1e30), "less than or equal to 100000"),
    "network_bandwidth": ({**CPU, "network": {"bandwidth_gbps": 1e-300}}, "greater than or equal to 0.001"),
    "bf16_tflops_high": (_spec(bf16_tflops=1e300), "less than or equal to 100000"),
    "bf16_tflops_low": (_spec(bf16_tflops=1e-300), "greater than or equal to 0.001"),
    "hbm_gb": (_spec(hbm_gb=1e15), "less than or equal to 100000"),
    "hbm_tb_per_s_high": (_spec(hbm_tb_per_s=1e300), "less than or equal to 10000"),
    "hbm_tb_per_s_low": (_spec(hbm_tb_per_s=1e-300), "greater than or equal to 0.001"),
    "nvlink_high": (_spec(nvlink_gb_per_s=1e300), "less than or equal to 100000"),
    "nvlink_low": (_spec(nvlink_gb_per_s=1e-300), "greater than or equal to 0.001"),
    "gpu_cost_per_hour": (_spec(cost_per_hour=1e308), "less than or equal to 1000000"),
    "gpu_spec_name": (_spec(name="X1\nY"), "U+000A"),
    "devices": ({**SSH, "nodes": [{"host": "h", "gpus": 1, "devices": [10**9]}]}, "less than 1024"),
    "site_cost_per_gpu_hour": ({**SSH, "cost_per_gpu_hour": 1e308}, "less than or equal to 1000000"),
    "host_case": (_hosts("h20-01", "H20-01"), "listed twice"),
    "host_ipv6": (_hosts("2001:db8::5", "2001:DB8:0::5"), "listed twice"),
}


def _write_record(job_dir: Path, site: dict[str, Any]) -> None:
    (job_dir / "sites.json").write_text(json.dumps([{"name": "s", "site": site}]))


@pytest.mark.parametrize("case", CASES)
def test_a_recorded_site_past_a_newer_bound_reads_back_as_launched(tmp_path: Path, case: str) -> None:
    """Before: the record read back refused ('[0].site.nodes.0.cpus: Input should be …'), so `rlctl stop` of the
    job running with it, status, pull and a resume all failed on the job's own sites.json."""
    site, _ = CASES[case]
    _write_record(tmp_path, site)
    read = read_sites(tmp_path)["s"].model_dump(mode="json", by_alias=True)
    assert _as_given(read, site) == site  # each value as the launch wrote it


def _as_given(read: Any, given: Any) -> Any:
    """`read` cut down to the keys `given` has (a dump holds every default too)."""
    if isinstance(given, dict):
        return {k: _as_given(read[k], v) for k, v in given.items()}
    if isinstance(given, list):
        return [_as_given(r, g) for r, g in zip(read, given, strict=True)]
    return read


@pytest.mark.parametrize("case", CASES)
def test_a_new_inventory_past_the_bound_is_still_refused(tmp_path: Path, case: str) -> None:
    site, refused = CASES[case]
    with pytest.raises(ValidationError, match=re.escape(refused)):
        Site.model_validate(site)
    inv = tmp_path / "inv.yaml"  # as `rlctl check` / `plan` read one: one line naming the file and field (exit 2)
    inv.write_text(json.dumps({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"s": site}}))
    with pytest.raises(ConfigError, match=re.escape(refused)):
        load_inventory([inv])


@pytest.mark.parametrize(
    "scheduler",
    [{"kind": "ssh", "user": "-oProxyCommand=x"}, {"kind": "ssh", "proxy_jump": "-oProxyCommand=x@bastion"}],
    ids=["user", "proxy_jump"],
)
def test_a_recorded_login_name_starting_with_a_dash_stays_refused(tmp_path: Path, scheduler: dict[str, Any]) -> None:
    """Kept refused in a record: `rlctl stop` would run ssh with it, where it is an option (ProxyCommand runs x)."""
    _write_record(tmp_path, {**SSH, "scheduler": scheduler})
    with pytest.raises(LaunchError, match="starts with '-'"):
        read_sites(tmp_path)
