"""The job index: a small SQLite database listing every job this operator launched.

One row per job: name, job directory, state, where its controller listens, the resolved job as
JSON, timestamps. WAL mode so `rlctl status` can read while a launcher writes; JSON columns, no
pickle; a schema version checked on open (a newer database is refused, not silently misread).

    launching ──▶ running ──▶ finished
        │            │
        └────────────┴──────▶ failed / stopped
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError, UsageError
from rlctl.launch.jobdir import HOME_ENV

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
STATES = ("launching", "running", "finished", "failed", "stopped")
LIVE = ("launching", "running")  # the states of a job whose end its launcher has not recorded
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    name        TEXT PRIMARY KEY,
    job_dir     TEXT NOT NULL,
    state       TEXT NOT NULL,
    controller  TEXT,              -- address of the controller's RPC endpoint, e.g. tcp://host:port
    spec        TEXT NOT NULL,     -- the resolved job, JSON
    info        TEXT NOT NULL,     -- free-form JSON: sites, metrics port, backend handles
    created_s   REAL NOT NULL,
    updated_s   REAL NOT NULL
);
"""


def job_key(job_dir: Path) -> str | None:
    """A digest of the job's secret (None before it has one): what tells the job's index row at a place its directory
    left (moved or renamed: `JobDB.moved_here`) from another job's; the secret itself stays in the job dir."""
    try:
        return hashlib.sha256((job_dir / "secret").read_bytes()).hexdigest()[:32]
    except OSError:
        return None


