"""The SQLite job index: upsert, update, list, schema guard, WAL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rlctl.errors import RlctlError
from rlctl.ops.jobdb import SCHEMA_VERSION, JobDB


def test_put_update_list(tmp_path: Path) -> None:
    db = JobDB(tmp_path / "jobs.db")
    db.put("demo", job_dir="/runs/demo-1", spec={"name": "demo", "iterations": 3})
    db.update("demo", state="running", controller="tcp://127.0.0.1:5000", info={"metrics_port": 9400})
    db.update("demo", info={"pid": 42})
    row = db.get("demo")
    assert (row.state, row.controller) == ("running", "tcp://127.0.0.1:5000")
    assert row.info == {"launched_s": row.launched_s, "metrics_port": 9400, "pid": 42}
    assert row.spec["iterations"] == 3
    db.put("demo", job_dir="/runs/demo-2", spec={"name": "demo"})  # relaunch replaces the row
    assert db.get("demo").job_dir == "/runs/demo-2" and db.get("demo").controller is None
    db.put("other", job_dir="/runs/o", spec={})
    assert [r.name for r in db.list()] == ["demo", "other"]
    assert db.latest() is not None and db.latest().name == "other"  # type: ignore[union-attr]
    mode = sqlite3.connect(tmp_path / "jobs.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_unknown_job_names_known_ones(tmp_path: Path) -> None:
    db = JobDB(tmp_path / "jobs.db")
    db.put("demo", job_dir="/r", spec={})
    with pytest.raises(RlctlError, match="no job named 'demp'; known: demo"):
        db.get("demp")


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    JobDB(tmp_path / "jobs.db").close()
    conn = sqlite3.connect(tmp_path / "jobs.db")
    conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    with pytest.raises(RlctlError, match="schema"):
        JobDB(tmp_path / "jobs.db")


def test_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "jobs.db").write_bytes(b"not a database" * 100)
    with pytest.raises(RlctlError, match="cannot open the job index") as e:
        JobDB(tmp_path / "jobs.db")
    assert e.value.hint == (  # it said nothing of what to do: every command failed on it, a job dir named too
        f"move it aside (mv {tmp_path}/jobs.db {tmp_path}/jobs.db.damaged): the next command starts an empty index, "
        "where a job is named by its directory until it is resumed"
    )


def test_an_update_only_from_some_states_never_overwrites_another(tmp_path: Path) -> None:
    # a launcher's `running` written after the operator's `stopped` (a stop while the run started) revived the job
    db = JobDB(tmp_path / "jobs.db")
    db.put("demo", job_dir="/r", spec={})
    db.update("demo", state="stopped")
    assert not db.update("demo", state="running", controller="tcp://h:1", only_from=("launching",))
    assert (db.get("demo").state, db.get("demo").controller) == ("stopped", None)
    db.put("demo", job_dir="/r", spec={})
    assert db.update("demo", state="running", controller="tcp://h:1", only_from=("launching",))
    assert db.get("demo").state == "running"
