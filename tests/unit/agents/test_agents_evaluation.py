"""Which versions a run evaluates on its held-out prompts, on which unit, and what a lost unit or a resume does to
that (rlctl.agents.evaluation)."""

from __future__ import annotations

from rlctl.agents.evaluation import EvalSchedule, cut_evaluations
from rlctl.launch.jobdir import JobDir
from rlctl.rl.source import RlPrompt

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
    assert not s.pending


def test_a_unit_that_skipped_a_due_version_evaluates_the_one_it_holds() -> None:
    s = schedule()
    assert s.ask("u0", 0, now=0.0) is not None
    assert s.ask("u0", 3, now=0.0) is None
    ev = s.ask("u0", 6, now=0.0)  # weights 4 never reached it: 6 answers for 4
    assert ev is not None and ev.version == 6
    assert s.ask("u1", 4, now=0.0) is None and s.ask("u1", 7, now=0.0) is None  # 4 is taken; 8 is next
    assert s.ask("u1", 8, now=0.0) is not None


def test_an_evaluation_lost_with_its_unit_is_not_asked_again_and_the_job_waits_for_the_last_only_while_due() -> None:
    s = schedule(every=5, last=10)
    s.ask("u0", 0, now=0.0)
    s.ask("u1", 5, now=0.0)
    assert s.lost("u1") == [5] and s.lost("u1") == []
    assert s.ask("u0", 5, now=0.0) is None  # lost: the curve has a gap there, noted by the controller
    s.answered(0)
    assert s.pending  # the last version's is still to come
    assert s.ask("u0", 10, now=0.0) is not None and s.pending
    assert s.lost("u0") == [10] and not s.pending  # lost: nothing to wait for


def test_a_resumed_run_starts_at_its_checkpoint_and_keeps_the_rows_of_versions_up_to_it(tmp_path) -> None:
    jd = JobDir.create("j", explicit=tmp_path / "job")
    for v in (0, 4, 8):
        jd.append(jd.path / "evaluations.jsonl", {"version": v, "greedy_reward": v / 10})
    kept = cut_evaluations(jd, 4)  # checkpoint 4 holds version 4's weights: its row stands
    assert [r["version"] for r in kept] == [0, 4]
    assert [r["version"] for r in jd.read_lines(jd.path / "evaluations.jsonl")] == [0, 4]
    assert [r["version"] for r in jd.read_lines(jd.path / "evaluations.discarded.jsonl")] == [8]
    s = schedule(floor=4)
    s.done.update(r["version"] for r in kept)
    assert s.ask("u0", 4, now=0.0) is None  # evaluated before the failure
    assert s.ask("u0", 5, now=0.0) is None
    assert s.ask("u0", 8, now=0.0) is not None


def test_the_controller_side_scores_what_it_asked_for_and_drops_what_it_did_not(tmp_path) -> None:
    """An answer from a unit not asked is dropped; one with other requests than asked is a failed evaluation (an
    event); a right one is scored by the task's verifier into a row, the trackers (at the later of its version and
    their step: W&B takes no earlier step) and the gauges."""
    import torch

    from rlctl.agents.evaluation import Evaluator
    from rlctl.agents.messages import Evaluated, make
    from rlctl.config.job import DigitsTask as DigitsConfig
    from rlctl.metrics import JobMetrics
    from rlctl.rl.source import DigitsSource
    from rlctl.rl.tasks import EOS, encode
    from rlctl.tracking import MemoryTracker

    task = DigitsSource(DigitsConfig(kind="digits"))
    prompts = task.heldout(4)
    jd = JobDir.create("j", explicit=tmp_path / "job")
    posted: list[tuple[str, object, object]] = []
    tracker, metrics = MemoryTracker(), JobMetrics()
    ev = Evaluator(
        EvalSchedule(5, 10, prompts, task.max_new_tokens),
        task=task,
        jobdir=jd,
        tracker=tracker,
        metrics=metrics,
        post=lambda *m: posted.append(m),
        step=lambda: 7,
        rows=[],
    )
    (out,) = ev.unit_at("u0", 5)
    assert (out.to, out.kind, out.header["version"]) == ("u0", "evaluate", 5)
    held = task.task.heldout_prompts(4)
    right = [[*encode(held[0].answer), EOS], [5], [6, 7], [*encode(held[3].answer), EOS]]  # two right, two wrong

    def answer(version: int, ids: list[str]) -> object:
        flat = torch.tensor([t for o in right for t in o], dtype=torch.int32)
        return make("evaluated", Evaluated(version, ids, [len(o) for o in right], version, version), [flat])

    ev.answered("u1", answer(5, ev.schedule.request_ids(5)))  # not asked of u1
    assert posted == [] and ev.pending
    ev.answered("u0", answer(5, ev.schedule.request_ids(5)))
    (kind, version, payload) = posted.pop()
    assert (kind, version) == ("eval_scored", 5)
    ev.scored(5, payload)  # type: ignore[arg-type]
    (row,) = jd.read_lines(jd.evaluations)
    assert (row["version"], row["greedy_exact"], row["prompts"], row["versions"]) == (5, 0.5, 4, [5, 5])
    scores = [task.task.reward(p, o) for p, o in zip(held, right, strict=True)]
    assert row["greedy_reward"] == round(sum(scores) / 4, 4)
    assert tracker.steps == [
        (7, {"eval/greedy_reward": row["greedy_reward"], "eval/version": 5.0, "eval/greedy_exact": 0.5})
    ]
    gauge = metrics.registry.get_sample_value
    assert (gauge("rlctl_eval_version"), gauge("rlctl_eval_greedy_exact")) == (5, 0.5)
    (out,) = ev.unit_at("u0", 10)
    ev.answered("u0", answer(10, ev.schedule.request_ids(5)))  # the requests of another evaluation
    assert posted == [] and not ev.pending
    (failed,) = [e for e in jd.read_lines(jd.events) if e["event"] == "evaluation_failed"]
    assert failed["version"] == 10 and "not the 4 asked" in failed["error"]
