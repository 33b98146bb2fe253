"""Trainer ranks above 0 are watched (rlctl.agents.watchdog): their loop marks its busy phases, never its wait for
rank 0's next broadcast, and a rank that hangs leaves its last word in the trainer group's store, where rank 0
finds it once its collective with that rank fails (the run's failure then names the rank and its host). The whole
path, a launched two-rank job whose rank 1 hangs: tests/integration/ops/test_ops_hangs.py."""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlctl.agents.trainer import hung_ranks, say_hung
from rlctl.agents.watchdog import HUNG
from rlctl.config.job import GrpoAlgorithm
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.learner import StreamingLearner
from tests.unit.agents.test_agents_learner_kl import SMALL, on_policy


def test_a_hung_ranks_last_word_is_found_by_rank_0_lowest_rank_first() -> None:
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    store = dist.PrefixStore("job-secret-prefix", server)
    assert hung_ranks(store, 4) == []
    say_hung(store, 3, f"{HUNG} train ran 21 s, past its limit of 20 s")
    say_hung(store, 1, f"{HUNG} optimizer step ran 300 s, past its limit of 300 s")
    host = socket.gethostname()
    assert hung_ranks(store, 4) == [
        f"trainer-1 on {host}: optimizer step ran 300 s, past its limit of 300 s",
        f"trainer-3 on {host}: train ran 21 s, past its limit of 20 s",
    ]
    assert hung_ranks(dist.PrefixStore("another-job", server), 4) == []  # keys under the job's own prefix


def _rank(rank: int, init: str, state: dict[str, torch.Tensor], out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        model = TinyGPT(SMALL)
        model.load_state_dict(state)
        learner = StreamingLearner(model, GrpoAlgorithm(kind="grpo", lr=1e-2), group_size=4, micro_batch_samples=4)
        if rank == 1:
            phases: list[str] = []

            def busy(phase: str) -> contextlib.AbstractContextManager[None]:
                phases.append(phase)
                return contextlib.nullcontext()

            learner.follow(on_step=lambda: phases.append("stepped"), busy=busy)
            out.put(phases)
            return
        samples = on_policy(model, prompts=3, group=4, seed=2)
        for _ in range(2):
            for s in samples:
                learner.add(s)
                learner.train_ready()
            learner.step()
        learner.stop_followers()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_a_follower_marks_its_work_as_busy_phases(tmp_path: Path) -> None:
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in TinyGPT(SMALL).state_dict().items()}
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, f"file://{tmp_path / 'rdv'}", state, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    phases = out.get(timeout=100)
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    # 3 groups of 4 in micro-batches of 4: 3 chunks trained, then the step, then publishing (on_step), twice
    assert phases == ["train", "train", "train", "optimizer step", "stepped"] * 2
