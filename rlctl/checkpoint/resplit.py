"""A trainer checkpoint resumed at another split (tp × pp × dp) than it was written at: which shards a rank reads,
and its AdamW state rebuilt for its new shard from them.

Same tp × pp, another dp: the rank at position (t, p) restores the shard replica 0's rank at (t, p) wrote, as at
the same split (the replicas hold the same state); the position's writer is another global rank
(`ParallelConfig.first_replica_ranks`). A `torch` trainer that is not sharded is always there (tp = pp = 1).

Another tp or pp (`megatron`): a moment of AdamW (exp_avg, exp_avg_sq) has its parameter's shape and layout, so
the rule that splits the weights splits it (`rlctl.trainers.megatron.names`):

    for each new parameter P of this rank, for each moment:
      HF tensors P is made of (q, k, v of a fused qkv; gate, up of fc1; else one), each:
        old shard (t0, stage_of) ──to_hf(only it)──▶ its part ──gather_hf over t0──▶ whole
      ──to_megatron(t, stage, only P)──▶ this rank's part of P (a copy); the whole ones freed before the next

A rank reads the shards of the old stages its layers overlap (and the embedding's and the final norm's), every
old tp rank of them, mapped (`mmap`): a tensor is read from disk as it is used. It holds one parameter's whole
HF tensors of one moment at a time beside the state it has rebuilt (its own shard's moments), not a stage's
(70B at pp 1: ~560 GB a rank, every rank of a node at once). The step count is one
value (every parameter steps together) and is carried; the hyper-parameters are the old shard's. A shard
holds its optimizer's state by index: the old rank's megatron names in GPTModel's order (`param_order`), grouped
as `rlctl.rl.schedule.policy_optimizer` groups them, name the indices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.hf import TinyGPTConfig
from rlctl.models.hfnames import expected_shapes
from rlctl.trainers.megatron import names
from rlctl.trainers.megatron.names import Stage

MOMENTS = ("exp_avg", "exp_avg_sq")


class ShardMisfit(ValueError):
    """What one old shard holds otherwise than its rank's part of this model (`shard_moments`): `at`, its position
    (t0, s0), by which the loader names its file (`rlctl.checkpoint.shardcheck.damaged`)."""

    def __init__(self, at: tuple[int, int], what: str) -> None:
        super().__init__(what)
        self.at = at


def position(shard_of: int, split: ParallelConfig) -> tuple[int, int]:
    """The (tp rank, pp stage) of replica 0's global rank `shard_of` at `split` (megatron's order: tp fastest,
    then dp, then pp)."""
    return shard_of % split.tp, shard_of // (split.tp * split.dp)


def writer(t: int, p: int, split: ParallelConfig) -> int:
    """The global rank of replica 0 at position (t, p) of `split`: the rank that wrote its shard."""
    return t + split.tp * split.dp * p


def stages_read(c: TinyGPTConfig, stage: Stage, old_pp: int) -> list[int]:
    """The stages of a `old_pp`-stage split whose shards a rank at `stage` reads: those holding its layers, the
    first (the embedding; at the last stage, tied, its copy), the last (the final norm, lm_head)."""
    per = c.num_hidden_layers // old_pp
    out = {n // per for n in stage.layers(c)}
    if stage.first or (stage.last and c.tie_word_embeddings):
        out.add(0)
    if stage.last:
        out.add(old_pp - 1)
    return sorted(out)


def param_order(c: TinyGPTConfig, stage: Stage, layer: list[str]) -> list[str]:
    """The megatron names of a GPTModel stage's parameters in their order (`named_parameters`): the embedding, each
    layer's (`layer`: the suffixes of one, in order), the final norm, the output layer (tied: the last stage's
    copy at pp > 1)."""
    out = ["embedding.word_embeddings.weight"] if stage.first else []
    for i in range(len(stage.layers(c))):
        out += [f"decoder.layers.{i}.{s}" for s in layer]
    if stage.last:
        out.append("decoder.final_layernorm.weight")
        if not c.tie_word_embeddings or not stage.first:
            out.append("output_layer.weight")
    return out


def layer_suffixes(mg_names: list[str]) -> list[str]:
    """The suffixes of layer 0's parameters (every stage holds a layer 0), in order."""
    head = "decoder.layers.0."
    return [n.removeprefix(head) for n in mg_names if n.startswith(head)]


def shard_shapes(c: TinyGPTConfig, *, tp: int, t: int, stage: Stage) -> dict[str, tuple[int, ...]]:
    """The shape of each megatron parameter of tp rank `t` at `stage` of a `tp` split (the split of meta tensors)."""
    meta = {k: torch.empty(shape, device="meta") for k, shape in expected_shapes(c).items()}
    return {k: tuple(v.shape) for k, v in names.to_megatron(meta, c, tp=tp, rank=t, stage=stage).items()}


