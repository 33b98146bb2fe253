"""job.json is replaced whole (`JobDir.write_job`): a reader that has it open while a launch or resume writes it
(status, an agent starting, a resume) reads the old job.json or the new, never one cut short."""

from __future__ import annotations

import json
from pathlib import Path

from rlctl.launch.jobdir import JobDir
from tests.unit.controller_harness import small_job


def test_a_reader_with_job_json_open_reads_it_whole_while_it_is_written_again(tmp_path: Path) -> None:
    # before: written in place, truncated first: the open reader read "" (json: Expecting value)
    jd = JobDir.create("kt", explicit=tmp_path / "job")
    jd.write_job(small_job("kt", iterations=200), source="test")
    with jd.job_json.open() as reader:
        jd.write_job(small_job("kt", iterations=300), source="test")
        assert json.loads(reader.read())["job"]["iterations"] == 200
    assert json.loads(jd.job_json.read_text())["job"]["iterations"] == 300
    assert [p.name for p in jd.path.iterdir() if p.name.endswith(".tmp")] == []


def test_two_writers_of_one_file_at_once_each_write_under_their_own_temporary_name(tmp_path: Path) -> None:
    """Both wrote NAME.tmp: one's rename took the other's half-written file, the other's then failed on a name gone."""
    import threading

    from rlctl.launch.recordfiles import replace_text

    path = tmp_path / "summary.json"
    errors: list[BaseException] = []

    def write(text: str) -> None:
        try:
            for _ in range(300):
                replace_text(path, text)
        except BaseException as e:  # noqa: BLE001 - collected for the assert below
            errors.append(e)

    writers = [threading.Thread(target=write, args=(c * 20_000,)) for c in "ab"]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert errors == [] and path.read_text() in ("a" * 20_000, "b" * 20_000)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
