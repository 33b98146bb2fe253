"""`rlctl profile -o FILE` decides whether FILE is a profile from its head only (refuse_overwriting)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from rlctl.errors import UsageError
from rlctl.profiler.profile import refuse_overwriting


def test_a_large_file_is_judged_from_its_head_not_read_whole(tmp_path: Path) -> None:
    """`-o` naming a dataset read all of it (and YAML-parsed it) to find it no profile: 32 MiB held in memory."""
    big = tmp_path / "data.jsonl"
    with big.open("wb") as f:
        f.truncate(32 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(UsageError, match="holds a file that is no profile"):
            refuse_overwriting(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, peak


def test_a_file_larger_than_any_profile_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "huge.yaml"
    with big.open("wb") as f:
        f.truncate(65 * 1024 * 1024)
    with pytest.raises(UsageError, match=r"holds a file of 68157440 bytes, larger than any profile"):
        refuse_overwriting(big)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_profile_past_the_head_s_size_is_written_over_and_another_kind_is_named(tmp_path: Path, suffix: str) -> None:
    pad = [{"tp": i, "seconds": 0.5} for i in range(6000)]  # past 64 KiB
    for kind, refused in (("Profile", False), ("Job", True)):
        data = {"apiVersion": "rlctl/v1", "kind": kind, "sites": {"a": {"generation": pad}}}
        path = tmp_path / f"p{suffix}"
        path.write_text(json.dumps(data, indent=2) if suffix == ".json" else _yaml(data))
        assert path.stat().st_size > 64 * 1024
        if refused:
            with pytest.raises(UsageError, match="holds a file of kind 'Job'"):
                refuse_overwriting(path)
        else:
            refuse_overwriting(path)


def _yaml(data: object) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
