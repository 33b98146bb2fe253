"""`resplit.rebuilt_state` without megatron: old shards cut from known whole AdamW moments by the rule that splits
the weights (`names.to_megatron`), saved and loaded mapped as a checkpoint's are, rebuilt at another tp × pp. Each
rank's state is the whole moments' cut for its new shard bit for bit, and the rebuild holds one parameter's whole
tensors at a time, not an old stage's (CPU allocations counted by torch's profiler)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rlctl.checkpoint import resplit
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.hf import TinyGPTConfig
from rlctl.models.hfnames import expected_shapes
from rlctl.trainers.megatron import names
from rlctl.trainers.megatron.names import Stage

# 8 layers: a stage's moments are many times its largest tensor (the embedding, 256 × 64)
CONFIG = TinyGPTConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
    tie_word_embeddings=True,
)


def whole_moments(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {m: {k: torch.randn(s, generator=g) for k, s in expected_shapes(CONFIG).items()} for m in resplit.MOMENTS}


def layer_suffixes() -> list[str]:
    meta = {k: torch.empty(s, device="meta") for k, s in expected_shapes(CONFIG).items()}
    return resplit.layer_suffixes(list(names.to_megatron(meta, CONFIG, stage=Stage(0, CONFIG.num_hidden_layers))))


def optimizer_state(mg: dict[str, dict[str, torch.Tensor]], order: list[str]) -> dict[str, Any]:
    state = {i: {"step": torch.tensor(2.0), **{m: mg[m][n] for m in resplit.MOMENTS}} for i, n in enumerate(order)}
    return {"state": state, "param_groups": [{"lr": 1e-3, "params": list(range(len(order)))}]}


def old_shards(tmp_path: Path, whole: dict[str, dict[str, torch.Tensor]], old: ParallelConfig) -> dict:
    """{(t0, s0): optimizer state dict} of every old position, saved and loaded mapped."""
    out = {}
    for s0 in range(old.pp):
        stage = Stage(s0, old.pp)
        order = resplit.param_order(CONFIG, stage, layer_suffixes())
        for t0 in range(old.tp):
            cut = {m: names.to_megatron(whole[m], CONFIG, tp=old.tp, rank=t0, stage=stage) for m in resplit.MOMENTS}
            mg = {m: {n: v.clone() for n, v in cut[m].items()} for m in resplit.MOMENTS}  # own storage, as a rank's
            torch.save(optimizer_state(mg, order), tmp_path / f"{t0}-{s0}.pt")
            out[(t0, s0)] = torch.load(tmp_path / f"{t0}-{s0}.pt", weights_only=True, mmap=True)
    return out


def rebuild(shards: dict, old: ParallelConfig, *, tp: int, t: int, stage: Stage) -> tuple[dict[str, Any], list[str]]:
    order = resplit.param_order(CONFIG, stage, layer_suffixes())
    current = {"state": {}, "param_groups": [{"lr": 1e-4, "params": list(range(len(order)))}]}
    reads = {k: v for k, v in shards.items() if k[1] in resplit.stages_read(CONFIG, stage, old.pp)}
    state = resplit.rebuilt_state(
        CONFIG,
        old=old,
        states=reads,
        now_tp=tp,
        t=t,
        stage=stage,
        current=current,
        index_names=dict(enumerate(order)),
        dtype=torch.float32,
    )
    return state, order


def split(tp: int, pp: int) -> ParallelConfig:
    return ParallelConfig(role="trainer", tp=tp, pp=pp, dp=1)


@pytest.mark.parametrize(
    "was,now",
    [((2, 1), (1, 1)), ((1, 2), (2, 1)), ((2, 2), (1, 1)), ((1, 1), (2, 2)), ((2, 4), (1, 2))],
    ids=["tp2-to-tp1", "pp2-to-tp2", "tp2-pp2-to-tp1", "tp1-to-tp2-pp2", "tp2-pp4-to-pp2"],
)
def test_each_rank_rebuilds_its_cut_of_the_whole_moments_bit_for_bit(
    tmp_path: Path, was: tuple[int, int], now: tuple[int, int]
) -> None:
    whole = whole_moments(seed=1)
    old = split(*was)
    shards = old_shards(tmp_path, whole, old)
    for p in range(now[1]):
        for t in range(now[0]):
            stage = Stage(p, now[1])
            state, order = rebuild(shards, old, tp=now[0], t=t, stage=stage)
            assert state["param_groups"] == [{"lr": 1e-3, "params": list(range(len(order)))}]
            for m in resplit.MOMENTS:
                want = names.to_megatron(whole[m], CONFIG, tp=now[0], rank=t, stage=stage)
                for i, n in enumerate(order):
                    assert torch.equal(state["state"][i][m], want[n]), (t, p, m, n)
                    assert float(state["state"][i]["step"]) == 2.0


def peak_and_held_bytes(run: Any) -> tuple[int, int]:
    """The most bytes of CPU tensors `run()` had allocated at once, and those it still held at its end."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    peak = held = 0
    for _, n in events:
        held += n
        peak = max(peak, held)
    return peak, held


