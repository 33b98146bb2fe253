"""What a site's hosts have for a job: rlctl (the operator's version), torch and its CUDA devices, the engine and
trainer packages, free disk — asked on each host through the site's own backend, in its own environment.

    check --reach ─▶ every site: on each of its hosts (an SSH site: each host over SSH; a SLURM site: one
                     `srun` on its partition, with a GPU where the site has GPUs; a local site: here), the site's
                     `setup` lines, then `<site python> -c PROBE <workdir>` ─▶ one JSON line: HostReport
                  ─▶ problems: one line each (`SiteLine`), naming the site and host, what is missing and what to do

A host that cannot be asked (unreachable, the python missing) is one problem too; nothing here raises for a site.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hostlist

from rlctl import __version__
from rlctl.buildid import code_digest
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.config.schedulers import SlurmScheduler
from rlctl.devices import kind_for
from rlctl.engines.compiletools import compile_tools_problem
from rlctl.engines.factory import VLLM_DISTRIBUTIONS, VLLM_EXTRAS
from rlctl.errors import CommandTimeout, LaunchError
from rlctl.launch.backends import kind_of, python_for
from rlctl.launch.base import site_setup
from rlctl.launch.remote import CommandResult, Runner

MARK = "RLCTL_PROBE "
PROBE_WORKERS = 16  # hosts of one site asked at once: a few dead ones cost one deadline, not one each
SETUP_BEGIN, SETUP_DONE = "RLCTL_SETUP_BEGIN", "RLCTL_SETUP_DONE"  # around the site's setup lines
STARTED = "RLCTL_PROBE_STARTED"  # the first line of a probe that may wait its turn (a SLURM step): it got its node
QUEUED, ALLOCATED = "queued and waiting for resources", "has been allocated resources"  # srun's, on its stderr
# run by the site's python: every answer is a field, every failure to import a field too (never an exception)
PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, os, shutil, sys
out = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import rlctl
    out["rlctl"] = rlctl.__version__
    out["rlctl_at"] = os.path.dirname(rlctl.__file__)
    from rlctl.buildid import code_digest
    out["rlctl_code"] = code_digest()
except Exception as e:
    out["rlctl_error"] = f"{type(e).__name__}: {e}"[:200]
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {e}"[:200]
out["vllm"] = sorted(md.packages_distributions().get("vllm", []))
out["megatron"] = iu.find_spec("megatron") is not None and iu.find_spec("megatron.core") is not None
out["ucxx"] = iu.find_spec("ucxx") is not None
# what torch.compile needs (rollout.compile): as rlctl.engines.compiletools.compile_tools asks it
out["cxx"] = shutil.which(os.environ.get("CXX") or "g++")
out["cc"] = next((p for c in (os.environ.get("CC"), "gcc", "clang") if c and (p := shutil.which(c))), None)
out["triton"] = iu.find_spec("triton") is not None
ib = "/sys/class/infiniband"
out["rdma_devices"] = sorted(os.listdir(ib)) if os.path.isdir(ib) else []
root = os.path.expanduser(sys.argv[1])
os.makedirs(root, exist_ok=True)
out["workdir"] = root
if len(sys.argv) > 2:  # a file the operator's machine made in the work root: does this host share that filesystem?
    out["sees_here"] = os.path.exists(sys.argv[2])
out["free_bytes"] = shutil.disk_usage(root).free
print("RLCTL_PROBE " + json.dumps(out))
"""


class SiteLine(str):
    """One problem of a site's, the line `check --reach` prints: 'site {site} host {host}: {message}' ('site {site}:
    {message}' where `host` is None: the site as a whole); its parts kept for `check -o json`."""

    site: str
    host: str | None
    message: str

    def __new__(cls, site: str, host: str | None, message: str) -> SiteLine:
        line = super().__new__(cls, f"site {site}{'' if host is None else f' host {host}'}: {message}")
        line.site, line.host, line.message = site, host, message
        return line

    def __getnewargs__(self) -> tuple[str, str | None, str]:  # type: ignore[override]  # (copy, pickle)
        return self.site, self.host, self.message


