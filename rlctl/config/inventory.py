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

import contextlib
import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import hostlist
from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticKnownError

from rlctl.config.base import (
    MAX_THREADS,
    NAME_RE,
    ListenHost,
    Strict,
    check_header,
    is_recorded,
    read_yaml,
    register_tags,
    validate,
)
from rlctl.errors import ConfigError
from rlctl.hardware import CATALOG, GpuSpec
from rlctl.textutil import did_you_mean, home_expanded, one_of


def expand_hostlist(pattern: str) -> list[str]:
    """A SLURM hostlist (`h20-[01-04]`, `sitea-[1-2],siteb-[01,03-04]`, `r[1-2]n[1-2]`) as host names, in order,
    zero padding kept (python-hostlist, the syntax `scontrol show hostnames` reads). ValueError naming the list
    and what is wrong with it."""
    if not pattern or any(c.isspace() for c in pattern):
        raise ValueError(f"bad hostlist {pattern!r}: {'empty' if not pattern else 'contains whitespace'}")
    try:
        return [str(h) for h in hostlist.expand_hostlist(pattern)]
    except hostlist.BadHostlist as e:
        raise ValueError(f"bad hostlist {pattern!r}: {e}; e.g. 'node-[01-16]' or 'a-[1-2],b-7'") from e


_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")  # a host name, IPv4 or IPv6 address (no shell syntax)


def same_host(host: str) -> str:
    """What two spellings of one host share: DNS names ignore case (`H20-01` is `h20-01`) and one trailing dot (the
    root: `h20-01.` is `h20-01`), an IPv6 address has one compressed form (`2001:DB8:0::5` is `2001:db8::5`), an IPv4
    address its dotted quad (`127.1` is `127.0.0.1`, as inet_aton, and so ssh and getaddrinfo, read it)."""
    name = host.lower().removesuffix(".")
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        pass
    if re.fullmatch(r"[0-9a-fx.]+", name):  # (inet_aton takes what follows a space as well: no space here)
        with contextlib.suppress(OSError):
            return socket.inet_ntoa(socket.inet_aton(name))
    return name


def host_problem(host: str) -> str | None:
    """Why `host` is not a host name or address (it reaches ssh command lines, sbatch and the agents' addresses),
    None when it is. A ':' belongs to an IPv6 address only: `login:2222` is a port, which fabric refused at connect
    with a ValueError (the scheduler's port says it)."""
    if _HOST_NAME.fullmatch(host) and ":" not in host:
        return None
    try:
        ipaddress.IPv6Address(host)
        return None
    except ValueError:
        pass
    return (
        f"{host!r} is not a host name or address (letters, digits, '-', '_', '.', or an IP address); a user or a "
        "port goes in the scheduler's user / port (a SLURM submit host's ssh_user / ssh_port)"
    )


def jump_host_parts(spec: str) -> tuple[str, str, str | None]:
    """A `proxy_jump: [user@]host[:port]` as ssh -J reads it: (user, '' for none; host; port as written, None for
    none). An IPv6 address with a port goes in brackets (`[fd00::1]:2222`); bare, it has none (`fd00::1`).
    ValueError for a '[' with no ']' or anything but ':port' after it."""
    user, _, rest = spec.rpartition("@")
    if rest.startswith("["):
        host, closed, after = rest[1:].partition("]")
        if not closed or (after and not after.startswith(":")):
            raise ValueError(f"{rest!r}: write an IPv6 address with a port as [address]:port, e.g. [fd00::1]:2222")
        return user, host, after[1:] if after else None
    if rest.count(":") == 1:  # host:port (not a bare IPv6 address)
        host, _, port = rest.partition(":")
        return user, host, port
    return user, rest, None


WORKDIR_HELP = (
    "work root on the site: a job's files there are <workdir>/jobs/<job id>/ (staged by `launch`, logs, "
    "checkpoints); default: ssh and a SLURM submit_host ~/.rlctl, local and SLURM submitted from here the "
    "operator's job directory itself"
)


def _work_root(v: str | None) -> str | None:
    """Only `~` and `~/…` are the site user's home: remote shells get the path quoted (`sh_path`), so `~alice/w`
    was made as a directory named `~alice` in the home of the user rlctl logs in as."""
    if v is not None and v.startswith("~") and v != "~" and not v.startswith("~/"):
        raise ValueError(
            f"{v!r}: only a leading '~/' is expanded (the home of the user rlctl logs in as); give another user's "
            "directory as an absolute path, e.g. /home/alice/rlctl"
        )
    return v


WorkRoot = Annotated[str | None, AfterValidator(_work_root)]


def _this_machine_path(v: str | None, info: ValidationInfo) -> str | None:
    """A file rlctl reads here (an SSH key, a known-hosts file): absolute or under `~`. A relative one was read from
    the directory rlctl ran in, not the inventory's: found from one directory, 'No such file' from another. Under the
    home of a user this machine does not have (`home_expanded`): refused here, where only the connection did (a job's
    own record reads back as launched: its stop, status and pull connect to the site with it)."""
    if v is not None and not v.startswith(("/", "~")):
        raise ValueError(
            f"{v!r}: give an absolute path or one under ~ (a relative path was read from the directory rlctl runs in)"
        )
    if v is not None and not is_recorded(info):
        try:
            home_expanded(v)
        except ValueError as e:
            raise ValueError(f"{v!r}: {e}; give the file as ~/… or in full") from e
    return v


