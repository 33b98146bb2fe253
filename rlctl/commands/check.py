"""`rlctl check INVENTORY...`: validate inventories, show sites and links, optionally probe reachability."""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlctl.commands import said_if_interrupted, seconds_at_least
from rlctl.errors import ConfigError, JobProblems, PartialFailure, RlctlError, SiteProblem, UsageError
from rlctl.render import OutputFormat, OutputOpt, emit, grid

if TYPE_CHECKING:  # the config and the probes load when the command runs (`rlctl --help` stays quick)
    from rlctl.config import Inventory
    from rlctl.config.inventory import Site
    from rlctl.config.job import Job, JobFile
    from rlctl.launch.siteprobe import HostReport, SiteLine
    from rlctl.ops.preflight.base import Problem


def inventory_summary(inv: Inventory) -> dict[str, Any]:
    sites = []
    for name, s in inv.sites.items():
        spec = s.spec
        sites.append(
            {
                "name": name,
                "datacenter": s.datacenter,
                "scheduler": s.scheduler.kind,
                "gpu": spec.name,
                "nodes": len(s.hosts),
                "gpus": s.total_gpus,
                "bf16_tflops": spec.bf16_tflops,
                "hbm_gb": spec.hbm_gb,
                "network_gbps": s.network.bandwidth_gbps,
                "rdma": s.network.rdma,
                "cost_per_gpu_hour": s.gpu_cost_per_hour,
            }
        )
    links = [
        {"between": list(link.between), "bandwidth_gbps": link.bandwidth_gbps, "latency_ms": link.latency_ms}
        for link in inv.links
    ]
    return {"files": inv.files, "sites": sites, "links": links}


def _table(d: dict[str, Any]) -> str:
    head = ""
    if "job" in d:
        j = d["job"]
        head = f"Job {j['name']} ({j['file']}): model {j['model']}, task {j['task']}, pipeline {j['mode']}\n\n"
    srows = [
        [
            s["name"],
            s["datacenter"],
            s["scheduler"],
            s["gpu"],
            s["nodes"],
            s["gpus"],
            f"{s['network_gbps']:g} Gbps{' RDMA' if s['rdma'] else ''}",
            f"{s['cost_per_gpu_hour']:.2f}",
        ]
        for s in d["sites"]
    ]
    out = grid(srows, ["site", "datacenter", "scheduler", "gpu", "nodes", "gpus", "network", "cost/gpu-h"], "Sites")
    if d["links"]:
        lrows = [
            [" <-> ".join(link["between"]), f"{link['bandwidth_gbps']:g} Gbps", f"{link['latency_ms']:g} ms"]
            for link in d["links"]
        ]
        out += "\n\n" + grid(lrows, ["link", "bandwidth", "latency"], "Links")
    if "hosts" in d:
        hrows = [
            [
                h["site"],
                h["host"],
                h.get("python", "?"),
                h.get("rlctl", "-"),
                h.get("torch", "-"),
                h.get("cuda_devices", "-"),
                f"{h.get('free_bytes', 0) / 1e9:.0f} GB",
            ]
            for h in d["hosts"]
        ]
        out += "\n\n" + grid(hrows, ["site", "host", "python", "rlctl", "torch", "CUDA devices", "free disk"], "Hosts")
    if "reach" in d:
        rrows = [[r["site"], "ok" if r["ok"] else "FAILED", f"{r['seconds']:.2f}s", r["detail"]] for r in d["reach"]]
        out += "\n\n" + grid(rrows, ["site", "reach", "time", "detail"], "Reachability")
    return head + out


