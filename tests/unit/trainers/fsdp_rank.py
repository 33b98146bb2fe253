"""One rank of the FSDP2 tests (test_fsdp.py), as its own process:

    python tests/unit/trainers/fsdp_rank.py RANK WORLD RENDEZVOUS PHASE MODEL SAMPLES.pt JOB OUT.pt

With RLCTL_TEST_LORA=RANK,ALPHA in the environment the policy trains LoRA adapters on every projection
(`trainer.lora`): what is published and checkpointed is the merged model; with RLCTL_TEST_MICRO=N its micro-batches
hold N samples (3 otherwise); with RLCTL_TEST_PPO=1 the learner is PPO's, its critic sharded beside the policy
(checkpointed as the learner's module 'critic'; RLCTL_TEST_OLD_CRITIC=1: a whole trunk, lm_head included, as
until 2026-12-07), with RLCTL_TEST_ONCE=1 reducing the gradients once a step
(`reduce_per_step`), with RLCTL_TEST_ROWS=N training the first N samples of each iteration alone; with
RLCTL_TEST_CKPT_RANK=DIR rank RANK resumes from DIR (a copy of JOB/iter-2 as that rank sees it, a file broken) in
place of JOB/iter-2.

Forms a gloo group of WORLD CPU ranks, loads the `torch` backend on the HF checkpoint MODEL sharded over them
(FSDP2, `rlctl.trainers.fsdp`; WORLD 1: unsharded) and the GRPO learner on it as the trainer agent does: rank 0
adds the samples and steps, the other ranks follow its broadcasts. After each step every rank publishes the
version through its weight publisher in delta mode (its rows of every tensor encoded from its own shards,
`rlctl.weights.encoder`) and gathers the weights (`wire_weights`, a collective) to compare. The checkpoint's
HF directory is the published version (`PublishedModel`). SAMPLES.pt holds three iterations of samples.

  PHASE "run":     iterations 1 and 2; checkpoint JOB/iter-2 (rank 0 `save_trainer`, the followers `save_shard`:
                   sharded, every rank writes its part of the policy and of AdamW's state); iteration 3.
  PHASE "resume":  fresh ranks restore JOB/iter-2 (the HF policy, then each its own shard); iteration 3. Each rank
                   writes the checkpoint files it hashed (SHA-256) as it loaded to OUT.pt.hashed-RANK, one a line.

OUT.pt (rank 0): {"weights": [the fp32 weights after each iteration run], "grad_norms": [...], "router_aux": [...],
"published":
[whether the root's buffer equals the gathered weights, after each iteration], "encodings": [...], "critics": [PPO's
critic's whole state after each iteration (None: GRPO)]}.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.unit.rank_end import end_rank


def main(rank: int, world: int, rendezvous: Path, phase: str, model: Path, samples: Path, job: Path, out: Path) -> None:
    from rlctl.agents.weights import PublishedModel, WeightPublisher
    from rlctl.checkpoint.trainer import load_trainer, save_shard, save_trainer
    from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
    from rlctl.config.pipeline import Batch
    from rlctl.config.runtime import Lora, WeightSync
    from rlctl.launch.agentenv import ParallelConfig
    from rlctl.rl.learner import make_learner
    from rlctl.trainers.base import load_backend
    from rlctl.transport import InprocTransport
    from rlctl.weights import chunks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    iterations = torch.load(samples, weights_only=False)
    if rows := os.environ.get("RLCTL_TEST_ROWS"):
        iterations = [it[: int(rows)] for it in iterations]
    r, alpha = os.environ["RLCTL_TEST_LORA"].split(",") if "RLCTL_TEST_LORA" in os.environ else (None, None)
    adapters = Lora(rank=int(r), alpha=float(alpha)) if r is not None else None
    once = bool(os.environ.get("RLCTL_TEST_ONCE"))
    backend = load_backend("torch", model, shard=world > 1, reduce_per_step=once, adapters=adapters)
    dp = backend.data_parallel()
    split = ParallelConfig("trainer", dp=dp.size, fsdp=world > 1 or None)
    micro = int(os.environ.get("RLCTL_TEST_MICRO", "3"))
    if os.environ.get("RLCTL_TEST_OLD_CRITIC"):  # PPO's critic as it was until 2026-12-07: lm_head included
        from rlctl.models.tinygpt import TinyGPT

        m = backend.model
        old = (lambda: TinyGPT.on_meta(m.config, context=m.context)) if world > 1 else (lambda: copy.deepcopy(m))
        backend.critic_trunk = old  # type: ignore[method-assign]
    learner = make_learner(
        backend,
        PpoAlgorithm(kind="ppo", lr=1e-3) if os.environ.get("RLCTL_TEST_PPO") else GrpoAlgorithm(kind="grpo", lr=1e-3),
        Batch(samples_per_prompt=4, train_micro_batch_samples=micro),
        ref=None,
    )
    optimizers, modules = learner.optimizers(), learner.modules() | backend.checkpoint_modules()
    ckpt = Path(os.environ.get(f"RLCTL_TEST_CKPT_{rank}", job / "iter-2"))

    tied = backend.model.config.tie_word_embeddings
    group = dist.new_group(backend="gloo")
    pub = WeightPublisher(
        InprocTransport(secret=b"k"), listen="inproc://", sync=WeightSync(mode="delta"), timeout_s=30, group=group
    )
    state = {"version": 0 if phase == "run" else 2}
    checks: dict[str, list[object]] = {"published": [], "encodings": [], "critics": []}

    def whole(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()

    def trained_state() -> dict[str, object]:
        """The whole trained state, gathered (a collective): each optimizer's moments and steps by index, the fp32
        policy, each checkpointed module; and every rank's parts of each sharded parameter (FSDP2's layout)."""
        from rlctl.trainers.fsdp import local_tensor

        out: dict[str, object] = {"policy": {k: whole(v) for k, v in backend.model.state_dict().items()}}
        for k, o in optimizers.items():
            params = [p for g in o.param_groups for p in g["params"]]
            out[f"optimizer.{k}"] = {
                i: {m: whole(v) for m, v in o.state[p].items()} for i, p in enumerate(params) if p in o.state
            }
        out |= {f"module.{k}": {n: whole(v) for n, v in m.state_dict().items()} for k, m in modules.items()}
        parts: list[dict[str, torch.Tensor]] = [{}] * world
        mine = {n: local_tensor(p).detach().clone() for n, p in backend.model.named_parameters()}
        dist.all_gather_object(parts, mine)
        return out | {"parts": parts}

    def gathered() -> dict[str, torch.Tensor]:
        return backend.wire_weights(dtype=torch.float32, tied=tied)

    def published() -> dict[str, torch.Tensor]:
        """Publish the next version as the trainer agent does, wait for it, compare with the gathered weights."""
        v = state["version"] = state["version"] + 1
        if not pub.publish_step(v, backend.tensors()):
            pub.publish(v, gathered(), params=backend.tensors())
        while (cur := pub.node.store.current) is None or cur.version < v:
            time.sleep(0.01)
        full = gathered()
        checks["published"].append(torch.equal(cur.weights, chunks.flatten(full, cur.layout)))
        checks["encodings"].append(sorted(cur.payloads))
        critic = modules.get("critic")  # gathered (a collective), as the policy
        checks["critics"].append(None if critic is None else {k: whole(v) for k, v in critic.state_dict().items()})
        return full

    if phase == "resume":
        from rlctl.launch.sitefs import LocalFiles

        hashed, states = [], LocalFiles.states
        LocalFiles.states = lambda self, root, names, **kw: hashed.extend(names) or states(self, root, names, **kw)  # type: ignore[method-assign]
        load_trainer(
            ckpt, model=backend, optimizers=optimizers, modules=modules, split=split, data_parallel=dp, version=2
        )
        LocalFiles.states = states  # type: ignore[method-assign]
        Path(f"{out}.hashed-{rank}").write_text("".join(f"{n}\n" for n in hashed))
    loaded = trained_state() if phase == "resume" else None
    pub.publish(state["version"], gathered(), params=backend.tensors())  # the start: a full copy
    todo = [1, 2, 3] if phase == "run" else [3]
    if rank > 0:
        learner.follow(
            on_step=published,
            on_checkpoint=lambda v: (
                save_shard(job / f"iter-{v}", optimizers=optimizers, modules=modules, split=split, data_parallel=dp),
                trained_state(),
            ),
        )
        dist.barrier()
        pub.close()
        return
    record: dict[str, Any] = {"weights": [], "grad_norms": [], "router_aux": [], "state": loaded}
    for it in todo:
        for s in iterations[it - 1]:
            learner.add(s)
        stats = learner.step()
        record["weights"].append(published())
        record["grad_norms"].append(stats["grad_norm"])
        record["router_aux"].append(stats.get("router_aux_loss"))  # a MoE's load-balancing term, where trained
        if phase == "run" and it == 2:
            save_trainer(
                ckpt,
                model=PublishedModel(pub.node, 2, backend.model.config, timeout_s=30) if world > 1 else backend,
                optimizers=optimizers,
                modules=modules,
                counters={"version": 2},
                split=split,
                data_parallel=dp,
                announce=lambda: learner.announce_checkpoint(2),
            )
            record["state"] = trained_state()
    learner.stop_followers()
    torch.save(record | checks, out)
    dist.barrier()
    pub.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), Path(a[2]), a[3], Path(a[4]), Path(a[5]), Path(a[6]), Path(a[7]))
    end_rank()  # not through finalization (tests/unit/rank_end.py)
