"""Preflight of the job's sites and their network: what this machine can tell stops a site (`site_problems`), the
hosts the agents run on, and listen addresses and ports they could not reach or bind.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

from rlctl.config.hosts import loopback
from rlctl.config.inventory import Inventory, Site
from rlctl.config.job import Job
from rlctl.config.schedulers import SlurmScheduler, SshScheduler
from rlctl.errors import ConfigError
from rlctl.launch import hostkeys
from rlctl.launch.backends import kind_of
from rlctl.ops.preflight.base import Problem
from rlctl.planner.weightsync import weight_route, weight_sites
from rlctl.textutil import home_path, not_a_file


def _job_hosts(job: Job) -> set[str]:
    """The hosts the job's agents may run on: this machine for a local site (and an SSH host that is a loopback
    address), an SSH site's hosts, a SLURM site's nodes."""
    out: set[str] = set()
    for name in job_sites(job):
        site = job.inventory.sites[name]
        if kind_of(site).on_this_machine:
            out.add("this machine")
        else:
            out |= {"this machine" if loopback(h) else h for h, _ in site.hosts}
    return out


def job_sites(job: Job) -> list[str]:
    """The sites the job's agents run on: the trainer's, the rollout sites, the controller's (each once)."""
    p = job.spec.placement
    return list(dict.fromkeys([p.trainer.site, *(r.site for r in p.rollout), p.controller_site or p.trainer.site]))


def _listen_field(job: Job, name: str) -> tuple[str, str]:
    """(the address site `name`'s agents listen on, the field that sets it): its own `network.listen_host`, else
    the job's `transport.listen_host`."""
    own = job.inventory.sites[name].network.listen_host
    if own:
        return own, f"sites.{name}.network.listen_host"
    return job.spec.transport.listen_host, "transport.listen_host"


def _unspecified(host: str) -> bool:
    """0.0.0.0 or :: (every interface)."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def listen_address_problems(job: Job) -> list[Problem]:
    """A loopback listen address where the job's agents run on more than one host: they could not reach it; nor an
    unspecified one (0.0.0.0, ::), which binds every interface but is what an agent then says it listens on, and a
    peer elsewhere connecting to it reaches itself. One line per field that sets it: a site's
    `network.listen_host`, or the job's `transport.listen_host` (for every site that does not set its own)."""
    hosts = _job_hosts(job)
    if len(hosts) < 2:
        return []
    by_field: dict[str, tuple[str, list[str]]] = {}
    for name in job_sites(job):
        address, field = _listen_field(job, name)
        if loopback(address) or _unspecified(address):
            by_field.setdefault(field, (address, []))[1].append(name)
    shown = ", ".join(sorted(hosts)[:4]) + (", …" if len(hosts) > 4 else "")
    return [
        Problem(
            field,
            f"{address} is {'no address a peer can reach' if _unspecified(address) else 'a loopback address'}, "
            f"and this job's agents run on {len(hosts)} hosts ({shown}): "
            f"site{'s' if len(sites) > 1 else ''} {', '.join(map(repr, sorted(sites)))} would be unreachable from "
            "the others",
            hint=f"set sites.<site>.network.listen_host on {', '.join(sorted(sites))} to `auto` (each agent takes its "
            "own host's interface that routes toward the controller), or on a site of one host that host's address",
            file=_field_file(job, field, sites),
        )
        for field, (address, sites) in by_field.items()
    ]


