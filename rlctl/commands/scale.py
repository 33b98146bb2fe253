"""`rlctl scale JOB --rollout +N|-N [--site S]`: add or drain rollout DP units of a running job."""

from __future__ import annotations

import re
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlctl.commands import seconds_at_least
from rlctl.commands.status import RunningJobArg
from rlctl.errors import RlctlError, TransportError, UsageError
from rlctl.ops.operate import SCALE_ANSWER_S
from rlctl.render import OutputFormat, OutputOpt, emit, grid

if TYPE_CHECKING:
    from rlctl.ops.jobref import JobRef


MAX_UNITS = 10_000  # per scale: far more than a job has, and a count the request carries (msgpack: 64 bits)


def _delta(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"--rollout {text!r}: expected a signed count such as +1 or -2") from None
    if n == 0:
        raise UsageError("--rollout 0 changes nothing; give +N to add units or -N to remove them")
    if abs(n) > MAX_UNITS:
        raise UsageError(
            f"--rollout {text!r}: at most {MAX_UNITS} units at a time; e.g. +1 adds one unit, -2 drains two"
        )
    return n


def count_hint(count: str) -> str:
    """The hint for a count given without its --rollout, one text wherever the mistake is caught: as an argument after
    the job (`rlctl scale JOB +1`, `… 3`: the parser's error, `rlctl.cli`) or in the job's place (`rlctl scale +2`)."""
    signed = count if count[0] in "+-" else f"+{count}"  # --rollout adds or removes: it sets no total
    n = int(signed[1:])
    if n == 0:  # (a count that changes nothing: the option's form said, not `--rollout +0`)
        return "the count goes in --rollout: `rlctl scale [JOB] --rollout +N` adds N rollout unit(s), -N removes N"
    does = f"adds {n} rollout unit(s)" if signed[0] == "+" else f"drains and removes {n} rollout unit(s)"
    return f"the count goes in --rollout: `rlctl scale [JOB] --rollout {signed}` {does}"


def _cell(v: Any) -> Any:
    """A list or a mapping as a table's text (`rollout-2 3.0 s`), not Python's (`{'rollout-2': 3.004}`)."""
    if isinstance(v, list):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return ", ".join(f"{k} {x:.1f} s" if isinstance(x, float) else f"{k} {x}" for k, x in v.items())
    return v


def _table(r: dict[str, Any]) -> str:
    rows = [[k, _cell(v)] for k, v in r.items() if k not in ("job_dir", "copy")]
    if r.get("copy"):  # named by a copy of its dir: scaled where it runs
        rows.insert(1, ["job dir", f"{r['job_dir']}, where the job runs ({r['copy']}, named, is a copy of it)"])
    return grid(rows, ["", ""], f"Scale {r['id']}")


def _ended_as(ref: JobRef) -> str | None:
    """How the job ended, where its record says (`job_end`), or the summary its controller wrote as it ended (its
    launcher, still at work, has not recorded the end yet); None when neither does."""
    from rlctl.ops.operate import job_end
    from rlctl.ops.runstate import current_run, run_summary

    try:
        summary = run_summary(ref.jobdir, current_run(ref.jobdir))
        return job_end(ref) or (None if summary is None else str(summary.get("state", "ended")))
    except RlctlError:  # a record it cannot read says nothing of the end
        return None


