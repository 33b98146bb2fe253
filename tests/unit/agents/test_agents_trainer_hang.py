"""Trainer ranks above 0 are watched (rlctl.agents.watchdog): their loop marks its busy phases, never its wait for
rank 0's next broadcast, and a rank that hangs leaves its last word in the trainer group's store, where rank 0
finds it once its collective with that rank fails (the run's failure then names the rank and its host). The whole
path, a launched two-rank job whose rank 1 hangs: tests/integration/ops/test_ops_hangs.py."""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import socket
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlctl.agents import trainer
from rlctl.agents.trainer import TrainerAgent, culprits, hung_ranks, init_group, say_hung
from rlctl.agents.watchdog import HUNG, Watchdog
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops import runstart
from tests.unit.agents.test_agents_learner_kl import SMALL, on_policy, rank_learner
from tests.unit.rank_end import end_rank


def test_a_hung_ranks_last_word_is_found_by_rank_0_lowest_rank_first() -> None:
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    store = dist.PrefixStore("job-secret-prefix", server)
    assert hung_ranks(store, 4) == []
    say_hung(store, 3, f"{HUNG} train ran 21 s, past its limit of 20 s", waiting=False)
    say_hung(store, 1, f"{HUNG} optimizer step ran 300 s, past its limit of 300 s", waiting=True)
    host = socket.gethostname()
    said = hung_ranks(store, 4)
    assert said == [
        (f"trainer-1 on {host}: optimizer step ran 300 s, past its limit of 300 s", True),
        (f"trainer-3 on {host}: train ran 21 s, past its limit of 20 s", False),
    ]
    assert culprits(said) == [f"trainer-3 on {host}: train ran 21 s, past its limit of 20 s"]  # 1 only waited
    assert culprits(said[:1]) == [f"{said[0][0]} (waiting in a collective)"]
    assert hung_ranks(dist.PrefixStore("another-job", server), 4) == []  # keys under the job's own prefix


