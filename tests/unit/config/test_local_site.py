"""A local site's agents run on this machine: what its entry names there (the work root) must be what this machine
has, or `rlctl check` refuses it, of the inventory alone or of a job on it, in one line naming the inventory file
and the field, exit 2 — before launch writes anything."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, run_cli

DEMO = ROOT / "jobs" / "demo.yaml"


def local_inventory(tmp_path: Path, **fields: Any) -> Path:
    """An inventory of one local site, `local`, as clusters/local.yaml, with `fields` set on it (`scheduler`
    merged into its scheduler entry)."""
    site: dict[str, Any] = {
        "datacenter": "here",
        "scheduler": {"kind": "local", **fields.pop("scheduler", {})},
        "gpu": "CPU",
        "nodes": [{"host": "localhost", "gpus": 4}],
        **fields,
    }
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"local": site}}))
    return path


def checked(tmp_path: Path, inventory: Path) -> list[str]:
    """`rlctl check` of the inventory, then of the demo job on it: each one error line, exit 2."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**yaml.safe_load(DEMO.read_text()), "inventory": [str(inventory)]}))
    lines = []
    for file in (inventory, job):
        res = run_cli("check", str(file))
        assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res
        lines.append(res.stderr.strip())
    return lines


@pytest.mark.parametrize("under", ["empty", "file", "proc"])
def test_a_local_work_root_this_machine_cannot_make_is_refused_naming_the_inventory(tmp_path: Path, under: str) -> None:
    """It passed check; launch then failed at `cannot create …/jobs/run-…: Not a directory`, exit 1, naming neither
    the inventory nor the field; "" put the job's files under the directory launch ran in."""
    (tmp_path / "notes.txt").write_text("mine\n")
    workdir, says = {
        "empty": ("", "String should have at least 1 character"),
        "file": (str(tmp_path / "notes.txt"), f"{tmp_path / 'notes.txt'} is a file, not a directory"),
        "proc": ("/proc/rlctl-not-made", "/proc/rlctl-not-made: cannot make a directory in /proc"),
    }[under]
    inventory = local_inventory(tmp_path, scheduler={"workdir": workdir})
    for line in checked(tmp_path, inventory):
        assert line.startswith(f"rlctl: error: {inventory}: sites.local.scheduler.workdir: {says}"), line
    made = tmp_path / "roots" / "rl"  # one that can be made passes, and is not made by the check
    assert run_cli("check", str(local_inventory(tmp_path, scheduler={"workdir": str(made)}))).exit_code == 0
    assert not (tmp_path / "roots").exists()


@pytest.mark.parametrize("python", ["/nonexistent/python3", "notes.txt", "tmp", "python3.rlctl-none"])
def test_a_local_python_that_cannot_start_is_refused_naming_the_inventory(tmp_path: Path, python: str) -> None:
    """It passed check; launch then failed at `cannot start controller-0: [Errno 2] No such file or directory`,
    exit 1. A file without the x bit, a directory, and a command name not in PATH are refused as well."""
    (tmp_path / "notes.txt").write_text("mine\n")
    given = {"notes.txt": str(tmp_path / "notes.txt"), "tmp": str(tmp_path)}.get(python, python)
    says = "no such command in this machine's PATH" if "/" not in given else "no such file"
    says = "not an executable file" if python in ("notes.txt", "tmp") else says
    inventory = local_inventory(tmp_path, python=given)
    for line in checked(tmp_path, inventory):
        assert line.startswith(f"rlctl: error: {inventory}: sites.local.python: {given}: {says}"), line
    for fine in (sys.executable, "python3"):  # an interpreter of this machine, by path or by name
        assert run_cli("check", str(local_inventory(tmp_path, python=fine))).exit_code == 0