def default_home() -> Path:
    """$RLCTL_HOME (set and not empty), else ~/.rlctl."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".rlctl")


@dataclass(frozen=True)
class JobRow:
    name: str
    job_dir: str
    state: str
    controller: str | None
    spec: dict[str, Any]
    info: dict[str, Any]
    created_s: float
    updated_s: float

    @property
    def launched_s(self) -> float:
        """When its newest run was launched (`launch`, `launch --resume`, an auto-resume): `put`'s time, kept in
        `info`; its creation for a row an rlctl without it wrote."""
        return float(self.info.get("launched_s", self.created_s))


class IndexUnreadable(RlctlError):
    """The job index cannot be opened (no database, a directory in its place, a lock): a command that can do
    without it (`rlctl status DIR`, `launch --dry-run`) goes on with a warning (`open_or_none`)."""


def open_or_none(*, without: str) -> JobDB | None:
    """The job index; None where it cannot be opened, said in one warning line naming the file, what to do, and
    what the command does `without` it."""
    try:
        return JobDB()
    except IndexUnreadable as e:
        log.warning("%s; %s%s", e, without, f" (hint: {e.hint})" if e.hint else "")
        return None


class JobDB:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else default_home() / "jobs.db"
        where = f"{HOME_ENV}={self.path.parent}" if path is None and os.environ.get(HOME_ENV) else str(self.path.parent)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise UsageError(
                f"{where}: not a directory ({e.strerror}: {e.filename}); the job index lives in one",
                hint=f"point {HOME_ENV} at a directory (or unset it: ~/.rlctl)",
            ) from e
        except OSError as e:
            raise RlctlError(f"{where}: cannot create the job index's directory: {e.strerror}") from e
        aside = (
            f"move it aside (mv {shlex.quote(str(self.path))} {shlex.quote(f'{self.path}.damaged')}): the next command "
            "starts an empty index, where a job is named by its directory until it is resumed"
        )
        if self.path.is_dir():  # (sqlite said "unable to open database file", and nothing to do)
            raise IndexUnreadable(f"{self.path}: a directory, where the job index (a file) belongs", hint=aside)
        try:
            self._conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.executescript(_SCHEMA)
            self._check_version()
        except sqlite3.DatabaseError as e:
            # OperationalError: a lock, a permission, the disk (no hint); else not a database, or a malformed one
            hint = None if isinstance(e, sqlite3.OperationalError) else aside
            raise IndexUnreadable(f"{self.path}: cannot open the job index: {e}", hint=hint) from e

    def _check_version(self) -> None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            self._conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise RlctlError(
                f"{self.path}: job index has schema {row[0]}, this rlctl knows {SCHEMA_VERSION}",
                hint=f"upgrade rlctl or set {HOME_ENV} to another directory",
            )

    def close(self) -> None:
        self._conn.close()

    def put(
        self,
        name: str,
        *,
        job_dir: str,
        spec: dict[str, Any],
        state: str = "launching",
        info: dict[str, Any] | None = None,
    ) -> None:
        assert state in STATES, state
        now = time.time()
        key = job_key(Path(job_dir))
        info = {"launched_s": now, **({"key": key} if key is not None else {}), **(info or {})}
        self._conn.execute(
            "INSERT INTO jobs VALUES (?, ?, ?, NULL, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
            "job_dir=excluded.job_dir, state=excluded.state, controller=NULL, spec=excluded.spec, info=excluded.info, "
            "updated_s=excluded.updated_s",
            (name, job_dir, state, json.dumps(spec), json.dumps(info), now, now),
        )

    def update(
        self,
        name: str,
        *,
        state: str | None = None,
        controller: str | None = None,
        info: dict[str, Any] | None = None,
        only_from: tuple[str, ...] | None = None,
    ) -> bool:
        """Change the job's row; with `only_from`, only while its state is one of those, decided by the UPDATE
        itself (a launcher's `running` and an operator's `stopped` written at once: the one that comes second
        sees the other's state and changes nothing). Whether the row changed."""
        row = self.get(name)
        assert state is None or state in STATES, state
        merged = {**row.info, **(info or {})}
        where, args = "name=?", [name]
        if only_from is not None:
            where += f" AND state IN ({', '.join('?' for _ in only_from)})"
            args += only_from
        cur = self._conn.execute(
            f"UPDATE jobs SET state=?, controller=?, info=?, updated_s=? WHERE {where}",
            (state or row.state, controller or row.controller, json.dumps(merged), time.time(), *args),
        )
        return cur.rowcount > 0

    def put_back(self, row: JobRow, *, only_from: tuple[str, ...]) -> bool:
        """The job's row as `row` was (read before a run's `put`, which replaced its info: a run that refused to
        start undoes it), only while its state is one of `only_from`, decided by the UPDATE itself. Whether it did."""
        row_now = (row.job_dir, row.state, row.controller, json.dumps(row.spec), json.dumps(row.info), time.time())
        cur = self._conn.execute(
            "UPDATE jobs SET job_dir=?, state=?, controller=?, spec=?, info=?, updated_s=? "
            f"WHERE name=? AND state IN ({', '.join('?' for _ in only_from)})",
            (*row_now, row.name, *only_from),
        )
        return cur.rowcount > 0

    def remove(self, name: str, *, only_from: tuple[str, ...]) -> bool:
        """Take the job's row out, only while its state is one of `only_from` (a run that refused to start, of a job
        the index did not hold before it: its `launching` row undone). Whether it did."""
        cur = self._conn.execute(
            f"DELETE FROM jobs WHERE name=? AND state IN ({', '.join('?' for _ in only_from)})", (name, *only_from)
        )
        return cur.rowcount > 0

    def get(self, name: str) -> JobRow:
        row = self._conn.execute("SELECT * FROM jobs WHERE name=?", (name,)).fetchone()
        if row is None:
            known = [r.name for r in self.list()]
            raise RlctlError(f"no job named {name!r}; known: {', '.join(known) or 'none'}")
        return self._row(row)

    def list(self) -> list[JobRow]:
        return [self._row(r) for r in self._conn.execute("SELECT * FROM jobs ORDER BY created_s")]

    def moved_here(self, job_dir: Path) -> JobRow | None:
        """The row of the job in `job_dir` at a place the directory left (moved or renamed, its id the old
        directory's name): the same job (`job_key`) whose directory there is gone. None where there is none: a copy
        (its original's directory is still there), or a row an rlctl before keys wrote."""
        key = job_key(job_dir)
        if key is None:
            return None
        here = job_dir.resolve()
        return next(
            (
                r
                for r in self.list()
                if r.info.get("key") == key and Path(r.job_dir).resolve() != here and not Path(r.job_dir).is_dir()
            ),
            None,
        )

    def id_for(self, job_dir: Path) -> str:
        """The id a fresh launch into `job_dir` takes: its directory's name, unless another job of the index has that
        id and its directory is still there (a launch into /b/run while /a/run runs or is kept): then the name and a
        digest of the path, so that neither the row nor the sites' job dirs (`W/jobs/<id>`) of one job are the
        other's. A row whose directory is gone is taken over, as before."""
        here = job_dir.resolve()
        digest = hashlib.sha256(str(here).encode()).hexdigest()
        for job_id in (job_dir.name, *(f"{job_dir.name}-{digest[:n]}" for n in (8, 16, 64))):
            row = self._conn.execute("SELECT job_dir FROM jobs WHERE name=?", (job_id,)).fetchone()
            if row is None or Path(row[0]).resolve() == here or not Path(row[0]).is_dir():
                return job_id
        raise RlctlError(f"{self.path}: no free id for a job in {job_dir}")  # three SHA-256 prefixes taken

    def reserve(
        self, job_dir: Path, *, spec: dict[str, Any], info: dict[str, Any], record: Callable[[str], None]
    ) -> str:
        """`id_for` a fresh launch into `job_dir`, with its row put (`launching`, `info`) in the same transaction: two
        launches at once into /a/run and /b/run each take an id the other does not (reading the rows and putting
        one apart, both took `run`). `record(id)` writes the id into the job dir before the row is committed: a
        launcher gone in between leaves no row whose directory names itself otherwise."""
        self._conn.execute("BEGIN IMMEDIATE")  # the index's writers wait here (`timeout`) until this one commits
        try:
            job_id = self.id_for(job_dir)
            self.put(job_id, job_dir=str(job_dir), spec=spec, info=info)
            record(job_id)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        return job_id

    def latest(self) -> JobRow | None:
        """The job launched last (`JobRow.launched_s`: a resume is a launch), which a command whose JOB is omitted
        means; not the row updated last, which another job's launcher or an operator's stop moves."""
        return max(self.list(), key=lambda r: r.launched_s, default=None)

    @staticmethod
    def _row(r: tuple[Any, ...]) -> JobRow:
        return JobRow(r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5]), r[6], r[7])