HerePath = Annotated[str | None, AfterValidator(_this_machine_path)]


def _private_key(v: str | None) -> str | None:
    """The key rlctl logs in with: its private half. fabric loads the file as a private key, and with a key file
    given offers no agent's keys (`remote.connect`), so a `.pub` (which `ssh -i` pairs with an agent's key) was
    only 'Authentication failed' at launch."""
    if v is not None and v.endswith(".pub"):
        raise ValueError(
            f"{v!r} is the public half of a key pair; give the private key file ({v.removesuffix('.pub')!r}), as "
            "ssh -i takes it"
        )
    return v


KeyPath = Annotated[str | None, AfterValidator(_this_machine_path), AfterValidator(_private_key)]


RECORDED = {"recorded": True}  # the validation context of a job's own record (its sites.json, its job.json)


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


def _here_relative(v: str | None, runs: str, info: ValidationInfo, *, named: str = "") -> None:
    """A work root on this machine's filesystem (a local site's; a SLURM site's submitted from here) given as a
    relative path: it was read from the directory rlctl ran in, so a job launched from one directory and resumed
    or stopped from another looked for its files elsewhere. Not in a job's record (`RECORDED`): one launched by an
    rlctl that took it reads as launched, else no command could stop it."""
    if v is not None and not v.startswith(("/", "~")) and not is_recorded(info):
        raise ValueError(
            f"{named}{v!r}: give an absolute path or one under ~ ({runs}, and a relative path was read from the "
            "directory rlctl runs in)"
        )


class _Scheduler(Strict):
    """Base of the scheduler kinds: what every kind refuses alike."""

    @model_validator(mode="before")
    @classmethod
    def _python_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "python" in data:
            raise ValueError("python is the site's, for every scheduler: move it up to sites.<site>.python")
        return data


class LocalScheduler(_Scheduler):
    kind: Literal["local"]
    workdir: WorkRoot = Field(None, min_length=1, description=WORKDIR_HELP)

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str | None, info: ValidationInfo) -> str | None:
        _here_relative(v, "the site is this machine", info)
        return v


def _login_name(v: str | None) -> str | None:
    """The user rlctl logs in as over SSH: a name with no whitespace (as proxy_jump's user is checked), not starting
    with '-' (no login name does): `launch --dry-run`'s ssh line read `-oProxyCommand=x@h20-01` as an option."""
    if v is not None and (not v or any(c.isspace() for c in v)):
        raise ValueError(f"user {v!r} is empty or has whitespace; give the login name alone, e.g. rl")
    # refused in a job's record (`RECORDED`) too, unlike the figures' bounds: `rlctl stop`, status and pull run ssh
    # with the recorded user, where `-oProxyCommand=x` is an option that runs x, not a login name
    if v is not None and v.startswith("-"):
        raise ValueError(f"user {v!r} starts with '-', as no login name does (ssh reads it as an option); e.g. rl")
    return v


LoginName = Annotated[str | None, AfterValidator(_login_name)]


SUBMIT_SSH = ("ssh_user", "ssh_port", "ssh_key_file", "ssh_known_hosts")  # how a SLURM site's submit_host is reached


MAX_TIME_LIMIT_MIN = 366 * 24 * 60  # past any partition's MaxTime: more is a typo (2880000 for 2880)


