"""A torch trainer's checkpoint resumed at another dp where FSDP2 shards its state on either side
(`rlctl.checkpoint.refsdp`), over gloo CPU ranks (tests/unit/trainers/fsdp_rank.py): sharded at dp 2 into dp 3
(uneven rows, a rank with none of LoRA's A) and into one unsharded rank, and unsharded into dp 2. After the load every
rank's state, gathered, is the saved state bit for bit (AdamW's moments and steps by index, the fp32 policy, the
adapters), and the next step equals the run that went on without the restart (within fp32 reduction order). FSDP2's
layout is `refsdp.rows`: each rank's parts of every parameter, joined in rank order, are the whole of it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.checkpoint import refsdp
from tests.unit.trainers.test_fsdp import CFG, iterations, run


def test_rows_cut_as_torch_chunk_with_the_ranks_past_the_rows_empty() -> None:
    for n in (0, 1, 4, 7, 8, 67):
        for world in (1, 2, 3, 5, 8):
            got = [refsdp.rows(n, world=world, rank=r) for r in range(world)]
            sizes = [len(c) for c in torch.arange(n).chunk(world)] if n else []
            assert [s.stop - s.start for s in got] == sizes + [0] * (world - len(sizes))
            assert [i for s in got for i in range(n)[s]] == list(range(n))


def test_a_sharded_rank_reads_the_old_shards_its_rows_overlap_of_any_size() -> None:
    """dp 8 → 4: a rank reads two old shards where every size divides, a third where one does not (67 rows: 9 an old
    rank, 17 a new one; new rank 1's rows 17..33 are old ranks 1 to 3's); an unsharded side reads every shard
    written."""
    from rlctl.launch.agentenv import ParallelConfig

    old, new = ParallelConfig("trainer", dp=8, fsdp=True), ParallelConfig("trainer", dp=4, fsdp=True)
    written = list(range(8))
    assert [refsdp.shards_read(old, new, rank=r, sizes=[32, 64], written=written) for r in range(4)] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]
    assert refsdp.shards_read(old, new, rank=1, sizes=[32, 67], written=written) == [1, 2, 3]
    assert refsdp.shards_read(old, new, rank=0, sizes=[32, 67], written=written) == [0, 1]
    assert refsdp.shards_read(new, old, rank=7, sizes=[4, 3], written=[0, 1, 2, 3]) == [0]  # no rows: the first
    unsharded = ParallelConfig("trainer", dp=4)
    assert refsdp.shards_read(old, unsharded, rank=3, sizes=[32], written=written) == written
    assert refsdp.shards_read(unsharded, new, rank=3, sizes=[32], written=[0]) == [0]


def test_shards_of_another_model_are_refused_in_one_line_before_anything_is_copied() -> None:
    """`load_module` of parts that do not join into the module's tensors (another model's checkpoint): ValueError
    naming the tensor and both shapes, the module as it was; parts that join (2 + 2 rows) or are each whole load."""
    from torch import nn

    m = nn.Linear(3, 4)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    w, b = torch.randn(4, 3), torch.randn(4)
    bad = [{"weight": w[:2], "bias": b}, {"weight": w[1:], "bias": b}]
    with pytest.raises(ValueError, match=r"^weight is \(2, 3\) \+ \(3, 3\) in its shards, this model's \(4, 3\)$"):
        refsdp.load_module(m, bad)
    assert all(torch.equal(m.state_dict()[k], v) for k, v in before.items())
    with pytest.raises(ValueError, match=r"^its shards hold other tensors \(missing \['bias'\], unexpected \[\]\)$"):
        refsdp.load_module(m, [{"weight": w}])
    refsdp.load_module(m, [{"weight": w[:2], "bias": b}, {"weight": w[2:], "bias": b}])
    assert torch.equal(m.weight, w) and torch.equal(m.bias, b)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Qwen3 (per-head q/k norms of 8 rows; a 67-row vocabulary, tied): sizes dp 2 and 3 do not divide."""
    import dataclasses

    from rlctl.models.tinygpt import TinyGPT

    d = tmp_path_factory.mktemp("refsdp")
    torch.manual_seed(0)
    TinyGPT(dataclasses.replace(CFG, architecture="Qwen3ForCausalLM")).save_pretrained(d / "model")
    torch.save(iterations(), d / "samples.pt")
    return d / "model", d / "samples.pt"


