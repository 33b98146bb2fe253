"""What torch.compile's inductor needs on a host to compile the embedded engine's decode step (`rollout.compile`):
on a CPU a C++ compiler (inductor's `cpp.cxx`: $CXX, else g++), on a CUDA GPU triton and the C compiler triton builds
its launchers with ($CC, else gcc, else clang). Without them the step fails as it first compiles, at each unit's
first decode step. Asked here (`rlctl check` of a local site, a unit as it starts) and on a site's hosts by the
site probe (`rlctl.launch.siteprobe.PROBE` gathers the same facts)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any


def compile_tools(
    environ: Mapping[str, str] | None = None, *, which: Callable[[str], str | None] = shutil.which
) -> dict[str, Any]:
    """This host's: `cxx` (the C++ compiler's path, or None), `cc` (triton's C compiler, or None), `triton`."""
    env = os.environ if environ is None else environ
    cc = next((p for c in (env.get("CC"), "gcc", "clang") if c and (p := which(c))), None)
    return {"cxx": which(env.get("CXX") or "g++"), "cc": cc, "triton": importlib.util.find_spec("triton") is not None}


def compile_tools_problem(facts: Mapping[str, Any], *, gpu: bool, there: str = "there") -> str | None:
    """What a host with `facts` (`compile_tools`'s, or the site probe's) lacks to compile the step on a CUDA GPU
    (`gpu`) or a CPU, and how to install it `there`; None where it lacks nothing, or the facts do not say (an older
    probe)."""
    if gpu:
        needs = [
            ("triton", "triton", "pip install triton"),
            ("cc", "a C compiler ($CC, gcc or clang)", "apt install gcc"),
        ]
        where = "a CUDA GPU"
    else:
        needs = [("cxx", "a C++ compiler ($CXX, else g++)", "apt install g++")]
        where = "a CPU"
    lacking = [(what, how) for key, what, how in needs if key in facts and not facts[key]]
    if not lacking:
        return None
    return (
        f"torch.compile on {where} needs {' and '.join(w for w, _ in lacking)}, which it lacks: "
        f"{' and '.join(h for _, h in lacking)} {there}, or set rollout.compile: false"
    )