@dataclass
class HostReport:
    """What one host of a site answered (or why it could not)."""

    site: str
    host: str
    facts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the host could not be asked
    reached: bool = True  # False: the probe's command did not run to its end there (no connection, its deadline;
    # a SLURM probe's deadline is its partition's: its submit host ran srun, and answers sinfo)
    waited: bool = False  # a SLURM probe's srun past its deadline: the partition gave it no node in time (busy),
    # or the probe was slow on the one it got (`_past_deadline`): the site is up, its error says which


# run on the controller's site by its python: can it reach each site where it would start rollout units
# (`rlctl scale`, the rebalance rule)? The same probe as `check --reach` runs from here (rlctl.launch.reach).
CONTROLLER_PROBE = r"""
import json, sys
import hostlist

from rlctl.config.inventory import RECORDED, Site
from rlctl.config.schedulers import SlurmScheduler
from rlctl.launch.reach import probe_site
out = {}
for name, d in json.loads(sys.argv[1]).items():
    # as the operator's inventory read it: its dump writes every field (a custom GPU's default price beside the
    # site's), which a new inventory is refused with
    r = probe_site(name, Site.model_validate(d, context=RECORDED), timeout_s=float(sys.argv[2]))
    out[name] = {"ok": r.ok, "detail": r.detail}
print("RLCTL_PROBE " + json.dumps(out))
"""


def probe_site_hosts(
    name: str,
    site: Site,
    *,
    timeout_s: float = 60.0,
    script: str = PROBE,
    args: list[str] | None = None,
    first: bool = False,
    here: str | None = None,
) -> list[HostReport]:
    """Ask every host of `site` (a SLURM site: one node of its partition; `first`: an SSH site's first host only)
    with the site's python and setup: `script` run with `args` (default: the probe of what the host has, on the
    site's work root; on a site without one, `here`: where the operator's job dir will be, default this
    directory). The hosts are asked at once (up to PROBE_WORKERS), each on its own connection and with its own
    `timeout_s`; the reports come in the hosts' order."""
    kind = kind_of(site)
    python = python_for(site)
    root = kind.work_root(site) or here or os.getcwd()
    # a site whose job dir is on this machine's filesystem and its agents elsewhere (SLURM submitted from here):
    # whether its hosts see it
    apart = not kind.remote(site) and not kind.on_this_machine
    marker = _marker_in(root) if args is None and apart else None
    argv = " ".join(shlex.quote(a) for a in (args if args is not None else [root, *([marker] if marker else [])]))
    late = kind.probe_late(site, timeout_s)
    # where the probe may wait for a node (`late`), its first line says it got one: past its deadline after it, it
    # is slow there (the setup lines, python importing torch from a slow filesystem), not waiting (`_past_deadline`)
    begin = [f"echo {STARTED}"] if late is not None else []
    python_line = f"{shlex.quote(python)} -c {shlex.quote(script)} {argv}"
    command = "\n".join([*begin, *_strict_setup(site.setup), python_line])
    asks = kind.probe_commands(site, command, first=first)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(PROBE_WORKERS, len(asks)))) as pool:
            return list(pool.map(lambda a: _ask(name, a[0], kind.site_runner(site, a[1]), a[2], timeout_s, late), asks))
    finally:
        if marker is not None:
            Path(marker).unlink(missing_ok=True)


def _marker_in(root: str) -> str | None:
    """A new empty file in `root` on this machine (in its nearest existing parent while it does not exist), for
    the probe to look for on the site's hosts; None where none can be made there (nothing is then asked)."""
    place = Path(root)
    while not place.is_dir() and place != place.parent:
        place = place.parent
    try:
        fd, path = tempfile.mkstemp(prefix=".rlctl-probe-", dir=place)
    except OSError:
        return None
    os.close(fd)
    return os.path.abspath(path)


