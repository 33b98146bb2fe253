"""Faults across the two datacenters: the controller and the trainer are SLURM jobs in dc-a, the rollout units run
on the SSH site in its own network namespace (dc-b) behind the shaped veth link (tests/services/netsite.sh).

A relay killed mid-broadcast: the dc-b unit that pulls each version across the link and forwards it chunk by
chunk to the others is SIGKILLed while a version is on its way; its children re-attach to the next holder and
no unit applies anything but the trainer's published bytes. The inter-DC link down for 20 s: the job pauses
(status says so), and goes on when the link returns, with the same units.

These run in the full suite only (`make faults`): two SLURM jobs and SSH starts take longer than the reduced
form's budget."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.ops.conftest import job_yaml
from tests.integration.ops.test_ops_cross_site import cross_site_inventory, site_workdir

from .faultlib import (
    FULL,
    SIGKILL,
    LinkDown,
    Row,
    StatusClient,
    events,
    finish,
    joined,
    launch,
    metrics_rows,
    record,
    rlctl,
    size,
    skip_without_nft,
    stop_launcher,
    wait_for,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not FULL, reason="full suite only (RLCTL_FAULTS=full, `make faults`)"),
]


def inventory(services: dict[str, str], tmp_path: Path, *, gen_gpus: int) -> Path:
    path = cross_site_inventory(services, tmp_path / "sites.yaml", Path(site_workdir()))
    inv = yaml.safe_load(path.read_text())
    inv["sites"]["gen"]["nodes"][0]["gpus"] = gen_gpus
    path.write_text(yaml.safe_dump(inv))
    return path


def published(job_dir: Path) -> dict[int, str]:
    text = (job_dir / "logs" / "trainer-0.log").read_text()
    return {int(v): x for v, x in re.findall(r"weights v(\d+) published: \d+ bytes, xxh3 ([0-9a-f]{16})", text)}


def applied(job_dir: Path) -> list[dict[str, Any]]:
    return events(job_dir, "weights_applied")


def tc_rate(services: dict[str, str], rate: str) -> None:
    """Both directions of the shaped link at `rate` (netsite.sh's tbf, its burst and latency)."""
    dev, ns = services["RLCTL_TEST_NETSITE_DEV"], services["RLCTL_TEST_NETSITE_NETNS"]
    shape = ["root", "tbf", "rate", rate, "burst", "256k", "latency", "100ms"]
    subprocess.run(["tc", "qdisc", "change", "dev", dev, *shape], check=True, timeout=30)
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "change", "dev", "eth0", *shape], check=True, timeout=30)


def kill_the_relay(job_dir: Path, proc: subprocess.Popen[str], gone: list[str]) -> tuple[str, float]:
    """SIGKILL the relay one second after the trainer published a version; (its name, seconds until every other
    unit applied that version or a newer one). It is replaced on its site before this returns."""

    def chain() -> set[str]:
        return {e["agent"] for e in applied(job_dir)} - set(gone)

    wait_for("three units in the chain", lambda: len(chain()) >= 3, 300, alive=proc)
    # the relay: the unit that pulled the newest version straight from the trainer (applied, or skipped for a newer)
    fetched = applied(job_dir) + events(job_dir, "weights_skipped")
    relay = max((e for e in fetched if e["source"].startswith("trainer")), key=lambda e: e["version"])["agent"]
    others = chain() - {relay}
    seen = max(published(job_dir), default=0)
    v = int(
        wait_for("a new version", lambda: max(published(job_dir), default=0) > seen and max(published(job_dir)), 300)
    )
    time.sleep(1.0)  # mid-broadcast: 1.4 MB takes ~3 s over 4 Mbit/s
    os.kill(joined(job_dir)[relay]["pid"], SIGKILL)  # the site's processes share this pid namespace
    t_kill = time.time()

    def caught_up() -> float | None:
        got = {e["agent"]: e["t"] for e in applied(job_dir) if e["version"] >= v and e["agent"] in others}
        return max(got.values()) if len(got) == len(others) else None

    done = float(wait_for(f"{sorted(others)} on v{v} or newer", caught_up, 300, alive=proc))
    replaced = lambda: relay in {e["lost"] for e in events(job_dir, "unit_replaced")}  # noqa: E731
    wait_for(f"{relay} replaced", replaced, 300, alive=proc)
    return relay, done - t_kill


def stop_job(job_dir: Path, proc: subprocess.Popen[str]) -> dict[str, Any]:
    p = rlctl("stop", str(job_dir), "-o", "json", timeout_s=240)
    assert p.returncode == 0, p.stderr[-2000:]
    code, s, err = finish(proc, 180)
    assert s is not None, (code, err[-3000:])
    return s


