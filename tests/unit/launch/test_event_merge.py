"""The whole merge of the controller site's events into the operator's events.jsonl (`record._merge_lines`): its
contract, as its docstring says it, pinned by examples; the same lines, damaged lines and warning as the merge that
read both files whole (`_whole_file_merge`, kept here as it was) for any history of both files; and what it holds
of a file of MBs."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.launch import record, spillsort
from rlctl.launch.jobdir import event_time
from rlctl.launch.recordfiles import record_text


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


def _whole_file_merge(local: Path, remote: Path) -> str:
    """`record._merge_lines` as it was: both files read whole, every line held (3.5× the files at its peak)."""
    mine = record_text(local).splitlines() if local.exists() else []
    seen = set(mine)
    theirs = [(remote, n, line) for n, line in enumerate(record_text(remote).splitlines(), 1) if line not in seen]
    rows, bad = [], []
    for i, (path, n, line) in enumerate([(local, n, line) for n, line in enumerate(mine, 1)] + theirs):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append((event_time(row), i, line))
        else:
            bad.append((f"{path}: line {n}", line))
    damaged = local.with_name(local.name + ".damaged")
    kept = set(damaged.read_text().splitlines()) if damaged.exists() else set()
    bad = [(where, line) for where, line in bad if line not in kept]
    if bad:
        with damaged.open("a") as f:
            f.write("".join(line + "\n" for _, line in bad))
        more = f" (and {len(bad) - 1} more)" if bad[1:] else ""
        logging.getLogger(record.__name__).warning(
            "%s is not a JSON event: left out of the merged events%s, kept in %s", bad[0][0], more, damaged
        )
    return "".join(line + "\n" for _, _, line in sorted(rows))


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


_TIMES = st.sampled_from([0, 1, 1.5, 2, 2, 3, -0.0, None, "x", True, float("nan")])
_EVENT = st.builds(
    lambda t, e, pad, escaped: json.dumps({"t": t, "event": e, **({"pad": pad} if pad else {})}, ensure_ascii=escaped),
    _TIMES,
    st.sampled_from(["a", "b", "c"]),
    st.one_of(
        st.just(""),
        st.sampled_from(["é", "\u2028", "€\r", "x"]),
        st.integers(0, 9000).map("é".__mul__),
    ),
    st.booleans(),
).map(str.encode)
_ATOM = st.one_of(
    _EVENT,
    _EVENT.map(lambda b: b" " + b),  # the same event, another line
    st.tuples(_EVENT, st.integers(1, 40)).map(lambda e: e[0][: e[1]]),  # cut short
    st.sampled_from([b"", b"  ", b"[1, 2]", b"null", b"\xff\xfe", b'{"t": 1, "event": "\xe9"}', b"{", b"\x1f"]),
)
_END = st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\r", b"\x0c", b"\xe2\x80\xa8", b"\xc2\x85", b""])
_APPEND = st.tuples(st.sampled_from(["here", "site"]), st.lists(st.tuples(st.integers(0, 7), _END), max_size=6))
_CUT = st.tuples(st.sampled_from(["cut here", "cut site"]), st.floats(0, 1))
_STEP = st.one_of(_APPEND, _APPEND, _CUT, st.just(("merge", None)))


@settings(max_examples=250, deadline=None, derandomize=True)
@given(
    atoms=st.lists(_ATOM, min_size=1, max_size=8),
    steps=st.lists(_STEP, max_size=12),
    budget=st.sampled_from([0, 300, 2000, spillsort.BUDGET_BYTES]),
    block=st.sampled_from([1, 7, spillsort.BLOCK_BYTES]),
)
def test_the_merge_is_the_whole_file_merge_for_any_history_of_both_files(
    tmp_path_factory: pytest.TempPathFactory,
    atoms: list[bytes],
    steps: list[tuple[str, object]],
    budget: int,
    block: int,
) -> None:
    # appends on both sides in any order, of events at the same times, repeated, cut short, damaged, without their
    # newline; the site's copy cut back (a resume) or the operator's; each merge as the whole-file merge made it,
    # spilled to sorted runs or held (`budget`), its runs read back a byte at a time or in blocks
    d = tmp_path_factory.mktemp("merge")
    here, site = d / "events.jsonl", d / ".site-events.jsonl"
    site.write_bytes(b"")
    damaged = d / "events.jsonl.damaged"
    said = _Said()
    logging.getLogger(record.__name__).addHandler(said)
    try:
        for kind, what in [*steps, ("merge", None)]:
            if kind == "merge":
                before = damaged.read_bytes() if damaged.exists() else None
                want = _whole_file_merge(here, site), (damaged.read_bytes() if damaged.exists() else None), said.said
                damaged.unlink(missing_ok=True)
                if before is not None:
                    damaged.write_bytes(before)
                said.said = []
                with (
                    mock.patch.object(spillsort, "BUDGET_BYTES", budget),
                    mock.patch.object(spillsort, "BLOCK_BYTES", block),
                ):
                    got = "".join(record._merge_lines(here, site))
                assert (got, damaged.read_bytes() if damaged.exists() else None, said.said) == want
                said.said = []
                here.write_text(got)
                assert not [p for p in d.iterdir() if p not in (here, site, damaged)]  # the spill is gone
            elif kind.startswith("cut"):
                path = here if kind == "cut here" else site
                if path.exists():
                    data = path.read_bytes()
                    path.write_bytes(data[: int(len(data) * what)])
            else:
                with (here if kind == "here" else site).open("ab") as f:
                    f.write(b"".join(atoms[i % len(atoms)] + end for i, end in what))
    finally:
        logging.getLogger(record.__name__).removeHandler(said)


def _week(rng: random.Random, n: int, *, t0: float) -> Iterator[str]:
    """`n` events as a controller writes them: mostly in time order, a unit's clock a few ms off now and then."""
    for i in range(n):
        skew = rng.random() * 0.05 if rng.random() < 0.2 else 0.0
        yield json.dumps({"t": t0 + i * 0.01 - skew, "event": "weights_applied", "agent": f"rollout-{i % 64}",
                          "version": i // 64, "fetch_s": rng.random(), "bytes": rng.randrange(10**9)})  # fmt: skip


def test_a_merge_of_files_of_mbs_holds_a_fraction_of_them(tmp_path: Path) -> None:
    # a job's events.jsonl, merged again after a resume cut the site's copy: every line of both held, each as text,
    # as a set member, parsed, sorted (≈ 4-6× the files); a week-long job's is hundreds of MB, at each resume
    rng = random.Random(0)
    lines = list(_week(rng, 40_000, t0=1.7e9))
    here, site = tmp_path / "events.jsonl", tmp_path / ".site-events.jsonl"
    here.write_text("".join(line + "\n" for line in lines[:30_000]))  # as the last merge wrote it
    site.write_text("".join(line + "\n" for line in lines[10_000:]))  # cut back, fetched whole again
    size = here.stat().st_size + site.stat().st_size
    assert size > 6 << 20
    want = hashlib.sha256(_whole_file_merge(here, site).encode()).hexdigest()
    got = hashlib.sha256()
    tracemalloc.start()
    try:
        for piece in record._merge_lines(here, site):
            got.update(piece.encode())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.hexdigest() == want
    assert peak < size / 4, f"{peak} bytes held at the peak for {size} bytes of events"
