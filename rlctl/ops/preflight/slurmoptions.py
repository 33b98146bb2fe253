"""Whether a SLURM site's own options fit its cluster, asked where its jobs are submitted: its `constraint`'s features
(sinfo: the features of its partition's nodes) and its `reservation` (scontrol: the reservations there, their
nodes, users and times). sbatch refuses a feature no node of the partition has (or features no one node has all
of), and a reservation that is not there (never made, or ended and purged) or not this user's; it holds a job in a
reservation on other nodes, or one not started yet, pending. Each said only as the launch submits its first job,
after the staging. A reservation that ends before the site's `time_limit_min` is refused by none: the job starts
(its end shown at its full limit), and SLURM ends it at the reservation's end (slurm.conf's `ResvOverRun`, by default
0), every agent's job killed short of the limit asked for, the reservation then gone for a resume.

    check --reach, launch (--resume), scale +N ─▶ a SLURM site with a constraint or a reservation, through the
                     runner its probe uses (here, or its submit host over SSH):
                       `sinfo -h -N -p PART -o '%N|%f'`                          the partition's nodes, features
                       `id -un`, `id -Gn`, `date`, `scontrol show config`,     (a reservation) who submits,
                       `scontrol show reservation -o`                             its clock and ResvOverRun, the
                                                                                reservations there
                  ─▶ one Problem each, `sites.<site>.scheduler.<field>`: the value, why, what is valid there

A constraint is read conservatively: its plain feature names are looked for (`a&b`, `a|b`, `[a|b]`, `a*2`,
`(a&b)|c`, `a,b`); a name after `!` is not (newer SLURM takes `!a`, and a feature no node has is then no refusal),
nor a word of other characters. Where each is there, the expression is evaluated on each node's features
(`slurmconstraint`: names, AND, OR, parentheses; brackets, counts and NOT are not, and pass). Whatever cannot be
told passes: sinfo or scontrol failing (the site's reach row says why), a reservation's access through an account or
group where the site's account or the user's groups are not known, an end time not in scontrol's default form.

An active reservation's end (`EndTime`) is compared with the submit host's clock, `date` asked there in the same
command, in scontrol's form: local time without a zone (`2026-12-07T00:59:07`), of the host and zone scontrol prints
in, not this machine's (an hour off where a daylight-saving change falls between). A `time_limit_min` past the
minutes left (and the cluster's `ResvOverRun`, asked in the same command: `N min`; 0 where not said) is one line on
that field, naming the reservation, its end and those minutes. A FLEX reservation's jobs may run past its end, and so
may every job where `ResvOverRun` is UNLIMITED: not said. Nor is it of a launched job (`launched_option_problems`: a
resume, scale), which runs as launched, as far as the reservation lets it.

What srun then refuses the probe's step for (an account or qos not the user's, a partition not there) is that field's
line too (`probe_refusal`), not the host's raw error. `launch`, `launch --resume` and `scale +N` ask the same
(`sites_option_problems`) before they make, stage or submit anything: a site whose cluster cannot be asked goes on,
its sbatch's own error said later, as before.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rlctl.config.hosts import expand_hostlist
from rlctl.config.inventory import Site
from rlctl.config.schedulers import SlurmScheduler
from rlctl.errors import LaunchError
from rlctl.launch.backends import SITES_FILE, read_sites
from rlctl.launch.slurm import SlurmBackend
from rlctl.ops.preflight.base import Problem
from rlctl.ops.preflight.slurmconstraint import parse_constraint, satisfies

FEATURE = re.compile(r"[A-Za-z0-9_.-]+")  # a plain feature name: the only words of a constraint looked for
NULL = ("", "(null)", "None")
SHOWN = 8  # reservations named as the valid ones, at most
ASK_S = 30.0  # launch's (and scale's) bound on asking a site's cluster, an SSH hop included (check: its --timeout)
# who submits the site's jobs, marked (the site's setup lines may print before it)
WHO = 'echo "rlctl-user=$(id -un)"; echo "rlctl-groups=$(id -Gn)"; '
# the submit host's clock, in scontrol's form and zone (its default SLURM_TIME_FORMAT, local time without a zone), and
# how long SLURM lets a job run on past its reservation's end (slurm.conf's ResvOverRun: `0 min`, `UNLIMITED`)
NOW = (
    'echo "rlctl-now=$(date +%Y-%m-%dT%H:%M:%S)"; '
    "scontrol show config 2>/dev/null | sed -n 's/^ResvOverRun *= */rlctl-overrun=/p'; "
)
SLURM_TIME = "%Y-%m-%dT%H:%M:%S"
OVERRUN = "rlctl-overrun"


def constraint_features(expression: str) -> list[str]:
    """The plain feature names of a `--constraint` expression (each once, in order), less those after `!` and words
    that are no plain name: `[a*2&b]|!c` → a, b."""
    if re.search(r"!\s*[(\[]", expression):  # a group negated (newer SLURM): which names must be there, unsure
        return []
    out = []
    for word in re.split(r"[&|,\[\]()]", expression):
        word = re.sub(r"\*\d+$", "", word.strip())
        if word and not word.startswith("!") and FEATURE.fullmatch(word):
            out.append(word)
    return list(dict.fromkeys(out))


def node_features(sinfo: str) -> dict[str, set[str]]:
    """sinfo's `-N -o '%N|%f'` lines: each node's available features (`(null)`: none)."""
    out: dict[str, set[str]] = {}
    for line in sinfo.splitlines():
        node, sep, said = line.strip().partition("|")
        if node and sep:
            out.setdefault(node, set()).update(f for f in said.split(",") if f not in NULL)
    return out


def reservations(scontrol: str) -> dict[str, dict[str, str]]:
    """`scontrol show reservation -o`'s lines (one a reservation), each as its fields; `No reservations in the
    system`: none."""
    out = {}
    for line in scontrol.splitlines():
        fields = dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", line))
        if fields.get("ReservationName"):
            out[fields["ReservationName"]] = fields
    return out


@dataclass(frozen=True)
class Submitter:
    """Who submits the site's jobs (`id -un`, `id -Gn` where sbatch runs), and the account they charge (the site's;
    None: the user's default, not known here)."""

    user: str
    groups: frozenset[str]
    account: str | None


def _match(value: str, mine: set[str] | None) -> bool | None:
    """Whether a reservation's `Users=`/`Accounts=`/`Groups=` list (`-name`: all but that one) lets in one of `mine`
    (None: the list names none, or `mine` is not known here)."""
    words = [w for w in value.split(",") if w not in NULL]
    if not words or mine is None:
        return None
    if any(w[1:] in mine for w in words if w.startswith("-")):
        return False
    named = {w for w in words if not w.startswith("-")}
    return bool(named & mine) if named else True


def _denied(fields: dict[str, str], who: Submitter) -> str | None:
    """Why `who` may not use the reservation (None: it may, or that cannot be told). Where it names users (or groups)
    and accounts, a job matching one of them may still be let in (SLURM's releases differ): said only where each it
    names fails, none passes, and none is unknown here (the site's account not given)."""
    said = {
        "users": (fields.get("Users", ""), _match(fields.get("Users", ""), {who.user})),
        "groups": (fields.get("Groups", ""), _match(fields.get("Groups", ""), set(who.groups) or None)),
        "accounts": (fields.get("Accounts", ""), _match(fields.get("Accounts", ""), _one(who.account))),
    }
    named = {k: v for k, v in said.items() if v[0] not in NULL}
    if not named or any(ok is not False for _, ok in named.values()):
        return None
    mine = {
        "users": f"the site's jobs are submitted as {who.user}",
        "groups": f"{who.user}'s groups are {', '.join(sorted(who.groups))}",
        "accounts": f"the site's jobs charge {who.account} (scheduler.account)",
    }
    return "; ".join(f"its {k} are {v}, and {mine[k]}" for k, (v, _) in named.items())


def _one(account: str | None) -> set[str] | None:
    return {account} if account is not None else None


def _said(fields: dict[str, str]) -> str:
    """One reservation as the list of valid ones names it: `r1 (nodes g-[1-2], users rl, ends 2026-12-07T20:05)`."""
    parts = [f"nodes {fields.get('Nodes', '?')}"]
    parts += [f"{k.lower()} {fields[k]}" for k in ("Users", "Groups", "Accounts") if fields.get(k, "") not in NULL]
    parts += [f"starts {fields['StartTime']}"] if fields.get("State") == "INACTIVE" else []
    parts += [f"ends {fields.get('EndTime', '?')}"]
    return f"{fields['ReservationName']} ({', '.join(parts)})"


def reservation_problem(
    name: str,
    sched: SlurmScheduler,
    said: dict[str, dict[str, str]],
    partition_nodes: set[str],
    who: Submitter | None,
    *,
    now: str | None = None,
    overrun: str | None = None,
) -> Problem | None:
    """Site `name`'s `reservation` against the reservations scontrol lists (`said`), its partition's nodes and who
    submits: not there (never made, or ended: SLURM purges a reservation at its end), for others, on nodes the
    partition has none of, not started yet, or ending before the site's `time_limit_min` from `now` (the submit
    host's clock, as `date` prints it there in scontrol's form) and its `overrun` (ResvOverRun as scontrol's config
    says it; 0 where not said). None where it is usable, or that cannot be told."""
    value = sched.reservation
    assert value is not None
    field = f"sites.{name}.scheduler.reservation"
    others = [_said(f) for n, f in sorted(said.items()) if n != value]
    valid = (
        f"those there: {'; '.join(others[:SHOWN])}{'; …' if len(others) > SHOWN else ''}"
        if others
        else "no other is there"
    )
    fields = said.get(value)
    if fields is None:
        why = "no such reservation (scontrol show reservation): never made, or ended (SLURM removes it at its end)"
        return Problem(field, f"{value!r}: {why}; sbatch refuses every agent's job; {valid}", _HINT)
    if who is not None and (denied := _denied(fields, who)) is not None:
        return Problem(field, f"{value!r} is not for the site's jobs: {denied}; sbatch refuses them; {valid}", _HINT)
    if "FLEX" in fields.get("Flags", "").split(","):  # its jobs may start before it, on nodes outside it
        return None
    try:
        nodes = set(expand_hostlist(fields.get("Nodes", "")))
    except ValueError:
        nodes = set()
    if nodes and partition_nodes and not nodes & partition_nodes:
        return Problem(
            field,
            f"{value!r} is on nodes {fields['Nodes']}, none of partition {sched.partition}'s (sinfo): every agent's "
            f"job would wait for ever; {valid}",
            "set the reservation's partition as scheduler.partition, or a reservation on its nodes",
        )
    if fields.get("State") == "INACTIVE":
        return Problem(
            field,
            f"{value!r} starts {fields.get('StartTime', '?')} (scontrol; ends {fields.get('EndTime', '?')}): every "
            "agent's job would wait until then",
            "check again once it has started, or leave reservation out",
        )
    if fields.get("State") == "ACTIVE":
        return _ends_first(name, sched, fields, now, overrun)
    return None


def _ends_first(
    name: str, sched: SlurmScheduler, fields: dict[str, str], now: str | None, overrun: str | None
) -> Problem | None:
    """The site's `time_limit_min` past the end of its active reservation (`fields`) and the `overrun` SLURM allows
    (`ResvOverRun`: `N min`; not said, its default 0), `now` being the submit host's clock: SLURM ends a job running
    in a reservation then (FLEX aside). None where it ends no sooner, the overrun is UNLIMITED, or a time does not
    parse."""
    over = (overrun or "0 min").strip().split()
    if len(over) != 2 or over[1] != "min" or not over[0].isdigit():  # UNLIMITED, or a form not known: no end told
        return None
    try:
        end = datetime.strptime(fields.get("EndTime", ""), SLURM_TIME)
        to_end_s = (end - datetime.strptime(now or "", SLURM_TIME)).total_seconds()
    except ValueError:
        return None
    limit, past = sched.time_limit_min, int(over[0])
    if limit * 60 <= to_end_s + 60 * past:
        return None
    to_end, most = max(0, int(to_end_s // 60)), max(0, int((to_end_s + 60 * past) // 60))
    after = f" and {past} min past it (ResvOverRun)" if past else " (ResvOverRun 0)"
    given = "" if "time_limit_min" in sched.model_fields_set else " (the default)"
    return Problem(
        f"sites.{name}.scheduler.time_limit_min",
        f"{limit}{given} is past the end of reservation {fields['ReservationName']!r} (scheduler.reservation): it "
        f"ends {fields['EndTime']}, {to_end} min from now on the submit host's clock (scontrol, date): SLURM ends "
        f"every agent's job at its end{after}: at most {most} min in, not {limit}, the reservation then gone for a "
        "resume",
        f"set scheduler.time_limit_min ≤ {most}, or a reservation that ends later"
        if most
        else "set a reservation that ends later, or leave reservation out",
    )


_HINT = "set one listed there, or leave reservation out (`scontrol show reservation` lists them)"


def constraint_problem(name: str, sched: SlurmScheduler, features: dict[str, set[str]]) -> Problem | None:
    """Site `name`'s `constraint` naming a feature no node of its partition has (sinfo's `features`), which sbatch
    refuses ('Invalid feature specification'), or one that each feature is there for but no single node satisfies
    (`a&b`, a on some nodes and b on others: 'Requested node configuration is not available'). None where each plain
    name is there and a node satisfies it, where it is a form not evaluated (`slurmconstraint`: brackets, counts,
    NOT), or where sinfo named no node."""
    value = sched.constraint
    assert value is not None
    if not features:
        return None
    field = f"sites.{name}.scheduler.constraint"
    hint = "name features the partition's nodes have, or leave constraint out"
    have = set().union(*features.values())
    missing = [f for f in constraint_features(value) if f not in have]
    if missing:
        valid = f"its nodes' features: {', '.join(sorted(have))}" if have else "its nodes have no features"
        return Problem(
            field,
            f"{value!r}: no node of partition {sched.partition} has {_features(missing)} (sinfo): "
            f"sbatch refuses every agent's job; {valid}",
            hint,
        )
    expr = parse_constraint(value)
    if expr is None or any(satisfies(expr, f) for f in features.values()):
        return None
    return Problem(
        field,
        f"{value!r}: no node of partition {sched.partition} has all it asks, its features each on some node (sinfo): "
        f"sbatch refuses every agent's job ('Requested node configuration is not available'); its nodes' features: "
        f"{_feature_sets(features)}",
        hint,
    )


def _feature_sets(features: dict[str, set[str]]) -> str:
    """The nodes' distinct feature sets, the most nodes' first: `h800,nvme (2 nodes); h800,ib (1 node); none (1
    node)`, at most SHOWN."""
    counts = Counter(",".join(sorted(f)) or "none" for f in features.values())
    sets = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    said = [f"{k} ({n} node{'s' * (n > 1)})" for k, n in sets[:SHOWN]]
    return "; ".join(said) + ("; …" if len(sets) > SHOWN else "")


def _features(names: list[str]) -> str:
    return ("feature " if len(names) == 1 else "features ") + ", ".join(map(repr, names))


def option_problems(
    name: str, site: Site, *, file: str | None = None, timeout_s: float, ends: bool = True
) -> list[Problem]:
    """Site `name`'s constraint and reservation against its cluster, asked through the runner its probe uses (one
    sinfo; scontrol only with a reservation): one Problem each, of `file` (the inventory that declares the site); []
    on other sites, without either, or where the cluster could not be asked (the site's reach row, or its probe,
    says why). `ends`: a time limit past the reservation's end said too (a new job's, not a launched one's)."""
    found = _asked(name, site, timeout_s=timeout_s, ends=ends)
    return [Problem(p.field, p.message, p.hint, file=file) for p in found]


def sites_option_problems(
    sites: Mapping[str, Site], *, files: Mapping[str, str | None], timeout_s: float, ends: bool = True
) -> list[Problem]:
    """`option_problems` of each of `sites` (of the file `files` names for it), the clusters asked at once, in the
    sites' order; no call at all where no site is a SLURM site with a constraint or a reservation."""
    asked = [name for name, site in sites.items() if _asks(site)]
    if not asked:
        return []
    with ThreadPoolExecutor(max_workers=len(asked)) as pool:
        found = pool.map(
            lambda n: option_problems(n, sites[n], file=files.get(n), timeout_s=timeout_s, ends=ends), asked
        )
        return [p for wrong in found for p in wrong]


def launched_option_problems(job_dir: Path, names: Iterable[str], *, timeout_s: float) -> list[Problem]:
    """`sites_option_problems` of a launched job's sites `names` as its job dir's sites.json has them (what `launch
    --resume` and `scale` run on, whatever the inventory says now): each of that file, its hint saying so."""
    sites = read_sites(job_dir)
    file = str(job_dir / SITES_FILE)
    used = {n: sites[n] for n in dict.fromkeys(names) if n in sites}
    # a launched job's time limit past its reservation's end is not said: it runs as launched (sites.json's limit),
    # as far as the reservation lets it, its checkpoints kept, versus a resume refused for a limit it cannot change
    found = sites_option_problems(used, files=dict.fromkeys(used, file), timeout_s=timeout_s, ends=False)
    why = f"the job runs on its sites as launched ({SITES_FILE}); to run on a changed inventory, launch the job anew"
    return [Problem(p.field, p.message, f"{p.hint}; {why}" if p.hint else why, file=file) for p in found]


def _asks(site: Site) -> bool:
    sched = site.scheduler
    return isinstance(sched, SlurmScheduler) and bool(sched.constraint or sched.reservation)


def _asked(name: str, site: Site, *, timeout_s: float, ends: bool) -> list[Problem]:
    sched = site.scheduler
    if not isinstance(sched, SlurmScheduler) or not _asks(site):
        return []
    runner = SlurmBackend.site_runner(site)
    out: list[Problem] = []
    try:
        res = runner.run(f"sinfo -h -N -p {shlex.quote(sched.partition)} -o '%N|%f'", timeout_s=timeout_s)
        if res.exit_code != 0:
            return []
        features = node_features(res.stdout)
        if sched.constraint and (p := constraint_problem(name, sched, features)) is not None:
            out.append(p)
        if sched.reservation:
            res = runner.run(WHO + NOW + "scontrol show reservation -o", timeout_s=timeout_s)
            if res.exit_code != 0:
                return out
            marks = [line.partition("=") for line in res.stdout.splitlines()]  # (a setup line's too: no `=` in it)
            said = {k: v for k, eq, v in marks if eq and k in ("rlctl-user", "rlctl-groups", "rlctl-now", OVERRUN)}
            user = said.get("rlctl-user", "").strip()
            who = Submitter(user, frozenset(said.get("rlctl-groups", "").split()), sched.account) if user else None
            listed = reservations(res.stdout)
            now = (said.get("rlctl-now", "").strip() or None) if ends else None  # no clock: no end told
            overrun = said.get(OVERRUN)
            if (
                p := reservation_problem(name, sched, listed, set(features), who, now=now, overrun=overrun)
            ) is not None:
                out.append(p)
    except LaunchError:  # (a deadline too): the site's reach row or its probe says why it could not be asked
        return out
    finally:
        runner.close()
    return out


_SACCTMGR = "`sacctmgr show assoc user=$USER format=account,partition,qos` lists yours"
# what srun says refusing the probe's step for a field of the site's (slurm 22.05's words), the field, what to do
REFUSALS = (
    ("Invalid account or account/partition combination specified", "account", _SACCTMGR),
    ("Job's account not permitted to use this partition", "account", _SACCTMGR),
    ("Invalid qos specification", "qos", _SACCTMGR),
    ("Job's QOS not permitted to use this partition", "qos", _SACCTMGR),
    ("invalid partition specified", "partition", "`sinfo -s` lists the partitions"),
    ("Invalid partition name specified", "partition", "`sinfo -s` lists the partitions"),
    ("Invalid feature specification", "constraint", "`sinfo -N -o '%N %P %f'` lists the nodes' features"),
    ("Requested reservation is invalid", "reservation", "`scontrol show reservation` lists them"),
    ("Access denied to requested reservation", "reservation", "`scontrol show reservation` lists them"),
)


def probe_refusal(name: str, site: Site, error: str, *, file: str | None = None) -> Problem | None:
    """The probe's srun on SLURM site `name` refused its step for one of the site's fields (`error`: what the probe
    said, srun's line in it), as one Problem naming the field, its value and srun's words; None for any other error
    (the host's line says it as it is)."""
    sched = site.scheduler
    if not isinstance(sched, SlurmScheduler):
        return None
    for words, field, hint in REFUSALS:
        if words.lower() in error.lower():
            value = getattr(sched, field)
            said = next((line for line in error.splitlines() if words.lower() in line.lower()), words)
            said = said[said.find("srun: ") :] if "srun: " in said else said
            given = f"{value!r}" if value is not None else "not set (the user's default)"
            return Problem(
                f"sites.{name}.scheduler.{field}",
                f"{given}: srun refused the probe's step on partition {sched.partition} ({said.strip()}): sbatch "
                "refuses every agent's job alike",
                hint,
                file=file,
            )
    return None
