"""A rollout unit's flight record outlives the unit: a process SIGKILLed after writing it leaves it readable."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from rlctl.agents.flight import FlightRecord, read_flight

WRITER = """
import os, signal, sys
from pathlib import Path
from rlctl.agents.flight import FlightRecord
rec = FlightRecord(Path(sys.argv[1]))
rec.stepped(5)
rec.wrote(3)
rec.stepped(2)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_its_record(tmp_path: Path) -> None:
    path = tmp_path / "flight" / "rollout-0"
    p = subprocess.run([sys.executable, "-c", WRITER, str(path)], timeout=60)
    assert p.returncode == -signal.SIGKILL
    f = read_flight(path)
    assert f is not None
    assert (f.steps, f.unsent, f.sent) == (2, 4, 3)
    assert f.pid > 0


def test_writes_never_count_below_zero_unsent_and_a_new_unit_starts_a_new_record(tmp_path: Path) -> None:
    path = tmp_path / "rec"
    rec = FlightRecord(path)
    rec.stepped(2)
    rec.wrote(5)  # more written than counted (an engine that adds tokens otherwise) leaves none unsent
    f = read_flight(path)
    assert f is not None and (f.steps, f.unsent, f.sent) == (1, 0, 5)
    rec.close()
    FlightRecord(path).close()
    f = read_flight(path)
    assert f is not None and (f.steps, f.unsent, f.sent) == (0, 0, 0)


def test_no_record_or_another_file_reads_as_none(tmp_path: Path) -> None:
    assert read_flight(tmp_path / "missing") is None
    (tmp_path / "other").write_bytes(b"x" * 64)
    assert read_flight(tmp_path / "other") is None
    (tmp_path / "short").write_bytes(b"rlflight")
    assert read_flight(tmp_path / "short") is None