def job_dir_place(spec: JobFile) -> Path:
    """Where a launch of `spec` would put its job dir (the job file's `job_dir`, else $RLCTL_HOME/runs or ./runs),
    as far as it exists now: the directory whose free disk a site without a work root (local, SLURM submitted from
    here) writes the job's checkpoints into."""
    from rlctl.launch.jobdir import JobDir

    path = JobDir.choose_path(spec.name, explicit=spec.job_dir)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def job_dir_problems(job: Job) -> list[Problem]:
    """The job file's `job_dir` as a fresh launch refuses it (`fresh_dir`: it holds a job, a launch prepares one
    there, it holds a run's files no launch wrote), versus a check that passed and a launch refused ("would
    overwrite it"). Here, not in `preflight.problems`: a launch given --job-dir writes elsewhere, and a launcher
    --detach started runs in the directory it made."""
    from rlctl.launch.jobdir import why_not_made
    from rlctl.ops.launchdir import fresh_dir
    from rlctl.ops.preflight.base import Problem

    if job.spec.job_dir is None:  # a new timestamped directory: nothing there to take
        return []
    if why_not_made(Path(job.spec.job_dir)) is not None:  # a file, or a folder not this user's: `problems` says it
        return []
    try:
        fresh_dir(job, job.spec, None)
    except UsageError as e:
        return [Problem("job_dir", str(e).removeprefix(f"{job.path}: job_dir: "), hint=e.hint)]
    return []


def staged_model_bytes(spec: JobFile) -> float:
    """The disk the job's staged model takes: an HF directory's weight files as they are (an rlctl checkpoint
    declares the job's dtype and may hold fp32 tensors, `HfModelInfo.weight_file_bytes`), else the declared dtype's
    bytes (a builtin model is written in it)."""
    from rlctl.config.model import HfModel
    from rlctl.models.hfdir import check_hf_dir

    if isinstance(spec.model, HfModel):
        return float(check_hf_dir(spec.model.path, name=spec.model.name).weight_file_bytes)
    return spec.model.arch.weight_bytes


def job_problem_lines(job: Job, *, timeout_s: float) -> tuple[list[str], list[HostReport]]:
    """What stops `job`, one line each (`job_problems`), and what each host answered."""
    found, answered = job_problems(job, timeout_s=timeout_s)
    return [line for line, _ in found], answered


