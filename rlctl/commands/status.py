"""`rlctl status [JOB] [-w]`: a running job's live view (controller), else what each site's scheduler says."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from rlctl.commands import said_if_interrupted, seconds_at_least
from rlctl.errors import PartialFailure, UsageError
from rlctl.render import OutputFormat, OutputOpt, emit, grid, reward_failures_line
from rlctl.textutil import duration, one_line

# one rule for a job named by its name and for none named: the one launched (or resumed) last (`rlctl.ops.jobref`)
JobArg = Annotated[
    str | None,
    typer.Argument(
        help="job name (its run launched last), id or job directory (default: the job launched or resumed last)"
    ),
]
# `stop` and `scale` change a running job: none named is the one job that runs, where one does
# (`jobref.resolve(..., changes=COMMAND)`), and is refused while several run
RunningJobArg = Annotated[
    str | None,
    typer.Argument(
        help="job name (its run launched last), id or job directory (default: the job that runs; refused while "
        "several run; none running: the job launched or resumed last)"
    ),
]


def _f(v: Any, spec: str = ".2f") -> str:
    """A figure formatted by `spec`; '-' for null, and one that is no number (a kept row edited by hand, the live
    figures before a resumed run's first iteration) as it is, versus a ValueError traceback."""
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, int | float) and not isinstance(v, bool) else str(v)


def _weights_line(w: dict[str, Any]) -> str:
    """Newest version; the last delivered one: seconds until the last unit had it, bytes, inter-DC copies."""
    n = w.get("units_at_version")
    line = f"v{w.get('version')} ({w.get('sync')}), {n} unit{'' if n == 1 else 's'} at it"  # ('1 units at it')
    done = [r for r in w.get("versions", []) if r.get("seconds_to_last_unit") is not None]
    if done:
        r = done[-1]
        links = ", ".join(f"{k} {x['copies']}× {x['bytes']:,} B" for k, x in r["inter_dc"].items()) or "no inter-DC"
        line += f"; v{r['version']}: all units in {r['seconds_to_last_unit']:.3f} s, {r['bytes']:,} B pulled, {links}"
    return line


# the step's figures of some jobs alone (rlctl.agents.views.TRAINING_IF_ANY): key, label, format
OPTIONAL_LOSSES = (
    ("kl_ref", "kl ref", ".3g"),  # algorithm.kl_coef > 0
    ("value_loss", "value loss", ".4g"),  # PPO's critic
    ("router_aux_loss", "router aux loss", ".4f"),  # a MoE whose loss has its load-balancing term
)


def step_losses(t: dict[str, Any]) -> str:
    """A step's policy loss and its KL to the sampling policy (`-` where the step had none: no token trained, a
    gradient not finite), from status's `training` figures: the head of `training_line` and what `rlctl launch`'s
    line per iteration shows of the step (`rlctl.commands.launching.views.progress_line`)."""
    return f"loss {_f(t.get('loss'), '.4g')}  kl {_f(t.get('kl'), '.3g')}"


def training_line(t: dict[str, Any]) -> str:
    """The last optimizer step: the policy's loss and its KL to the sampling policy, then the figures of the job's
    algorithm and model alone, where its step has them (the KL to the reference that kl_coef multiplies, PPO's critic
    loss, a MoE's router load-balancing loss), its rate, gradient norm, the policy's entropy, clipped tokens, samples
    without signal (`-` for a figure the iteration did not have), the groups dynamic sampling dropped meanwhile, and
    whether the latest steps were skipped for a gradient that was not finite."""
    losses = "".join(f"  {label} {_f(t[k], spec)}" for k, label, spec in OPTIONAL_LOSSES if k in t)
    dropped = f"  dropped {t['dropped_groups']} groups" if t.get("dropped_groups") else ""
    # NaN or infinite gradients: the latest steps made no update
    skipped = f"  SKIPPED (gradient not finite; {t['skipped_in_a_row']} in a row)" if t.get("skipped_in_a_row") else ""
    return (
        f"{step_losses(t)}{losses}  lr {_f(t.get('lr'), '.2e')}"
        f"  grad norm {_f(t.get('grad_norm'), '.3f')}  entropy {_f(t.get('entropy'), '.3f')}"
        f"  clipped {_f(t.get('clip_frac'), '.3f')}  no signal {_f(t.get('no_signal_frac'), '.2f')}{dropped}{skipped}"
    )


