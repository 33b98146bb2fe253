"""The trainer's part of a checkpoint: the policy (an HF directory, gathered), every rank's shard of the rest
(its optimizers' state, other trained modules such as a PPO critic, its RNG states), the trainer's counters and
the split (tp × pp × dp) it was written at — saved and restored as one unit.

    rank 0: save_trainer                               ranks > 0: save_shard (the learner's follow loop)
      MANIFEST.trainer.json goes (being rewritten)
      announce() ── broadcast ("checkpoint", v) ──▶    on_checkpoint(v)
      ranks/rank-0.pt                                  ranks/rank-r.pt   (temporary name, fsync, rename)
      gather ◀──── bytes, SHA-256, optimizer digest ── gather            (the barrier: every shard is on disk)
      each shard here as its rank wrote it? then model/
      MANIFEST.trainer.json, written last: every file's SHA-256, the counters, the split, each rank's
      optimizer digest

    load_trainer on every rank: the manifest verifies (rank 0: every file; the others: what they read), the
    split is the checkpoint's, the policy through the backend (this rank's shard of the HF tensors), then its
    shard: optimizers (the digest recorded for this rank), modules, RNG. Else CheckpointError (one line).

The checkpoint directory is the job dir's, which every rank of the trainer sees (one host, or a filesystem
the hosts share: `rlctl.launch.run.refuse_unshared_trainer`). Tensors go through `torch.save` and come back
through `torch.load(weights_only=True)`; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlctl.agents.checkpoint import file_digest, manifest_path, write_part
from rlctl.engines.model import TinyGPT
from rlctl.errors import RlctlError
from rlctl.launch.agentenv import ParallelConfig, split_problem, verified_manifest
from rlctl.launch.sitefs import LocalFiles
from rlctl.trainers.base import TrainerBackend

log = logging.getLogger(__name__)

MODEL = "model"
RANKS = "ranks"


class CheckpointError(RlctlError):
    """A checkpoint that cannot be used: missing, incomplete or damaged (names the checkpoint and why)."""


def shard_name(rank: int) -> str:
    """Rank `rank`'s file, relative to the checkpoint directory."""
    return f"{RANKS}/rank-{rank}.pt"