def assert_same_state(saved: dict[str, Any], loaded: dict[str, Any]) -> None:
    """The gathered state after the load is the one gathered after the save, bit for bit: every optimizer's moments
    and steps by index, the policy's weights, and every module both hold (a sharded policy's is its weights)."""
    assert saved["optimizer.policy"].keys() == loaded["optimizer.policy"].keys() != set()
    for i, st in saved["optimizer.policy"].items():
        assert st.keys() == loaded["optimizer.policy"][i].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(loaded["optimizer.policy"][i][m], v) for m, v in st.items()), i
    for key in ["policy", *(k for k in saved if k.startswith("module.") and k in loaded)]:
        assert saved[key].keys() == loaded[key].keys()
        assert all(torch.equal(loaded[key][n], v) for n, v in saved[key].items()), key


def assert_fsdp_layout(state: dict[str, Any]) -> set[int]:
    """Every rank's part of each parameter (`to_local`) is its `refsdp.rows` of the whole, in rank order; the rows
    of the last rank's parts where it held fewer than the first rank (none: 0)."""
    parts, world = state["parts"], len(state["parts"])
    uneven = set()
    for name, full in state["policy"].items():
        if name == "lm_head.weight":  # (tied: the embedding's parameter, named once)
            continue
        n = full.shape[0]
        sizes = [parts[r][name].shape[0] for r in range(world)]
        assert sizes == [len(range(n)[refsdp.rows(n, world=world, rank=r)]) for r in range(world)], name
        assert torch.equal(torch.cat([parts[r][name] for r in range(world)]), full), name
        uneven |= {sizes[-1]} if sizes[-1] < sizes[0] else set()
    return uneven


def assert_next_step(ran: dict[str, Any], resumed: dict[str, Any]) -> None:
    """The step after the resume equals the third step of the run that went on (within 1e-3 of each tensor's change
    in it: the sum over the ranks' rows is another order), and so does its gradient norm."""
    for name, w in ran["weights"][2].items():
        step = (w - ran["weights"][1][name]).abs().max()
        torch.testing.assert_close(resumed["weights"][0][name], w, atol=1e-6 + 1e-3 * float(step), rtol=1e-4)
    assert resumed["grad_norms"][0] == pytest.approx(ran["grad_norms"][2], rel=1e-4)


@pytest.mark.parametrize(
    ("was", "now", "lora"), [(2, 3, None), (2, 1, None), (1, 2, None), (2, 3, "4,8"), (2, 1, "4,8")]
)
def test_a_checkpoint_resumes_at_another_dp_sharded_or_not(
    tmp_path: Path, inputs: tuple[Path, Path], was: int, now: int, lora: str | None
) -> None:
    """`was`/`now`: the trainer's ranks, FSDP2 over them where more than one; `lora`: adapters on every projection,
    which the shards hold (`module.lora`: a rank's part of them, sharded) in place of the policy's weights."""
    model, samples = inputs
    job = tmp_path / "job"
    ran = run(tmp_path, world=was, phase="run", job=job, model=model, samples=samples, lora=lora)
    resumed = run(tmp_path, world=now, phase="resume", job=job, model=model, samples=samples, lora=lora)
    held = {k for k in torch.load(job / "iter-2" / "ranks" / "rank-0.pt", weights_only=True) if k.startswith("mod")}
    assert held == ({"module.lora"} if lora else {"module.policy"} if was > 1 else set())
    assert_same_state(ran["state"], resumed["state"])
    if now == 3:  # the vocabulary's 67 rows: 23, 23, 21; LoRA's A of 4 rows: 2, 2, 0 (the last rank none)
        assert assert_fsdp_layout(resumed["state"]) >= ({0, 21} if lora else {21})
    assert_next_step(ran, resumed)
    hashed = [shards_hashed(tmp_path / f"out-{now}-resume.pt.hashed-{r}") for r in range(now)]
    if (was, now) in {(2, 3)}:  # rank 0 answers for the whole part; rank 2's rows of every tensor are old rank 1's
        assert hashed == [{0, 1}, {0, 1}, {1}]
    else:  # an unsharded side: every old shard (one where the source was unsharded)
        assert hashed == [set(range(max(1, was)))] * now


def shards_hashed(listing: Path) -> set[int]:
    """The old ranks whose shards a rank hashed as it loaded (fsdp_rank.py's OUT.pt.hashed-RANK)."""
    names = listing.read_text().split()
    assert "MANIFEST.trainer.json" in names  # (the listing is of the loading's reads)
    return {int(n.removeprefix("ranks/rank-").removesuffix(".pt")) for n in names if n.startswith("ranks/")}