def _wait_for_first_samples(
    ref: JobRef, added: list[str], out: dict[str, Any], timeout_s: float, output: OutputFormat
) -> None:
    """Until each of `added` produced its first sample (into out["first_sample_s"]); RlctlError (after printing
    what came) when one's start failed, the controller stops answering, or `timeout_s` passes."""
    from rlctl.ops.operate import scale_progress

    deadline = time.monotonic() + timeout_s
    firsts: dict[str, float] = {}
    failed: dict[str, str] = {}
    error: RlctlError | None = None
    try:
        while len(firsts) + len(failed) < len(added) and time.monotonic() < deadline:
            try:
                firsts, failed = scale_progress(ref, added)
            except (TransportError, OSError) as e:  # the job ended, or its controller went, meanwhile
                waiting = ", ".join(n for n in added if n not in firsts)
                ended = _ended_as(ref)  # its last iteration came first: said so, not as a controller that went
                error = RlctlError(
                    f"job {ref.id} ended ({ended}) before {waiting} produced a sample"
                    if ended is not None
                    else f"job {ref.id}: the controller stopped answering before {waiting} produced a sample: {e}",
                    hint=f"see `rlctl status {ref.arg}`",
                )
                break
            except RlctlError as e:  # a controller that does not count them: what came is printed, as for the others
                error = e
                break
            if len(firsts) + len(failed) < len(added):
                time.sleep(0.5)
    except KeyboardInterrupt:
        # Ctrl-C ends the wait, not the scale: the units the job goes on adding are named (else a scale run again to
        # make up for one read as undone adds as many more)
        out["first_sample_s"] = firsts
        emit(out, output, _table)
        sys.stdout.flush()
        adding = f"the job goes on adding {', '.join(added)} (`rlctl status {ref.arg}`)"
        sys.stderr.write(f"rlctl: interrupted: stopped waiting; {adding}\n")
        raise typer.Exit(130) from None
    out["first_sample_s"] = firsts
    if error is None and failed:
        error = RlctlError(
            f"job {ref.id}: " + "; ".join(f"{n} did not start: {why}" for n, why in sorted(failed.items())),
            hint=f"see `rlctl logs {ref.arg}`",
        )
    elif error is None and len(firsts) < len(added):
        missing = sorted(set(added) - set(firsts))
        error = RlctlError(f"job {ref.id}: {', '.join(missing)} produced no sample within {timeout_s:.0f} s")
    if error is not None:
        emit(out, output, _table)
        raise error


def register(app: typer.Typer) -> None:
    @app.command()
    def scale(
        job: RunningJobArg = None,
        rollout: Annotated[
            str, typer.Option("--rollout", help="+N adds N rollout units, -N drains and removes N", metavar="±N")
        ] = "+1",
        site: Annotated[str | None, typer.Option("--site", help="rollout site (default: any with free slots)")] = None,
        wait: Annotated[
            bool, typer.Option("--wait/--no-wait", help="wait until each new unit produced its first sample")
        ] = True,
        timeout_s: Annotated[
            float,
            typer.Option(
                "--timeout",
                min=1.0,
                help=f"how long --wait waits, seconds; the controller's answer to the request is waited for as long, "
                f"at most {SCALE_ANSWER_S:.0f} s",
                callback=seconds_at_least(1.0),
            ),
        ] = 300.0,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Add rollout DP units to a running job without pausing training (they get the current weights
        first), or drain units (no new work; stopped once their in-flight samples are in)."""
        from rlctl.ops.jobref import resolve
        from rlctl.ops.operate import scale as do_scale

        delta = _delta(rollout)
        if job is not None and re.fullmatch(r"\+\d+", job):  # `rlctl scale +1`: no job is named so
            raise UsageError(f"{job!r} is a count, not a job", hint=count_hint(job))
        ref = resolve(job, changes="scale")
        t0 = time.monotonic()
        try:
            reply = do_scale(ref, delta, site=site, timeout_s=min(timeout_s, SCALE_ANSWER_S))
        except KeyboardInterrupt:  # the request may have reached the controller: said, else a scale run again to make
            # up for one read as undone changes as many units more (typer ends a Ctrl-C with exit 130 and no word)
            what = "adding" if delta > 0 else "removing"
            sys.stderr.write(
                f"rlctl: interrupted: the controller may have the request and be {what} {abs(delta)} unit(s); "
                f"`rlctl status {ref.arg}` shows the job's units before you scale again\n"
            )
            raise typer.Exit(130) from None
        if "error" in reply:
            raise UsageError(f"job {ref.id}: {reply['error']}")
        out: dict[str, Any] = {"id": ref.id, **ref.copy_said(), **reply}
        added: list[str] = list(reply.get("adding", []))
        if added and wait:
            _wait_for_first_samples(ref, added, out, timeout_s, output)
        out["wall_s"] = round(time.monotonic() - t0, 2)
        emit(out, output, _table)
