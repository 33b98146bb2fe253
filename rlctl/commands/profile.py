"""`rlctl profile`: write a profile file (cost functions per site) from GPU specs or measurements."""

from __future__ import annotations

import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
import yaml

from rlctl.config import Site
from rlctl.config.base import check_header, read_yaml, validate
from rlctl.config.inventory import InventoryFile
from rlctl.errors import ConfigError, UsageError
from rlctl.modelcatalog import BUILTIN_MODELS
from rlctl.profiler.analytical import analytical_site, kv_capacity_tokens, training_entries
from rlctl.profiler.measure import require_embedded_model
from rlctl.profiler.probe import measure_here
from rlctl.profiler.profile import ModelSpec, ProfileFile, SiteProfile, save_profile
from rlctl.textutil import did_you_mean, one_of


class Source(StrEnum):
    analytical = "analytical"
    measured = "measured"


class Algo(StrEnum):
    grpo = "grpo"
    ppo = "ppo"


def load_sites(paths: list[Path]) -> dict[str, Site]:
    """Sites of inventory files, validated, without resolving links: a profile needs no link, so one
    site's file (`clusters/h20-rollout.yaml`, whose link names a site in another file) is enough."""
    sites: dict[str, Site] = {}
    for path in paths:
        data = read_yaml(path)
        check_header(path, data, "Inventory")
        for name, site in validate(path, data, InventoryFile).sites.items():
            if name in sites:
                raise ConfigError(str(path), f"sites.{name}", "duplicate site name; already defined in another file")
            sites[name] = site
    if not sites:
        raise ConfigError(", ".join(map(str, paths)), "sites", "no site defined; an inventory needs at least one site")
    return sites


def build_profile(
    cluster: list[Path],
    *,
    model_name: str,
    source: Source,
    sites: list[str] | None,
    algorithm: str = "grpo",
    workdir: Path | None = None,
) -> ProfileFile:
    if model_name not in BUILTIN_MODELS:
        raise UsageError(
            f"--model: unknown model {model_name!r}; known: {one_of(BUILTIN_MODELS)}"
            f"{did_you_mean(model_name, BUILTIN_MODELS)}"
        )
    arch = BUILTIN_MODELS[model_name]
    inv_sites = load_sites(cluster)
    names = sites or list(inv_sites)
    for s in names:
        if s not in inv_sites:
            raise UsageError(f"--site: unknown site {s!r}; known: {one_of(inv_sites)}{did_you_mean(s, inv_sites)}")
    out: dict[str, SiteProfile] = {}
    for s in names:
        site = inv_sites[s]
        if source is Source.analytical:
            out[s] = analytical_site(
                arch,
                site.spec,
                gpus_per_node=site.gpus_per_node,
                cost_per_gpu_hour=site.gpu_cost_per_hour,
                algorithm=algorithm,
            )
            continue
        kv = kv_capacity_tokens(arch, site.spec, tp=1)
        if site.scheduler.kind == "local":
            entry = measure_here(arch, kv_capacity_tokens=kv)
        else:
            from rlctl.profiler.remote import measure_on_site  # launch backends: only when needed

            require_embedded_model(arch)  # the probe runs the embedded engine: check before starting anything
            where = workdir or Path("runs") / f"profile-{time.strftime('%Y%m%d-%H%M%S')}"
            sys.stderr.write(f"site {s}: measuring through its {site.scheduler.kind} backend (work dir {where})\n")
            entry = measure_on_site(s, site, arch, kv_capacity_tokens=kv, workdir=where)
        out[s] = SiteProfile(
            gpu=site.spec.name,
            gpus_per_node=site.gpus_per_node,
            hbm_bytes=site.spec.hbm_bytes,
            cost_per_gpu_hour=site.gpu_cost_per_hour,
            generation=[entry],
            training=training_entries(arch, site.spec, gpus_per_node=site.gpus_per_node, algorithm=algorithm),
        )
    return ProfileFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Profile",
            "source": source.value,
            "model": ModelSpec.of(arch),
            "algorithm": algorithm,
            "sites": out,
        }
    )


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        cluster: Annotated[list[Path], typer.Option("--cluster", "-c", help="inventory file(s) (clusters/*.yaml)")],
        model: Annotated[str, typer.Option("--model", "-m", help=f"built-in model: {one_of(BUILTIN_MODELS)}")],
        site: Annotated[
            list[str] | None, typer.Option("--site", help="profile only these sites (default: all)")
        ] = None,
        source: Annotated[
            Source,
            typer.Option(
                "--source",
                help="analytical (roofline from GPU specs) or measured "
                "(microbenchmarks; local sites run the embedded engine)",
            ),
        ] = Source.analytical,
        algorithm: Annotated[
            Algo, typer.Option("--algorithm", help="RL algorithm: sets training FLOPs and memory")
        ] = Algo.grpo,
        output: Annotated[
            Path | None, typer.Option("--output", "-o", help="profile file to write (default: stdout)")
        ] = None,
        workdir: Annotated[
            Path | None,
            typer.Option(
                "--workdir",
                help="measured, SLURM/SSH sites: where the probe writes its result and log; must be on "
                "storage the site's hosts share (default runs/profile-<time>)",
            ),
        ] = None,
    ) -> None:
        """Write a profile (PTL(BS) per GPU type and TP, prefill, KV capacity, training cost) for `rlctl plan`."""
        prof = build_profile(
            cluster, model_name=model, source=source, sites=site, algorithm=algorithm.value, workdir=workdir
        )
        if output is None:
            sys.stdout.write(
                yaml.safe_dump(
                    prof.model_dump(by_alias=True, mode="json"), sort_keys=False, default_flow_style=None, width=160
                )
            )
            return
        save_profile(prof, output)
        sys.stderr.write(f"wrote {output} ({source.value}, {len(prof.sites)} site(s))\n")
