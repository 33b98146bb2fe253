"""A config file that is no regular file (a FIFO, a device) or is larger than any config: one line, never a hang."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlctl.config.base import read_yaml
from rlctl.errors import ConfigError
from rlctl.models.hf import read_config_json
from tests.conftest import ROOT, run_cli

Feed = Callable[[Path, str], None]


@pytest.fixture
def fifo() -> Iterator[Feed]:
    """`fifo(path, text)` makes a FIFO at `path` and writes `text` into it once a reader opens it (as a shell's
    `cat x > fifo` would), so that the old read, which waited on a FIFO for a writer, read it rather than hanging; a
    FIFO nobody opens is given up at the test's end."""
    stop = threading.Event()
    texts: dict[Path, str] = {}

    def feed() -> None:
        while not stop.is_set():
            for path, text in list(texts.items()):
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as e:
                    if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                        raise
                    continue
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                del texts[path]
            time.sleep(0.01)

    def make(path: Path, text: str) -> None:
        os.mkfifo(path)
        texts[path] = text

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    yield make
    stop.set()
    t.join(timeout=5)


def test_a_fifo_as_a_yaml_file_is_refused_unread(tmp_path: Path, fifo: Feed) -> None:
    # `mkfifo job.yaml; rlctl check job.yaml` waited for ever on the read
    path = tmp_path / "job.yaml"
    fifo(path, "apiVersion: rlctl/v1\nkind: Job\n")
    with pytest.raises(ConfigError) as e:
        read_yaml(path)
    assert str(e.value) == f"{path}: not a file: a FIFO (named pipe); name a regular file"


def test_a_device_as_a_yaml_file_is_refused_unread() -> None:
    with pytest.raises(ConfigError, match=r"^/dev/null: not a file: a character device; name a regular file$"):
        read_yaml(Path("/dev/null"))  # (/dev/zero: read for ever; /dev/null: "file is empty", said of no file)


def test_a_yaml_file_larger_than_any_config_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "job.yaml"
    with big.open("wb") as f:
        f.truncate(65 * 2**20)  # sparse: no disk written
    with pytest.raises(ConfigError, match=r"^.*job\.yaml: 68157440 bytes, larger than 64 MiB; no config is that large"):
        read_yaml(big)


def test_a_fifo_as_a_models_config_json_is_refused_unread(tmp_path: Path, fifo: Feed) -> None:
    fifo(tmp_path / "config.json", "{}")
    with pytest.raises(ConfigError, match=r"config\.json: not a file: a FIFO \(named pipe\); name a regular file$"):
        read_config_json(tmp_path)


def test_check_of_a_job_whose_inventory_is_a_fifo_is_one_line(tmp_path: Path, fifo: Feed) -> None:
    inv = tmp_path / "inv.yaml"
    fifo(inv, (ROOT / "clusters/local.yaml").read_text())
    job = (ROOT / "jobs/demo.yaml").read_text().replace("[../clusters/local.yaml]", f"[{inv}]")
    (tmp_path / "job.yaml").write_text(job)
    r = run_cli("check", str(tmp_path / "job.yaml"))
    assert r.exit_code == 2, r.stderr
    assert r.stderr.strip().endswith(f"{inv}: not a file: a FIFO (named pipe); name a regular file"), r.stderr