def _strict_setup(lines: list[str]) -> list[str]:
    """The site's setup lines as the SSH start script runs them (`set -e`: an agent does not start after a line
    that failed), between two marks, so that a probe ended by one of them says so rather than passing where the
    launch then fails."""
    if not lines:
        return []
    return [f"echo {SETUP_BEGIN}", "set -e", *site_setup(lines), "set +e", f"echo {SETUP_DONE}"]


def _ask(name: str, host: str, runner: Runner, command: str, timeout_s: float, late: str | None) -> HostReport:
    """What `host` answered to the probe `command`. `late`: what the probe past its deadline says of the site where
    it only waited its turn (`probe_late`: a SLURM srun whose step the partition gave no node in time, busy), said
    as such and the site left reached (sinfo is asked there), versus 'cannot be asked' as for a site down; one that
    got its node and was slow there is said as that (`_past_deadline`)."""
    try:
        res = runner.run(command, timeout_s=timeout_s)
    except CommandTimeout as e:
        if late is None:  # a host that took the command and did not end it: as good as down
            return HostReport(name, host, error=f"{e}", reached=False)
        return HostReport(name, host, error=_past_deadline(name, e, timeout_s, late), waited=True)
    except LaunchError as e:  # with its hint: an unknown host key's is the ssh-keyscan line that adds it
        return HostReport(name, host, error=f"{e}" + (f" (hint: {e.hint})" if e.hint else ""), reached=False)
    finally:
        runner.close()
    out = [x for x in res.stdout.splitlines() if x != STARTED]
    res = CommandResult(res.exit_code, "\n".join(out), res.stderr)  # (its tail: what the probe said, not the mark)
    line = next((x for x in out if x.startswith(MARK)), None)
    if line is None and SETUP_BEGIN in out and SETUP_DONE not in out:
        return HostReport(
            name,
            host,
            error=f"a line of sites.{name}.setup failed there (exit {res.exit_code}: {res.tail()}): fix or remove it "
            "(the site's agents start after these lines)",
        )
    if line is None:
        return HostReport(name, host, error=f"the probe did not answer (exit {res.exit_code}): {res.tail()}")
    return HostReport(name, host, json.loads(line.removeprefix(MARK)))


def _past_deadline(name: str, e: CommandTimeout, timeout_s: float, late: str) -> str:
    """What a probe that may wait its turn (a SLURM srun) and ran past its deadline had got to, from what it printed
    before it was ended: its first line (`STARTED`) or srun's 'job N has been allocated resources': it got a node,
    and was slow there — its setup lines, or its python (torch imported from a slow filesystem); else `late` (the
    partition busy), with srun's 'queued and waiting for resources' where it said it. Before, a probe slow on the
    node it got was said as the partition busy."""
    out = e.stdout.splitlines()
    said = [x.strip() for x in e.stderr.splitlines()]
    allocated = next((x for x in said if ALLOCATED in x), None)
    if STARTED not in out and allocated is None:
        queued = next((x for x in said if QUEUED in x), None)
        return late + (f" (srun said: '{queued}')" if queued else "")
    if SETUP_BEGIN in out and SETUP_DONE not in out:
        doing = f"the site's setup lines (sites.{name}.setup) were still running"
    elif STARTED in out:
        doing = "its python was still starting (importing rlctl and torch: a slow filesystem there?)"
    else:
        doing = f"its step was still starting there ({allocated})"
    return (
        f"the probe got a node but did not answer within {timeout_s:g} s: {doing}; the partition is not busy: check "
        "again with a longer --timeout"
    )


def unreachable(reports: list[HostReport]) -> bool:
    """Whether the probe reached none of a site's hosts (`reports`: what `probe_site_hosts` answered): its reach
    line says so, and asking the site again (sinfo) would only wait out another deadline."""
    return bool(reports) and not any(r.reached for r in reports)