def test_a_hang_named_by_both_the_failed_collective_and_the_watchdog_is_said_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 waiting for a hung rank 1: its collective fails when rank 1 ends itself, and its own watchdog may
    fire at the same moment; both name rank 1, in one last heartbeat (CI once saw the word twice)."""
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    say_hung(server, 1, f"{HUNG} train ran 5 s, past its limit of 4 s", waiting=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(trainer, "make", lambda kind, figures: figures)  # the heartbeat: its state alone
    agent = _shell(server, 0)
    ready = threading.Barrier(4)

    def name() -> None:
        ready.wait()
        agent._name_hung_ranks(own_only=True)

    threads = [threading.Thread(target=name) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agent._name_hung_ranks()  # the failed collective's, after the watchdog's
    assert agent.sent == [f"{HUNG} trainer-1 on {socket.gethostname()}: train ran 5 s, past its limit of 4 s"]


LIMIT_S = 4.0


def _shell(store: dist.Store, rank: int, watchdog: Watchdog | None = None) -> types.SimpleNamespace:
    """The parts of a TrainerAgent its hang handlers use (no controller link: what it would send is kept)."""
    agent = types.SimpleNamespace(
        store=store, rank=rank, state="running", sent=[], watchdog=watchdog, last_word=threading.Lock()
    )
    agent.figures = lambda: agent.state
    agent.link = types.SimpleNamespace(send=agent.sent.append)
    agent._name_hung_ranks = types.MethodType(TrainerAgent._name_hung_ranks, agent)
    agent._hung_waiting = types.MethodType(TrainerAgent._hung_waiting, agent)
    return agent


def _hang_rank(rank: int, port: int, state: dict[str, torch.Tensor], who: int, out: mp.Queue) -> None:
    """Rank `who` hangs in its own work — rank 0 in its optimizer step before the all-reduce, rank 1 in its third
    micro-batch — while the other waits for it in a collective; both watched at LIMIT_S, as the trainer runs
    them. Rank 0 puts what its last heartbeat said (or its collective's failure named) on `out`."""
    torch.set_num_threads(1)
    trainer.make = lambda kind, figures: figures  # type: ignore[assignment]  # the heartbeat: its state alone
    store = init_group(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, secret=b"job")
    assert store is not None
    learner = rank_learner(state, micro=2)  # cuts of 4 rows, 2 a rank: a third share comes
    agent = _shell(store, rank)
    exiting = threading.Lock()  # never released: the first caller's exit ends the process

    def ended(code: int) -> None:
        # rank 0's watchdog and its failed collective may both end it: a second caller's join_thread returned at
        # once (the queue's joiner runs once) and its exit cut the first one's flush, so nothing came (CI, once)
        exiting.acquire()
        if rank == 0:
            out.put(agent.sent)
            out.close()
            out.join_thread()  # on the pipe before the exit, which skips the queue's own flush
        os._exit(code)

    handler = TrainerAgent._hung if rank == 0 else TrainerAgent._hung_follower
    agent.watchdog = dog = Watchdog(f"trainer-{rank}", LIMIT_S, on_hang=types.MethodType(handler, agent), exit=ended)
    learner.busy = dog.busy
    if rank == who:
        if rank == 0:
            learner.apply_step = lambda tokens: time.sleep(1000)  # type: ignore[method-assign]  # a stuck kernel
        else:
            share, calls = learner.backward_share, [0]

            def stuck(chunk, **kw):  # type: ignore[no-untyped-def]
                calls[0] += 1
                if calls[0] == 3:
                    time.sleep(1000)
                return share(chunk, **kw)

            learner.backward_share = stuck  # type: ignore[method-assign]
    if rank == 1:
        learner.follow()
        os._exit(0)
    try:
        for s in on_policy(learner.model, prompts=4, group=4, seed=2):
            learner.add(s)
            learner.train_ready()
        with dog.busy("optimizer step"):  # as the trainer wraps the learner's step
            learner.step()
    except Exception:  # noqa: BLE001 - the collective with the rank that ended itself failed: as the trainer does
        agent._name_hung_ranks()
        ended(1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("who", [0, 1])
def test_the_rank_that_hung_is_named_not_the_ones_waiting_for_it(who: int) -> None:
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in TinyGPT(SMALL).state_dict().items()}
    port = runstart._free_port()  # below the ephemeral range, as a launch picks it (one inside it was taken in CI)
    ctx = mp.get_context("spawn")  # not fork: a fork of a threaded pytest worker can deadlock in the child
    out = ctx.Queue()
    # daemons: a rank left running when the test fails ends with pytest (a join at exit would hang it)
    procs = [ctx.Process(target=_hang_rank, args=(r, port, state, who, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    said = out.get(timeout=100)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    assert len(said) == 1, said
    if who == 0:  # rank 1 also ran past its limit, waiting in the all-reduce: rank 0 names itself
        assert said[0].startswith(f"{HUNG} optimizer step ran ") and "trainer-1" not in said[0], said
    else:
        assert said[0].startswith(f"{HUNG} trainer-1 on {socket.gethostname()}: train ran "), said


def _rank(rank: int, init: str, state: dict[str, torch.Tensor], out: mp.Queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        learner = rank_learner(state, micro=2)
        if rank == 1:
            phases: list[str] = []

            def busy(phase: str) -> contextlib.AbstractContextManager[None]:
                phases.append(phase)
                return contextlib.nullcontext()

            learner.busy = busy
            learner.follow(on_step=lambda: phases.append("stepped"))
            out.put(phases)
        else:
            samples = on_policy(learner.model, prompts=3, group=4, seed=2)
            for _ in range(2):
                for s in samples:
                    learner.add(s)
                    learner.train_ready()
                learner.step()
            learner.stop_followers()
    finally:
        dist.destroy_process_group()
    end_rank(out)  # not through finalization: a rank 1 that had followed every step exited -6 there (CI)


@pytest.mark.timeout(120)
def test_a_follower_marks_its_work_as_busy_phases(tmp_path: Path) -> None:
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in TinyGPT(SMALL).state_dict().items()}
    ctx = mp.get_context("spawn")  # not fork: a fork of a threaded pytest worker can deadlock in the child
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, f"file://{tmp_path / 'rdv'}", state, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    phases = out.get(timeout=100)
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    # 3 groups of 4 in cuts of 4 (2 rows a rank): 3 chunks trained, then the step, then publishing (on_step), twice
    assert phases == ["train", "train", "train", "optimizer step", "stepped"] * 2
