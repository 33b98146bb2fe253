"""Weight broadcast across two emulated datacenters: rlctl's plan vs a naive star vs gloo.

Topology (bench.netem, needs root): DC-A = trainer root + a1; DC-B = b1, b2, b3 (rollout);
every host NIC shaped to 2 Gbit/s both ways, the inter-DC link to 500 Mbit/s. Weights: 256 MiB
(64 MiB with --quick). Every method moves the same bytes from the root to all four receivers:

- rlctl:      the planner's plan (one copy across the inter-DC link to b1, which relays b1→b2→b3;
              root→a1 locally), chunks pipelined, every chunk checksummed;
- naive_star: the same agents, every receiver fetching straight from the root;
- gloo:       torch.distributed.broadcast (gloo backend) over the same namespaces;
- rlctl_delta: the next version (2 % of the bf16 weights changed) sent as a lossless delta;
- intra_dc_chain: b1 → b2 → b3 alone, against the pipelined-chain bound (S + (h−1)·c)/B;
- slow_unit:  b2 slowed to a third of the inter-DC rate; the other receivers' completion (the slowest of them)
              against the same plan unslowed, with the relay feeding one chain (b1 → b2 → b3: b3 waits for b2)
              and two (`weight_sync.chains_per_datacenter`, default 2: b1 → b2, b1 → b3);
- job:        a running job's own agents (controller + trainer on root, one rollout unit on each of
              b1-b3; bench.broadcast_job): each version's ~50 MiB of fp32 weights along the job's
              broadcast plan, copies counted from the job's events and the same tc counters
              (`job_delta`: the same job with `weight_sync: delta`; `job_two_per_host`: two units on each of
              b1-b3, where each host should take in one copy per version, counted from the events' sources
              and from each host's received bytes).

The yardsticks are measured in the same run: TCP goodput of the inter-DC link and of a host link
(plain socket, one stream, best of two probes), and the tc byte overhead per payload byte (headers, ACKs), which turns
bytes counted on the uplinks into `inter_dc_copies` = payload copies that crossed.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
import sys
import time
from typing import Any

from bench.broadcast_job import run_job
from bench.netem import LabSpec, NetLab
from bench.netem.bcast_agent import SECRET_ENV, AgentProcess, agent_argv
from bench.netem.probe import measure_goodput
from rlctl.weights.plan import Endpoint, plan_broadcast

DCS = {"dc-a": ["root", "a1"], "dc-b": ["b1", "b2", "b3"]}
HOST_MBIT, INTER_DC_MBIT = 2000.0, 500.0
SLOW_MBIT = INTER_DC_MBIT / 3  # the slow unit's NIC (slow_unit)
CHUNK_BYTES = 4 << 20
PORT = 7100


def _receivers() -> list[Endpoint]:
    return [Endpoint(h, dc) for dc, hosts in DCS.items() for h in hosts if h != "root"]


def _run_agents(lab: NetLab, nbytes: int, secret: str) -> dict[str, Any]:
    """rlctl plan and naive star with the same agents; returns both results."""
    env = {**os.environ, SECRET_ENV: secret}
    agents = {}
    for host in lab.hosts:
        argv = agent_argv(f"tcp://{lab.ip(host)}:{PORT}", chunk_bytes=CHUNK_BYTES, chunk_timeout_s=120)
        agents[host] = AgentProcess(
            lab.spawn(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        )
    plan = plan_broadcast([Endpoint("root", "dc-a")], _receivers())
    out: dict[str, Any] = {"plan": {c: p for c, p in plan.parent.items()}}
    rounds = [  # (version, method, publisher, {receiver: holders}, force a full anchor)
        (1, "rlctl", "root", {r.name: [plan.parent[r.name], *plan.fallbacks[r.name]] for r in plan.receivers}, True),
        (2, "naive_star", "root", {r.name: ["root"] for r in plan.receivers}, True),
        (
            3,
            "rlctl_delta",
            "root",
            {r.name: [plan.parent[r.name], *plan.fallbacks[r.name]] for r in plan.receivers},
            False,
        ),
        (4, "intra_dc_chain", "b1", {"b2": ["b1"], "b3": ["b2", "b1"]}, True),
    ]
    for k, chains in enumerate((1, 2)):  # each plan unslowed, then with b2 slowed
        p = plan_broadcast([Endpoint("root", "dc-a")], _receivers(), dc_chains=chains)
        planned = {r.name: [p.parent[r.name], *p.fallbacks[r.name]] for r in p.receivers}
        rounds += [
            (5 + 2 * k, f"chains_{chains}", "root", planned, True),
            (6 + 2 * k, f"chains_{chains}_slow_b2", "root", planned, True),
        ]
    try:
        for version, method, publisher, holders, anchor in rounds:
            lab_rate = SLOW_MBIT if method.endswith("_slow_b2") else HOST_MBIT
            lab.set_host_rate("b2", lab_rate)
            agents[publisher].command(
                cmd="publish", version=version, bytes=nbytes, seed=7, change_frac=0.02, anchor=anchor
            )
            published = agents[publisher].wait("published")
            before = lab.inter_dc_bytes()
            t0 = time.perf_counter()
            for name, hs in holders.items():
                agents[name].command(cmd="fetch", version=version, holders=[agents[h].address for h in hs])
            done = {name: agents[name].wait("current", timeout_s=600) for name in holders}
            seconds = time.perf_counter() - t0
            out[method] = {
                "seconds": seconds,
                "crossed_bytes": lab.inter_dc_bytes() - before,
                "bit_exact": all(d["xxh3"] == published["xxh3"] for d in done.values()),
                "payload_bytes": published["payload_bytes"].get(
                    "delta" if "delta" in published["encoding"] else "full"
                ),
                "receiver_seconds": {k: round(d["seconds"], 3) for k, d in done.items()},
                "parents": {k: hs[0] for k, hs in holders.items()},
            }
    finally:
        for a in agents.values():
            a.quit()
    return out


def _run_gloo(lab: NetLab, nbytes: int) -> dict[str, Any]:
    hosts = list(lab.hosts)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    procs = []
    for rank, host in enumerate(hosts):
        argv = [
            sys.executable,
            "-m",
            "bench.broadcast",
            "gloo-worker",
            str(rank),
            str(len(hosts)),
            lab.ip(hosts[0]),
            str(nbytes),
        ]
        procs.append(lab.spawn(host, argv, stdout=subprocess.PIPE, text=True, env=env))
    before = lab.inter_dc_bytes()
    outs = []
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return {
        "seconds": max(o["seconds"] for o in outs),
        "crossed_bytes": lab.inter_dc_bytes() - before,
        "bit_exact": all(o["ok"] for o in outs),
    }


def _gloo_worker(rank: int, world: int, master: str, nbytes: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{PORT + 50}", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(3)
    t = (
        torch.randint(0, 255, (nbytes,), dtype=torch.uint8, generator=g)
        if rank == 0
        else torch.empty(nbytes, dtype=torch.uint8)
    )
    dist.barrier()
    t0 = time.perf_counter()
    dist.broadcast(t, src=0)
    dist.barrier()
    seconds = time.perf_counter() - t0
    ok = bool(
        t[:4096]
        .eq(torch.randint(0, 255, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))[:4096])
        .all()
    )
    print(json.dumps({"rank": rank, "seconds": seconds, "ok": ok}), flush=True)
    dist.destroy_process_group()


def run(*, quick: bool) -> dict[str, Any]:
    nbytes = (64 if quick else 256) << 20
    spec = LabSpec(DCS, host_rate_mbit=HOST_MBIT, inter_dc_rate_mbit=INTER_DC_MBIT)
    with NetLab(spec) as lab:
        probe_bytes = (32 if quick else 64) << 20
        before = lab.inter_dc_bytes()
        # best of two probes: the stricter yardstick (a low probe would flatter the methods)
        inter_goodput = max(measure_goodput(lab, "a1", "b1", probe_bytes, port=5990 + i) for i in range(2))
        wire_per_payload = (lab.inter_dc_bytes() - before) / (2 * probe_bytes)
        host_goodput = max(measure_goodput(lab, "b1", "b2", probe_bytes * 2, port=5995 + i) for i in range(2))
        agents = _run_agents(lab, nbytes, secrets.token_hex(16))
        gloo = _run_gloo(lab, nbytes)
        job = functools.partial(run_job, lab, inter_goodput=inter_goodput, wire_per_payload=wire_per_payload)
        jobs = {sync: job(sync=sync, iterations=4 if quick else 8) for sync in ("full", "delta")}
        jobs["two_per_host"] = job(sync="full", iterations=3 if quick else 6, units_per_host=2)
    result: dict[str, Any] = {
        "bytes": nbytes,
        "chunk_bytes": CHUNK_BYTES,
        "inter_dc_goodput_bytes_per_s": inter_goodput,
        "host_goodput_bytes_per_s": host_goodput,
        "wire_bytes_per_payload_byte": wire_per_payload,
        "plan": agents["plan"],
    }
    for method in ("rlctl", "naive_star", "rlctl_delta"):
        r = result[method] = agents[method]
        r["fraction_of_inter_dc_link"] = nbytes / (r["seconds"] * inter_goodput)
        r["inter_dc_copies"] = r["crossed_bytes"] / (nbytes * wire_per_payload)
    gloo["fraction_of_inter_dc_link"] = nbytes / (gloo["seconds"] * inter_goodput)
    gloo["inter_dc_copies"] = gloo["crossed_bytes"] / (nbytes * wire_per_payload)
    result["gloo"] = gloo
    # whole plan: root → b1 → b2 → b3 is a 3-hop pipelined chain whose slowest hop is the inter-DC link
    r = result["rlctl"]
    r["chain_bound_s"] = (nbytes + (3 - 1) * CHUNK_BYTES) / inter_goodput
    r["ratio_to_chain_bound"] = r["chain_bound_s"] / r["seconds"]
    # intra-DC alone: b1 → b2 → b3 (2 hops at host goodput), measured in its own round
    c = result["intra_dc_chain"] = agents["intra_dc_chain"]
    c["chain_bound_s"] = (nbytes + (2 - 1) * CHUNK_BYTES) / host_goodput
    c["ratio_to_chain_bound"] = c["chain_bound_s"] / c["seconds"]
    result["job"], result["job_delta"], result["job_two_per_host"] = jobs["full"], jobs["delta"], jobs["two_per_host"]
    result["slow_unit"] = _slow_unit(agents)
    return result


def _slow_unit(agents: dict[str, Any]) -> dict[str, Any]:
    """Per plan (1 or 2 chains in dc-b): the slowest receiver other than b2, slowed over unslowed."""
    out: dict[str, Any] = {"slow_mbit": SLOW_MBIT}
    for chains in (1, 2):
        base, slow = agents[f"chains_{chains}"], agents[f"chains_{chains}_slow_b2"]
        others = [n for n in base["receiver_seconds"] if n != "b2"]
        t0 = max(base["receiver_seconds"][n] for n in others)
        t1 = max(slow["receiver_seconds"][n] for n in others)
        out[f"chains_{chains}"] = {
            "others_s": round(t0, 3),
            "others_s_b2_slow": round(t1, 3),
            "others_ratio": round(t1 / t0, 3),
            "b2_s_slow": slow["receiver_seconds"]["b2"],
            "plan": base["parents"],
        }
    return out


def summary(result: dict[str, Any]) -> str:
    inter_mbit = result["inter_dc_goodput_bytes_per_s"] * 8 / 1e6
    host_mbit = result["host_goodput_bytes_per_s"] * 8 / 1e6
    lines = [
        f"{result['bytes'] / 2**20:.0f} MiB, inter-DC goodput {inter_mbit:.0f} Mbit/s, "
        f"host goodput {host_mbit:.0f} Mbit/s, plan {result['plan']}"
    ]
    for m in ("rlctl", "naive_star", "gloo", "rlctl_delta"):
        r = result[m]
        lines.append(
            f"  {m:<11} {r['seconds']:7.2f} s  fraction_of_inter_dc_link {r['fraction_of_inter_dc_link']:.3f}  "
            f"inter_dc_copies {r['inter_dc_copies']:.2f}  bit_exact {r['bit_exact']}"
        )
    lines.append(f"  rlctl whole chain: ratio to (S+(h-1)c)/B_inter {result['rlctl']['ratio_to_chain_bound']:.3f}")
    c = result["intra_dc_chain"]
    lines.append(
        f"  intra-DC chain b1→b2→b3: {c['seconds']:.2f} s, ratio to (S+(h-1)c)/B {c['ratio_to_chain_bound']:.3f}"
    )
    for m in ("job", "job_delta"):
        j = result[m]
        lines.append(
            f"  {m:<11} {j['versions']} versions of {j['version_bytes'] / 2**20:.1f} MiB ({j['sync']}) in "
            f"{j['seconds']:.1f} s: inter_dc_copies {j['inter_dc_copies']:.3f} (events: "
            f"{j['copies_per_version_from_events']:.2f}/version, {j['relayed_pulls']} relayed pulls), "
            f"fraction_of_inter_dc_link {j['fraction_of_inter_dc_link']:.3f} ({', '.join(j['transfer_time'])})"
        )
    j = result["job_two_per_host"]
    copies = ", ".join(f"{h} {c:.2f}" for h, c in (j["host_received_copies"] or {}).items())
    lines.append(
        f"  job, 2 units per host: {j['versions']} versions in {j['seconds']:.1f} s, copies into each host per "
        f"version: {copies} (received bytes), at most {j['most_copies_into_a_host']} (events); inter_dc_copies "
        f"{j['inter_dc_copies']:.3f}"
    )
    su = result["slow_unit"]
    for chains in (1, 2):
        c = su[f"chains_{chains}"]
        lines.append(
            f"  slow unit (b2 at {su['slow_mbit']:.0f} Mbit/s), {chains} chain(s) in dc-b: the others done in "
            f"{c['others_s_b2_slow']:.2f} s against {c['others_s']:.2f} s unslowed (×{c['others_ratio']:.2f}; "
            f"goal ≤ 1.2), b2 in {c['b2_s_slow']:.2f} s"
        )
    return "\n".join(lines)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "gloo-worker":
    _gloo_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
