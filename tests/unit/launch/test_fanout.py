"""The fan-out inside a site (rlctl.launch.fanout), in-process over real TCP: a fetch follows the seed's `.part`
as the link copy writes it, goes on from its own cut-short `.part`, refuses paths outside the job dir, and a
peer without the job's secret gets nothing."""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlctl.config.job import load_job
from rlctl.errors import RlctlError
from rlctl.launch.fanout import FanoutError, Server, available, fetch, main, read_range, safe_path
from rlctl.launch.jobdir import JobDir
from rlctl.transport import make_transport

SECRET = secrets.token_bytes(32)
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def seed(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "seed"
    root.mkdir()
    server = Server(root, SECRET, "tcp://127.0.0.1:0", stall_s=1.0)
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    yield server
    server.stop()
    t.join(timeout=5)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_fetch(server: Server, root: Path, files: list[tuple[str, int, str, int]], **kw: Any) -> tuple[bool, list[dict]]:
    rows: list[dict[str, Any]] = []
    with make_transport("tcp", secret=SECRET).connect(server.address, timeout_s=5) as conn:
        ok = fetch(root, conn, files, say=rows.append, **kw)
    return ok, rows


def test_a_fetch_follows_the_seeds_part_as_it_grows(seed: Server, tmp_path: Path) -> None:
    seed.stall_s = 30.0  # the copy's thread, not the stall limit, is under test: a loaded machine may pause it 1 s
    data = os.urandom(3 << 20)
    dst = seed.root / "model" / "w.bin"
    dst.parent.mkdir()
    part = dst.with_name("w.bin.part")

    def link_copy() -> None:  # the operator's SFTP copy, slowly
        with part.open("wb") as f:
            for i in range(0, len(data), 256 << 10):
                f.write(data[i : i + (256 << 10)])
                f.flush()
                time.sleep(0.01)
        part.rename(dst)

    writer = threading.Thread(target=link_copy)
    writer.start()
    time.sleep(0.03)
    ok, rows = run_fetch(seed, tmp_path / "host2", [("model/w.bin", len(data), sha(data), 0o644)], chunk_bytes=1 << 20)
    writer.join()
    assert ok
    assert (tmp_path / "host2" / "model" / "w.bin").read_bytes() == data
    assert rows[-1] == {"progress": rows[-1]["progress"], "path": "model/w.bin", "size": len(data),
                        "sha256": sha(data), "ok": True}  # fmt: skip
    assert sum(r["progress"] for r in rows) == len(data)
    assert not (tmp_path / "host2" / "model" / "w.bin.part").exists()
    assert seed.served == len(data)


def test_a_cut_short_fetch_goes_on_and_one_of_other_bytes_starts_again(seed: Server, tmp_path: Path) -> None:
    data = os.urandom(2 << 20)
    (seed.root / "a").write_bytes(data)
    (seed.root / "b").write_bytes(data)
    host = tmp_path / "host2"
    host.mkdir()
    (host / "a.part").write_bytes(data[: 1 << 20])  # an earlier fetch's bytes
    (host / "b.part").write_bytes(os.urandom(1 << 20))  # other bytes: the file does not verify, fetched again
    files = [("a", len(data), sha(data), 0o644), ("b", len(data), sha(data), 0o600)]
    ok, _ = run_fetch(seed, host, files, chunk_bytes=1 << 19)
    assert ok
    assert (host / "a").read_bytes() == data and (host / "b").read_bytes() == data
    assert (host / "b").stat().st_mode & 0o777 == 0o600
    assert seed.served == (1 << 20) + (1 << 20) + len(data)  # a: the rest; b: the rest, then all of it


def test_a_file_that_never_arrives_fails_after_the_stall_limit(seed: Server, tmp_path: Path) -> None:
    (seed.root / "w.part").write_bytes(b"x" * 100)
    t0 = time.monotonic()
    with pytest.raises(FanoutError, match=r"no new bytes on the seed for 1 s \(at 100 of 1000\)"):
        run_fetch(seed, tmp_path / "h", [("w", 1000, "0" * 64, 0o644)], chunk_bytes=1 << 10)
    assert time.monotonic() - t0 < 10


def test_bytes_that_do_not_verify_are_reported_and_never_put_in_place(seed: Server, tmp_path: Path) -> None:
    """A host that relays serves what it holds: a file that did not verify is not left under its name."""
    (seed.root / "w").write_bytes(b"y" * 100)
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "w").write_bytes(b"old")  # another version: gone, not kept beside a failed fetch
    ok, rows = run_fetch(seed, tmp_path / "h", [("w", 100, "0" * 64, 0o644)])
    assert not ok and rows[-1]["ok"] is False and rows[-1]["sha256"] == sha(b"y" * 100)
    assert not (tmp_path / "h" / "w").exists() and not (tmp_path / "h" / "w.part").exists()


