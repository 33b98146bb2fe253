"""The task as the agents see it: where a job's prompts come from and how its samples are scored.

    controller: rl_prompts(iteration, n) ─▶ dispatch (prompt ids p<position>, token ids, known lengths)
    controller: refill_prompt(iteration, n, j) ─▶ a group in place of a dropped one (dynamic sampling)
    controller: score(sample_id, prompt_id, output) ─▶ Future[score] (as samples arrive, beside it)
    controller: heldout(n), score_heldout(key, outputs) ─▶ Future[HeldoutScores] (evaluation during the run)
    trainer:    prompt_tokens(prompt_id)

Two implementations behind one interface: the built-in digits task (prompts from a seeded stream,
the rule-based verifier scoring in-line) and a user dataset (`task: {kind: dataset}`: prompts tokenized
once at launch into the job directory's `data/`, rewards from the user's function in a pool of worker
processes, failures scored as configured and counted). Both derive a prompt from its id alone, so the
controller and the trainer agree without sending prompts around, and a resume needs no loader state.
"""

from __future__ import annotations

import functools
import re
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.config.job import JobFile
from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.errors import ConfigError
from rlctl.rl.reward import RewardResult
from rlctl.rl.reward_pool import RewardPool, RewardStats

if TYPE_CHECKING:
    from rlctl.rl.dataset import DataPrompt
    from rlctl.rl.tasks import Prompt

DATA_DIR = "data"  # in the job directory: the tokenized prompts (rlctl.rl.dataset)
HELDOUT_DIR = "data-heldout"  # in the job directory: the tokenized held-out prompts of a dataset task (evaluation)
REWARD_DIR = "reward"  # in the job directory: the user's reward file, copied at launch
PROMPT_CACHE = 4096  # demo prompts kept by a DigitsSource (a few iterations' worth)
EXTRAS_KEPT = 1 << 16  # samples whose reward's extra figures wait for their iteration's row (never trained: dropped)


@dataclass(frozen=True)
class HeldoutScores:
    """Greedy outputs of held-out prompts, scored as the end-of-job evaluation scores them (no shaping)."""

    reward: float  # mean reward
    exact: float | None  # digits: fraction answered exactly (then EOS); None for a dataset task
    prompts: int
    failures: int = 0  # reward calls scored `reward_on_error`
    # mean reward per data_source where the prompts have more than one (a mixed job: GSM8K + MATH); else None
    by_source: dict[str, float] | None = None


def by_source(sources: list[str], scores: list[float]) -> dict[str, float] | None:
    """The mean of `scores` per data_source (`sources[i]` is the source of `scores[i]`), sources sorted, each
    rounded as the overall figure; None where the prompts have one source (the overall figure says it all): a mean
    over a mixed held-out file hides one dataset improving while another regresses (verl's
    `val/test_score/<data_source>`)."""
    groups: dict[str, list[float]] = {}
    for src, x in zip(sources, scores, strict=True):
        groups.setdefault(src, []).append(x)
    return {k: round(sum(v) / len(v), 4) for k, v in sorted(groups.items())} if len(groups) > 1 else None


def source_key(data_source: str) -> str:
    """A data_source as one metric name's part (`openai/gsm8k` → `openai_gsm8k`): letters, digits, `_`, `.`
    and `-` only, versus a `/` that nests W&B's panels and a name Prometheus or TensorBoard refuses."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", data_source) or "_"


BY_SOURCE = "greedy_reward_by_source"  # an evaluations.jsonl row's means per data_source (rows of 2+ sources)


def heldout_view(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first and the last held-out evaluation of a run's rows (`evaluations.jsonl`; None before the first):
    the controller's summary and `rlctl status` read it. A row's means per data_source where it has them (a mixed
    job's), as `rlctl status` shows them beside the mean."""
    keys = ("version", "greedy_reward", "greedy_exact", "prompts", "reward_failures")
    rows = sorted(rows, key=lambda r: int(r["version"]))  # written as their scores came back

    def view(r: dict[str, Any]) -> dict[str, Any]:
        return {k: r.get(k) for k in keys} | ({BY_SOURCE: r[BY_SOURCE]} if isinstance(r.get(BY_SOURCE), dict) else {})

    return {"first": view(rows[0]), "last": view(rows[-1])} if rows else None


@dataclass(frozen=True)
class RlPrompt:
    prompt_id: str
    tokens: list[int]
    target_tokens: int | None  # the true output length when the task knows it (digits); else None


