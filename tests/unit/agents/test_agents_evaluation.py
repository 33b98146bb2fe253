"""Which versions a run evaluates on its held-out prompts, on which unit, and what a lost unit or a resume does to
that (rlctl.agents.evaluation)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlctl.agents.evaluation import EvalSchedule, Evaluator, cut_evaluations
from rlctl.agents.messages import Evaluated, make
from rlctl.config.task import DigitsTask as DigitsConfig
from rlctl.launch.jobdir import JobDir
from rlctl.metrics import JobMetrics
from rlctl.rl.source import DigitsSource, RlPrompt
from rlctl.rl.tasks import EOS, encode
from rlctl.tracking import MemoryTracker
from rlctl.transport import Message

PROMPTS = [RlPrompt(f"h{i}", [1, 2 + i], None) for i in range(3)]


def schedule(every: int = 4, last: int = 10, floor: int = 0) -> EvalSchedule:
    return EvalSchedule(every, last, PROMPTS, max_new_tokens=5, floor=floor)


def test_versions_0_k_2k_and_the_last_are_asked_once_each_of_the_first_unit_that_holds_them() -> None:
    s = schedule()
    asked = []
    for version in range(11):
        for unit in ("u0", "u1"):  # both units reach each version; only the first is asked
            ev = s.ask(unit, version, now=0.0)
            if ev is not None:
                asked.append((unit, ev.version))
                assert [r.request_id for r in ev.requests] == [f"eval-v{version}-{i}" for i in range(3)]
                assert [r.prompt_tokens for r in ev.requests] == [p.tokens for p in PROMPTS]
                assert {r.max_new_tokens for r in ev.requests} == {5}
                s.answered(ev.version)
    assert asked == [("u0", 0), ("u0", 4), ("u0", 8), ("u0", 10)]


def test_a_unit_that_skipped_a_due_version_evaluates_the_one_it_holds() -> None:
    s = schedule()
    assert s.ask("u0", 0, now=0.0) is not None
    assert s.ask("u0", 3, now=0.0) is None
    ev = s.ask("u0", 6, now=0.0)  # weights 4 never reached it: 6 answers for 4
    assert ev is not None and ev.version == 6
    assert s.ask("u1", 4, now=0.0) is None and s.ask("u1", 7, now=0.0) is None  # 4 is taken; 8 is next
    assert s.ask("u1", 8, now=0.0) is not None


def test_versions_due_again_at_a_version_another_unit_decodes_are_covered_by_its_answer() -> None:
    # u1 was asked again for v8 (for the versions a lost unit left due): its ask replaced u0's, and u0's answer
    # was dropped while it still decoded
    s = schedule(every=4, last=12)
    assert s.ask("x", 5, now=0.0) is not None  # covers 0 and 4
    assert s.ask("u0", 8, now=0.0) is not None
    assert s.lost("x") == [5]  # 0 and 4 are due again
    assert s.ask("u1", 8, now=0.0) is None  # u0's evaluation of 8 answers for them
    assert s.holds("u0") and not s.holds("u1") and not s.due(8)
    assert s.lost("u0") == [8] and s.due(8)  # all three due again
    ev = s.ask("u1", 8, now=0.0)
    assert ev is not None and ev.version == 8 and s.asked[8].covers == [0, 4, 8]


class Harness:
    """An Evaluator of the digits task's first 4 held-out prompts (every 5 versions of 10) with its job dir, trackers,
    gauges and what it posts to the controller's loop."""

    def __init__(self, tmp_path, *, step: int = 7, resumed: int = 0) -> None:
        self.task = DigitsSource(DigitsConfig(kind="digits"))
        self.jd = JobDir.create("j", explicit=tmp_path / "job")
        self.posted: list[tuple[str, Any, Any]] = []
        self.tracker, self.metrics = MemoryTracker(), JobMetrics()
        self.ev = Evaluator(
            EvalSchedule(5, 10, self.task.heldout(4), self.task.max_new_tokens, floor=resumed),
            task=self.task,
            jobdir=self.jd,
            tracker=self.tracker,
            metrics=self.metrics,
            post=lambda *m: self.posted.append(m),
            step=lambda: step,
            rows=cut_evaluations(self.jd, resumed),
        )
        held = self.task.task.heldout_prompts(4)
        self.outputs = [[*encode(held[0].answer), EOS], [5], [6, 7], [*encode(held[3].answer), EOS]]  # 2 right

    def answer(self, version: int, ids: list[str] | None = None, error: str = "") -> Message:
        outputs = [] if error else self.outputs
        flat = torch.tensor([t for o in outputs for t in o], dtype=torch.int32)
        ids = self.ev.schedule.request_ids(version) if ids is None else ids
        head = Evaluated(version, [] if error else ids, [len(o) for o in outputs], version, version, error=error)
        return make("evaluated", head, [flat])

    def score(self) -> None:
        """Hand what the reward side posted to the evaluator, as the controller's loop does."""
        while self.posted:
            kind, version, payload = self.posted.pop(0)
            assert kind == "eval_scored"
            self.ev.scored(version, payload)


