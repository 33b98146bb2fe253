"""Test and benchmark harnesses (not shipped in the rlctl package): emulated datacenters on one box.

    lab.py          NetLab: network namespaces as hosts, `tc tbf` as link rates (needs root)
    probe.py        plain-TCP goodput probe between two lab hosts (the benchmarks' yardstick)
    bcast_agent.py  a stand-alone weight-plane process driven over stdin/stdout

Processes started with `NetLab.spawn` run from the repository root, so `python -m bench.netem.…`
resolves there; pytest needs the root on sys.path too (`pythonpath = ["."]`).
"""

from __future__ import annotations

from bench.netem.lab import Host, LabSpec, NetLab, NetLabError, cleanup_stale

__all__ = ["Host", "LabSpec", "NetLab", "NetLabError", "cleanup_stale"]
