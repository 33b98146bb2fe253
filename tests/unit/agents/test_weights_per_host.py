"""One copy of the weights per host, not per trainer rank: two gloo ranks on this host publish four versions in
delta mode (each encodes its part of every delta); only the lowest rank holds them in host memory and is a root
of the broadcast, the other holds nothing, and a receiver gets the exact weights from that root. The host's
publishers together hold ≤ 1.25 × the model's bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.trainers.ranks import run_rank_script

RANK = Path(__file__).with_name("roots_rank.py")


@pytest.mark.timeout(180)
def test_the_lowest_rank_of_a_host_is_its_one_root(tmp_path: Path) -> None:
    world = 2
    run_rank_script(RANK, world, lambda r: [str(tmp_path / "rdzv"), str(tmp_path / f"out{r}.json")])
    r0, r1 = (json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(world))
    assert (r0["holds"], r1["holds"]) == (True, False)
    assert len(r0["roots"]) == 1 and r0["roots"] == r1["roots"]  # rank 0's node only
    assert r0["fetched_equal"] and r0["from"] == r0["roots"][0]
    held = r0["host_bytes"]
    assert held[1] == 0 and 0 < sum(held) <= 1.25 * r0["model_bytes"], (held, r0["model_bytes"])
