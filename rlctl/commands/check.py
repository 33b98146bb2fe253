"""`rlctl check INVENTORY...`: validate inventories, show sites and links, optionally probe reachability."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import typer

from rlctl.config import Inventory, load_inventory, load_job
from rlctl.config.base import read_yaml
from rlctl.errors import PartialFailure
from rlctl.launch.preflight import preflight
from rlctl.launch.reach import probe_site
from rlctl.render import OutputFormat, OutputOpt, emit, grid


def inventory_summary(inv: Inventory) -> dict[str, Any]:
    sites = []
    for name, s in inv.sites.items():
        spec = s.spec
        sites.append(
            {
                "name": name,
                "datacenter": s.datacenter,
                "scheduler": s.scheduler.kind,
                "gpu": spec.name,
                "nodes": len(s.hosts),
                "gpus": s.total_gpus,
                "bf16_tflops": spec.bf16_tflops,
                "hbm_gb": spec.hbm_gb,
                "network_gbps": s.network.bandwidth_gbps,
                "rdma": s.network.rdma,
                "cost_per_gpu_hour": s.gpu_cost_per_hour,
            }
        )
    links = [
        {"between": list(link.between), "bandwidth_gbps": link.bandwidth_gbps, "latency_ms": link.latency_ms}
        for link in inv.links
    ]
    return {"files": inv.files, "sites": sites, "links": links}


def _table(d: dict[str, Any]) -> str:
    head = ""
    if "job" in d:
        j = d["job"]
        head = f"Job {j['name']} ({j['file']}): model {j['model']}, task {j['task']}, pipeline {j['mode']}\n\n"
    srows = [
        [
            s["name"],
            s["datacenter"],
            s["scheduler"],
            s["gpu"],
            s["nodes"],
            s["gpus"],
            f"{s['network_gbps']:g} Gbps{' RDMA' if s['rdma'] else ''}",
            f"{s['cost_per_gpu_hour']:.2f}",
        ]
        for s in d["sites"]
    ]
    out = grid(srows, ["site", "datacenter", "scheduler", "gpu", "nodes", "gpus", "network", "cost/gpu-h"], "Sites")
    if d["links"]:
        lrows = [
            [" <-> ".join(link["between"]), f"{link['bandwidth_gbps']:g} Gbps", f"{link['latency_ms']:g} ms"]
            for link in d["links"]
        ]
        out += "\n\n" + grid(lrows, ["link", "bandwidth", "latency"], "Links")
    if "reach" in d:
        rrows = [[r["site"], "ok" if r["ok"] else "FAILED", f"{r['seconds']:.2f}s", r["detail"]] for r in d["reach"]]
        out += "\n\n" + grid(rrows, ["site", "reach", "time", "detail"], "Reachability")
    return head + out


def register(app: typer.Typer) -> None:
    @app.command()
    def check(
        files: Annotated[list[Path], typer.Argument(help="inventory files (clusters/*.yaml) or one job file")],
        reach: Annotated[
            bool, typer.Option("--reach", help="probe every site: local, SSH login, SLURM controller")
        ] = False,
        timeout_s: Annotated[float, typer.Option("--timeout", help="per-site deadline, seconds")] = 10.0,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Validate inventories (or a job and its inventories); print sites, GPUs and links.

        With --reach, probe each site through its scheduler; exit 3 if some site is unreachable.
        """
        job = None
        if len(files) == 1 and read_yaml(files[0]).get("kind") == "Job":
            job = load_job(files[0])
            preflight(job)  # check passing means launch can start it: every field is honoured or refused
            inv = job.inventory
        else:
            inv = load_inventory(files)
        data = inventory_summary(inv)
        if job is not None:
            data["job"] = {
                "name": job.name,
                "file": str(files[0]),
                "mode": job.spec.pipeline.mode,
                "model": job.spec.model.arch.name,
                "task": job.spec.task.kind,
            }
        failed: list[str] = []
        if reach:
            with ThreadPoolExecutor(max_workers=max(1, len(inv.sites))) as pool:
                results = list(pool.map(lambda kv: probe_site(kv[0], kv[1], timeout_s=timeout_s), inv.sites.items()))
            data["reach"] = [r.__dict__ for r in results]
            failed = [r.site for r in results if not r.ok]
        emit(data, output, _table)
        if failed:
            raise PartialFailure(f"unreachable site(s): {', '.join(failed)}")
