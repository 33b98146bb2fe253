"""The whole merge of the controller site's events into the operator's events.jsonl (`record._merge_lines`): its
contract, as its docstring says it, pinned by examples."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rlctl.launch import record


def _line(t: object, event: str, **more: object) -> str:
    return json.dumps({"t": t, "event": event, **more})


def _merged(local: Path, remote: Path) -> list[str]:
    """The merge's lines (`''.join`: its text whole, or its lines one by one)."""
    text = "".join(record._merge_lines(local, remote))
    assert text == "" or text.endswith("\n")
    return text.splitlines()


def _files(tmp_path: Path, local: bytes | None, remote: bytes) -> tuple[Path, Path]:
    here, there = tmp_path / "events.jsonl", tmp_path / ".site-events.jsonl"
    if local is not None:
        here.write_bytes(local)
    there.write_bytes(remote)
    return here, there


def _text(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def test_the_order_is_by_time_the_operators_lines_first_at_one_time(tmp_path: Path) -> None:
    a1, a2, a0 = _line(2, "a1"), _line(2, "a2"), _line(None, "a0")
    b1, b2, b3 = _line(2, "b1"), _line(1, "b2"), _line("x", "b3")
    here, there = _files(tmp_path, _text(a1, a2, a0), _text(b1, b2, b3))
    # no usable time: at 0, before anything; at one time the operator's in their order, then the site's in theirs
    assert _merged(here, there) == [a0, b3, b2, a1, a2, b1]


def test_a_sites_line_the_operators_file_holds_anywhere_is_left_out_repeats_on_one_side_are_kept(
    tmp_path: Path,
) -> None:
    a, b, c = _line(1, "a"), _line(2, "b"), _line(3, "c")
    spaced = " " + b  # the same event, another line: not the same
    here, there = _files(tmp_path, _text(b, a, a), _text(a, c, b, c, spaced))
    assert _merged(here, there) == [a, a, b, spaced, c, c]
    here.write_text("")  # nothing here: the site's lines, each time
    assert _merged(here, there) == [a, b, spaced, c, c]


def test_a_missing_operators_file_and_lines_of_whitespace(tmp_path: Path) -> None:
    a, b = _line(1, "a"), _line(2, "b")
    here, there = _files(tmp_path, None, b"\n  \n" + _text(b, a) + b"\t\n")
    assert _merged(here, there) == [a, b]
    here.write_bytes(b" \n\n")
    assert _merged(here, there) == [a, b]


def test_line_ends_are_those_of_text_read_and_split_by_splitlines(tmp_path: Path) -> None:
    a, b, c = _line(1, "a"), _line(2, "b"), _line(3, "c")
    here, there = _files(tmp_path, f"{c}\r\n{a}\r".encode(), f"{b}\x0c{a}\r\n".encode())
    assert _merged(here, there) == [a, b, c]
    # a raw U+2028 (an event written with ensure_ascii=False) ends a line, as every reader of events.jsonl splits it
    here.write_bytes(_text(json.dumps({"t": 1, "event": "x\u2028y"}, ensure_ascii=False)))
    assert _merged(here, there) == [a, b]
    assert (tmp_path / "events.jsonl.damaged").read_text().splitlines() == ['{"t": 1, "event": "x', 'y"}']


def test_a_line_that_is_no_json_object_is_set_aside_once_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = _line(1, "a"), _line(2, "b")
    cut, listed = '{"t": 3, "ev', "[1, 2]"
    here, there = _files(tmp_path, _text(a, cut, cut), _text(listed, cut, b, listed) + b"\xff\xfe")
    with caplog.at_level(logging.WARNING):
        assert _merged(here, there) == [a, b]
    damaged = tmp_path / "events.jsonl.damaged"
    # the operator's first, then the site's (a line the operator's holds: left out with it); repeats each time
    assert damaged.read_text().splitlines() == [cut, cut, listed, listed, "\ufffd\ufffd"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{here}: line 2 is not a JSON event: left out of the merged events (and 4 more), kept in {damaged}"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _merged(here, there) == [a, b]  # the next merge reads them again: said and kept once
    assert damaged.read_text().splitlines() == [cut, cut, listed, listed, "\ufffd\ufffd"]
    assert caplog.records == []


def test_a_partial_last_line_is_merged_when_whole_and_once_its_writer_ends_it(tmp_path: Path) -> None:
    a, b, c = _line(1, "a"), _line(2, "b"), _line(3, "c")
    here, there = _files(tmp_path, _text(a), _text(b) + c[:7].encode())
    assert _merged(here, there) == [a, b]  # cut short: set aside
    assert (tmp_path / "events.jsonl.damaged").read_text() == c[:7] + "\n"
    there.write_bytes(_text(b) + c.encode())  # whole, without its newline yet
    here.write_text("".join(line + "\n" for line in _merged(here, there)))
    assert here.read_text().splitlines() == [a, b, c]
    there.write_bytes(_text(b, c))  # its writer ended it: the same line, nothing added
    assert _merged(here, there) == [a, b, c]
    here.write_bytes(_text(a) + b[:-1].encode())  # the operator's own last line cut short: set aside too
    assert _merged(here, there) == [a, b, c]
    assert (tmp_path / "events.jsonl.damaged").read_text().splitlines() == [c[:7], b[:-1]]


def test_a_cut_of_either_side_takes_nothing_away_while_the_other_holds_it(tmp_path: Path) -> None:
    rows = [_line(i, f"e{i}") for i in range(1, 7)]
    here, there = _files(tmp_path, _text(rows[0]), _text(*rows[1:5]))
    here.write_text("".join(line + "\n" for line in _merged(here, there)))
    assert here.read_text().splitlines() == rows[:5]
    there.write_bytes(_text(rows[1], rows[5]))  # the site's copy cut back by a resume, then grown
    assert _merged(here, there) == rows
    here.write_bytes(_text(rows[0]))  # the operator's cut back: the site's lines come back, its own one stays
    there.write_bytes(_text(*rows[2:]))
    assert _merged(here, there) == [rows[0], *rows[2:]]
