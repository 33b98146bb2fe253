"""`rlctl profile`: write a profile file (cost functions per site) from GPU specs or measurements."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from rlctl.errors import UsageError
from rlctl.models.catalog import BUILTIN_MODELS
from rlctl.render import write_out
from rlctl.textutil import one_of


class Source(StrEnum):
    analytical = "analytical"
    measured = "measured"


class Algo(StrEnum):
    grpo = "grpo"
    ppo = "ppo"


class Engine(StrEnum):
    embedded = "embedded"
    vllm = "vllm"


class TrainerBackend(StrEnum):  # rlctl.trainers.base.BACKENDS
    torch = "torch"
    megatron = "megatron"


def _missing(*, cluster: bool, model: bool) -> str:
    """What a profile without --job lacks, named: the option not given (either alone was told to give both)."""
    if model:
        return (
            "--model needs --cluster: the inventory file(s) whose sites to profile (-c clusters/local.yaml); or --job"
        )
    if cluster:
        return (
            f"--cluster needs --model: a built-in model ({one_of(BUILTIN_MODELS)}) or a Hugging Face checkpoint "
            "directory; or --job"
        )
    return "give --cluster and --model, or --job"


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        cluster: Annotated[
            list[Path] | None, typer.Option("--cluster", "-c", help="inventory file(s) (clusters/*.yaml)")
        ] = None,
        model: Annotated[
            str | None,
            typer.Option(
                "--model",
                "-m",
                help=f"built-in model ({one_of(BUILTIN_MODELS)}) or a Hugging Face checkpoint directory",
            ),
        ] = None,
        job: Annotated[
            Path | None,
            typer.Option(
                "--job",
                "-j",
                help="profile what this job runs: its model, algorithm, rollout engine, trainer backend, batch "
                "and sites (instead of --cluster, --model, --algorithm)",
            ),
        ] = None,
        site: Annotated[
            list[str] | None, typer.Option("--site", help="profile only these sites (default: all)")
        ] = None,
        source: Annotated[
            Source,
            typer.Option(
                "--source",
                help="analytical (roofline from GPU specs) or measured (microbenchmarks of the rollout "
                "engine and of a training step with rlctl's learner, run on each site)",
            ),
        ] = Source.analytical,
        algorithm: Annotated[
            Algo | None,
            typer.Option("--algorithm", help="RL algorithm (default grpo): sets training FLOPs and memory"),
        ] = None,
        engine: Annotated[
            list[Engine] | None,
            typer.Option(
                "--engine",
                help="measured: rollout engine(s) to measure, repeatable (default: the job's, else embedded); "
                "vllm needs an HF checkpoint and vLLM installed where it runs",
            ),
        ] = None,
        trainer_backend: Annotated[
            TrainerBackend | None,
            typer.Option(
                "--trainer-backend",
                help="measured: trainer backend whose training step is timed, on one rank (tp 1, pp 1), and "
                "recorded in the training entries (default: the job's trainer.backend, else torch); megatron "
                "needs megatron-core where it runs. With --job, a megatron split "
                "(trainer.tensor_parallel / pipeline_parallel) is also timed by running its tp·pp ranks (wall "
                "clock), which needs a core per rank where the probe runs",
            ),
        ] = None,
        output: Annotated[
            Path | None,
            typer.Option(
                "--output",
                "-o",
                help="profile file to write: YAML, or JSON where its name ends in .json (default: YAML on stdout)",
            ),
        ] = None,
        workdir: Annotated[
            Path | None,
            typer.Option(
                "--workdir",
                help="measured, SLURM/SSH sites: where the probe's result and log are collected "
                "(default runs/profile-<time>)",
            ),
        ] = None,
    ) -> None:
        """Write a profile (PTL(BS) per GPU type and TP, prefill, KV capacity, training cost) for `rlctl plan`."""
        import yaml

        from rlctl.config import load_job
        from rlctl.profiler.build import build_profile, request_from_job, request_from_options
        from rlctl.profiler.profile import refuse_overwriting, save_profile

        if output is not None and str(output) in ("json", "table"):  # other commands' `-o json` is a format
            raise UsageError(
                f"-o {output}: profile's -o is the file to write (a YAML profile), not an output format",
                hint="`rlctl profile ... -o profile.yaml`, or no -o for the YAML on stdout",
            )
        if output is not None:  # before a measured profile's minutes, not after them
            refuse_overwriting(output)
        if source is Source.analytical:  # a roofline of the GPU specs: no engine runs, no step is timed, no probe
            unread = [
                o
                for o, v in (("--engine", engine), ("--trainer-backend", trainer_backend), ("--workdir", workdir))
                if v
            ]
            if unread:
                raise UsageError(
                    f"{', '.join(unread)}: read by --source measured only (the analytical profile is a roofline of "
                    "the GPU specs: nothing runs)",
                    hint="add --source measured, or drop " + ", ".join(unread),
                )
        engines = [e.value for e in engine] if engine else None
        backend = trainer_backend.value if trainer_backend else None
        if job is not None:
            given = [o for o, v in (("--cluster", cluster), ("--model", model), ("--algorithm", algorithm)) if v]
            if given:
                raise UsageError(f"--job gives the model, algorithm and sites; drop {', '.join(given)}")
            req = request_from_job(
                load_job(job, profile_must_exist=False), sites=site, engines=engines, trainer_backend=backend
            )
        else:
            if not cluster or model is None:
                raise UsageError(_missing(cluster=bool(cluster), model=model is not None))
            algo = (algorithm or Algo.grpo).value
            req = request_from_options(
                cluster, model=model, algorithm=algo, sites=site, engines=engines, trainer_backend=backend
            )
        prof = build_profile(req, source="measured" if source is Source.measured else "analytical", workdir=workdir)
        if output is None:
            text = yaml.safe_dump(
                prof.model_dump(by_alias=True, mode="json"), sort_keys=False, default_flow_style=None, width=160
            )
            write_out(text, end="")
            return
        save_profile(prof, output)
        sys.stderr.write(f"wrote {output} ({source.value}, {len(prof.sites)} site(s))\n")