def test_the_rebuild_holds_one_parameters_whole_tensors_at_a_time_not_an_old_stages(tmp_path: Path) -> None:
    old = split(2, 1)  # one old stage: the whole model's moments, read by the one new rank
    shards = old_shards(tmp_path, whole_moments(seed=2), old)
    kept: list[dict[str, Any]] = []
    peak, held = peak_and_held_bytes(lambda: kept.append(rebuild(shards, old, tp=1, t=0, stage=Stage())[0]))
    moments = sum(st[m].nbytes for st in kept[0]["state"].values() for m in resplit.MOMENTS)
    largest = max(torch.Size(s).numel() for s in expected_shapes(CONFIG).values()) * 4  # one moment, fp32
    # what it holds at the end is the rebuilt state (and the step counts): the profiler saw it allocated and saw the
    # rest freed, versus a profiler that records no frees (held = peak: the bound below then passes whatever it held)
    assert moments <= held <= moments + largest, (held, moments)
    stage = sum(torch.Size(s).numel() for s in expected_shapes(CONFIG).values()) * 4 * 2
    assert stage > 10 * largest  # what gathering the stage whole would hold beside the state
    assert peak - held <= 4 * largest, (peak - held, largest)


def test_a_checkpoint_whose_optimizer_never_stepped_rebuilds_an_empty_state(tmp_path: Path) -> None:
    """Every step before the checkpoint skipped as non-finite (`trainer.skip_nonfinite`): AdamW holds no parameter's
    state yet, and the rebuild at another split is that empty state with the old groups, as a resume at the same
    split loads it; versus a KeyError's traceback on every rank (the first index looked up in an empty state)."""
    old = split(2, 1)
    order = resplit.param_order(CONFIG, Stage(), layer_suffixes())
    groups = [{"lr": 1e-3, "params": list(range(len(order)))}]
    for t0 in range(old.tp):
        torch.save({"state": {}, "param_groups": groups}, tmp_path / f"{t0}.pt")
    shards = {(t0, 0): torch.load(tmp_path / f"{t0}.pt", weights_only=True, mmap=True) for t0 in range(old.tp)}
    current = {"state": {}, "param_groups": [{"lr": 1e-4, "params": list(range(len(order)))}]}
    state = resplit.rebuilt_state(
        CONFIG,
        old=old,
        states=shards,
        now_tp=1,
        t=0,
        stage=Stage(),
        current=current,
        index_names=dict(enumerate(order)),
        dtype=torch.float32,
    )
    assert state == {"state": {}, "param_groups": groups}
    shape = resplit.shard_shapes(CONFIG, tp=2, t=1, stage=Stage())[order[0]]
    moments = {m: torch.zeros(shape) for m in resplit.MOMENTS}
    stepped = {"state": {0: {"step": torch.tensor(1.0), **moments}}, "param_groups": groups}
    mixed = {(0, 0): shards[(0, 0)], (1, 0): stepped}
    with pytest.raises(ValueError, match="has no optimizer state"):  # one shard stepped, the other not: not rebuilt
        resplit.shard_moments(CONFIG, old, mixed, layer_suffixes(), dtype=torch.float32)


