"""A damaged trainer shard whose SHA-256 its manifest lists as it is (`rlctl.checkpoint.shardcheck`): each check at
function level, then `load_trainer` at the split it was written at ending in one CheckpointError line naming the
checkpoint, the shard and what is wrong, the files as they were. Versus a KeyError's traceback (no optimizer.policy,
no rng), torch's RuntimeError (a truncated file), a line of the optimizer digests naming no file (a moment of another
shape), nothing at all (a moment in float64: cast back by AdamW's load, digest equal), and at another dp a line of
`rebuilt_optimizer` naming no file (one shard lacking a parameter's state)."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.checkpoint import shardcheck
from rlctl.checkpoint.trainer import load_trainer, rng_state, save_trainer, states_digest
from rlctl.errors import CheckpointError, ConfigError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.models.tinygpt import TinyGPT
from rlctl.trainers.base import DataParallel
from tests.unit.tiny_models import small_config


def stepped() -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 4)
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.ones(2, 3)).sum().backward()
    opt.step()
    return lin, opt


def a_shard(opt: torch.optim.Optimizer, **modules: torch.nn.Module) -> dict[str, Any]:
    """A shard as `save_shard` writes one for rank 0."""
    return {"rank": 0, "rng": rng_state(), "optimizer.policy": copy.deepcopy(opt.state_dict())} | {
        f"module.{k}": {n: t.clone() for n, t in m.state_dict().items()} for k, m in modules.items()
    }


def moment(i: int, name: str, change: Callable[[torch.Tensor], Any]) -> Callable[[dict[str, Any]], None]:
    def edit(shard: dict[str, Any]) -> None:
        st = shard["optimizer.policy"]["state"][i]
        st[name] = change(st[name])

    return edit


HELD = {
    "it holds no optimizer.policy": lambda s: s.pop("optimizer.policy"),
    "it holds no rng": lambda s: s.pop("rng"),
    "its rng holds no numpy state": lambda s: s["rng"].pop("numpy"),
    "its rng's torch state is torch.float32; torch's is torch.uint8": lambda s: s["rng"].update(
        torch=s["rng"]["torch"].float()
    ),
    "it is rank 1's shard, not rank 0's": lambda s: s.update(rank=1),
}
OPTIMIZERS = {
    "its optimizer.policy parameter 1 lacks exp_avg": lambda s: s["optimizer.policy"]["state"][1].pop("exp_avg"),
    "its optimizer.policy holds [3] parameters per group, this trainer's [2]": lambda s: s["optimizer.policy"][
        "param_groups"
    ][0]["params"].append(2),
    "its optimizer.policy holds state of parameter 5; this trainer's has 2 parameters": lambda s: s["optimizer.policy"][
        "state"
    ].update({5: s["optimizer.policy"]["state"][0]}),
    "optimizer.policy parameter 0's exp_avg_sq is torch.float64; its parameter's is torch.float32": moment(
        0, "exp_avg_sq", lambda t: t.double()
    ),
    "optimizer.policy parameter 1's exp_avg is list; its parameter's is torch.float32": moment(
        1, "exp_avg", lambda t: t.tolist()
    ),
}


@pytest.mark.parametrize("said", list(HELD) + list(OPTIMIZERS))
def test_each_entry_a_shard_lacks_or_holds_otherwise_is_said_in_one_line(said: str) -> None:
    _, opt = stepped()
    good = a_shard(opt)
    shardcheck.check_held(good, rank=0, optimizers={"policy": opt})
    shardcheck.check_optimizers(good, optimizers={"policy": opt})
    shardcheck.check_local(good, optimizers={"policy": opt})
    damaged = copy.deepcopy(good)
    (HELD | OPTIMIZERS)[said](damaged)
    with pytest.raises(ValueError, match=f"^{re.escape(said)}$"):
        shardcheck.check_held(damaged, rank=0, optimizers={"policy": opt})
        shardcheck.check_optimizers(damaged, optimizers={"policy": opt})


def test_a_moment_of_another_shape_and_a_module_of_another_dtype_are_said_naming_the_entry() -> None:
    lin, opt = stepped()
    shard = a_shard(opt, critic=lin)
    moment(0, "exp_avg", lambda t: t[1:].clone())(shard)
    with pytest.raises(
        ValueError, match=r"^optimizer.policy parameter 0's exp_avg is \(3, 3\); this rank's is \(4, 3\)$"
    ):
        shardcheck.check_local(shard, optimizers={"policy": opt})
    shard["module.critic"]["bias"] = shard["module.critic"]["bias"].half()
    with pytest.raises(ValueError, match=r"^module.critic bias is torch.float16; this module's is torch.float32$"):
        shardcheck.check_module_dtypes(shard, modules={"critic": lin})
    with pytest.raises(ConfigError, match=r"^ranks/rank-0.pt: module.critic bias is torch.float16; this module's"):
        shardcheck.check_modules(Path("ranks/rank-0.pt"), shard, {"critic": lin})


def test_the_digest_is_checked_against_what_the_rank_recorded() -> None:
    _, opt = stepped()
    shard = a_shard(opt)
    recorded = states_digest({"policy": shard["optimizer.policy"]})
    shardcheck.check_digest(shard, optimizers={"policy": opt}, recorded=recorded)
    shard["optimizer.policy"]["state"][0]["exp_avg"][0, 0] += 1
    with pytest.raises(ValueError, match=r"^its optimizer state is not the one its rank wrote \(its SHA-256 is not"):
        shardcheck.check_digest(shard, optimizers={"policy": opt}, recorded=recorded)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (lambda data: data[: len(data) // 2], r"not a readable torch file \(RuntimeError: PytorchStreamReader failed"),
        (lambda data: b"", r"not a readable torch file \((EOFError|RuntimeError): "),
        (lambda data: b"not torch" * 9, r"not a readable torch file \((UnpicklingError|RuntimeError): "),
    ],
)
def test_an_unreadable_shard_is_said_naming_it(tmp_path: Path, content: Callable[[bytes], bytes], said: str) -> None:
    (tmp_path / "ranks").mkdir()
    torch.save({"rank": 0}, tmp_path / "ranks" / "rank-0.pt")
    assert shardcheck.read_shard(tmp_path, "ranks/rank-0.pt") == {"rank": 0}
    path = tmp_path / "ranks" / "rank-0.pt"
    path.write_bytes(content(path.read_bytes()))
    for mmap in (False, True):
        with pytest.raises(CheckpointError, match=f"^{re.escape(str(tmp_path))}: ranks/rank-0.pt: {said}") as e:
            shardcheck.read_shard(tmp_path, "ranks/rank-0.pt", mmap=mmap)
        assert "\n" not in str(e.value)
    torch.save([1, 2], path)
    with pytest.raises(CheckpointError, match=r": ranks/rank-0.pt: it holds a list, not a shard's entries$"):
        shardcheck.read_shard(tmp_path, "ranks/rank-0.pt")


def test_fsdp2_shards_stepped_unevenly_are_refused_naming_the_one_lacking_a_parameter(tmp_path: Path) -> None:
    _, opt = stepped()
    first, second = a_shard(opt), a_shard(opt)
    shardcheck.check_stepped(
        tmp_path, {"ranks/rank-0.pt": first, "ranks/rank-1.pt": second}, optimizers={"policy": opt}
    )
    unstepped = {
        "ranks/rank-0.pt": {"optimizer.policy": {"state": {}}},
        "ranks/rank-1.pt": {"optimizer.policy": {"state": {}}},
    }
    shardcheck.check_stepped(tmp_path, unstepped, optimizers={"policy": opt})  # (no step yet: none holds any)
    del second["optimizer.policy"]["state"][1]
    with pytest.raises(
        CheckpointError,
        match=f"^{re.escape(str(tmp_path))}: ranks/rank-1.pt: its optimizer.policy holds no state of parameter 1, but "
        "state of the others$",
    ):
        shardcheck.check_stepped(
            tmp_path, {"ranks/rank-0.pt": first, "ranks/rank-1.pt": second}, optimizers={"policy": opt}
        )
    del first["optimizer.policy"]["state"][1]  # none holds it: it never stepped (PPO's critic's untied lm_head)
    shardcheck.check_stepped(
        tmp_path, {"ranks/rank-0.pt": first, "ranks/rank-1.pt": second}, optimizers={"policy": opt}
    )
    second["optimizer.policy"]["state"].clear()
    with pytest.raises(CheckpointError, match=r": ranks/rank-1.pt: .* no state of parameter 0, but state of every "
                       r"parameter in ranks/rank-0.pt$"):  # fmt: skip
        shardcheck.check_stepped(
            tmp_path, {"ranks/rank-0.pt": first, "ranks/rank-1.pt": second}, optimizers={"policy": opt}
        )


# -- load_trainer at the split the checkpoint was written at ---------------------------------------------------------


def relist(ckpt: Path, rel: str) -> None:
    """List shard `rel` of `ckpt` in the trainer's manifest as it is now (its bytes and SHA-256)."""
    path = ckpt / "MANIFEST.trainer.json"
    manifest = json.loads(path.read_text())
    data = (ckpt / rel).read_bytes()
    manifest["files"][rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def edited(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        shard = torch.load(path, weights_only=True)
        change(shard)
        torch.save(shard, path)

    return edit


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-200])