def test_a_relay_killed_mid_broadcast(services: dict[str, str], tmp_path: Path) -> None:
    """Three units in dc-b pull each version as one chain: the trainer → the relay → the others, chunk by chunk
    (64 KiB chunks, the link slowed to 4 Mbit/s so a version takes seconds to cross). The relay is SIGKILLed
    one second after the trainer published a version; the other units re-attach to the next holder of their
    list, every version any unit applies has the trainer's xxh3, and the relay is replaced on its site.
    Recovery: from the SIGKILL until every surviving unit applied that version or a newer one."""
    kills = size(1, 3)
    inv = inventory(services, tmp_path, gen_gpus=4)
    job = job_yaml(
        tmp_path / "relay.yaml",
        inventory=[str(inv)],
        trainer="train",
        rollout="gen",
        rollout_gpus=3,
        iterations=100000,
        weight_sync={"mode": "full", "chunk_bytes": 65536},
    )
    job_dir = tmp_path / "run"
    proc = launch(str(job), "--job-dir", str(job_dir), "-o", "json")
    recovery: list[float] = []
    victims: list[str] = []
    reattached = 0
    try:
        wait_for("two trained iterations", lambda: len(metrics_rows(job_dir)) >= 2, 400, alive=proc)
        tc_rate(services, "4mbit")
        for _ in range(kills):
            relay, seconds = kill_the_relay(job_dir, proc, victims)
            victims.append(relay)
            recovery.append(seconds)
        tc_rate(services, f"{services['RLCTL_TEST_NETSITE_RATE_MBIT']}mbit")
        s = stop_job(job_dir, proc)
    finally:
        tc_rate(services, f"{services['RLCTL_TEST_NETSITE_RATE_MBIT']}mbit")
        stop_launcher(proc)
    theirs = published(job_dir)
    wrong = [e for e in applied(job_dir) if e["xxh3"] != theirs.get(e["version"])]
    assert wrong == [], wrong[:5]  # no unit applied a partial (or any other) version
    logs = {
        u: rlctl("logs", str(job_dir), f"rollout/{u.rsplit('-', 1)[1]}").stdout
        for u in joined(job_dir)
        if u.startswith("rollout")
    }
    for relay in victims:
        address = joined(job_dir)[relay]["weights"]
        pattern = rf"from {re.escape(address)} failed, re-attaching to the next holder"
        reattached += sum(len(re.findall(pattern, text)) for text in logs.values())
    assert reattached >= len(victims), reattached  # a child was pulling from each relay when it died
    led = s["ledger"]
    assert led["lost"] == 0 and led["duplicated"] == 0, led
    record(
        Row(
            "relay in dc-b SIGKILLed mid-broadcast (cross-site, 3 units, full sync)",
            len(victims),
            led["lost"],
            led["duplicated"],
            recovery,
            f"{reattached} re-attachments; {len(applied(job_dir))} versions applied = trainer's xxh3; relays replaced",
        )
    )


def test_the_inter_dc_link_down_for_20_s(services: dict[str, str], tmp_path: Path) -> None:
    """Every packet over the link between dc-a (controller, trainer) and dc-b (two rollout units) is dropped for
    20 s, then the link is back. After 15 s of silence the units are unreachable and, none being left, the job
    is paused: the controller's status says so, naming the site. When the link returns, their connections
    (never closed) carry their messages again: they rejoin, the job resumes with the same units (none lost,
    none replaced). Recovery: from the link's return to the next trained iteration."""
    skip_without_nft()
    outage_s = 20.0
    inv = inventory(services, tmp_path, gen_gpus=3)
    job = job_yaml(
        tmp_path / "linkdown.yaml",
        inventory=[str(inv)],
        trainer="train",
        rollout="gen",
        rollout_gpus=2,
        iterations=100000,
    )
    job_dir = tmp_path / "run"
    proc = launch(str(job), "--job-dir", str(job_dir), "-o", "json")
    link = LinkDown(dev=services["RLCTL_TEST_NETSITE_DEV"], netns=services["RLCTL_TEST_NETSITE_NETNS"])
    status = StatusClient(job_dir)
    said: list[str] = []
    try:
        wait_for("two trained iterations", lambda: len(metrics_rows(job_dir)) >= 2, 400, alive=proc)
        link.down()
        t_down = time.time()
        # at least outage_s, and on until status said paused (at most 60 s): a loaded machine's controller may see
        # the silence late, and the 5 s left between the 15 s heartbeat timeout and 20 s were the only window
        while (down := time.time() - t_down) < outage_s or (not said and down < 60.0):
            st = status()
            if st is not None and st["state"] == "paused":
                said.append(st["resilience"]["paused"])
            time.sleep(0.5)
        link.up()
        t_up = time.time()
        after = lambda: [e["t"] for e in events(job_dir, "trained") if e["t"] > t_up]  # noqa: E731
        wait_for("an iteration trained after the link returned", after, 180, alive=proc)
        wait_for("the job resumed", lambda: events(job_dir, "job_resumed"), 60, alive=proc)
        trained = len(metrics_rows(job_dir))
        wait_for("two more trained iterations", lambda: len(metrics_rows(job_dir)) >= trained + 2, 180, alive=proc)
        s = stop_job(job_dir, proc)
    finally:
        if link.down_at is not None and link.up_at is None:
            link.up()
        status.close()
        stop_launcher(proc)
    units = {"rollout-0", "rollout-1"}
    assert said and said[-1].startswith("paused: site gen unreachable since "), said
    assert {e["agent"] for e in events(job_dir, "agent_unreachable")} == units
    assert {e["agent"] for e in events(job_dir, "agent_rejoined")} == units
    assert not events(job_dir, "agent_lost") and not events(job_dir, "unit_replaced")
    paused, resumed = events(job_dir, "job_paused"), events(job_dir, "job_resumed")
    assert len(paused) == len(resumed) == 1 and paused[0]["sites"] == ["gen"]
    led = s["ledger"]
    assert led["lost"] == 0 and led["duplicated"] == 0, led
    record(
        Row(
            f"inter-DC link down {t_up - t_down:.0f} s (cross-site, 2 units in dc-b)",
            1,
            led["lost"],
            led["duplicated"],
            [min(after()) - t_up],
            f"status: '{said[-1].split(' (')[0]}' ({len(said)} polls); "
            f"paused {resumed[0]['t'] - paused[0]['t']:.0f} s; "
            f"{sum(e['requeued'] for e in events(job_dir, 'agent_unreachable'))} samples requeued; same units rejoined",
        )
    )
