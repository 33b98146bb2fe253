"""What `rlctl launch` shows: the live progress line (stderr), the end-of-run summary table (stdout) and the
`--dry-run` table of every agent's placement, staging and exact script."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

from rlctl.commands.status import step_losses
from rlctl.ops import detach
from rlctl.render import grid, reward_failures_line
from rlctl.textutil import duration

if TYPE_CHECKING:
    from rlctl.ops.preflight.base import Problem


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def progress_line(st: dict[str, Any]) -> str:
    """`launch`'s line per iteration, from the controller's status: progress, the reward and the last step's loss and
    KL (as `rlctl status` shows them, `step_losses`), rates and times, the weights and the agents."""
    left = f" (≈ {duration(st['eta_s'])} left)" if st.get("eta_s") else ""
    return (
        f"iter {st['iteration']}/{st['iterations']}{left}  reward {_fmt(st.get('reward'))}  "
        f"{step_losses(st.get('training') or {})}  "
        f"samples/s {_fmt(st.get('samples_per_s'), '.1f')}  T_gen {_fmt(st.get('t_gen_s'), '.2f')}s  "
        f"T_train {_fmt(st.get('t_train_s'), '.2f')}s  δ {_fmt(st.get('delta_s'), '+.2f')}s  "
        f"weights v{st.get('weight_version')}  agents {agents_text(st.get('agents', []))}"
    )


AGENTS_NAMED = 6  # agents not running that `launch`'s line names; the rest it counts


def agents_text(agents: list[dict[str, Any]]) -> str:
    """The agents in `launch`'s line per iteration: how many run, and the others by name and state, versus every
    agent's `name:state` (a 64-unit job's line ran past a thousand characters, every iteration) and nothing at all
    before the controller's first reply named one."""
    if not agents:
        return "-"
    running = sum(a["state"] == "running" for a in agents)
    others = [f"{a['name']} {a['state']}" for a in agents if a["state"] != "running"]
    more = f", {len(others) - AGENTS_NAMED} more not running" if len(others) > AGENTS_NAMED else ""
    return ", ".join([f"{running} running", *others[:AGENTS_NAMED]]) + more


def _heldout(s: dict[str, Any]) -> str | None:
    """The summary's held-out row; None without figures, or where they do not read (null or text: a summary.json
    edited, an older rlctl's), as `rlctl status` leaves it out (`outcome_rows`), versus a TypeError traceback as
    the launch ended, its table lost."""
    from rlctl.ops.evaluation import heldout_line

    if not isinstance(held := s.get("heldout"), dict):
        return None
    try:
        return heldout_line(held)
    except (KeyError, TypeError, ValueError):
        return None


def summary_table(s: dict[str, Any]) -> str:
    led = s["ledger"]
    rows = [
        ["state", s["state"]],
        ["mode (η)", f"{s['mode']} ({s['eta']})"],
        ["iterations", f"{s['iterations']}/{s['iterations_planned']}"],
        ["reward", f"{_fmt(s['reward_first'])} → {_fmt(s['reward_last'])} (mean of first/last {s['reward_window']})"],
        *([["held-out", held]] if (held := _heldout(s)) is not None else []),
        *([["reward failures", failures]] if (failures := reward_failures_line(s.get("rewards") or {})) else []),
        ["samples/s", _fmt(s["samples_per_s"], ".1f")],
        ["tokens/s", _fmt(s["tokens_per_s"], ".0f")],
        [
            "T_gen / T_train / δ",
            f"{_fmt(s['t_gen_s'], '.2f')} / {_fmt(s['t_train_s'], '.2f')} / {_fmt(s['delta_s'], '+.2f')} s",
        ],
        [
            "bubble rollout / trainer",
            f"{_fmt(s['bubble_fraction']['rollout'], '.2f')} / {_fmt(s['bubble_fraction']['trainer'], '.2f')}",
        ],
        [
            "staleness",
            " ".join(f"{k}:{v}" for k, v in s["staleness"].items()) + f"  violations {s['staleness_violations']}",
        ],
        ["ledger", ledger_line(led)],
        ["partial rollouts", partials_line(led)],
        *time_rows(s),
        ["job dir", s["job_dir"]],
    ]
    if (far := s.get("controller_job_dir")) is not None:  # where the controller's site keeps the job's record
        rows.append(["controller's job dir", f"{far['path']} (on site {far['site']})"])
    if (n := s.get("next")) is not None:
        rows.append(["next", f"`{n['report']}` (curves), `{n['checkpoints']}`, `{n['pull']}` (its final model)"])
    return grid(rows, ["", ""], f"Job {s['job']}")


