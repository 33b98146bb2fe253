"""A controller mid-job whose loop does not run: the test hands it each event (`_handle`), after its trainer, two
rollout units and a client joined through the real handshake over the in-process transport. Shared by the
controller's fuzz tests and the gone-agent tests."""

from __future__ import annotations

import queue
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from rlctl.agents.controller import ControllerAgent
from rlctl.agents.controller_checkpoints import Checkpoints
from rlctl.agents.messages import Hello, make
from rlctl.config.job import JobFile
from rlctl.launch.jobdir import JobDir
from rlctl.transport import Connection, InprocTransport, Message

PEERS = ("trainer-0", "rollout-0", "rollout-1", "client-0")
RESUME = Checkpoints._resume  # (unpatched)


def small_job(name: str, *, iterations: int) -> JobFile:
    """A digits job of 2 prompts × 2 samples an iteration, one trainer and two rollout units (async)."""
    return JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": name,
            "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits", "median_output_tokens": 6, "max_output_tokens": 16},
            "iterations": iterations,
            "batch": {"prompts_per_iteration": 2, "samples_per_prompt": 2, "train_micro_batch_samples": 2},
            "pipeline": {"mode": "async"},
            "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 2}]},
            "transport": {"kind": "inproc", "timeout_s": 5},
            "warmup": {"sft_steps": 0},
        }
    )


class HandledController:
    """`job`'s controller in `root`/job, listening at `listen` (unique per test: the in-process transport's names
    are global), with PEERS joined; `ends[name]` is each peer's end of its connection."""

    def __init__(self, root: Path, job: JobFile, *, listen: str) -> None:
        self.jd = JobDir.create(job.name, explicit=root / "job")
        self.jd.write_job(job, source="test")
        self.jd.write_json(self.jd.plan_json, {"rollout": [{"site": "local", "units": 2}]})
        self.transport = InprocTransport(secret=self.jd.secret())
        self.ctl = ControllerAgent(self.jd, job, self.transport, listen=listen)
        self.ends: dict[str, Connection] = {}
        for name in PEERS:
            self.ends[name] = self.hello(name)

    def hello(self, name: str, *, version: int = 0, weight_roots: tuple[str, ...] = ()) -> Connection:
        """Agent `name` (its role: the name's first word; its weights at `w-NAME`, a trainer's ranks' at
        `weight_roots` where given) connects and says hello at `version`; the controller handles every event up to
        and with that hello (the ends of connections it closed before, too)."""
        end = self.transport.connect(self.ctl.listener.address, timeout_s=5)
        hello = Hello(
            role=name.split("-")[0],
            name=name,
            version=version,
            address=f"inproc://{name}",
            weights=weight_roots[0] if weight_roots else f"w-{name}",
            weight_roots=list(weight_roots),
        )
        end.send(make("hello", hello))
        while True:
            what, who, payload = self.ctl.inbox.get(timeout=10)
            self.ctl._handle(what, who, payload)
            if what == "hello":
                return end

    def feed(self, who: str, msg: Message) -> None:
        """`msg` from peer `who`, handled as the loop would (its readers' queue bypassed)."""
        self.ctl._handle("msg", who, (msg, time.monotonic()))

    def drain(self) -> None:
        """What the peers' readers queued (their messages were fed directly): discarded."""
        while True:
            try:
                self.ctl.inbox.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        for end in self.ends.values():
            end.close()
        self.ctl.listener.close()
        # its /metrics server stops within its poll interval (0.5 s): not waited for, one per test
        threading.Thread(target=self.ctl.metrics.close, daemon=True).start()


def resumed_measured(jd: JobDir, job: JobFile, *, listen: str, monkeypatch: Any) -> tuple[ControllerAgent, int]:
    """`job`'s controller resumed from `jd`'s checkpoint (the version in ENV_RESUME), listening at `listen` (closed
    at once), and the most memory its resume (`Checkpoints._resume`) held at once."""
    peaks: list[int] = []

    def measured(self: Checkpoints, version: int) -> None:
        tracemalloc.start()
        try:
            RESUME(self, version)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()

    monkeypatch.setattr(Checkpoints, "_resume", measured)
    ctl = ControllerAgent(jd, job, InprocTransport(secret=jd.secret()), listen=listen)
    ctl.listener.close()
    threading.Thread(target=ctl.metrics.close, daemon=True).start()
    return ctl, peaks[0]