def evaluations_line(h: dict[str, Any] | None) -> str:
    """The run's last held-out evaluation beside its first: greedy reward (and exact answers, digits)."""
    if not h:
        return "-"

    def one(r: dict[str, Any]) -> str:
        exact = f", exact {_f(r.get('greedy_exact'), '.3f')}" if r.get("greedy_exact") is not None else ""
        # else a reward that raised on every answer reads as the policy's figure (`reward_on_error` each)
        failed = f", {r['reward_failures']} reward calls failed" if r.get("reward_failures") else ""
        return f"v{r['version']}: greedy reward {_f(r.get('greedy_reward'), '.3f')}{exact}{failed}"

    first, last = h["first"], h["last"]
    tail = f"  (first {one(first)})" if first["version"] != last["version"] else ""
    return f"{one(last)}{tail}  over {last.get('prompts')} prompts"


BY_SOURCE = "greedy_reward_by_source"  # (rlctl.rl.source.BY_SOURCE: not imported by the CLI's modules)


def heldout_source_rows(h: dict[str, Any] | None) -> list[list[str]]:
    """Below the held-out row, one short row per data_source of a mixed job's last evaluation (its rows have 2+): the
    source's greedy reward, and its first evaluation's beside it — a mean over GSM8K and MATH hides one regressing."""
    if not h:
        return []
    first, last = h["first"], h["last"]
    by_source = last.get(BY_SOURCE)
    if not isinstance(by_source, dict) or len(by_source) < 2:
        return []
    before = first.get(BY_SOURCE) if first["version"] != last["version"] else None
    before = before if isinstance(before, dict) else {}
    return [  # (a source and an edited row's figure as written, line breaks and control characters escaped)
        [
            f"  {one_line(src)}",
            one_line(
                f"v{last.get('version')}: greedy reward {_f(x, '.3f')}"
                + (f"  (first v{first.get('version')}: {_f(before[src], '.3f')})" if src in before else "")
            ),
        ]
        for src, x in sorted(by_source.items())
    ]


def time_line(v: dict[str, Any]) -> str:
    """'running 3 d 04 h; ≈ 1 d 02 h left at 41.2 s an iteration (last 20)' from a live status ('paused: …' of a
    paused job, versus an estimate at the pace from before the pause); a resumed job's
    'running 2 h 00 min (this run; 3 d 04 h since the job's first start)', versus 'running 2 h 00 min' read as the job's
    (and '(this run; job 3 d 04 h)', read as the job's running time, of a job stopped for days between its runs)."""
    out = f"running {duration(v['elapsed_s'])}" if v.get("elapsed_s") is not None else "running"
    if v.get("elapsed_s") is not None and v.get("job_elapsed_s") is not None:
        out += f" (this run; {duration(v['job_elapsed_s'])} since the job's first start)"
    if v["iteration"] >= v["iterations"]:
        return out + "; no iteration left"
    if v.get("state") == "paused":  # it trains nothing while it waits: the pace from before is no estimate
        return out + "; paused: no time left estimated while it waits (the paused row says why)"
    if v.get("pace_s") is None or v.get("eta_s") is None:
        return out + f"; time left: known after {v.get('pace_after_iterations', 4)} iterations of this run"
    return out + f"; ≈ {duration(v['eta_s'])} left at {v['pace_s']:.1f} s an iteration (last {v['pace_iterations']})"


def rebalance_line(r: dict[str, Any]) -> str:
    """`auto: δ < δ'` from the rule's last reading; before its first (no iteration trained yet) what it waits for,
    versus 'manual: -'."""
    if r.get("why"):
        return f"{'auto' if r['auto'] else 'manual'}: {r['why']}"
    return "auto: measuring from the first trained iteration" if r["auto"] else "manual: automatic rebalancing is off"


