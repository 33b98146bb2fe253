"""Staging a model to a remote site of three hosts behind one shaped link, as `rlctl launch` does.

Needs the test services (`make services-up`, root): the namespaced site of tests/services/netsite.sh — three
hosts (sshd each, private /tmp each) in one network namespace, reached from here over a veth pair shaped with
`tc tbf` (100 Mbit/s by default). In the same run:

- `fanout`: a model of two safetensors shards (2 GiB in all; 256 MiB with --quick) plus the job's small files,
  staged by `rlctl.launch.stage.stage_site` (hashing here, preparing each host, the copy, the verification):
  the large files cross the link once, to the first host, and fan out from there (rlctl.launch.fanout).
  `link_over_model` = bytes through the link's tbf queue toward the site ÷ the model's bytes (goal ≤ 1.05);
  `wall_over_ideal` = the staging's wall time ÷ (the model's bytes ÷ the link's tbf rate) (goal ≤ 1.2).
- `ssh_overhead`: link bytes per payload byte of one plain SSH stream to the site (framing); `copies` = link
  bytes ÷ (the job's bytes × ssh_overhead): how many copies of the job crossed.
- `direct`: the same at 256 MiB (128 MiB with --quick) with a site python that lacks rlctl, so the fan-out
  server cannot start and every host's copy crosses the link (what staging did before): its `link_over_model`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rlctl.config.inventory import Site
from rlctl.config.job import load_job
from rlctl.errors import RlctlError
from rlctl.launch import stage, stagecopy
from rlctl.launch.jobdir import JobDir

ROOT = Path(__file__).resolve().parents[1]

SERVICES_ENV = Path(os.environ.get("RLCTL_TEST_SERVICES_ENV", "/tmp/rlctl-test-services.env"))
SHARDS = 2


def _services() -> dict[str, str]:
    if not SERVICES_ENV.exists():
        raise RlctlError(f"{SERVICES_ENV} missing: the namespaced site is down", hint="run `make services-up` as root")
    rows = (line.split("=", 1) for line in SERVICES_ENV.read_text().splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in rows}


def _site(env: dict[str, str], workdir: str, python: str) -> Site:
    return Site.model_validate(
        {
            "datacenter": "dc-b",
            "gpu": "CPU",
            "python": python,
            "nodes": [{"host": h, "gpus": 1} for h in env["RLCTL_TEST_NETSITE_HOSTS"].split(",")],
            "scheduler": {"kind": "ssh", "user": "root", "port": 22, "key_file": env["RLCTL_TEST_SSH_KEY"],
                          "known_hosts": env["RLCTL_TEST_NETSITE_KNOWN_HOSTS"], "workdir": workdir},
        }
    )  # fmt: skip


def _job(d: Path, model_bytes: int) -> None:
    (d / "model" / "init").mkdir(parents=True)
    JobDir(d).write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="jobs/demo.yaml")  # as launch stages it
    fd = os.open(d / "secret", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, secrets.token_hex(32).encode())
    os.close(fd)
    (d / "model" / "init" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    for i in range(SHARDS):
        with (d / "model" / "init" / f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors").open("wb") as f:
            left = model_bytes // SHARDS
            while left:
                n = min(left, 64 << 20)
                f.write(os.urandom(n))
                left -= n


def _tbf(env: dict[str, str]) -> tuple[int, float]:
    """(bytes sent so far, rate in bytes/s) of the link's tbf queue toward the site."""
    out = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", env["RLCTL_TEST_NETSITE_DEV"]],
                         capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    q = next(q for q in json.loads(out.stdout) if q.get("kind") == "tbf")
    return int(q["bytes"]), float(q["options"]["rate"])


def _on_hosts(env: dict[str, str], script: str) -> None:
    for host in env["RLCTL_TEST_NETSITE_HOSTS"].split(","):
        subprocess.run(["ssh", "-i", env["RLCTL_TEST_SSH_KEY"], "-o",
                        f"UserKnownHostsFile={env['RLCTL_TEST_NETSITE_KNOWN_HOSTS']}", "-o", "BatchMode=yes",
                        f"root@{host}", script], capture_output=True, timeout=120, check=False)  # fmt: skip


