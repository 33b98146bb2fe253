"""`rlctl pull [JOB] [--checkpoint latest|N|vN] [--to DIR]`: a checkpoint's policy and the tracker files, here."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from rlctl.commands import said_if_interrupted
from rlctl.commands.status import JobArg
from rlctl.render import OutputFormat, OutputOpt, emit
from rlctl.textutil import home_path


def register(app: typer.Typer) -> None:
    @app.command()
    def pull(
        job: JobArg = None,
        checkpoint: Annotated[
            str,
            typer.Option(
                "--checkpoint",
                "-c",
                help="'latest' (the newest sound one: the latest of `rlctl status JOB --checkpoints`), 'best' (the "
                "highest held-out greedy reward of those the run evaluated: `rlctl status JOB --checkpoints`) or a "
                "version",
            ),
        ] = "latest",
        to: Annotated[
            Path | None, typer.Option("--to", help="where the model goes (default: <job dir>/pulled/v<N>)")
        ] = None,
        output: OutputOpt = OutputFormat.table,
    ) -> None:
        """Copy a checkpoint's policy (a Hugging Face directory, every file checked against the checkpoint's
        manifest) from the trainer's site, and the job's tracker files from the controller's, to this machine."""
        from rlctl.ops.jobref import require_job_dir, resolve
        from rlctl.ops.pull import Pulled
        from rlctl.ops.pull import pull as pull_checkpoint
        from rlctl.ops.refusals import refuse_if_unprepared

        ref = resolve(job)
        require_job_dir(ref)
        refuse_if_unprepared(
            ref.jobdir, source=ref.row.info.get("source") if ref.row is not None else None, nothing="nothing to pull"
        )
        again = " ".join(
            shlex.quote(a)
            for a in [ref.id if ref.row is not None else str(ref.jobdir.path), "--checkpoint", checkpoint]
            + (["--to", str(to)] if to is not None else [])
        )
        policy: list[Pulled] = []

        def cut_short() -> str:
            if not policy:
                return (
                    f"the pull of job {ref.id} did not finish (the job is unchanged); `rlctl pull {again}` pulls the "
                    "checkpoint whole"
                )
            # its policy is in place: a pull again into the same --to is refused (not empty)
            return (
                f"the pull of job {ref.id} stopped as it fetched the tracker files: checkpoint v{policy[0].version}'s "
                f"policy is complete in {policy[0].to} (every file verified); `rlctl status {ref.arg} --checkpoints` "
                "fetches the tracker files"
            )

        with said_if_interrupted(cut_short):
            # `--to=~/x`: a shell leaves a ~ after `=` as it is
            to = home_path(to, named="--to") if to is not None else None
            got = pull_checkpoint(ref.jobdir.path, checkpoint=checkpoint, to=to, policy_in=policy.append, named=ref.arg)
        data = {
            "version": got.version,
            "to": str(got.to),
            "files": got.files,
            "bytes": got.bytes,
            "source": got.source,
            "trackers": got.trackers,
        }
        emit(
            data,
            output,
            lambda d: (
                f"checkpoint v{d['version']}: {d['files']} files, {d['bytes'] / 1e6:.1f} MB from {d['source']}\n"
                f"  → {d['to']}  (transformers: AutoModelForCausalLM.from_pretrained({d['to']!r}))\n"
                f"  tracker files: {len(d['trackers'])}"
            ),
        )
