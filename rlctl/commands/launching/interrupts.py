"""A Ctrl-C (or SIGTERM) of `rlctl launch`, said in one line: what became of the job and how to go on with it
(`InterruptSaid`: said once, exit 130)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.run import JobRun


class InterruptSaid(KeyboardInterrupt):
    """A Ctrl-C whose line was said (by the launcher, or the launch that waits for one in the background): exit 130,
    nothing more said."""


@contextlib.contextmanager
def said_if_interrupted(job_file: Path | None, resume: str | None) -> Iterator[list[JobDir]]:
    """Around `rlctl launch`: a Ctrl-C before its launcher says what became of the job (`InterruptSaid`) — the
    modules it loads, the job read, planned and checked (a dataset's every row), the directory made — is said in one
    line as well, versus exit 130 with nothing said (typer ends a KeyboardInterrupt so). A fresh launch's job
    directory, once made (appended to the list yielded), is in the index `launching`: it is stopped there."""
    made: list[JobDir] = []
    try:
        yield made
    except InterruptSaid:
        raise
    except KeyboardInterrupt:
        if resume is not None:
            line = f"rlctl: interrupted: the resume of job {resume} stopped before it started anything; "
            line += "the job is as it was"
        elif made:
            from rlctl.ops.jobdb import LIVE, JobDB

            with contextlib.closing(JobDB()) as db:  # its launcher never took it on: the row says how it ended
                db.update(made[0].id, state="stopped", only_from=LIVE)
            line = interrupted_line(made[0], None, source=str(job_file))
        else:
            line = f"rlctl: interrupted: the launch of {job_file} stopped before it started anything: nothing to stop"
        with contextlib.suppress(OSError):
            sys.stderr.write(line + "\n")
        raise


def interrupted_line(
    jd: JobDir, run: JobRun | None, *, source: str | None = None, why: str = "interrupted", stopped: bool = True
) -> str:
    """What a launch Ctrl-C stopped says: the job stopped (every agent), and how to continue it; one stopped while
    it was prepared (no job.json: `launch --resume` refuses it), how to launch it again from `source`. `stopped`
    False: the stop failed (its warning line said why): not said to have stopped every agent."""
    from rlctl.launch.jobdir import resume_command
    from rlctl.ops.jobprep import launch_again

    if run is None and not jd.job_json.exists():
        return (
            f"rlctl: {why}: job {jd.id} stopped while its launch prepared it (nothing started); "
            f"launch it again with `{launch_again(source)}`"
        )
    how = run.resume_command() if run is not None else resume_command(jd.path)
    if run is not None and run.unstarted:  # a resume stopped while it staged: no agent ran, the job put back as it
        # was (a finished one stays finished: a plain resume is refused; a roll-back's --checkpoint is not kept; a
        # --trainer-split's plan.json put back: a plain resume runs the plan's split)
        return (
            f"rlctl: {why}: the resume of job {jd.id} stopped before any agent of it started; the job is as it "
            f"was before it: continue it with `{how}` (and the resume's --iterations / --checkpoint / "
            "--trainer-split, where it had them)"
        )
    if not stopped:  # (an agent on a site the stop could not reach may still run)
        return f"rlctl: {why}: job {jd.id}: its stop failed (the warning above); continue it with `{how}`"
    return f"rlctl: {why}: job {jd.id} stopped (every agent); continue it with `{how}`"
