"""A resume cuts the controller's logs back to its checkpoint (`SampleLog.cut`, `cut_metrics`) and the resumed run
appends past the cut: the next fetch cut the copy here to the lines both still begin with and copied what follows
them (`record._kept`), versus the whole log again at the first fetch after each resume (the sample log: ≈ 355 bytes
a sample, GBs after weeks)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlctl.launch import record
from rlctl.launch.sitefs import LocalFiles

RUNS, ROWS = 20, 2000


class CountedFiles(LocalFiles):
    """The local view, counting the bytes copied and the reads of the host's file."""

    def __init__(self) -> None:
        self.copied = self.reads = 0

    def get_range(self, path: str, local: Path, start: int, end: int) -> None:
        self.copied += end - start
        super().get_range(path, local, start, end)

    def read_from(self, path: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        self.reads += 1
        return super().read_from(path, offset, limit)


def _rows(rng: random.Random, run: int, n: int) -> str:
    """`n` sample-log lines of run `run`, as the controller writes them (times and tokens differ from run to run)."""
    return "".join(
        json.dumps({"sample_id": f"r{run}-{rng.randrange(10**6)}/0", "state": "trained", "agent": "rollout-0",
                    "output_tokens": rng.randrange(512), "reward": rng.random(), "dispatched_at": rng.random() * 1e9},
                   separators=(",", ":")) + "\n"
        for _ in range(n)
    )  # fmt: skip


def test_each_fetch_after_a_resume_copies_what_the_resumed_run_wrote_not_the_log(tmp_path: Path) -> None:
    rng = random.Random(0)
    there, here = tmp_path / "site" / "samples.jsonl", tmp_path / "samples.jsonl"
    there.parent.mkdir()
    fs = CountedFiles()
    written = 0
    for run in range(RUNS):
        text = _rows(rng, run, ROWS)
        with there.open("a") as f:
            f.write(text)
        written += len(text)
        reads = fs.reads
        assert record.fetch_appended(fs, str(there), here) and here.read_bytes() == there.read_bytes()
        assert fs.reads - reads < 60  # a few dozen probes of the host's log at most
        # the run fails; its resume cuts the log back by a quarter of a run's lines (past its checkpoint)
        keep = there.read_bytes()
        cut = len(keep) - len("".join(text.splitlines(keepends=True)[-ROWS // 4 :]))
        there.write_bytes(keep[:cut])
    size = there.stat().st_size
    assert fs.copied <= written, (fs.copied, written, size)  # was the whole log after each resume: 8 × it here


@pytest.mark.parametrize("window", [64, 1 << 16])
def test_a_log_that_shares_no_line_with_the_copy_here_is_copied_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    monkeypatch.setattr(record, "TAIL_MATCH_BYTES", window)
    rng = random.Random(1)
    there, here = tmp_path / "site.jsonl", tmp_path / "here.jsonl"
    there.write_text(_rows(rng, 0, 300))
    first = there.stat().st_size
    fs = CountedFiles()
    assert record.fetch_appended(fs, str(there), here)
    there.write_text(_rows(rng, 1, 200))  # another log in its place (a job dir staged again): nothing in common
    assert record.fetch_appended(fs, str(there), here) and here.read_bytes() == there.read_bytes()
    assert fs.copied == first + there.stat().st_size
