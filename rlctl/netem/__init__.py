"""Network emulation for tests and benchmarks: namespaces as hosts in emulated datacenters."""

from __future__ import annotations

from rlctl.netem.lab import Host, LabSpec, NetLab, NetLabError, cleanup_stale

__all__ = ["Host", "LabSpec", "NetLab", "NetLabError", "cleanup_stale"]