NORM = "decoder.layers.0.input_layernorm.weight"  # (stage 1's first parameter)
EMBEDDING = "embedding.word_embeddings.weight"  # (stage 0's first parameter: the first step count read)


def _steps(sd: dict[str, Any], step: float, *, only: int | None = None) -> None:
    for i, st in sd["state"].items():
        if only is None or i == only:
            st["step"] = torch.tensor(step)


# what is done to the shard at `at`, and the line said of it
DAMAGES = {
    "shape": (
        lambda sd: sd["state"][0].update(exp_avg=sd["state"][0]["exp_avg"][1:]),
        rf"^{NORM}'s exp_avg is \(63,\); its rank's part of {NORM} at tp 2 pp 2 is \(64,\)$",
        (1, 1),
    ),
    "lacking": (lambda sd: sd["state"][3].pop("exp_avg_sq"), r"^its optimizer state of \S+ lacks exp_avg_sq$", (1, 1)),
    "groups": (
        lambda sd: sd["param_groups"][0]["params"].pop(),
        r"^its optimizer holds \[\d+\] parameters per group",
        (1, 1),
    ),
    # a moment not in the parameters' dtype: AdamW's load casts it to theirs unsaid (a bf16 copy resumed as fp32)
    "dtype": (
        lambda sd: sd["state"][0].update(exp_avg_sq=sd["state"][0]["exp_avg_sq"].to(torch.bfloat16)),
        rf"^{NORM}'s exp_avg_sq is torch.bfloat16; its parameter's is torch.float32$",
        (0, 1),
    ),
    # every parameter steps together: a shard whose count is not the others', a parameter's not its shard's
    "steps": (
        lambda sd: _steps(sd, 3.0),
        r"^its parameters took 3 steps, rank 0's shard's 2 \(every parameter steps together\)$",
        (1, 1),
    ),
    # the first shard read the odd one: it is named, beside a shard of the count the others share (versus every
    # other shard measured by it: rank 1's, the second read, named)
    "first-shard's-steps": (
        lambda sd: _steps(sd, 3.0),
        r"^its parameters took 3 steps, rank 1's shard's 2 \(every parameter steps together\)$",
        (0, 0),
    ),
    "a-parameter's-steps": (
        lambda sd: _steps(sd, 5.0, only=2),
        rf"^its optimizer state of \S+ took 5 steps, of {EMBEDDING} 2 \(every parameter steps together\)$",
        (0, 0),
    ),
    "unstepped": (
        lambda sd: sd["state"].pop(4),
        r"^\S+ has no optimizer state, and the other parameters took 2 steps$",
        (1, 0),
    ),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_shard_not_holding_its_ranks_part_is_said_with_its_position(tmp_path: Path, case: str) -> None:
    """What one old shard holds otherwise than its rank's part of the model is a ShardMisfit carrying that shard's
    (tp, pp) position, by which `load_trainer` names its file (tests/unit/trainers/test_megatron_resplit.py), versus
    a ValueError naming no shard (a step count the shards do not share, a parameter without state) or, for a moment
    of another dtype, nothing said (cast as the optimizer loaded it)."""
    old = split(2, 2)
    shards = {k: copy.deepcopy(dict(v)) for k, v in old_shards(tmp_path, whole_moments(seed=3), old).items()}
    damage, said, at = DAMAGES[case]
    damage(shards[at])
    with pytest.raises(resplit.ShardMisfit, match=said) as e:
        resplit.shard_moments(CONFIG, old, shards, layer_suffixes(), dtype=torch.float32)
    assert e.value.at == at
