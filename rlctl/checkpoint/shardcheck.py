"""A trainer shard checked before anything of it is loaded: what a rank can meet in a shard whose SHA-256 its
manifest lists as it is (a shard another rlctl, or a hand, wrote and listed; bytes damaged before the part was
sealed) refused in one line naming the checkpoint, the file and what is wrong, versus a KeyError's or torch's
traceback, or a line of the optimizer digests naming neither.

    read_shard           a torch file holding a dict (truncated, emptied, another format: one line)
    check_held           its rank, RNG states and a state dict of each optimizer               any split
    check_optimizers     each optimizer's groups, each parameter's step and AdamW moments,    any dp
                         the moments in the parameter's dtype
    check_module_dtypes  each module's tensors in the module's dtypes                         any dp
    check_modules        each module held, at this rank's shapes (ConfigError: another job's) the same split
    check_local          each moment at this rank's shape of its parameter                    the same split
                         (at another dp: `refsdp.check_rows`)
    check_digest         its optimizers' state is the one its rank wrote (the manifest's digest)  another dp
                         (at the same split: the state as restored, `load_trainer`, hashed once)
    check_stepped        FSDP2's shards of a part hold state of every parameter, or none       another dp

The ValueErrors are said as `damaged`'s CheckpointError, `<checkpoint>: <shard>: <what>`; the launcher's hint names
the older checkpoints a resume can go on from (`rlctl.ops.runwait`).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlctl.errors import CheckpointError, ConfigError
from rlctl.models.tensors import DoesNotFit
from rlctl.trainers.fsdp import check_local_fit, local_tensor

MOMENTS = ("exp_avg", "exp_avg_sq")


def damaged(ckpt: Path, rel: str, what: str) -> CheckpointError:
    """The one line that refuses shard `rel` of checkpoint `ckpt`: `<ckpt>: <rel>: <what>`."""
    return CheckpointError(f"{ckpt}: {rel}: {what}")


def read_shard(ckpt: Path, rel: str, *, mmap: bool = False) -> dict[str, Any]:
    """Shard `rel` of `ckpt` (`torch.load`, weights only; `mmap`: its tensors read as they are used). CheckpointError
    where it is not a torch file of a dict (truncated: no zip directory; emptied; another format)."""
    try:
        shard = torch.load(ckpt / rel, weights_only=True, mmap=mmap)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        said = str(e).split(". ")[0][:160] or "end of file"
        raise damaged(ckpt, rel, f"not a readable torch file ({type(e).__name__}: {said})") from e
    if not isinstance(shard, dict):
        raise damaged(ckpt, rel, f"it holds a {type(shard).__name__}, not a shard's entries")
    return shard


def _params(o: torch.optim.Optimizer) -> dict[int, torch.Tensor]:
    """An optimizer's parameters by the index its state dict gives each."""
    indices = [i for g in o.state_dict()["param_groups"] for i in g["params"]]
    return dict(zip(indices, [p for g in o.param_groups for p in g["params"]], strict=True))


