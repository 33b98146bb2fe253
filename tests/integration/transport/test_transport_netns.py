"""A small broadcast in real network namespaces with tc shaping (bench.netem): one copy crosses."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess

import pytest

from bench.netem import LabSpec, NetLab
from bench.netem.bcast_agent import SECRET_ENV, AgentProcess, agent_argv
from bench.netem.lab import PREFIX, STATE_DIR, cleanup_stale
from rlctl.weights.plan import Endpoint, plan_broadcast

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
]

DCS = {"dc-a": ["root", "a1"], "dc-b": ["b1", "b2"]}
NBYTES = 4 << 20


def test_planned_broadcast_crosses_once_where_a_star_crosses_per_receiver():
    env = {**os.environ, SECRET_ENV: secrets.token_hex(16)}
    receivers = [Endpoint(h, dc) for dc, hosts in DCS.items() for h in hosts if h != "root"]
    plan = plan_broadcast([Endpoint("root", "dc-a")], receivers)
    with NetLab(LabSpec(DCS, host_rate_mbit=400, inter_dc_rate_mbit=100)) as lab:
        procs = {
            h: lab.spawn(
                h,
                agent_argv(f"tcp://{lab.ip(h)}:7300", chunk_bytes=256 << 10),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for h in lab.hosts
        }
        agents = {h: AgentProcess(p) for h, p in procs.items()}
        crossed = {}
        for version, star in ((1, False), (2, True)):
            agents["root"].command(cmd="publish", version=version, bytes=NBYTES, seed=version, anchor=True)
            want = agents["root"].wait("published")["xxh3"]
            before = lab.inter_dc_bytes()
            for r in plan.receivers:
                holders = ["root"] if star else [plan.parent[r.name], *plan.fallbacks[r.name]]
                agents[r.name].command(cmd="fetch", version=version, holders=[agents[h].address for h in holders])
            for r in plan.receivers:
                assert agents[r.name].wait("current", timeout_s=120)["xxh3"] == want
            crossed[version] = (lab.inter_dc_bytes() - before) / NBYTES
        for a in agents.values():
            a.quit()
    # payload + TCP/IP headers + ACKs: one copy is 1.0-1.15x the payload on the uplinks
    assert 1.0 <= crossed[1] < 1.15, crossed
    assert 2.0 <= crossed[2] < 2.3, crossed  # the star sends b1 and b2 their own copies


def test_stale_lab_of_a_dead_owner_is_removed():
    """A lab whose owner died (no teardown ran) is cleaned up by the next NetLab/cleanup_stale."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    prefix = PREFIX + "dead00"
    ns = f"{prefix}h0x0"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    (STATE_DIR / f"{prefix}.json").write_text(json.dumps({"pid": dead.pid}))
    try:
        assert prefix in cleanup_stale()
        assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert not (STATE_DIR / f"{prefix}.json").exists()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
