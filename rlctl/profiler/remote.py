"""Run the generation probe on a SLURM or SSH site through its launch backend and collect the entry.

The work directory must be on storage the site's hosts share with the operator (as a job directory
is): the probe writes its result and its log there. Every start is recorded in <workdir>/agents.jsonl.
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
    argv = [python_for(site), "-m", "rlctl.profiler.probe", "--model", arch.name]
    argv += ["--kv-capacity-tokens", str(kv_capacity_tokens), "--out", str(out)]
    spec = AgentSpec("profile", 0, name, argv, dict(BASE_ENV), log_path)
    backends = Backends({name: site}, job=f"profile-{name}", job_dir=workdir)
    backend = backends.for_site(name)
    try:
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
    finally:
        backends.close()
    if code != 0 or not out.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:] if log_path.exists() else []
        raise RlctlError(
            f"site {name!r}: the profiling run exited {code} without a result ({' | '.join(tail) or 'no log'})",
            hint=f"its log: {log_path}; the work directory must be on storage the site's hosts share",
        )
    return GenerationEntry.model_validate(json.loads(out.read_text())["generation"])
