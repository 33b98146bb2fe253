"""A `torch` trainer's checkpoint resumed at another dp where FSDP2 shards the state on either side (another number
of shards, or sharded ⇄ unsharded; tp = pp = 1 always): each rank's part of the AdamW state and of the modules its
shard holds (a sharded policy's fp32 weights, LoRA adapters) rebuilt from the old shards.

FSDP2 shards every parameter on dim 0 (Shard(0)) as `torch.chunk` cuts it, a rank past the rows holding none:
rank r of W holds rows [r·c, (r+1)·c) ∩ [0, n) of n, c = ⌈n / W⌉ (`rows`; tests/unit/checkpoint/test_refsdp.py
checks it against FSDP2's DTensors at uneven sizes). So, for each tensor of this rank, one at a time:

    old shards (in rank order, mapped; those it reads no rows of: shapes alone)
      ──rows of this rank (`part`: read from the old parts they overlap)──▶ its part, a copy
    (an unsharded source: the old shard's tensor; a target not sharded: the whole; else the whole is never made)

An optimizer's moments go by parameter index (the optimizer holds the model's trained parameters in the model's
order, sharded or not, so the indices are the same on both sides), a module's state by name. A rank maps every old
rank's shard (an unsharded source: rank 0's alone; `mmap`: a tensor is read from disk as it is used) and holds its
part of one tensor at a time beside the state it has rebuilt (an unsharded target: the whole tensor). The step
count is carried (every parameter steps together); the hyper-parameters are the old shard's.

A sharded rank verifies (SHA-256) only the old shards its rows overlap (`shards_read`, the union over every dim-0
size of its state: the same old ranks for each only where the sizes divide evenly); the others stand in as their
tensors' shapes alone (`stand_in`: meta tensors, a read of which fails), versus every old shard hashed in full on
every rank (rank 0 still checks the whole part: it answers for it). A stand-in is made by FSDP2's rule (`rows` of
each tensor's whole size at this trainer) with a verified shard's structure, its file never opened (versus each file
mapped for its shapes: a truncated or missing shard this rank does not read raised torch's raw error, and a wrong
shape in it shifted the rows `part` cut from the verified ones); a verified shard not cut by that rule (in any dim),
or lacking an optimizer, module, tensor or moment this trainer's state has, is refused in one line naming it
(`check_rows`), versus a KeyError's traceback, or a line naming shapes of stand-ins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlctl.devices import as_dtensor
from rlctl.launch.agentenv import ParallelConfig
from rlctl.trainers.fsdp import local_tensor

MOMENTS = ("exp_avg", "exp_avg_sq")


def applies(was: ParallelConfig, now: ParallelConfig) -> bool:
    """Whether a part written at `was` loads at `now` through this module: FSDP2 on either side, and another dp or
    sharded on one side alone (at the same split, each rank restores its own shard as it is)."""
    return bool(was.fsdp or now.fsdp) and (was.dp != now.dp or bool(was.fsdp) != bool(now.fsdp))


def rows(n: int, *, world: int, rank: int) -> slice:
    """The rows of a dim-0 size `n` that FSDP2 gives rank `rank` of `world` (Shard(0), `torch.chunk`'s cut)."""
    per = -(-n // world)
    return slice(min(rank * per, n), min((rank + 1) * per, n))


def shards_read(
    was: ParallelConfig, now: ParallelConfig, *, rank: int, sizes: Iterable[int], written: Sequence[int]
) -> list[int]:
    """The old ranks, of `written` (those whose shards the part lists), whose data rank `rank` at `now` reads: where
    FSDP2 shards both sides, those holding rows of a dim-0 size in `sizes` that `rank` holds too (`rows` on either
    side; none: the first, for the step and hyper-parameters); else every one (an unsharded source wrote one, an
    unsharded target holds the whole of every tensor)."""
    if not (was.fsdp and now.fsdp):
        return list(written)
    want = set()
    for n in set(sizes):
        ours = rows(n, world=now.dp, rank=rank)
        want |= {r for r in range(was.dp) if _overlap(rows(n, world=was.dp, rank=r), ours)}
    return [r for r in written if r in want] or list(written[:1])


def _overlap(a: slice, b: slice) -> bool:
    return max(a.start, b.start) < min(a.stop, b.stop)


def whole_shapes(
    optimizers: Mapping[str, torch.optim.Optimizer], modules: Mapping[str, nn.Module]
) -> dict[str, dict[Any, tuple[int, ...]]]:
    """Each tensor's whole shape at this trainer (a DTensor's shape is the whole tensor's), by shard key and entry:
    `optimizer.K` by parameter index (its moments have the parameter's shape), `module.K` by name; scalars none
    (FSDP2 cuts no rows of them)."""
    out: dict[str, dict[Any, tuple[int, ...]]] = {}
    for k, o in optimizers.items():
        indices = [i for g in o.state_dict()["param_groups"] for i in g["params"]]
        params = [p for g in o.param_groups for p in g["params"]]
        out[f"optimizer.{k}"] = {i: tuple(p.shape) for i, p in zip(indices, params, strict=True) if p.dim() > 0}
    for k, m in modules.items():
        out[f"module.{k}"] = {n: tuple(t.shape) for n, t in m.state_dict().items() if t.dim() > 0}
    return out


def _held(rows_n: int, *, world: int, rank: int) -> int:
    s = rows(rows_n, world=world, rank=rank)
    return s.stop - s.start


def _entries(shard: Mapping[str, Any]) -> Iterable[tuple[str, Any, str, torch.Tensor]]:
    """(shard key, entry, name for an error, tensor) of each optimizer moment and module tensor of `shard`."""
    for k, v in shard.items():
        if k.startswith("optimizer."):
            for i, st in v["state"].items():
                yield from ((k, i, f"{k} parameter {i}'s {m}", t) for m, t in st.items() if m in MOMENTS)
        elif k.startswith("module."):
            yield from ((k, n, f"{k} {n}", t) for n, t in v.items() if isinstance(t, torch.Tensor))


def _cut(whole: tuple[int, ...], *, world: int, rank: int) -> tuple[int, ...]:
    """The shape of FSDP2's part of a tensor of shape `whole` on rank `rank` of `world` (`rows`)."""
    return (_held(whole[0], world=world, rank=rank), *whole[1:])


def check_rows(
    shard: Mapping[str, Any], *, whole: Mapping[str, Mapping[Any, tuple[int, ...]]], world: int, rank: int
) -> None:
    """ValueError, one line, unless `shard` (old rank `rank`'s of `world`, verified) holds every optimizer and module
    of `whole` (`whole_shapes`: this trainer's), every module tensor of it, the step and both AdamW moments of each
    parameter it holds state of, and each such tensor as FSDP2 cuts it (`rows`; `world` 1: the whole): `part` places
    every old rank's rows by that rule, so a shard cut otherwise would shift the rows taken from the others, and a
    shard lacking an entry the others hold raised a KeyError's traceback on the rank that read it."""
    for k, shapes in whole.items():
        if k not in shard:
            raise ValueError(f"it holds no {k}")
        if k.startswith("module."):
            if lacking := sorted(set(shapes) - set(shard[k])):
                raise ValueError(
                    f"its {k} lacks {lacking[0]}" + (f" and {len(lacking) - 1} more" if lacking[1:] else "")
                )
        else:
            for i, st in shard[k]["state"].items():
                if lacking := [m for m in ("step", *MOMENTS) if m not in st]:
                    raise ValueError(f"its {k} parameter {i} lacks {lacking[0]}")
    for k, e, name, t in _entries(shard):
        n = whole.get(k, {}).get(e)
        if n is not None and tuple(t.shape) != (want := _cut(n, world=world, rank=rank)):
            of = f"FSDP2 cuts {want} of its {n} to old rank {rank} of {world}" if world > 1 else f"this model's is {n}"
            raise ValueError(f"{name} is {tuple(t.shape)}; {of}")


def stand_in(
    verified: Mapping[str, Any], *, whole: Mapping[str, Mapping[Any, tuple[int, ...]]], world: int, rank: int
) -> dict[str, Any]:
    """Old rank `rank`'s shard (of `world`), one this rank reads no rows of (`shards_read`), as `part` needs it,
    without its file: `verified`'s (a shard this rank verified, `check_rows`) optimizer state indices and module
    tensors, each FSDP2's part of rank `rank` (`rows` of `whole`'s shape), as meta tensors (reading one fails); no
    hyper-parameters (`param_groups` None). A tensor this trainer does not hold keeps `verified`'s shape (refused by
    `check_module`, or not read)."""

    def meta(k: str, e: Any, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return None
        n = whole.get(k, {}).get(e)
        shape = _cut(n, world=world, rank=rank) if n is not None and t.dim() > 0 else t.shape  # (not a step count)
        return torch.empty(shape, dtype=t.dtype, device="meta")

    out: dict[str, Any] = {}
    for k, v in verified.items():
        if k.startswith("optimizer."):
            state = {i: {m: meta(k, i, t) for m, t in st.items()} for i, st in v["state"].items()}
            out[k] = {"state": state, "param_groups": None}
        elif k.startswith("module."):
            out[k] = {n: meta(k, n, t) for n, t in v.items()}
    return out


def _joined(name: str, pieces: Sequence[torch.Tensor], shape: Sequence[int]) -> bool:
    """Whether `pieces` (each old rank's tensor `name`) are the dim-0 parts of a tensor of `shape` (True) or each
    the whole of it (False: a tensor the old ranks did not shard, or one rank). ValueError for neither."""
    shape = tuple(shape)
    got = [tuple(p.shape) for p in pieces]
    if shape and all(g[1:] == shape[1:] for g in got) and sum(g[0] for g in got) == shape[0]:
        return True
    if all(g == shape for g in got):
        return False
    said = " + ".join(map(str, got)) if len(got) > 1 else str(got[0])
    raise ValueError(f"{name} is {said} in its shards, this model's {shape}")


def part(name: str, pieces: Sequence[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """This rank's part, a copy, of the tensor `pieces` (each old rank's, in rank order: dim-0 parts, or each whole)
    hold, as `target` (this rank's parameter, or a module's entry) lays it out: its rows where FSDP2 shards it (a
    DTensor), else the whole. Of the joined parts only those the rows overlap are read (mapped: from disk), and
    only the rows are held. ValueError where `pieces` are not of `target`'s shape (`_joined`)."""
    shape = tuple(target.shape)
    joined = _joined(name, pieces, shape)
    d = as_dtensor(target)
    whole = next((p for p in pieces if not p.is_meta), pieces[0])  # not joined: each the whole (a verified one)
    if d is None:
        return torch.cat(list(pieces)) if joined else whole.clone()
    from torch.distributed.tensor import Shard

    assert tuple(d.placements) == (Shard(0),), d.placements  # what `rlctl.trainers.fsdp.shard` makes
    mesh = d.device_mesh
    want = rows(shape[0], world=mesh.size(), rank=mesh.get_local_rank())
    if not joined:
        out = whole[want].clone()
    else:
        cuts, start = [], 0
        for p in pieces:  # old rank's rows [start, start + len): the ones this rank holds of them
            lo, hi = max(start, want.start), min(start + p.shape[0], want.stop)
            if lo < hi:
                if p.is_meta:  # (`shards_read` went by `rows`: the old parts are not FSDP2's cut)
                    raise ValueError(f"{name}'s rows {lo}..{hi} are in an old shard this rank did not read")
                cuts.append(p[lo - start : hi - start])
            start += p.shape[0]
        out = torch.cat(cuts) if cuts else torch.empty((0, *shape[1:]), dtype=pieces[0].dtype)
    assert out.shape == d.to_local().shape, (out.shape, d.to_local().shape)  # FSDP2's cut is `rows`'
    return out


def rebuilt_optimizer(
    states: Sequence[Mapping[str, Any]], *, params: Sequence[torch.Tensor], current: Mapping[str, Any]
) -> dict[str, Any]:
    """The state dict of an optimizer over `params` (this rank's, in index order; `current`: its state dict, for
    its groups' indices), rebuilt from `states` (each old shard's state dict of it, in rank order), one moment of
    one parameter at a time: plain tensors, as `local_state` saves them (`redistribute_optimizer` makes the
    sharded ones DTensors after the load). ValueError where the old optimizer holds other parameters (another
    model, other groups) or a parameter's state in some old shards and not the others. A parameter no shard holds
    state of never stepped (no gradient reached it: an expert no token chose) and has none here either."""
    real = next(j for j, sd in enumerate(states) if sd["param_groups"] is not None)  # (not a `stand_in`)
    old_groups = states[real]["param_groups"]
    now_groups = current["param_groups"]
    if [len(g["params"]) for g in old_groups] != [len(g["params"]) for g in now_groups]:
        raise ValueError(
            f"its optimizer holds {[len(g['params']) for g in old_groups]} parameters per group, this trainer's "
            f"{[len(g['params']) for g in now_groups]}"
        )
    groups = [g | {"params": list(now["params"])} for g, now in zip(old_groups, now_groups, strict=True)]
    indices = [i for g in now_groups for i in g["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for i, p in zip(indices, params, strict=True):
        got = [sd["state"].get(i) for sd in states]
        if all(st is None for st in got):  # (a torch optimizer has a parameter's state once it stepped it)
            continue
        if any(st is None for st in got):  # (a step reduces every rank's rows of a parameter: all or none)
            raise ValueError(f"parameter {i} has optimizer state in some of its shards and not the others")
        state[i] = {"step": torch.as_tensor(got[real]["step"]).clone()}
        for m in MOMENTS:
            state[i][m] = part(f"parameter {i}'s {m}", [st[m] for st in got], p)
    return {"state": state, "param_groups": groups}


def check_module(module: nn.Module, pieces: Sequence[Mapping[str, torch.Tensor]]) -> None:
    """ValueError, one line, unless `pieces` (each old shard's state of `module`) hold `module`'s tensors, whole or
    in dim-0 parts (their shapes alone: nothing read)."""
    own = module.state_dict()
    if set(own) != set(pieces[0]):
        missing, extra = sorted(set(own) - set(pieces[0])), sorted(set(pieces[0]) - set(own))
        raise ValueError(f"its shards hold other tensors (missing {missing[:3]}, unexpected {extra[:3]})")
    for name, t in own.items():
        _joined(name, [p[name] for p in pieces], t.shape)


def load_module(module: nn.Module, pieces: Sequence[Mapping[str, torch.Tensor]]) -> None:
    """`module`'s state from `pieces` (each old shard's state of it, in rank order), one tensor at a time: this
    rank's rows of each tensor FSDP2 shards, the whole of the others. Checked first (`check_module`): ValueError
    with nothing copied."""
    check_module(module, pieces)
    with torch.no_grad():
        for name, t in module.state_dict().items():
            local_tensor(t).copy_(part(name, [p[name] for p in pieces], t))
