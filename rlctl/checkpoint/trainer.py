"""The trainer's part of a checkpoint: the policy (an HF directory, gathered), the shards of data-parallel
replica 0 (one per tp × pp rank of it: its optimizers' state, other trained modules such as a PPO critic, its
RNG states), the trainer's counters and the split (tp × pp × dp) it was written at — saved and restored as one
unit.

Data-parallel replicas hold the same optimizer state bit for bit (gradients are summed over dp before the same
AdamW step: `rlctl.rl.learner`), so only replica 0's ranks write a shard; a rank of replica d > 0 joins the
barrier, and on resume restores the shard of the replica-0 rank at its own (tp, pp) position: the first rank of
its data-parallel group. The torch backend holds a whole replica per rank: rank 0 alone writes.

    rank 0: save_trainer                               ranks > 0: save_shard (the learner's follow loop)
      MANIFEST.trainer.json goes (being rewritten)
      announce() ── broadcast ("checkpoint", v) ──▶    on_checkpoint(v)
      ranks/rank-0.pt                                  replica 0: ranks/rank-r.pt (temporary name, fsync, rename)
                                                       replica d > 0: writes nothing
      gather ◀── bytes, SHA-256, optimizer digest ──── gather            (the barrier: every shard is on disk)
      each shard here as its rank wrote it? then model/
      MANIFEST.trainer.json, written last: every file's SHA-256, the counters, the split, per shard its
      writer, its optimizer digest and the ranks that restore it

    load_trainer on every rank: the manifest verifies (rank 0: every file; the others: what they read), the
    policy through the backend (this rank's shard of the HF tensors, read one at a time), then the shard of its
    (tp, pp) position: optimizers (the digest recorded for it), modules, RNG. Else CheckpointError (one line); a
    shard that verifies but is not what its rank wrote (an entry missing, of another shape or dtype, a truncated
    file listed as it is) is refused before its state is loaded, naming its file (`rlctl.checkpoint.shardcheck`).
    At another split (`rlctl.checkpoint.resplit`): another dp, the shard of its position at the checkpoint's
    split, exactly; another tp × pp (megatron), its AdamW state rebuilt from the old shards its new shard
    overlaps, gathered whole per parameter and split for its position as the weights are. A torch trainer whose
    state FSDP2 shards at either split, at another dp or sharded on one side alone (`rlctl.checkpoint.refsdp`):
    its part of the AdamW state and of its modules (a sharded policy's fp32 weights, LoRA adapters) cut per
    tensor from the old shards its rows overlap, which alone it verifies and reads (the whole tensor never made).
    Refused in one line: FSDP's sharded state at another tp × pp, other modules' state (a PPO critic's) at another
    tp × pp, a shard that does not hold this model's parameters. A torch PPO critic's shard of before 2026-12-07, which
    held the policy's lm_head, is hashed as written, then read without it (`rlctl.checkpoint.oldcritic`).

RNG: the states of replicas d > 0 are not saved; such a rank resumes with its replica-0 peer's. Nothing on the
trainer's ranks draws from them once the model is built: every dropout is 0 (megatron's RNG tracker forks
nothing: `rlctl.trainers.megatron.cpu`), GRPO's advantages, loss, clipping and AdamW draw nothing, and the
task's code on rank 0 (prompt tokens, rewards) draws only from generators of its own, seeded from the job; a
user's reward function runs in worker processes. The states are kept so that whatever draws from them later
resumes where replica 0 was.

The checkpoint directory is the job dir's, which the writing ranks see (one host, or a filesystem the hosts
share), and which every rank reads on resume: `rlctl.launch.layout.unshared_trainer`. Tensors go through
`torch.save` and come back through `torch.load(weights_only=True)`; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from rlctl.checkpoint import oldcritic, refsdp, resplit, shardcheck
from rlctl.checkpoint.choose import split_problem, verified_manifest, written_at
from rlctl.checkpoint.files import file_digest, fsync_dir, manifest_path, no_space, write_part
from rlctl.errors import CheckpointError, ConfigError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.sitefs import LocalFiles
from rlctl.models import hf, hfdir, hfnames
from rlctl.models.tensors import CheckpointTensors, DoesNotFit, ModelTensors
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig
from rlctl.trainers.base import DataParallel, TrainerBackend, whole_replicas
from rlctl.trainers.fsdp import load_local, local_state, redistribute_optimizer
from rlctl.trainers.wire import all_gather_values

log = logging.getLogger(__name__)

MODEL = "model"
RANKS = "ranks"


class SavesPretrained(Protocol):
    """What writes the policy's HF directory into a checkpoint (a trainer backend, TinyGPT, a published version)."""

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path: ...


def shard_name(rank: int) -> str:
    """Rank `rank`'s file, relative to the checkpoint directory."""
    return f"{RANKS}/rank-{rank}.pt"