def host_problems(
    report: HostReport, site: Site, *, roles: set[str] | None = None, job: JobFile | None = None
) -> list[SiteLine]:
    """One line per thing `report`'s host lacks to run `roles` ("trainer", "rollout", "controller") of `job`
    (None: what any rlctl agent needs there)."""
    python = report.facts.get("executable") or python_for(site)
    if report.error is not None:  # (a busy partition's host was not asked yet: it can be)
        return [SiteLine(report.site, report.host, f"{'' if report.waited else 'cannot be asked: '}{report.error}")]
    f, out = report.facts, list[SiteLine]()

    def lacks(message: str) -> None:
        out.append(SiteLine(report.site, report.host, message))

    if f.get("sees_here") is False:
        lacks(
            f"does not see {f.get('workdir')} of this machine (a file made there for the probe was not "
            f"there), where the site's agents read and write the job's files: set sites.{report.site}.scheduler."
            "workdir to a directory this machine and the site's nodes share, or give the site a submit_host"
        )
    if "rlctl" not in f:
        lacks(
            f"{python} cannot import rlctl ({f.get('rlctl_error')}): install rlctl=={__version__} there, "
            f"or set sites.{report.site}.python (and setup) to the environment that has it"
        )
    elif f["rlctl"] != __version__:
        lacks(f"rlctl {f['rlctl']} there, {__version__} here: install rlctl=={__version__} there")
    elif f.get("rlctl_code") != code_digest():  # one version, other code: its agents would exit at start
        there = f"code {f['rlctl_code']}" if f.get("rlctl_code") else "an older build, no code digest"
        lacks(
            f"rlctl {__version__} at {f.get('rlctl_at', '?')} there is other code than here ({there}, here "
            f"{code_digest()}): install this machine's rlctl there (the same checkout or wheel)"
        )
    computes = roles is None or bool(roles & {"trainer", "rollout"})
    gpu = kind_for(site.spec.name) == "cuda"
    if "torch" not in f:
        lacks(
            f"{python} cannot import torch ({f.get('torch_error')}): install torch there"
            + (" (a CUDA build: the site declares GPUs)" if gpu else "")
        )
    elif gpu and computes and not f.get("cuda_devices"):
        what = "is a CPU build" if not f.get("cuda") else "sees no CUDA device (driver, CUDA_VISIBLE_DEVICES)"
        lacks(
            f"torch {f['torch']} {what}, and the site declares {site.spec.name} GPUs: install a CUDA "
            "build of torch there, or declare the site `gpu: CPU`"
        )
    elif gpu and computes and kind_of(site).slices_gpus:  # where SLURM binds GPUs, it counts them
        nodes = [n for n in site.nodes if report.host in n.hosts or report.host == "localhost"]
        need = max((1 + n.device(slot) for n in nodes for slot in range(n.gpus)), default=0)
        if f["cuda_devices"] < need:
            lacks(
                f"torch sees {f['cuda_devices']} CUDA device(s), the inventory declares {need}: "
                f"give sites.{report.site}.nodes the host's real GPU count"
            )
    if job is not None and roles and "rollout" in roles and job.rollout.engine == "vllm":
        kind = kind_for(site.spec.name)
        if VLLM_DISTRIBUTIONS[kind] not in f.get("vllm", []):
            have = ", ".join(f.get("vllm", [])) or "no vLLM"
            lacks(
                f"{have} there, its rollout units need {VLLM_DISTRIBUTIONS[kind]}: "
                f"pip install '{VLLM_EXTRAS[kind]}' there"
            )
    compiles = job is not None and job.rollout.engine == "embedded" and job.rollout.compile
    if compiles and roles and "rollout" in roles and (why := compile_tools_problem(f, gpu=gpu)) is not None:
        lacks(f"rollout.compile: true: {why}")
    if job is not None and roles and "trainer" in roles and job.trainer.backend == "megatron" and not f.get("megatron"):
        lacks("the megatron trainer needs megatron-core there: pip install 'rlctl[megatron]' there")
    if job is not None and job.transport.kind == "ucx" and not f.get("ucxx"):
        lacks("transport ucx needs ucxx there: pip install 'rlctl[ucx]' there")
    if job is not None and job.transport.kind == "ucx" and site.network.rdma and f.get("rdma_devices") == []:
        lacks(
            f"the inventory says network.rdma: true, and the host has no RDMA device (/sys/class/infiniband "
            f"is empty): set sites.{report.site}.network.rdma: false, or load the host's RDMA driver"
        )
    return out


