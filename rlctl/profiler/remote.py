"""Run the generation probe on a SLURM or SSH site through its launch backend and collect the entry.

The probe writes its result and its log on the site (sites share no filesystem with the operator):
in the site's work root, `<site workdir>/jobs/profile-<site>/` (the operator's work directory itself on a
local site or a SLURM site submitted from here, see rlctl.launch.sitefs); both are read back through
the site into the operator's work directory. Every start is recorded in <workdir>/agents.jsonl.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlctl.config.inventory import Site
from rlctl.errors import RlctlError
from rlctl.launch.agentenv import BASE_ENV
from rlctl.launch.backends import Backends, record_agent
from rlctl.launch.base import AgentSpec
from rlctl.launch.sitefs import access_hosts, host_files, site_root
from rlctl.launch.spawn import python_for
from rlctl.modelcatalog import ModelArch
from rlctl.profiler.profile import GenerationEntry

POLL_S = 0.5


def measure_on_site(
    name: str, site: Site, arch: ModelArch, *, kv_capacity_tokens: int, workdir: Path, timeout_s: float = 900.0
) -> GenerationEntry:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    out, log_path = workdir / f"{name}.generation.json", workdir / f"{name}.probe.log"
    out.unlink(missing_ok=True)
    fs = host_files(site, access_hosts(site)[0])  # an SSH site's probe runs on its first host (replica 0)
    backends = Backends({name: site}, job=f"profile-{name}", job_dir=workdir)
    try:
        root = fs.make_dirs([site_root(site, f"profile-{name}", here=workdir)])[0]
        site_out, site_log = f"{root}/{out.name}", f"{root}/{log_path.name}"
        argv = [python_for(site), "-m", "rlctl.profiler.probe", "--model", arch.name]
        argv += ["--kv-capacity-tokens", str(kv_capacity_tokens), "--out", site_out]
        spec = AgentSpec("profile", 0, name, argv, dict(BASE_ENV), Path(site_log))
        backend = backends.for_site(name)
        handle = backend.start(spec)
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
        raise RlctlError(
            f"site {name!r}: the profiling run exited {code} without a result ({' | '.join(tail) or 'no log'})",
            hint=f"its log: {log_path}",
        )
    return GenerationEntry.model_validate(json.loads(out.read_text())["generation"])