def time_rows(s: dict[str, Any]) -> list[list[str]]:
    """What each time figure covers: this launcher's (`wall`: staging, every run, its automatic resumes), the job's
    training across resumes and this run's (`training`), and how often the job resumed (`resumed`, when it did).
    Before, `wall` (the last run's alone), summary.json's run_s and `report`'s wall s disagreed unexplained, and a
    resume showed only in `--output json`."""
    auto = int(s.get("auto_resumes") or 0)
    wall = f"{s['wall_s']:.1f} s, this launcher's"
    if auto and s.get("run_wall_s") is not None:
        wall += f" (its last run: {s['run_wall_s']:.1f} s)"
    rows = [["wall", wall]]
    if s.get("run_s") is not None:
        training = f"{s['run_s']:.1f} s this run (first sample → last iteration)"
        if s.get("job_wall_s") is not None and (s.get("resilience") or {}).get("resumes"):
            training += f"; {s['job_wall_s']:.1f} s since the job's first start"
        rows.append(["training", training])
    resumes = int((s.get("resilience") or {}).get("resumes") or 0)
    if resumes:
        by = f", {auto} by this launcher (checkpoint.auto_resume)" if auto else ""
        rows.append(["resumed", f"{resumes} time{'s' * (resumes > 1)}{by}"])
    return rows


def ledger_line(led: dict[str, Any]) -> str:
    """The summary's prompt ledger; the samples left out of a trained group (`filtered`: their reward held the
    trainer) when there were any, without which the staleness row's sum (the trained samples) matched no count."""
    return (
        f"prompts {led['prompts']} trained {led['trained']} requeued {led['requeued']} "
        f"lost {led['lost']} duplicated {led['duplicated']}"
        + (f" dropped {led['dropped']} (no signal)" if led.get("dropped") else "")
        + (f" quarantined {led['quarantined']} (crashed units)" if led.get("quarantined") else "")
        + (
            f"; samples: {led['filtered']} filtered (their reward held the trainer), "
            f"{led.get('trained_samples', '-')} trained"
            if led.get("filtered")
            else ""
        )
    )


def partials_line(led: dict[str, Any]) -> str:
    """The summary ledger's partial rollouts: moved and resumed work, and what lost units' generations kept and
    lost (at most; and as measured by the flight records the controller's host held)."""
    p = led["partials"]
    line = f"migrated {led['migrated']} resumed {p['resumed']} ({p['resumed_tokens']} tokens not generated again)"
    if p.get("interrupted"):
        line += (
            f"; {p['interrupted']} cut by a lost unit: {p['interrupted_kept_tokens']} tokens kept, "
            f"≤ {p['interrupted_lost_tokens_max']} generated again"
        )
        if n := p.get("lost_units_measured"):
            line += f" ({p['interrupted_lost_tokens_measured']} by the flight records of {n} lost unit{'s' * (n > 1)})"
    return line