def checkpoint_line(c: dict[str, Any] | None) -> str:
    """'v120, 4 min 10 s ago (every 20 iterations)' / 'none complete yet (…)' / '… (only at the end)'."""
    if c is None:
        return "-"
    every = c.get("every_iterations")
    how = f"every {every} iterations" if every else "only at the end"
    if c.get("version") is None:
        return f"none complete yet ({how})"
    age = f", {duration(c['age_s'])} ago" if c.get("age_s") is not None else " (resumed from)"
    return f"v{c['version']}{age} ({how})"


def metrics_line(m: dict[str, Any] | None) -> str:
    """'http://10.0.0.5:9400/metrics', with what keeps another machine's Prometheus from scraping it: a loopback
    address (named by the setting it came from, as the controller says: the site's network.listen_host where it
    sets one, else transport.listen_host) and a port picked anew each run."""
    if not m:
        return "-"
    host, _, port = m["address"].rpartition(":")
    notes = []
    if host.startswith("127.") or host in ("::1", "localhost"):
        notes.append(f"this machine only: set {m.get('listen_field', 'transport.listen_host')} to a reachable address")
    if not m.get("port_fixed"):
        notes.append("a new port each run and resume: set metrics.port")
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
    return url + (f"  ({'; '.join(notes)})" if notes else "")


def suspects_line(suspects: dict[str, int]) -> str:
    """Prompts running alone on a unit after unit losses (rlctl.agents.unitloss `_blame`)."""
    return ", ".join(f"{g} ({n} unit losses)" for g, n in suspects.items()) + ": each runs alone on a unit"


def gone_line(gone: dict[str, int]) -> str:
    """The agents that went, per end state (the live status's `agents_gone`)."""
    return ", ".join(f"{state} {n}" for state, n in gone.items() if n)


def _per_site(counts: dict[str, Any]) -> str:
    """`{'local': 1, 'h20': 0}` as `local 1, h20 0` (a Python dict's text is no table's)."""
    return ", ".join(f"{k} {n}" for k, n in counts.items()) or "-"


def _figures_age(age_s: Any) -> str:
    """How old the live view's figures are: none trained by this run yet (a fresh start, or a resumed run showing its
    checkpoint's last row) says so, versus 'figures - s old'."""
    return "no iteration trained by this run yet" if age_s is None else f"figures {_f(age_s, '.1f')} s old"


COPY_SAID = "shown here, and what stop or scale acts on"


def copy_rows(s: dict[str, Any]) -> list[list[str]]:
    """A job dir that is a copy of one whose launcher runs the job (`copy_of_running`): the dir it copies, where the job
    runs, said as such (what status shows is that run; a `stop` or `scale` of the copy acts on it), versus the copy's
    dir alone, as if it were the job's."""
    c = s.get("copy_of")
    if c is None:
        return []
    return [["copy of", f"{c['job_dir']}, where the job runs (its launcher: {c['launcher']}): {COPY_SAID}"]]


ROLE_ORDER = {"controller": 0, "trainer": 1, "rollout": 2}


def _agent_order(a: dict[str, Any]) -> tuple[int, str, int, str]:
    """The live table's agents as the job dir's table has them: the trainer, then the rollout units by replica as a
    number, versus the order they joined in (after a resume or a scale, rollout-1 above the trainer, rollout-10
    above rollout-2)."""
    prefix, _, n = str(a["name"]).rpartition("-")
    replica = int(n) if n.isascii() and n.isdigit() else -1
    return ROLE_ORDER.get(a["role"], len(ROLE_ORDER)), prefix, replica, str(a["name"])


def warning_rows(s: dict[str, Any]) -> list[list[str]]:
    """A row a warning its launcher recorded for the run shown (`rlctl.ops.operate._with_warnings`: a trainer rank
    this rlctl prices past its GPU, said as the resume started it), one line each."""
    return [["warning", str(w).removeprefix("warning: ")] for w in s.get("warnings", [])]


