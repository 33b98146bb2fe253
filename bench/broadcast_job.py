"""The `job` row of the broadcast benchmark: a running job's own agents move each policy version across
the same two emulated datacenters as the other methods (bench.broadcast).

    dc-a: root = controller-0 + trainer-0 (a1 idle)  ══ 500 Mbit/s ══  dc-b: b1 = rollout-0, b2 = rollout-1,
                                                                            b3 = rollout-2

    job dir (inventory: site dc-a on host root, site dc-b on hosts b1-b3; job: digits task, no SFT warm-up,
             a TinyGPT wide enough that one fp32 version is ~50 MB, so link time dominates)
      ─▶ every agent's command line and environment exactly as `rlctl launch` builds them
         (run.planned_agents + spawn.agent_spec), RLCTL_LISTEN_HOST = its own host's lab IP,
         started inside that host's namespace (NetLab.spawn) instead of by a launch backend
      ─▶ the controller exits when the last iteration is trained and every unit holds it
      ─▶ events.jsonl `weights_applied` / `weights_skipped` (agent, version, source = the agent that served,
         bytes[, fetch_s])
         + the tc byte counters of the datacenter uplinks (the yardstick the other methods use)

Per version exactly one unit should pull from the trainer (the relay of dc-b) and the others from relays
on their side: `copies_per_version_from_events`. The uplinks' bytes over the whole run (weights, and the
job's samples and control messages) over (those pulls' bytes × the probe's wire overhead) is
`inter_dc_copies`. `fraction_of_inter_dc_link` is each trainer pull's goodput over the probed link goodput,
averaged over versions, counting a full version's bytes like the `rlctl_delta` row
(`wire_fraction_of_inter_dc_link` counts the bytes sent instead). The transfer time is the relay's
`fetch_s` when the controller records it in the event (`transfer_time: fetch_s`); otherwise the time
from the controller's `trained` event of that version to the relay's `weights_applied`
(`trained_to_applied`): that also counts publishing (and delta encoding), the wait for the engine's safe
point and loading, and both are stamped when the controller reads the message, so it is an
approximation, mostly a pessimistic one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import yaml

from bench.netem import NetLab
from rlctl.agents.appliedlog import unit_rows
from rlctl.errors import RlctlError
from rlctl.models.hf import TinyGPTConfig

# one fp32 version of this model is 12.9 M parameters = 49 MiB; a training step ~1 s on one core
MODEL = TinyGPTConfig(
    hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8
)
TRAINER_HOST = "root"
ROLLOUT_HOSTS = ["b1", "b2", "b3"]
JOB_TIMEOUT_S = 240.0


def _write_job(workdir: Path, lab: NetLab, *, sync: str, iterations: int, units_per_host: int) -> Path:
    """The inventory (two sites, one per datacenter; `units_per_host` one-GPU units on each rollout host) and the
    job file; returns the job file."""
    sites = {
        "dc-a": {
            "datacenter": "dc-a",
            "scheduler": {"kind": "local"},
            "gpu": "CPU",
            "nodes": [{"host": TRAINER_HOST, "gpus": 1}],
            "network": {"bandwidth_gbps": 2, "listen_host": lab.ip(TRAINER_HOST)},
        },
        "dc-b": {
            "datacenter": "dc-b",
            "scheduler": {"kind": "local"},
            "gpu": "CPU",
            "nodes": [{"host": h, "gpus": units_per_host} for h in ROLLOUT_HOSTS],
            # per agent, RLCTL_LISTEN_HOST overrides this with its own host's address
            "network": {"bandwidth_gbps": 2, "listen_host": lab.ip(ROLLOUT_HOSTS[0])},
        },
    }
    inventory = {
        "apiVersion": "rlctl/v1",
        "kind": "Inventory",
        "sites": sites,
        "links": [{"between": ["dc-a", "dc-b"], "bandwidth_gbps": lab.spec.inter_dc_rate_mbit / 1000}],
    }
    job = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": f"bench-broadcast-{sync}-{units_per_host}",
        "inventory": ["sites.yaml"],
        "model": {"kind": "builtin", "name": "tiny-demo"},  # its weights: the wider TinyGPT written below
        "task": {"kind": "digits", "median_output_tokens": 8, "max_output_tokens": 32},
        "iterations": iterations,
        "batch": {"prompts_per_iteration": 4, "samples_per_prompt": 4, "train_micro_batch_samples": 16},
        "pipeline": {"mode": "async"},
        "placement": {
            "trainer": {"site": "dc-a", "gpus": 1},
            "rollout": [{"site": "dc-b", "gpus": len(ROLLOUT_HOSTS) * units_per_host}],
        },
        "transport": {"timeout_s": 60},
        "weight_sync": {"mode": sync},
        "warmup": {"sft_steps": 0},
        "checkpoint": {"every_iterations": 0},
    }
    (workdir / "sites.yaml").write_text(yaml.safe_dump(inventory))
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _prepare(job_file: Path, job_dir: Path) -> tuple[Any, Any, dict[str, Any], int]:
    """What `rlctl launch` does before starting agents; the starting policy is the wide TinyGPT.
    Also returns the bytes of one full version (fp32, flat)."""
    import torch

    from rlctl.config import load_job
    from rlctl.launch.jobdir import JobDir
    from rlctl.models.tinygpt import TinyGPT
    from rlctl.ops.counts import plan_counts, resolve_job
    from rlctl.ops.jobprep import prepare

    job = load_job(job_file)
    spec = resolve_job(job)
    plan = plan_counts(job, spec)
    jd = JobDir.create(spec.name, explicit=job_dir)
    torch.manual_seed(spec.seed)
    model = TinyGPT(dataclasses.replace(MODEL))  # a copy: the model keeps its config
    model.save_pretrained(jd.init_model)  # prepare() keeps an existing init model
    prepare(jd, spec, plan, source=str(job_file), job=job)
    return jd, spec, plan, sum(4 * t.numel() for t in model.state_dict().values())


def _start_agents(
    lab: NetLab, jd: Any, spec: Any, plan: dict[str, Any], logs: list[IO[bytes]], hosts: dict[str, str]
) -> dict[str, Any]:
    """Every agent of the job inside its host's namespace, controller first (the others read its address);
    `hosts` gets each agent's host."""
    from rlctl.launch.agentenv import ENV_LISTEN_HOST
    from rlctl.launch.backends import read_sites
    from rlctl.launch.spawn import agent_spec
    from rlctl.ops.agentplan import planned_agents

    sites = read_sites(jd.path)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    # the trainer's rendezvous is on root's own loopback (a fresh namespace: any port is free)
    for a, extra in planned_agents(plan, sites, spec, master_port=29500):
        host = a.gpu_slice.host if a.gpu_slice is not None else TRAINER_HOST
        s = agent_spec(jd, a, sites[a.site], env=extra)
        log_path = s.log_path or jd.log(a.role, a.replica)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logs.append(log_path.open("ab"))
        env = {**os.environ, **s.env, ENV_LISTEN_HOST: lab.ip(host)}
        procs[s.name] = lab.spawn(host, s.argv, env=env, stdout=logs[-1], stderr=subprocess.STDOUT)
        hosts[s.name] = host
        if a.role == "controller":
            deadline = time.monotonic() + 120
            while not jd.controller_json.exists():
                if procs[s.name].poll() is not None or time.monotonic() > deadline:
                    raise RlctlError(f"the controller did not start; see {log_path}")
                time.sleep(0.05)
    return procs