class Progress:
    """A live line on a TTY, one plain line per new iteration otherwise (stderr either way)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = -1
        self.live: Any = None
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            # redrawn by this thread's updates only: no refresh thread writing to a terminal that may go away
            self.live = Live(console=Console(stderr=True), auto_refresh=False, transient=False)
            with detach.terminal_frame():
                self.live.start()

    def _live(self) -> Any:
        """The live display, until a SIGHUP moved this process's output to the job's log (plain lines from then)."""
        if self.live is not None and detach.hung_up():
            live, self.live = self.live, None
            live.console.quiet = True  # its last frame is for a terminal: not for the log
            with contextlib.suppress(OSError), detach.terminal_frame():
                live.stop()
        return self.live

    def say(self, text: str) -> None:
        try:  # a terminal that went away, or a closed pipe, must not end the launcher
            if (live := self._live()) is not None:
                with detach.terminal_frame():
                    live.console.print(text)
            else:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except OSError:
            pass

    def show(self, text: str) -> None:
        """The live line, e.g. the staging bar (a TTY only: nothing otherwise)."""
        if (live := self._live()) is not None:
            with contextlib.suppress(OSError), detach.terminal_frame():
                live.update(text, refresh=True)

    def __call__(self, st: dict[str, Any]) -> None:
        if self._live() is not None:
            self.show(progress_line(st))
        elif st["iteration"] != self.last:
            self.last = st["iteration"]
            self.say(progress_line(st))

    def close(self) -> None:
        if (live := self._live()) is not None:
            with contextlib.suppress(OSError), detach.terminal_frame():
                live.stop()


DRY_RUN_MASTER_PORT = 29500  # a real launch picks a free port on the trainer's first host


def staging_table(staging: list[dict[str, Any]]) -> str:
    """Where `launch` copies the job's files on each site (sites share no filesystem), and how (each column headed:
    the last, the staging's checks or 'no copy', had none)."""
    rows = [[s["site"], ", ".join(s["hosts"]), s["job_dir"], " ".join(s["files"]) or "-", s["note"]] for s in staging]
    return grid(rows, ["site", "hosts", "job dir on the site", "staged there", "how"], "Staging")


def refused_lines(found: list[Problem]) -> list[str]:
    """What `rlctl check` (and a launch) refuses in the job, for `--dry-run`: a marked section, one line each; a
    problem of another file (a site's, the links of an inventory file) names that file, as check's line does."""
    if not found:
        return []
    return [f"# would be refused by `rlctl check` ({len(found)}): a launch stops before starting anything"] + [
        f"#   {p.file + ': ' if p.file else ''}{p.field}: {p.message}" + (f" (hint: {p.hint})" if p.hint else "")
        for p in found
    ]


def _devices_cell(r: dict[str, Any]) -> str:
    """The dry-run table's CUDA_VISIBLE_DEVICES / SLURM request of one agent: "none" where it gets no GPU (it is
    told CUDA_VISIBLE_DEVICES="", the controller and a `gpu: CPU` site's agents)."""
    if r["cuda_visible_devices"] is None or (r["cuda_visible_devices"] == "" and r["gpu_request"]):  # (SLURM's)
        return str(r["gpu_request"] or "-")
    return str(r["cuda_visible_devices"] or "none")


def dry_table(
    rows: list[dict[str, Any]], staging: list[dict[str, Any]] | None = None, refused: list[Problem] | None = None
) -> str:
    """What `rlctl check` refuses (if anything), where each agent runs and what it gets (one table), the
    staging plan, then every exact sbatch script / SSH command."""
    from rlctl.ops.runstart import DRY_RUN_CONTROLLER

    table = [
        [
            r["agent"],
            r["site"],
            r["host"] or ("(SLURM places it)" if r["backend"] == "slurm" else "this machine"),
            r["backend"],
            _devices_cell(r),
            r["threads"],
            r["parallel"],
        ]
        for r in rows
    ]
    head = ["agent", "site", "host", "backend", "CUDA_VISIBLE_DEVICES / SLURM request", "threads", "parallel"]
    out = refused_lines(refused or [])
    out += [
        f"# {len(rows)} agents; MASTER_PORT={DRY_RUN_MASTER_PORT} stands for the free port picked at launch, "
        f"{DRY_RUN_CONTROLLER} for the controller's address once it listens",
        grid(table, head),
    ]
    if staging is not None:
        out += ["", staging_table(staging)]
    for r in rows:
        out.append(f"\n# ---- {r['agent']} on site {r['site']} ({r['backend']}) ----\n{r['script'].rstrip()}")
    return "\n".join(out)
