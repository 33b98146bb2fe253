"""A rollout unit's flight record outlives the unit: a process SIGKILLed after writing it leaves it readable."""

from __future__ import annotations

import os
import signal
import socket
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
rec.wrote(1, dropped=True)
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_its_record(tmp_path: Path) -> None:
    path = tmp_path / "flight" / "rollout-0"
    p = subprocess.run([sys.executable, "-c", WRITER, str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL
    f = read_flight(path)
    assert f is not None
    assert (f.num_steps, f.generated_tokens, f.sent_tokens, f.dropped_tokens, f.unsent_tokens) == (2, 7, 3, 1, 3)
    assert (f.pid, f.host) == (int(p.stdout), socket.gethostname())
    assert [q.name for q in path.parent.iterdir()] == ["rollout-0"]  # written aside, renamed into place


def test_a_new_unit_of_the_same_name_starts_a_new_record_the_old_one_cannot_write_into(tmp_path: Path) -> None:
    path = tmp_path / "rec"
    old = FlightRecord(path)
    old.stepped(2)
    new = FlightRecord(path)
    old.stepped(9)  # an orphan of a resumed job, still running: its own file, no longer the record
    f = read_flight(path)
    assert f is not None and (f.num_steps, f.generated_tokens, f.pid) == (0, 0, os.getpid())
    new.stepped(1)
    f = read_flight(path)
    assert f is not None and (f.num_steps, f.generated_tokens) == (1, 1)
    old.close()
    new.close()


def test_no_record_or_another_file_reads_as_none(tmp_path: Path) -> None:
    assert read_flight(tmp_path / "missing") is None
    (tmp_path / "other").write_bytes(b"x" * 4096)
    assert read_flight(tmp_path / "other") is None
    (tmp_path / "short").write_bytes(b"rlflight")
    assert read_flight(tmp_path / "short") is None
