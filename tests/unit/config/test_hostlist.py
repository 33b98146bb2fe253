"""SLURM hostlists through python-hostlist: scontrol's syntax, zero padding, malformed input as one clear line."""

from __future__ import annotations

import json
import os

import pytest

from rlctl.config.hosts import expand_hostlist as expand
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / "launch" / "nodelist.json"
CASES = [
    "sitea-[1-2],siteb-[1,3-4]",
    "h20-[01-04]",
    "n[08-11]",
    "n[098-102]",
    "rack[1-2]-node[01-02]",
    "gpu[7],cpu-[9-10]x",
    "login1,login2",
    "plain",
]


def test_expansions_match_golden() -> None:
    got = {case: expand(case) for case in CASES}
    if os.environ.get("RLCTL_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    assert GOLDEN.exists(), f"no golden file {GOLDEN}; run with RLCTL_UPDATE_GOLDEN=1 to create it"
    assert got == json.loads(GOLDEN.read_text())


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("sitea-[1-2],siteb-[1,3-4]", ["sitea-1", "sitea-2", "siteb-1", "siteb-3", "siteb-4"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a-[0]", ["a-0"]),
        ("x[1-1]y", ["x1y"]),
    ],
)
def test_expand(hostlist: str, hosts: list[str]) -> None:
    assert expand(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "message"),
    [
        ("", "empty"),
        ("a[1-2", "unbalanced brackets"),
        ("a]1", "unbalanced brackets"),
        ("a[[1]]", "nested brackets"),
        ("a[]", "bad range"),
        ("a[3-1]", "start > stop"),
        ("a[x-2]", "bad range"),
        ("a[1-]", "bad range"),
        ("a b", "whitespace"),
        ("a[1-99999999]", "too large"),
        ("a[1-1000]b[1-1001]", "too large"),
    ],
)
def test_malformed_hostlists_raise_clear_value_error(hostlist: str, message: str) -> None:
    with pytest.raises(ValueError, match="bad hostlist") as e:
        expand(hostlist)
    assert message in str(e.value)
    assert repr(hostlist) in str(e.value)