def _live_table(s: dict[str, Any]) -> str:
    v = s["live"]
    w = v.get("weights", {})
    led = v["ledger"]
    res = v.get("resilience") or {}
    rows = [
        ["state", f"{v['state']}  ({v['mode']}, η={v['eta']})"],
        # why a paused job waits, and units replaced or given up on (docs/runtime.md: the table left both out, the
        # state said `paused` and nothing of which site since when)
        *([["paused", str(res["paused"]).removeprefix("paused: ")]] if res.get("paused") else []),
        *warning_rows(s),
        ["iteration", f"{v['iteration']}/{v['iterations']}  ({_figures_age(s.get('figures_age_s'))})"],
        ["time", time_line(v)],
        ["checkpoint", checkpoint_line(v.get("checkpoint"))],
        ["reward", _f(v.get("reward"), ".3f")],
        *([["reward failures", failures]] if (failures := reward_failures_line(v.get("rewards") or {})) else []),
        ["T_gen / T_train", f"{_f(v.get('t_gen_s'))} / {_f(v.get('t_train_s'))} s"],
        ["last step", training_line(v.get("training", {}))],
        ["held-out", evaluations_line(v.get("heldout"))],
        *heldout_source_rows(v.get("heldout")),
        ["δ (window) / δ'", f"{_f(v.get('delta_window_s'), '+.2f')} / {_f(v.get('delta_prime_s'))} s"],
        ["rebalance", rebalance_line(v["rebalance"])],
        ["rollout units", f"{v['rollout_units']}  free slots {_per_site(v['free_slots'])}"],
        *([["resilience", res["note"]]] if res.get("note") else []),
        # the agents that went: the table below lists one until the next iteration's metrics row
        *([["agents gone", gone_line(v["agents_gone"])]] if any(v.get("agents_gone", {}).values()) else []),
        ["samples/s  tokens/s", f"{_f(v.get('samples_per_s'), '.1f')}  {_f(v.get('tokens_per_s'), '.0f')}"],
        ["weights", _weights_line(w)],
        # samples the trainer found staler than η (must stay 0), versus in `--output json` and the summary alone
        [
            "staleness",
            f"{' '.join(f'{k}:{n}' for k, n in v['staleness'].items()) or '-'}  violations {v['staleness_violations']}",
        ],
        ["ledger", " ".join(f"{k} {n}" for k, n in led.items())],
        *([["suspect prompts", suspects_line(v["suspects"])]] if v.get("suspects") else []),
        ["metrics", metrics_line(v.get("metrics"))],
        ["job dir", s["job_dir"]],
        *([["launcher", s["launcher"]]] if s.get("launcher") else []),
        *copy_rows(s),
    ]
    agents = [
        [
            a["name"],
            a["role"],
            a.get("site", ""),
            a["state"] + (" (draining)" if a.get("draining") else ""),
            f"v{a['version']}",
            _f(a["heartbeat_age_s"], ".1f"),
            _f(a["busy_s"], ".1f"),
            f"{a['phase']} {a['phase_s']:.1f} s" if a.get("phase") else "-",
            a["inflight"],
        ]
        for a in sorted(v["agents"], key=_agent_order)
    ]
    head = grid(rows, ["", ""], f"Job {s['id']} (live from the controller, {s['controller_latency_s']:.2f} s)")
    body = grid(
        agents, ["agent", "role", "site", "state", "weights", "heartbeat age s", "busy s", "busy in", "in flight"]
    )
    return head + "\n\n" + body


def checkpoints_line(s: dict[str, Any]) -> str:
    """An ended job's complete checkpoints, how to continue from one and where each one's figures are: 'v10, v20
    (`rlctl launch --resume ID --checkpoint V` continues from V; `--iterations N` trains on to N; `rlctl status ID
    --checkpoints` shows …)'."""
    c = s["checkpoints"]
    held = ", ".join(f"v{v}" for v in c["versions"])
    return (
        f"{held} (`{c['resume']} --checkpoint V` continues from V; `--iterations N` trains on to N; `{c['list']}` "
        "shows each one's reward and held-out figures)"
    )


def index_line(s: dict[str, Any]) -> str:
    """The job index's state; where it says the job runs and every agent is known to have exited, without a
    summary, that it ended without one (a controller killed with its launcher: only the agents' logs say how). An
    agent whose site did not answer may run: then the row is not contradicted."""
    from rlctl.ops.jobdb import LIVE

    state = s["index_state"]
    exited = s["agents"] and all(a["state"].startswith("exited") for a in s["agents"])
    if state in LIVE and "summary" not in s and exited:
        return f"{state}, but no agent runs and no summary was written: it ended without one (`rlctl logs` says how)"
    return state