def _cuda_device() -> int | None:
    """The CUDA device this process computes on (`rlctl.devices.compute_for` set it), None where it has not
    initialised CUDA: a CPU trainer, which asking for CUDA RNG states would make initialise it on a GPU host."""
    return torch.cuda.current_device() if torch.cuda.is_initialized() else None


def rng_state() -> dict[str, Any]:
    """This process's RNG states: torch's (its own CUDA device's too, on a GPU trainer: `cuda`), `random`'s and
    numpy's."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [version, list(internal), gauss],
        "numpy": [str(kind), np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }
    if (device := _cuda_device()) is not None:
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """`rng_state`'s states back; the CUDA one into this process's own device, whatever its index (a SLURM task that
    sees its node's GPUs computes on the SLURM_LOCALID-th: `rlctl.devices.first_device`). A checkpoint written
    before `cuda` kept every visible device's state as `cuda.<index>`: this device's index is taken."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if (device := _cuda_device()) is not None and (cuda := state.get("cuda", state.get(f"cuda.{device}"))) is not None:
        torch.cuda.set_rng_state(cuda, device)


def optimizer_digest(optimizers: dict[str, torch.optim.Optimizer]) -> str:
    """SHA-256 over every optimizer's hyper-parameters and state tensors (bytes), in a fixed order: equal
    digests before the save and after the restore mean the optimizer state came back exactly."""
    return states_digest({name: local_state(o.state_dict()) for name, o in optimizers.items()})  # FSDP: its part


def states_digest(states: dict[str, dict[str, Any]]) -> str:
    """`optimizer_digest` of optimizers' (local) state dicts, e.g. a snapshot of them in host memory."""
    h = hashlib.sha256()
    for name in sorted(states):
        sd = states[name]
        h.update(name.encode() + json.dumps(sd["param_groups"], sort_keys=True, default=str).encode())
        for index in sorted(sd["state"]):
            for key in sorted(sd["state"][index]):
                value = sd["state"][index][key]
                h.update(f"{index}.{key}".encode())
                t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _rank_world() -> tuple[int, int]:
    """This rank and the world's size in the default group (0 of 1 without one)."""
    every = whole_replicas()
    return every.rank, every.size


def replica_ranks(data_parallel: DataParallel) -> list[int]:
    """The global ranks of this rank's data-parallel group in replica order: the ranks at its (tp, pp) position,
    which hold the same optimizer state after every step. The first (replica 0's) writes the shard they all
    restore."""
    rank, world = _rank_world()
    if data_parallel.size == 1 or data_parallel.sharded:  # sharded: every rank's state is its own
        return [rank]
    elif data_parallel.group is None:  # the default group's ranks, every one a whole replica (`whole_replicas`)
        out = list(range(world))
    else:
        group = data_parallel.group
        out = sorted(dist.get_process_group_ranks(group), key=lambda g: dist.get_group_rank(group, g))
    assert len(out) == data_parallel.size and out[data_parallel.rank] == rank, (out, data_parallel, rank)
    return out


def host_copy(value: Any) -> Any:
    """`value` with every tensor in it copied into host memory (dicts, lists and tuples rebuilt; other values
    as they are): a snapshot the next optimizer step does not change."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(v) for v in value)
    return value


class HostPolicy:
    """A policy's HF tensors copied into host memory when its checkpoint was due: what a background write saves
    while training goes on (`SavesPretrained`). Weights in the dtype they were taken in (the trainer's fp32
    master weights: a resume continues from them exactly); a tied embedding once. Its config.json declares the
    dtype of the model the job started from (`config.torch_dtype`), as a sharded trainer's checkpoint (the
    published version, in that dtype) does: every checkpoint of a job loads the same way whatever the trainer's
    split — transformers and vLLM (`dtype="auto"`), a next job's planner, wire and engines take a bf16 model's
    checkpoint as bf16, not as an fp32 model of twice the bytes."""

    def __init__(self, state: Mapping[str, torch.Tensor], config: TinyGPTConfig) -> None:
        tied = config.tie_word_embeddings
        self.state = {k: host_copy(v) for k, v in state.items() if not (tied and k == "lm_head.weight")}
        self.config = config

    def save_pretrained(self, directory: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
        return hfdir.write_pretrained(
            directory, self.state, self.config, tokenizer_from=tokenizer_from, declared_dtype=self.config.torch_dtype
        )


def _shard_snapshot(
    *,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module],
    data_parallel: DataParallel,
) -> dict[str, Any] | None:
    """What this rank's shard holds, copied into host memory now; None on a rank of a replica other than 0
    (replica 0's rank at its position holds the same state, and writes it)."""
    if data_parallel.rank > 0 and not data_parallel.sharded:
        return None
    rank, _ = _rank_world()
    body: dict[str, Any] = {"rank": rank, "rng": rng_state()}
    body |= {f"optimizer.{k}": host_copy(local_state(o.state_dict())) for k, o in optimizers.items()}
    body |= {f"module.{k}": host_copy(local_state(m.state_dict())) for k, m in modules.items()}
    return body


def _write_shard(
    ckpt: Path, body: dict[str, Any] | None, *, optimizers: list[str], split: ParallelConfig, replicas: list[int]
) -> dict[str, Any]:
    """Write this rank's shard (`_shard_snapshot`), on disk under its final name when this returns; what rank 0
    records of it (or why it could not be written: rank 0 then refuses the checkpoint, naming the rank). A rank
    of another replica (`body` None) writes nothing."""
    rank, _ = _rank_world()
    if body is None:
        return {"rank": rank, "replicas": replicas, "split": split.short()}
    rel = shard_name(rank)
    path = ckpt / rel
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.tmp-*"):  # a failed write's (a full disk), under another pid
            stale.unlink(missing_ok=True)
        with tmp.open("wb") as f:
            torch.save(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        written = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    except (OSError, RuntimeError) as e:  # the disk is full (torch.save: RuntimeError), the directory is gone:
        # every rank still reaches the gather, and rank 0 refuses the checkpoint naming this rank and why
        # (asked before the partial shard goes: ranks sharing the disk free theirs too, and each then saw room)
        full = no_space(path.parent, e, needed_bytes=_tensor_bytes(body))
        tmp.unlink(missing_ok=True)  # a partial shard is not left for `keep` to miss
        error = f"{type(e).__name__}: {e}"
        log.error("checkpoint %s: rank %d could not write %s: %s", ckpt.name, rank, rel, full or error)
        failed = {"rank": rank, "replicas": replicas, "file": rel, "error": error}
        return failed if full is None else failed | {"error": f"{full} ({error})", "full_dir": str(ckpt.parent)}
    return {
        "rank": rank,
        "replicas": replicas,
        "file": rel,
        **written,
        "optimizer_sha256": states_digest({k: body[f"optimizer.{k}"] for k in optimizers}),
        "split": split.short(),
    }


def snapshot_shard(
    ckpt: Path,
    *,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    split: ParallelConfig,
    data_parallel: DataParallel,
    group: Any = None,
) -> Callable[[], None]:
    """Ranks > 0, told by rank 0 that checkpoint `ckpt` is due: this rank's shard copied into host memory now
    (if it is one of replica 0's); the write, to call now or on a thread of its own: it writes the shard, then
    joins the gather over `group` (default: every rank) that tells rank 0 it is on disk (rank 0 seals the
    checkpoint after it)."""
    body = _shard_snapshot(optimizers=optimizers, modules=modules or {}, data_parallel=data_parallel)
    replicas = replica_ranks(data_parallel)

    def write() -> None:
        record = _write_shard(ckpt, body, optimizers=list(optimizers), split=split, replicas=replicas)
        all_gather_values(record, dict[str, Any], group=group)  # rank 0 seals the part once every rank answered

    return write


def save_shard(
    ckpt: Path,
    *,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    split: ParallelConfig,
    data_parallel: DataParallel,
) -> None:
    """`snapshot_shard`, written at once."""
    snapshot_shard(ckpt, optimizers=optimizers, modules=modules, split=split, data_parallel=data_parallel)()


def snapshot_trainer(
    ckpt: Path,
    *,
    model: SavesPretrained,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    counters: dict[str, Any],
    split: ParallelConfig,
    data_parallel: DataParallel,
    tokenizer_from: Path | None = None,
    announce: Callable[[], None] | None = None,
    group: Any = None,
) -> Callable[[], str]:
    """Rank 0: the trainer's part of checkpoint `ckpt`, taken now: `announce` tells the other ranks to take
    theirs (`snapshot_shard`: with several ranks it must make each of them call it for `ckpt`), then this rank's
    shard is copied into host memory. `model` must not change after this (a `HostPolicy`, a backend no step
    changes before the write). The write, to call now or on a thread of its own, returns the SHA-256 of the
    part's manifest (the controller records it); it gathers the other ranks' records over `group` (default:
    every rank)."""
    rank, world = _rank_world()
    assert rank == 0 and world == split.tp * split.pp * split.dp, (rank, world, split)
    manifest_path(ckpt, "trainer").unlink(missing_ok=True)  # the part is incomplete until it is sealed again
    if world > 1:
        assert announce is not None, "the other ranks must be told to write their shards"
        announce()
    body = _shard_snapshot(optimizers=optimizers, modules=modules or {}, data_parallel=data_parallel)
    replicas = replica_ranks(data_parallel)
    names = list(optimizers)

    def write() -> str:
        mine = _write_shard(ckpt, body, optimizers=names, split=split, replicas=replicas)
        records: list[dict[str, Any]] = [mine]
        if world > 1:
            records = all_gather_values(mine, dict[str, Any], group=group)
        return _seal(ckpt, records, model=model, counters=counters, split=split, tokenizer_from=tokenizer_from)

    return write


def save_trainer(
    ckpt: Path,
    *,
    model: SavesPretrained,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    counters: dict[str, Any],
    split: ParallelConfig,
    data_parallel: DataParallel,
    tokenizer_from: Path | None = None,
    announce: Callable[[], None] | None = None,
) -> str:
    """`snapshot_trainer`, written at once: the SHA-256 of the part's manifest."""
    return snapshot_trainer(
        ckpt,
        model=model,
        optimizers=optimizers,
        modules=modules,
        counters=counters,
        split=split,
        data_parallel=data_parallel,
        tokenizer_from=tokenizer_from,
        announce=announce,
    )()


def _seal(
    ckpt: Path,
    records: list[dict[str, Any]],
    *,
    model: SavesPretrained,
    counters: dict[str, Any],
    split: ParallelConfig,
    tokenizer_from: Path | None,
) -> str:
    """Rank 0, once every rank's record is in: check that each shard is here as its rank wrote it, write the
    policy, then the manifest (last); its SHA-256."""
    world = len(records)
    mine = records[0]
    shards = [rec for rec in records if "file" in rec]
    # replica 0 is where ParallelConfig says (the launcher places the writers by it), and restores every rank
    assert [rec["rank"] for rec in shards] == split.first_replica_ranks(), (records, split)
    assert {rec["replicas"][0] for rec in records} == {rec["rank"] for rec in shards}, records
    failed = [rec for rec in shards if "error" in rec]
    if failed:  # a full disk first: what the operator must fix before a resume
        rec = next((rec for rec in failed if rec.get("full_dir")), failed[0])
        raise CheckpointError(
            f"{ckpt}: rank {rec['rank']} could not write its shard {rec['file']}: {rec['error']}",
            full_dir=rec.get("full_dir", ""),
        )
    listed = {}
    for rec in shards:  # every shard is on disk, and is here as its rank wrote it
        r = rec["rank"]
        assert rec["split"] == split.short(), (rec, split)
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
        "split": {"tp": split.tp, "pp": split.pp, "dp": split.dp, "world": world}
        | ({"fsdp": True} if split.fsdp else {}),
        "optimizer_sha256": mine["optimizer_sha256"],  # rank 0's; every shard's below
        "ranks": [  # the ranks that wrote (replica 0's), and the ranks that restore each one's shard
            {
                "rank": r["rank"],
                "file": r["file"],
                "optimizer_sha256": r["optimizer_sha256"],
                "restored_by": r["replicas"],
            }
            for r in shards
        ],
    }
    try:
        return write_part(ckpt, "trainer", {MODEL: fill_model}, meta=meta, listed=listed)
    except Exception as e:  # the policy's files on a full disk: safetensors raises SafetensorError (os error 28)
        full = no_space(ckpt, e)
        if full is None:
            raise
        raise CheckpointError(
            f"{ckpt}: the policy could not be written: {full} ({type(e).__name__}: {e})", full_dir=str(ckpt.parent)
        ) from e


def _tensor_bytes(body: Any) -> int:
    """The bytes of the tensors and arrays in a shard's body (what its file needs, give or take the framing)."""
    if isinstance(body, torch.Tensor):
        return body.numel() * body.element_size()
    if isinstance(body, np.ndarray):
        return int(body.nbytes)
    if isinstance(body, dict):
        return sum(_tensor_bytes(v) for v in body.values())
    if isinstance(body, list | tuple):
        return sum(_tensor_bytes(v) for v in body)
    return 0


def _verified(ckpt: Path, *, rank: int, reads: Callable[[dict[str, Any]], list[int]], version: int) -> dict[str, Any]:
    """The trainer part's manifest once the files this rank reads match it: the policy and the shards of the
    ranks `reads(manifest)` names (the one of its position; at another split, those its new shard overlaps); on
    rank 0 every shard (it answers for the whole part); of checkpoint `version` (its counters name it:
    `verified_manifest`). Each shard is checked against the manifest read again, which must be the one read
    first (its SHA-256) and of `version` too: a manifest swapped between the reads (another version's part, another
    run's) is refused, versus its shards taken as the new one listed them beside the first one's counters and
    optimizer digests. CheckpointError naming what is wrong."""

    def common(rel: str) -> bool:
        return not rel.startswith(f"{RANKS}/")

    try:
        manifest = verified_manifest(LocalFiles(), str(ckpt), "trainer", version=version, only=common)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: the trainer's part is not usable: {e}") from e
    mine = reads(manifest) if "ranks" in manifest else []
    shards = [s for s in manifest.get("ranks", []) if rank == 0 or s["rank"] in mine]
    for s in shards:
        try:
            again = verified_manifest(LocalFiles(), str(ckpt), "trainer", version=version, only=str(s["file"]).__eq__)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{ckpt}: rank {s['rank']}'s shard is not usable: {e}") from e
        if again["digest"] != manifest["digest"]:
            raise CheckpointError(
                f"{ckpt}: the trainer's part is not usable: MANIFEST.trainer.json changed as rank {rank} read it "
                "(the part rewritten meanwhile)"
            )
    return manifest


def written_split(manifest: dict[str, Any]) -> ParallelConfig:
    """The split a trainer part was written at (its manifest's)."""
    split = manifest["split"]
    return ParallelConfig("trainer", int(split["tp"]), int(split["pp"]), dp=int(split["dp"]), fsdp=split.get("fsdp"))


def _shards_read(
    manifest: dict[str, Any],
    *,
    model: Any,
    split: ParallelConfig,
    shard_of: int,
    rank: int,
    sizes: Callable[[], Iterable[int]],
) -> list[int]:
    """The writers of the shards this rank restores from: replica 0's at its (tp, pp) position at the
    checkpoint's split (`shard_of` itself at the same split); at another tp × pp those of the old positions its
    new shard overlaps (`resplit.stages_read`, every old tp rank of them); FSDP's state at another dp or sharded on
    one side alone, the old ranks' shards holding rows `rank` holds of a tensor of a dim-0 size in `sizes()`
    (`refsdp.shards_read`: every one for an unsharded target, rank 0's for an unsharded source)."""
    if split_problem(manifest, split) is not None:
        return [shard_of]
    was = written_split(manifest)
    if refsdp.applies(was, split):
        written = [int(s["rank"]) for s in manifest["ranks"]]
        return refsdp.shards_read(was, split, rank=rank, sizes=sizes(), written=written)
    t, p = resplit.position(shard_of, split)
    if (was.tp, was.pp) == (split.tp, split.pp):
        return [resplit.writer(t, p, was)]
    policy: Any = getattr(model, "model", None)
    if not hasattr(policy, "stage"):  # not megatron's: refused in load_trainer
        return []
    stages = resplit.stages_read(policy.config, policy.stage, was.pp)
    return [resplit.writer(t0, s0, was) for s0 in stages for t0 in range(was.tp)]


def load_trainer(
    ckpt: Path,
    *,
    model: TinyGPT | TrainerBackend,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    split: ParallelConfig,
    data_parallel: DataParallel,
    version: int,
) -> tuple[dict[str, Any], str]:
    """Restore into this rank's objects what `save_trainer` and `save_shard` wrote: the policy, then the shard
    of replica 0's rank at this rank's (tp, pp) position (its own on replica 0); (counters, manifest digest).
    No collective: every rank loads on its own. At another split than the checkpoint's, see the module's docstring
    (one line logs both splits). CheckpointError (naming the checkpoint, and the rank for a shard) when the files
    do not verify, the checkpoint was written at a split this rank cannot rebuild its state at (`split_problem`,
    `_load_resplit`), or its counters name another version than `version` (the N of the iter-N a resume loads); a
    shard read that is not what its rank wrote, `<checkpoint>: <shard>: <what>` (`rlctl.checkpoint.shardcheck`), its
    optimizers' entries, shapes and dtypes refused before any is loaded (their values after, hashed once as restored),
    its modules before the policy is (another model's policy is refused first, by `_load_policy`, in its own words;
    at another tp × pp, by `_check_policy`, before the old shards are read)."""
    rank, _ = _rank_world()
    replicas = replica_ranks(data_parallel)
    shard_of = replicas[0]

    def sizes() -> set[int]:  # the dim-0 sizes of the state FSDP2 shards (a DTensor's shape is the whole tensor's)
        held = [p for o in optimizers.values() for g in o.param_groups for p in g["params"]]
        held += [t for m in (modules or {}).values() for t in m.state_dict().values()]
        return {int(t.shape[0]) for t in held if isinstance(t, torch.Tensor) and t.dim() > 0}

    def reads(manifest: dict[str, Any]) -> list[int]:
        return _shards_read(manifest, model=model, split=split, shard_of=shard_of, rank=rank, sizes=sizes)

    manifest = _verified(ckpt, rank=rank, reads=reads, version=version)
    why = split_problem(manifest, split)
    if why is not None:
        raise CheckpointError(f"{ckpt}: {why}")
    was = written_split(manifest)
    if refsdp.applies(was, split):
        mine = reads(manifest)
        return _load_refsdp(
            ckpt, manifest, model=model, optimizers=optimizers, modules=modules or {}, split=split, reads=mine
        )
    if (was.tp, was.pp) != (split.tp, split.pp):
        return _load_resplit(
            ckpt,
            manifest,
            model=model,
            optimizers=optimizers,
            modules=modules or {},
            split=split,
            reads=reads(manifest),
        )
    if was.dp != split.dp:  # the writer of this rank's position at that split: the same state (the module's docstring)
        log.info("checkpoint %s was written at %s and is resumed at %s", ckpt.name, was.short(), split.short())
        shard_of = resplit.writer(*resplit.position(shard_of, split), was)
    (entry,) = [s for s in manifest["ranks"] if s["rank"] == shard_of]
    assert was.dp != split.dp or rank in entry.get("restored_by", replicas), (ckpt, entry, rank)
    rel, written = entry["file"], entry["optimizer_sha256"]
    shard = shardcheck.read_shard(ckpt, rel)
    shard, hashed = oldcritic.read_as_now(  # (a critic's with the lm_head it held until 2026-12-07: hashed as written)
        ckpt, rel, shard, rank=shard_of, optimizers=optimizers, modules=modules or {}, recorded=written
    )
    try:  # what any shard must hold, then the modules: before the policy (a refusal copies nothing)
        shardcheck.check_held(shard, rank=shard_of, optimizers=optimizers)
    except ValueError as e:
        raise shardcheck.damaged(ckpt, rel, str(e)) from e
    shardcheck.check_modules(ckpt / rel, shard, modules or {})
    _load_policy(ckpt / MODEL, model)  # (another model's checkpoint: refused here, in its words, nothing copied)
    try:  # the optimizers' state: refused before any of it is loaded
        shardcheck.check_optimizers(shard, optimizers=optimizers)
        shardcheck.check_local(shard, optimizers=optimizers)
    except ValueError as e:
        raise shardcheck.damaged(ckpt, rel, str(e)) from e
    for k, m in (modules or {}).items():
        load_local(m, shard[f"module.{k}"])
    for k, o in optimizers.items():
        o.load_state_dict(shard[f"optimizer.{k}"])
        redistribute_optimizer(o, [p for g in o.param_groups for p in g["params"]])  # sharded: DTensors again
    # its values, hashed once: as restored (a shard's changed values and a restore that changed them alike), versus
    # the shard's state hashed before the load too (at model scale the seconds of a second pass over AdamW's state)
    restored = optimizer_digest(optimizers)
    if restored != written and not hashed:
        raise shardcheck.damaged(
            ckpt, rel, "its optimizer state is not the one its rank wrote (its SHA-256 is not the manifest's)"
        )
    set_rng_state(shard["rng"])  # replica 0's at this position, on every replica (see the module's docstring)
    log.info(
        "restored %s: optimizer state sha256 %s, as saved (rank %d from rank %d's shard, %s)",
        ckpt.name,
        restored,
        rank,
        shard_of,
        split.short(),
    )
    return dict(manifest["counters"]), str(manifest["digest"])


def _load_policy(directory: Path, model: TinyGPT | TrainerBackend) -> None:
    """The checkpoint's policy weights into `model`, its tensors checked against its config.json first and read one
    at a time (`CheckpointTensors`): a megatron rank holds its shard and one parameter's whole HF tensors, a torch
    rank one tensor (`copy_into`), versus the whole model twice (its state dict and a TinyGPT of it: 70B in fp32,
    ≈ 560 GB on every rank). ConfigError naming `directory`, nothing copied, where they do not fit the job's model
    (`rlctl.models.tensors.check_fit`: another model's checkpoint), versus a ValueError's traceback (or, sharded, a
    missing tensor alone refused; megatron, a KeyError's)."""
    tensors = _policy_tensors(directory)
    try:
        if isinstance(model, TinyGPT):
            model.load_weights(tensors)  # (copy_into: a tied lm_head optional, as the model ties it)
        else:
            model.load_state_dict(tensors)
    except DoesNotFit as e:
        raise ConfigError(str(directory), None, str(e)) from e


def _policy_tensors(directory: Path) -> ModelTensors:
    """The checkpoint's policy tensors (`directory`: its HF model) under the model's names, each read as it is asked
    for (a Phi3 file's fused tensors too); ConfigError naming `directory` where they are not its config.json's."""
    file, config = CheckpointTensors(directory), hf.read_config(directory)
    only = hfnames.match_weights(file.shapes(), config, where=str(directory))
    return ModelTensors(file, config, only=only)


def _check_policy(directory: Path, policy: Any) -> tuple[ModelTensors, dict[str, tuple[int, ...]]]:
    """`_load_policy`'s refusal of another model's checkpoint (ConfigError naming `directory`), with nothing read but
    the files' headers (and a tied lm_head): megatron's `policy` (`MegatronPolicy.check_hf`), before a resume at
    another tp × pp reads the old shards, whose AdamW state another model's would misfit in a line naming a shard.
    The tensors checked and their full shapes, which that resume's load takes as checked (`load_hf`'s `checked`)."""
    tensors = _policy_tensors(directory)
    try:
        return tensors, policy.check_hf(tensors)
    except DoesNotFit as e:
        raise ConfigError(str(directory), None, str(e)) from e


def _load_resplit(
    ckpt: Path,
    manifest: dict[str, Any],
    *,
    model: TinyGPT | TrainerBackend,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module],
    split: ParallelConfig,
    reads: list[int],
) -> tuple[dict[str, Any], str]:
    """`load_trainer` of a part written at another tp × pp than `split`: its AdamW state rebuilt from the old shards
    `reads` (`rlctl.checkpoint.resplit`), then the policy (this rank's shard of the HF tensors), the RNG of the
    first. Megatron's policy optimizer alone: CheckpointError for other modules' state (a PPO critic's) or another
    backend; a shard that does not hold its rank's part of the policy's state (a moment of another shape or dtype, a
    step count the other shards' parameters do not share) refused in one line naming its file and the parameter
    (`shardcheck.damaged`) before the policy is loaded, versus a line naming no file after it. Another model's
    checkpoint is refused before any shard is read (`_check_policy`: ConfigError naming its model), versus a line
    blaming a shard file for the other model's moments."""
    was = written_split(manifest)
    refused = f"{ckpt}: {written_at(manifest, split)}"
    policy: Any = getattr(model, "model", None)
    if not hasattr(policy, "stage") or not reads:
        raise CheckpointError(f"{refused}: only megatron's shards are rebuilt at another tp × pp")
    if modules or sorted(optimizers) != ["policy"]:
        raise CheckpointError(
            f"{refused}: rebuilding {', '.join(sorted(set(modules) | set(optimizers) - {'policy'}))}'s state at "
            f"another tp × pp is not built; resume at tp {was.tp} pp {was.pp}"
        )
    # another model's checkpoint: refused in its words, before any shard is read; checked once (the load below
    # takes it as checked), versus again by the load (each file's header parsed twice, a tied lm_head and the
    # embedding read and compared twice)
    tensors, shapes = _check_policy(ckpt / MODEL, policy)
    rank, _ = _rank_world()
    files = {s["rank"]: s["file"] for s in manifest["ranks"]}
    shards = {resplit.position(r, was): shardcheck.read_shard(ckpt, files[r], mmap=True) for r in reads}
    for r in reads:
        try:
            shardcheck.check_held(shards[resplit.position(r, was)], rank=r, optimizers=optimizers)
        except ValueError as e:
            raise shardcheck.damaged(ckpt, files[r], str(e)) from e
    opt = optimizers["policy"]
    by_id = {id(p): n.removeprefix("gpt.") for n, p in policy.named_parameters()}
    params = [p for g in opt.param_groups for p in g["params"]]
    index_names = {i: by_id[id(p)] for i, p in enumerate(params)}
    t = rank % split.tp  # this rank's tp rank (megatron's order: tp fastest)
    (dtype,) = {p.dtype for p in params}  # (megatron's fp32 master weights: `params_dtype`)
    try:
        state = resplit.rebuilt_state(
            policy.config,
            old=was,
            states={k: v["optimizer.policy"] for k, v in shards.items()},
            now_tp=split.tp,
            t=t,
            stage=policy.stage,
            current=opt.state_dict(),
            index_names=index_names,
            dtype=dtype,
        )
    except resplit.ShardMisfit as e:  # one old shard's: its file named
        raise shardcheck.damaged(ckpt, files[resplit.writer(*e.at, was)], str(e)) from e
    except ValueError as e:
        raise CheckpointError(f"{refused}: {e}") from e
    policy.load_hf(tensors, rank=t, checked=shapes)  # (once every shard read passed: nothing written to it before)
    opt.load_state_dict(state)
    first = min(shards, key=lambda k: (k[1], k[0] != t % was.tp))
    set_rng_state(shards[first]["rng"])  # nothing on the trainer draws from it (the module's docstring)
    log.info(
        "checkpoint %s was written at %s and is resumed at %s: rank %d rebuilt its optimizer state from ranks %s' "
        "shards (sha256 %s)",
        ckpt.name,
        was.short(),
        split.short(),
        rank,
        ",".join(map(str, reads)),
        optimizer_digest(optimizers),
    )
    return dict(manifest["counters"]), str(manifest["digest"])