def rng_state() -> dict[str, Any]:
    """This process's RNG states: torch's (every CUDA device's too, on a GPU trainer), `random`'s and numpy's."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": [str(kind), np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if torch.cuda.is_available():
        out |= {f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())}
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = [state[f"cuda.{i}"] for i in range(torch.cuda.device_count()) if f"cuda.{i}" in state]
    if cuda and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def optimizer_digest(optimizers: dict[str, torch.optim.Optimizer]) -> str:
    """SHA-256 over every optimizer's hyper-parameters and state tensors (bytes), in a fixed order: equal
    digests before the save and after the restore mean the optimizer state came back exactly."""
    h = hashlib.sha256()
    for name in sorted(optimizers):
        sd = optimizers[name].state_dict()
        h.update(name.encode() + json.dumps(sd["param_groups"], sort_keys=True, default=str).encode())
        for index in sorted(sd["state"]):
            for key in sorted(sd["state"][index]):
                value = sd["state"][index][key]
                h.update(f"{index}.{key}".encode())
                t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _write_shard(
    ckpt: Path,
    *,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module],
    split: ParallelConfig,
) -> dict[str, Any]:
    """This rank's shard, on disk under its final name when this returns; what rank 0 records of it (or why
    it could not be written: rank 0 then refuses the checkpoint, naming the rank)."""
    rank, _ = _rank_world()
    rel = shard_name(rank)
    body: dict[str, Any] = {"rank": rank, "rng": rng_state()}
    body |= {f"optimizer.{k}": o.state_dict() for k, o in optimizers.items()}
    body |= {f"module.{k}": m.state_dict() for k, m in modules.items()}
    path = ckpt / rel
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            torch.save(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        written = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    except OSError as e:  # the disk is full, the directory is gone: rank 0 says which rank and why
        log.error("checkpoint %s: rank %d could not write %s: %s", ckpt.name, rank, rel, e)
        return {"rank": rank, "file": rel, "error": f"{type(e).__name__}: {e}"}
    return {
        "rank": rank,
        "file": rel,
        **written,
        "optimizer_sha256": optimizer_digest(optimizers),
        "split": split.short(),
    }


def save_shard(
    ckpt: Path,
    *,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    split: ParallelConfig,
) -> None:
    """Ranks > 0, told by rank 0 that checkpoint `ckpt` is due: write this rank's shard, then join the gather
    that tells rank 0 it is on disk (rank 0 seals the checkpoint after it)."""
    record = _write_shard(ckpt, optimizers=optimizers, modules=modules or {}, split=split)
    dist.gather_object(record, None, dst=0)


def save_trainer(
    ckpt: Path,
    *,
    model: TinyGPT | TrainerBackend,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    counters: dict[str, Any],
    split: ParallelConfig,
    tokenizer_from: Path | None = None,
    announce: Callable[[], None] | None = None,
) -> str:
    """Rank 0: write the trainer's part of checkpoint `ckpt`, every rank's shard in it; the SHA-256 of its
    manifest (the controller records it). `announce` tells the other ranks to write theirs (`save_shard`):
    with several ranks it must make each of them call `save_shard` for `ckpt`."""
    rank, world = _rank_world()
    assert rank == 0 and world == split.tp * split.pp * split.dp, (rank, world, split)
    manifest_path(ckpt, "trainer").unlink(missing_ok=True)  # the part is incomplete until it is sealed again
    if world > 1:
        assert announce is not None, "the other ranks must be told to write their shards"
        announce()
    mine = _write_shard(ckpt, optimizers=optimizers, modules=modules or {}, split=split)
    records: list[Any] = [mine]
    if world > 1:
        records = [None] * world
        dist.gather_object(mine, records, dst=0)
    listed = {}
    for r, rec in enumerate(records):  # every shard is on disk, and is here as its rank wrote it
        if "error" in rec:
            raise CheckpointError(f"{ckpt}: rank {r} could not write its shard {rec['file']}: {rec['error']}")
        assert rec["rank"] == r and rec["split"] == split.short(), (rec, split)
        path = ckpt / rec["file"]
        seen = {"bytes": path.stat().st_size, "sha256": file_digest(path)} if path.is_file() else None
        if seen != {"bytes": rec["bytes"], "sha256": rec["sha256"]}:
            raise CheckpointError(
                f"{ckpt}: rank {r}'s shard {rec['file']} is not here as rank {r} wrote it "
                f"({'missing' if seen is None else 'other bytes'}): do the trainer's ranks share the job dir?"
            )
        listed[rec["file"]] = seen

    def fill_model(tmp: Path) -> None:
        model.save_pretrained(tmp, tokenizer_from=tokenizer_from)

    meta = {
        "counters": counters,
        "split": {"tp": split.tp, "pp": split.pp, "dp": split.dp, "world": world},
        "optimizer_sha256": mine["optimizer_sha256"],  # rank 0's; every rank's below
        "ranks": [{"rank": r["rank"], "file": r["file"], "optimizer_sha256": r["optimizer_sha256"]} for r in records],
    }
    return write_part(ckpt, "trainer", {MODEL: fill_model}, meta=meta, listed=listed)


def _verified(ckpt: Path, rank: int) -> dict[str, Any]:
    """The trainer part's manifest once the files this rank reads match it: the policy and its shard; on rank 0
    every rank's shard (it answers for the whole part). CheckpointError naming what is wrong."""

    def common(rel: str) -> bool:
        return not rel.startswith(f"{RANKS}/")

    try:
        manifest = verified_manifest(LocalFiles(), str(ckpt), "trainer", only=common)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: the trainer's part is not usable: {e}") from e
    shards = [s for s in manifest.get("ranks", []) if rank == 0 or s["rank"] == rank]
    for s in shards:
        try:
            verified_manifest(LocalFiles(), str(ckpt), "trainer", only=str(s["file"]).__eq__)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{ckpt}: rank {s['rank']}'s shard is not usable: {e}") from e
    return manifest


def load_trainer(
    ckpt: Path,
    *,
    model: TinyGPT | TrainerBackend,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    split: ParallelConfig,
) -> tuple[dict[str, Any], str]:
    """Restore into this rank's objects what `save_trainer` and `save_shard` wrote; (counters, manifest digest).
    No collective: every rank loads on its own. CheckpointError (naming the checkpoint, and the rank for a
    shard) when the files do not verify, or the checkpoint was written at another split than `split`."""
    rank, _ = _rank_world()
    manifest = _verified(ckpt, rank)
    why = split_problem(manifest, split)
    if why is not None:
        raise CheckpointError(f"{ckpt}: {why}")
    (entry,) = [s for s in manifest["ranks"] if s["rank"] == rank]
    loaded = TinyGPT.from_pretrained(ckpt / MODEL)
    model.load_state_dict(loaded.state_dict())
    shard = torch.load(ckpt / entry["file"], weights_only=True)
    assert shard["rank"] == rank, (ckpt, entry)  # the manifest verified this file: it is the one rank 0 listed
    for k, o in optimizers.items():
        o.load_state_dict(shard[f"optimizer.{k}"])
    for k, m in (modules or {}).items():
        m.load_state_dict(shard[f"module.{k}"])
    restored = optimizer_digest(optimizers)
    if restored != entry["optimizer_sha256"]:
        raise CheckpointError(f"{ckpt}: rank {rank}'s optimizer state restored differs from the one saved")
    set_rng_state(shard["rng"])
    log.info("restored %s: optimizer state sha256 %s, as saved (rank %d, %s)", ckpt.name, restored, rank, split.short())
    return dict(manifest["counters"]), str(manifest["digest"])
