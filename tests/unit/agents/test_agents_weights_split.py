"""Trainer ranks split the delta encoding of each version (rlctl.agents.weights, rlctl.weights.encoder): two
ranks in two processes over gloo each encode their half of the version's buffer, hold the same delta payload, and
a unit fetching from either rebuilds and verifies every version through the deltas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RANK = Path(__file__).with_name("weights_split_rank.py")


@pytest.mark.timeout(180)
def test_two_ranks_split_the_delta_encoding(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(RANK), str(r), "2", str(tmp_path / "rendezvous"), str(tmp_path / f"rank{r}.json")],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    errors = [p.communicate(timeout=150)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors[0][-3000:] + errors[1][-3000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    total = got[0]["weights_bytes"]
    for g in got:
        assert g["fetched"] == {"1": {"encoding": "full", "equal": True}, "3": {"encoding": "delta", "equal": True}}
    # each rank compared its own half of the buffer for both deltas (part_range: the tensors' bytes, no padding)
    half = [got[r]["encoded_bytes"] // 2 for r in (0, 1)]
    assert sum(half) <= total and abs(half[0] - half[1]) <= total // 10 and min(half) > 0
    assert got[0]["delta_xxh3"] == got[1]["delta_xxh3"]