def partition_problems(name: str, site: Site, *, timeout_s: float = 60.0) -> list[SiteLine]:
    """A SLURM site's nodes as its inventory lists them, against its partition's (sinfo): hosts the partition does
    not have (GPU slots the plan counts and SLURM never gives), and nodes it has that the inventory does not list
    (SLURM may place agents there, whose GPUs and memory the plan did not count); and a `time_limit_min` past the
    partition's MaxTime (SLURM holds every agent's job pending, PartitionTimeLimit, or refuses it). One line each;
    [] on other sites, or when sinfo cannot be asked (the site's reach row says why)."""
    sched = site.scheduler
    if not isinstance(sched, SlurmScheduler):
        return []
    from rlctl.launch.slurm import SlurmBackend

    try:
        nodes, max_s = SlurmBackend.partition(site, timeout_s=timeout_s)
    except LaunchError:
        return []
    have = set(nodes)
    listed = {h for n in site.nodes for h in n.hosts}
    out = []
    if max_s is not None and sched.time_limit_min * 60 > max_s:
        given = "" if "time_limit_min" in sched.model_fields_set else " (the default)"
        out.append(
            f"time_limit_min {sched.time_limit_min}{given} is past partition {sched.partition}'s MaxTime "
            f"of {max_s // 60} min (sinfo): SLURM would hold every agent's job pending; set sites.{name}."
            f"scheduler.time_limit_min: {max_s // 60} (checkpoint.auto_resume resumes a run that reaches it)"
        )
    if have and (missing := sorted(listed - have)):
        out.append(
            f"the inventory lists {hostlist.collect_hostlist(missing)}, which partition "
            f"{sched.partition} does not have (sinfo): remove them from sites.{name}.nodes, or set the partition "
            "that has them"
        )
    if have and (extra := sorted(have - listed)):
        out.append(
            f"partition {sched.partition} also has {hostlist.collect_hostlist(extra)}, which "
            f"sites.{name}.nodes does not list: SLURM may place agents there; list them (with their gpus), or set a "
            "partition of the listed nodes"
        )
    return [SiteLine(name, None, message) for message in out]


class PartitionCpus:
    """The most CPUs a node of a SLURM site's partition has (sinfo's `%c`, `SlurmBackend.node_cpus`), asked once a
    site for every check that compares a request with it (`check --reach`: the controller's cores, the agents'
    threads); None where sinfo cannot be asked or says no plain figure (each check then compares nothing)."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._said: dict[str, int | None] = {}

    def __call__(self, name: str, site: Site) -> int | None:
        if name not in self._said:
            from rlctl.launch.slurm import SlurmBackend

            try:
                self._said[name] = SlurmBackend.node_cpus(site, timeout_s=self.timeout_s)
            except LaunchError:
                self._said[name] = None
        return self._said[name]


def controller_cores_problems(
    name: str, site: Site, job: JobFile, *, timeout_s: float = 60.0, cpus: PartitionCpus | None = None
) -> list[SiteLine]:
    """The controller's SLURM job on site `name` asking more cores (`controller_cores`: itself, its reward
    workers, the held-out evaluations' one) than any node of its partition has (sinfo's CPUs, from `cpus`: those
    asked already, or asked now within `timeout_s`), where no `nodes[].cpus` caps the request: sbatch refuses it
    ('Requested node configuration is not available') as the launch starts. One line; [] on other sites, with cpus
    given, or when sinfo cannot be asked or says no plain figure."""
    from rlctl.launch.layout import controller_cores

    sched = site.scheduler
    if not isinstance(sched, SlurmScheduler) or any(n.cpus is not None for n in site.nodes):
        return []
    cores = controller_cores(job, site)
    if cores == 1:
        return []
    most = (cpus or PartitionCpus(timeout_s=timeout_s))(name, site)
    if most is None or cores <= most:
        return []
    workers = getattr(job.task, "reward_workers", 0)
    held = cores - 1 - workers
    message = (
        f"the controller's SLURM job asks {cores} cores (itself and task.reward_workers {workers}"
        + (", and the held-out evaluations' worker" if held else "")
        + f"), and partition {sched.partition}'s nodes have at most {most} (sinfo): sbatch refuses it; set "
        f"task.reward_workers to at most {max(0, most - 1 - held)}, or give sites.{name}.nodes their cpus (the "
        "controller then asks at most a node's)"
    )
    return [SiteLine(name, None, message)]


def disk_problem(report: HostReport, *, need_bytes: float, what: str = "the staged model") -> SiteLine | None:
    """The host's work root has less free disk than `need_bytes` (`what`: of what, and how to need less)."""
    free = report.facts.get("free_bytes")
    if free is None or free >= need_bytes:
        return None
    return SiteLine(
        report.site,
        report.host,
        f"{free / 1e9:.1f} GB free in {report.facts.get('workdir')}, the job needs about {need_bytes / 1e9:.1f} GB "
        f"there ({what}): free space or set the site's scheduler.workdir",
    )


