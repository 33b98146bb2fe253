"""SLURM hostlist expansion and compression: scontrol's syntax, zero padding, malformed input."""

from __future__ import annotations

import json
import os

import pytest

from rlctl.launch.nodelist import compress, expand
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


@pytest.mark.parametrize("hostlist", [*CASES, "n[1-3,5,7-9]", "a-[001-010]"])
def test_compress_inverts_expand(hostlist: str) -> None:
    hosts = expand(hostlist)
    assert expand(compress(hosts)) == hosts


def test_compress_merges_neighbours() -> None:
    assert compress(["a-1", "a-2", "a-3", "b-7", "a-9"]) == "a-[1-3],b-7,a-9"
    assert compress(["n08", "n09", "n10"]) == "n[08-10]"


@pytest.mark.parametrize(
    ("hostlist", "message"),
    [
        ("", "empty"),
        ("a[1-2", "never closed"),
        ("a]1", "']' without '['"),
        ("a[[1]]", "nested"),
        ("a[]", "empty brackets"),
        ("a[3-1]", "runs backwards"),
        ("a[x-2]", "not N or N-M"),
        ("a[1-]", "not N or N-M"),
        ("a,,b", "stray comma"),
        ("a b", "whitespace"),
        ("a[1-99999999]", "more than"),
        ("a[1-1000]b[1-1001]", "more than"),
    ],
)
def test_malformed_hostlists_raise_clear_value_error(hostlist: str, message: str) -> None:
    with pytest.raises(ValueError, match="bad hostlist") as e:
        expand(hostlist)
    assert message in str(e.value)
    assert repr(hostlist) in str(e.value)