def test_a_sharded_policy_resumes_unsharded_from_its_fp32_shards_not_the_published_bf16_model(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    """A sharded trainer's checkpoint holds the policy as published (bf16 on a GPU: its HF directory) and its fp32
    master weights in the ranks' shards (`module.policy`). Resumed unsharded, the policy is the fp32 weights, bit for
    bit, versus the HF directory's bf16 weights (the precision the sharded run trained at lost). One gloo rank in
    this process: FSDP2 over it, then an unsharded trainer."""
    import torch.distributed as dist

    from rlctl.checkpoint.trainer import HostPolicy, load_trainer, save_trainer
    from rlctl.launch.agentenv import ParallelConfig
    from rlctl.rl.schedule import policy_optimizer
    from rlctl.trainers.native import TorchBackend

    model, _ = inputs
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        sharded = TorchBackend.load(model, shard=True)
        opt = policy_optimizer(sharded.model, 1e-2)
        sharded.model(torch.randint(0, CFG.vocab_size, (2, 5))).float().logsumexp(-1).sum().backward()
        opt.step()
        fp32 = {k: v.full_tensor() for k, v in sharded.model.state_dict().items()}
        published = {k: v.to(torch.bfloat16) for k, v in fp32.items()}
        assert any(not torch.equal(v.float(), fp32[k]) for k, v in published.items())  # bf16 loses bits
        save_trainer(
            tmp_path / "iter-1",
            model=HostPolicy(published, sharded.model.config),
            optimizers={"policy": opt},
            modules=sharded.checkpoint_modules(),
            counters={"version": 1},
            split=ParallelConfig("trainer", dp=1, fsdp=True),
            data_parallel=sharded.data_parallel(),
        )
        whole = TorchBackend.load(model)
        opt2 = policy_optimizer(whole.model, 1e-2)
        load_trainer(
            tmp_path / "iter-1",
            model=whole,
            optimizers={"policy": opt2},
            modules=whole.checkpoint_modules(),
            split=ParallelConfig("trainer", dp=1),
            data_parallel=whole.data_parallel(),
            version=1,
        )
        got = whole.model.state_dict()
        assert got.keys() == fp32.keys() and all(torch.equal(got[k], v) for k, v in fp32.items())
        pairs = list(zip(opt2.state.values(), opt.state.values(), strict=True))
        assert len(pairs) == len(fp32) - 1  # (lm_head: the tied embedding)
        assert all(torch.equal(a["exp_avg"], b["exp_avg"].full_tensor()) for a, b in pairs)
    finally:
        dist.destroy_process_group()


def test_a_rank_resumes_without_opening_the_old_shards_it_does_not_read(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    """dp 2 → 3: new rank 2's rows of every tensor are old rank 1's, so old rank 0's shard, truncated or missing where
    rank 2 sees the checkpoint, is not opened there (its stand-in is FSDP2's rule): rank 2 resumes, the state the
    saved one bit for bit, versus torch's raw error on opening the file for its shapes (the others see it whole)."""
    import shutil

    model, samples = inputs
    job = tmp_path / "job"
    ran = run(tmp_path, world=2, phase="run", job=job, model=model, samples=samples)
    for broken in ("truncated", "missing"):
        seen, at = tmp_path / f"seen-{broken}", tmp_path / broken
        shutil.copytree(job / "iter-2", seen)
        at.mkdir()
        shard = seen / "ranks" / "rank-0.pt"
        if broken == "truncated":
            shard.write_bytes(shard.read_bytes()[:4096])
        else:
            shard.unlink()
        extra = {"RLCTL_TEST_CKPT_2": str(seen)}
        resumed = run(at, world=3, phase="resume", job=job, model=model, samples=samples, extra=extra)
        assert shards_hashed(at / "out-3-resume.pt.hashed-2") == {1}
        assert_same_state(ran["state"], resumed["state"])
        assert_next_step(ran, resumed)


def test_old_shards_stand_in_by_fsdp2_rows_and_a_verified_shard_cut_otherwise_is_refused() -> None:
    """A stand-in for old rank r of 2 has FSDP2's part of each tensor's whole shape (`rows`), the structure of a
    verified shard, whatever it held; a verified shard whose rows are not FSDP2's (3 + 5 of 8, which join into the 8
    rows: `part` would cut rank 1's rows one off), of another width, or lacking an entry this trainer's state has, is
    refused in one line naming the tensor, versus a KeyError (an entry missing) or a line naming a stand-in's shape
    made of the verified one's (another width)."""
    import copy

    from torch import nn

    lin = nn.Linear(3, 8)
    opt = torch.optim.AdamW(lin.parameters())
    whole = refsdp.whole_shapes({"policy": opt}, {"policy": lin})
    assert whole == {"optimizer.policy": {0: (8, 3), 1: (8,)}, "module.policy": {"weight": (8, 3), "bias": (8,)}}
    state = {
        i: {"step": torch.tensor(1.0), "exp_avg": torch.ones(5, *s), "exp_avg_sq": torch.ones(5, *s)}
        for i, s in [(0, (3,)), (1, ())]
    }
    verified = {
        "optimizer.policy": {"state": state, "param_groups": [{"params": [0, 1]}]},
        "module.policy": {"weight": torch.ones(5, 3), "bias": torch.ones(5)},
        "rng": {},
    }
    with pytest.raises(
        ValueError,
        match=r"^optimizer.policy parameter 0's exp_avg is \(5, 3\); FSDP2 cuts \(4, 3\) of its \(8, 3\) to old rank 1 "
        r"of 2$",
    ):
        refsdp.check_rows(verified, whole=whole, world=2, rank=1)
    got = refsdp.stand_in(verified, whole=whole, world=2, rank=0)
    assert got.keys() == {"optimizer.policy", "module.policy"} and got["optimizer.policy"]["param_groups"] is None
    shapes = {
        i: {m: (tuple(t.shape), t.is_meta) for m, t in st.items()} for i, st in got["optimizer.policy"]["state"].items()
    }
    assert shapes == {
        0: {"step": ((), True), "exp_avg": ((4, 3), True), "exp_avg_sq": ((4, 3), True)},
        1: {"step": ((), True), "exp_avg": ((4,), True), "exp_avg_sq": ((4,), True)},
    }
    assert {n: tuple(t.shape) for n, t in got["module.policy"].items()} == {"weight": (4, 3), "bias": (4,)}
    fsdp = {
        "optimizer.policy": {
            "state": {
                i: {**st, "exp_avg": st["exp_avg"][:4], "exp_avg_sq": st["exp_avg_sq"][:4]} for i, st in state.items()
            },
            "param_groups": [],
        },
        "module.policy": {"weight": torch.ones(4, 3), "bias": torch.ones(4)},
    }
    refsdp.check_rows(fsdp, whole=whole, world=2, rank=1)

    def broken(change: Any) -> dict[str, Any]:
        out = copy.deepcopy(fsdp)
        change(out)
        return out

    def moment(i: int, **kw: torch.Tensor) -> Callable[[dict[str, Any]], None]:
        return lambda sd: sd["optimizer.policy"]["state"][i].update(kw)

    fsdp2_cuts = "FSDP2 cuts {} of its {} to old rank 1 of 2"
    cases: dict[str, Callable[[dict[str, Any]], Any]] = {
        "its module.policy lacks bias": lambda sd: sd["module.policy"].pop("bias"),
        "it holds no module.policy": lambda sd: sd.pop("module.policy"),
        "its optimizer.policy parameter 1 lacks exp_avg_sq": lambda sd: sd["optimizer.policy"]["state"][1].popitem(),
        "its optimizer.policy parameter 0 lacks step": lambda sd: sd["optimizer.policy"]["state"][0].pop("step"),
        "module.policy weight is (4, 2); " + fsdp2_cuts.format((4, 3), (8, 3)): lambda sd: sd["module.policy"].update(
            weight=torch.ones(4, 2)
        ),
        "optimizer.policy parameter 1's exp_avg is (); " + fsdp2_cuts.format((4,), (8,)): moment(
            1, exp_avg=torch.tensor(0.0)
        ),
    }
    for said, change in cases.items():
        with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
            refsdp.check_rows(broken(change), whole=whole, world=2, rank=1)
    # an unsharded source's one shard holds the whole of each (world 1)
    with pytest.raises(
        ValueError, match=r"^optimizer.policy parameter 0's exp_avg is \(4, 3\); this model's is \(8, 3\)$"
    ):
        refsdp.check_rows(fsdp, whole=whole, world=1, rank=0)