def test_the_controller_side_scores_what_it_asked_for_and_drops_what_it_did_not(tmp_path) -> None:
    """An answer from a unit not asked is dropped; one with other requests than asked, or the unit's error, is a
    failed evaluation (an event); a right one is scored by the task's verifier into a row, the trackers (at the
    later of the iteration that made its version and their step: W&B takes no earlier step) and the gauges."""
    h = Harness(tmp_path)
    (out,) = h.ev.unit_at("u0", 5)
    assert (out.to, out.kind, out.header["version"]) == ("u0", "evaluate", 5)
    h.ev.answered("u1", h.answer(5))  # not asked of u1
    assert h.posted == []
    h.ev.answered("u0", h.answer(5))
    assert h.ev.pending  # being scored
    h.score()
    assert not h.ev.pending
    (row,) = h.jd.read_lines(h.jd.evaluations)
    assert (row["version"], row["greedy_exact"], row["prompts"], row["versions"]) == (5, 0.5, 4, [5, 5])
    held = h.task.task.heldout_prompts(4)
    scores = [h.task.task.reward(p, o) for p, o in zip(held, h.outputs, strict=True)]
    assert row["greedy_reward"] == round(sum(scores) / 4, 4)
    want = {"eval/greedy_reward": row["greedy_reward"], "eval/version": 5.0, "eval/greedy_exact": 0.5}
    assert h.tracker.steps == [(7, want)]  # the trackers are at 7 already
    gauge = h.metrics.registry.get_sample_value
    assert (gauge("rlctl_eval_version"), gauge("rlctl_eval_greedy_exact")) == (5, 0.5)
    h.ev.unit_at("u0", 10)
    assert h.ev.pending  # the last version's, being decoded
    h.ev.answered("u0", h.answer(10, ids=h.ev.schedule.request_ids(5)))  # the requests of another evaluation
    assert h.posted == [] and not h.ev.pending
    (failed,) = [e for e in h.jd.read_lines(h.jd.events) if e["event"] == "evaluation_failed"]
    assert failed["version"] == 10 and "not the 4 asked" in failed["error"]


def test_a_units_error_and_an_undecodable_answer_end_an_evaluation_and_a_lost_ones_is_asked_again(tmp_path) -> None:
    h = Harness(tmp_path, step=0)
    h.ev.unit_at("u0", 0)
    msg = h.answer(0, error="request eval-v0-0: 9 prompt + 5 new tokens > max_position_embeddings 12")
    from rlctl.agents.messages import TO_CONTROLLER, check

    check(msg, peer="u0", kinds=TO_CONTROLLER)  # the unit's error reply is well-formed
    h.ev.answered("u0", msg)
    h.ev.unit_at("u1", 5)
    h.ev.lost("u1")  # lost, retired or reconnected before it answered
    (again,) = h.ev.unit_at("u0", 6)  # the next unit to hold version 5 or later
    assert again.header["version"] == 6
    h.ev.answered("u0", h.answer(6))
    h.score()
    h.ev.unit_at("u0", 10)
    bad = h.answer(10)
    bad.tensors[0][0] = 10_000  # no such token
    h.ev.answered("u0", bad)
    assert not h.ev.pending and h.posted == []
    assert [r["version"] for r in h.jd.read_lines(h.jd.evaluations)] == [6]
    events = [(e["event"], e["version"]) for e in h.jd.read_lines(h.jd.events) if e["event"] != "evaluation_asked"]
    assert events == [("evaluation_failed", 0), ("evaluation_lost", 5), ("evaluation_failed", 10)]


def test_a_unit_that_skipped_versions_and_was_lost_leaves_them_all_due_again(tmp_path) -> None:
    s = schedule(every=2, last=10)
    s.ask("u0", 0, now=0.0)
    s.answered(0)
    assert s.ask("u1", 5, now=0.0) is not None  # answers for 2 and 4 too
    assert s.ask("u0", 5, now=0.0) is None
    s.lost("u1")
    ev = s.ask("u0", 5, now=0.0)
    assert ev is not None and s.asked[5].covers == [2, 4]
    assert s.ask("u0", 6, now=0.0) is not None and s.asked[6].covers == [6]