# run on the controller's site by its python: the tracking backends' packages, and the W&B login the controller
# would use there (rlctl.tracking.check_tracking, in its environment: its setup lines, its netrc)
TRACKING_PROBE = r"""
import json, sys
from rlctl.config.tracking import Tracking
from rlctl.errors import ConfigError
from rlctl.tracking import check_tracking
try:
    check_tracking(Tracking.model_validate(json.loads(sys.argv[1])), source="")
    out = {"ok": True}
except ConfigError as e:
    out = {"ok": False, "field": e.field, "detail": e.detail, "hint": e.hint}
print("RLCTL_PROBE " + json.dumps(out))
"""


def controller_tracking_problems(name: str, site: Site, job: JobFile, *, timeout_s: float = 60.0) -> list[SiteLine]:
    """A tracking job's controller on site `name` (not this machine) without the trackers' packages there, or, for
    an online W&B run, without a W&B login there: it logs the run with that host's, not this machine's (`check`
    asks this machine's only where the controller runs here). One line, asked on the site's first host; a host that
    cannot be asked is left to `host_problems`."""
    if kind_of(site).on_this_machine or not job.tracking.backends:
        return []
    body = json.dumps(job.tracking.model_dump(mode="json"))
    [report] = probe_site_hosts(name, site, timeout_s=timeout_s, script=TRACKING_PROBE, args=[body], first=True)
    if report.error is not None or report.facts.get("ok", True):
        return []
    hint = report.facts.get("hint")
    message = (
        f"{report.facts.get('field') or 'tracking'}: {report.facts.get('detail')} there, where the controller logs "
        "the run (with its host's packages and login, not this machine's)" + (f": {hint} there" if hint else "")
    )
    return [SiteLine(name, report.host, message)]


def controller_reach_problems(
    name: str, site: Site, targets: dict[str, Site], *, timeout_s: float = 60.0, reach_timeout_s: float = 10.0
) -> list[SiteLine]:
    """From the controller's site `name` (where `rlctl scale` and the rebalance rule start rollout units), the
    sites in `targets` it cannot reach, one line each. Nothing to ask where the controller runs on this machine
    (`check --reach` reached the sites from here). A controller host that cannot be asked (no rlctl there) is
    left to `host_problems`."""
    if kind_of(site).on_this_machine or not targets:
        return []
    body = json.dumps({n: t.model_dump(mode="json") for n, t in sorted(targets.items())})
    [report] = probe_site_hosts(
        name, site, timeout_s=timeout_s, script=CONTROLLER_PROBE, args=[body, str(reach_timeout_s)], first=True
    )
    if report.error is not None:
        return []
    return [
        SiteLine(
            target,
            None,
            f"cannot be reached from the controller's site {name} (host {report.host}): {answer.get('detail')}: "
            "`rlctl scale` and the rebalance rule start rollout units from there; give that host the site's SSH key "
            "and known_hosts, or set placement.controller_site to a site that reaches it",
        )
        for target, answer in sorted(report.facts.items())
        if not answer.get("ok")
    ]
