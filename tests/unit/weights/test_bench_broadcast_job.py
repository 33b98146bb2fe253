"""The broadcast benchmark's `job` row: per-version copies and transfer times read from a job's events."""

from __future__ import annotations

from bench.broadcast_job import per_version


def applied(agent: str, version: int, source: str, t: float, **extra) -> dict:
    return {"t": t, "event": "weights_applied", "agent": agent, "version": version, "source": source, **extra}


def test_one_pull_from_the_trainer_per_version_and_its_transfer_time():
    events = [
        {"t": 10.0, "event": "trained", "iteration": 1, "version": 1},
        applied("rollout-0", 1, "trainer-0", 11.5, encoding="full", bytes=100),
        applied("rollout-1", 1, "rollout-0", 11.7, encoding="full", bytes=100),
        {"t": 20.0, "event": "trained", "iteration": 2, "version": 2},
        applied("rollout-0", 2, "trainer-0", 22.0, encoding="delta", bytes=40, fetch_s=0.8),
        applied("rollout-1", 2, "trainer-0", 22.1, encoding="delta", bytes=40, fetch_s=0.9),  # its parent failed
    ]
    rows = per_version(events)
    assert [(r["version"], r["from_trainer"], r["from_relays"], r["bytes_from_trainer"]) for r in rows] == [
        (1, ["rollout-0"], ["rollout-1"], 100),
        (2, ["rollout-0", "rollout-1"], [], 80),
    ]
    assert rows[0]["transfer_time"] == "trained_to_applied" and rows[0]["transfer_s"] == 1.5
    assert "transfer_s" not in rows[1]  # two copies crossed: no single inter-DC transfer to time


def test_a_version_the_relay_skipped_for_a_newer_one_still_counts_as_its_pull():
    events = [
        applied("rollout-1", 1, "rollout-0", 11.7, encoding="full", bytes=100),
        {**applied("rollout-0", 1, "trainer-0", 11.8, bytes=100), "event": "weights_skipped"},
    ]
    (row,) = per_version(events)
    assert (row["from_trainer"], row["from_relays"], row["bytes_from_trainer"]) == (["rollout-0"], ["rollout-1"], 100)


def test_fetch_s_in_the_event_wins_over_the_event_stamps():
    events = [
        {"t": 10.0, "event": "trained", "iteration": 1, "version": 1},
        applied("rollout-0", 1, "trainer-0", 12.0, encoding="full", bytes=100, fetch_s=0.75),
    ]
    (row,) = per_version(events)
    assert (row["transfer_s"], row["transfer_time"]) == (0.75, "fetch_s")


def test_the_slow_unit_case_compares_the_others_slowest_receiver_slowed_and_not():
    from bench.broadcast import _slow_unit

    def rnd(b2: float, b3: float, parent_b3: str) -> dict:
        return {"receiver_seconds": {"a1": 0.5, "b1": 1.0, "b2": b2, "b3": b3}, "parents": {"b3": parent_b3}}

    agents = {
        "chains_1": rnd(1.1, 1.2, "b2"),
        "chains_1_slow_b2": rnd(3.3, 3.6, "b2"),  # b3 waits for b2
        "chains_2": rnd(1.1, 1.2, "b1"),
        "chains_2_slow_b2": rnd(3.3, 1.25, "b1"),
    }
    got = _slow_unit(agents)
    assert (got["chains_1"]["others_s"], got["chains_1"]["others_s_b2_slow"]) == (1.2, 3.6)
    assert got["chains_1"]["others_ratio"] == 3.0 and got["chains_2"]["others_ratio"] == round(1.25 / 1.2, 3)
    assert got["chains_2"]["b2_s_slow"] == 3.3 and got["chains_2"]["plan"] == {"b3": "b1"}


def test_copies_into_a_host_count_the_pulls_from_another_host():
    hosts = {"trainer-0": "root", "rollout-0": "b1", "rollout-1": "b1", "rollout-2": "b2", "rollout-3": "b2"}
    events = [
        applied("rollout-0", 1, "trainer-0", 11.0, bytes=100),
        applied("rollout-1", 1, "rollout-0", 11.1, bytes=100),  # the same host: no copy into it
        applied("rollout-2", 1, "rollout-0", 11.2, bytes=100),
        applied("rollout-3", 1, "rollout-2", 11.3, bytes=100),
        applied("rollout-0", 2, "trainer-0", 12.0, bytes=100),
        applied("rollout-1", 2, "rollout-0", 12.1, bytes=100),
        applied("rollout-2", 2, "rollout-1", 12.2, bytes=100),
        applied("rollout-3", 2, "rollout-0", 12.3, bytes=100),  # a host-blind plan: b2 took in two copies
    ]
    rows = per_version(events, hosts)
    assert [r["into_host"] for r in rows] == [{"b1": 1, "b2": 1}, {"b1": 1, "b2": 2}]
    assert "into_host" not in per_version(events)[0]