def test_evaluations_lost_with_their_unit_more_times_in_a_row_than_the_job_takes_stop_the_evaluation(tmp_path) -> None:
    """A held-out prompt that crashes the engine would take down every unit asked, for ever: past `max_lost` losses
    in a row the evaluation stops (one ERROR, an event); an evaluation answered in between starts the count again."""
    s = EvalSchedule(2, 10, PROMPTS, max_new_tokens=5, max_lost=2)
    s.ask("u0", 0, now=0.0)
    assert s.holds("u0") and not s.holds("u1")
    s.lost("u0")
    s.ask("u1", 0, now=0.0)
    s.answered(0)  # answered: the count starts again
    for unit in ("u2", "u3"):
        assert s.ask(unit, 2, now=0.0) is not None
        s.lost(unit)
    assert (s.lost_in_a_row, s.stopped) == (2, False)
    s.ask("u4", 2, now=0.0)
    s.lost("u4")
    assert s.stopped and s.ask("u5", 2, now=0.0) is None and s.ask("u5", 10, now=0.0) is None
    never = EvalSchedule(2, 10, PROMPTS, max_new_tokens=5)  # 0: it never stops
    for k in range(5):
        never.ask(f"u{k}", 0, now=0.0)
        never.lost(f"u{k}")
    assert not never.stopped and never.ask("u9", 0, now=0.0) is not None

    h = Harness(tmp_path, step=0)
    h.ev.schedule.max_lost = 1
    for unit in ("u0", "u1"):
        h.ev.unit_at(unit, 0)
        h.ev.lost(unit)
    assert h.ev.unit_at("u2", 5) == []
    stopped = [e for e in h.jd.read_lines(h.jd.events) if e["event"] == "evaluation_stopped"]
    assert [e["lost_in_a_row"] for e in stopped] == [2]


def test_rows_are_logged_at_the_iteration_that_made_their_version(tmp_path) -> None:
    h = Harness(tmp_path, step=2)
    h.ev.unit_at("u0", 5)
    h.ev.answered("u0", h.answer(5))
    h.score()
    assert [s for s, _ in h.tracker.steps] == [4]  # v5 = iteration 4's update; the trackers were at 2


def test_a_resumed_run_starts_at_its_checkpoint_and_keeps_the_rows_of_versions_up_to_it(tmp_path) -> None:
    first = Harness(tmp_path)
    for v in (0, 5, 10):
        first.ev.unit_at("u0", v)
        first.ev.answered("u0", first.answer(v))
        first.score()
    assert [r["version"] for r in first.jd.read_lines(first.jd.evaluations)] == [0, 5, 10]
    again = Harness(tmp_path, resumed=5)  # checkpoint 5 holds version 5's weights: its row stands
    assert [r["version"] for r in again.ev.rows] == [0, 5]
    assert [r["version"] for r in again.jd.read_lines(again.jd.evaluations)] == [0, 5]
    assert [r["version"] for r in again.jd.read_lines(again.jd.path / "evaluations.discarded.jsonl")] == [10]
    gauge = again.metrics.registry.get_sample_value
    assert gauge("rlctl_eval_version") == 5  # the gauges start from the last row kept
    assert again.ev.unit_at("u0", 5) == [] and again.ev.unit_at("u0", 9) == []
    assert again.ev.unit_at("u0", 10) != []


def test_an_iteration_is_marked_when_an_evaluation_decoded_beside_its_generation(tmp_path) -> None:
    h = Harness(tmp_path)
    assert not h.ev.overlapped()
    h.ev.unit_at("u0", 5)
    assert h.ev.overlapped() and h.ev.overlapped()  # still decoding at the next row
    h.ev.answered("u0", h.answer(5))
    assert h.ev.overlapped()  # it ended since the last row: that iteration shared the units too
    assert not h.ev.overlapped()


def test_a_row_partly_decoded_by_weights_a_resume_discards_is_discarded(tmp_path) -> None:
    jd = JobDir.create("j", explicit=tmp_path / "job")
    for v, versions in ((0, [0, 1]), (4, [4, 4]), (5, [5, 6])):
        jd.append(jd.evaluations, {"version": v, "versions": versions})
    assert [r["version"] for r in cut_evaluations(jd, 5)] == [0, 4]  # v6 decoded part of v5's row: trained again


