"""Measured training at a tensor/pipeline-parallel split: the split's tp·pp ranks run as processes, as a job's do.

    measure_split(algorithm, batch, tp=…, pp=…)     in the probe: the ranks are its children, on its host, so
      │                                             a site's launch backend (local, SLURM, SSH) runs them alike
      │ scratch dir: model/ (tiny-demo written once: every rank loads the same weights), spec.json, rendezvous
      ├─▶ tp·pp × `python -m rlctl.profiler.measure_split SPEC RANK`, OMP_NUM_THREADS=1 (a core each, as agents)
      │     gloo group (file rendezvous) ─▶ load_backend(backend, model, tp, pp), a reference too with KL
      │     ─▶ the trainer agent's learner (measure_train.make_learner): rank 0 adds the synthetic batch and
      │        steps, the other ranks follow() its broadcasts (rlctl.agents.trainer)
      │     per step: barrier ─▶ each rank's perf_counter to the end of its optimizer step, and the padded tokens
      │        of the samples it trained (measure_train.padded_tokens) ─▶ rank-R.json
      ◀── per timed step the slowest rank's seconds; figure = tp·pp × median over steps of (seconds / tokens)
    a rank that exits non-zero: every rank is stopped and its last stderr line is the RlctlError; no result
    within `timeout_s`: the ranks are stopped, RlctlError (the gloo group's timeout is as long: no hang)

Wall clock, not the thread clock of the one-rank probe (measure_train.py): a pipeline stage idles while the
others compute (each cut fills and drains rlctl's GPipe schedule, `rlctl.trainers.megatron.pipeline`) and tp
ranks wait for each other in their all-reduces; that waiting is GPU time the split costs, which only the wall
clock counts, so the figure is GPU-seconds: tp·pp ranks × the step's wall time. On a machine whose cores are
shared it also counts the sharing: the probe refuses a split with more ranks than cores it may use
(probe.check_trainer).

Which figures a profile gets (probe.measure_here, build.py): the tp 1 pp 1 entry stays the one-rank thread-clock
figure, with or without a split, because it is what a data-parallel rank costs (no waiting to count), it
does not move with other load on the machine, and the generation entries are timed on the same clock; the
split's entry is this module's wall-clock figure as measured (`pipeline_wait_included`: plan adds no bubble).
Beside it the probe measures tp 1 pp 1 with this same harness (one rank, wall clock), so the split's cost
relative to one rank is read like for like (`rlctl profile` prints the ratio; the probe's JSON keeps it).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import rlctl
from rlctl.config.algorithm import Algorithm, GrpoAlgorithm, PpoAlgorithm
from rlctl.config.base import Strict
from rlctl.config.pipeline import Batch
from rlctl.errors import RlctlError
from rlctl.exits import end_after, end_without_finalization
from rlctl.launch.agentenv import BASE_ENV
from rlctl.profiler.measure_train import TrainMeasurement

POLL_S = 0.05


class RankSpec(Strict):
    """What every rank of one measurement runs (spec.json in the scratch directory)."""

    backend: str
    model_dir: str
    tp: int
    pp: int
    algorithm: Algorithm
    batch: Batch
    steps: int
    warmup_steps: int
    rendezvous: str
    timeout_s: float

    @property
    def world(self) -> int:
        return self.tp * self.pp


def measure_split(
    algorithm: GrpoAlgorithm | PpoAlgorithm,
    batch: Batch,
    *,
    tp: int,
    pp: int,
    backend: str = "megatron",
    checkpoint: str | Path | None = None,
    steps: int = 3,
    warmup_steps: int = 1,
    timeout_s: float = 600.0,
) -> TrainMeasurement:
    """GPU-seconds per trained token of one iteration of `algorithm` at tensor parallel `tp` × pipeline parallel
    `pp`, timed by wall clock over that many rank processes (tp = pp = 1: one process, the same harness)."""
    if steps < 1 or warmup_steps < 0:
        raise ValueError("steps must be ≥ 1 and warmup_steps ≥ 0")
    from rlctl.profiler.measure_train import load_policy

    with tempfile.TemporaryDirectory(prefix="rlctl-measure-split-") as tmp:
        scratch = Path(tmp)
        model_dir = Path(checkpoint) if checkpoint is not None else load_policy(None).save_pretrained(scratch / "model")
        spec = RankSpec(
            backend=backend,
            model_dir=str(model_dir),
            tp=tp,
            pp=pp,
            algorithm=algorithm,
            batch=batch,
            steps=steps,
            warmup_steps=warmup_steps,
            rendezvous=str(scratch / "rendezvous"),
            timeout_s=timeout_s,
        )
        (scratch / "spec.json").write_text(spec.model_dump_json())
        _run_ranks(scratch, spec)
        ranks = [json.loads((scratch / f"rank-{r}.json").read_text()) for r in range(spec.world)]
    step_s = [max(r["step_s"][k] for r in ranks) for k in range(steps)]  # a step ends when its slowest rank does
    tokens: list[int] = ranks[0]["tokens"]
    per_token = statistics.median(t / n for t, n in zip(step_s, tokens, strict=True))
    return TrainMeasurement(
        spec.world * per_token,
        step_s,
        tokens,
        backend=backend,
        tp=tp,
        pp=pp,
        rank_step_s=[r["step_s"] for r in ranks],
        rank_tokens=[r["tokens"] for r in ranks],
    )


def _run_ranks(scratch: Path, spec: RankSpec) -> None:
    """Start the ranks, wait for all of them; stop every one on a failure, a timeout or an interrupt."""
    where = f"training at tp {spec.tp} pp {spec.pp}"
    # the ranks import the rlctl this process runs, whatever their working directory and installs say
    path = os.pathsep.join(p for p in (str(Path(rlctl.__file__).parents[1]), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **BASE_ENV, "PYTHONPATH": path}
    argv = [sys.executable, "-m", "rlctl.profiler.measure_split", str(scratch / "spec.json")]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(spec.world):
            with (scratch / f"rank-{r}.log").open("wb") as log:
                procs.append(subprocess.Popen([*argv, str(r)], env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + spec.timeout_s
        while (codes := [p.poll() for p in procs]) != [0] * len(procs):
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:  # the first to fail is the cause: the others then fail in a collective with it
                r = min(failed, key=lambda r: (scratch / f"rank-{r}.log").stat().st_mtime_ns)
                raise RlctlError(
                    f"{where}: rank {r} exited {codes[r]}: {_last_line(scratch / f'rank-{r}.log')}",
                    hint="the same split runs in the job's trainer: `rlctl check JOB.yaml`, then "
                    "`rlctl profile --source analytical` to plan without measuring it",
                )
            if time.monotonic() > deadline:
                raise RlctlError(
                    f"{where}: the {spec.world} rank(s) took over {spec.timeout_s:.0f} s; stopped them",
                    hint="a host busy with other work slows them; run the probe on an idle one, or "
                    "`rlctl profile --source analytical`",
                )
            time.sleep(POLL_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _last_line(log: Path) -> str:
    """The log's last line (a traceback's exception), without torch's `[rankN]:` prefix."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return re.sub(r"^\[rank\d+\]:\s*", "", lines[-1].strip()) if lines else "no output"