def check_held(shard: Mapping[str, Any], *, rank: int, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
    """ValueError, one line, unless `shard` is rank `rank`'s and holds RNG states as `rng_state` makes them and a
    state dict of each of `optimizers` (at any split: its groups are not compared, as at another tp × pp)."""
    if shard.get("rank") != rank:
        raise ValueError(f"it is rank {shard.get('rank')}'s shard, not rank {rank}'s")
    rng = shard.get("rng")
    if not isinstance(rng, dict):
        raise ValueError("it holds no rng")
    for key, kind in (("torch", torch.Tensor), ("python", list), ("numpy", list)):
        if not isinstance(rng.get(key), kind):
            raise ValueError(f"its rng holds no {key} state")
    if rng["torch"].dtype != torch.uint8:
        raise ValueError(f"its rng's torch state is {rng['torch'].dtype}; torch's is torch.uint8")
    for k in optimizers:
        sd = shard.get(f"optimizer.{k}")
        if (
            not isinstance(sd, dict)
            or not isinstance(sd.get("state"), dict)
            or not isinstance(sd.get("param_groups"), list)
        ):
            raise ValueError(f"it holds no optimizer.{k}")


def check_optimizers(shard: Mapping[str, Any], *, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
    """ValueError, one line, unless each of `optimizers` in `shard` (`check_held` passed) has as many parameters per
    group as this trainer's, and a step and both AdamW moments of each parameter it holds state of, each moment in
    its parameter's dtype (AdamW makes them so; shapes: `check_local`, `refsdp.check_rows`)."""
    for k, o in optimizers.items():
        sd = shard[f"optimizer.{k}"]
        now = [len(g["params"]) for g in o.state_dict()["param_groups"]]
        had = [len(g.get("params", ())) for g in sd["param_groups"]]
        if had != now:
            raise ValueError(f"its optimizer.{k} holds {had} parameters per group, this trainer's {now}")
        params = _params(o)
        for i, st in sd["state"].items():
            if i not in params:
                raise ValueError(
                    f"its optimizer.{k} holds state of parameter {i}; this trainer's has {len(params)} parameters"
                )
            if lacking := [m for m in ("step", *MOMENTS) if m not in st]:
                raise ValueError(f"its optimizer.{k} parameter {i} lacks {lacking[0]}")
            want = local_tensor(params[i]).dtype
            for m in MOMENTS:
                got = st[m].dtype if isinstance(st[m], torch.Tensor) else type(st[m]).__name__
                if got != want:
                    raise ValueError(f"optimizer.{k} parameter {i}'s {m} is {got}; its parameter's is {want}")


def check_module_dtypes(shard: Mapping[str, Any], *, modules: Mapping[str, nn.Module]) -> None:
    """ValueError, one line, unless each tensor of `modules` that `shard` holds is in the module's dtype (a load
    would cast it silently: a float16 copy of fp32 weights resumed as if exact). Missing ones: `check_modules`,
    `refsdp.check_rows`."""
    for k, mod in modules.items():
        state = shard.get(f"module.{k}")
        if not isinstance(state, dict):
            raise ValueError(f"it holds no module.{k}")
        for name, t in mod.state_dict().items():
            held = state.get(name)
            if name.endswith("_extra_state") or not isinstance(t, torch.Tensor) or not isinstance(held, torch.Tensor):
                continue  # (megatron's _extra_state: whatever it saves)
            if held.dtype != (want := local_tensor(t).dtype):
                raise ValueError(f"module.{k} {name} is {held.dtype}; this module's is {want}")


def check_modules(file: Path, shard: Mapping[str, Any], modules: Mapping[str, nn.Module]) -> None:
    """ConfigError naming the shard `file` and the module (`module.critic`: a PPO critic's; `module.policy`: a sharded
    policy's), where the shard holds no state of one of `modules`, one that does not fit it at this rank's shapes
    (`check_local_fit`: its own shard at the split it was written at), or a tensor of another dtype; versus a
    KeyError's traceback or the tensors before the misfit copied (torch's load_state_dict: every tensor that fit)."""
    for k, m in modules.items():
        if f"module.{k}" not in shard:
            raise ConfigError(str(file), f"module.{k}", "missing: the checkpoint's job trained no such module")
        try:
            check_local_fit(m, shard[f"module.{k}"])
        except DoesNotFit as e:
            raise ConfigError(str(file), f"module.{k}", str(e)) from e
    try:
        check_module_dtypes(shard, modules=modules)
    except ValueError as e:
        raise ConfigError(str(file), None, str(e)) from e


def check_local(shard: Mapping[str, Any], *, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
    """ValueError, one line, unless each moment `shard` holds (`check_optimizers` passed) is of this rank's shape of
    its parameter: its own shard at the split it was written at (`local_state`'s, FSDP2's rows where sharded)."""
    for k, o in optimizers.items():
        params = _params(o)
        for i, st in shard[f"optimizer.{k}"]["state"].items():
            want = tuple(local_tensor(params[i]).shape)
            for m in MOMENTS:
                if tuple(st[m].shape) != want:
                    raise ValueError(
                        f"optimizer.{k} parameter {i}'s {m} is {tuple(st[m].shape)}; this rank's is {want}"
                    )


def check_digest(shard: Mapping[str, Any], *, optimizers: Mapping[str, torch.optim.Optimizer], recorded: str) -> None:
    """ValueError unless the optimizers' state in `shard` has the SHA-256 its rank recorded when it wrote it (the
    manifest's `optimizer_sha256` of this shard: `states_digest`), before any of it is loaded."""
    from rlctl.checkpoint.trainer import states_digest  # (trainer imports this module)

    if states_digest({k: shard[f"optimizer.{k}"] for k in optimizers}) != recorded:
        raise ValueError("its optimizer state is not the one its rank wrote (its SHA-256 is not the manifest's)")


def check_stepped(
    ckpt: Path, shards: Mapping[str, Mapping[str, Any]], *, optimizers: Mapping[str, torch.optim.Optimizer]
) -> None:
    """CheckpointError naming the file, unless each of `shards` (by file, each `check_entries` passed: the ranks' of one
    part where FSDP2 shards it, every rank holding rows of every parameter) holds state of each parameter any of them
    holds state of: a rank steps every parameter it holds rows of at once (their gradients reduced over every rank),
    versus a parameter's state rebuilt from the shards but one (`refsdp.rebuilt_optimizer`'s line naming no file). A
    parameter none holds state of never stepped (no gradient reached it: an expert no token was routed to before the
    first checkpoint; PPO's critic's unused lm_head in a checkpoint of before 2026-12-07, `rlctl.checkpoint.oldcritic`,
    dropped before this check)."""
    for k in optimizers:
        stepped = {rel: set(s[f"optimizer.{k}"]["state"]) for rel, s in shards.items()}
        every = set().union(*stepped.values())
        for rel, held in stepped.items():
            if lacking := sorted(every - held):
                others = "of the others" if held else f"of every parameter in {next(r for r in stepped if stepped[r])}"
                raise damaged(
                    ckpt, rel, f"its optimizer.{k} holds no state of parameter {lacking[0]}, but state {others}"
                )
