"""Held-out evaluation during the run (`evaluation.every_iterations: K`): which version to evaluate, on which unit,
and what became of each (`EvalSchedule`, without I/O), and the controller's side of it (`Evaluator`).

    a unit holds version v (it joined at v, or applied it) and some due version d ≤ v is not asked yet
         │   due: 0, K, 2K, … and the job's last version, from the version the run started at
         ▼
    evaluate(v) ──▶ that unit: the held-out prompts, greedy, admitted before its rollout work
         │                                     (rlctl.agents.rollout; a unit that skipped d answers for v)
         ▼
    evaluated(v, outputs, versions min..max) ──▶ scored by the task's reward (its own worker) ──▶ one row (`row`):
         evaluations.jsonl, trackers eval/*, gauges rlctl_eval_*, `rlctl status`

The figures are those of greedy decoding, as the end-of-job evaluation's (rlctl.rl.evaluate), on the same
prompts. A version applied while the unit decodes shows as versions [v, v′] in the row: the unit swaps weights
between decode steps, as it does for its rollout work. An evaluation whose unit is lost, retired or reconnected
before it answers is asked again (`lost`: its `evaluate` or answer may have gone with the old connection) of the
next unit to hold that version or a later one (the same unit, reconnected, answers from the decoding it had).
Rows are written as their scores come back: readers order them by version. A job that is done waits for its last
version's row while a unit decodes it or it is scored (FINAL_EVALUATION_WAIT_S at most), as it waits for the
units' final weights; an earlier version's still decoding then is left unanswered.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rlctl.agents.coretypes import Out
from rlctl.agents.messages import EvalRequest, Evaluate, Evaluated, parse
from rlctl.checkpoint.cut import cut_rows
from rlctl.launch.jobdir import JobDir, row_count
from rlctl.metrics import JobMetrics
from rlctl.rl.source import HeldoutScores, RlPrompt, TaskSource, source_key
from rlctl.textutil import one_line
from rlctl.tracking import Tracker
from rlctl.transport import Message

log = logging.getLogger(__name__)


@dataclass
class Asked:
    unit: str
    at: float  # the controller's clock when it asked
    covers: list[int]  # the due versions it answers for (a unit that skipped some answers for them too)


@dataclass
class DoneVersions:
    """The versions evaluated (or lost, or refused): every version ≤ `upto`, and those above it in `above`. A job of
    weeks evaluates 10⁴ versions and more: one number each, held for the whole job, versus those above the lowest
    that a lost unit can make due again (`EvalSchedule.settle`)."""

    upto: int = -1
    above: set[int] = field(default_factory=set)

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and (version <= self.upto or version in self.above)

    def add(self, version: int) -> None:
        if version > self.upto:
            self.above.add(version)

    def update(self, versions: Iterable[int]) -> None:
        for v in versions:
            self.add(v)

    def difference_update(self, versions: Iterable[int]) -> None:
        for v in versions:
            assert v > self.upto, f"v{v} is below the versions done for good (≤ {self.upto})"
            self.above.discard(v)

    def below(self, version: int) -> None:
        """Every version below `version` is done for good: none is asked again, and none is due again."""
        if version - 1 > self.upto:
            self.upto = version - 1
            self.above = {v for v in self.above if v >= version}


@dataclass
class EvalSchedule:
    every: int  # K
    last: int  # the job's last version (its iteration count)
    prompts: list[RlPrompt]
    max_new_tokens: int
    done: DoneVersions = field(default_factory=DoneVersions)  # evaluated (or lost, or refused): never asked again
    asked: dict[int, Asked] = field(default_factory=dict)  # version → the unit decoding it
    floor: int = 0  # due versions below this are not evaluated (a resumed run: evaluated before it failed)
    low: int = -1  # every due version below this is done (or below the floor): where `_due_versions` starts
    # more evaluations than this lost with their unit in a row stop the evaluation (`lost`; 0: never stops)
    max_lost: int = 0
    lost_in_a_row: int = 0
    stopped: bool = False

    def due(self, version: int) -> bool:
        """Some due version ≤ `version` has not been asked for (or done) yet."""
        return not self.stopped and any(
            d not in self.done and d not in self.asked for d in self._due_versions(upto=version)
        )

    def _next_due(self, d: int) -> int:
        """The first due version after `d` (past the last: last + 1)."""
        return self.last + 1 if d >= self.last else min((d // self.every + 1) * self.every, self.last)

    def _due_versions(self, *, upto: int) -> list[int]:
        """The due versions ≥ the floor and ≤ `upto` that may not be done, from the lowest not done on."""
        if self.low < 0:
            self.low = min(-(-self.floor // self.every) * self.every, self.last)
        while self.low <= self.last and self.low in self.done:
            self.low = self._next_due(self.low)
        self.settle()
        out = list(range(self.low, min(upto, self.last) + 1, self.every)) if self.low < self.last else []
        if upto >= self.last >= self.low and self.last not in out:
            out.append(self.last)
        return out

    def settle(self) -> None:
        """Let `done` hold the versions below both `low` and every version an evaluation in flight answers for as one
        number: only `lost` makes a version done due again (one of those it covers), and `low` goes no lower then."""
        if self.low >= 0:
            self.done.below(min([self.low, *(d for a in self.asked.values() for d in a.covers)]))

    def ask(self, unit: str, version: int, *, now: float) -> Evaluate | None:
        """The message that asks `unit`, which holds `version`, to evaluate it; None when no version ≤ it is due.
        Every due version ≤ `version` is then taken: one evaluation answers for the versions the unit skipped (or,
        when another unit decodes `version` already, that unit's: None)."""
        if not self.due(version):
            return None
        covers = [d for d in self._due_versions(upto=version) if d not in self.done and d not in self.asked]
        self.done.update(d for d in covers if d != version)
        if version in self.asked:  # another unit decodes this version already: its answer covers these too
            self.asked[version].covers.extend(covers)
            return None
        self.asked[version] = Asked(unit, now, covers)
        pairs = zip(self.request_ids(version), self.prompts, strict=True)
        return Evaluate(version, [EvalRequest(i, p.tokens, self.max_new_tokens) for i, p in pairs])

    def redo(self, versions: list[int]) -> None:
        """Due versions below the floor whose evaluation a run before asked for and never wrote (it failed while a
        unit decoded it, or its row was set aside with the versions past the checkpoint): due again. Their weights
        are gone (units hold the checkpoint's version, or later), so the first unit to hold one evaluates that
        version in their place, as a unit that skipped a due version does. The others below the floor stay done."""
        if not versions:
            return
        first = min(versions)
        assert first > self.done.upto, "redo comes before the schedule is asked anything"
        self.done.update(d for d in range(first, self.floor, self.every) if d not in versions)
        self.low = first

    def request_ids(self, version: int) -> list[str]:
        """The ids of the requests that evaluate `version`, in the held-out prompts' order."""
        return [f"eval-v{version}-{i}" for i in range(len(self.prompts))]

    def answered(self, version: int) -> Asked | None:
        """The unit answered `version` (its outputs, or why it could not): what was asked, None if nothing was."""
        asked = self.asked.pop(version, None)
        if asked is not None:
            self.done.add(version)
            self.lost_in_a_row = 0
        return asked

    def lost(self, unit: str) -> list[int]:
        """`unit` is gone (or its connection, with what it was asked or answered): the versions it was evaluating.
        The due versions they answered for are due again: the next unit to hold one (or a later version) is asked."""
        gone = [v for v, a in self.asked.items() if a.unit == unit]
        for v in gone:
            covers = self.asked.pop(v).covers
            self.done.difference_update(covers)
            self.low = min([self.low, *covers])
        if gone:
            self.lost_in_a_row += 1
            # a held-out prompt that crashes the engine would take down every unit asked, for ever (the rollout
            # work's suspects run alone to be told apart: ControllerCore._blame; here the evaluation just stops)
            if self.max_lost and self.lost_in_a_row > self.max_lost:
                self.stopped = True
        return gone

    def holds(self, unit: str) -> bool:
        """`unit` is decoding an evaluation."""
        return any(a.unit == unit for a in self.asked.values())


def row(
    version: int,
    scores: HeldoutScores,
    *,
    unit: str,
    versions: tuple[int, int],
    seconds: float,
    wall_time: float,
) -> dict[str, Any]:
    """The evaluations.jsonl row of one evaluation."""
    out: dict[str, Any] = {
        "version": version,
        "greedy_reward": round(scores.reward, 4),
        "prompts": scores.prompts,
        "unit": unit,
        "versions": list(versions),
        "seconds": round(seconds, 3),
        "wall_time": round(wall_time, 3),
    }
    if scores.exact is not None:
        out["greedy_exact"] = round(scores.exact, 4)
    if scores.failures:
        out["reward_failures"] = scores.failures
    if scores.by_source:  # (a job of one data_source: its row as it was)
        out["greedy_reward_by_source"] = scores.by_source
    return out


class Evaluator:
    """The controller's side of it: asks units (`unit_at`), scores their answers in the task's reward workers,
    writes the rows. `post(kind, key, payload)` hands a finished score back to the controller's loop; `step()` is
    the trackers' current step (a row is logged at the iteration that made its version, or later: W&B takes no
    step below its last; `eval/version` says which)."""

    def __init__(
        self,
        schedule: EvalSchedule,
        *,
        task: TaskSource,
        jobdir: JobDir,
        tracker: Tracker,
        metrics: JobMetrics,
        post: Callable[[str, Any, Any], None],
        step: Callable[[], int],
        rows: Generator[dict[str, Any], None, None],
    ) -> None:
        self.schedule, self.task, self.jobdir, self.tracker, self.metrics = schedule, task, jobdir, tracker, metrics
        self.post, self.step = post, step
        # of evaluations.jsonl's rows (a resumed run's kept ones, taken one at a time as `cut_evaluations` reads them:
        # versus all of them held at once), those the views read (`heldout_view`): the first and the last by version,
        # versus every row of the job (one per version evaluated, each status sorted)
        self.rows: list[dict[str, Any]] = []
        self.scoring: set[int] = set()  # versions whose outputs the reward workers are scoring
        self.decoded_since_row = False  # a unit decoded an evaluation since the last iteration's row (`overlapped`)
        self.shown = -1  # the version the gauges show (evaluations of two units may end out of order)
        written: set[int] = set()
        # closed here: a raise partway (a gauge, an interrupt) ends the cut now, its temporary files removed and the
        # log as it was, versus when the garbage collector took the generator (the raise's traceback holds it)
        with contextlib.closing(rows):
            for r in rows:
                self.rows = _ends([*self.rows, r])
                written.add(int(r["version"]))
                schedule.done.add(int(r["version"]))
                self._gauges(r)
        events = jobdir.iter_events("evaluation_asked", "evaluation_failed")
        self.redone = set(unwritten(events, written, below=schedule.floor))
        schedule.redo(sorted(self.redone))

    def unit_at(self, unit: str, version: int) -> list[Out]:
        """`unit` holds `version` (it joined, or applied it): ask it to evaluate when a version is due."""
        ev = self.schedule.ask(unit, version, now=time.monotonic())
        if ev is None:
            return []
        covers = self.schedule.asked[version].covers
        self.jobdir.event("evaluation_asked", agent=unit, version=version, prompts=len(ev.requests), covers=covers)
        redone = [d for d in covers if d in self.redone]
        if redone:
            self.redone.difference_update(redone)
            names = ", ".join(f"v{d}" for d in redone)
            why = (
                f"asked before the run failed and never written; its weights are gone: the run resumed from "
                f"checkpoint v{self.schedule.floor}"
            )
            log.warning("controller: v%d is evaluated in place of %s (%s)", version, names, why)
            self.jobdir.event("evaluation_in_place", agent=unit, version=version, of=redone, why=why)
        self.decoded_since_row = True
        return [Out(unit, "evaluate", msgspec.to_builtins(ev))]

    def answered(self, unit: str, msg: Message) -> None:
        """A unit's `evaluated`: its outputs go to the reward workers; the figures come back through `post`."""
        ev = parse(msg, Evaluated)
        asked = self.schedule.asked.get(ev.version)
        if asked is None or asked.unit != unit:
            log.warning("controller: dropped evaluated v%d from %s: not asked of it", ev.version, unit)
            return
        self.schedule.answered(ev.version)
        asked_ids = self.schedule.request_ids(ev.version)
        error = ev.error or (
            "" if ev.ids == asked_ids else f"answered {len(ev.ids)} requests, not the {len(asked_ids)} asked"
        )
        if error:
            log.warning("controller: %s could not evaluate v%d: %s", unit, ev.version, error)
            self.jobdir.event("evaluation_failed", agent=unit, version=ev.version, error=error)
            return
        flat = msg.tensors[0].tolist()
        outputs, at = [], 0
        for n in ev.lengths:
            outputs.append(flat[at : at + n])
            at += n
        try:
            done = self.task.score_heldout(f"eval-v{ev.version}", outputs)
        except (IndexError, KeyError, ValueError) as e:  # a token id the task cannot decode: the unit's fault
            log.warning("controller: the evaluation of v%d from %s cannot be scored: %s", ev.version, unit, e)
            self.jobdir.event("evaluation_failed", agent=unit, version=ev.version, error=f"{type(e).__name__}: {e}")
            return
        self.scoring.add(ev.version)
        versions = (ev.version_min, ev.version_max)

        def scored(f: Future[HeldoutScores]) -> None:
            self.post("eval_scored", ev.version, None if f.cancelled() else (f.result(), unit, versions, asked.at))

        done.add_done_callback(scored)

    def overlapped(self) -> bool:
        """A unit decoded an evaluation since the last call (an iteration's row): that iteration's generation
        shared the units with it (the rebalance rule leaves it out)."""
        was = self.decoded_since_row or bool(self.schedule.asked)
        self.decoded_since_row = bool(self.schedule.asked)
        return was

    @property
    def pending(self) -> bool:
        """A unit is decoding the job's last version's evaluation, or an evaluation is being scored."""
        return self.schedule.last in self.schedule.asked or bool(self.scoring)

    def scored(self, version: int, payload: tuple[HeldoutScores, str, tuple[int, int], float] | None) -> None:
        """An evaluation's figures (None: its reward calls were cancelled, the job is ending): its row."""
        self.scoring.discard(version)
        if payload is None:
            return
        scores, unit, versions, at = payload
        r = row(version, scores, unit=unit, versions=versions, seconds=time.monotonic() - at, wall_time=time.time())
        self.rows = _ends([*self.rows, r])
        self.jobdir.append(self.jobdir.evaluations, r)
        figures = {"eval/greedy_reward": r["greedy_reward"], "eval/version": float(version)}
        if "greedy_exact" in r:
            figures["eval/greedy_exact"] = r["greedy_exact"]
        for src, x in r.get("greedy_reward_by_source", {}).items():
            figures[f"eval/greedy_reward/{source_key(src)}"] = x
        self.tracker.log(max(version - 1, self.step()), figures)  # version v: what iteration v − 1 trained
        self._gauges(r)
        log.info(
            "controller: held-out v%d on %s: greedy reward %.4f%s over %d prompts",
            version,
            unit,
            r["greedy_reward"],
            f", exact {r['greedy_exact']:.4f}" if "greedy_exact" in r else "",
            r["prompts"],
        )
        for src, x in r.get("greedy_reward_by_source", {}).items():  # (rows of 2+ sources: a regressing one is seen)
            # (the source as the rows wrote it, its line breaks and control characters escaped: one line each)
            log.info("controller: held-out v%d, data_source %s: greedy reward %.4f", version, one_line(src), x)

    def lost(self, unit: str) -> None:
        was = self.schedule.stopped
        for v in self.schedule.lost(unit):
            log.warning("controller: the evaluation of v%d was lost with %s; it is asked again", v, unit)
            self.jobdir.event("evaluation_lost", agent=unit, version=v)
        if self.schedule.stopped and not was:
            n = self.schedule.lost_in_a_row
            log.error(
                "controller: held-out evaluation stopped: %d evaluations in a row were lost with their unit (more "
                "than rollout.quarantine_after); a held-out prompt may crash the engine — see the lost units' logs",
                n,
            )
            self.jobdir.event("evaluation_stopped", lost_in_a_row=n)

    def _gauges(self, r: dict[str, Any]) -> None:
        """The gauges of the newest evaluation. A figure a kept row has no number for (null, text: an edited row)
        leaves its gauge as it was (`Gauge.set(None)` was a TypeError that killed the resumed controller)."""
        if r["version"] < self.shown:
            return
        self.shown = r["version"]
        self.metrics.eval_version.set(r["version"])
        for gauge, key in (
            (self.metrics.eval_greedy_reward, "greedy_reward"),
            (self.metrics.eval_greedy_exact, "greedy_exact"),
        ):
            x = r.get(key)
            if isinstance(x, int | float) and not isinstance(x, bool):
                gauge.set(x)
        by_source = r.get("greedy_reward_by_source")
        for src, x in (by_source if isinstance(by_source, dict) else {}).items():
            if isinstance(x, int | float) and not isinstance(x, bool):
                self.metrics.eval_greedy_reward_by_source.labels(data_source=str(src)).set(x)


def _ends(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of `rows` (evaluations.jsonl's, in the order written), what `heldout_view` reads: the first written of the
    lowest version and the last written of the highest (one row when they are the same), the lowest first."""
    if not rows:
        return []
    first = min(rows, key=lambda r: int(r["version"]))  # (the first of those equal)
    last = max(reversed(rows), key=lambda r: int(r["version"]))  # (the last of those equal)
    return [first] if first is last else [first, last]


def unwritten(events: Iterable[dict[str, Any]], written: set[int], *, below: int) -> list[int]:
    """The due versions below `below` (a resumed run's checkpoint) that the runs before asked a unit to evaluate
    (an `evaluation_asked` event: its version and those it `covers`) and that no kept row (the versions `written`)
    and no failed evaluation answers for: the evaluation in flight when a run failed. Before, the resumed run took
    every due version below its checkpoint for done, and evaluations.jsonl lacked one (0, 4, 12, 16 for a run resumed
    from v10 while v8 decoded)."""
    covers: dict[int, set[int]] = {}
    answered = set(written)
    for e in events:  # (an event without a number for a version, an edited one, says nothing of it: int(None) raised)
        v = row_count(e.get("version"))
        if v is None:
            continue
        if e.get("event") == "evaluation_asked":
            also = e.get("covers", [v])
            covers.setdefault(v, set()).update(
                d for d in (row_count(x) for x in (also if isinstance(also, list) else [v])) if d is not None
            )
        elif e.get("event") == "evaluation_failed":
            answered.add(v)
    settled = {d for v in answered for d in covers.get(v, set()) | {v}}
    return sorted({d for ds in covers.values() for d in ds if d < below and d not in settled})


def cut_evaluations(jobdir: JobDir, version: int) -> Generator[dict[str, Any], None, None]:
    """A resumed run's rows, one at a time as evaluations.jsonl is read (`cut_rows`; the Evaluator takes them so,
    versus every kept row of the job in a list first): those decoded by versions ≤ `version` only (the checkpoint's:
    its weights are the same); the others move to evaluations.discarded.jsonl once it is read, as does a row without a
    number for its version (null, text: an edited row; `int(None)` was a TypeError that killed the resumed
    controller). A `versions` that is no list of numbers says nothing more."""

    def kept(r: dict[str, Any]) -> bool:
        v, more = row_count(r.get("version")), r.get("versions")
        decoded = [row_count(x) for x in more] if isinstance(more, list) else []
        return v is not None and max([v, *(d for d in decoded if d is not None)]) <= version

    return cut_rows(jobdir, jobdir.evaluations, kept)
