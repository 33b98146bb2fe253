"""The figures an inventory gives hardware: a custom GPU's (`gpu_spec`), a node's (`nodes[]`), a network's or link's
bandwidth and latency; and their bounds, which a new inventory is held to and a job's record (`inventory.RECORDED`) is
not (`_bounded`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticKnownError

from rlctl.config.base import MAX_THREADS, Strict, is_recorded
from rlctl.config.hosts import expand_hostlist, host_problem
from rlctl.hardware import CATALOG


def _bounded(*, ge: float | None = None, le: float | None = None, lt: int | None = None) -> AfterValidator:
    """A figure's bound which a new inventory is held to, and a job's record (`RECORDED`) is not: one launched by
    an rlctl before the bound reads as launched, else `rlctl stop` of the running job, status, pull and a resume all
    refused the job's own sites.json. Said as pydantic says its own bound (`Input should be less than or equal to
    …`)."""

    def check(v: float, info: ValidationInfo) -> float:
        if is_recorded(info):
            return v
        if ge is not None and not v >= ge:
            raise PydanticKnownError("greater_than_equal", {"ge": ge})
        if le is not None and not v <= le:
            raise PydanticKnownError("less_than_equal", {"le": le})
        if lt is not None and not v < lt:
            raise PydanticKnownError("less_than", {"lt": lt})
        return v

    return AfterValidator(check)


# bounds of a custom GPU's figures, past any GPU (B200: 2250 TFLOPS, 192 GB at 8 TB/s, NVLink 1800 GB/s): past them
# a figure is a typo, and the planner's arithmetic on it failed (1e300 TFLOPS made a token's GPU time 0.0, 1e15 GB of
# HBM a KV capacity past 2^63 tokens: `check`, `plan` and `profile` ended in a traceback)
MAX_GPU_TFLOPS = 100_000.0
MAX_GPU_HBM_GB = 100_000.0
MAX_GPU_HBM_TB_PER_S = 10_000.0
MAX_GPU_NVLINK_GB_PER_S = 100_000.0
# and below any (the catalog's CPU core-slot: 0.1 TFLOPS, 0.02 TB/s, 10 GB/s between slots): 1e-300 TFLOPS, TB/s or
# GB/s made plan print times of 300 digits (the last, a tensor-parallel rollout unit's generation time)
MIN_GPU_TFLOPS = 0.001
MIN_GPU_HBM_TB_PER_S = 0.001
MIN_GPU_NVLINK_GB_PER_S = 0.001
# a GPU-hour's price past any, in any currency (an H100 hour: a few dollars, some thousand yen): 1e308 made a plan's
# cost totals inf
MAX_GPU_COST_PER_HOUR = 1_000_000.0
GpuCost = Annotated[
    float,
    Field(gt=0, description=f"at most {MAX_GPU_COST_PER_HOUR:g}"),
    _bounded(le=MAX_GPU_COST_PER_HOUR),
]


class CustomGpu(Strict):
    name: str = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _own_name(cls, v: str, info: ValidationInfo) -> str:
        # a line break or a terminal's ESC ("H20\nX", "\x1b[2J" in a quoted YAML string) broke plan's tables; not in
        # a job's record (`RECORDED`): the name reaches no command line, and the job it names must still stop
        if not is_recorded(info) and (c := next((c for c in v if not c.isprintable()), None)) is not None:
            raise ValueError(
                f"{v!r} has U+{ord(c):04X} (a line break, tab or other control character): give a name of printable "
                "characters on one line, e.g. H20-custom"
            )
        if v in CATALOG:  # 'CPU' made a GPU site's agents compute on the CPU, and asked SLURM for no GPU
            raise ValueError(
                f"{v!r} is a catalog GPU: write gpu: {v} for the catalog's figures, or give custom ones another name"
            )
        return v

    # the bounds below hold a new inventory, not a job's record (`_bounded`)
    bf16_tflops: Annotated[
        float,
        Field(gt=0, description=f"at least {MIN_GPU_TFLOPS:g}, at most {MAX_GPU_TFLOPS:g}"),
        _bounded(ge=MIN_GPU_TFLOPS, le=MAX_GPU_TFLOPS),
    ]
    hbm_gb: Annotated[float, Field(gt=0, description=f"at most {MAX_GPU_HBM_GB:g}"), _bounded(le=MAX_GPU_HBM_GB)]
    hbm_tb_per_s: Annotated[
        float,
        Field(gt=0, description=f"at least {MIN_GPU_HBM_TB_PER_S:g}, at most {MAX_GPU_HBM_TB_PER_S:g}"),
        _bounded(ge=MIN_GPU_HBM_TB_PER_S, le=MAX_GPU_HBM_TB_PER_S),
    ]
    nvlink_gb_per_s: Annotated[
        float,
        Field(gt=0, description=f"at least {MIN_GPU_NVLINK_GB_PER_S:g}, at most {MAX_GPU_NVLINK_GB_PER_S:g}"),
        _bounded(ge=MIN_GPU_NVLINK_GB_PER_S, le=MAX_GPU_NVLINK_GB_PER_S),
    ] = 64.0
    cost_per_hour: GpuCost = 1.0


MAX_GPUS_PER_NODE = 1024  # beyond any host's GPU slots (a `gpu: CPU` site's slots are cores)
MAX_GPUS_PER_SITE = 2**20  # beyond any cluster; launch keeps a record per slot, so a typo must not reach it
# a host's cores and memory past any host's: sbatch got them as --cpus-per-task / --mem-per-cpu (1e30 GB: a
# 31-digit --mem-per-cpu) and refused the job at launch, after staging
MAX_CPUS_PER_NODE = MAX_THREADS
MAX_MEMORY_GB_PER_NODE = 100_000.0  # 100 TB
# the least host memory a GPU slot of a SLURM site may be given: below it a GPU agent (python, torch, CUDA's context)
# cannot start, and sbatch got the slot's share as --mem-per-cpu (0.001 GB: 1 MiB, the agents killed as they start)
MIN_MEMORY_GB_PER_GPU = 1.0


class Node(Strict):
    host: str = Field(min_length=1)
    gpus: Annotated[int, Field(gt=0, le=MAX_GPUS_PER_NODE)] = Field(
        description=f"GPU slots of each host; at most {MAX_GPUS_PER_NODE}"
    )
    # cpus', memory_gb's and devices' bounds hold a new inventory, not a job's record (`_bounded`)
    cpus: Annotated[int, Field(gt=0), _bounded(le=MAX_CPUS_PER_NODE)] | None = Field(
        None,
        description="CPU cores per host: divided among its GPU slots (SLURM's --cpus-per-task, agents' threads); at "
        f"most {MAX_CPUS_PER_NODE}",
    )
    memory_gb: Annotated[float, Field(gt=0), _bounded(le=MAX_MEMORY_GB_PER_NODE)] | None = Field(
        None,
        description="host memory per host (GB): divided among its GPU slots (SLURM's --mem-per-cpu: a slot's memory ÷ "
        "its threads; on a `gpu: CPU` site, the memory a trainer rank's replica must fit); refused on an SSH or "
        f"local GPU site, where nothing reads it; at most {MAX_MEMORY_GB_PER_NODE:g}",
    )
    # a CUDA device id counts a host's GPUs from 0, so one past MAX_GPUS_PER_NODE (as many as a host's slots may be)
    # names no device: 10**9 went into the agent's CUDA_VISIBLE_DEVICES, and it found no GPU only as it started
    devices: list[Annotated[int, Field(ge=0), _bounded(lt=MAX_GPUS_PER_NODE)]] | None = Field(
        None,
        description="the CUDA device id behind each of the host's GPU slots (default: slot i is device i); an id "
        "listed more than once is shared by the agents given those slots — rollout units and a trainer rank may "
        f"share a GPU (e.g. a test machine with one), the trainer's NCCL ranks may not; each below {MAX_GPUS_PER_NODE}",
    )

    @field_validator("host")
    @classmethod
    def _host_pattern(cls, v: str) -> str:
        why = next((w for h in expand_hostlist(v) if (w := host_problem(h)) is not None), None)
        if why is not None:
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _one_device_per_slot(self) -> Node:
        if self.cpus is not None and self.cpus < self.gpus:  # `cpus_per_slot` made it 1: sbatch asked for more
            raise ValueError(  # cores than the node has
                f"cpus: {self.cpus} cores for {self.gpus} GPU slots; cpus counts the host's cores (as nproc does, not "
                "its sockets): at least one per slot"
            )
        if self.devices is not None and len(self.devices) != self.gpus:
            raise ValueError(f"devices lists {len(self.devices)} ids for {self.gpus} GPU slots: give one per slot")
        return self

    def cpus_per_slot(self) -> int | None:
        return None if self.cpus is None else max(1, self.cpus // self.gpus)

    def memory_per_slot_gb(self) -> float | None:
        return None if self.memory_gb is None else self.memory_gb / self.gpus

    def device(self, slot: int) -> int:
        """The CUDA device id of GPU slot `slot` of each of this entry's hosts."""
        return slot if self.devices is None else self.devices[slot]

    @property
    def hosts(self) -> list[str]:
        return expand_hostlist(self.host)


# bounds of what a link or network can be: past them a figure is a typo (1e300 ms printed 300-digit times, and so
# did a bandwidth of 1e-300 Gbit/s: plan's weight sync and iteration times)
MIN_BANDWIDTH_GBPS = 0.001  # 1 Mbit/s
MAX_BANDWIDTH_GBPS = 100_000.0  # 100 Tbit/s
MAX_LATENCY_MS = 60_000.0  # a minute: the transport's own timeouts are shorter
BandwidthGbps = Annotated[
    float,
    Field(
        gt=0,
        le=MAX_BANDWIDTH_GBPS,
        description=f"Gbit/s, at least {MIN_BANDWIDTH_GBPS:g} (1 Mbit/s), at most {MAX_BANDWIDTH_GBPS:g}",
    ),
    _bounded(ge=MIN_BANDWIDTH_GBPS),  # a new inventory's, not a job's record's (f21de19 added it; le was there)
]
