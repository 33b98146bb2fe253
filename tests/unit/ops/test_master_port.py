"""The trainer group's MASTER_PORT is picked below the kernel's ephemeral range, where no outgoing connection of the
host takes it before rank 0 binds it."""

from __future__ import annotations

import socket
from pathlib import Path

from rlctl.ops import runstart


def test_the_trainer_groups_port_is_free_and_below_the_ephemeral_range() -> None:
    low = int(Path(runstart.EPHEMERAL_RANGE).read_text().split()[0])
    ports = {runstart._free_port() for _ in range(20)}
    assert all(runstart.PORT_FLOOR <= p < low for p in ports) and len(ports) > 1, ports
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free when picked (nothing here listens on them)


def test_without_a_range_to_read_it_stays_below_linuxs_default(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(runstart, "EPHEMERAL_RANGE", str(tmp_path / "missing"))
    assert runstart.PORT_FLOOR <= runstart._free_port() < 32768