class TaskSource(ABC):
    """Prompts and scores of one job's task."""

    max_new_tokens: int
    eos_ids: tuple[int, ...] = ()  # () = the model's own
    shaping: tuple[int, float] = (0, 0.0)  # the task's (overlong_buffer_tokens, overlong_penalty)

    @abstractmethod
    def rl_prompts(self, iteration: int, n: int) -> list[RlPrompt]: ...

    @abstractmethod
    def refill_prompt(self, iteration: int, n: int, j: int) -> RlPrompt:
        """The j-th prompt drawn for RL iteration `iteration` beyond its n (dynamic sampling): none of any
        iteration's own, the same for the same arguments."""

    @abstractmethod
    def prompt_tokens(self, prompt_id: str) -> list[int]: ...

    @abstractmethod
    def score(self, sample_id: str, prompt_id: str, output_tokens: list[int]) -> Future[float]: ...

    def cancel_score(self, sample_id: str) -> None:
        """The score of `sample_id` is not wanted any more (its future may be cancelled)."""
        return None

    def heldout(self, n: int) -> list[RlPrompt]:
        """The first n held-out prompts (`evaluation`): those the end-of-job evaluation decodes."""
        raise ConfigError("job.json", "evaluation.heldout_prompts", "this task has no held-out prompts")

    def score_heldout(self, key: str, outputs: list[list[int]]) -> Future[HeldoutScores]:
        """The figures of `outputs[i]`, the output for `heldout(n)[i]` (`key` names the calls: one evaluation)."""
        raise ConfigError("job.json", "evaluation.heldout_prompts", "this task has no held-out prompts")

    def length_penalty(self, output_tokens: int) -> float:
        """DAPO's soft overlong punishment, part of every score: 0 up to `max_new_tokens` − buffer, then linear
        down to −penalty at `max_new_tokens` (and below it, for an output the engine let run longer)."""
        buffer, penalty = self.shaping
        buffer = min(buffer, self.max_new_tokens)  # (the digits task may cap its outputs below max_output_tokens)
        start = self.max_new_tokens - buffer
        if not buffer or output_tokens <= start:
            return 0.0
        return -penalty * min(output_tokens - start, buffer) / buffer

    def origin(self, prompt_id: str) -> str | None:
        """Where the prompt is in the user's data ("data.jsonl line 3"), for an operator; None: a generated one."""
        return None

    def reward_stats(self) -> RewardStats:
        return RewardStats()

    def reward_extras(self, sample_ids: Iterable[str]) -> dict[str, float]:
        """The mean of each extra figure a dict reward returned beside 'score' (verl's reward_extra_info) over
        `sample_ids` (an iteration's trained samples) that have it; their figures are forgotten."""
        return {}

    def reward_failure(self) -> str | None:
        """Why the task's rewards cannot be scored any more (its reward pool failed, its calls cancelled), or None."""
        return None

    def close(self) -> None:
        return None


def _done(value: float) -> Future[float]:
    f: Future[float] = Future()
    f.set_result(value)
    return f


def _position(prompt_id: str) -> int:
    return int(prompt_id[1:])


class DigitsSource(TaskSource):
    """The demo task: its verifier scores at once (microseconds: no pool needed)."""

    def __init__(self, cfg: DigitsTask) -> None:
        from rlctl.rl.tasks import DigitsTask as Digits

        self.task = Digits(cfg)
        self.max_new_tokens = self.task.max_new_tokens
        self.shaping = cfg.shaping
        # a prompt is drawn from its own generator (≈ 0.1 ms); its samples ask for it again and again (every
        # sample's reward and tokens on the trainer): the recent ones are kept
        self._prompt = functools.lru_cache(maxsize=PROMPT_CACHE)(self.task.prompt)
        self._held: list[Prompt] = []  # the held-out prompts `heldout` gave

    def rl_prompts(self, iteration: int, n: int) -> list[RlPrompt]:
        return [RlPrompt(p.prompt_id, p.tokens, p.target_tokens) for p in self.task.rl_prompts(iteration, n)]

    def refill_prompt(self, iteration: int, n: int, j: int) -> RlPrompt:
        from rlctl.rl.tasks import rl_index

        p = self._prompt(rl_index(iteration, n + j))  # the iteration's own numbers, past its n prompts
        return RlPrompt(p.prompt_id, p.tokens, p.target_tokens)

    def bootstrap(self, n: int) -> tuple[list[list[int]], list[int]]:
        """(prompt tokens, true output lengths) of n prompts outside the RL stream, to pre-fit the ranker."""
        prompts = self.task.prompts(0, n)
        return [p.tokens for p in prompts], [p.target_tokens for p in prompts]

    def prompt_tokens(self, prompt_id: str) -> list[int]:
        return list(self._prompt(_position(prompt_id)).tokens)

    def score(self, sample_id: str, prompt_id: str, output_tokens: list[int]) -> Future[float]:
        reward = self.task.reward(self._prompt(_position(prompt_id)), output_tokens)
        return _done(reward + self.length_penalty(len(output_tokens)))

    def heldout(self, n: int) -> list[RlPrompt]:
        self._held = self.task.heldout_prompts(n)
        return [RlPrompt(p.prompt_id, p.tokens, p.target_tokens) for p in self._held]

    def score_heldout(self, key: str, outputs: list[list[int]]) -> Future[HeldoutScores]:
        from rlctl.rl.evaluate import score_outputs

        held = self._held[: len(outputs)]
        f = score_outputs(self.task, held, {p.prompt_id: o for p, o in zip(held, outputs, strict=True)})
        done: Future[HeldoutScores] = Future()
        done.set_result(HeldoutScores(f.reward, f.exact, f.prompts))
        return done