def _load_refsdp(
    ckpt: Path,
    manifest: dict[str, Any],
    *,
    model: TinyGPT | TrainerBackend,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module],
    split: ParallelConfig,
    reads: list[int],
) -> tuple[dict[str, Any], str]:
    """`load_trainer` of a torch trainer's part where FSDP2 shards the state at the checkpoint's split or at `split`
    and the two differ (`refsdp.applies`): the policy, then this rank's part of every optimizer's state and of every
    module rebuilt from the old shards `reads` (`rlctl.checkpoint.refsdp`), the RNG of this rank's old shard (else the
    first's). A sharded policy's fp32 weights (`module.policy`) are the old shards' where they hold them, into a
    policy sharded or not; an unsharded one's are its HF directory's (fp32: `HostPolicy`). CheckpointError for a
    module the shards lack (but an unsharded part's policy) or hold other tensors of, or other optimizer state. The old
    shards but `reads` (those this rank verified) are not opened: FSDP2's rule stands in for them (`refsdp.stand_in`),
    and a verified shard not cut by it, lacking a tensor of this trainer's state or a parameter's state the others
    hold, or not what its rank wrote, is refused naming its file (`refsdp.check_rows`, `rlctl.checkpoint.shardcheck`),
    as a damaged shard, not a split this trainer cannot load."""
    was = written_split(manifest)
    refused = f"{ckpt}: {written_at(manifest, split)}"
    rank, _ = _rank_world()
    files = {int(s["rank"]): s["file"] for s in manifest["ranks"]}
    recorded = {int(s["rank"]): s["optimizer_sha256"] for s in manifest["ranks"]}
    verified, hashed = {}, set()  # (`hashed`: an old critic's, checked against its digest as written, then upgraded)
    for r in (r for r in files if r in reads):
        shard = shardcheck.read_shard(ckpt, files[r], mmap=True)
        verified[r], upgraded = oldcritic.read_as_now(
            ckpt, files[r], shard, rank=r, optimizers=optimizers, modules=modules, recorded=recorded[r]
        )
        if upgraded:
            hashed.add(r)
    first = verified[reads[0]]
    held = {k.removeprefix("module.") for k in first if k.startswith("module.")}
    into = dict(modules)
    if "policy" in held and "policy" not in into:  # sharded into unsharded: the policy is the backend's whole model
        from rlctl.trainers.native import TorchBackend

        policy = model.model if isinstance(model, TorchBackend) else model
        assert isinstance(policy, TinyGPT), type(model)  # (FSDP2 shards the torch trainer's alone)
        into["policy"] = policy
    for k in sorted(set(into) - held):
        # an unsharded part's policy is its HF directory's, in fp32 (loaded below); a sharded one's shards hold it
        # (FSDP2's fp32 part, versus the HF directory's read in its place where the shards a rank read lacked it),
        # or LoRA's adapters in its place
        if k != "policy" or (was.fsdp and "lora" not in held):
            raise shardcheck.damaged(ckpt, files[reads[0]], f"it holds no module.{k}")
        into.pop(k)
    whole = refsdp.whole_shapes(optimizers, into)
    for r, shard in verified.items():  # (FSDP2 cut the old shards by `refsdp.rows`: the stand-ins are made by it)
        try:  # (an unsharded source: its one shard holds the whole of each)
            shardcheck.check_held(shard, rank=r, optimizers=optimizers)
            shardcheck.check_optimizers(shard, optimizers=optimizers)
            shardcheck.check_module_dtypes(shard, modules=into)
            refsdp.check_rows(shard, whole=whole, world=was.dp if was.fsdp else 1, rank=r if was.fsdp else 0)
        except ValueError as e:
            raise shardcheck.damaged(ckpt, files[r], str(e)) from e
    shardcheck.check_stepped(ckpt, {files[r]: s for r, s in verified.items()}, optimizers=optimizers)
    for r, shard in verified.items():  # (its values: after what says more of a damaged shard)
        if r in hashed:
            continue
        try:
            shardcheck.check_digest(shard, optimizers=optimizers, recorded=recorded[r])
        except ValueError as e:
            raise shardcheck.damaged(ckpt, files[r], str(e)) from e
    shards = [  # (rank order: the manifest's)
        verified[r] if r in verified else refsdp.stand_in(first, whole=whole, world=was.dp, rank=r) for r in files
    ]
    try:
        for k, m in into.items():
            refsdp.check_module(m, [s[f"module.{k}"] for s in shards])
        states = {
            k: refsdp.rebuilt_optimizer(
                [s[f"optimizer.{k}"] for s in shards],
                params=[p for g in o.param_groups for p in g["params"]],
                current=o.state_dict(),
            )
            for k, o in optimizers.items()
        }
    except ValueError as e:
        raise CheckpointError(f"{refused}: {e}") from e
    _load_policy(ckpt / MODEL, model)
    for k, m in into.items():
        refsdp.load_module(m, [s[f"module.{k}"] for s in shards])
    for k, o in optimizers.items():
        o.load_state_dict(states[k])
        redistribute_optimizer(o, [p for g in o.param_groups for p in g["params"]])  # sharded: DTensors again
    set_rng_state(verified[rank]["rng"] if rank in verified else first["rng"])  # (nothing draws from it)
    log.info(
        "checkpoint %s was written at %s and is resumed at %s: rank %d rebuilt its state from ranks %s' shards "
        "(optimizer sha256 %s)",
        ckpt.name,
        was.short(),
        split.short(),
        rank,
        ",".join(map(str, reads)),
        optimizer_digest(optimizers),
    )
    return dict(manifest["counters"]), str(manifest["digest"])