def job_problems(job: Job, *, timeout_s: float) -> tuple[list[tuple[str, ConfigError]], list[HostReport]]:
    """What stops `job`: its file's problems (`preflight.problems`), then each site's hosts' (`siteprobe`), asked
    for the roles the job places there; each as its line and its parts for `check -o json` (the file and field; a
    site's, a SiteProblem naming the site and host). And what each host answered."""
    from rlctl.checkpoint.choose import checkpoint_bytes, checkpoints_held, checkpoints_set_aside
    from rlctl.errors import PlanError
    from rlctl.launch.siteprobe import (
        PartitionCpus,
        controller_cores_problems,
        controller_reach_problems,
        controller_tracking_problems,
        disk_problem,
        host_problems,
        partition_problems,
        probe_site_hosts,
        unreachable,
    )
    from rlctl.ops import counts
    from rlctl.ops.preflight import problem_lines, problems
    from rlctl.ops.preflight.placement import partition_cores_problems
    from rlctl.ops.preflight.slurmoptions import option_problems, probe_refusal

    said: list[tuple[str, ConfigError]] = []  # each problem: its line and its parts
    origins = job.inventory.origin  # the inventory file that declares each site

    def of_file(wrong: list[Problem], *, site: str | None = None, host: str | None = None) -> None:
        for line, p in zip(problem_lines(job, wrong), wrong, strict=True):
            file = p.file or str(job.path)
            e = ConfigError(file, p.field, p.message, hint=p.hint)
            if site is not None:  # (a site's field: an srun refusal, a constraint sinfo does not know)
                e = SiteProblem(file, p.field, p.message, site=site, host=host, hint=p.hint)
            said.append((line, e))

    def of_site(lines: list[SiteLine]) -> None:
        for line in lines:
            where = SiteProblem(origins[line.site], f"sites.{line.site}", line.message, site=line.site, host=line.host)
            said.append((line, where))

    try:  # the plan launch runs, made once: `problems` says why where it cannot be (and the planner's note once)
        plan: dict[str, Any] | None = counts.plan_counts(job, job.spec)
    except (PlanError, ConfigError):
        plan = None
    of_file(problems(job, plan=plan) + job_dir_problems(job))
    spec = job.spec
    roles: dict[str, set[str]] = {spec.placement.trainer.site: {"trainer"}}
    for r in spec.placement.rollout:
        roles.setdefault(r.site, set()).add("rollout")
    roles.setdefault(spec.placement.controller_site or spec.placement.trainer.site, set()).add("controller")
    model = staged_model_bytes(spec) + 1e9  # the staged model (+ the job's files and logs)
    # the checkpoints in iter-* and the sealed ones resumes set aside in abandoned/, which keep bounds too
    aside, each = checkpoints_set_aside(spec), checkpoint_bytes(spec)
    held = checkpoints_held(spec) + aside
    trainer_site = spec.placement.trainer.site
    abandoned = (
        f"{aside} of them set aside by a resume in checkpoints/abandoned/"
        if aside
        else "not counting those a resume sets aside in checkpoints/abandoned/, which keep 0 does not bound"
    )
    checkpoints = (
        f"the staged model {model / 1e9:.1f} GB and {held} checkpoint(s) of {each / 1e9:.1f} GB "
        f"(fp32 weights and AdamW state; {abandoned}); checkpoint.keep sets how many are kept"
    )
    answered: list[HostReport] = []
    here = str(job_dir_place(spec))  # a site without a work root writes the job into the operator's job dir
    gone: set[str] = set()  # sites the probe reached no host of: one line each says so, sinfo is not asked there
    refused: set[str] = set()  # SLURM sites whose constraint or reservation sbatch refuses (or holds): not probed

    def asked(name: str) -> tuple[list[Problem], list[HostReport]]:
        """A SLURM site's constraint and reservation first (sinfo, scontrol): where one is wrong, the probe's srun
        would be refused alike (its raw error) or wait out its deadline (a reservation on other nodes): its hosts
        are asked once they are fixed."""
        site = job.inventory.sites[name]
        wrong = option_problems(name, site, file=origins[name], timeout_s=timeout_s)
        if wrong:
            return wrong, []
        return [], probe_site_hosts(name, site, timeout_s=timeout_s, here=here)

    with ThreadPoolExecutor(max_workers=len(roles)) as pool:
        for name, (wrong, found) in zip(roles, pool.map(asked, roles), strict=True):
            if wrong:
                of_file(wrong, site=name)
                refused.add(name)
            for report in found:
                answered.append(report)
                site = job.inventory.sites[name]
                # srun refusing the probe's step for a field of the site's (an account, a qos): that field's line
                if report.error and (no := probe_refusal(name, site, report.error, file=origins[name])) is not None:
                    of_file([no], site=name, host=report.host)
                    continue
                of_site(host_problems(report, site, roles=roles[name], job=spec))
                need, what = (model + held * each, checkpoints) if name == trainer_site else (model, "the staged model")
                if (disk := disk_problem(report, need_bytes=need, what=what)) is not None:
                    of_site([disk])
            if unreachable(found):
                gone.add(name)
            else:
                of_site(partition_problems(name, job.inventory.sites[name], timeout_s=timeout_s))
    reached = [name for name in roles if name not in gone]
    cpus = PartitionCpus(timeout_s=timeout_s)  # sinfo's CPUs, asked once a site for the agents and the controller
    of_file(partition_cores_problems(job, plan, reached=reached, cpus=cpus))
    controller = spec.placement.controller_site or spec.placement.trainer.site
    if controller not in gone:
        of_site(controller_cores_problems(controller, job.inventory.sites[controller], spec, cpus=cpus))
    # else: one line above says so (its hosts' answer, or its options, which the controller's probes would get too)
    if controller not in refused and all("rlctl" in r.facts for r in answered if r.site == controller):
        sites = job.inventory.sites
        rollout = {r.site: sites[r.site] for r in spec.placement.rollout}
        of_site(controller_reach_problems(controller, sites[controller], rollout, timeout_s=timeout_s))
        of_site(controller_tracking_problems(controller, sites[controller], spec, timeout_s=timeout_s))
        used = {n: sites[n] for n in sorted({*roles, controller})}  # the job's sites, as the controller reads them
        of_site(controller_route_problems(spec, controller, used, timeout_s=timeout_s))
    return said, answered


