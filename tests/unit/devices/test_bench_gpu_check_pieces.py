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


def test_only_the_pieces_named_run_and_the_build() -> None:
    """`RLCTL_GPU_CHECK_ONLY`: a short second run on a lease runs the pieces it names (and the checkpoint's build)."""
    out: dict[str, object] = {}
    piece = Pieces(out, path=None, budget_s=None, only={"engine_mixed"})
    assert piece("build_s", lambda: None, timed=True) is not None
    assert piece("engine", lambda: {"64": 1.0}) is None
    assert piece("engine_mixed", lambda: {"tok_s": 1.0}) == {"tok_s": 1.0}
    assert out["skipped"] == ["engine"] and out["engine_mixed"] == {"tok_s": 1.0} and "build_s" in out


def test_a_cpu_bench_keeps_its_headline_figures(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """gpu-check's CPU benches keep the figures the issues name (and each staleness configuration's samples/s and
    all-units-idle fraction), not the curves; `bench.NAME.run` is what runs (a stand-in here: the benches run in
    their own tests)."""
    import sys
    import types

    import bench.gpu_check as gc

    full = {"eta4_over_eta1": 1.3, "eta2_over_eta1": 1.1, "eta1_over_sync": 1.0, "staleness_violations": 0}
    full |= {"lost": 0, "iterations": 12, "seeds": [0], "wall_s": 9.0}
    full["configs"] = {"eta1": {"samples_per_s": 2.0, "all_idle": 0.1, "reward_curves": [[0.1]]}}
    calls = []

    def run(*, quick: bool) -> dict[str, object]:
        calls.append(quick)
        return full

    monkeypatch.setitem(sys.modules, "bench.staleness", types.SimpleNamespace(run=run))
    got = gc._cpu_bench("staleness", quick=True)
    assert calls == [True] and "seeds" not in got and "wall_s" not in got
    assert got["eta4_over_eta1"] == 1.3 and got["configs"] == {"eta1": {"samples_per_s": 2.0, "all_idle": 0.1}}


def test_the_check_names_the_device_by_its_catalog_entry() -> None:
    """The lent machine is an H200 now: its bandwidth floor, MFU peak and the launched job's inventory were an
    H100's whatever the device (80 GB planned on a 141 GB card)."""
    from bench.gpu_check import catalog_gpu

    assert catalog_gpu("NVIDIA H200") == "H200"
    assert catalog_gpu("NVIDIA H100 80GB HBM3") == "H100"
    assert catalog_gpu("NVIDIA A100-SXM4-80GB") == "A100"
    assert catalog_gpu("NVIDIA GeForce RTX 4090") == "H100"  # not in the catalog: priced as the reference part