def indexed_names(
    order: list[str], shapes: Mapping[str, tuple[int, ...]], groups: list[dict[str, Any]]
) -> dict[int, str]:
    """The name of each index of an optimizer state dict whose `groups` hold the parameters `order` names:
    one group in model order, or two as `policy_optimizer` splits them (matrices and embeddings, then the rest).
    ValueError when the groups do not hold as many parameters."""
    split = (
        [order]
        if len(groups) == 1
        else [[n for n in order if len(shapes[n]) >= 2], [n for n in order if len(shapes[n]) < 2]]
    )
    if len(split) != len(groups) or [len(g) for g in split] != [len(g["params"]) for g in groups]:
        raise ValueError(
            f"its optimizer holds {[len(g['params']) for g in groups]} parameters per group, this model's shard "
            f"{[len(g) for g in split]}"
        )
    return {i: n for g, ns in zip(groups, split, strict=True) for i, n in zip(g["params"], ns, strict=True)}


def shard_moments(
    c: TinyGPTConfig,
    old: ParallelConfig,
    states: Mapping[tuple[int, int], dict[str, Any]],
    layer: list[str],
    *,
    dtype: torch.dtype,
) -> tuple[dict[tuple[int, int], dict[str, dict[str, torch.Tensor]]], torch.Tensor | None]:
    """Each old shard's moments by megatron name ({(t0, s0): {"exp_avg": {name: tensor}, …}}) of `states` (the
    optimizer state dict of old position (t0, s0), every t0 of each stage), as loaded (mapped: nothing read but
    the step counts), and the step count: None where no parameter has a state yet (every step before the checkpoint
    skipped as non-finite: `rl.schedule.finite_step`). ShardMisfit, naming the parameter, when a shard does not hold
    its rank's part of this model's parameters (another model, another optimizer, a moment of another shape, or not
    in `dtype`, this trainer's parameters' as AdamW keeps its moments: checked by the shapes and dtypes alone), or
    its parameters' step count is not the others' (every parameter steps together: a parameter without state beside
    stepped ones, a count another shard's parameters do not share)."""
    out: dict[tuple[int, int], dict[str, dict[str, torch.Tensor]]] = {}
    steps: list[torch.Tensor] = []
    counts: dict[tuple[int, int], tuple[float, str]] = {}  # each shard's step count, by its first parameter's
    unstepped: list[tuple[str, tuple[int, int]]] = []
    for (t0, s0), sd in sorted(states.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        stage = Stage(s0, old.pp)
        shapes = shard_shapes(c, tp=old.tp, t=t0, stage=stage)
        order = param_order(c, stage, layer)
        if sorted(order) != sorted(shapes):
            raise ValueError(f"this model's names and megatron's order disagree: {sorted(set(order) ^ set(shapes))}")
        try:
            named = indexed_names(order, shapes, sd["param_groups"])
        except ValueError as e:
            raise ShardMisfit((t0, s0), str(e)) from e
        by_moment: dict[str, dict[str, torch.Tensor]] = {m: {} for m in MOMENTS}
        for i, name in named.items():
            st = sd["state"].get(i)
            if st is None:  # (a torch optimizer has a parameter's state once it stepped it)
                unstepped.append((name, (t0, s0)))
                continue
            if lacking := [m for m in ("step", *MOMENTS) if m not in st]:
                raise ShardMisfit((t0, s0), f"its optimizer state of {name} lacks {lacking[0]}")
            for m in MOMENTS:
                if (got_dtype := _dtype(st[m])) != dtype:
                    raise ShardMisfit((t0, s0), f"{name}'s {m} is {got_dtype}; its parameter's is {dtype}")
                if (got := tuple(st[m].shape)) != (want := shapes[name]):
                    raise ShardMisfit(
                        (t0, s0),
                        f"{name}'s {m} is {got}; its rank's part of {name} at tp {old.tp} pp {old.pp} is {want}",
                    )
                by_moment[m][name] = st[m]
            step = torch.as_tensor(st["step"])
            if (t0, s0) not in counts:
                counts[(t0, s0)] = (float(step), name)
            elif float(step) != (mine := counts[(t0, s0)])[0]:
                raise ShardMisfit((t0, s0), _other_step(name, float(step), (*mine, (t0, s0)), at=(t0, s0), old=old))
            steps.append(step)
        out[(t0, s0)] = by_moment
    # a shard whose count is not the others': the one apart from the count most shards share (a tie: the first
    # read's), versus every shard read after the first measured by it (rank 0's the odd one: rank 1's file named)
    most = Counter(count for count, _ in counts.values()).most_common(1)
    if odd := [at for at, (count, _) in counts.items() if count != most[0][0]]:
        base = next(at for at, (count, _) in counts.items() if count == most[0][0])
        count, name = counts[odd[0]]
        raise ShardMisfit(odd[0], _other_step(name, count, (*counts[base], base), at=odd[0], old=old))
    if most and unstepped:
        name, at = unstepped[0]
        raise ShardMisfit(at, f"{name} has no optimizer state, and the other parameters took {most[0][0]:g} steps")
    return out, steps[0] if steps else None


def _dtype(moment: Any) -> torch.dtype | str:
    """A moment's dtype; the type's name of one that is no tensor (a shard written by hand)."""
    return moment.dtype if isinstance(moment, torch.Tensor) else type(moment).__name__


def _other_step(
    name: str, step: float, first: tuple[float, str, tuple[int, int]], *, at: tuple[int, int], old: ParallelConfig
) -> str:
    """What a shard's step count of `name` is said as beside another (`first`: the count, its parameter and the
    position of its shard: its shard's first, or the count most shards share): within one shard, by that parameter;
    else by the rank that wrote that shard."""
    count, other, where = first
    if where == at:
        return (
            f"its optimizer state of {name} took {step:g} steps, of {other} {count:g} (every parameter steps together)"
        )
    return (
        f"its parameters took {step:g} steps, rank {writer(*where, old)}'s shard's {count:g} (every parameter steps "
        "together)"
    )


class WholeMoment(Mapping[str, torch.Tensor]):
    """One moment's whole HF tensors, each gathered from the old shards when it is read and not kept: the tp parts
    of its stage's shards (`to_hf` of that name alone), joined (`gather_hf`)."""

    def __init__(
        self,
        c: TinyGPTConfig,
        old: ParallelConfig,
        shards: Mapping[tuple[int, int], dict[str, dict[str, torch.Tensor]]],
        moment: str,
    ) -> None:
        self.c, self.old, self.shards, self.moment = c, old, shards, moment

    def __getitem__(self, name: str) -> torch.Tensor:
        s0 = names.stage_of(name, self.c, self.old.pp)
        stage = Stage(s0, self.old.pp)
        parts = [
            names.to_hf(self.shards[(t0, s0)][self.moment], self.c, tp=self.old.tp, stage=stage, only={name})
            for t0 in range(self.old.tp)
        ]
        return names.gather_hf(parts)[name]

    def __iter__(self) -> Iterator[str]:
        return iter(expected_shapes(self.c))

    def __len__(self) -> int:
        return len(expected_shapes(self.c))


def rebuilt_state(
    c: TinyGPTConfig,
    *,
    old: ParallelConfig,
    states: Mapping[tuple[int, int], dict[str, Any]],
    now_tp: int,
    t: int,
    stage: Stage,
    current: dict[str, Any],
    index_names: Mapping[int, str],
    dtype: torch.dtype,
) -> dict[str, Any]:
    """The optimizer state dict of tp rank `t` at `stage` of a `now_tp` split, rebuilt from the old shards `states`
    one parameter and moment at a time (`WholeMoment`): `current` is this rank's optimizer's state dict (its
    groups' indices), `index_names` the megatron name of each of its indices, `dtype` its parameters' (megatron's
    fp32 master weights: every moment of the old shards in it, `shard_moments`). The hyper-parameters of each group
    are the old shards'."""
    mg_names = list(index_names.values())
    shards, step = shard_moments(c, old, states, layer_suffixes(mg_names), dtype=dtype)
    old_groups = next(iter(states.values()))["param_groups"]
    if len(old_groups) != len(current["param_groups"]):
        raise ValueError(
            f"its optimizer has {len(old_groups)} parameter groups, this trainer's {len(current['param_groups'])}"
        )
    groups = [g | {"params": list(now["params"])} for g, now in zip(old_groups, current["param_groups"], strict=True)]
    state: dict[int, dict[str, torch.Tensor]] = {}
    if step is None:  # no step taken before the checkpoint: nothing to rebuild, as an optimizer not yet stepped
        return {"state": state, "param_groups": groups}
    whole = {m: WholeMoment(c, old, shards, m) for m in MOMENTS}
    for i, name in index_names.items():
        state[i] = {"step": step.clone()}
        for m in MOMENTS:  # the whole tensors this part is cut from go as the call returns
            part = names.to_megatron(whole[m], c, tp=now_tp, rank=t, stage=stage, only={name})[name]
            state[i][m] = part.clone()
    return {"state": state, "param_groups": groups}
