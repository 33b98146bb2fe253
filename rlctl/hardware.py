"""GPU catalog: the specs the cost models need, and relative cost per GPU-hour.

H20 and H800 follow StreamRL Table 1 (BF16 dense TFLOPS, HBM, NVLink, relative price with H20 = 1).
The others are vendor datasheet figures (dense BF16, SXM parts) with costs on the same scale.
`CPU` stands for one core-slot of a CPU-only machine: its figures are rough and are meant to be
replaced by `rlctl profile --source measured`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    bf16_tflops: float
    hbm_gb: float
    hbm_tb_per_s: float
    nvlink_gb_per_s: float
    cost_per_hour: float  # relative units, H20 = 1.00

    @property
    def flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12


CATALOG: dict[str, GpuSpec] = {
    s.name: s
    for s in [
        GpuSpec("H20", 148.0, 96.0, 4.0, 900.0, 1.00),
        GpuSpec("H800", 989.5, 80.0, 3.35, 400.0, 2.85),
        GpuSpec("H100", 989.5, 80.0, 3.35, 900.0, 3.00),
        GpuSpec("H200", 989.5, 141.0, 4.8, 900.0, 3.60),
        GpuSpec("A100", 312.0, 80.0, 2.039, 600.0, 1.60),
        GpuSpec("L40S", 181.0, 48.0, 0.864, 64.0, 0.90),
        GpuSpec("CPU", 0.1, 4.0, 0.02, 10.0, 0.05),
    ]
}


def lookup(name: str) -> GpuSpec:
    """Catalog entry by exact name; callers validate names first (see config.inventory)."""
    return CATALOG[name]