def run_rank(spec: RankSpec, rank: int) -> dict[str, list[float] | list[int]]:
    """One rank: the trainer agent's backend and learner at the split, timed step by step (see the docstring)."""
    import torch
    import torch.distributed as dist

    from rlctl.models.hf import read_config
    from rlctl.profiler.measure_train import SampleLengths, padded_tokens, synthetic_samples
    from rlctl.rl.learner import StreamingLearner, make_learner
    from rlctl.rl.samples import Sample
    from rlctl.trainers.base import load_backend

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    dist.init_process_group(
        "gloo", init_method=f"file://{spec.rendezvous}", rank=rank, world_size=spec.world, timeout=timeout
    )
    config = read_config(spec.model_dir)
    lengths = SampleLengths.of(config, model=spec.model_dir)  # (as the one-rank probe's: measure_train)
    policy = load_backend(spec.backend, spec.model_dir, tp=spec.tp, pp=spec.pp, context=lengths.context)
    ref = (
        load_backend(spec.backend, spec.model_dir, tp=spec.tp, pp=spec.pp, context=lengths.context).model
        if spec.algorithm.kl_coef > 0
        else None
    )
    learner = make_learner(
        policy,
        spec.algorithm,
        spec.batch,
        ref=ref,
        iterations=spec.warmup_steps + spec.steps,
        max_output_tokens=lengths.output_tokens[1],  # the synthetic samples' longest (`loss_aggregation: constant`)
    )
    vocab = config.vocab_size

    trained: list[Sample] = []  # the samples of the micro-batches this rank trained since its last step (the
    # learner's own code path, counted: GRPO's shares as they stream in, PPO's whole batch at the step; dp is 1 here),
    # whose padded tokens the step is per (`measure_train.padded_tokens`, as the one-rank probe counts them)
    if isinstance(learner, StreamingLearner):
        share = learner.backward_share

        def counted(chunk: list[tuple[Sample, float]], *, reduce: bool = True) -> None:
            trained.extend(s for s, _ in chunk)
            share(chunk, reduce=reduce)

        learner.backward_share = counted  # type: ignore[method-assign]
    else:
        whole = learner.train_batch

        def counted_batch(samples: list[Sample]) -> dict[str, float]:
            trained.extend(samples)
            return whole(samples)

        learner.train_batch = counted_batch  # type: ignore[method-assign]
    step_s: list[float] = []
    tokens: list[int] = []
    t0 = 0.0

    def start() -> None:  # every rank leaves the barrier together: a step's clocks start at once
        nonlocal t0
        dist.barrier()
        t0 = time.perf_counter()

    def stepped() -> None:
        step_s.append(time.perf_counter() - t0)
        tokens.append(padded_tokens(trained, spec.batch))
        trained.clear()

    if rank == 0:
        for i in range(spec.warmup_steps + spec.steps):
            samples = synthetic_samples(
                prompts=spec.batch.prompts_per_iteration,
                group_size=spec.batch.samples_per_prompt,
                vocab=vocab,
                seed=i,
                lengths=lengths,
            )
            start()
            for s in samples:  # as the trainer hands them over (measure_train._time_steps)
                learner.add(s)
                learner.train_ready()
            learner.step()
            stepped()
        dist.barrier()  # the followers' barrier after their last step
        learner.stop_followers()
    else:
        start()

        def follower_stepped() -> None:
            stepped()
            start()

        learner.follow(on_step=follower_stepped)
    dist.destroy_process_group()
    return {"step_s": step_s[spec.warmup_steps :], "tokens": tokens[spec.warmup_steps :]}


def main(argv: list[str]) -> int:
    spec_file, rank = Path(argv[0]), int(argv[1])
    spec = RankSpec.model_validate_json(spec_file.read_text())
    out = spec_file.with_name(f"rank-{rank}.json")
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(run_rank(spec, rank)))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    # a rank ends without the interpreter's finalization however main left (its figures written, or an error): the
    # gloo thread freeing the last collective would abort it (rlctl.exits)
    end_after(lambda: main(sys.argv[1:]), end=end_without_finalization)