def outcome_rows(summary: dict[str, Any]) -> list[list[str]]:
    """What an ended run's summary says of its outcome, as `launch` printed it: the sampled reward, first → last,
    the reward calls that failed, and the held-out evaluation of the starting and the final policy (none where the
    summary lacks it, or a hand edit left it unreadable)."""
    from rlctl.ops.evaluation import heldout_line

    rows = []
    if isinstance(summary.get("reward_first"), int | float) and isinstance(summary.get("reward_last"), int | float):
        window = summary.get("reward_window", "?")
        rows.append(
            [
                "reward",
                f"{_f(summary['reward_first'], '.3f')} → {_f(summary['reward_last'], '.3f')} (mean of first/last "
                f"{window})",
            ]
        )
    if isinstance(r := summary.get("rewards"), dict) and (failures := reward_failures_line(r)):
        rows.append(["reward failures", failures])
    if isinstance(held := summary.get("heldout"), dict):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            rows.append(["held-out (end)", heldout_line(held)])
    return rows


def _fallback_table(s: dict[str, Any]) -> str:
    rows = [["controller", s["controller"]], ["source", s["source"]], *warning_rows(s)]
    if "last_iteration" in s:  # a count, as the live view's `iteration` and the `ended` row's (not the row's index)
        li = s["last_iteration"]
        rows.append(
            [
                "iterations done",
                f"{s.get('iterations_done', '-')}; the last: reward {_f(li['reward_mean'], '.3f')}, "
                f"T_gen {_f(li['t_gen_s'])} s, T_train {_f(li['t_train_s'])} s ({_f(s.get('figures_age_s'), '.0f')} s "
                "ago)",
            ]
        )
    if s.get("heldout"):
        rows += [["held-out", evaluations_line(s["heldout"])], *heldout_source_rows(s["heldout"])]
    if "summary" in s:
        # the count first: a failed state's text ends with the command that resumes it
        e = s["summary"]  # (a summary edited by hand may lack either: said as none, not a KeyError)
        rows.append(["ended", f"after {e.get('iterations', '-')} iterations: {e.get('state', 'no state')}"])
        rows += outcome_rows(e)
    if "ended_without_summary" in s:
        from rlctl.launch.base import exit_text

        e = s["ended_without_summary"]
        code = "its exit not recorded" if e["controller_exit"] is None else f"exit {exit_text(e['controller_exit'])}"
        # a job that completed none resumes from its start (as the resume says), not from a checkpoint
        none = "checkpoints" in s and not s["checkpoints"].get("versions")
        start = "its start (it completed no checkpoint)" if none else "its latest complete checkpoint"
        said = f"the controller exited without a summary ({code}); continue the job from {start}: `{e['resume']}`"
        rows.append(["ended", said])
    if (s.get("checkpoints") or {}).get("versions"):
        rows.append(["checkpoints", checkpoints_line(s)])
    if s.get("index_state"):
        rows.append(["job index", index_line(s)])
    if s["sites_down"]:
        rows.append(["sites not answering", ", ".join(s["sites_down"])])
    if s.get("launcher"):
        rows.append(["launcher", s["launcher"]])
    rows += copy_rows(s)
    agents = [[a["name"], a["role"], a["site"], a["state"], a["source"], _f(a["age_s"])] for a in s["agents"]]
    return (
        grid(rows, ["", ""], f"Job {s['id']}")
        + "\n\n"
        + grid(agents, ["agent", "role", "site", "state", "according to", "age s"])
    )


def _table(s: dict[str, Any]) -> str:
    return _live_table(s) if s["source"] == "controller" else _fallback_table(s)


def heldout_cell(h: dict[str, Any] | None) -> str:
    """A policy's held-out greedy figures: 'exact 0.137, reward 0.572' (a dataset task: its reward alone)."""
    if not h:
        return "-"
    exact = f"exact {h['greedy_exact']:.3f}, " if "greedy_exact" in h else ""
    return f"{exact}reward {h['greedy_reward']:.3f}" if "greedy_reward" in h else exact.rstrip(", ") or "-"


