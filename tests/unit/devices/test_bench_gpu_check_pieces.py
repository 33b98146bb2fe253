"""The GPU check's pieces (bench/gpu_check.py): a lent GPU machine gives one run, so a piece that fails is recorded
and the others still run, the JSON so far is on disk after every piece, and a time budget skips what is left."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu_check import Pieces


def test_a_failing_piece_is_recorded_and_the_rest_run(tmp_path: Path) -> None:
    out: dict[str, object] = {"device": "cpu"}
    path = tmp_path / "gpu-check.json"
    piece = Pieces(out, path=str(path), budget_s=None)
    assert piece("a", lambda: {"x": 1}) == {"x": 1}
    assert piece("b", lambda: 1 / 0) is None
    assert json.loads(path.read_text())["errors"]["b"]["error"] == "ZeroDivisionError: division by zero"
    assert piece("c", lambda: {"y": 2}, merge=True) == {"y": 2}
    assert piece("d", lambda: None, timed=True) is not None
    r = json.loads(path.read_text())
    assert r["a"] == {"x": 1} and r["y"] == 2 and "b" not in r and isinstance(r["d"], float)
    assert set(r["piece_s"]) == {"a", "b", "c", "d"} and any(
        "test_bench_gpu_check" in f for f in r["errors"]["b"]["at"]
    )
    assert piece.artifacts == tmp_path


def test_pieces_past_the_budget_are_skipped() -> None:
    out: dict[str, object] = {}
    piece = Pieces(out, path=None, budget_s=-1.0)
    ran = []
    assert piece("late", lambda: ran.append(1)) is None
    assert ran == [] and out["skipped"] == ["late"] and piece.done() is out