def one_host_address_problems(job: Job) -> list[Problem]:
    """An IP address as the listen address of an SSH site of several hosts: every agent there, each trainer rank and
    rollout unit, binds it, and it is one host's — those on the others failed at their start. (A SLURM site's node
    names may all be one machine, as on the test cluster: `check --reach` has the nodes.)"""
    by_field: dict[str, tuple[str, list[str]]] = {}
    for name in job_sites(job):
        site = job.inventory.sites[name]
        address, field = _listen_field(job, name)
        try:
            ip = ipaddress.ip_address(address)
            one = not (ip.is_loopback or ip.is_unspecified)  # `listen_address_problems`' line
        except ValueError:
            one = False  # `auto`, or a name, which each host may resolve to itself
        placed = kind_of(site).slices_gpus and not kind_of(site).on_this_machine  # rlctl picks each agent's host
        if one and placed and len({"this machine" if loopback(h) else h for h, _ in site.hosts}) > 1:
            by_field.setdefault(field, (address, []))[1].append(name)
    return [
        Problem(
            field,
            f"{address} is one host's address, and every agent binds it: "
            f"{'; '.join(_hosts_said(job, n) for n in sorted(sites))}, and agents on all but one could not start",
            hint=f"set sites.<site>.network.listen_host on {', '.join(sorted(sites))} to `auto` (each agent takes its "
            "own host's interface that routes toward the controller)",
            file=_field_file(job, field, sites),
        )
        for field, (address, sites) in by_field.items()
    ]


def _field_file(job: Job, field: str, sites: list[str]) -> str | None:
    """The inventory file that declares the site a `sites.<name>.…` field is of (None: the job file's field)."""
    return job.inventory.origin[sites[0]] if field.startswith("sites.") else None


def _hosts_said(job: Job, name: str) -> str:
    hosts = [h for h, _ in job.inventory.sites[name].hosts]
    return f"site {name!r} has {len(hosts)} hosts ({', '.join(hosts[:3])}{', …' if len(hosts) > 3 else ''})"


def _bind_probe(address: str, port: int, *, reuse: bool = False) -> None:
    """Bind a TCP socket at `address`:`port` on this machine and let it go; OSError where that fails."""
    family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        if reuse:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(where)


def unbindable_problems(job: Job) -> list[Problem]:
    """A listen address that agents on this machine (a local site's) could not bind: not one of its addresses
    (an SSH or SLURM site's hosts are asked by `check --reach`)."""
    out = []
    for name in job_sites(job):
        address, field = _listen_field(job, name)
        if address == "auto" or not kind_of(job.inventory.sites[name]).on_this_machine:
            continue
        try:
            _bind_probe(address, 0)
        except OSError as e:
            why = e.strerror or str(e)
            out.append(
                Problem(
                    field,
                    f"{address}: the agents of site {name!r} run on this machine, which cannot listen there ({why})",
                    hint="give an address of this machine, or `auto`",
                )
            )
    return out


def metrics_port_problems(job: Job) -> list[Problem]:
    """A fixed metrics.port that another server holds where the controller would serve /metrics: its listen address
    on this machine (a local site's controller). A remote controller's host is not asked, nor an `auto` address
    (the interface is chosen at its start)."""
    port = job.spec.metrics.port
    p = job.spec.placement
    name = p.controller_site or p.trainer.site
    address, _ = _listen_field(job, name)
    if not port or address == "auto" or not kind_of(job.inventory.sites[name]).on_this_machine:
        return []
    try:
        # SO_REUSEADDR as the controller's server: a port whose last run's connections are in TIME_WAIT is free to it
        _bind_probe(address, port, reuse=True)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:  # an address this machine does not have: `unbindable_problems`'s line
            return []
        return [
            Problem(
                "metrics.port",
                f"{port} is taken on {address} (the controller of site {name!r} serves /metrics there, on this "
                "machine): another server holds it",
                hint="choose a free port, or 0 for one picked at each start",
            )
        ]
    return []


KEY_FIELDS = ("key_file", "ssh_key_file")  # the key rlctl logs in with: an SSH site's, a SLURM submit host's


def key_file_problems(job: Job) -> list[Problem]:
    """A key file that the job's sites are logged in to with (an SSH site's `key_file`, a SLURM site's
    `ssh_key_file` for its submit host) and that is not a file on this machine: rlctl's connection reads it as
    written (no %-tokens, no fallback to other keys), and the launch failed at its first connection after check
    passed. Only the job's sites: an inventory's other sites are not logged in to."""
    return [
        Problem(
            f"sites.{name}.scheduler.{field}",
            f"{not_a_file(path)} {str(path)!r} on this machine: rlctl logs in to site {name!r} with it",
            hint=f"give the private key you log in with, or leave {field} out: your own keys and ssh agent are tried",
            file=job.inventory.origin[name],
        )
        for name, field, path in _site_files(job, KEY_FIELDS)
        if not path.is_file()
    ]