# run on the controller's host by its site's python, with `listen_host: auto` there: does its peer route?
ROUTE_PROBE = r"""
import json, sys
from rlctl.agents.listen import auto_route
from rlctl.errors import LaunchError
try:
    out = {"ok": True, "address": auto_route(*sys.argv[1:4])}
except LaunchError as e:
    out = {"ok": False, "detail": f"{e}: {e.hint}"}
print("RLCTL_PROBE " + json.dumps(out))
"""


def controller_route_problems(
    job: JobFile, name: str, sites: dict[str, Site], *, timeout_s: float = 60.0
) -> list[SiteLine]:
    """With `listen_host: auto` for the controller on site `name` (of the job's `sites`): whether the controller's
    host routes toward the peer `auto` picks (`controller_peer`); a SLURM site's node name that resolves only
    inside its cluster does not, and the controller would exit at start. One line, asked on the controller's first
    host (here for a site on this machine); a host that cannot be asked is left to `host_problems`."""
    from rlctl.agents.listen import AUTO, auto_route, controller_peer
    from rlctl.errors import LaunchError
    from rlctl.launch.backends import kind_of
    from rlctl.launch.siteprobe import SiteLine, probe_site_hosts

    site = sites[name]
    ours = f"site {name}: "  # (how auto_route's error begins: the controller's site)
    value = site.network.listen_host or job.transport.listen_host
    peer = controller_peer(sites, name) if value == AUTO else None
    if peer is None:
        return []
    if kind_of(site).on_this_machine:
        try:
            auto_route(name, *peer)
        except LaunchError as e:
            return [SiteLine(name, None, f"{e}: {e.hint}".removeprefix(ours))]
        return []
    [report] = probe_site_hosts(name, site, timeout_s=timeout_s, script=ROUTE_PROBE, args=[name, *peer], first=True)
    if report.error is not None or report.facts.get("ok", True):
        return []
    return [SiteLine(name, None, f"{report.facts.get('detail')} (asked on {report.host})".removeprefix(ours))]