def _checkpoints_table(c: dict[str, Any]) -> str:
    """`status --checkpoints`: one row a checkpoint, and how to go back to one or copy its model."""
    rows = [
        [
            f"v{r['version']}",
            "-" if r["written_at"] is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["written_at"])),
            f"{r['iterations'][0]}–{r['iterations'][1]}",
            _f(r["reward_mean"], ".3f"),
            heldout_cell(r["heldout"]),
            "latest" if r["latest"] else f"damaged: {r['damaged']}" if r.get("damaged") else "",
        ]
        for r in c["checkpoints"]
    ]
    n = len(rows)
    title = f"Job {c['id']}: {n} complete checkpoint{'s' if n != 1 else ''}"
    if bad := sum(1 for r in c["checkpoints"] if r.get("damaged")):
        title += f" ({bad} of them damaged since)"
    if c["heldout_start"]:
        title += f"; the starting policy held out: {heldout_cell(c['heldout_start'])}"
    if not rows:
        return (
            f"{title}\n(none yet: `checkpoint.every_iterations` in {c['job_dir']}/job.json says when the first comes)"
        )
    table = grid(rows, ["checkpoint", "written", "iterations", "sampled reward", "held-out (greedy)", "state"], title)
    # the cheap check of each part's manifests on its site (rlctl.ops.checkpoints.sound), and the parts not checked
    from rlctl.ops.checkpoints import unchecked_line

    line = unchecked_line(c.get("manifests_checked", []), c.get("manifests_unchecked"))
    note = f"\n{line}" if line else ""
    if lost := c.get("dirs_lost"):  # no checkpoint of it to go back to or pull: the directory to put back said
        return f"{table}{note}\n" + "; ".join(lost) + ": no checkpoint's files are there; put the directory back"
    return (
        f"{table}{note}\n\n`{c['resume']} --checkpoint V` continues from V; `{c['pull']} --checkpoint V` copies its "
        "model here"
    )


GONE = " (gone: removed, or not mounted on this machine)"  # a job dir an index row outlived


def _jobs_table(rows: list[dict[str, Any]], *, index: Path) -> str:
    """`status --all`: a row a job of the index in `index`; one line where it lists none, versus a table's header and
    rule with nothing under them."""
    if not rows:
        return f"no jobs (the job index in {index} lists none)"
    return grid(
        [
            [r["id"], r["name"], r["state"], r["job_dir"] + (GONE if r["job_dir_gone"] else ""), r["launcher"] or "-"]
            for r in rows
        ],
        ["id", "job", "state", "job dir", "launcher"],
    )


