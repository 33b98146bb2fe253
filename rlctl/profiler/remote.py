"""Run the probe on a SLURM or SSH site through its launch backend and collect its result.

The probe writes its result and its log on the site (sites share no filesystem with the operator):
in the site's work root, `<site workdir>/jobs/profile-<site>/` (the operator's work directory itself on a
local site or a SLURM site submitted from here, see rlctl.launch.sitefs); both are read back through
the site into the operator's work directory. An HF checkpoint is copied there first (`model/`) when the
site's files are remote. Every start is recorded in <workdir>/agents.jsonl. A probe that exits 2 (a
usage error on the site, e.g. vLLM not installed there, or fewer cores than a megatron split's ranks) is a
usage error here too. The probe starts a split's ranks itself, as its children, so they run where it runs
whatever the backend; on SLURM it asks for a CPU per rank.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rlctl.buildid import code_digest
from rlctl.config.inventory import Site
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.agentenv import BASE_ENV, ENV_CODE, ENV_VISIBLE
from rlctl.launch.backends import Backends, kind_of, python_for, record_agent
from rlctl.launch.base import AgentSpec, Resources
from rlctl.launch.sitefs import HostFiles, access_hosts, host_files, is_remote, site_root
from rlctl.profiler.probe import ProbeSpec

POLL_S = 0.5


def stage_checkpoint(fs: HostFiles, checkpoint: Path, root: str) -> str:
    """Copy the checkpoint directory's files to `<root>/model` on the site; that directory."""
    (model_dir,) = fs.make_dirs([f"{root}/model"])
    for f in sorted(p for p in checkpoint.iterdir() if p.is_file()):
        fs.put(f, f"{model_dir}/{f.name}")
    return model_dir


def measure_on_site(
    name: str, site: Site, spec: ProbeSpec, *, workdir: Path, timeout_s: float = 900.0
) -> dict[str, Any]:
    """The probe's result (see probe.measure_here) from a run on the site's first host."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    out, log_path = workdir / f"{name}.probe.json", workdir / f"{name}.probe.log"
    out.unlink(missing_ok=True)
    fs = host_files(site, access_hosts(site)[0])  # an SSH site's probe runs on its first host (replica 0)
    backends = Backends({name: site}, job=f"profile-{name}", job_dir=workdir)
    try:
        root = fs.make_dirs([site_root(site, f"profile-{name}", here=workdir)])[0]
        site_out, site_log = f"{root}/{out.name}", f"{root}/{log_path.name}"
        if spec.checkpoint is not None:  # the probe reads the checkpoint on the site
            where = Path(spec.checkpoint).resolve()
            spec = dataclasses.replace(
                spec, checkpoint=stage_checkpoint(fs, where, root) if is_remote(site) else str(where)
            )
        argv = [python_for(site), "-m", "rlctl.profiler.probe", *spec.argv(), "--out", site_out]
        # a megatron split's ranks are the probe's children, a core each: SLURM gives the probe that many
        cores = spec.split[0] * spec.split[1] if spec.split else 1
        gpus = 1 if spec.device == "cuda" else 0  # the site's first GPU (SLURM binds one; an SSH host's device 0)
        # measuring on the CPU, none at all, as the launcher tells a CPU site's agents (rlctl.launch.spawn)
        visible = {ENV_VISIBLE: "0"} if gpus and kind_of(site).slices_gpus else {} if gpus else {ENV_VISIBLE: ""}
        env = dict(BASE_ENV) | visible | {ENV_CODE: code_digest()}  # a probe of other rlctl code refuses to measure
        resources = Resources(cpus_per_task=cores, gpus_per_task=gpus)
        agent = AgentSpec("profile", 0, name, argv, env, Path(site_log), resources=resources)
        backend = backends.for_site(name)
        handle = backend.start(agent)
        record_agent(workdir, handle)
        deadline = time.monotonic() + timeout_s
        try:
            while (code := backend.poll(handle)) is None:
                if time.monotonic() > deadline:
                    raise RlctlError(f"site {name!r}: the profiling run took over {timeout_s:.0f} s; stopped it")
                time.sleep(POLL_S)
        except BaseException:  # timeout, Ctrl-C, a lost site: leave nothing running there
            backend.stop([handle], grace_s=5.0)
            raise
        for site_path, here in ((site_out, out), (site_log, log_path)):  # bring result and log here
            text = fs.read_text(site_path)
            if text is not None and Path(site_path) != here:
                here.write_text(text)
    finally:
        backends.close()
        fs.close()
    if code != 0 or not out.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:] if log_path.exists() else []
        if code == 2 and tail:  # the probe refused its inputs (e.g. vLLM missing on the site): one line
            raise UsageError(f"site {name!r}: {tail[-1].removeprefix('rlctl profile probe: ')}")
        raise RlctlError(
            f"site {name!r}: the profiling run exited {code} without a result ({' | '.join(tail) or 'no log'})",
            hint=f"its log: {log_path}",
        )
    result: dict[str, Any] = json.loads(out.read_text())
    return result
