"""The job directory: everything one run leaves on disk, and where its processes find each other.

There is one per site (sites share no filesystem, see rlctl.launch.sitefs): the operator's (below), and
on each site a staged copy of what agents read (job.json, plan.json, sites.json, secret, model/, data/)
where that site's agents write their logs and checkpoints; the controller's site's copy holds the
job's record (controller.json, events, metrics, evaluations, samples, summary), fetched back here
(rlctl.launch.record: the logs by the bytes they grew since the last fetch).
A JobDir is path arithmetic: the same class serves every site's copy.

runs/<name>-<YYYYmmdd-HHMMSS>/        ($RLCTL_HOME/runs/… when set; or `job_dir` / --job-dir)
  .job-id           the job's id when it is not the directory's name (`JobDir.id`)
  job.json          the resolved job (every default filled in), as the agents read it
  plan.json         GPU counts per role and how they were chosen
  secret            per-job HMAC secret of the tensor RPC (mode 0600)
  controller.json   the controller's RPC address and pid, written once it listens
  sites.json        the inventory entries of the job's sites (what the controller needs to scale)
  staged.json       per site: its job dir (per host view) and the files staged there (size, SHA-256)
  agents.jsonl      every agent started, by whom ever: site, backend, handle (pid/pgid, SLURM job, host)
  logs/<role>-<n>.log
  flight/rollout-<n>  a rollout unit's flight record: tokens it generated and had not yet sent (agents.flight)
  events.jsonl      one JSON object per event (agent joined / lost, iteration done, stop)
  metrics.jsonl     one line per iteration (reward, stage times, δ, throughput, staleness)
  evaluations.jsonl one line per held-out evaluation during the run (evaluation.every_iterations)
  samples.jsonl     one line per sample of every round the ledger retired (rlctl.agents.samplelog)
  .site-events.jsonl  the controller's site's events.jsonl as fetched, when it runs on another site (merged into
                    events.jsonl here, under the flock every append to it takes: `appending`)
  .site-events.merged what the last merge left of both (rlctl.launch.eventtail: the next appends what the site's grew)
  .site-manifests.json  the checkpoint manifests last read on sites over SSH, each by its file's stamp there: a look
                    asks a site for those new or changed only (rlctl.ops.surveycache)
  summary.json      the final summary (what `rlctl launch -o json` prints)
  model/init/       the starting policy (SFT warm-up), HF-style directory
  checkpoints/iter-N/{model/, ledger.json}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import secrets
import shlex
import tempfile
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlctl import __version__
from rlctl.config.base import first_error, read_yaml
from rlctl.config.inventory import RECORDED, Link
from rlctl.config.job import JobFile
from rlctl.errors import ConfigError, LaunchError, UsageError
from rlctl.launch.locks import launcher_holder, launcher_lock
from rlctl.launch.recordfiles import (
    append_row,
    json_file,
    json_lines,
    json_rows,
    open_record,
    record_text,
    replace_text,
    whole_object,
)
from rlctl.textutil import home_expanded

log = logging.getLogger(__name__)

HOME_ENV = "RLCTL_HOME"
# what an OS or a file system leaves in any directory, no one's files: a Mac's Finder (.DS_Store, ._name beside a
# file on a share), Windows Explorer (Thumbs.db, desktop.ini), NFS's name for a removed file still open (.nfs<hex>)
LITTER = re.compile(r"\.DS_Store|\._.+|Thumbs\.db|desktop\.ini|\.nfs[0-9A-Fa-f]+")
# what a job dir holds once a launch prepared it: a fresh launch there would overwrite the job's record
JOB_RECORD = ("job.json", "plan.json", "agents.jsonl", "summary.json")
# what a job's run writes (appends to) in its job dir, besides JOB_RECORD: in a directory no launch made (no secret,
# `JobDir.secret`, the first thing a launch writes there, before its index row: `launchdir.reserved`) one by these
# names is the user's, which the job would append to
RUN_RECORD = (
    "controller.json",
    "events.jsonl",
    ".site-events.jsonl",
    ".site-events.merged",
    "staged.json",
    "sites.json",
    *(f"{name}{cut}.jsonl" for name in ("metrics", "evaluations", "samples") for cut in ("", ".discarded")),
)


def default_base() -> Path:
    home = os.environ.get(HOME_ENV)
    return (Path(home) if home else Path.cwd()) / "runs"


ID_FILE = ".job-id"


class JobDir:
    def __init__(self, path: Path, *, job_id: str | None = None) -> None:
        self.path = path
        self._id = job_id  # the id a launch would give it (`launch --dry-run`), before it is recorded

    @property
    def id(self) -> str:
        """The job's id: what the index row, `rlctl status ID` and the sites' job dirs (`W/jobs/<id>`) name it by.
        The directory's name, unless its launch chose another (`name_as`: another job in the index has that name)
        and wrote it in `.job-id`."""
        if self._id is not None:
            return self._id
        try:
            recorded = (self.path / ID_FILE).read_text().strip()
        except OSError:  # none (or not a file): the directory's name
            return self.path.name
        # it names W/jobs/<id> on sites; a launch writes a directory's name (`JobDB.id_for`: `lr=1e-5-<digest>` of a
        # dir lr=1e-5), so any one name but . and .. is one
        if recorded and (recorded in (".", "..") or "/" in recorded or not recorded.isprintable()):
            raise LaunchError(
                f"{self.path / ID_FILE}: {recorded[:60]!r} is no job id (one directory name: no '/', not '.' or '..'; "
                "its launch wrote one such)",
                hint="put back the id its launch wrote (`rlctl status --all` lists them), or remove the file to use "
                "the directory's name",
            )
        return recorded or self.path.name

    def name_as(self, job_id: str) -> None:
        """Record `job_id` as the job's id (a fresh launch's, before its index row is committed: `JobDB.reserve`);
        the directory's name needs no record."""
        path = self.path / ID_FILE
        if job_id == self.path.name:
            path.unlink(missing_ok=True)
        else:
            replace_text(path, job_id + "\n")

    @staticmethod
    def choose_path(name: str, *, explicit: str | Path | None = None) -> Path:
        """`explicit` (the --job-dir flag or the job file's `job_dir`) wins; else a fresh timestamped dir."""
        if explicit is not None:  # `..` and `a/../b` resolved here: the directory's name is the job's id
            try:
                expanded = home_expanded(str(explicit))
            except ValueError as e:
                raise UsageError(f"{explicit}: {e}", hint="give the job directory as ~/… or in full") from e
            return Path(os.path.normpath(os.path.abspath(expanded)))
        path = default_base().absolute() / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        n = 1
        while path.exists():
            path = path.with_name(f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
            n += 1
        return path

    @classmethod
    def create(cls, name: str, *, explicit: str | Path | None = None) -> JobDir:
        """`explicit`, made if it is not there; else a new timestamped directory, made by this call alone (another
        launch in the same second, which chose the same name, made it first: the next name is taken)."""
        path = cls.choose_path(name, explicit=explicit)
        try:
            while explicit is None:
                try:
                    path.mkdir(parents=True)
                    break
                except FileExistsError:
                    path = cls.choose_path(name)
            path.mkdir(parents=True, exist_ok=True)
            (path / "logs").mkdir(exist_ok=True)
            (path / "checkpoints").mkdir(exist_ok=True)
        except OSError as e:
            raise LaunchError(f"cannot create job directory {path}: {e}") from e
        return cls(path)

    # -- paths --------------------------------------------------------------------------------------
    @property
    def job_json(self) -> Path:
        return self.path / "job.json"

    @property
    def plan_json(self) -> Path:
        return self.path / "plan.json"

    @property
    def controller_json(self) -> Path:
        return self.path / "controller.json"

    @property
    def summary_json(self) -> Path:
        return self.path / "summary.json"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def evaluations(self) -> Path:
        return self.path / "evaluations.jsonl"

    @property
    def samples(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def init_model(self) -> Path:
        return self.path / "model" / "init"

    def log(self, role: str, replica: int) -> Path:
        return self.path / "logs" / f"{role}-{replica}.log"

    def flight(self, agent: str) -> Path:
        return self.path / "flight" / agent

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def manifest_cache(self) -> Path:
        return self.path / ".site-manifests.json"

    def checkpoint(self, iteration: int) -> Path:
        return self.checkpoints / f"iter-{iteration}"

    # -- contents -----------------------------------------------------------------------------------
    def write_job(self, spec: JobFile, *, source: str, mapping: dict[str, Any] | None = None) -> None:
        """job.json: the job as launched (resolved: overrides, inputs), named by `source`, and the rlctl that
        launched it (`VERSION`); what a resume compares with it (`rlctl.ops.jobchanges`): the SHA-256 of each of its
        top-level fields, and, when `source` is a file, that file's path and mapping as they were at the launch
        (`mapping`, as the launch read it: an edit while it prepared the job is not the launch's; else read now)."""
        job = spec.model_dump(mode="json", by_alias=True)
        data: dict[str, Any] = {"source": source, "job": job, "job_sha256": job_digests(job), VERSION: __version__}
        # a resume refuses an edit of one of these (one of `PREPARED_FIELDS` only where the run would not take it)
        data[LAUNCHED] = {name: job_field(job, name) for name in (*FIXED_FIELDS, *PREPARED_FIELDS)}
        # the launch's record, not for editing (the `job` section is the one edited), the whole job: what a resume
        # prices the job as launched by, to tell an edit that raised a trainer rank's need (`rlctl.ops.resumememory.
        # judge_memory`), and tells the leaves edited since and the problems the launch already had by
        # (`rlctl.ops.resumecheck.edit_problems`)
        data[JOB_LAUNCHED] = job
        path = Path(source)
        if path.is_file() and mapping is not None:
            data["source_file"] = {"path": str(path.absolute()), "job": mapping}
        elif path.is_file():
            try:
                mapping = read_yaml(path)
            except ConfigError as e:  # (it was read a moment ago; a resume then has nothing to compare with)
                log.warning("%s: not kept for a resume to compare with: %s", path, e)
            else:
                mapping = json.loads(json.dumps(mapping, default=str))  # (a YAML date: as JSON reads it back)
                data["source_file"] = {"path": str(path.absolute()), "job": mapping}
        replace_text(self.job_json, json.dumps(data, indent=2) + "\n")  # (a reader meanwhile: old or new, whole)

    def refuse_lost_job_json(self, *, nothing: str | None = None) -> None:
        """UsageError, one line, for a job that was prepared (`prepare` writes plan.json before job.json) whose
        job.json is gone (removed by hand): it names the file and how to put it back (`nothing`: what the command
        then has nothing to do). A directory where job.json goes is said so (before: 'missing'). Nothing for a job.json
        that is there, or a directory with neither."""
        if self.job_json.is_dir():
            raise UsageError(
                f"{self.job_json}: a directory, where the job's resolved job (a file, written with its plan.json) goes"
                + (f"; {nothing}" if nothing else ""),
                hint="move it aside and put the job dir's job.json back from a copy",
            )
        if self.job_json.is_file() or not self.plan_json.is_file():
            return
        raise UsageError(
            f"{self.job_json}: missing (the resolved job, written with its plan.json)"
            + (f"; {nothing}" if nothing else ""),
            hint="put the job dir's job.json back from a copy",
        )

    def read_job(self) -> JobFile:
        try:
            data = json.loads(self.job_json.read_text())
        except (OSError, ValueError) as e:
            raise LaunchError(f"{self.job_json}: cannot read the resolved job: {e}") from e
        return self.job_of(data)

    def job_of(self, data: Any) -> JobFile:
        """The job of `data`, job.json's content as read (`read_job`, or a reader that needs its other fields too)."""
        if not isinstance(data, dict) or not isinstance(data.get("job"), dict):
            raise LaunchError(f"{self.job_json}: no 'job' mapping in it", hint="was it edited?")
        try:
            return JobFile.model_validate(data["job"], context=RECORDED)  # as its launch accepted it
        except ValidationError as e:  # a hand edit (the way a resumed job's settings change) a job file would refuse
            field, msg = first_error(e)
            raise ConfigError(
                str(self.job_json),
                f"job.{field}",
                msg,
                hint=f"edit job.{field} in job.json to a valid value (the resume runs the job as edited there)",
            ) from e

    def read_plan(self, *, as_placed: bool = False) -> dict[str, Any]:
        """plan.json, with what its reader places agents by checked; LaunchError naming the file and the field (a
        plan edited into another shape stopped a resume or attach on a KeyError, TypeError or ValueError traceback,
        and the controller on one in its log or its spawn thread). Two rules, `as_placed` tells them apart:

        - the launch's (a launch --resume, attach, and the controller's Spawner at each unit it adds): `trainer` (its
          `site`, `ranks` ≥ 1, and its `parallel` split's tp, pp, dp ≥ 1 where given), `rollout` (each group's
          `site`, `units` ≥ 0, `tp` ≥ 1) and `controller_site`. Every launch has written all of them
          (`rlctl.ops.counts.plan_counts`, since rlctl's first), so a plan an older rlctl wrote reads; the units the
          Scaler adds are recorded in agents.jsonl, never in plan.json; and the Spawner lays every agent out again
          from all three (`rlctl.launch.layout.layout`).
        - `as_placed` (the controller's `rlctl.agents.placement.Placement` as it starts): {} before `prepare` wrote
          it, its `rollout` groups, and its `trainer` only where it has one (`ranks` 1 where not given), no
          `controller_site`. The controller places by these alone, and the in-process mode (a ControllerAgent on a
          job dir of its own, with no sites.json: rlctl's tests) runs it on a plan of rollout groups alone; there it
          has no Spawner (`UnitStarts`), the one reader at the controller that needs the launch's shape.

        Under both, `links` and `dc_links` where given (`ops.jobprep`; a job dir written before them lacks them):
        each a list of pairs of two names, which the controller's Placement routes the weights by; and
        `link_figures` where given (a job dir written before 2026-12-07 lacks it): one entry per entry of `links`, its
        pair (`between`), its sites' `datacenters` (a pair of names) and the link's `bandwidth_gbps` and `latency_ms`
        as an inventory's link takes them, which a resume at another trainer split prices the weights' route over
        (`ops.jobchanges.launched_inventory`).

        The controller's copy is its site's, which may differ from the one the launch checked: edited there during
        the run, or staged again by an automatic resume from the operator's copy edited since. For a plan that may
        not be written yet, and of which a command reads a field or two, see `read_plan_or_none` and `plan_site`:
        the same checks, taken per field."""
        if as_placed and not self.plan_json.is_file():
            return {}
        plan = self._plan_object()
        if not as_placed or "trainer" in plan:
            self._check_trainer(plan, ranks_default=1 if as_placed else None)
        self._check_rollout(plan)
        self._check_links(plan)
        if not as_placed:
            self.plan_site(plan, "controller_site")
        return plan

    def _check_trainer(self, plan: dict[str, Any], *, ranks_default: int | None) -> None:
        self.plan_site(plan, "trainer", "site")
        t = plan["trainer"]
        self._count(t.get("ranks", ranks_default), "trainer.ranks", 1)
        if t.get("parallel") is not None:
            if not isinstance(t["parallel"], dict):
                raise self._plan_error("trainer.parallel", "not an object of tp, pp and dp")
            for k in ("tp", "pp", "dp"):
                self._count(t["parallel"].get(k), f"trainer.parallel.{k}", 1)

    def _check_rollout(self, plan: dict[str, Any]) -> None:
        groups = plan.get("rollout")
        if not isinstance(groups, list):
            raise self._plan_error("rollout", "no list of rollout groups")
        for i, g in enumerate(groups):
            if not isinstance(g, dict) or not isinstance(g.get("site"), str):
                raise self._plan_error(f"rollout[{i}]", "no object with a site name")
            self._count(g.get("units"), f"rollout[{i}].units", 0)
            self._count(g.get("tp", 1), f"rollout[{i}].tp", 1)

    def _check_links(self, plan: dict[str, Any]) -> None:
        # `links` (site pairs) and `dc_links` (datacenter pairs), which `ops.jobprep` writes and the controller's
        # Placement routes the weights by; either absent in a job dir written before it. An edited entry stopped the
        # controller on a TypeError, and a string of two characters was read as a pair ('ab': datacenters a and b).
        for key, names in (("links", "site"), ("dc_links", "datacenter")):
            if key not in plan:
                continue
            if not isinstance(plan[key], list):
                raise self._plan_error(key, f"no list of {names} pairs")
            for i, pair in enumerate(plan[key]):
                if not _names_pair(pair):
                    raise self._plan_error(f"{key}[{i}]", f"{pair!r} is not a pair of {names} names")
        if "link_figures" in plan:
            self._check_link_figures(plan["link_figures"], plan.get("links"))

    def _check_link_figures(self, figures: Any, links: Any) -> None:
        # `link_figures` (`ops.jobprep`): each link's figures, which a resume at another trainer split reads as an
        # inventory's link (`ops.jobchanges.launched_inventory`): an edited entry, unchecked, would stop it on a
        # KeyError or a pydantic traceback, or price the route over a link that `links` does not name
        if not isinstance(figures, list) or not isinstance(links, list) or len(figures) != len(links):
            raise self._plan_error("link_figures", "no list of one entry per entry of links (its figures)")
        for i, (entry, pair) in enumerate(zip(figures, links, strict=True)):
            where = f"link_figures[{i}]"
            if not isinstance(entry, dict) or entry.get("between") != pair:
                raise self._plan_error(where, f"no object of links[{i}]'s figures, whose between is {pair!r}")
            if not _names_pair(dcs := entry.get("datacenters")):
                raise self._plan_error(f"{where}.datacenters", f"{dcs!r} is not a pair of datacenter names")
            if missing := [k for k in ("bandwidth_gbps", "latency_ms") if k not in entry]:  # (not Link's default)
                raise self._plan_error(f"{where}.{missing[0]}", "required field is missing")
            try:  # as the inventory's link was taken, a launched job's figures as launched (`RECORDED`)
                Link.model_validate(
                    {k: entry[k] for k in ("between", "bandwidth_gbps", "latency_ms")}, context=RECORDED
                )
            except ValidationError as e:
                field, msg = first_error(e)
                raise self._plan_error(f"{where}.{field}", msg) from e

    def _count(self, value: Any, field: str, least: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise self._plan_error(field, f"{value!r} is not a count of {least} or more")

    def read_plan_or_none(self) -> dict[str, Any] | None:
        """plan.json for the operator's commands (pull, the record's fetch, stop), None before `prepare` wrote it.
        Only its top level is checked here (as `read_plan` checks it): each caller reads its few fields through
        `plan_site`, so a plan edited elsewhere still lets a stop or pull go on."""
        return self._plan_object() if self.plan_json.is_file() else None

    def plan_site(self, plan: dict[str, Any], *keys: str) -> str:
        """The site name at `keys` in `plan` (this job's plan.json); LaunchError naming the file and the field when
        it is not one, the line `read_plan` says of it."""
        value: Any = plan
        for i, key in enumerate(keys):
            if not isinstance(value, dict):
                raise self._plan_error(".".join(keys[:i]), "no object with a site name")
            value = value.get(key)
        if not isinstance(value, str):
            raise self._plan_error(".".join(keys), f"{value!r} is not a site name")
        return value

    def _plan_object(self) -> dict[str, Any]:
        plan = json_file(self.plan_json)
        if not isinstance(plan, dict):
            raise self._plan_error("(top level)", f"a JSON {type(plan).__name__}, where the plan is an object")
        return plan

    def _plan_error(self, field: str, what: str) -> LaunchError:
        return LaunchError(f"{self.plan_json}: {field}: {what}", hint="was it edited? put back its launch's")

    def write_json(self, path: Path, data: Any) -> None:
        replace_text(path, json.dumps(data, indent=2, default=str) + "\n")

    def read_json(self, path: Path) -> Any:
        return json_file(path)

    def launcher_lock(self) -> contextlib.AbstractContextManager[int]:
        """This process as the job's one launcher while inside (`rlctl.launch.locks.launcher_lock`)."""
        return launcher_lock(self)

    def launcher_holder(self) -> str | None:
        """Who holds the job's launcher lock ("pid N on HOST"), None when no launcher does (`locks.launcher_holder`)."""
        return launcher_holder(self)

    def secret(self) -> bytes:
        """The per-job secret, created (0600) on first use. ConfigError naming the file where it is not one (empty,
        not hex, not readable): `check_secret`."""
        p = self.path / "secret"
        if not p.exists():
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        return self._read_secret(p)

    def check_secret(self) -> None:
        """ConfigError naming the job's secret where it is there and not one (empty, not hex, not readable); none
        made where it is not. Read by the launcher before a run moves anything or starts any agent (`JobRun.start`),
        versus a ValueError's traceback in the controller's log after the run's agents started."""
        p = self.path / "secret"
        if p.exists() or p.is_symlink():
            self._read_secret(p)

    @staticmethod
    def _read_secret(p: Path) -> bytes:
        hint = "put the job's secret back from a copy of the job dir (or a site's copy of it, in its job dir there)"
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(str(p), None, f"the job's secret cannot be read ({e})", hint=hint) from e
        try:
            key = bytes.fromhex(text.strip())
        except ValueError:
            key = b""
        if not key:
            said = "empty" if not text.strip() else "not hex digits"
            raise ConfigError(str(p), None, f"{said}: the job's secret is hex digits (rlctl writes 64)", hint=hint)
        return key

    def append(self, path: Path, row: dict[str, Any]) -> None:
        append_row(path, row)

    def read_events(self, *kinds: str) -> list[dict[str, Any]]:
        """The job's events, one a line; given `kinds`, those of these kinds only, and the lines that name none of
        them are not parsed (a job of weeks writes a `weights_applied` event per weight version, 10⁴ and more; one of
        an older rlctl, one per unit and version: 64 units × 10⁴ versions, 640,000 lines, seconds and some 600 MB to
        parse each time); the file is read a line at a time, never held whole (its size, again, on each call). A line
        that is no JSON object is left out and said once (a warning naming the file and line): events.jsonl is
        appended to across runs, and a line cut short by a controller killed mid-write stays in it for good; status,
        resume, stop and report act on the events they can read. (A last line that does not parse yet is skipped
        unsaid, as `read_lines` does: its writer may be in the middle.)"""
        return list(self.iter_events(*kinds))

    def iter_events(self, *kinds: str) -> Iterator[dict[str, Any]]:
        """`read_events`, one event at a time as the file is read: a reader that keeps a bounded part of them (the
        latest scale events: `ScaleLog`) holds no more than that, versus every event of these kinds the job ever
        wrote at once. The lines left out are said once the file is read to its end."""
        if not self.events.exists():
            return
        names = tuple(f'"{k}"' for k in kinds)

        def parsed(line: str) -> bool:  # the others passed over; the last line and a line cut short (said once) not
            return not names or any(n in line for n in names) or not whole_object(line)

        skipped: list[str] = []
        with open_record(self.events) as f:  # a line at a time, versus the whole file (and its lines) held at once
            lines = (part for physical in f for part in physical.splitlines() or [""])  # (as str.splitlines numbers)
            for r in json_rows(self.events, lines, skipped=skipped, parsed=parsed):
                if not kinds or r.get("event") in kinds:
                    yield r
        say_once(skipped)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append the event to events.jsonl; the row appended."""
        row = {"t": round(time.time(), 3), "event": kind, **fields}
        self.append(self.events, row)
        return row

    def read_lines(self, path: Path) -> list[dict[str, Any]]:
        """The JSON objects of a .jsonl file, one a line. A last line that does not parse is skipped (its writer
        may be in the middle of it); any other: LaunchError naming the file and the line."""
        if not path.exists():
            return []
        return json_lines(path, record_text(path))

    def iter_lines(self, path: Path) -> Iterator[dict[str, Any]]:
        """`read_lines`, one row at a time as the file is read (never held whole): a reader that keeps a bounded
        part of them (a resume's running totals of metrics.jsonl: `RowBook`) holds no more than that."""
        if not path.exists():
            return
        with open_record(path) as f:
            yield from json_rows(path, (part for physical in f for part in physical.splitlines() or [""]))


_said: set[str] = set()  # the damaged lines `say_once` said in this process (`rlctl status -w` reads every poll)


def resume_points(events: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """(time, version) of each `resumed_from` among `events` (rows of events.jsonl) that says both (a resume with no
    time or version that is a number — null, text, a bool: an edited file — says nothing)."""
    return [
        (event_time(e), v)
        for e in events
        if e.get("event") == "resumed_from" and (v := row_count(e.get("version"))) is not None and event_time(e) > 0
    ]


def abandoned(event: dict[str, Any], resumes: list[tuple[float, int]]) -> bool:
    """Whether `event` (a row of events.jsonl that names its iteration: a scale) is no part of the job's history of
    scales (a resumed controller's summary and status, `rlctl report`'s): it belongs to a run a later resume of
    `resumes` (`resume_points`) abandoned, written before it, at or past the checkpoint it went back to (that
    checkpoint's iteration and those after it were trained again); or it is an edited row that says no time, or an
    iteration that is not a number (text, a bool; a null one is a scale at no iteration), which `rlctl report` leaves
    out, naming it (`reportrecord._event_lacks`), and the resumed controller kept ('two': text was a TypeError that
    killed it as it started, then kept in its summary.json)."""
    if row_count(event.get("t")) is None or (
        event.get("iteration") is not None and row_count(event.get("iteration")) is None
    ):
        return True
    iteration = row_count(event.get("iteration")) or 0
    return any(event_time(event) < t and iteration >= v for t, v in resumes)


def event_time(row: dict[str, Any]) -> float:
    """The time (time.time()) a row of events.jsonl or metrics.jsonl was written; 0 (before anything) where it has
    none: missing, null, or edited into text or a bool (`float` raised on null and text, a traceback)."""
    t = row.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        return 0.0
    return float(t)


def row_count(value: Any) -> int | None:
    """A row's iteration or version (metrics.jsonl, evaluations.jsonl, an event's) as an int; None where it has no
    number there (missing, null, text, a bool: a row of an older version, an edited one), as `event_time` reads a
    row's time."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value)


def _names_pair(value: Any) -> bool:
    """Whether `value` is a pair of names as plan.json writes one (a list of two strings; 'ab' is not)."""
    return isinstance(value, list) and len(value) == 2 and all(isinstance(n, str) for n in value)


def say_once(lines: list[str]) -> None:
    """Log each of `lines` (what a reader of a .jsonl file left out: `json_lines`'s `skipped`) as a warning, once
    per process."""
    for line in lines:
        if line not in _said:
            _said.add(line)
            log.warning("%s", line)


def why_not_made(path: Path) -> str | None:
    """Why this machine cannot make (or write into) the directory `path`, None when it can: the nearest of it and its
    parents that exists is a file, or takes no new entry. The latter is asked by making an empty directory there and
    removing it: permission bits do not tell root that /proc or a read-only mount refuses one. `path` is expanded
    already (`choose_path`, `load_job`'s job_dir, a site's `work_root`: `home_expanded`'s one rule)."""
    path = path.absolute()
    there = path
    while not there.exists() and there != there.parent:
        there = there.parent
    if not there.is_dir():
        return f"{there} is a file, not a directory" if there == path else f"{path}: {there} is a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlctl-probe-", dir=there))
    except OSError as e:
        return f"{path}: cannot make a directory in {there} ({e.strerror or e})"
    return None


def refuse_taken(path: Path, *, named_by: str = "--job-dir", resume: str | None = None) -> None:
    """Before a fresh launch into `path` (`named_by`: the --job-dir flag, or the job file's `job_dir` field): refused
    when it cannot be made (`why_not_made`), already holds a job (UsageError, one line: the launch would overwrite
    that job's record, which `resume` continues: `launch --resume`, by default), or a launch still prepares one there
    (its launcher lock held, its record not written yet: the new launch would put its index row over that
    launch's), or holds files by the names a run writes (`RUN_RECORD`) that no launch did (the user's events.jsonl,
    metrics.jsonl: the job appended to them)."""
    other = f"another {named_by.rpartition(': ')[2]}"
    if not path.name:  # no name to be the job's id (W/jobs/<id> on its sites)
        raise UsageError(f"{named_by}: {path} is the filesystem's root, not a job directory", hint=f"choose {other}")
    if (why := why_not_made(path)) is not None:
        raise UsageError(f"{named_by}: {why}", hint=f"choose {other}")
    held = [name for name in JOB_RECORD if (path / name).exists()]
    holder = JobDir(path).launcher_holder()
    if held:
        how = f"continue that job with `{resume or resume_command(path)}`, or " if "job.json" in held else ""
        if holder is not None:  # a launcher watches it: a resume is refused (`has a launcher already`)
            how = f"its launcher ({holder}) runs it: watch it with `rlctl status {shlex.quote(str(path))}`, or "
        raise UsageError(
            f"{named_by}: {path} already holds a job ({', '.join(held)}); a new launch there would overwrite it",
            hint=f"{how}choose {other}",
        )
    if holder is not None:  # a launch preparing it: no record written yet
        raise UsageError(
            f"{named_by}: {path}: a launch is preparing a job there ({holder}); a new launch would take its place",
            hint=f"watch it with `rlctl status {shlex.quote(str(path))}`, or choose {other}",
        )
    theirs = [] if os.path.lexists(path / "secret") else [n for n in RUN_RECORD if os.path.lexists(path / n)]
    if theirs:  # (a launch writes the secret as it reserves its index row: one that ended before `prepare` left it)
        raise UsageError(
            f"{named_by}: {path} holds {', '.join(theirs)}, which rlctl did not write (no launch made a job there); "
            "a launch appends its record to files by these names",
            hint=f"move them aside, or choose {other}",
        )


def refuse_theirs(directory: Path, *, ours: Collection[str], did: str, then: str, hint: str) -> None:
    """ConfigError, one line, when `directory`, a job dir's data/, model/ or reward/, holds a name that is not one of
    `ours` (what rlctl writes there): a launch into a directory that is no job's (the job file's own), whose data/,
    model/ or reward/ is the user's, wrote over, linked into or deleted it, and staged it to every site as the job's.
    The line names up to three of its names, says rlctl did not `did` them, then what a launch does there (`then`).
    A file (or a link to nothing) by that name is refused as well: making the directory there failed, a traceback.
    An OS's litter (`LITTER`: .DS_Store, NFS's .nfs<hex>) is no one's: it refused a relaunch into a job dir."""
    if os.path.lexists(directory) and not directory.is_dir():
        what = "a file" if directory.exists() else "a link to nothing"
        raise ConfigError(str(directory), None, f"is {what}, which rlctl did not {did}; {then}", hint=hint)
    names = (p.name for p in directory.iterdir()) if directory.is_dir() else iter(())
    theirs = sorted(n for n in names if n not in ours and not LITTER.fullmatch(n))
    if theirs:
        raise ConfigError(
            str(directory),
            None,
            f"holds {', '.join(theirs[:3])}{' …' if len(theirs) > 3 else ''}, which rlctl did not {did}; {then}",
            hint=hint,
        )


# the fields of a job that its checkpoints depend on, as job.json's `launched` keeps them from the launch: an edit of
# one in job.json is refused by a resume (`rlctl.ops.jobchanges.refuse_fixed_edits`), not run on the checkpoint
# (a model's path is not: a directory moved since holds the same model, and the checkpoints carry its weights)
FIXED_FIELDS = ("batch.samples_per_prompt", "model.kind", "model.name", "seed", "task.kind", "trainer.lora")
# the model kinds whose `model.name` picks the weights' names and shapes (`BUILTIN_MODELS`, an architecture's
# figures); an HF model's is only the label of the architecture its directory holds (`check_hf_dir`): not fixed
NAME_FIXES_WEIGHTS = ("builtin", "arch")
# the fields of a dataset task's job that its prepared data (data/, data-heldout/: tokenized once, at the launch,
# `rlctl.ops.inputs.prepare_data`; a resume never tokenizes again) is made of, kept in `launched` beside
# `FIXED_FIELDS`: the run reads the prepared data whatever job.json says of them since, so a resume refuses an edit
# of one (`rlctl.ops.preparededits.refuse_prepared_edits`). `evaluation.heldout_prompts` only where the launch prepared
# no held-out rows (the run reads that many of data-heldout/'s); shuffle, shuffle_seed, max_output_tokens are the
# run's to read, not the preparation's
PREPARED_FIELDS = (
    "task.path",
    "task.prompt_key",
    "task.answer_key",
    "task.data_source_key",
    "task.extra_info_key",
    "task.template_strings",
    "task.chat_template_kwargs",
    "task.max_prompt_tokens",
    "task.bad_rows",
    "evaluation.path",
    "evaluation.heldout_prompts",
)
LAUNCHED = "launched"
# job.json's fields a trainer rank's memory is priced on (`rlctl.ops.preflight.memory.trainer_memory_refusal`): the
# model's figures, its task's rows, the batch's cuts, the trainer's backend, checkpointing and LoRA, the algorithm's
# reference policy, critic and mini-batches; their launch values are kept in job.json's `JOB_LAUNCHED`
MEMORY_FIELDS = ("algorithm", "batch", "model", "task", "trainer")
# the whole job as launched (an rlctl before 2026-12-08 kept `MEMORY_FIELDS` alone: `launched_job` tells them apart)
JOB_LAUNCHED = "job_launched"
# job.json's top-level field naming the rlctl that launched the job (`rlctl.__version__`): none in a job an rlctl
# before it launched, whose loss this rlctl may compute otherwise (`rlctl.ops.jobchanges.older_rlctl_changes`)
VERSION = "rlctl_version"


def job_field(job: dict[str, Any], name: str) -> Any:
    """The value of the dotted field `name` in a job's mapping (None where it or a mapping above it is missing)."""
    value: Any = job
    for key in name.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def launched_job(data: Any) -> dict[str, Any] | None:
    """job.json's whole job as launched (its `JOB_LAUNCHED`); None where it keeps `MEMORY_FIELDS` alone (an rlctl
    before the whole job was kept) or nothing."""
    record = data.get(JOB_LAUNCHED) if isinstance(data, dict) else None
    if not isinstance(record, dict) or record.keys() <= set(MEMORY_FIELDS):
        return None
    return record


def job_digests(job: dict[str, Any]) -> dict[str, str]:
    """The SHA-256 of each top-level field of a job's mapping (its JSON, keys sorted): what names the fields of a
    job.json edited since its launch."""
    return {k: hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest() for k, v in job.items()}


def resume_command(job: str | Path) -> str:
    """The command that continues `job`: its index id (`JobDir.id`) or, for a job not in the
    index, its directory."""
    return f"rlctl launch --resume {shlex.quote(str(job))}"