def register(app: typer.Typer) -> None:
    @app.command()
    def status(
        job: JobArg = None,
        watch: Annotated[
            bool, typer.Option("--watch", "-w", help="refresh until the job ends (Ctrl-C to leave)")
        ] = False,
        interval_s: Annotated[
            float, typer.Option("--interval", min=0.2, help="seconds between refreshes", callback=seconds_at_least(0.2))
        ] = 2.0,
        timeout_s: Annotated[
            float,
            typer.Option(
                "--timeout",
                min=0.1,
                help="deadline per site and for the controller, seconds",
                callback=seconds_at_least(0.1),
            ),
        ] = 5.0,
        all_jobs: Annotated[bool, typer.Option("--all", help="list every job in the index instead")] = False,
        checkpoints: Annotated[
            bool,
            typer.Option(
                "--checkpoints",
                help="list the job's complete checkpoints instead: when each was written, the sampled reward of the "
                "iterations that made it, its held-out figures where the job evaluated it",
            ),
        ] = False,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Show a job's live state: stage times, δ and δ', throughput, weights, staleness, each agent's health."""
        from rlctl.launch.jobdir import resume_command
        from rlctl.ops.detach import dir_gone, launcher_state
        from rlctl.ops.jobdb import LIVE, JobDB
        from rlctl.ops.jobref import resolve
        from rlctl.ops.operate import job_status, row_now

        if checkpoints and (all_jobs or watch):
            raise UsageError(
                f"--checkpoints lists one job's checkpoints once: it takes no {'--all' if all_jobs else '--watch'}"
            )
        if all_jobs:
            if job is not None:  # it listed every job, JOB ignored
                raise UsageError(
                    f"--all lists every job: it takes no JOB ({job!r}); `rlctl status {shlex.quote(job)}` shows that "
                    "one"
                )
            if watch:  # it listed them once, --watch ignored
                raise UsageError("--all lists every job once: it takes no --watch; `rlctl status -w JOB` follows one")
            db = JobDB()
            try:
                rows = [
                    {
                        "id": r.name,
                        "name": r.spec.get("name"),
                        "state": r.state,
                        "job_dir": r.job_dir,
                        # its row outlived it (removed, or on a filesystem not mounted here), as `status JOB` says
                        "job_dir_gone": dir_gone(Path(r.job_dir)),
                        "launcher": launcher_state(
                            r.info.get("launcher"),
                            ended=r.state not in LIVE,
                            job_dir=r.job_dir,
                            source=r.info.get("source"),
                        ),
                    }
                    for r in db.list()
                ]
            finally:
                db.close()
            emit(rows, output, functools.partial(_jobs_table, index=db.path.parent))
            return
        ref = resolve(job)
        if checkpoints:
            from rlctl.ops.checkpoints import checkpoint_table
            from rlctl.ops.jobref import require_job_dir
            from rlctl.ops.operate import fetch_job_record
            from rlctl.ops.pull import checkpoint_parts

            require_job_dir(ref)
            if not ref.jobdir.job_json.exists():  # still prepared by its launcher, or never: said so (exit 2), versus
                # 'cannot read the resolved job' (exit 1) of the job.json the table reads
                from rlctl.ops.refusals import refuse_if_unprepared

                source = ref.row.info.get("source") if ref.row is not None else None
                refuse_if_unprepared(ref.jobdir, source=source, nothing="no checkpoints to list")
            fetch_job_record(ref)  # a controller on another site: its events and metrics, brought here
            name = ref.id if ref.row is not None else str(ref.jobdir.path)
            parts = checkpoint_parts(ref.jobdir.path, remote=True)  # each part's manifests checked on its site
            data = {"id": ref.id, "job_dir": str(ref.jobdir.path), **checkpoint_table(ref.jobdir, parts=parts)}
            data |= {"resume": resume_command(name), "pull": f"rlctl pull {shlex.quote(name)}"}
            emit(data, output, _checkpoints_table)
            return
        named = shlex.quote(ref.id if ref.row is not None else str(ref.jobdir.path))
        with said_if_interrupted(
            lambda: (
                f"stopped watching job {ref.id}; the job goes on (`rlctl status -w {named}` watches it again)"
                if watch
                else f"job {ref.id}'s status was not shown (asking changes nothing: `rlctl status {named}` again)"
            )
        ):
            while True:
                # read before the frame: the frame after its launcher let go of the job is the last (its index end)
                held = watch and ref.jobdir.launcher_holder() is not None
                if watch and ref.row is not None:  # its index row as it is now, not as it was at the first frame
                    ref = dataclasses.replace(ref, row=row_now(ref.row))
                s, complete = job_status(ref, timeout_s=timeout_s)
                # (no stdout at all, `>&-`: not a terminal; emit says so)
                if watch and output is OutputFormat.table and sys.stdout is not None and sys.stdout.isatty():
                    sys.stdout.write("\x1b[2J\x1b[H")
                emit(s, output, _table)
                ended = s.get("live", {}).get("state") in ("done", "failed")
                ended = ended or "summary" in s or "ended_without_summary" in s or "never_started" in s
                # its launcher still holds the job after the controller's end: it evaluates the final checkpoint,
                # records the end in the index, or resumes the run (auto_resume); -w stopped at the controller's
                # `done`, its last frame `held-out v0` and `launcher … watching`
                if not watch or (ended and not held):
                    break
                sys.stdout.flush()
                time.sleep(interval_s)
        if not complete:
            down = ", ".join(s.get("sites_down", [])) or "none"
            raise PartialFailure(
                f"job {ref.id}: partial status: controller {s.get('controller', 'ok')}; sites not answering: {down}"
            )
