"""The trainer agent: one torch.distributed (gloo) group; rank 0 talks to the controller.

    controller ──samples (whole groups, scored beside the controller)──▶ inbox ─▶ staleness check, by iteration
             iteration i (= the version) ─▶ learner.add ─▶ micro-batches train as whole groups arrive
             a later one (async)         ─▶ held until the trainer gets there
           all samples of iteration i in? ─▶ optimizer step ─▶ version i+1 ─▶ iteration i+1's held samples
                                     ─▶ WeightPublisher (background): plan the broadcast, tell units
                                     ─▶ trained(i, i+1, sample ids, figures) ──▶ controller
    controller ──members──▶ publisher targets with their datacenters (a newcomer gets the latest version)

Ranks > 0 follow rank 0's broadcasts (`StreamingLearner.follow`; PPO's `PpoBatchLearner.follow`: the whole
batch at the step) and take their part in every version: the lowest rank of each host holds it in its weight
node and is a root of the broadcast plan (`rlctl.agents.weights`), so several chains share the trainer
datacenter's links. With one rank the group is still formed, so the code path is the same. With megatron
tensor or pipeline parallel, the ranks of a tp × pp group train shards of one replica and each gathers the
full weights over the group (the same bytes on every rank); rank 0 checkpoints them.

    checkpoint due (rank 0) ─broadcast ("checkpoint", v)─▶ data-parallel replica 0's ranks copy their shard
      host copies of the policy,                           (optimizer, RNG) into host memory; the other
      its shard; training goes on                          replicas hold the same; training goes on
      writer thread ◀──── gather over the checkpoint ──── writer thread: the shard on disk
                          group: on disk
      the HF policy, the manifest ──checkpoint_written(v, digest)──▶ controller: its part, `latest`
    `launch --resume`: every rank restores the HF policy (its shard) and the shard of its (tp, pp) position
                       (`rlctl.checkpoint.trainer`); at another split its state rebuilt from the old shards

The policy is held by the job's trainer backend (`rlctl.trainers`: `torch` or `megatron`); the learner trains
its module, and what is published and checkpointed is the backend's HF-layout weights.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import logging
import os
import queue
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist

from rlctl.agents.common import AgentContext, ControllerLink, job_context, output_budget
from rlctl.agents.listen import host_of, listen_host, store_listener
from rlctl.agents.messages import CheckpointWritten, Delivered, Heartbeat, Hello, Regroup, Trained, make, parse
from rlctl.agents.staleness import StalenessBound
from rlctl.agents.watchdog import HUNG, Watchdog, waits_in_collective
from rlctl.agents.watchdog import TICK_S as WATCH_TICK_S
from rlctl.agents.weights import PublishedModel, Target, WeightPublisher
from rlctl.checkpoint.background import BackgroundWriter
from rlctl.checkpoint.choose import checkpoints_at, resume_version
from rlctl.checkpoint.files import newest_complete, prune, set_aside_newer
from rlctl.checkpoint.trainer import CheckpointError, HostPolicy, load_trainer, snapshot_shard, snapshot_trainer
from rlctl.config.job import JobFile
from rlctl.devices import Compute
from rlctl.errors import ConfigError, TransportError
from rlctl.launch.agentenv import ParallelConfig, parallel_from_env
from rlctl.launch.jobdir import resume_command
from rlctl.models import hf
from rlctl.rl.learner import make_learner
from rlctl.rl.samples import Sample
from rlctl.rl.source import task_source
from rlctl.trainers.base import TrainerBackend, load_backend
from rlctl.trainers.wire import all_gather_values
from rlctl.transport import Message

log = logging.getLogger(__name__)

# how long rank 0's watchdog, ending it, waits for a rank above to say it hung first (two of the watchers' ticks)
FOLLOWER_WORD_S = 2 * WATCH_TICK_S + 1.0

Held = tuple[Delivered, list[int], list[float]]  # a delivered sample: its header, output tokens, logprobs


def init_group(
    *, rank: int, world_size: int, master_addr: str, master_port: int, cuda: bool = False, secret: bytes = b""
) -> dist.Store | None:
    """The trainer ranks' process group: gloo, plus NCCL for CUDA tensors on a GPU site (gradients travel over
    NCCL; the learner's small host-side messages over gloo). The rendezvous store listens on MASTER_ADDR only,
    and every key the ranks use is under a prefix derived from the job's secret (`store_prefix`): a process
    without the secret that reaches the store can neither read the ranks' addresses nor plant its own.
    Returns the store (None when the group was formed before): where a rank that hangs leaves its last word."""
    if dist.is_initialized():
        return None
    timeout = datetime.timedelta(seconds=120)
    fd = store_listener(master_addr, master_port) if rank == 0 else None  # bound to MASTER_ADDR, not every interface
    tcp = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout=timeout, master_listen_fd=fd)
    store = dist.PrefixStore(store_prefix(secret), tcp) if secret else tcp
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return store


def say_hung(store: dist.Store, rank: int, text: str, *, waiting: bool) -> None:
    """A rank > 0's last word before its watchdog ends it (`text`: the watchdog's; `waiting`: its hung thread was
    inside a collective, waiting for another rank rather than hung itself): in the group's store, which rank 0
    holds, where `hung_ranks` finds it once rank 0's collective with the ended rank fails. The ranks above 0 have
    no controller link, and without this the run's failure would name rank 0's broken collective, not the rank
    (and host) that hung."""
    said = text.removeprefix(HUNG).strip()
    word = {"said": f"trainer-{rank} on {socket.gethostname()}: {said}", "waiting": waiting}
    store.set(f"hung/{rank}", json.dumps(word))


def hung_ranks(store: dist.Store, world_size: int) -> list[tuple[str, bool]]:
    """What the ranks whose watchdogs ended them said (`say_hung`), lowest rank first: (words, waiting)."""
    out = []
    for key in (f"hung/{r}" for r in range(1, world_size)):
        if store.check([key]):
            word = json.loads(store.get(key))
            out.append((str(word["said"]), bool(word["waiting"])))
    return out


def culprits(said: list[tuple[str, bool]]) -> list[str]:
    """Of the ranks that said they hung, those hung themselves: not the ones only waiting in a collective for
    another (all of them when every one was waiting: the collective itself never completed)."""
    own = [words for words, waiting in said if not waiting]
    return own or [f"{words} (waiting in a collective)" for words, _ in said]


def store_prefix(secret: bytes) -> str:
    """The trainer store's key prefix: a keyed hash of the job's secret (the secret itself never leaves)."""
    return hmac.new(secret, b"rlctl trainer store", hashlib.sha256).hexdigest()[:32]


class TrainerAgent:
    def __init__(
        self, ctx: AgentContext, *, rank: int = 0, compute: Compute | None = None, store: dist.Store | None = None
    ) -> None:
        self.ctx = ctx
        self.store = store  # the trainer group's (`init_group`): the ranks' last words when they hang
        job = ctx.job
        self.task = task_source(job, ctx.jobdir.path, ctx.jobdir.init_model)  # prompts only: rewards come scored
        self.rank = rank
        self.name = f"trainer-{rank}"
        where = str(ctx.jobdir.job_json)
        self.compute = compute
        init = ctx.jobdir.init_model
        self.backend = _backend(job, init, where=where, compute=compute)
        kl = job.algorithm.kl_coef > 0
        ref = _backend(job, init, where=where, compute=compute, reference=True).model if kl else None
        # versions travel in the checkpoint's dtype, a tied embedding once (what the planner prices)
        self.config = config = hf.read_config(init)
        self._wire_dtype, self._tied = hf.torch_dtype(config), config.tie_word_embeddings
        self.learner = make_learner(
            self.backend,
            job.algorithm,
            job.batch,
            ref=ref,
            iterations=job.iterations,
            max_output_tokens=output_budget(job),  # (the digits task caps its answers below the field)
        )
        self.bound = StalenessBound(job.pipeline.eta)
        self.samples_per_prompt = job.batch.samples_per_prompt
        self.prompts_per_iteration = job.batch.prompts_per_iteration
        self._sizes: dict[str, int] = {}  # the current iteration's groups taken so far: how many samples each trains
        self.version = 0
        self.checkpoint_digest = ""  # of the checkpoint this trainer restored (the controller compares)
        tp, pp = self.backend.model_parallel()
        self.data_parallel = self.backend.data_parallel()
        self.split = ParallelConfig(
            "trainer", tp=tp, pp=pp, dp=self.data_parallel.size, fsdp=self.data_parallel.sharded or None
        )
        self.modules = self.learner.modules() | self.backend.checkpoint_modules()  # in each rank's shard
        resumed = resume_version()
        if resumed is not None and rank == 0:  # rank 0 writes and prunes the part; the newer ones are abandoned
            set_aside_newer(ctx.jobdir.checkpoints, "trainer", resumed=resumed, keep=job.checkpoint.keep)
        if resumed:  # `launch --resume`: policy, the optimizer shard and RNG of this rank's (tp, pp) position,
            # version from the checkpoint
            counters, self.checkpoint_digest = load_trainer(
                ctx.jobdir.checkpoint(resumed),
                model=self.backend,
                optimizers=self.learner.optimizers(),
                modules=self.modules,
                split=self.split,
                data_parallel=self.data_parallel,
                version=resumed,
            )
            self.version = int(counters["version"])
            self.learner.resume_at(self.version)
            log.info("%s: restored checkpoint v%d", self.name, self.version)
        self.busy_s = 0.0
        self.snapshot_s = 0.0  # the training thread's time taking checkpoints' host copies
        self.state = "starting"
        self.last_word = threading.Lock()  # the watchdog's thread and a failed collective's both name a hang
        self.inbox: queue.Queue[Message | None] = queue.Queue()
        self._early: list[Message | None] = []  # messages read before their turn, looking for a stop (`_told_stop`)

    def _publish(self, publisher: WeightPublisher, version: int) -> None:
        """A new version: in delta mode its delta, encoded where the trainer computes (every rank its part); a full
        host snapshot where one is due (the first, an anchor; full mode). Every rank, every version, in order."""
        params = self.backend.tensors()
        if not publisher.publish_step(version, params):
            publisher.publish(version, self.wire_weights(), params=params)

    def wire_weights(self) -> dict[str, torch.Tensor]:
        """A snapshot of the policy as it is published: the checkpoint's dtype, where the trainer computes (the
        publisher moves it into its host buffer tensor by tensor; on a rank that holds no copy, its layout only)."""
        publisher: WeightPublisher | None = getattr(self, "publisher", None)  # set once run() made it
        holds = publisher is None or publisher.holds
        return self.backend.wire_weights(dtype=self._wire_dtype, tied=self._tied, host=holds, on_device=True)

    def figures(self) -> Heartbeat:
        watchdog: Watchdog | None = getattr(self, "watchdog", None)  # rank 0's, made once its link is up
        phase, phase_s = watchdog.current() if watchdog is not None else ("", 0.0)
        return Heartbeat(
            name=self.name, state=self.state, version=self.version, busy_s=self.busy_s, phase=phase, phase_s=phase_s
        )

    def _publisher(self) -> WeightPublisher:
        """This rank's weight node. The lowest rank of each host holds every version in host memory and is a root
        of the broadcast; the others take their part in encoding each delta and hold nothing (one copy per host,
        not per rank). The ranks split the encoding over a group of their own (made here, on every rank, in
        order)."""
        job = self.ctx.job
        scheme = job.transport.kind
        host = "" if scheme == "inproc" else listen_host(job, toward=host_of(self.ctx.controller))
        several = dist.is_initialized() and dist.get_world_size() > 1
        return WeightPublisher(
            self.ctx.transport,
            listen="inproc://" if scheme == "inproc" else f"{scheme}://{host}:0",
            sync=job.weight_sync,
            timeout_s=job.transport.timeout_s,
            group=dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=120)) if several else None,
            holds=_first_on_host(),
        )

    def run(self) -> None:
        self.publisher = publisher = self._publisher()
        # checkpoints are written beside training: their gathers go over a group of their own (made here, on
        # every rank, in order), so that a write never meets the training steps' collectives
        several = dist.is_initialized() and dist.get_world_size() > 1
        self.checkpoint_group = (
            dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=600)) if several else None
        )
        self.writer = BackgroundWriter()
        roots = _roots(publisher.node.address, holds=publisher.holds)
        if self.version:  # resumed: the checkpoint's weights, as a full copy to every unit (an anchor)
            publisher.publish(self.version, self.wire_weights(), params=self.backend.tensors())
        if self.rank > 0:  # follow rank 0's steps; publish each version for the units planned below this rank
            version = self.version
            # a phase that never returns ends this rank, its last word in the group's store: rank 0's collective
            # with it then fails, and rank 0 names this rank in the run's failure (`hung_ranks`)
            self.watchdog = watchdog = Watchdog(
                self.name, self.ctx.job.trainer.hang_timeout_s, on_hang=self._hung_follower
            )

            def stepped() -> None:
                nonlocal version
                version += 1
                with watchdog.busy("publish"):
                    self._publish(publisher, version)

            def write_shard(version: int) -> None:  # rank 0 writes the policy and seals the part after this
                with watchdog.busy("checkpoint snapshot"):
                    write = snapshot_shard(
                        self.ctx.jobdir.checkpoint(version),
                        optimizers=self.learner.optimizers(),
                        modules=self.modules,
                        split=self.split,
                        data_parallel=self.data_parallel,
                        group=self.checkpoint_group,
                    )
                self.writer.submit(write)

            try:
                self.learner.busy = watchdog.busy
                self.learner.follow(on_step=stepped, on_checkpoint=write_shard)
                self.writer.wait()
            finally:
                watchdog.close()
                publisher.close()
            return
        publisher.set_roots(roots)
        self.link = link = ControllerLink(
            self.ctx,
            Hello(
                role="trainer",
                name=self.name,
                version=self.version,
                pid=os.getpid(),
                weights=publisher.node.address,
                checkpoint=self.checkpoint_digest,
                weight_roots=roots,
            ),
            figures=self.figures,
            inbox=self.inbox,
        )
        self.state = "running"
        # a training phase that never returns ends this rank: the run fails, and auto_resume resumes it
        self.watchdog = watchdog = Watchdog(self.name, self.ctx.job.trainer.hang_timeout_s, on_hang=self._hung)
        self.learner.busy = watchdog.busy  # its micro-batches and steps are phases (as on the ranks that follow)
        ids: list[str] = []
        # by iteration: the one trained now (= self.version) and, in async, later ones the controller sent early
        held: dict[int, deque[Held]] = {}
        violations: Counter[int] = Counter()  # by iteration: samples staler than the bound allows
        complete = [self.version] if self.version else []  # checkpoints the controller sealed (and the resumed one)
        failed = False
        try:
            while True:
                fed = False
                for msg in self._next_messages():
                    if msg is None or msg.kind == "stop":
                        self.state = "stopped" if msg is not None else "orphaned"
                        if msg is None:  # the controller is gone: say how the job goes on
                            log.warning(
                                "trainer: lost the controller; once the job has stopped, `%s` continues it from its "
                                "latest complete checkpoint",
                                resume_command(self.ctx.jobdir.id),
                            )
                        try:
                            if msg is not None:  # the checkpoint being written is finished first
                                self.writer.wait()
                        finally:
                            link.close(final=self.figures() if msg is not None else None)
                        return
                    if msg.kind == "checkpointed":  # iter-v is complete: our parts `checkpoint.keep` lets go
                        complete.append(int(msg.header["version"]))
                        keep = self.ctx.job.checkpoint.keep
                        prune(self.ctx.jobdir.checkpoints, "trainer", complete=complete, keep=keep)
                        complete = newest_complete(complete, keep=keep)  # versus one per checkpoint of the run
                    elif msg.kind == "members":
                        rollouts = msg.header["rollouts"]
                        targets = {n: Target(t["address"], t["weights"], t["datacenter"]) for n, t in rollouts.items()}
                        links = msg.header.get("dc_links")
                        publisher.set_targets(
                            targets,
                            datacenter=str(msg.header.get("datacenter", "")),
                            dc_links={frozenset(p) for p in links} if links else None,
                        )
                    elif msg.kind == "regroup":  # groups held for a later iteration move into the current one
                        _regroup(held, parse(msg, Regroup))
                        fed = True
                    elif msg.kind == "samples":
                        self._hold(msg, held, violations)
                        fed = True
                    else:
                        log.warning("trainer: unexpected message %r", msg.kind)
                if not fed:
                    continue
                # train the current iteration as far as its samples go; commit it when whole, and go on with
                # the next one's held samples (they may be whole already)
                while True:
                    t0 = time.monotonic()
                    ids += self._take(held.setdefault(self.version, deque()))
                    self.learner.train_ready()  # a "train" phase per micro-batch (`learner.busy`), as on the
                    # ranks that follow: a phase that blocks here began after a follower's that hung, never before
                    self.busy_s += time.monotonic() - t0
                    if not self._whole():
                        break
                    # the iteration is complete: one optimizer step, a new version, publish, report
                    t0 = time.monotonic()
                    with watchdog.busy("optimizer step"):
                        stats = self.learner.step()
                    self._sizes.clear()
                    del held[self.version]
                    iteration, self.version = self.version, self.version + 1
                    with watchdog.busy("publish"):
                        self._publish(publisher, self.version)
                    checkpoint = self._maybe_checkpoint()
                    self.busy_s += time.monotonic() - t0
                    link.send(
                        make(
                            "trained",
                            Trained(
                                iteration=iteration,
                                version=self.version,
                                sample_ids=ids,
                                reward_mean=stats["reward_mean"],
                                train_s=stats["train_s"],
                                tokens=int(stats["tokens"]),
                                loss=stats["loss"],
                                kl=stats["kl"],
                                kl_ref=stats.get("kl_ref") if self.ctx.job.algorithm.kl_coef > 0 else None,
                                value_loss=stats.get("value_loss"),  # PPO's critic
                                router_aux_loss=stats.get("router_aux_loss"),  # a MoE's load balancing
                                grad_norm=stats["grad_norm"],
                                lr=stats["lr"],
                                clip_frac=stats["clip_frac"],
                                entropy=stats["entropy"],
                                no_signal_frac=stats.get("no_signal_frac", 0.0),
                                checkpointing=checkpoint is not None,
                                skipped=bool(stats.get("skipped")),
                                staleness_violations=violations.pop(iteration, 0),
                                busy_s=self.busy_s,
                            ),
                        )
                    )
                    if checkpoint is not None:  # its checkpoint_written goes after this trained
                        self.writer.submit(checkpoint)
                        checkpoint = None  # the writer holds the snapshot now: one in host memory at a time
                    ids = []
                    if self._told_stop():  # before the next iteration's step, whole already or not
                        break
        except BaseException:
            failed = True
            self._name_hung_ranks()  # a collective failed because a rank ended itself hung: name that rank
            with contextlib.suppress(Exception):  # the group may be broken: the followers' own reads then end them
                self.learner.stop_followers()
            raise
        finally:
            try:  # the loop's end is a `return` (a try's `else` does not run then): the followers leave the group
                if not failed:
                    self.learner.stop_followers()
            finally:
                watchdog.close()
                publisher.close()
                self.task.close()

    def _hung(self, text: str) -> None:
        """The watchdog's last word before this rank exits: the controller names the hang in the run's failure.
        Hung in its own work, this rank names itself (the ranks above that also ran past their limits were only
        waiting for it). Hung inside a collective, it is waiting for a rank above that may have hung first: their
        watchdogs tick apart, so that rank's own word is waited for a moment, and named instead when it comes."""
        self.state = text
        if not (self._hung_waiting() and self._name_hung_ranks(wait_s=FOLLOWER_WORD_S, own_only=True)):
            self.link.send(make("heartbeat", self.figures()))

    def _name_hung_ranks(self, *, wait_s: float = 0.0, own_only: bool = False) -> bool:
        """Rank 0: when ranks above ended themselves hung, its last heartbeat says which (the controller names
        them in the run's failure): those hung in their own work, else every one that said so (`culprits`);
        `own_only`: only those hung in their own work. Whether any was named (asked again for up to `wait_s`)."""
        named: list[str] = []
        if self.store is not None and dist.is_initialized() and dist.get_world_size() > 1:
            deadline = time.monotonic() + wait_s
            with contextlib.suppress(Exception):  # the last word is a courtesy: the failure goes on regardless
                while True:
                    said = hung_ranks(self.store, dist.get_world_size())
                    named = [w for w, waiting in said if not waiting] if own_only else culprits(said)
                    if named or time.monotonic() >= deadline:
                        break
                    time.sleep(0.1)
        if not named:
            return False
        text = f"{HUNG} {'; '.join(named)}"
        with self.last_word:  # the collective's failure and this rank's own watchdog may both get here: one word
            if self.state == text:
                return True
            self.state = text
            log.error("trainer: %s ended itself hung (its log has every thread's stack)", "; ".join(named))
            with contextlib.suppress(TransportError):
                self.link.send(make("heartbeat", self.figures()))
        return True

    def _hung_follower(self, text: str) -> None:
        """A rank > 0's watchdog's last word: into the group's store, for rank 0 (`say_hung`), saying whether it
        was only waiting in a collective (for rank 0, or another rank)."""
        self.state = text
        if self.store is not None:
            say_hung(self.store, self.rank, text, waiting=self._hung_waiting())

    def _hung_waiting(self) -> bool:
        """Whether the phase this rank's watchdog found hung is inside a collective: waiting for another rank."""
        hung = self.watchdog.hung
        return hung is not None and waits_in_collective(hung.thread)

    def _told_stop(self) -> bool:
        """Whether a stop (or the controller's end) is queued: the messages queued are read now, and handed out first
        by `_next_messages`. A stop that came during a step went unread while the next iteration's samples were all
        held, and that iteration was trained too (a step more after `rlctl stop`; a checkpoint's, waited for)."""
        while True:
            try:
                self._early.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        return any(m is None or m.kind == "stop" for m in self._early)

    def _next_messages(self) -> list[Message | None]:
        """The next message (waiting for one), then every other one already queued: the learner cuts its
        micro-batches from every group that arrived while it trained (one group's rows at a time cut 23 % more
        padded tokens, 20 % more micro-steps, in the hf-demo job). Those `_told_stop` read first come first."""
        if self._early:
            msgs, self._early = self._early, []
            return msgs
        msgs = [self.inbox.get()]
        while msgs[-1] is not None:
            try:
                msgs.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        return msgs

    def _hold(self, msg: Message, held: dict[int, deque[Held]], violations: Counter[int]) -> None:
        """Sample-level work as each group arrives (scored beside the controller): the staleness check, then it
        waits by iteration for the learner."""
        t0 = time.monotonic()
        for d, (out, lp) in zip(_delivered(msg), _pairs(msg.tensors), strict=True):
            # the controller delivers iterations not trained yet only (ControllerCore._deliver)
            assert d.iteration >= self.version, (d.sample_id, d.iteration, self.version)
            # iteration i is trained at version i: that is the staleness that counts
            if not self.bound.may_train(trainer_version=d.iteration, sample_version=d.version):
                violations[d.iteration] += 1
            held.setdefault(d.iteration, deque()).append((d, out.tolist(), lp.tolist()))
        self.busy_s += time.monotonic() - t0

    def _take(self, held: deque[Held]) -> list[str]:
        """Hand the learner every sample of the current iteration that arrived, in arrival order."""
        ids = []
        while held:
            d, toks, lps = held.popleft()
            prompt = self.task.prompt_tokens(d.prompt_id)
            size = d.group_size or self.samples_per_prompt
            self.learner.add(Sample(d.prompt_id, prompt, toks, lps, d.reward, version=d.version), group_size=size)
            self._sizes[d.prompt_id] = size
            ids.append(d.sample_id)
        return ids

    def _whole(self) -> bool:
        """The current iteration has all its groups, each with the samples the controller said it trains (a group
        may have fewer than the job's: samples filtered out because their reward held the trainer)."""
        return len(self._sizes) == self.prompts_per_iteration and self.learner.count == sum(self._sizes.values())

    def _maybe_checkpoint(self) -> Callable[[], None] | None:
        """Every `checkpoint.every_iterations` and at the end: the trainer's part of the checkpoint of this
        version (policy, counters, and the optimizers and RNG of data-parallel replica 0's ranks: the other ranks
        are told through the learner's broadcasts), copied into host memory now; the write, for the background
        writer once this version's `trained` is sent (it tells the controller when the part is on disk:
        `checkpoint_written`). None when no checkpoint is due."""
        if not checkpoints_at(self.ctx.job, self.version):
            return None
        version = self.version
        # one snapshot in host memory at a time: the one before is on disk first (a wait on the disk, unwatched)
        self.writer.wait()
        t0 = time.monotonic()
        with self.watchdog.busy("checkpoint snapshot"):
            write = self._snapshot(version)
        self.snapshot_s += time.monotonic() - t0

        def written() -> None:
            t0 = time.monotonic()
            try:
                digest = write()
            except Exception as e:  # noqa: BLE001 - any failure of the write (a full disk in safetensors, a rank's
                # gather timing out) is told to the controller, which ends the job naming it: never a silent hang
                log.error("trainer: checkpoint iter-%d not written: %s: %s", version, type(e).__name__, e)
                with contextlib.suppress(TransportError):
                    self.link.send(
                        make(
                            "checkpoint_written",
                            CheckpointWritten(
                                version=version,
                                error=f"{type(e).__name__}: {e}",
                                full_dir=e.full_dir if isinstance(e, CheckpointError) else "",
                            ),
                        )
                    )
                return
            log.info("trainer: checkpoint iter-%d written in %.2f s beside training", version, time.monotonic() - t0)
            try:
                self.link.send(make("checkpoint_written", CheckpointWritten(version=version, checkpoint=digest)))
            except TransportError as e:  # the controller is gone: its part of iter-N is never written
                log.warning("trainer: checkpoint iter-%d written, the controller not told (%s): a resume uses an "
                            "earlier complete checkpoint", version, e)  # fmt: skip

        return written

    def _snapshot(self, version: int) -> Callable[[], str]:
        """The host copies of this rank's part of checkpoint `version`; returns its write (for the writer)."""
        # a sharded policy's HF directory is the version this rank published (gathered once, as its deltas)
        policy = (
            PublishedModel(
                self.publisher.node, version, self.config, timeout_s=self.ctx.job.transport.timeout_s
            ).snapshot()
            if self.data_parallel.sharded
            else HostPolicy(self.backend.weights(), self.config)
        )
        return snapshot_trainer(
            self.ctx.jobdir.checkpoint(version),
            model=policy,
            optimizers=self.learner.optimizers(),
            modules=self.modules,
            counters={"version": version},
            split=self.split,
            data_parallel=self.data_parallel,
            tokenizer_from=self.ctx.jobdir.init_model,
            announce=lambda: self.learner.announce_checkpoint(version),
            group=self.checkpoint_group,
        )


