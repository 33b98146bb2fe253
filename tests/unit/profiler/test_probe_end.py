"""A site's probe (`python -m rlctl.profiler.probe`) that measured the megatron backend, which forms and takes down
a one-rank gloo group in the probe's process, ends without the interpreter's finalization, its figures written,
versus through it: the group's worker thread could still be freeing its last collective there (SIGABRT, the probe
-6 after its file was written: rlctl.exits)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.rank_end import probe_rank_ends
from tests.unit.trainers.megatron_required import require_megatron

MODULE = "rlctl.profiler.probe"
TINY = ["--model", "tiny-demo", "--kv-capacity-tokens", "1000", "--prompts", "2", "--samples-per-prompt", "2"]


def test_a_megatron_probe_ends_without_finalization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_megatron()
    ends = probe_rank_ends(monkeypatch, tmp_path, MODULE)
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, *TINY, "--trainer-backend", "megatron", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text())["training"], "its figures written before it ended"
    assert sorted(p.name.partition("-")[0] for p in ends.iterdir()) == ["rank"]  # no `finalized-PID`


def test_a_probe_refused_keeps_its_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ends = probe_rank_ends(monkeypatch, tmp_path, MODULE)
    missing = tmp_path / "no-such-checkpoint"
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, "--checkpoint", str(missing), "--kv-capacity-tokens", "1000", "--out", "o"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1].startswith("rlctl profile probe: "), proc.stderr[-2000:]
    assert str(missing) in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name.partition("-")[0] for p in ends.iterdir()) == ["rank"]