def test_evaluations_that_end_out_of_order_keep_the_gauges_and_views_on_the_newest(tmp_path) -> None:
    from rlctl.rl.source import heldout_view

    h = Harness(tmp_path)
    h.ev.unit_at("u0", 5)
    h.ev.unit_at("u1", 10)
    h.ev.answered("u1", h.answer(10))
    h.score()
    h.ev.answered("u0", h.answer(5))
    h.score()
    assert [r["version"] for r in h.jd.read_lines(h.jd.evaluations)] == [10, 5]  # as their scores came back
    assert h.metrics.registry.get_sample_value("rlctl_eval_version") == 10
    view = heldout_view(h.ev.rows)
    assert view is not None and (view["first"]["version"], view["last"]["version"]) == (5, 10)


class Reference:
    """The schedule by its definition, without pointers or watermarks: a due version (0, K, 2K, … or the last, ≥ the
    floor) is asked of the first unit to hold it or a later version, once; an answer or a version another answer
    covers is done; a lost unit's evaluation makes the versions it covered due again."""

    def __init__(self, every: int, last: int, floor: int) -> None:
        self.due_versions = [v for v in range(floor, last + 1) if v % every == 0 or v == last]
        self.done: set[int] = set()
        self.asked: dict[int, tuple[str, list[int]]] = {}

    def due(self, version: int) -> list[int]:
        return [d for d in self.due_versions if d <= version and d not in self.done and d not in self.asked]

    def ask(self, unit: str, version: int) -> int | None:
        covers = self.due(version)
        if not covers:
            return None
        self.done.update(d for d in covers if d != version)
        if version in self.asked:
            self.asked[version][1].extend(covers)
            return None
        self.asked[version] = (unit, covers)
        return version

    def answered(self, version: int) -> None:
        self.asked.pop(version)
        self.done.add(version)

    def lost(self, unit: str) -> list[int]:
        gone = [v for v, (u, _) in self.asked.items() if u == unit]
        for v in gone:
            self.done.difference_update(self.asked.pop(v)[1])
        return gone


def test_the_schedule_answers_as_its_definition_under_random_asks_losses_and_answers() -> None:
    """`due` keeps a pointer past the versions done (a long job with a small K must not rescan them all) and `done`
    a watermark below them: it says what the definition says (`Reference`), at every step, and asks, covers and
    loses the same versions."""
    import random

    r = random.Random(7)
    for trial in range(300):
        every, last = r.randint(1, 5), r.randint(1, 30)
        s = EvalSchedule(every, last, PROMPTS, 5, floor=r.choice([0, 0, r.randint(0, last)]))
        ref = Reference(every, last, s.floor)
        version = s.floor
        for _ in range(60):
            version = min(last, version + r.randint(0, 3))
            unit = r.choice(["u0", "u1", "u2"])
            where = (trial, every, last, s.floor, version)
            assert s.due(version) == bool(ref.due(version)), where
            what = r.random()
            if what < 0.5:
                ev = s.ask(unit, version, now=0.0)
                assert (ev and ev.version) == ref.ask(unit, version), where
            elif what < 0.7 and s.asked:
                v = r.choice(list(s.asked))
                assert s.answered(v) is not None
                ref.answered(v)
            elif what < 0.8:
                assert s.lost(unit) == ref.lost(unit), where
            assert {v: (a.unit, sorted(a.covers)) for v, a in s.asked.items()} == {
                v: (u, sorted(c)) for v, (u, c) in ref.asked.items()
            }, where
            assert all((d in s.done) == (d in ref.done) for d in ref.due_versions), where


def test_the_schedule_of_a_long_job_holds_no_number_per_version_evaluated() -> None:
    """10,000 versions, each evaluated by one of two units, one lost now and then: the schedule's size stays that of a
    short job's, versus one number per version evaluated in `done` for the whole job (10,000: some 500 kB)."""
    import pickle

    def run(last: int) -> int:
        s = EvalSchedule(1, last, PROMPTS, 5)
        for v in range(last + 1):
            unit = f"u{v % 2}"
            if s.ask(unit, v, now=0.0) is not None and v % 7:
                s.answered(v)
            elif v % 7 == 0:
                s.lost(unit)
        assert not s.due(last - 3)
        return len(pickle.dumps(s))

    assert run(10_000) < run(100) + 100


