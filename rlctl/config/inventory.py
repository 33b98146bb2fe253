"""Inventory files (`clusters/*.yaml`, kind: Inventory): sites, their nodes and GPUs, and links.

    apiVersion: rlctl/v1
    kind: Inventory
    sites:
      h20:                         # site name, unique across all loaded files
        datacenter: dc-b
        scheduler: {kind: ssh, user: rl, port: 22, key_file: ~/.ssh/id_ed25519}
        gpu: H20                   # catalog name, or gpu_spec: {...} for custom hardware
        nodes: [{host: "h20-[01-04]", gpus: 8}]   # local/ssh agents get CUDA_VISIBLE_DEVICES slices of these
        network: {bandwidth_gbps: 100, rdma: false}
    links:
      - {between: [h800, h20], bandwidth_gbps: 80, latency_ms: 2}

Several files are merged (sites must not repeat); links are checked against the merged sites.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlctl.config.base import NAME_RE, ListenHost, Strict, check_header, is_recorded, read_yaml, validate
from rlctl.config.hardware import (
    MAX_GPUS_PER_SITE,
    MAX_LATENCY_MS,
    MIN_MEMORY_GB_PER_GPU,
    BandwidthGbps,
    CustomGpu,
    GpuCost,
    Node,
)
from rlctl.config.hosts import loopback, same_host
from rlctl.config.schedulers import Scheduler, SlurmScheduler
from rlctl.errors import ConfigError
from rlctl.hardware import CATALOG, GpuSpec
from rlctl.textutil import did_you_mean, one_of

RECORDED = {"recorded": True}  # the validation context of a job's own record (its sites.json, its job.json)


class Network(Strict):
    bandwidth_gbps: BandwidthGbps
    rdma: bool = Field(
        False,
        description="the hosts have RDMA (InfiniBand/RoCE) for the job's traffic: with transport ucx, agents on a site "
        "without it leave it out of UCX (UCX_TLS=^ib unless UCX_TLS is set) and `check --reach` looks for its devices",
    )
    listen_host: ListenHost | None = Field(
        None,
        description="address this site's agents bind and advertise to peers on other sites: an IP or "
        "hostname of its hosts, or `auto` (the interface that routes toward the controller); "
        "default: the job's transport.listen_host",
    )


class Site(Strict):
    datacenter: str = Field(min_length=1)
    scheduler: Scheduler
    gpu: str | None = None
    gpu_spec: CustomGpu | None = None
    nodes: list[Node] = Field(
        min_length=1,
        description=f"at most {MAX_GPUS_PER_SITE} GPU slots in all; on a SLURM site, the nodes of its partition "
        "(SLURM chooses among them; `check --reach` compares them with sinfo's)",
    )
    network: Network = Network(bandwidth_gbps=10.0)
    cost_per_gpu_hour: GpuCost | None = None
    python: str | None = Field(
        None,
        min_length=1,
        description="the interpreter that runs rlctl on the site's hosts (e.g. a virtualenv's bin/python); default: "
        "python3 on SSH sites and SLURM sites with a submit_host, this interpreter on local sites and SLURM sites "
        "submitted from here (a filesystem shared with the nodes)",
    )
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run before every agent on the site's hosts (e.g. `module load cuda/12.4`, "
        "`source /opt/rl/venv/bin/activate`); SSH and SLURM sites",
    )

    @field_validator("python")
    @classmethod
    def _python_where_it_starts(cls, v: str | None) -> str | None:
        """A command name (looked up in the host's PATH) or an absolute path: the agents' command lines quote it,
        so a leading `~` is never expanded there (the probe, then every agent, failed with 'No such file or
        directory' on a file that is there), and a relative path depends on the directory each command starts in."""
        if v is not None and any(c.isspace() for c in v):  # quoted as one word: "No such file" on every host
            raise ValueError(
                f"{v!r}: give the interpreter alone, without arguments (the agents' command lines quote it as one "
                "word); set environment variables in the site's setup lines"
            )
        if v is not None and "/" in v and not v.startswith("/"):
            raise ValueError(
                f"{v!r}: give the interpreter's absolute path or a command name such as python3 (the agents' "
                "command lines quote it: a leading ~ is not expanded there, a relative path depends on where each "
                "starts)"
            )
        return v

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | None) -> str | None:
        if v is not None and v not in CATALOG:
            raise ValueError(f"unknown GPU {v!r}; known: {one_of(CATALOG)}{did_you_mean(v, CATALOG)}")
        return v

    @model_validator(mode="after")
    def _one_gpu_source(self, info: ValidationInfo) -> Site:
        if (self.gpu is None) == (self.gpu_spec is None):
            raise ValueError("give exactly one of 'gpu' (catalog name) or 'gpu_spec' (custom specs)")
        if self.setup and self.scheduler.kind == "local":
            raise ValueError("setup: a local site's agents run in this environment: activate it before rlctl")
        slots = sum(len(n.hosts) * n.gpus for n in self.nodes)
        if slots > MAX_GPUS_PER_SITE:
            raise ValueError(f"nodes: {slots} GPU slots in all (hosts × gpus); at most {MAX_GPUS_PER_SITE} on one site")
        # same_host key → the host as first written; in a job's record (`RECORDED`) the host as written, as an rlctl
        # before 859994e told hosts apart: one launched so stops as launched (each agent where it was started)
        key = (lambda h: h) if is_recorded(info) else same_host
        seen: dict[str, str] = {}
        for i, n in enumerate(self.nodes):
            for host in n.hosts:
                first = seen.get(key(host))
                if first is not None:  # its slots would be counted, placed and staged twice
                    also = "" if first == host else f" (as {first} too: one host, however it is spelt)"
                    raise ValueError(
                        f"nodes[{i}]: host {host} is listed twice{also}; list each host once, with all its GPUs"
                    )
                seen[key(host)] = host
        if self.scheduler.kind == "slurm" and any(n.devices is not None for n in self.nodes):
            raise ValueError(
                "nodes[].devices: SLURM binds each task's GPUs itself (CUDA_VISIBLE_DEVICES); devices maps the "
                "GPU slots of local and SSH sites: remove it"
            )
        return self

    @model_validator(mode="after")
    def _one_price(self, info: ValidationInfo) -> Site:
        """A GPU-hour's price is the site's `cost_per_gpu_hour`, else its GPU's (`gpu_cost_per_hour`): a custom GPU's
        `cost_per_hour` beside the site's was read by nothing (the plan's costs and its cheaper-site order took the
        site's). Not in a job's record (`RECORDED`): its sites.json writes the custom GPU's default price too."""
        g = self.gpu_spec
        if g is None or self.cost_per_gpu_hour is None or "cost_per_hour" not in g.model_fields_set:
            return self
        if is_recorded(info):
            return self
        raise ValueError(
            f"gpu_spec.cost_per_hour: {g.cost_per_hour:g} is read only where the site sets no cost_per_gpu_hour, and "
            f"this one sets {self.cost_per_gpu_hour:g} (the price the plan takes): give the price once, in one of them"
        )

    @model_validator(mode="after")
    def _no_devices_on_a_cpu_site(self, info: ValidationInfo) -> Site:
        """A `gpu: CPU` site's slots are cores and its agents see no CUDA device (CUDA_VISIBLE_DEVICES '':
        rlctl.launch.spawn): `devices` was read by nothing there. Not in a job's record (`RECORDED`)."""
        recorded = is_recorded(info)
        if self.gpu == "CPU" and any(n.devices is not None for n in self.nodes) and not recorded:
            raise ValueError(
                "nodes[].devices: the site's gpu is CPU: its slots are cores and its agents use no CUDA device "
                "(devices maps the GPU slots of local and SSH GPU sites): remove it"
            )
        return self

    @model_validator(mode="after")
    def _no_memory_on_an_unscheduled_gpu_site(self, info: ValidationInfo) -> Site:
        """`memory_gb` is read by SLURM sites (--mem-per-cpu) and `gpu: CPU` sites (the memory a slot's agents must
        fit, `rlctl check`); an SSH or local GPU site's agents ask no scheduler for memory and check weighs their
        GPU's, so it was read by nothing there (clusters/h20-rollout.yaml set it). Not in a job's record
        (`RECORDED`)."""
        recorded = is_recorded(info)
        if self.scheduler.kind == "slurm" or self.spec.name == "CPU" or recorded:
            return self
        if any(n.memory_gb is not None for n in self.nodes):
            raise ValueError(
                f"nodes[].memory_gb: read on SLURM sites (--mem-per-cpu) and gpu: CPU sites only; this "
                f"{self.scheduler.kind} site's agents ask no scheduler for memory and `rlctl check` measures them "
                f"against their {self.spec.name}'s memory: remove it"
            )
        return self

    @model_validator(mode="after")
    def _host_memory_for_each_gpu(self, info: ValidationInfo) -> Site:
        """A GPU site's node gives each GPU slot at least MIN_MEMORY_GB_PER_GPU of host memory: less is a typo (2 TB
        written in TB), and SLURM was asked it per slot. Not on a `gpu: CPU` site (its slots are cores, and check
        weighs its slots' memory), nor in a job's record (`RECORDED`)."""
        if self.spec.name == "CPU" or is_recorded(info):
            return self
        for i, n in enumerate(self.nodes):
            if n.memory_gb is not None and n.memory_gb < MIN_MEMORY_GB_PER_GPU * n.gpus:
                raise ValueError(
                    f"nodes[{i}].memory_gb: {n.memory_gb:g} GB for {n.gpus} GPU slots; give the host's whole memory "
                    f"in GB (10^9 bytes), at least {MIN_MEMORY_GB_PER_GPU:g} per GPU slot "
                    f"({MIN_MEMORY_GB_PER_GPU * n.gpus:g} here), e.g. 2048 for 2 TB"
                )
        return self

    @model_validator(mode="after")
    def _no_gpus_asked_of_a_cpu_site(self, info: ValidationInfo) -> Site:
        """`gpu: CPU` never asks SLURM for a GPU (docs/launch.md): its slots are cores and its agents compute on the
        CPU. An explicit per_task / gres asked for as many GPUs as the site has cores, and the jobs waited for
        them (for ever on nodes without any). Not in a job's record (`RECORDED`): one launched so stops as launched."""
        sched = self.scheduler
        if not isinstance(sched, SlurmScheduler) or sched.gpu_request not in ("per_task", "gres"):
            return self
        if self.spec.name == "CPU" and not is_recorded(info):
            raise ValueError(
                f"scheduler.gpu_request: {sched.gpu_request!r} asks SLURM for GPUs, and the site's gpu is CPU (its "
                "slots are cores, its agents compute on the CPU): its jobs would wait for GPUs they never use; "
                "use 'auto' or 'none'"
            )
        return self

    @property
    def spec(self) -> GpuSpec:
        if self.gpu_spec is not None:
            g = self.gpu_spec
            return GpuSpec(g.name, g.bf16_tflops, g.hbm_gb, g.hbm_tb_per_s, g.nvlink_gb_per_s, g.cost_per_hour)
        assert self.gpu is not None
        return CATALOG[self.gpu]

    @property
    def gpu_cost_per_hour(self) -> float:
        return self.cost_per_gpu_hour if self.cost_per_gpu_hour is not None else self.spec.cost_per_hour

    @property
    def hosts(self) -> list[tuple[str, int]]:
        return [(h, n.gpus) for n in self.nodes for h in n.hosts]

    @property
    def total_gpus(self) -> int:
        return sum(g for _, g in self.hosts)

    def cpus_per_slot(self) -> int | None:
        """The fewest CPU cores a GPU slot of the site gets (its nodes' `cpus` ÷ `gpus`), None when not given."""
        given = [c for n in self.nodes if (c := n.cpus_per_slot()) is not None]
        return min(given) if given else None

    def memory_per_slot_gb(self) -> float | None:
        """The least host memory a GPU slot of the site gets (its nodes' `memory_gb` ÷ `gpus`), None when not given."""
        given = [m for n in self.nodes if (m := n.memory_per_slot_gb()) is not None]
        return min(given) if given else None

    def devices_of(self, host: str, slots: tuple[int, ...]) -> tuple[int, ...]:
        """The CUDA device ids behind GPU slots `slots` of `host` (its node's `devices`, or the slots themselves)."""
        node = next((n for n in self.nodes if host in n.hosts), None)
        return slots if node is None else tuple(node.device(s) for s in slots)

    def cores_of(self, host: str, slots: tuple[int, ...]) -> tuple[int, ...] | None:
        """The CPU core ids of `host` behind GPU slots `slots`: slot s has its node's cores s·k … s·k + k − 1 (k its
        `cpus_per_slot`), so agents of disjoint slots get disjoint cores; None where the node gives no `cpus`."""
        node = next((n for n in self.nodes if host in n.hosts), None)
        if node is None or (per := node.cpus_per_slot()) is None:
            return None
        return tuple(c for s in slots for c in range(s * per, (s + 1) * per))

    @property
    def gpus_per_node(self) -> int:
        return max(g for _, g in self.hosts)


class Link(Strict):
    between: tuple[str, str]
    bandwidth_gbps: BandwidthGbps
    latency_ms: Annotated[float, Field(ge=0, le=MAX_LATENCY_MS, description=f"at most {MAX_LATENCY_MS:g}")] = 1.0

    @field_validator("between")
    @classmethod
    def _two_sites(cls, v: tuple[str, str]) -> tuple[str, str]:
        if v[0] == v[1]:
            raise ValueError(f"a link joins two different sites, got {v[0]!r} twice")
        return v


class InventoryFile(Strict):
    api_version: str = Field(alias="apiVersion")
    kind: Literal["Inventory"]
    sites: dict[Annotated[str, Field(pattern=NAME_RE)], Site] = Field(default_factory=dict)
    links: list[Link] = Field(default_factory=list)


class Inventory:
    """Sites and links merged from one or more inventory files; `origin`: the file that declares each site."""

    def __init__(
        self, sites: dict[str, Site], links: list[Link], files: list[str], origin: dict[str, str] | None = None
    ) -> None:
        self.sites = sites
        self.links = links
        self.files = files
        self.origin = origin if origin is not None else {name: ", ".join(files) for name in sites}

    def link(self, a: str, b: str) -> Link | None:
        for link in self.links:
            if set(link.between) == {a, b}:
                return link
        return None

    def links_among(self, sites: Iterable[str]) -> list[Link]:
        """The declared links that count for a job on `sites` (its controller's, trainer's and rollout sites): those
        whose two sites' datacenters both hold a site of the job. A link is physically between datacenters, and an
        inventory often declares a datacenter's uplink from one of its sites: a link a2–r joins the datacenters of
        a2 and r for a job on t (a2's datacenter) and r, whether or not it uses a2, versus (2026-12-06) only links
        both of whose sites the job used, which refused such a job. The planner and `rlctl check` price the
        weights' route over them (`planner.weightsync.weight_route`), and `dc_links_among` picks each pair of
        datacenters' link from them, the pairs the job dir records and the weight plane routes over."""
        dcs = {self.sites[s].datacenter for s in sites}
        return [ln for ln in self.links if {self.sites[s].datacenter for s in ln.between} <= dcs]

    def dc_links_among(self, sites: Iterable[str]) -> dict[frozenset[str], Link]:
        """Each pair of datacenters that the links counting for a job on `sites` join (`links_among`), with the link
        a copy crossing between them is priced over: of two such links between the same two datacenters that
        disagree, the fastest (the first declared of equals), as the weight plane sends one copy per pair of
        datacenters and not over a link of its choosing; a link declared between the two sites themselves is taken
        before it (`weight_route`). The one function behind the planner's route, `rlctl check`'s, the datacenter
        pairs `ops.jobprep` records in plan.json (`dc_links`) and the weight plane's tree over them."""
        out: dict[frozenset[str], Link] = {}
        for ln in self.links_among(sites):
            key = frozenset(self.sites[s].datacenter for s in ln.between)
            if len(key) == 2 and (key not in out or ln.bandwidth_gbps > out[key].bandwidth_gbps):
                out[key] = ln
        return out

    def site(self, name: str) -> Site:
        return self.sites[name]


def given_once(paths: list[Path]) -> None:
    """ConfigError for a file named twice (`rlctl check a.yaml ./a.yaml`), whose sites were otherwise said to be
    defined twice, there or 'in another file'."""
    for i, path in enumerate(paths):
        if path.resolve() in (p.resolve() for p in paths[:i]):
            raise ConfigError(str(path), None, "given twice; name each inventory file once")


def load_inventory(paths: list[Path]) -> Inventory:
    sites: dict[str, Site] = {}
    origin: dict[str, str] = {}
    links: list[tuple[str, int, Link]] = []
    given_once(paths)
    for path in paths:
        data = read_yaml(path)
        check_header(path, data, "Inventory")
        inv = validate(path, data, InventoryFile)
        for name, site in inv.sites.items():
            if name in sites:
                raise ConfigError(str(path), f"sites.{name}", f"duplicate site name; already defined in {origin[name]}")
            sites[name] = site
            origin[name] = str(path)
        links.extend((str(path), i, link) for i, link in enumerate(inv.links))
    if not sites:
        raise ConfigError(", ".join(map(str, paths)), "sites", "no site defined; an inventory needs at least one site")
    _no_device_twice(sites, origin)
    seen: set[frozenset[str]] = set()
    for file, i, link in links:
        for j, end in enumerate(link.between):
            in_dc = [name for name, site in sites.items() if site.datacenter == end]
            if end not in sites and in_dc:  # the hint to load another file sent the operator looking for one
                raise ConfigError(
                    file,
                    f"links[{i}].between[{j}]",
                    f"{end!r} is a datacenter (of site {', '.join(in_dc)}); a link joins two sites: name its site",
                )
            if end not in sites:
                raise ConfigError(
                    file,
                    f"links[{i}].between[{j}]",
                    f"unknown site {end!r}; known: {one_of(sites)}{did_you_mean(end, sites)}",
                    hint="load the inventory file that declares it too",
                )
        key = frozenset(link.between)
        if key in seen:
            raise ConfigError(
                file, f"links[{i}]", f"duplicate link between {link.between[0]!r} and {link.between[1]!r}"
            )
        seen.add(key)
    return Inventory(sites, [link for _, _, link in links], [str(p) for p in paths], origin)


def _machine(host: str) -> str:
    """An SSH site's host as `_no_device_twice` tells machines apart: localhost, a loopback address (127.0.0.0/8,
    ::1, however written) or this machine's name is this machine, as a local site's nodes are (no lookup: a name
    that resolves here is still told apart)."""
    key = same_host(host)
    if key == same_host(socket.gethostname()) or loopback(key):
        return "this machine"
    return key


def _no_device_twice(sites: dict[str, Site], origin: dict[str, str]) -> None:
    """Two local or SSH sites may split one host's GPUs (`devices`), not both place agents on one GPU: each
    would count it, and the trainer's NCCL ranks may not share one. Every local site's agents run on this machine,
    whatever its nodes call it (localhost, 127.0.0.1, its name). SLURM sites may overlap (SLURM allocates);
    `gpu: CPU` sites' slots are cores, not devices."""
    held: dict[tuple[str, int], str] = {}  # (host, device) → the site that lists it
    for name, site in sites.items():
        if site.scheduler.kind == "slurm" or site.spec.name == "CPU":
            continue
        for n in site.nodes:
            machines = [_machine(h) for h in n.hosts]
            if site.scheduler.kind == "local":  # this machine, and the names its nodes give it (an SSH site's
                machines = ["this machine", *(m for m in machines if m != "this machine")]  # 10.0.0.5, its FQDN)
            for host in machines:
                for device in sorted({n.device(slot) for slot in range(n.gpus)}):
                    other = held.setdefault((host, device), name)
                    if other != name:
                        raise ConfigError(
                            origin[name],
                            f"sites.{name}.nodes",
                            f"GPU {device} of {host} is listed by site {other!r} too; give each site its own GPUs of "
                            "a host (nodes[].devices)",
                        )