def register(app: typer.Typer) -> None:
    @app.command()
    def check(
        files: Annotated[list[Path], typer.Argument(help="inventory files (clusters/*.yaml) or one job file")],
        reach: Annotated[
            bool,
            typer.Option(
                "--reach",
                help="probe every site: local, SSH login, SLURM controller (and a SLURM site's constraint and "
                "reservation); with a job, also ask each site's hosts, in the site's python, for rlctl, torch and "
                "CUDA, the job's engine and backend, and free disk",
            ),
        ] = False,
        timeout_s: Annotated[
            float, typer.Option("--timeout", help="per-site deadline, seconds", callback=seconds_at_least(0.1))
        ] = 10.0,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Validate inventories (or a job and its inventories); print sites, GPUs and links.

        With --reach, probe each site through its scheduler; exit 3 if some site is unreachable.

        With a job and --reach, every problem (the job file's, and what each site's hosts lack) is one line; exit 2.

        With -o json, one object whether it passes or not: ok, each problem's file, field (site, host), message, hint.
        """
        what = " ".join(shlex.quote(str(f)) for f in files)
        data: dict[str, Any] = {"ok": True, "problems": []}  # and what is known of the files, as it is read
        from rlctl.models.readonce import reads_once

        with (
            said_if_interrupted(lambda: f"the check of {what} did not finish (a check changes nothing); run it again"),
            reads_once(),  # (a model's config.json and weight headers read once)
        ):
            try:
                failed = _checked(files, data, reach=reach, timeout_s=timeout_s)
            except RlctlError as e:  # a program reading the JSON gets the verdict too, and the lines' fields
                if output is OutputFormat.json:
                    emit(data | {"ok": False, "problems": [_problem_row(p) for p in _each(e)]}, output, _table)
                raise
            emit(data, output, _table)
            if failed:
                raise PartialFailure(f"unreachable site(s): {', '.join(failed)}")


def _each(e: RlctlError) -> list[RlctlError]:
    """The problems `e` says, one each (JobProblems: one a line)."""
    return list(e.each) if isinstance(e, JobProblems) else [e]


def _problem_row(e: RlctlError) -> dict[str, Any]:
    """One problem as `check -o json` gives it: the file, the field (None: the file as a whole), a site's problem's
    site and host (None: the site as a whole), what is wrong and what to do."""
    if isinstance(e, SiteProblem):
        return {"file": e.file, "field": e.field, "site": e.site, "host": e.host, "message": e.detail, "hint": e.hint}
    if isinstance(e, ConfigError):
        return {"file": e.file, "field": e.field, "message": e.detail, "hint": e.hint}
    return {"file": None, "field": None, "message": str(e), "hint": e.hint}


def _checked(files: list[Path], data: dict[str, Any], *, reach: bool, timeout_s: float) -> list[str]:
    """`rlctl check FILES`: what they hold into `data` (the sites and links, the job, what --reach found), a problem
    raised; the sites --reach found unreachable."""
    from rlctl.config import load_inventory, load_job
    from rlctl.config.base import check_header, read_yaml
    from rlctl.launch.reach import ReachResult, probe_site
    from rlctl.ops.preflight import problems, refuse
    from rlctl.ops.preflight.sites import site_problems
    from rlctl.ops.preflight.slurmoptions import option_problems

    job = None
    jobs = []
    for f in files:  # a job file, or inventories: a file of neither kind is told so
        if (read := read_yaml(f)).get("kind") == "Job":
            jobs.append(f)
        else:
            check_header(f, read, "Inventory", reads=("Inventory", "Job"))
    if jobs and len(files) > 1:
        raise UsageError(
            f"{jobs[0]}: a job file is checked alone (its inventories are the ones its `inventory:` names)",
            hint=f"`rlctl check {jobs[0]}`, or `rlctl check` the inventory files without it",
        )
    if jobs:
        job = load_job(files[0])
        inv = job.inventory
        data.update(inventory_summary(inv))
        data["job"] = {
            "name": job.name,
            "file": str(files[0]),
            "mode": job.spec.pipeline.mode,
            "model": job.spec.model.arch.name,
            "task": job.spec.task.kind,
        }
        if reach:  # every problem, the file's and the hosts', one line each
            found, hosts = job_problems(job, timeout_s=max(timeout_s, 60.0))
            if found:
                raise JobProblems(str(files[0]), [line for line, _ in found], each=[e for _, e in found])
            data["hosts"] = [{"site": h.site, "host": h.host, **h.facts} for h in hosts]
        else:
            # check passing means launch can start it: every field is honoured or refused
            refuse(str(job.path), problems(job) + job_dir_problems(job))
    else:
        inv = load_inventory(files)
        data.update(inventory_summary(inv))
        # what stops their agents, as this machine sees
        refuse(", ".join(inv.files), site_problems(inv, inv.sites))
    if not reach:
        return []

    def reached(name: str, site: Site) -> tuple[ReachResult, list[Problem]]:
        """The site's reach row; and, reached, a SLURM site's constraint and reservation (a job's were asked with
        its hosts above)."""
        row = probe_site(name, site, timeout_s=timeout_s)
        if not row.ok or job is not None:
            return row, []
        return row, option_problems(name, site, file=inv.origin[name], timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=max(1, len(inv.sites))) as pool:
        answers = list(pool.map(lambda kv: reached(*kv), inv.sites.items()))
    refuse(", ".join(inv.files), [p for _, wrong in answers for p in wrong])  # sbatch refuses their jobs
    results = [row for row, _ in answers]
    data["reach"] = [r.__dict__ for r in results]
    failed = [r for r in results if not r.ok]
    data["ok"] = not failed
    data["problems"] = [
        _problem_row(SiteProblem(inv.origin[r.site], f"sites.{r.site}", f"unreachable: {r.detail}", site=r.site))
        for r in failed
    ]
    return [r.site for r in failed]
