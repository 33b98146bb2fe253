"""A fetch killed mid-copy (SIGKILL: no `finally` ran) leaves its `.part` beside the log it fetched; the next fetch of
that log removes it where its name says a process of this host and pid space (`procfs.pid_space`: this boot, this pid
namespace) that is gone, versus kept in the job dir for good. A part of a process alive, of another host or pid space
sharing the job dir (NFS; a container of another machine given this host name), or of an older rlctl (no pid space in
its name) stays: nothing here can tell that its fetch ended."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlctl import procfs
from rlctl.launch.record import fetch_record
from tests.unit.launch.test_stage import _controller_site


def test_a_fetch_removes_the_parts_of_its_log_that_a_gone_fetch_of_this_machine_left(tmp_path: Path) -> None:
    src, site, root = _controller_site(tmp_path)
    (root / "metrics.jsonl").write_text('{"iteration": 0}\n')
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    gone, host, space = int(ended.stdout), socket.gethostname(), procfs.pid_space()
    assert space is not None
    left = src / f".metrics.jsonl.{gone}-1-0badf00d-{host}-{space}.part"
    kept = [
        src / f".metrics.jsonl.{os.getpid()}-1-0badf00d-{host}-{space}.part",  # a fetch alive (another thread of this)
        src / f".metrics.jsonl.{gone}-1-0badf00d-elsewhere-{space}.part",  # another host's process
        # a container of another machine named as this one: its pid names nothing here (it was removed)
        src / f".metrics.jsonl.{gone}-1-0badf00d-{host}-00000000-0000-0000-0000-000000000000-1.part",
        src / f".metrics.jsonl.{gone}-1-0badf00d-{host}.part",  # an older rlctl's: its host only (it was removed)
        src / f".metrics.jsonl.{gone}-1-0badf00d.part",  # an older rlctl's: no host
        src / f".summary.json.{gone}-1-0badf00d-{host}-{space}.part",  # another name's
    ]
    for p in [left, *kept]:
        p.write_text('{"iterat')
    assert fetch_record(src, site, "localhost", str(root)) == ["metrics.jsonl"]
    assert (src / "metrics.jsonl").read_text() == '{"iteration": 0}\n'
    assert sorted(src.glob(".*.part")) == sorted(kept)


def test_a_fetch_lists_the_job_dir_once_for_all_its_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs and tracker files fetched, each through a part of its own: the job dir is listed once, and each name's
    gone parts are removed all the same (versus a listing at each part: one a tracker file)."""
    src, site, root = _controller_site(tmp_path)
    (root / "metrics.jsonl").write_text('{"iteration": 0}\n')
    (root / "evaluations.jsonl").write_text('{"iteration": 0}\n')
    for tree, n in (("tensorboard", 3), ("wandb", 2)):
        (root / tree).mkdir()
        for i in range(n):
            (root / tree / f"f{i}").write_text("x")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    here = f"{int(ended.stdout)}-1-0badf00d-{socket.gethostname()}-{procfs.pid_space()}"
    left = [src / f".{name}.{here}.part" for name in ("metrics.jsonl", "evaluations.jsonl", "tensorboard", "wandb")]
    for p in left:
        p.write_text("x")
    listed: list[str] = []
    listdir = os.listdir

    def counted(path: Any = ".") -> list[str]:
        listed.append(os.fspath(path))
        return listdir(path)

    monkeypatch.setattr(os, "listdir", counted)
    fetched = fetch_record(src, site, "localhost", str(root))
    assert len(fetched) == 7 and "tensorboard/f2" in fetched and "wandb/f1" in fetched
    assert listed.count(str(src)) == 1
    assert not any(p.exists() for p in left) and sorted(src.glob(".*.part")) == []