def test_a_file_whose_copy_has_not_begun_is_waited_for_past_the_stall_limit(seed: Server, tmp_path: Path) -> None:
    """The seed copies its files one after another: a fetch of a later one waits (the stall clock starts with
    its copy), here 1.5 × the 1 s stall limit."""
    data = os.urandom(1000)
    timer = threading.Timer(1.5, lambda: (seed.root / "late").write_bytes(data))
    timer.start()
    ok, _ = run_fetch(seed, tmp_path / "h", [("late", len(data), sha(data), 0o644)])
    timer.join()
    assert ok and (tmp_path / "h" / "late").read_bytes() == data


def test_a_whole_file_of_another_size_is_not_served_over_its_part(tmp_path: Path) -> None:
    (tmp_path / "w").write_bytes(b"o" * 20)  # an older version, longer than the part so far
    (tmp_path / "w.part").write_bytes(b"n" * 8)
    assert read_range(tmp_path / "w", 0, 8, 10) == b"n" * 8


def test_a_seed_whose_listener_fails_stops_serving(tmp_path: Path) -> None:
    server = Server(tmp_path, SECRET, "tcp://127.0.0.1:0")
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    server._listener.close()  # e.g. out of file descriptors: accept() fails from now on
    t.join(timeout=5)
    assert not t.is_alive() and server.failed


@pytest.mark.parametrize("rel", ["../secret", "/etc/passwd", "a/../../b", ""])
def test_paths_outside_the_job_dir_are_refused(rel: str, tmp_path: Path) -> None:
    with pytest.raises(FanoutError, match="not a path inside the job dir"):
        safe_path(tmp_path, rel)


def test_the_seed_refuses_a_range_outside_its_job_dir(seed: Server, tmp_path: Path) -> None:
    (seed.root.parent / "outside").write_bytes(b"z" * 10)
    with pytest.raises(FanoutError, match="not a path inside the job dir"):
        run_fetch(seed, tmp_path / "h", [("../outside", 10, sha(b"z" * 10), 0o644)])


def test_a_peer_without_the_secret_gets_nothing(seed: Server) -> None:
    with pytest.raises(RlctlError):
        make_transport("tcp", secret=b"other" * 8).connect(seed.address, timeout_s=5).recv(timeout_s=2)
    assert seed.served == 0


def test_available_counts_the_whole_file_or_its_part(tmp_path: Path) -> None:
    assert available(tmp_path / "w", 10) == 0
    (tmp_path / "w.part").write_bytes(b"1234")
    assert available(tmp_path / "w", 10) == 4
    (tmp_path / "w.part").write_bytes(b"x" * 11)  # longer than the file: an older copy's
    assert available(tmp_path / "w", 10) == 0
    (tmp_path / "w").write_bytes(b"x" * 10)
    assert available(tmp_path / "w", 10) == 10


def test_the_command_line_fetch_reports_json_lines(seed: Server, tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io
    import json

    data = os.urandom(1000)
    (seed.root / "w").write_bytes(data)
    host = tmp_path / "h"
    host.mkdir()
    (host / "secret").write_text(SECRET.hex())
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps([["w", 1000, sha(data), 0o640]])))
    assert main(["fetch", str(host), "--source", seed.address]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows == [{"progress": 1000, "path": "w", "size": 1000, "sha256": sha(data), "ok": True}]


def test_the_command_line_seed_advertises_the_name_the_other_hosts_reach(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io
    import json

    (tmp_path / "secret").write_text(SECRET.hex())
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # the operator's end closed at once: serve, then stop
    assert main(["serve", str(tmp_path), "--advertise", "h20-01"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows[0]["listening"].startswith("tcp://h20-01:") and rows[1] == {"served": 0}


def test_an_encrypting_job_fans_out_encrypted(tmp_path: Path) -> None:
    """The job's `transport.encrypt` (its staged job.json) holds for the fan-out too: both ends read it."""
    from rlctl.launch.fanout import _encrypt

    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    JobDir(tmp_path).write_job(spec, source="jobs/demo.yaml")  # as launch stages it
    assert not _encrypt(tmp_path) and not _encrypt(tmp_path / "nowhere")
    sealed = spec.model_copy(update={"transport": spec.transport.model_copy(update={"encrypt": True})})
    JobDir(tmp_path).write_job(sealed, source="jobs/demo.yaml")
    assert _encrypt(tmp_path)
    data = os.urandom(4096)
    (tmp_path / "w").write_bytes(data)
    server = Server(tmp_path, SECRET, "tcp://127.0.0.1:0", encrypt=True)
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    try:
        with make_transport("tcp", secret=SECRET, encrypt=True).connect(server.address, timeout_s=5) as conn:
            assert fetch(tmp_path / "h", conn, [("w", len(data), sha(data), 0o644)], say=lambda _: None)
        with pytest.raises(RlctlError):  # a fetch that does not encrypt is refused
            make_transport("tcp", secret=SECRET).connect(server.address, timeout_s=5).recv(timeout_s=2)
    finally:
        server.stop()
        t.join(timeout=5)
