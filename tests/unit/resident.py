"""The process's resident memory and its peak (Linux's VmRSS and VmHWM, the peak reset by `reset_peak`): what a
memory test reads around the step it measures."""

from __future__ import annotations

from pathlib import Path


def resident_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def peak_resident_mib() -> float:
    """The process's peak resident memory since `reset_peak` (VmHWM)."""
    line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the resident memory now