def _backend(
    job: JobFile, model_dir: Path, *, where: str, compute: Compute | None = None, reference: bool = False
) -> TrainerBackend:
    """The job's trainer backend on `model_dir`, as this rank's place in the plan's tp × pp (from the launcher).
    `torch` is data parallel whatever the plan says (one whole replica per rank), with the job's LoRA adapters
    (`trainer.lora`) unless it is the `reference`; `megatron` forms the plan's tp × pp groups and holds this rank's
    shard. What megatron cannot run here is a one-line ConfigError."""
    parallel = parallel_from_env()
    tp, pp, shard = int(parallel.get("tp", 1)), int(parallel.get("pp", 1)), bool(parallel.get("fsdp"))
    once = bool(parallel.get("reduce_per_step"))  # FSDP2 reduces the gradients once an optimizer step, not a cut
    sharding = " fsdp" * shard + " (gradients reduced once a step)" * once
    log.info("trainer backend %s, tp %d pp %d%s, on %s", job.trainer.backend, tp, pp, sharding, model_dir)
    context = job_context(job)
    if job.trainer.backend != "megatron":
        ckpt = job.trainer.activation_checkpointing
        adapters = None if reference else job.trainer.lora
        return load_backend(
            "torch",
            model_dir,
            compute=compute,
            shard=shard,
            reduce_per_step=once,
            activation_checkpointing=ckpt,
            context=context,
            adapters=adapters,
        )
    try:
        return load_backend("megatron", model_dir, tp=tp, pp=pp, compute=compute, context=context)
    except ValueError as e:  # names.check_split: tp does not divide the heads, MLP width or vocabulary; pp the layers
        field = "pipeline_parallel" if str(e).startswith("pipeline parallel") else "tensor_parallel"
        raise ConfigError(where, f"trainer.{field}", str(e)) from e


def _first_on_host() -> bool:
    """Whether this is the lowest trainer rank on its host (one collective over the trainer's group)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    hosts = all_gather_values(socket.gethostname(), str)
    return hosts.index(hosts[dist.get_rank()]) == dist.get_rank()


def _roots(address: str, *, holds: bool) -> list[str]:
    """The weight-node addresses of the ranks that hold the versions, rank 0 first (one collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [address]
    return [a for a, h in all_gather_values((address, holds), tuple[str, bool]) if h]


def _regroup(held: dict[int, deque[Held]], r: Regroup) -> None:
    """Move the samples of `r.groups` from the later iterations they were held for into `r.iteration`."""
    moving = set(r.groups)
    into = held.setdefault(r.iteration, deque())
    for it, items in held.items():
        if it == r.iteration:
            continue
        keep: deque[Held] = deque()
        for item in items:
            if item[0].prompt_id in moving:
                item[0].iteration = r.iteration
                into.append(item)
            else:
                keep.append(item)
        held[it] = keep


def _delivered(msg: Message) -> list[Delivered]:
    return msgspec.convert(msg.header["samples"], list[Delivered])


def _pairs(tensors: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(tensors[i], tensors[i + 1]) for i in range(0, len(tensors), 2)]