def _ssh_overhead(env: dict[str, str], nbytes: int = 32 << 20) -> float:
    """Bytes through the link's tbf queue per payload byte of one SSH stream to the site (TCP/IP, Ethernet and
    SSH framing): the yardstick that turns link bytes into copies."""
    host = env["RLCTL_TEST_NETSITE_HOSTS"].split(",")[0]
    sent0 = _tbf(env)[0]
    subprocess.run(["ssh", "-i", env["RLCTL_TEST_SSH_KEY"], "-o",
                    f"UserKnownHostsFile={env['RLCTL_TEST_NETSITE_KNOWN_HOSTS']}", "-o", "BatchMode=yes",
                    f"root@{host}", "cat > /dev/null"], input=os.urandom(nbytes), timeout=120, check=True)  # fmt: skip
    return (_tbf(env)[0] - sent0) / nbytes


def _case(env: dict[str, str], model_bytes: int, python: str, lines: list[str], overhead: float) -> dict[str, Any]:
    workdir = f"/tmp/rlctl-bench-staging/{uuid.uuid4().hex[:12]}"  # each host's private /tmp
    with tempfile.TemporaryDirectory(prefix="rlctl-bench-staging-") as tmp:
        src = Path(tmp) / "job"
        _job(src, model_bytes)
        total = sum(stage.file_state(src / n).size for n in stage.files_to_stage(src))
        try:
            sent0, rate = _tbf(env)
            progress = stagecopy.StagingProgress("gen", lines.append)
            t0 = time.monotonic()
            entry = stage.stage_site("gen", _site(env, workdir, python), src, job_id="job", progress=progress)
            wall = time.monotonic() - t0
            progress.done()
            sent = _tbf(env)[0] - sent0
        finally:
            _on_hosts(env, f"rm -rf {workdir}")
    ideal = model_bytes / rate
    return {
        "model_bytes": model_bytes,
        "job_bytes": total,
        "hosts": len(entry["roots"]),
        "link_rate_bytes_per_s": rate,
        "link_bytes": sent,
        "link_over_model": round(sent / model_bytes, 4),
        "copies": round(sent / (total * overhead), 4),
        "wall_s": round(wall, 2),
        "ideal_s": round(ideal, 2),
        "wall_over_ideal": round(wall / ideal, 3),
        "served_by_seed": entry.get("fanout", {}).get("served_bytes", 0),
        "copied_straight": entry.get("fanout", {}).get("direct", {}),
    }


def run(*, quick: bool) -> dict[str, Any]:
    env = _services()
    logging.basicConfig(level=logging.WARNING)
    lines: list[str] = []
    bare = "/usr/bin/python3"  # no rlctl there: the fan-out server cannot start (checked below)
    if subprocess.run([bare, "-c", "import rlctl"], capture_output=True, cwd="/", check=False).returncode == 0:
        raise RlctlError(f"{bare} imports rlctl: the direct case needs a python without it")
    overhead = _ssh_overhead(env)
    fanout = _case(env, (256 if quick else 2048) << 20, sys.executable, lines, overhead)
    direct = _case(env, (128 if quick else 256) << 20, bare, [], overhead)
    return {
        "ssh_overhead": round(overhead, 4),
        "fanout": fanout,
        "direct": direct,
        "link_over_model": fanout["link_over_model"],
        "wall_over_ideal": fanout["wall_over_ideal"],
        "direct_link_over_model": direct["link_over_model"],
        "progress_lines": lines[-3:],
        "goals": {"link_over_model": 1.05, "wall_over_ideal": 1.2},
    }


def summary(r: dict[str, Any]) -> str:
    f, d = r["fanout"], r["direct"]
    mbit = f["link_rate_bytes_per_s"] * 8 / 1e6
    return (
        f"fan-out: {f['model_bytes'] / 2**30:.2f} GiB to {f['hosts']} hosts over {mbit:.0f} Mbit/s: link bytes / model "
        f"{f['link_over_model']:.3f} (goal ≤ 1.05; an SSH stream's framing alone {r['ssh_overhead']:.3f}: "
        f"{f['copies']:.3f} copies), wall {f['wall_s']:.1f} s / ideal {f['ideal_s']:.1f} s = "
        f"{f['wall_over_ideal']:.3f} (goal ≤ 1.2); seed served {f['served_by_seed'] / 2**30:.2f} GiB in the site\n"
        f"straight to every host (no rlctl on the site), {d['model_bytes'] / 2**20:.0f} MiB: link bytes / model "
        f"{d['link_over_model']:.3f} ({d['copies']:.3f} copies), wall / ideal {d['wall_over_ideal']:.3f}"
    )