class SlurmScheduler(_Scheduler):
    kind: Literal["slurm"]
    partition: str = Field(min_length=1)
    account: str | None = Field(None, min_length=1)  # '' left --account out: the user's default account was charged
    qos: str | None = Field(None, min_length=1)
    submit_host: str | None = Field(None, description="login node reached over SSH; None = run sbatch here")
    ssh_user: LoginName = None
    ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22  # as the ssh scheduler's port: 70000 reached fabric
    ssh_key_file: KeyPath = None
    ssh_known_hosts: HerePath = Field(
        None, description="known_hosts file for the submit host (default ~/.ssh/known_hosts)"
    )
    slurm_conf: str | None = Field(None, description="SLURM_CONF for the client tools, if not the default")
    workdir: WorkRoot = Field(None, min_length=1, description=WORKDIR_HELP)
    time_limit_min: Annotated[int, Field(gt=0, le=MAX_TIME_LIMIT_MIN)] = Field(
        7 * 24 * 60, description=f"every sbatch's --time, minutes; at most {MAX_TIME_LIMIT_MIN} (a year)"
    )
    gpu_request: Literal["auto", "per_task", "gres", "none"] = Field(
        "auto",
        description="how jobs ask for GPUs: per_task = --gpus-per-task=N, gres = --gres=gpu:N per node "
        "(clusters without select/cons_tres), none = no GPU request; auto = per_task unless the site's gpu is CPU",
    )

    @field_validator("partition", mode="before")
    @classmethod
    def _partitions_as_sbatch_takes_them(cls, v: Any) -> Any:
        if isinstance(v, list) and v and all(isinstance(p, str) for p in v):
            joined = ",".join(v)
            raise ValueError(f"{v!r} is a list; several partitions are one string, as sbatch takes them: {joined!r}")
        return v

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, v: str | None) -> str | None:
        """sbatch gets it quoted as one word: a space in it (`'gpu '`, `'high normal'`) was sbatch's 'invalid
        partition specified' (account, qos) at launch, after staging."""
        if v is not None and any(c.isspace() for c in v):
            raise ValueError(f"{v!r} has whitespace, which no SLURM name has; several partitions are one 'a,b'")
        return v

    @field_validator("slurm_conf")
    @classmethod
    def _slurm_conf_as_the_tools_read_it(cls, v: str | None, info: ValidationInfo) -> str | None:
        """SLURM_CONF reaches the client tools as written (this process's environment, or a quoted `export` on the
        submit host): a leading `~` is no home there, and sbatch, squeue, sinfo all failed on a file that is there;
        `''` was no SLURM_CONF at all, the cluster's default silently. Not in a job's record (`RECORDED`)."""
        if v is None or is_recorded(info):
            return v
        if not v:
            raise ValueError("empty; give the slurm.conf's path, or leave slurm_conf out (the cluster's default)")
        if v.startswith("~"):
            raise ValueError(
                f"{v!r}: a leading ~ is not expanded (SLURM_CONF reaches sbatch and the other tools as written): give "
                "an absolute path, e.g. /etc/slurm/slurm.conf"
            )
        return v

    @field_validator("submit_host")
    @classmethod
    def _submit_host_name(cls, v: str | None) -> str | None:
        if v is not None and (why := host_problem(v)) is not None:  # fabric refused user@ or :port beside ssh_*
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _ssh_needs_submit_host(self, info: ValidationInfo) -> SlurmScheduler:
        given = [name for name in SUBMIT_SSH if getattr(self, name) != type(self).model_fields[name].default]
        if given and self.submit_host is None:
            raise ValueError(
                f"{', '.join(given)}: read only to reach submit_host (sbatch over SSH), which is not set: set "
                "submit_host, or remove them (sbatch runs here)"
            )
        if self.submit_host is None:
            _here_relative(self.workdir, "sbatch runs here", info, named="workdir ")  # a model's check: name the field
            conf = self.slurm_conf
            if conf is not None and not conf.startswith("/") and not is_recorded(info):
                raise ValueError(
                    f"slurm_conf {conf!r}: give an absolute path (sbatch runs here, and a relative path was read from "
                    "the directory rlctl runs in)"
                )
        return self


class SshScheduler(_Scheduler):
    kind: Literal["ssh"]
    user: LoginName = None
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    key_file: KeyPath = None
    proxy_jump: str | None = None
    known_hosts: HerePath = Field(
        None, description="known_hosts file trusted for these hosts (default ~/.ssh/known_hosts)"
    )
    workdir: Annotated[str, AfterValidator(_work_root)] = Field("~/.rlctl", min_length=1, description=WORKDIR_HELP)
    shared_workdir: bool = Field(
        False,
        description="the site's hosts see one filesystem at workdir (e.g. NFS inside the datacenter): the job is "
        "staged once, through the first host, instead of once per host",
    )

    @field_validator("proxy_jump")
    @classmethod
    def _one_jump_host(cls, v: str | None) -> str | None:
        """`[user@]host[:port]`, as `remote.jump_target` reads it: one hop (it took `a,b` for one host's name)."""
        if v is None:
            return v
        at = "@" in v
        why = "several jump hosts; rlctl connects through one" if "," in v else None
        if why is None and "://" in v:  # ssh -J takes one; ours took `ssh://rl` for the bastion's user
            why = f"{v!r} is a URI"
        user, host, port = "", "", None
        if why is None:
            try:
                user, host, port = jump_host_parts(v)
            except ValueError as e:
                why = str(e)
        if why is None and at and (not user or any(c.isspace() for c in user)):
            why = f"user {user!r} is empty or has a space"
        if why is None and user.startswith("-"):  # in a job's record too (`_login_name`): stop would run ssh with it
            why = f"user {user!r} starts with '-', as no login name does (ssh reads it as an option)"
        if why is None and host_problem(host) is not None:
            why = f"{host!r} is not a host name or address"
        if why is None and port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
            why = f"port {port!r} is not 1-65535"
        if why is not None:
            raise ValueError(f"{why}; give one jump host as [user@]host[:port], e.g. rl@bastion.example.com:2222")
        return v


Scheduler = Annotated[LocalScheduler | SlurmScheduler | SshScheduler, Field(discriminator="kind")]
register_tags("scheduler", Scheduler)


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


def loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback however written (`same_host`): localhost, 127.0.0.0/8 (`127.1` too),
    ::1, an IPv4-mapped IPv6 one (::ffff:127.0.0.1)."""
    key = same_host(host)
    if key == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(key)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


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
