"""One rank of test_fsdp_load.py, as its own process:

    python tests/unit/trainers/load_rank.py RANK WORLD RENDEZVOUS MODEL OUT.pt

Forms a gloo group of WORLD CPU ranks and loads the `torch` backend on the HF checkpoint MODEL sharded over them
(`shard=True`: made on the meta device, sharded, filled one tensor at a time), with LoRA adapters on every
projection where RLCTL_TEST_LORA=RANK,ALPHA is set, else with PPO's critic sharded beside it (`critic_trunk`,
`shard_critic`); with RLCTL_TEST_PEAK_ONLY=1 the loads alone (nothing gathered). Rank 0 writes OUT.pt:

    "policy":           the policy's state gathered whole (adapters included)
    "buffers":          its RoPE tables
    "critic":           the critic's state gathered whole (None with LoRA)
    "load_peak_bytes":  [[how far each rank's peak resident memory rose over its resident memory before the load,
                         and (with a critic) before `critic_trunk` and `shard_critic`], …]
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.unit.rank_end import end_rank


def main(rank: int, world: int, rendezvous: Path, model: Path, out: Path) -> None:
    from rlctl.config.runtime import Lora
    from rlctl.rl.ppo import ValueModel
    from rlctl.trainers.base import load_backend

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    r, alpha = os.environ["RLCTL_TEST_LORA"].split(",") if "RLCTL_TEST_LORA" in os.environ else (None, None)
    adapters = Lora(rank=int(r), alpha=float(alpha)) if r is not None else None
    before = resident()
    backend = load_backend("torch", model, shard=True, adapters=adapters)
    grown = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before]  # (ru_maxrss: KiB on Linux)
    measured_only = bool(os.environ.get("RLCTL_TEST_PEAK_ONLY"))
    policy = {} if measured_only else gathered(backend.model)
    critic = None
    if adapters is None:
        before = resident()
        value = ValueModel(backend.critic_trunk())
        backend.shard_critic(value)
        grown.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)
        critic = None if measured_only else gathered(value)
    every: list[list[int]] = [[] for _ in range(world)]
    dist.all_gather_object(every, grown)
    if rank == 0:
        buffers = {k: v.clone() for k, v in backend.model.named_buffers()}
        torch.save({"policy": policy, "buffers": buffers, "critic": critic, "load_peak_bytes": every}, out)
    dist.barrier()


def resident() -> int:
    """This process's resident memory now, in bytes."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def gathered(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s state, each DTensor gathered whole (a collective: every rank, in order)."""
    from rlctl.devices import as_dtensor

    return {
        k: (d.full_tensor() if (d := as_dtensor(t)) is not None else t).detach().clone()
        for k, t in module.state_dict().items()
    }


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), Path(a[2]), Path(a[3]), Path(a[4]))
    end_rank()  # not through finalization (tests/unit/rank_end.py)
