"""The sample log: what the ledger retired, cut back to a checkpoint on resume, read together with its ledger."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rlctl.agents import samplelog
from rlctl.agents.ledger import Ledger, entry_row
from rlctl.agents.samplelog import SampleLog


def _round(led: Ledger, it: int) -> list:
    """Round `it` (one group of two) generated, trained and retired."""
    if f"p{it}/0" not in led.entries:
        led.add_prompt(iteration=it, prompt_id=f"p{it}", num_samples=2)
    for k in range(2):
        sid = f"p{it}/{k}"
        led.dispatch(sid, agent="r0", version=it)
        led.finish(sid, agent="r0", version=it, output_tokens=10 * it + k)
        led.deliver(sid)
        led.mark_trained(sid)
    return led.retire(it)


def test_the_log_cut_to_a_checkpoint_and_that_checkpoints_ledger_hold_each_sample_once(tmp_path: Path) -> None:
    led, log = Ledger(), SampleLog(tmp_path / "samples.jsonl")
    log.write(_round(led, 0))
    led.add_prompt(iteration=1, prompt_id="p1", num_samples=2)  # in flight when the checkpoint is taken
    ckpt, size = led.to_json(), log.size()
    led2 = Ledger.from_json(ckpt)
    log.write(_round(led, 1))  # the run goes on past the checkpoint, retires round 1, then dies
    assert [r["sample_id"] for r in samplelog.read(log.path)] == ["p0/0", "p0/1", "p1/0", "p1/1"]

    resumed = SampleLog(log.path)
    assert resumed.cut(size) == 2  # round 1's lines go aside: this run trains it again
    assert [r["sample_id"] for r in samplelog.read(log.path)] == ["p0/0", "p0/1"]
    gone = samplelog.read(tmp_path / "samples.discarded.jsonl")
    assert [(r["sample_id"], r["output_tokens"]) for r in gone] == [("p1/0", 10), ("p1/1", 11)]
    rows = samplelog.rows(log.path, led2.to_json(), size)
    assert sorted((r["sample_id"], r["state"]) for r in rows) == [
        ("p0/0", "trained"),
        ("p0/1", "trained"),
        ("p1/0", "queued"),
        ("p1/1", "queued"),
    ]
    assert samplelog.rows(log.path, led2.to_json(), None) == led2.to_json()["entries"]  # a checkpoint from before
    resumed.write(_round(led2, 1))  # appended after the cut
    assert [r["sample_id"] for r in samplelog.read(log.path)] == ["p0/0", "p0/1", "p1/0", "p1/1"]
    resumed.close()


def test_a_log_shorter_than_the_checkpoint_says_is_left_as_it_is(tmp_path: Path) -> None:
    log = SampleLog(tmp_path / "samples.jsonl")
    assert log.cut(100) == 0 and not log.path.exists()  # none yet
    log.write(_round(Ledger(), 0))
    size = log.size()
    assert log.cut(size + 100) == 0 and log.size() == size  # never padded


def test_a_cut_that_cannot_set_the_lines_aside_keeps_them_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills as a resume moves the lines past its checkpoint to samples.discarded.jsonl: they stay in the
    log (the next resume cuts them again), versus truncated away first and then lost with the failed write."""
    led, log = Ledger(), SampleLog(tmp_path / "samples.jsonl")
    log.write(_round(led, 0))
    size = log.size()
    log.write(_round(led, 1))
    log.close()
    whole = log.path.read_bytes()
    real_open = Path.open

    def full_disk(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self.name == "samples.discarded.jsonl":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", full_disk)
    with pytest.raises(OSError, match="No space"):
        SampleLog(log.path).cut(size)
    monkeypatch.setattr(Path, "open", real_open)
    assert log.path.read_bytes() == whole  # round 1's lines are still somewhere: here
    resumed = SampleLog(log.path)
    assert resumed.cut(size) == 2  # the next resume moves them
    assert [r["sample_id"] for r in samplelog.read(tmp_path / "samples.discarded.jsonl")] == ["p1/0", "p1/1"]
    assert [r["sample_id"] for r in samplelog.read(log.path)] == ["p0/0", "p0/1"]


def test_the_file_the_lines_go_to_is_named_on_disk_before_the_log_loses_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume's first cut makes samples.discarded.jsonl: its directory is synced (its name durable) while the log
    still holds the lines it moves, versus never, where a power loss could keep the log's truncation and not the new
    file's name — round 1's lines gone from both (the metrics' cut syncs it: metrics.discarded.jsonl)."""
    led, log = Ledger(), SampleLog(tmp_path / "samples.jsonl")
    log.write(_round(led, 0))
    size = log.size()
    log.write(_round(led, 1))
    log.close()
    whole = log.size()
    synced: list[tuple[int, int]] = []  # at each fsync: the inode synced, the log's size then
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.fstat(fd).st_ino, log.size()))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert SampleLog(log.path).cut(size) == 2
    assert (tmp_path.stat().st_ino, whole) in synced
    assert synced[-1] == (log.path.stat().st_ino, size)  # then the log is cut


