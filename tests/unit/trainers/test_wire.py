"""The trainer group's values travel as msgpack in uint8 tensors (`rlctl.trainers.wire`): three gloo ranks
broadcast the learner's commands and gather strings and bytes of different lengths, each received exactly as
sent and built as the receiver's type; a value of the wrong shape is refused on every rank. Nothing
in rlctl uses torch's pickling `*_object` collectives."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.unit.trainers.ranks import ROOT, run_rank_script

RANK = Path(__file__).with_name("wire_rank.py")


@pytest.mark.timeout(180)
def test_values_cross_the_group_as_typed_msgpack(tmp_path: Path) -> None:
    world = 3
    run_rank_script(RANK, world, lambda r: [str(tmp_path / "rdzv"), str(tmp_path / f"out{r}.json")])
    outs = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(world)]
    sample = {"prompt_id": "p0", "prompt_tokens": [1, 2], "output_tokens": [3, 4, 5],
              "logprobs": [-0.5, -1.25, -2.0], "reward": 0.75, "version": 3, "ref_logprobs": None}  # fmt: skip
    for r, got in enumerate(outs):
        assert got["chunk"] == [sample, [0.1]] and got["step"] == 41 and got["stop"] == "Stop", (r, got)
        assert got["gathered"] == [f"tcp://10.0.0.{i}:1" * (i + 1) for i in range(world)]
        assert got["bytes"] == [0, 200, 600]
        # every rank, the sender too, builds the value from the bytes: the wrong shape is refused everywhere
        assert got["wrong"] == "a value broadcast by trainer rank 0: Object missing required field `type`", got


def test_nothing_uses_the_pickling_object_collectives() -> None:
    """broadcast_object_list, all_gather_object, gather_object, scatter_object_list, send/recv_object_list
    unpickle what a peer sends: rlctl exchanges values through `rlctl.trainers.wire` instead."""
    pickling = {"broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                "send_object_list", "recv_object_list"}  # fmt: skip
    found = []
    for path in sorted((ROOT / "rlctl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in pickling:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}")
    assert found == []