def _events(job_dir: Path) -> list[dict[str, Any]]:
    p = job_dir / "events.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def per_version(events: list[dict[str, Any]], hosts: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per version the units fetched (applied, or skipped for a newer one): the pulls from a trainer rank (what
    crossed), pulls from relays, and the trainer pull's transfer time (`fetch_s` if the event has it, else
    trained → applied); with `hosts` (agent → host), each host's pulls from another host (`into_host`: the
    copies that entered it)."""
    trained = {int(e["version"]): float(e["t"]) for e in events if e["event"] == "trained"}
    applied = [e for e in unit_rows(events) if e["event"] in ("weights_applied", "weights_skipped")]
    out = []
    for v in sorted({int(e["version"]) for e in applied}):
        pulls = [e for e in applied if int(e["version"]) == v]
        direct = [e for e in pulls if str(e.get("source", "")).startswith("trainer")]
        row: dict[str, Any] = {
            "version": v,
            "from_trainer": [e["agent"] for e in direct],
            "from_relays": sorted(e["agent"] for e in pulls if e not in direct),
            "encodings": sorted({str(e.get("encoding")) for e in pulls}),
            "bytes_from_trainer": sum(int(e.get("bytes") or 0) for e in direct),
        }
        if hosts is not None:
            into = Counter(hosts[e["agent"]] for e in pulls if hosts.get(str(e.get("source"))) != hosts[e["agent"]])
            row["into_host"] = {h: into[h] for h in sorted({hosts[e["agent"]] for e in pulls})}
        if len(direct) == 1:
            e = direct[0]
            if isinstance(e.get("fetch_s"), int | float):
                row["transfer_s"], row["transfer_time"] = float(e["fetch_s"]), "fetch_s"
            elif v in trained:
                row["transfer_s"], row["transfer_time"] = float(e["t"]) - trained[v], "trained_to_applied"
        out.append(row)
    return out


def run_job(
    lab: NetLab,
    *,
    sync: str,
    iterations: int,
    inter_goodput: float,
    wire_per_payload: float,
    units_per_host: int = 1,
) -> dict[str, Any]:
    """One job through `lab`; its figures in the shape of the other methods' rows. `units_per_host` > 1: the
    copies into each rollout host too, from the events (pulls from another host) and from the host's received
    bytes, which should be one version's per version whatever the host's unit count (`weights/plan.py`)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"rlctl-bench-job-{sync}-"))
    logs: list[IO[bytes]] = []
    ok = False
    try:
        job_file = _write_job(workdir, lab, sync=sync, iterations=iterations, units_per_host=units_per_host)
        jd, spec, plan, full_bytes = _prepare(job_file, workdir / "run")
        before = lab.inter_dc_bytes()
        received = {h: lab.received_bytes(h) for h in ROLLOUT_HOSTS}
        t0 = time.perf_counter()
        hosts: dict[str, str] = {}
        procs = _start_agents(lab, jd, spec, plan, logs, hosts)
        controller = procs["controller-0"]
        try:
            code = controller.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RlctlError(f"the job did not finish within {JOB_TIMEOUT_S:.0f} s; see {jd.path}/logs") from None
        seconds = time.perf_counter() - t0
        for p in procs.values():  # the controller told them to stop; they exit on their own
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.terminate()
        crossed = lab.inter_dc_bytes() - before
        received = {h: lab.received_bytes(h) - n for h, n in received.items()}
        if code != 0 or not jd.summary_json.exists():
            raise RlctlError(f"the controller exited with {code}; see {jd.path}/logs/controller-0.log")
        summary = jd.read_json(jd.summary_json)
        rows = per_version(_events(jd.path), hosts)
        ok = True
    finally:
        for f in logs:
            f.close()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
    one_copy = sum(r["bytes_from_trainer"] for r in rows)
    timed = [r for r in rows if "transfer_s" in r and len(r["from_trainer"]) == 1]
    # like the other rows: a full version's bytes over the time it took (a delta can beat the link)
    fractions = [full_bytes / (r["transfer_s"] * inter_goodput) for r in timed]
    wire = [r["bytes_from_trainer"] / (r["transfer_s"] * inter_goodput) for r in timed]
    units = {u for r in rows for u in r["from_trainer"] + r["from_relays"]}
    n_units = len(ROLLOUT_HOSTS) * units_per_host
    every_version = sum(r["bytes_from_trainer"] / len(r["from_trainer"]) for r in rows if r["from_trainer"])
    last = {u: max(r["version"] for r in rows if u in r["from_trainer"] + r["from_relays"]) for u in units}
    return {
        "sync": sync,
        "seconds": seconds,
        "iterations": summary.get("iterations"),
        "versions": len(rows),
        "version_bytes": full_bytes,
        "last_version_wire_bytes": rows[-1]["bytes_from_trainer"] if rows else 0,
        "crossed_bytes": crossed,
        "one_copy_bytes": one_copy,
        "inter_dc_copies": crossed / (one_copy * wire_per_payload) if one_copy else None,
        "copies_per_version_from_events": sum(len(r["from_trainer"]) for r in rows) / max(1, len(rows)),
        "relayed_pulls": sum(len(r["from_relays"]) for r in rows),
        "fraction_of_inter_dc_link": sum(fractions) / len(fractions) if fractions else None,
        "fraction_min_max": [min(fractions), max(fractions)] if fractions else None,
        "wire_fraction_of_inter_dc_link": sum(wire) / len(wire) if wire else None,  # bytes sent / time
        "transfer_time": sorted({r["transfer_time"] for r in timed}),
        "units_on_last_version": sorted(last) == sorted(f"rollout-{i}" for i in range(n_units))
        and set(last.values()) == {iterations},
        "units_per_host": units_per_host,
        # per version, the most copies that entered one rollout host (events), and each host's received bytes
        # over one wire copy of every version pulled (the job's samples and control messages ride along)
        "most_copies_into_a_host": max((max(r["into_host"].values()) for r in rows), default=None),
        "host_received_copies": {h: n / (every_version * wire_per_payload) for h, n in received.items()}
        if every_version
        else None,
        "weightbook_inter_dc": summary.get("weights", {}).get("inter_dc_total"),
        "per_version": rows,
    }