def test_a_line_cut_short_by_a_crash_is_set_aside_as_a_line_of_its_own(tmp_path: Path) -> None:
    """The controller is killed as it writes round 1's lines; the resume sets them aside, the last cut short. The
    next resume's lines start lines of their own in samples.discarded.jsonl, versus the first glued onto that cut
    line (one damaged line where a sample's row was)."""
    led, log = Ledger(), SampleLog(tmp_path / "samples.jsonl")
    log.write(_round(led, 0))
    size = log.size()
    log.write(_round(led, 1))
    log.close()
    with log.path.open("ab") as f:
        f.write(b'{"sample_id": "p2/0", "sta')  # round 2's first line, cut short
    assert SampleLog(log.path).cut(size) == 3
    resumed = SampleLog(log.path)
    resumed.write(_round(Ledger(), 1))  # the resumed run retires round 1 again, then dies before a checkpoint
    assert resumed.cut(size) == 2
    lines = (tmp_path / "samples.discarded.jsonl").read_text().splitlines()
    assert lines[2] == '{"sample_id": "p2/0", "sta'
    assert [json.loads(line)["sample_id"] for line in lines[:2] + lines[3:]] == ["p1/0", "p1/1", "p1/0", "p1/1"]


def test_lines_set_aside_after_a_cut_that_failed_as_it_set_them_aside_start_lines_of_their_own(tmp_path: Path) -> None:
    """The disk filled as a resume wrote round 1's lines to samples.discarded.jsonl: part of its first line got there
    (the log kept them all). The next resume's lines start after that part, versus p1/0's row glued onto it (one
    damaged line where that sample's row was)."""
    led, log = Ledger(), SampleLog(tmp_path / "samples.jsonl")
    log.write(_round(led, 0))
    size = log.size()
    log.write(_round(led, 1))
    log.close()
    aside = tmp_path / "samples.discarded.jsonl"
    aside.write_bytes(log.path.read_bytes()[size : size + 10])  # what the failed write left there
    assert SampleLog(log.path).cut(size) == 2
    lines = aside.read_text().splitlines()
    assert [json.loads(line)["sample_id"] for line in lines[1:]] == ["p1/0", "p1/1"]


def test_a_sample_line_is_compact_json_that_reads_back_as_the_ledger_held_it(tmp_path: Path) -> None:
    # it was written with json.dumps' spaces after ',' and ':': 2 bytes a field, 30 of a line's ≈ 400
    led, log = Ledger(), SampleLog(tmp_path / "samples.jsonl")
    entries = _round(led, 3)
    log.write(entries)
    log.close()
    lines = log.path.read_text().splitlines()
    assert len(lines) == 2 and not any(", " in line or '": ' in line for line in lines)
    assert samplelog.read(log.path) == [entry_row(e) for e in entries]
    row = entry_row(entries[0])
    assert len(lines[0]) == len(json.dumps(row)) - (2 * len(row) - 1)  # a space after each ':' and each ',' less