LOADS: dict[str, tuple[Callable[[Path], None], str]] = {
    "no-optimizer": (edited(lambda s: s.pop("optimizer.policy")), "it holds no optimizer.policy"),
    "no-rng": (edited(lambda s: s.pop("rng")), "it holds no rng"),
    "shape": (
        edited(moment(0, "exp_avg", lambda t: t[1:].clone())),
        r"optimizer.policy parameter 0's exp_avg is \(65, 32\); this rank's is \(66, 32\)",
    ),
    "dtype": (
        edited(moment(0, "exp_avg_sq", lambda t: t.double())),
        "optimizer.policy parameter 0's exp_avg_sq is torch.float64; its parameter's is torch.float32",
    ),
    "values": (
        edited(moment(0, "exp_avg", lambda t: t + 1)),
        r"its optimizer state is not the one its rank wrote \(its SHA-256 is not the manifest's\)",
    ),
    "truncated": (truncated, r"not a readable torch file \(RuntimeError: PytorchStreamReader failed [^\n]*"),
}


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(LOADS))
def test_a_resume_of_a_damaged_shard_at_its_split_ends_in_one_line_naming_it(tmp_path: Path, case: str) -> None:
    torch.manual_seed(0)
    model = TinyGPT(small_config())
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).float().sum().backward()
    opt.step()
    ckpt = tmp_path / "iter-1"
    split = ParallelConfig("trainer")
    save_trainer(ckpt, model=model, optimizers={"policy": opt}, counters={"version": 1}, split=split,
                 data_parallel=DataParallel())  # fmt: skip
    damage, said = LOADS[case]
    damage(ckpt / "ranks" / "rank-0.pt")
    relist(ckpt, "ranks/rank-0.pt")
    before = files_of(tmp_path)

    resumed = TinyGPT(small_config())
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(ckpt))}: ranks/rank-0.pt: {said}$") as e:
        load_trainer(ckpt, model=resumed, optimizers={"policy": torch.optim.AdamW(resumed.parameters())}, split=split,
                     data_parallel=DataParallel(), version=1)  # fmt: skip
    assert "\n" not in str(e.value)
    assert files_of(tmp_path) == before