def _site_files(job: Job, fields: tuple[str, ...]) -> Iterator[tuple[str, str, Path]]:
    """Each of `fields` that the job's sites' schedulers set: (site, field, the file on this machine)."""
    for name in job_sites(job):
        scheduler = job.inventory.sites[name].scheduler
        for field in fields:
            written = getattr(scheduler, field, None)
            if written is not None:  # (the inventory refused a home this machine does not know: no error here)
                yield name, field, home_path(written, named=field)


KNOWN_HOSTS_FIELDS = ("known_hosts", "ssh_known_hosts")  # the host keys trusted: an SSH site's, a submit host's


def known_hosts_problems(job: Job) -> list[Problem]:
    """A known_hosts file named for the job's sites (an SSH site's `known_hosts`, a SLURM site's `ssh_known_hosts`
    for its submit host) that is not a file on this machine, under the strict host-key policy (`hostkeys`, the
    default): only that file's keys are trusted, so every host of the site was refused at the launch's first
    connection after check passed. Not the default ~/.ssh/known_hosts (no field names it: the shipped inventories,
    checked on machines that may have none), and nothing under the opt-out (`RLCTL_SSH_HOST_KEY_CHECKING=off`),
    which reads no file. Only the job's sites, as `key_file_problems`."""
    out = []
    for name, field, path in _site_files(job, KNOWN_HOSTS_FIELDS):
        if path.is_file() or hostkeys.mode() == "off":
            continue
        host, port = _first_host(job.inventory.sites[name])
        out.append(
            Problem(
                f"sites.{name}.scheduler.{field}",
                f"{not_a_file(path)} {str(path)!r} on this machine: rlctl checks the host keys of site {name!r} "
                "against it alone (strict host-key checking) and would refuse every host",
                hint=f"add the hosts' keys to it (ssh-keyscan -p {port} {host} >> {path}, after checking them), "
                f"or leave {field} out: ~/.ssh/known_hosts is trusted",
                file=job.inventory.origin[name],
            )
        )
    return out


def _first_host(site: Site) -> tuple[str, int]:
    """The host rlctl connects to first at `site`, and its SSH port: a SLURM site's submit host, else its first
    node."""
    s = site.scheduler
    if isinstance(s, SlurmScheduler) and s.submit_host is not None:
        return s.submit_host, s.ssh_port
    return site.hosts[0][0], s.port if isinstance(s, SshScheduler) else 22


def site_problems(inventory: Inventory, names: Iterable[str]) -> list[Problem]:
    """What this machine can tell stops sites `names` of `inventory` (their backend's `site_problems`: a local
    site's work root), each naming the inventory file that declares the site."""
    return [
        Problem(f"sites.{name}.{p.field}", p.message, p.hint, file=inventory.origin[name])
        for name in names
        for p in kind_of(inventory.sites[name]).site_problems(inventory.sites[name])
    ]


def link_problems(job: Job) -> list[Problem]:
    """A rollout site in another datacenter than the trainer's that no declared link, nor a path of links, joins to
    it: `rlctl plan` cannot price the weights' way there and refuses the job, and the weight plane would route as if
    every pair of datacenters were linked; refused here in plan's line (`weightsync.weight_route`), naming the
    inventory's `links` and the link to add, versus a warning while check passed and launch started the job. The
    route is the weight plane's: over the links between the job's sites, through datacenters it has rollout in."""
    trainer = job.spec.placement.trainer.site
    rollout = [r.site for r in job.spec.placement.rollout]
    job_sites, unit_sites = weight_sites(job, rollout)
    out = []
    for site in dict.fromkeys(s for s in rollout if s != trainer):
        try:
            weight_route(job.inventory, trainer, site, job_sites=job_sites, unit_sites=unit_sites)
        except ConfigError as e:
            out.append(Problem(e.field or "links", e.detail, e.hint, file=e.file))
    return out
