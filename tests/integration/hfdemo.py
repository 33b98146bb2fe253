"""The HF demo's checkpoint and data for a test job: built by the shipped builder, untrained (no SFT warm-up),
into the test's directory (nothing can be downloaded on these machines)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build_hf_demo(out: Path, *, rows: int = 64) -> None:
    """`out`/model (a Qwen2-architecture checkpoint) and `out`/data.jsonl (`rows` rows)."""
    build = subprocess.run(
        [sys.executable, str(REPO / "jobs/hf-demo/build.py"), "--out", str(out), "--sft-steps=0", f"--rows={rows}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