class DatasetSource(TaskSource):
    """A user dataset prepared in `job_dir/data`; rewards from the user's function (when `scoring`)."""

    def __init__(
        self, cfg: DatasetTask, job_dir: Path, model_dir: Path, *, scoring: bool, heldout_path: str | None = None
    ) -> None:
        from rlctl.rl.dataset import load_dataset
        from rlctl.rl.tokenizer import load_tokenizer

        self.cfg = cfg
        self.job_dir, self.heldout_path = job_dir, heldout_path
        self._held: list[DataPrompt] = []
        self.data = load_dataset(job_dir / DATA_DIR, cfg)
        self.tokenizer = load_tokenizer(model_dir)
        self.eos_ids = self.tokenizer.eos_ids
        self.max_new_tokens = self.data.max_new_tokens
        self.shaping = cfg.shaping
        # the controller's: it waits for a worker to load the function, so that one that cannot (an import error
        # on this host) ends the job now, before any generation, as a config error — not at its first sample
        self.pool = self._pool(cfg.reward_workers, wait=True) if scoring else None
        # the held-out evaluations' calls: a worker of their own, so that they never queue ahead of the training
        # samples' (whose late rewards would hold the trainer) and stay out of the training figures
        self.heldout_pool: RewardPool | None = None
        self._extras: OrderedDict[str, dict[str, float]] = OrderedDict()  # sample id → its reward's extra figures
        self._extras_lock = threading.Lock()  # (set by the pool's thread, read by the controller's)

    def _pool(self, workers: int, *, loaded: bool = False, wait: bool = False) -> RewardPool:
        """A pool of the job's reward function; `wait`: once a worker has loaded it, else a ConfigError (one line
        naming the function and why it cannot be loaded), within the pool's deadline for a start."""
        c = self.cfg
        try:
            return RewardPool(
                c.reward,
                base_dir=self.job_dir,
                workers=workers,
                timeout_s=c.reward_timeout_s,
                on_error=c.reward_on_error,
                load_retry_s=c.reward_load_timeout_s,
                loaded=loaded,
                wait=wait,
            )
        except ValueError as e:
            raise ConfigError("job.json", "task.reward", str(e)) from e

    def rl_prompts(self, iteration: int, n: int) -> list[RlPrompt]:
        return [RlPrompt(p.prompt_id, p.tokens, None) for p in self.data.rl_prompts(iteration, n)]

    def refill_prompt(self, iteration: int, n: int, j: int) -> RlPrompt:
        p = self.data.refill_prompt(iteration, j)
        return RlPrompt(p.prompt_id, p.tokens, None)

    def prompt_tokens(self, prompt_id: str) -> list[int]:
        return self.data.prompt(_position(prompt_id)).tokens

    def origin(self, prompt_id: str) -> str | None:
        return f"{self.cfg.path} {self.data.prompt(_position(prompt_id)).source_row}"

    def score(self, sample_id: str, prompt_id: str, output_tokens: list[int]) -> Future[float]:
        from rlctl.rl.dataset import submit_reward

        assert self.pool is not None, "this source was built without scoring"
        prompt = self.data.prompt(_position(prompt_id))
        result = submit_reward(
            self.pool,
            self.tokenizer,
            sample_id=sample_id,
            prompt=prompt,
            output_tokens=output_tokens,
            data_path=self.cfg.path,
        )
        out: Future[float] = Future()
        penalty = self.length_penalty(len(output_tokens))

        def done(f: Future[RewardResult]) -> None:  # a call the pool cancelled (it closed) is cancelled here too
            if f.cancelled():
                out.cancel()
                out.set_running_or_notify_cancel()
            else:
                r = f.result()
                if r.extra:
                    with self._extras_lock:
                        self._extras[sample_id] = r.extra
                        if len(self._extras) > EXTRAS_KEPT:
                            self._extras.popitem(last=False)
                out.set_result(r.score + penalty)

        result.add_done_callback(done)
        return out

    def cancel_score(self, sample_id: str) -> None:
        if self.pool is not None:
            self.pool.cancel(sample_id)
        with self._extras_lock:
            self._extras.pop(sample_id, None)

    def heldout(self, n: int) -> list[RlPrompt]:
        """The first n rows of `evaluation.path`, as launch prepared them into data-heldout/."""
        from rlctl.rl.dataset import load_dataset

        if self.heldout_path is None:
            super().heldout(n)
        data = load_dataset(self.job_dir / HELDOUT_DIR, heldout_task(self.cfg, str(self.heldout_path)))
        self._held = [data.prompt(i) for i in range(min(n, len(data)))]
        return [RlPrompt(f"h{i}", p.tokens, None) for i, p in enumerate(self._held)]

    def score_heldout(self, key: str, outputs: list[list[int]]) -> Future[HeldoutScores]:
        from rlctl.rl.dataset import submit_reward

        assert self.pool is not None, "this source was built without scoring"
        if self.heldout_pool is None:  # started days into a job: the function loaded in the training pool already,
            # so a start that fails now (a stale NFS handle) is retried, not taken for a config error
            self.heldout_pool = self._pool(1, loaded=True)
        calls = [
            submit_reward(
                self.heldout_pool,
                self.tokenizer,
                sample_id=f"{key}#{i}",
                prompt=p,
                output_tokens=o,
                data_path=self.heldout_path,
            )
            for i, (p, o) in enumerate(zip(self._held, outputs, strict=False))
        ]
        out: Future[HeldoutScores] = Future()
        left = [len(calls)]
        lock = threading.Lock()

        def one(_: Future[RewardResult]) -> None:  # the last call to end sets the figures (a cancelled one: 0)
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            results = [c.result() for c in calls if not c.cancelled()]
            if len(results) < len(calls):  # the pool closed: the job is ending
                out.cancel()
                out.set_running_or_notify_cancel()
                return
            scores = [r.score for r in results]
            out.set_result(
                HeldoutScores(
                    sum(scores) / len(results),
                    None,
                    len(results),
                    sum(not r.ok for r in results),
                    by_source([p.data_source for p in self._held[: len(results)]], scores),
                )
            )

        if not calls:
            out.set_result(HeldoutScores(0.0, None, 0))
        for c in calls:
            c.add_done_callback(one)
        return out

    def reward_stats(self) -> RewardStats:
        return self.pool.stats if self.pool is not None else RewardStats()

    def reward_extras(self, sample_ids: Iterable[str]) -> dict[str, float]:
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        with self._extras_lock:
            for sid in sample_ids:
                for k, v in self._extras.pop(sid, {}).items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        return {k: sums[k] / counts[k] for k in sorted(sums)}

    def reward_failure(self) -> str | None:
        """Why a reward pool stopped for good (the job then fails naming it): the training pool's, or the held-out
        evaluation's (else its evaluations would stop without a word for the rest of the job)."""
        for pool, what in ((self.pool, ""), (self.heldout_pool, "held-out evaluation: ")):
            if pool is not None and pool.failed is not None:
                return what + pool.failed
        return None

    def close(self) -> None:
        for pool in (self.pool, self.heldout_pool):
            if pool is not None:
                pool.close()


def heldout_task(task: DatasetTask, path: str) -> DatasetTask:
    """The task's settings for its held-out file (`evaluation.path`): the same keys and limits, rows in file order."""
    return task.model_copy(update={"path": path, "shuffle": False})


def stop_ids(job: JobFile, model_dir: Path) -> tuple[int, ...]:
    """The token ids that end a generation: the tokenizer's EOS ids for a dataset job (its generation
    config may name more than the model's config), else () = the model's own."""
    if isinstance(job.task, DatasetTask):
        from rlctl.rl.tokenizer import load_tokenizer

        return load_tokenizer(model_dir).eos_ids
    return ()


def task_source(job: JobFile, job_dir: Path, model_dir: Path, *, scoring: bool = False) -> TaskSource:
    """The job's task as a source of prompts (and scores, `scoring`: beside the controller)."""
    task = job.task
    if isinstance(task, DigitsTask):
        return DigitsSource(task)
    if isinstance(task, DatasetTask):
        return DatasetSource(task, job_dir, model_dir, scoring=scoring, heldout_path=job.evaluation.path)
    raise ConfigError("job.json", "task", f"kind {task.kind!r} describes a workload for planning; it has no prompts")