def test_a_resume_takes_the_kept_evaluation_rows_one_at_a_time_as_the_file_is_read(tmp_path) -> None:
    """The evaluator has taken each kept row (its gauges show it) before the next is read, and the rows past the
    checkpoint are set aside once the file is read, versus every kept row of the job in a list first (one per version
    evaluated: 10⁴ and more in a job of weeks)."""
    jd = JobDir.create("j", explicit=tmp_path / "job")
    for v in range(12):
        jd.append(jd.evaluations, {"version": v, "greedy_reward": v / 10, "prompts": 4, "versions": [v, v]})
    metrics = JobMetrics()
    shown: list[float | None] = []
    read = jd.iter_lines

    def iter_lines(path):
        for r in read(path):
            shown.append(metrics.registry.get_sample_value("rlctl_eval_version"))
            yield r

    jd.iter_lines = iter_lines  # type: ignore[method-assign]
    task = DigitsSource(DigitsConfig(kind="digits"))
    ev = Evaluator(
        EvalSchedule(1, 20, task.heldout(4), task.max_new_tokens, floor=9),
        task=task,
        jobdir=jd,
        tracker=MemoryTracker(),
        metrics=metrics,
        post=lambda *m: None,
        step=lambda: 9,
        rows=cut_evaluations(jd, 9),
    )
    assert shown == [0.0, *range(9), 9.0, 9.0]  # (v10 and v11 are set aside: the gauges stay at v9)
    assert [r["version"] for r in ev.rows] == [0, 9]
    assert [r["version"] for r in jd.read_lines(jd.evaluations)] == list(range(10))
    assert [r["version"] for r in jd.read_lines(jd.evaluations.with_name("evaluations.discarded.jsonl"))] == [10, 11]


def test_a_raise_as_the_evaluator_takes_a_resumed_runs_rows_ends_the_cut_at_once(tmp_path, monkeypatch) -> None:
    """A raise partway through the kept rows (a gauge's, an interrupt) closes the cut they are read from: its
    temporary files go and evaluations.jsonl is as it was, versus left beside it, open, until the garbage collector
    took the generator (the raise's traceback, or its caller, holds it)."""
    jd = JobDir.create("j", explicit=tmp_path / "job")
    for v in range(6):
        jd.append(jd.evaluations, {"version": v, "greedy_reward": 0.5, "prompts": 4, "versions": [v, v]})
    before = jd.evaluations.read_bytes()

    def gauges(self: Evaluator, r: dict[str, Any]) -> None:
        if r["version"] == 2:
            raise RuntimeError("a gauge failed")

    monkeypatch.setattr(Evaluator, "_gauges", gauges)
    task = DigitsSource(DigitsConfig(kind="digits"))
    rows = cut_evaluations(jd, 3)  # (held here: the garbage collector cannot take it)
    with pytest.raises(RuntimeError, match="a gauge failed"):
        Evaluator(
            EvalSchedule(1, 10, task.heldout(4), task.max_new_tokens, floor=3),
            task=task,
            jobdir=jd,
            tracker=MemoryTracker(),
            metrics=JobMetrics(),
            post=lambda *m: None,
            step=lambda: 3,
            rows=rows,
        )
    assert sorted(p.name for p in jd.path.iterdir() if "evaluations" in p.name) == ["evaluations.jsonl"]
    assert jd.evaluations.read_bytes() == before


def test_an_evaluation_in_flight_when_the_run_failed_is_done_after_the_resume(tmp_path) -> None:
    # every 4 of 16, killed at 10 while v8 decoded, resumed from v10: evaluations.jsonl had 0, 4, 12, 16, without a
    # word of v8 (the resumed run took every due version below its checkpoint for done)
    task = DigitsSource(DigitsConfig(kind="digits"))
    jd = JobDir.create("j", explicit=tmp_path / "job")
    for v in (0, 4):
        jd.event("evaluation_asked", agent="u0", version=v, prompts=4, covers=[v])
        jd.append(jd.evaluations, {"version": v, "greedy_reward": 0.5, "prompts": 4, "versions": [v, v]})
    jd.event("evaluation_asked", agent="u0", version=8, prompts=4, covers=[8])  # then the trainer was lost
    schedule = EvalSchedule(4, 16, task.heldout(4), task.max_new_tokens, floor=10)
    ev = Evaluator(
        schedule,
        task=task,
        jobdir=jd,
        tracker=MemoryTracker(),
        metrics=JobMetrics(),
        post=lambda *m: None,
        step=lambda: 10,
        rows=cut_evaluations(jd, 10),
    )
    (out,) = ev.unit_at("u0", 10)  # v8's weights are gone: the checkpoint's version answers for it
    assert out.header["version"] == 10 and schedule.asked[10].covers == [8]
    (said,) = [e for e in jd.read_events() if e["event"] == "evaluation_in_place"]
    assert (said["version"], said["of"]) == (10, [8]) and "resumed from checkpoint v10" in said["why"]
    schedule.answered(10)
    assert ev.unit_at("u0", 11) == []  # 0 and 4 were written: not asked again
    (out,) = ev.unit_at("u0", 12)
    assert out.header["version"] == 12 and schedule.asked[12].covers == [12]


