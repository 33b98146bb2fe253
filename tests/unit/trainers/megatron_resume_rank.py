"""One rank of the sharded-checkpoint resume test (test_megatron_resume.py), as its own process:

    python tests/unit/trainers/megatron_resume_rank.py RANK WORLD TP PP RENDEZVOUS BACKEND ALGORITHM PHASE \
        SAMPLES.pt JOB OUT.pt MODEL

Forms a gloo group of WORLD ranks (megatron: its parallel state at TP × PP, dp = WORLD ÷ (TP·PP); torch: every
rank a replica), builds the BACKEND trainer backend on the HF checkpoint MODEL and the ALGORITHM's learner on
it as the trainer agent does (`rlctl.agents.trainer`: `StreamingLearner` for "grpo", `PpoBatchLearner` with its
critic for "ppo"): rank 0 adds the samples and steps, the other ranks follow its broadcasts and publish (gather)
the weights after each step. SAMPLES.pt holds three iterations of samples.

  PHASE "run":     iterations 1 and 2; checkpoint JOB/iter-2 (rank 0 `save_trainer`, announced through the
                   learner; the followers `save_shard` from `follow`: data-parallel replica 0's write a shard);
                   iteration 3.
  PHASE "resume":  fresh ranks: try JOB/iter-2-damaged and JOB/iter-2 at a split they cannot rebuild their state
                   at (GRPO: sharded by FSDP; PPO: tp and pp swapped, the critic's state) (each error is kept),
                   then restore JOB/iter-2 (the HF policy, the optimizer shard and RNG of this rank's (tp, pp)
                   position); iteration 3.
  PHASE "resplit": fresh ranks at another split than the run's restore JOB/iter-2 (their AdamW state rebuilt
                   from the old shards); iteration 3.
  PHASE "resplit-refused": fresh ranks at another split try JOB/iter-2 (a shard damaged by the test, or MODEL
                   another model's; each error, a CheckpointError or ConfigError, is kept) and keep the weights
                   they then hold; no iteration.

OUT.pt: {"weights": full HF weights after iteration 3, "optimizer": this rank's AdamW state after it (each
optimizer's: "policy", PPO's "critic"), "modules": the state of the learner's other modules after it (PPO's
critic: this rank's shard of its trunk, and its head), "errors": the CheckpointErrors of the resume phase,
"counters": the counters restored, "rng": this rank's RNG states right after the restore (resume phase),
"at_checkpoint" (run) / "restored" (resplit): this rank's policy AdamW state by parameter name when the
checkpoint was written / right after the restore, "restored_weights" (resplit): the full HF weights then,
"policy_checks" (resplit): how many times the restore checked the checkpoint's policy against the model (megatron's
`check_hf`; 0 for the torch backend)}.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.unit.rank_end import end_rank


def main(
    rank: int,
    world: int,
    tp: int,
    pp: int,
    rendezvous: Path,
    backend_name: str,
    algorithm: str,
    phase: str,
    samples: Path,
    job: Path,
    out: Path,
    model: Path,
) -> None:
    from rlctl.checkpoint.trainer import CheckpointError, load_trainer, rng_state, save_shard, save_trainer
    from rlctl.config.algorithm import GrpoAlgorithm, PpoAlgorithm
    from rlctl.config.pipeline import Batch
    from rlctl.errors import ConfigError
    from rlctl.launch.agentenv import ParallelConfig
    from rlctl.rl.learner import make_learner
    from rlctl.trainers.base import load_backend

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    iterations = torch.load(samples, weights_only=False)
    backend = load_backend(backend_name, model, tp=tp, pp=pp)
    dp = backend.data_parallel()
    split = ParallelConfig("trainer", *backend.model_parallel(), dp=dp.size)
    algo = (
        GrpoAlgorithm(kind="grpo", lr=1e-3)
        if algorithm == "grpo"
        else PpoAlgorithm(kind="ppo", lr=1e-3, critic_lr=1e-2)
    )
    batch = Batch(prompts_per_iteration=3, samples_per_prompt=4, train_micro_batch_samples=5)
    learner = make_learner(backend, algo, batch, ref=None)  # the trainer agent's learner
    opts, modules, ckpt = learner.optimizers(), learner.modules(), job / "iter-2"
    result: dict[str, Any] = {"errors": [], "counters": None}
    if phase == "resume":
        # a split no rank can rebuild its state at: FSDP's sharded state at a pp > 1 (GRPO's; at tp 1 pp 1 it is
        # rebuilt: `rlctl.checkpoint.refsdp`), a PPO critic's at another tp × pp
        other = (
            ParallelConfig("trainer", split.tp, 2 * split.pp, dp=dp.size, fsdp=True)
            if algorithm == "grpo"
            else ParallelConfig("trainer", split.pp, split.tp, dp=dp.size)
        )
        for where, as_split in ((job / "iter-2-damaged", split), (ckpt, other)):
            try:
                load_trainer(
                    where, model=backend, optimizers=opts, modules=modules, split=as_split, data_parallel=dp, version=2
                )
            except CheckpointError as e:
                result["errors"].append(str(e))
        result["counters"], _ = load_trainer(
            ckpt, model=backend, optimizers=opts, modules=modules, split=split, data_parallel=dp, version=2
        )
        result["rng"] = rng_state()
    if phase == "resplit-refused":
        try:
            load_trainer(
                ckpt, model=backend, optimizers=opts, modules=modules, split=split, data_parallel=dp, version=2
            )
        except (CheckpointError, ConfigError) as e:  # (ConfigError: another model's checkpoint)
            result["errors"].append(str(e))
        result["weights"] = {k: v.clone() for k, v in backend.weights().items()}
        torch.save(result, out)
        dist.destroy_process_group()
        return
    if phase == "resplit":
        checks = policy_checks(backend)
        result["counters"], _ = load_trainer(
            ckpt, model=backend, optimizers=opts, modules=modules, split=split, data_parallel=dp, version=2
        )
        result["policy_checks"] = len(checks)
        result["restored"] = named_state(backend.model, opts["policy"])
        result["restored_weights"] = {k: v.clone() for k, v in backend.weights().items()}

    def checkpointed() -> None:
        result["at_checkpoint"] = named_state(backend.model, opts["policy"])

    def on_checkpoint(version: int) -> None:
        checkpointed()
        save_shard(job / f"iter-{version}", optimizers=opts, modules=modules, split=split, data_parallel=dp)

    todo = [0, 1, 2] if phase == "run" else [2]
    published: list[dict[str, torch.Tensor]] = []
    if rank == 0:
        for i in todo:
            for s in iterations[i]:
                learner.add(s)
                learner.train_ready()
            learner.step()
            published.append(backend.weights())  # every rank publishes each version (a collective at tp, pp > 1)
            if i == 1:
                checkpointed()
                save_trainer(
                    ckpt,
                    model=backend,
                    optimizers=opts,
                    modules=modules,
                    counters={"version": 2},
                    split=split,
                    data_parallel=dp,
                    announce=lambda: learner.announce_checkpoint(2),
                )
        learner.stop_followers()
    else:
        learner.follow(
            on_step=lambda: published.append(backend.weights()),
            on_checkpoint=on_checkpoint,
        )
    assert len(published) == len(todo)
    result["weights"] = {k: v.clone() for k, v in published[-1].items()}
    result["optimizer"] = {k: o.state_dict() for k, o in opts.items()}
    result["modules"] = {
        k: {n: t.clone() for n, t in m.state_dict().items() if t is not None} for k, m in modules.items()
    }
    torch.save(result, out)
    dist.destroy_process_group()


def policy_checks(backend: Any) -> list[str]:
    """Each name of the checkpoint's tensors `check_hf` is asked about by `backend`'s megatron policy (its names'
    count at each call; none for another backend), as it is called from now on."""
    calls: list[str] = []
    policy = getattr(backend, "model", None)
    check_hf = getattr(policy, "check_hf", None)
    if check_hf is not None and hasattr(policy, "stage"):

        def counted(hf: Any) -> Any:
            calls.append(f"{len(hf)} tensors")
            return check_hf(hf)

        policy.check_hf = counted  # (the instance's: what `load_hf` and `_check_policy` call)
    return calls


def named_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    """`opt`'s state of each parameter of `model`, by its name (copies)."""
    return {
        n: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
        for n, p in model.named_parameters()
        if p in opt.state
    }


if __name__ == "__main__":
    a = sys.argv[1:]
    main(
        int(a[0]), int(a[1]), int(a[2]), int(a[3]), Path(a[4]), a[5], a[6], a[7], Path(a[8]), Path(a[9]),
        Path(a[10]), Path(a[11]),
    )  # fmt: skip
    end_rank()  # not through finalization (tests/unit/rank_end.py)
