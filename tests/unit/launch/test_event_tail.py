"""The controller site's events merge into the operator's events.jsonl by what they grew (`rlctl.launch.eventtail`),
as the whole merge (`record._merge_lines`) would merge them."""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import shutil
import tracemalloc
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlctl.config.inventory import Site
from rlctl.launch import eventtail, record, spillsort
from rlctl.launch.jobdir import JobDir, event_time
from rlctl.launch.record import fetch_record
from rlctl.launch.sitefs import site_root
from rlctl.ops.runstate import current_run
from tests.unit.launch.test_event_merge import _week
from tests.unit.props import props


def _site(tmp_path: Path) -> tuple[Path, Site, Path]:
    """The operator's job dir, a local site with a workdir of its own, and the job's root there."""
    src = tmp_path / "op" / "job-1"
    src.mkdir(parents=True)
    site = Site.model_validate(
        {
            "datacenter": "a",
            "gpu": "CPU",
            "nodes": [{"host": "localhost", "gpus": 2}],
            "scheduler": {"kind": "local", "workdir": str(tmp_path / "w")},
        }
    )
    root = Path(site_root(site, "job-1", here=src))
    root.mkdir(parents=True)
    return src, site, root


def _add(path: Path, *rows: dict[str, object] | str) -> None:
    with path.open("a") as f:
        f.write("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _whole_merge(src: Path, root: Path, tmp_path: Path) -> list[str]:
    """What the whole merge makes of events.jsonl here and the site's now."""
    (tmp_path / "whole").mkdir(exist_ok=True)
    copy = tmp_path / "whole" / "events.jsonl"
    shutil.copy(src / "events.jsonl", copy)
    return "".join(record._merge_lines(copy, root / "events.jsonl")).splitlines()


def _tailed(local: Path, mirror: Path) -> str | None:
    """What the tail appends (None: the whole merge is needed)."""
    out = io.StringIO()
    if eventtail.tail(local, mirror, out):
        return out.getvalue()
    assert out.getvalue() == ""
    return None


def _site_events(n: int, *, t0: float = 1000.0) -> list[dict[str, object]]:
    return [{"t": t0 + i, "event": "weights_applied", "agent": f"rollout-{i % 4}", "version": i // 4} for i in range(n)]


def test_a_fetch_appends_the_sites_new_events_and_reads_not_every_event_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each `rlctl status` of a job whose controller ran on another site read both files whole, parsed and sorted
    # every line and wrote events.jsonl again: at 64 units × 10⁴ weight versions, 130 MB and seconds a status
    src, site, root = _site(tmp_path)
    _add(src / "events.jsonl", {"t": 1.0, "event": "launch"})
    _add(root / "events.jsonl", *_site_events(400))
    fetch_record(src, site, "localhost", str(root))  # the first: the whole merge
    inode = (src / "events.jsonl").stat().st_ino
    _add(root / "events.jsonl", *_site_events(3, t0=5000.0))
    want = _whole_merge(src, root, tmp_path)
    whole = record._merge_lines
    merged: list[Path] = []
    monkeypatch.setattr(record, "_merge_lines", lambda a, b: merged.append(a) or whole(a, b))
    assert "events.jsonl" in fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == want
    assert merged == [] and (src / "events.jsonl").stat().st_ino == inode  # appended in place
    assert len(want) == 404


@pytest.mark.parametrize(
    "case", ["newer", "operator_event_pushed", "older_than_the_last_here", "cut_by_a_resume", "damaged", "same_time"]
)
def test_the_sites_new_events_merge_as_the_whole_merge_would(tmp_path: Path, case: str) -> None:
    src, site, root = _site(tmp_path)
    jd = JobDir(src)
    _add(src / "events.jsonl", {"t": 1.0, "event": "launch"})
    site_file = root / "events.jsonl"
    _add(site_file, *_site_events(50))
    fetch_record(src, site, "localhost", str(root))
    if case == "newer":
        _add(site_file, *_site_events(5, t0=2000.0))
    elif case == "operator_event_pushed":  # `rlctl stop`'s event here and on the site (`event_to_record`)
        row = jd.event("stop_requested")
        _add(site_file, *_site_events(2, t0=row["t"] - 0.5), json.dumps(row), *_site_events(2, t0=row["t"] + 1))
    elif case == "older_than_the_last_here":  # the site's clock behind
        _add(site_file, *_site_events(3, t0=1010.5))
    elif case == "cut_by_a_resume":  # the site's file cut back, then grew: fetched whole again
        lines = site_file.read_text().splitlines()[:20]
        site_file.write_text("".join(line + "\n" for line in lines))
        _add(site_file, *_site_events(40, t0=3000.0))
    elif case == "damaged":
        _add(site_file, '{"t": 2000, "ev', *_site_events(2, t0=2001.0))
    else:  # a new event at the time of the last here
        _add(site_file, {"t": 1049.0, "event": "scale"})
    want = _whole_merge(src, root, tmp_path)
    fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == want
    _add(site_file, *_site_events(2, t0=9000.0))  # and the next merge still reads on from there
    want = _whole_merge(src, root, tmp_path)
    fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == want


def test_a_reader_of_some_kinds_of_events_parses_only_the_lines_that_name_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the run id (`current_run`: every status of an ended job, scale, the launcher), a resume's count and start
    # offset, the checkpoint to resume from: each parsed every event of the job, 640,000 lines after weeks
    jd = JobDir.create("ev", explicit=tmp_path / "job")
    _add(jd.events, {"t": 1.0, "event": "agent_started", "agent": "controller-0", "run": "r1"})
    _add(jd.events, *_site_events(300), '{"t": 5, "ev')  # a line cut short: left out, said once
    _add(jd.events, {"t": 6.0, "event": "agent_started", "agent": "controller-0", "run": "r2"})
    _add(jd.events, *_site_events(300, t0=2000.0), '{"t": 7, "event": "agent_st')  # the last: being written
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    assert current_run(jd) == "r2"
    assert len(parsed) == 4  # the two agent_started, the line cut short and the last line
    assert caplog.text.count("line 302 is not valid JSON") == 1
    assert [e["run"] for e in jd.read_events("agent_started")] == ["r1", "r2"]
    monkeypatch.setattr(json, "loads", loads)
    assert len(jd.read_events()) == 602  # every kind: as before


NO_TIME = ['{"t": null, "event": "launch"}', '{"t": "x", "event": "scale"}', '{"event": "note"}']


@pytest.mark.parametrize(("t", "want"), [(None, 0.0), ("x", 0.0), (True, 0.0), (float("nan"), 0.0), (5, 5.0)])
def test_the_one_rule_for_an_events_time(t: object, want: float) -> None:
    # `event_time`: the rule the whole merge and the tail (below) read a row's time by, as status, stop and report do
    assert event_time({"t": t}) == want and event_time({}) == 0.0
    assert eventtail._time(json.dumps({"t": t})) == want and eventtail._time("[1]") is None


def test_the_whole_merge_keeps_an_event_without_a_usable_time_as_event_time_reads_it(tmp_path: Path) -> None:
    # every reader of an event's time (`event_time`) takes a row whose t is null or text (an older version's, an
    # edited one) as an event at time 0; the merge set it aside in events.jsonl.damaged, out of every later reader
    src, site, root = _site(tmp_path)
    _add(src / "events.jsonl", {"t": 1.0, "event": "launch"})
    _add(root / "events.jsonl", *_site_events(2), *NO_TIME)
    fetch_record(src, site, "localhost", str(root))
    assert (src / "events.jsonl").read_text().splitlines() == [
        *NO_TIME, '{"t": 1.0, "event": "launch"}', *(json.dumps(e) for e in _site_events(2))
    ]  # fmt: skip
    assert not (src / "events.jsonl.damaged").exists()
    assert [e["event"] for e in JobDir(src).read_events("scale", "note")] == ["scale", "note"]


def test_the_sites_new_events_append_after_an_event_without_a_usable_time(tmp_path: Path) -> None:
    # the tail took such a line here for one that is no JSON event, and sent every fetch after to the whole merge
    local, mirror = tmp_path / "events.jsonl", tmp_path / ".site-events.jsonl"
    _add(local, NO_TIME[0])
    mirror.write_text("")
    eventtail.mark(local, mirror)
    _add(mirror, *_site_events(2), NO_TIME[1])
    # appended as the whole merge orders them: at time 0 (after the one here), then by time
    assert _tailed(local, mirror) == "".join([NO_TIME[1] + "\n", *(json.dumps(e) + "\n" for e in _site_events(2))])


def _whole_growth_tail(local: Path, mirror: Path, *, longest: float = math.inf) -> str | None:
    """`eventtail.tail` as it was: what the site's copy grew by read at once, its lines and rows held (≈ 6× it at the
    peak), and `local`'s lines since their earliest in a set; but for one rule (`longest`, see `_old_time`)."""
    try:
        li, ls, mi, ms = (int(x) for x in (local.parent / eventtail.MARK).read_text().split())
        here, there = local.stat(), mirror.stat()
    except (OSError, ValueError):
        return None
    if (here.st_ino, here.st_size, there.st_ino) != (li, ls, mi) or there.st_size < ms:
        return None
    with mirror.open("rb") as f:
        f.seek(ms)
        data = f.read()
    try:
        new = data.decode().splitlines()
    except UnicodeDecodeError:
        return None
    rows = []
    for line in new:
        if not line.strip():
            continue
        t = _old_time(line, longest)
        if t is None:  # not a JSON event: the whole merge sets it aside, once
            return None
        rows.append((t, line))
    if not rows:
        return ""
    held = _old_lines_since(local, min(t for t, _ in rows), longest)
    if held is None:
        return None
    lines, last = held
    fresh = [(t, i, line) for i, (t, line) in enumerate(rows) if line not in lines]
    if fresh and min(t for t, _, _ in fresh) < last:
        return None
    return "".join(line + "\n" for _, _, line in sorted(fresh))


def _old_time(line: str, longest: float) -> float | None:
    """`eventtail._time` as it was; a line longer than `longest` as one that is no JSON object (the one rule the
    tail adds: a line past LINE_MAX_CHARS is not held)."""
    if len(line) > longest:
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return event_time(row) if isinstance(row, dict) else None


def _old_lines_since(path: Path, since: float, longest: float) -> tuple[set[str], float] | None:
    """`eventtail._lines_since` as it was (read from the end in pieces growing ×4 from 1 MiB, each held whole)."""
    size = path.stat().st_size
    want = 1 << 20
    while True:
        start = max(0, size - want)
        with path.open("rb") as f:
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()  # (a character cut by the start: its line goes)
        if start > 0:
            lines = lines[1:]  # (cut by the start)
        found: set[str] = set()
        last = float("-inf")
        for line in reversed(lines):
            t = _old_time(line, longest)
            if t is None:
                return None
            if last == float("-inf"):
                last = t
            if t < since:
                return found, last
            found.add(line)
        if start == 0:
            return found, last
        want *= 4


def _event(times: list[object], pads: list[str]) -> st.SearchStrategy[bytes]:
    return st.builds(
        lambda t, e, pad, ascii: json.dumps({"t": t, "event": e, **({"pad": pad} if pad else {})}, ensure_ascii=ascii),
        st.sampled_from(times),
        st.sampled_from(["a", "b", "c"]),
        st.one_of(st.just(""), st.sampled_from(pads), st.integers(0, 300).map("é".__mul__)),
        st.booleans(),
    ).map(str.encode)


_EVENT = _event([1, 1.5, 2, 2, 3, 3, 0, -0.0, None, "x", True, float("nan"), 1e400], ["é", "\u2028", "€\r", "🦀"])
_LATER = st.one_of(  # the site's new events: mostly after the operator's; a line of spaces now and then
    *[_event([3, 4, 5, 5, 6, 1e9], ["é", "🦀"])] * 4, st.sampled_from([b" " * 90, b"\t " * 30])
)
_ATOM = st.one_of(
    _EVENT,
    _EVENT,
    _EVENT,
    _EVENT.map(lambda b: b" " + b),  # the same event, another line
    st.tuples(_EVENT, st.integers(1, 40)).map(lambda e: e[0][: e[1]]),  # cut short
    st.sampled_from([b"", b"  ", b" " * 90, b"[1, 2]", b"null", b"\xff\xfe", b'{"t": 1, "event": "\xe9"}', b"\x1f"]),
)
_END = st.sampled_from([b"\n", b"\n", b"\n", b"\n", b"\r\n", b"\r", b"\x0c", b"\xe2\x80\xa8", b"\xc2\x85", b""])
_GROWN_END = st.sampled_from([b"\n"] * 8 + [b"\r\n", b"\r", b"\xe2\x80\xa8", b""])
_KINDS = ["later", "here", "beside", "atom"]  # of the site's new lines: see the test
_LINES = st.lists(st.tuples(st.integers(0, 11), _END), max_size=10)


def _bytes(atoms: list[bytes], lines: list[tuple[int, bytes]]) -> bytes:
    return b"".join(atoms[i % len(atoms)] + end for i, end in lines)


@props(800)
@given(
    atoms=st.lists(_ATOM, min_size=1, max_size=12),
    later=st.lists(_LATER, min_size=1, max_size=6),
    here=st.lists(st.tuples(st.integers(0, 11), _END), min_size=1, max_size=10),
    merged=st.sampled_from([b"\n", b"\r\n", b"\r", b"\xe2\x80\xa8", None]),
    site=_LINES,
    cut=st.one_of(st.none(), st.none(), st.floats(0, 1)),
    grown=st.one_of(
        st.lists(st.tuples(st.sampled_from([*_KINDS[:3]]), st.integers(0, 11), _GROWN_END), min_size=1, max_size=12),
        st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(0, 11), _END), min_size=1, max_size=12),
    ),
    touched=st.sampled_from([None, None, None, "here", "site"]),
    sizes=st.tuples(
        st.sampled_from([eventtail.TAIL_READ_BYTES, 1, 7, 64]),
        st.sampled_from([eventtail.READ_BYTES, 1, 3]),
        st.sampled_from([eventtail.LINE_MAX_CHARS, 200, 40, 5]),
        st.sampled_from([spillsort.BUDGET_BYTES, 0, 300]),
        st.sampled_from([spillsort.BLOCK_BYTES, 7]),
    ),
)
def test_the_tail_appends_what_the_whole_growth_tail_appended_for_any_files(
    tmp_path_factory: pytest.TempPathFactory,
    atoms: list[bytes],
    later: list[bytes],
    here: list[tuple[int, bytes]],
    merged: bytes | None,
    site: list[tuple[int, bytes]],
    cut: float | None,
    grown: list[tuple[str, int, bytes]],
    touched: str | None,
    sizes: tuple[int, int, int, int, int],
) -> None:
    # the operator's file as a merge writes it (its events by time; its lines ended by `merged`) or any bytes; the
    # site's copy marked where it ended (a fetch appends whole lines) or anywhere (mid-line, mid-character, between
    # \r and \n), then grown by events later or at any time, the operator's lines again or others at their time,
    # repeated, cut short, damaged, long; either file touched since
    # the mark; read in pieces of any size, lines past any length not held, rows spilled or held: appended as the
    # tail that read it all at once appended (or not at all)
    d = tmp_path_factory.mktemp("tail")
    local, mirror = d / "events.jsonl", d / ".site-events.jsonl"
    text = _bytes(atoms, here)
    if merged is not None:
        mine = [line for line in text.decode(errors="replace").splitlines() if eventtail._time(line) is not None]
        text = b"".join(line.encode() + merged for line in sorted(mine, key=lambda line: eventtail._time(line) or 0.0))
    local.write_bytes(text)
    theirs = _bytes(atoms, site)
    mark = len(theirs)
    mine = text.splitlines() or later
    kinds = {"later": later, "here": mine, "beside": [line.replace(b'"event": "', b'"event": "z') for line in mine]}
    kinds["atom"] = atoms
    theirs += b"".join(kinds[kind][i % len(kinds[kind])] + end for kind, i, end in grown)
    mirror.write_bytes(theirs[: mark if cut is None else int(len(theirs) * cut)])
    eventtail.mark(local, mirror)
    mirror.write_bytes(theirs)
    if touched == "here":  # an event appended here since
        with local.open("ab") as f:
            f.write(_text_of(_site_events(1)))
    elif touched == "site":  # the site's fetched whole again (a resume cut it)
        (d / "new").write_bytes(theirs)
        (d / "new").replace(mirror)
    for tail_bytes, read_bytes, longest, budget, block in [sizes, (1, 1, eventtail.LINE_MAX_CHARS, 0, 7)]:
        want = _whole_growth_tail(local, mirror, longest=longest)
        with (
            mock.patch.object(eventtail, "TAIL_READ_BYTES", tail_bytes),
            mock.patch.object(eventtail, "READ_BYTES", read_bytes),
            mock.patch.object(eventtail, "LINE_MAX_CHARS", longest),
            mock.patch.object(spillsort, "BUDGET_BYTES", budget),
            mock.patch.object(spillsort, "BLOCK_BYTES", block),
        ):
            assert _tailed(local, mirror) == want
    assert sorted(p.name for p in d.iterdir()) == sorted([local.name, mirror.name, eventtail.MARK])  # no spill left


def test_a_tail_of_mbs_holds_a_fraction_of_them(tmp_path: Path) -> None:
    # the site's events grew by days' worth since the last `rlctl status`: read at once as bytes, text, lines and
    # parsed rows (≈ 6× the growth at the peak: 51 MB for 8.4 MB)
    lines = list(_week(random.Random(0), 80_000, t0=1.7e9))  # a few ms out of order now and then
    local, mirror = tmp_path / "events.jsonl", tmp_path / ".site-events.jsonl"
    local.write_text("".join(line + "\n" for line in sorted(lines[:20_000], key=lambda line: json.loads(line)["t"])))
    mirror.write_text("".join(line + "\n" for line in lines[10_000:19_990]))
    eventtail.mark(local, mirror)
    with mirror.open("a") as f:  # the last ten here (merged already), then days of new ones
        f.write("".join(line + "\n" for line in lines[19_990:20_000] + lines[20_010:]))
    grown = mirror.stat().st_size - int((tmp_path / eventtail.MARK).read_text().split()[3])
    assert grown > 8 << 20
    want = _whole_growth_tail(local, mirror)
    assert want is not None and want.count("\n") == 59_990
    out = tmp_path / "out"
    tracemalloc.start()
    try:
        with out.open("w") as f:
            assert eventtail.tail(local, mirror, f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(want.encode()).digest()
    assert peak < grown / 4, f"{peak} bytes held at the peak for {grown} bytes grown"


@pytest.mark.parametrize("line", [b"\x00" * (8 << 20), b'{"t": 5, "event": "x", "pad": "' + b"y" * (8 << 20) + b'"}'])
def test_a_line_of_mbs_is_not_held_and_goes_to_the_whole_merge(tmp_path: Path, line: bytes) -> None:
    # a line of garbage or cut short (a disk's damage, a writer killed mid-write) of MBs: read whole, three times
    local, mirror = tmp_path / "events.jsonl", tmp_path / ".site-events.jsonl"
    local.write_text(json.dumps({"t": 1, "event": "launch"}) + "\n")
    mirror.write_bytes(b"")
    eventtail.mark(local, mirror)
    mirror.write_bytes(_text_of(_site_events(3)) + line + b"\n" + _text_of(_site_events(3, t0=2000.0)))
    assert _held_at_most(1 << 20, local, mirror) is None  # no JSON event, as a short line that is none; an event of
    # MBs: the whole merge's to read
    local.write_bytes(line + b"\n" + _text_of([{"t": 1, "event": "launch"}]))  # the operator's, read back to it
    mirror.write_bytes(b"")
    eventtail.mark(local, mirror)
    mirror.write_bytes(_text_of(_site_events(3)) + NO_TIME[2].encode() + b"\n")
    assert _held_at_most(1 << 20, local, mirror) is None
    local.write_text(json.dumps({"t": 1, "event": "launch"}) + "\n")
    mirror.write_bytes(b"")
    eventtail.mark(local, mirror)
    mirror.write_bytes(_text_of(_site_events(3)) + b" " * (8 << 20) + b"\n" + _text_of(_site_events(3, t0=2000.0)))
    with mock.patch.object(eventtail, "LINE_MAX_CHARS", 1 << 16):
        want = _whole_growth_tail(local, mirror)
        assert want is not None and _tailed(local, mirror) == want  # whitespace only: left out, as a short one


def _text_of(rows: list[dict[str, object]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _held_at_most(most_bytes: int, local: Path, mirror: Path) -> str | None:
    """What the tail appends, lines past 64 KiB not held, holding at most `most_bytes` at its peak."""
    tracemalloc.start()
    try:
        with mock.patch.object(eventtail, "LINE_MAX_CHARS", 1 << 16):
            got = _tailed(local, mirror)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < most_bytes, f"{peak} bytes held at the peak"
    return got