def test_versions_answered_in_place_or_failed_are_not_redone_at_a_later_resume() -> None:
    from rlctl.agents.evaluation import unwritten

    rows = {0, 10}
    events = [
        {"event": "evaluation_asked", "version": 0},  # written before `covers` was
        {"event": "evaluation_asked", "version": 8, "covers": [8]},
        {"event": "evaluation_asked", "version": 10, "covers": [8]},  # the resumed run's, in place of v8
        {"event": "evaluation_asked", "version": 12, "covers": [12]},
        {"event": "evaluation_failed", "version": 12},
        {"event": "evaluation_asked", "version": 16, "covers": [16]},
    ]
    assert unwritten(events, rows, below=17) == [16]
    assert unwritten(events, {0}, below=17) == [8, 16]
    assert unwritten(events, rows, below=0) == []


def test_status_says_the_reward_calls_of_an_evaluation_that_failed() -> None:
    """Before: `v4: greedy reward 0.000` alone, the reward having raised on all 16 answers (`reward_on_error` each)."""
    from rlctl.commands.status import evaluations_line
    from rlctl.rl.source import heldout_view

    rows = [
        {"version": 0, "greedy_reward": 0.5, "prompts": 16, "reward_failures": 0},
        {"version": 4, "greedy_reward": 0.0, "prompts": 16, "reward_failures": 16},
    ]
    assert evaluations_line(heldout_view(rows)) == (
        "v4: greedy reward 0.000, 16 reward calls failed  (first v0: greedy reward 0.500)  over 16 prompts"
    )


def test_a_resume_sets_aside_an_evaluation_row_without_a_number_for_its_version(tmp_path) -> None:
    # int(r["version"]) raised on null, and *r.get("versions", []) on a null versions: the resumed controller died
    jd = JobDir(tmp_path)
    rows = [{"version": None}, {"version": 1, "versions": None}, {"version": 2, "versions": [1, "x"]}, {"version": 3}]
    for r in rows:
        jd.append(jd.evaluations, r)
    assert list(cut_evaluations(jd, 2)) == rows[1:3]
    assert jd.read_lines(tmp_path / "evaluations.discarded.jsonl") == [rows[0], rows[3]]


def test_a_resume_passes_over_a_kept_evaluation_figure_or_an_evaluation_event_without_a_number(tmp_path) -> None:
    # Gauge.set(None) of a kept row's null greedy_reward, int(None) of an evaluation_asked event's version or covers:
    # a TypeError that killed the resumed controller as it started
    jd = JobDir.create("j", explicit=tmp_path / "job")
    jd.append(jd.evaluations, {"version": 0, "versions": [0], "greedy_reward": None, "greedy_exact": "x"})
    jd.event("evaluation_asked", version=None, covers=[0])
    jd.event("evaluation_asked", version=5, covers=[None, 5])
    jd.event("evaluation_failed", version="x")
    h = Harness(tmp_path, resumed=10)
    assert h.ev.redone == {5}  # asked, neither answered nor failed: due again
    assert h.metrics.eval_version._value.get() == 0 and h.metrics.eval_greedy_reward._value.get() == 0.0


def test_the_evaluator_keeps_the_rows_the_views_read_not_one_per_version(tmp_path) -> None:
    """Every version of 30 evaluated, ending out of order, then a run resumed from them: the evaluator holds the
    first and the last row by version (what status and summary.json show: `heldout_view`, the same as of every row
    written), versus every row of the job, one per version evaluated, sorted whole at each status request."""
    from rlctl.rl.source import heldout_view

    h = Harness(tmp_path)
    h.ev.schedule = EvalSchedule(1, 30, h.task.heldout(4), h.task.max_new_tokens)
    for v in range(30):
        h.ev.unit_at(f"u{v}", v)
    for v in [*range(1, 30), 0]:  # (v0's unit answers last)
        h.ev.answered(f"u{v}", h.answer(v))
        h.score()
    written = h.jd.read_lines(h.jd.evaluations)
    assert len(written) == 30 and [r["version"] for r in h.ev.rows] == [0, 29]
    assert heldout_view(h.ev.rows) == heldout_view(written) is not None
    again = Evaluator(
        EvalSchedule(1, 40, h.task.heldout(4), h.task.max_new_tokens, floor=30),
        task=h.task,
        jobdir=h.jd,
        tracker=h.tracker,
        metrics=h.metrics,
        post=lambda *m: None,
        step=lambda: 30,
        rows=cut_evaluations(h.jd, 30),
    )
    assert [r["version"] for r in again.rows] == [0, 29] and heldout_view(again.rows) == heldout_view(written)


