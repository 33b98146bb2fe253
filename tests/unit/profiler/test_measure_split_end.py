"""A measured split's rank (`python -m rlctl.profiler.measure_split SPEC RANK`) ends without the interpreter's
finalization however its main left, an error too (its traceback, exit 1), versus only after main returned: a rank
whose main raised went through finalization, where a gloo worker thread still freeing the last collective could be
unwound through a C++ destructor (SIGABRT: the rank -6, not its error)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.rank_end import probe_rank_ends

MODULE = "rlctl.profiler.measure_split"


@pytest.mark.parametrize(("argv", "said"), [(["missing/spec.json", "0"], "FileNotFoundError"), ([], "IndexError")])
def test_a_rank_whose_main_raises_ends_without_finalization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], said: str
) -> None:
    ends = probe_rank_ends(monkeypatch, tmp_path, MODULE)
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1].startswith(f"{said}: "), proc.stderr[-2000:]
    assert sorted(p.name.partition("-")[0] for p in ends.iterdir()) == ["rank"]  # no `finalized-PID`