def test_a_mixed_jobs_row_and_trackers_give_each_data_sources_figure_under_a_safe_key(tmp_path) -> None:
    """Scores of held-out prompts of two data_sources: the row holds each source's mean and the trackers have
    eval/greedy_reward/<source> with the source's '/' written '_' (a '/' nests W&B panels), versus the mean alone;
    one source's row and keys are as they were."""
    from rlctl.rl.source import HeldoutScores, by_source

    per_source = by_source(["openai/gsm8k", "lighteval/MATH", "openai/gsm8k"], [1.0, 0.0, 1.0])
    assert per_source == {"lighteval/MATH": 0.0, "openai/gsm8k": 1.0}
    assert by_source(["openai/gsm8k"] * 2, [1.0, 0.0]) is None
    h = Harness(tmp_path)
    h.ev.scored(5, (HeldoutScores(2 / 3, None, 3, 0, per_source), "u0", (5, 5), 0.0))
    h.ev.scored(10, (HeldoutScores(0.5, None, 2, 0, None), "u0", (10, 10), 0.0))
    rows = h.jd.read_lines(h.jd.evaluations)
    assert rows[0]["greedy_reward_by_source"] == per_source and "greedy_reward_by_source" not in rows[1]
    assert h.tracker.steps == [
        (
            7,
            {
                "eval/greedy_reward": 0.6667,
                "eval/version": 5.0,
                "eval/greedy_reward/lighteval_MATH": 0.0,
                "eval/greedy_reward/openai_gsm8k": 1.0,
            },
        ),
        (9, {"eval/greedy_reward": 0.5, "eval/version": 10.0}),
    ]


def test_a_mixed_jobs_gauges_give_each_data_sources_figure_as_a_label(tmp_path) -> None:
    """rlctl_eval_greedy_reward_by_source{data_source="openai/gsm8k"}: the source as it is (a label value may hold
    a '/'), versus no gauge per source (Prometheus showed the mean alone)."""
    from rlctl.rl.source import HeldoutScores

    h = Harness(tmp_path)
    h.ev.scored(5, (HeldoutScores(0.5, None, 2, 0, {"lighteval/MATH": 0.0, "openai/gsm8k": 1.0}), "u0", (5, 5), 0.0))
    gauge = h.metrics.registry.get_sample_value
    name = "rlctl_eval_greedy_reward_by_source"
    assert gauge(name, {"data_source": "openai/gsm8k"}) == 1.0
    assert gauge(name, {"data_source": "lighteval/MATH"}) == 0.0
    assert gauge("rlctl_eval_greedy_reward") == 0.5


def test_a_mixed_jobs_evaluation_logs_each_data_sources_figure_on_a_line_of_its_own(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller's line of an evaluation gave the mean alone (GSM8K improving while MATH regressed read as one
    flat figure in its log); one source's evaluation logs its one line, as it did."""
    import logging

    from rlctl.rl.source import HeldoutScores, heldout_view

    caplog.set_level(logging.INFO, logger="rlctl.agents.evaluation")
    h = Harness(tmp_path)
    h.ev.scored(5, (HeldoutScores(0.5, None, 4, 0, {"openai/gsm8k": 0.75, "lighteval/MATH": 0.25}), "u0", (5, 5), 0.0))
    h.ev.scored(10, (HeldoutScores(0.5, None, 2, 0, None), "u0", (10, 10), 0.0))
    assert [r.getMessage() for r in caplog.records] == [
        "controller: held-out v5 on u0: greedy reward 0.5000 over 4 prompts",
        "controller: held-out v5, data_source openai/gsm8k: greedy reward 0.7500",
        "controller: held-out v5, data_source lighteval/MATH: greedy reward 0.2500",
        "controller: held-out v10 on u0: greedy reward 0.5000 over 2 prompts",
    ]
    view = heldout_view(h.ev.rows)  # the live status' (rlctl.agents.views): each source's beside the mean
    assert view is not None and view["first"]["greedy_reward_by_source"] == {
        "openai/gsm8k": 0.75,
        "lighteval/MATH": 0.25,
    }
    assert "greedy_reward_by_source" not in view["last"]


def test_status_gives_each_data_sources_figure_on_a_row_of_its_own() -> None:
    """`rlctl status` showed the mean alone, first and last; a mixed job's rows now give one short row per source
    below it (the last evaluation's, its first's beside it), one source's status as it was."""
    from rlctl.commands.status import _fallback_table, evaluations_line, heldout_source_rows
    from rlctl.rl.source import heldout_view

    rows = [
        {"version": 0, "greedy_reward": 0.5, "prompts": 4, "greedy_reward_by_source": {"a/gsm8k": 0.5, "b/MATH": 0.5}},
        {
            "version": 8,
            "greedy_reward": 0.5,
            "prompts": 4,
            "greedy_reward_by_source": {"a/gsm8k": 0.75, "b/MATH": 0.25},
        },
    ]
    view = heldout_view(rows)
    assert evaluations_line(view) == "v8: greedy reward 0.500  (first v0: greedy reward 0.500)  over 4 prompts"
    assert heldout_source_rows(view) == [
        ["  a/gsm8k", "v8: greedy reward 0.750  (first v0: 0.500)"],
        ["  b/MATH", "v8: greedy reward 0.250  (first v0: 0.500)"],
    ]
    assert heldout_source_rows(heldout_view(rows[1:])) == [
        ["  a/gsm8k", "v8: greedy reward 0.750"],
        ["  b/MATH", "v8: greedy reward 0.250"],
    ]
    one = [{k: v for k, v in r.items() if k != "greedy_reward_by_source"} for r in rows]
    assert heldout_view(one) == {
        "first": {"version": 0, "greedy_reward": 0.5, "greedy_exact": None, "prompts": 4, "reward_failures": None},
        "last": {"version": 8, "greedy_reward": 0.5, "greedy_exact": None, "prompts": 4, "reward_failures": None},
    }
    assert heldout_source_rows(heldout_view(one)) == heldout_source_rows(None) == []
    record = {"id": "j", "controller": "gone", "source": "the job's record", "sites_down": [], "agents": []}
    table = _fallback_table({**record, "heldout": view}).splitlines()  # (`rlctl status` of a job whose controller
    held = next(i for i, line in enumerate(table) if "held-out" in line)  # is gone: its record's evaluations.jsonl)
    assert ["a/gsm8k" in table[held + 1], "b/MATH" in table[held + 2]] == [True, True]
    assert "a/gsm8k" not in _fallback_table({**record, "heldout": heldout_view(one)})


def test_a_data_source_with_line_breaks_or_control_characters_stays_on_its_one_line(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """A data_source as the rows wrote it ('gsm8k\\nERROR …', an escape sequence) split the controller's log line in
    two (a forged line below it) and `rlctl status`'s row; each is now written as one line, its breaks and control
    characters escaped as rlctl writes an error (`one_line`)."""
    import logging

    from rlctl.commands.status import _fallback_table, heldout_source_rows
    from rlctl.rl.source import HeldoutScores, heldout_view

    odd = "a/gsm8k\nERROR controller: forged\x1b[31m\r"
    caplog.set_level(logging.INFO, logger="rlctl.agents.evaluation")
    h = Harness(tmp_path)
    h.ev.scored(5, (HeldoutScores(0.5, None, 4, 0, {odd: 0.75, "b/MATH": 0.25}), "u0", (5, 5), 0.0))
    assert [r.getMessage() for r in caplog.records][1:] == [
        "controller: held-out v5, data_source a/gsm8k\\nERROR controller: forged\\x1b[31m\\r: greedy reward 0.7500",
        "controller: held-out v5, data_source b/MATH: greedy reward 0.2500",
    ]
    view = heldout_view([{"version": 0, "greedy_reward": 0.5, "greedy_reward_by_source": {odd: "x\ny", "b": 0.5}}])
    assert heldout_source_rows(view) == [
        ["  a/gsm8k\\nERROR controller: forged\\x1b[31m\\r", "v0: greedy reward x\\ny"],
        ["  b", "v0: greedy reward 0.500"],
    ]
    record = {"id": "j", "controller": "gone", "source": "the job's record", "sites_down": [], "agents": []}
    table = _fallback_table({**record, "heldout": view})
    assert "\x1b" not in table and "\r" not in table
    held = table.splitlines()
    at = next(i for i, line in enumerate(held) if "held-out" in line)
    assert "forged" in held[at + 1] and "x\\ny" in held[at + 1] and held[at + 2].strip().startswith("b ")
