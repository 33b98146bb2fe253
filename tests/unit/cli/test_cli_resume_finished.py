"""`rlctl launch --resume` of a finished job is refused (exit 2, one line, nothing started or written), whether
the job index or only its summary.json says it finished; a stopped or failed one is still resumed. With
`--iterations N` (`rlctl.ops.extend`) a finished job trains on to N: its job.json takes the count as its launcher
starts the run, and the checkpoint it finished on stays one a resume takes."""

from __future__ import annotations

import json
import shutil
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlctl.checkpoint.choose import checkpoint_versions
from rlctl.commands.launching import resume as resume_cmd
from rlctl.config import load_job
from rlctl.config.pipeline import Pipeline
from rlctl.errors import UsageError
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.ops.extend import earlier_iterations, with_iterations, write_iterations
from rlctl.ops.jobchanges import launch_changes
from rlctl.ops.jobdb import JobDB, default_home
from rlctl.ops.refusals import refuse_if_finished
from tests.conftest import ROOT, run_cli

DEMO = ROOT / "jobs" / "demo.yaml"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def ended(path: Path, state: str, *, iterations: int, indexed: str | None) -> JobDir:
    """A job directory whose run ended in `state` (summary.json) after `iterations` of 15; in the job index with
    state `indexed` unless None."""
    job = load_job(DEMO)
    jd = JobDir.create("demo", explicit=path)
    jd.write_job(job.spec.model_copy(update={"iterations": 15}), source=str(DEMO))
    jd.write_json(jd.plan_json, {"trainer": {"site": "local", "ranks": 1}, "controller_site": "local", "rollout": []})
    write_sites(jd.path, dict(job.inventory.sites))
    summary = {"job": "demo", "state": state, "iterations": iterations, "iterations_planned": 15}
    jd.summary_json.write_text(json.dumps(summary))
    jd.metrics.write_text("".join(json.dumps({"iteration": i, "reward_mean": 0.5}) + "\n" for i in range(iterations)))
    if indexed is not None:
        db = JobDB(default_home() / "jobs.db")
        db.put(jd.path.name, job_dir=str(jd.path), spec={"name": "demo"})
        db.update(jd.path.name, state=indexed)
        db.close()
    return jd


def files(path: Path) -> dict[str, bytes]:
    """The job dir's files, less the launcher lock's (`.launcher.lock`: a resume takes the lock before it reads the
    job, and every launch of the job made the file; what it holds says who holds the lock, not the job)."""
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != ".launcher.lock"
    }


@pytest.mark.parametrize("indexed", ["finished", None])
def test_resuming_a_finished_job_is_refused_and_starts_nothing(tmp_path: Path, indexed: str | None) -> None:
    jd = ended(tmp_path / "run", "done", iterations=15, indexed=indexed)
    before = files(jd.path)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"rlctl: error: job {jd.path.name}: finished (15/15 iterations); nothing to resume")
    assert files(jd.path) == before  # no event, no agent record, no summary set aside


def test_the_index_saying_finished_is_enough_without_a_summary(tmp_path: Path) -> None:
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    jd.summary_json.unlink()  # e.g. not fetched back from the controller's site
    with pytest.raises(UsageError, match=f"job {jd.path.name}: finished; nothing to resume"):
        refuse_if_finished(jd, state="finished")


@pytest.mark.parametrize("state", ["stopped", "failed"])
def test_a_stopped_or_failed_job_is_not_refused(tmp_path: Path, state: str) -> None:
    jd = ended(tmp_path / "run", state, iterations=7, indexed=state)
    refuse_if_finished(jd, state=state)  # nothing raised: its resume goes on as before


def launched_by(jd: JobDir, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list[str]]:
    """What a `launch --resume` of `jd` starts (its launcher's `begin`, with a run that starts nothing): the spec,
    the `runs.start` arguments and job.json then; and the lines it says."""
    launched: dict[str, Any] = {}
    said: list[str] = []

    class Runs:
        def start(self, *, resume: bool, checkpoint: int | None = None, warnings: list[str] | None = None) -> str:
            launched.update(resume=resume, checkpoint=checkpoint, job_json=json.loads(jd.job_json.read_text()))
            return "run"

    def be_launcher(
        jd_: JobDir, spec: object, plan: object, db: JobDB, begin: object, output: object, **_: object
    ) -> None:
        launched["spec"] = spec
        launched["job_json_before"] = json.loads(jd.job_json.read_text())  # not written before its launcher runs
        assert begin(Runs(), said.append) == "run"  # type: ignore[operator]
        db.close()

    monkeypatch.setattr(resume_cmd, "be_launcher", be_launcher)
    return launched, said


def test_a_finished_job_given_more_iterations_trains_on_to_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it was refused with "more iterations are a new job", which starts from the base model: a finished run could
    # not be trained further from where it ended
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", "40")
    assert launched["job_json_before"]["job"]["iterations"] == 15
    assert r.exit_code == 0, r.stderr
    assert said == ["job demo: iterations 15 → 40 (--iterations), from 15 trained"]
    assert launched["resume"] is True and launched["checkpoint"] is None and launched["spec"].iterations == 40
    data = launched["job_json"]
    assert data["job"]["iterations"] == 40 and data["iterations_before"] == [15]
    assert launch_changes(jd) == []  # its digest moved with it: not "job.json was edited since the launch"
    spec = jd.read_job()
    assert checkpoint_versions(spec, earlier=earlier_iterations(jd)) == [40, 20, 15]  # v15: where it ended
    assert checkpoint_versions(spec) == [40, 20]  # (every 20 of 40: without the count it had, no v15)


@pytest.mark.parametrize("count", ["15", "9"])
def test_a_count_the_job_trained_already_is_refused_and_changes_nothing(tmp_path: Path, count: str) -> None:
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    before = files(jd.path)
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", count)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    if count == "15":  # the count it has: a plain resume, of a job that finished
        assert "finished (15/15 iterations); nothing to resume" in r.stderr, r.stderr
        assert f"`rlctl launch --resume {jd.path.name} --iterations 30`" in r.stderr
    else:
        assert r.stderr.startswith(
            f"rlctl: error: --iterations 9: job {jd.path.name} trained 15 iterations already; the count is the job's "
            "total, so more than 15"
        ), r.stderr
    assert files(jd.path) == before


def test_a_stopped_job_may_end_sooner_but_not_under_its_staleness_bound(tmp_path: Path) -> None:
    jd = ended(tmp_path / "run", "stopped", iterations=2, indexed="stopped")
    spec = jd.read_job()
    async4 = spec.model_copy(update={"pipeline": Pipeline(mode="async", staleness=4)})
    spec, line = with_iterations(jd, 8)
    assert spec.iterations == 8 and line == "iterations 15 → 8 (--iterations), from 2 trained"
    jd.write_job(async4, source="x")
    with pytest.raises(
        UsageError, match=r"^--iterations 3: fewer than the job's pipeline.staleness 4; use at least 4$"
    ):
        with_iterations(jd, 3)
    cosine = async4.model_copy(update={"algorithm": async4.algorithm.model_copy(update={"lr_decay": "cosine"})})
    jd.write_job(cosine, source="x")
    assert with_iterations(jd, 30)[1] == (
        "iterations 15 → 30 (--iterations), from 2 trained; lr_decay cosine now ends at iteration 30 (it ended at 15)"
    )
    assert with_iterations(jd, 15) == (cosine, None)


def test_a_finished_job_whose_metrics_are_not_here_is_refused_by_its_summary(tmp_path: Path) -> None:
    # (a controller on another site, its record not fetched): counted 0 trained, it was resumed, and --iterations 5
    # was taken for a job its summary says trained 15
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    jd.metrics.unlink()
    with pytest.raises(UsageError, match=r"^job run: finished \(15/15 iterations\); nothing to resume"):
        refuse_if_finished(jd, state="finished")
    with pytest.raises(UsageError, match=r"^--iterations 5: job run trained 15 iterations already"):
        with_iterations(jd, 5)


def test_a_finished_job_neither_of_whose_counts_is_here_is_refused_by_its_index(tmp_path: Path) -> None:
    # no metrics and no summary here (its controller's site not fetched from): counted 0 trained, under its planned
    # 15, it was taken for a job whose count was raised since it finished, and resumed
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    jd.metrics.unlink()
    jd.summary_json.unlink()
    with pytest.raises(UsageError, match=r"^job run: finished; nothing to resume"):
        refuse_if_finished(jd, state="finished")


@pytest.mark.parametrize("count", [7, 8, 9])
def test_a_count_past_the_checkpoint_the_resume_continues_from_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    # its metrics say 9 trained, its latest complete checkpoint is v6: the resume trains on from v6, but a count of
    # 7 to 9 was refused as "trained 9 iterations already"
    jd = ended(tmp_path / "run", "stopped", iterations=9, indexed="stopped")
    checkpointed(jd, 3, 6)
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", str(count))
    assert r.exit_code == 0, r.stderr
    assert said == [f"job demo: iterations 15 → {count} (--iterations), from checkpoint v6 (9 trained)"]
    assert launched["spec"].iterations == count and launched["job_json"]["job"]["iterations"] == count


def test_a_count_at_or_under_the_checkpoint_the_resume_continues_from_is_refused_naming_both(tmp_path: Path) -> None:
    jd = ended(tmp_path / "run", "stopped", iterations=9, indexed="stopped")
    checkpointed(jd, 3, 6)
    before = files(jd.path)
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", "6")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        f"rlctl: error: --iterations 6: job {jd.path.name} trained 9 iterations, and the resume continues from its "
        "latest complete checkpoint v6; the count is the job's total, so more than 6"
    ), r.stderr
    assert files(jd.path) == before


def hand_edit_iterations(jd: JobDir, iterations: int) -> None:
    """job.json's count edited by hand: its digest left as it was."""
    data = json.loads(jd.job_json.read_text())
    data["job"]["iterations"] = iterations
    jd.job_json.write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize("more", [None, "60"])
def test_a_count_edited_into_job_json_by_hand_keeps_the_count_before_among_the_earlier_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, more: str | None
) -> None:
    # finished at 15, its count edited to 40 in job.json: the resume ran to 40 but left 15 out of `iterations_before`,
    # so v15, where it ended, was no checkpoint it could take (with `every_iterations` 20: v20 or the start)
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    checkpointed(jd, 15)
    hand_edit_iterations(jd, 40)
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path), *(["--iterations", more] if more else []))
    assert r.exit_code == 0, r.stderr
    if more is None:
        assert said == [
            f"job demo: {jd.job_json} was edited since the launch (iterations): the resume runs the job as edited there"
        ]
    else:  # it said "job.json was edited since the launch (iterations): the resume runs the job as edited there",
        # though the count it runs is --iterations'
        assert said == ["job demo: iterations 40 → 60 (--iterations), from 15 trained"]
    data = launched["job_json"]
    assert data["job"]["iterations"] == int(more or 40)
    assert data["iterations_before"] == ([15] if more is None else [15, 40])
    assert 15 in checkpoint_versions(jd.read_job(), earlier=earlier_iterations(jd))
    assert launch_changes(jd) == []  # recorded: the next resume does not say it again


@pytest.mark.parametrize("hand_edited", [False, True])
def test_a_roll_back_refused_at_its_start_leaves_job_json_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hand_edited: bool
) -> None:
    # `--checkpoint 5 --iterations 12` whose v5 then failed to verify on its site: the run put the summary and the
    # index state back, but job.json kept 12 (and the next plain resume ran to 12)
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    checkpointed(jd, 5, 10, 15)
    if hand_edited:  # (a count edited by hand, which the resume writes as its own: left as edited too)
        hand_edit_iterations(jd, 14)
    before = jd.job_json.read_bytes()
    written: list[int] = []

    class Runs:
        run = None

        def start(self, *, resume: bool, checkpoint: int | None = None, warnings: list[str] | None = None) -> str:
            written.append(jd.read_job().iterations)
            self.run = SimpleNamespace(unstarted=True)  # (`JobRun._unstart` put the summary and index row back)
            raise UsageError("--checkpoint v5: trainer part: trainer/state.json is missing")

    def be_launcher(
        jd_: JobDir, spec: object, plan: object, db: JobDB, begin: object, output: object, **_: object
    ) -> None:
        try:
            begin(Runs(), lambda line: None)  # type: ignore[operator]
        finally:
            db.close()

    monkeypatch.setattr(resume_cmd, "be_launcher", be_launcher)
    r = run_cli("launch", "--resume", str(jd.path), "--checkpoint", "5", "--iterations", "12")
    assert r.exit_code == 2 and r.stderr.startswith("rlctl: error: --checkpoint v5: trainer part:"), r.stderr
    assert written == [12]  # (its agents would have read it)
    assert jd.job_json.read_bytes() == before


def test_a_finished_job_whose_count_was_raised_is_resumed_without_it(tmp_path: Path) -> None:
    """The count written and its run ended before training (a failed start): a plain `--resume` goes on to it."""
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    jd.write_job(jd.read_job().model_copy(update={"iterations": 20}), source="x")
    refuse_if_finished(jd, state="finished")  # nothing raised


def checkpointed(jd: JobDir, *versions: int, set_aside: tuple[int, ...] = ()) -> None:
    """The job's events: checkpoints `versions` completed, then a resume that set `set_aside` aside."""
    for v in versions:
        jd.event("checkpoint", version=v)
    if set_aside:
        jd.event("resumed_from", version=min(versions), set_aside=list(set_aside))


def test_a_roll_back_resumes_from_the_checkpoint_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a run whose reward collapsed after v5 could only be resumed from its latest checkpoint
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    checkpointed(jd, 5, 10, 15)
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path), "--checkpoint", "v5", "--iterations", "12")
    assert r.exit_code == 0, r.stderr
    assert (launched["resume"], launched["checkpoint"], launched["spec"].iterations) == (True, 5, 12)
    assert said == ["job demo: iterations 15 → 12 (--iterations), from checkpoint v5 (15 trained)"]  # the roll-back


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--checkpoint", "v10"], "--checkpoint v10: no such complete checkpoint; this job has v5, v15"),
        (["--checkpoint", "ten"], "--checkpoint 'ten': a checkpoint's version, e.g. 20 or v20; this job has v5, v15"),
        (["--checkpoint", "15"], "--checkpoint v15: the job's last (15 iterations); nothing after it to train"),
        (
            ["--checkpoint", "5", "--iterations", "5"],
            "--iterations 5: job {id} trained 15 iterations, and the resume continues from v5 (--checkpoint); the "
            "count is the job's total, so more than 5",
        ),
    ],
)
def test_a_roll_back_to_no_checkpoint_of_the_job_is_refused_and_changes_nothing(
    tmp_path: Path, args: list[str], error: str
) -> None:
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    checkpointed(jd, 5, 10, 15, set_aside=(10, 15))  # set aside by a resume from v5, since
    jd.event("checkpoint", version=15)  # (that run's own v15)
    before = files(jd.path)
    r = run_cli("launch", "--resume", str(jd.path), *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"rlctl: error: {error.format(id=jd.path.name)}"), r.stderr
    assert files(jd.path) == before


def test_a_roll_back_given_a_count_it_has_trained_is_told_how_to_roll_back_with_more(tmp_path: Path) -> None:
    # the hint was `rlctl launch --resume ID --iterations 30`, without the --checkpoint: taken as it was, it resumed
    # from the latest checkpoint, not the one the operator rolled back to
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    checkpointed(jd, 5, 10, 15)
    r = run_cli("launch", "--resume", str(jd.path), "--checkpoint", "v5", "--iterations", "4")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        "rlctl: error: --iterations 4: job run trained 15 iterations, and the resume continues from v5 (--checkpoint); "
        "the count is the job's total, so more than 5"
    ), r.stderr
    hint = "(hint: e.g. `rlctl launch --resume run --checkpoint 5 --iterations 30`)"
    assert r.stderr.rstrip().endswith(hint), r.stderr


def test_a_roll_back_to_a_checkpoint_checkpoint_keep_let_go_is_refused(tmp_path: Path) -> None:
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    spec = jd.read_job()
    jd.write_job(spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"keep": 2})}), source="x")
    checkpointed(jd, 5, 10, 15)
    r = run_cli("launch", "--resume", str(jd.path), "--checkpoint", "5")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.startswith("rlctl: error: --checkpoint 5: no such complete checkpoint; this job has v10, v15")


def test_a_checkpoint_without_a_resume_is_refused() -> None:
    r = run_cli("launch", str(DEMO), "--checkpoint", "5")
    assert r.exit_code == 2 and "--checkpoint names where a resume continues from" in r.stderr, r.stderr


def test_a_new_count_in_a_job_json_without_digests_names_no_field_edited(tmp_path: Path) -> None:
    # it wrote a digest of `iterations` alone into a job.json that kept none (an rlctl before the digests), so the
    # resume said every other field of it (algorithm, batch, …) was edited by hand since the launch
    jd = ended(tmp_path / "run", "done", iterations=15, indexed="finished")
    data = json.loads(jd.job_json.read_text())
    del data["job_sha256"]
    jd.job_json.write_text(json.dumps(data))
    write_iterations(jd, 40)
    assert jd.read_job().iterations == 40 and earlier_iterations(jd) == [15]
    assert launch_changes(jd) == []
    assert "job_sha256" not in json.loads(jd.job_json.read_text())


def test_a_roll_back_of_a_job_whose_controller_ran_on_another_site_reads_that_sites_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its launcher gone before the run ended fetched none of them: the checkpoints the site's events name were
    # 'no such complete checkpoint' to the roll-back, while `rlctl status` (which fetches them) listed them
    from rlctl.config.inventory import Site
    from rlctl.launch.stage import write_staged

    jd = ended(tmp_path / "run", "stopped", iterations=12, indexed="stopped")
    far = tmp_path / "w" / "jobs" / jd.id
    far.mkdir(parents=True)
    site = Site.model_validate({"datacenter": "d", "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}],
                                "scheduler": {"kind": "local", "workdir": str(tmp_path / "w")}})  # fmt: skip
    write_sites(jd.path, {"local": site})
    write_staged(jd.path, {"local": {"roots": {"localhost": str(far)}}})
    checkpointed(jd, 5)  # here, as the launcher last fetched them
    (far / "events.jsonl").write_text("".join(json.dumps({"t": 1.0 + v, "event": "checkpoint", "version": v}) + "\n"
                                              for v in (5, 10)))  # fmt: skip
    launched, _ = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path), "--checkpoint", "10")
    assert r.exit_code == 0, r.stderr
    assert launched["checkpoint"] == 10


def test_the_hints_of_a_job_dir_the_index_lacks_name_it_by_its_directory(tmp_path: Path) -> None:
    # (a copied job dir, an index lost) they named it by its id, `rlctl status run`, `rlctl launch --resume run …`:
    # 'no job 'run' in the index'
    jd = ended(tmp_path / "copied" / "run", "done", iterations=15, indexed=None)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    assert f"`rlctl status {jd.path}` shows how it ended" in r.stderr, r.stderr
    assert f"`rlctl launch --resume {jd.path} --iterations 30`" in r.stderr, r.stderr
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", "9")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.rstrip().endswith(f"(hint: e.g. `rlctl launch --resume {jd.path} --iterations 30`)"), r.stderr


def test_a_count_edited_by_hand_from_one_the_job_names_nowhere_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stopped at 7 of 15 before any checkpoint, its summary naming no planned count: the count its digest was taken
    # of is none the job's record names (`hand_edited_from`), and job.json was left as it was: every resume said
    # "job.json was edited since the launch (iterations)" again
    jd = ended(tmp_path / "run", "stopped", iterations=7, indexed="stopped")
    summary = json.loads(jd.summary_json.read_text())
    del summary["iterations_planned"]
    jd.summary_json.write_text(json.dumps(summary))
    hand_edit_iterations(jd, 40)
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert said == [
        f"job demo: {jd.job_json} was edited since the launch (iterations): the resume runs the job as edited there"
    ]
    data = launched["job_json"]
    assert data["job"]["iterations"] == 40 and data.get("iterations_before", []) == []
    assert launch_changes(jd) == []  # recorded: the next resume does not say it again


def test_a_resume_of_a_running_job_the_index_lacks_names_its_directory_in_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # resumed by its directory (a moved job dir), its controller answering: the hint said `rlctl attach run` and
    # `rlctl stop run`, an id that names no job in the index (`attach` refuses a job the index lacks by any name:
    # the hint names status and stop, e810fd77)
    from rlctl.ops import refusals

    jd = ended(tmp_path / "my run", "failed", iterations=5, indexed=None)
    launched_by(jd, monkeypatch)

    class Answers:
        def close(self) -> None:
            pass

    monkeypatch.setattr(refusals, "connect_client", lambda jobdir, *, timeout_s, name: Answers())
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    named = f"'{jd.path}'"
    assert "its controller answers, and this machine's job index does not hold it" in r.stderr, r.stderr
    assert f"`rlctl status {named}` shows it; `rlctl stop {named}` ends it" in r.stderr, r.stderr


def test_a_resume_of_a_job_json_edited_in_its_samples_per_prompt_is_refused_in_one_line_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it started, said 'job.json was edited since the launch (batch)', and ran the checkpoint's groups of the launch's
    # size beside new ones of the edited size
    jd = ended(tmp_path / "run", "failed: trainer trainer-0 was lost", iterations=10, indexed="failed")
    checkpointed(jd, 5)
    data = json.loads(jd.job_json.read_text())
    was = data["job"]["batch"]["samples_per_prompt"]
    data["job"]["batch"]["samples_per_prompt"] = was * 2
    jd.job_json.write_text(json.dumps(data, indent=2))
    before = files(jd.path)
    launched, _ = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        f"rlctl: error: {jd.job_json}: job.batch.samples_per_prompt was edited since the launch ({was} → {was * 2})"
    ), r.stderr
    assert launched == {} and files(jd.path) == before


def test_a_resume_of_a_job_that_completed_no_checkpoint_takes_a_fixed_field_edit_and_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # refused as for a job with checkpoints ('its checkpoints' groups have the launch's samples each'), though a job
    # that completed none starts from the beginning, which nothing of the launch holds back
    jd = ended(tmp_path / "run", "failed: trainer trainer-0 was lost", iterations=3, indexed="failed")
    data = json.loads(jd.job_json.read_text())
    data["job"]["batch"]["samples_per_prompt"] *= 2
    jd.job_json.write_text(json.dumps(data, indent=2))
    launched, said = launched_by(jd, monkeypatch)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 0, r.stderr
    assert launched["resume"] is True and launched["checkpoint"] is None
    assert said == [
        f"job demo: {jd.job_json} was edited since the launch (batch): the resume runs the job as edited there"
    ]


def test_a_resume_of_a_moved_job_by_its_id_says_to_name_its_directory_which_resumes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its hint was `rlctl status --all` alone, which lists the row whose directory is gone: nothing said that the job
    # goes on by its directory where it is now
    jd = ended(tmp_path / "run", "failed: trainer trainer-0 was lost", iterations=7, indexed="failed")
    checkpointed(jd, 5)
    moved = JobDir(jd.path.rename(tmp_path / "elsewhere"))
    r = run_cli("launch", "--resume", jd.id)
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.rstrip().endswith(
        f"(hint: moved elsewhere? name the job by its directory where it is now, not {jd.id}; `rlctl status --all` "
        "lists the jobs in the index)"
    ), r.stderr
    launched, _ = launched_by(moved, monkeypatch)
    r = run_cli("launch", "--resume", str(moved.path))
    assert r.exit_code == 0, r.stderr
    assert launched["resume"] is True


@pytest.mark.parametrize("renamed", [True, False])
def test_a_resume_of_a_moved_job_dir_by_its_directory_moves_its_index_row_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renamed: bool
) -> None:
    """A job dir moved (or renamed) since its launch, resumed by its directory: the job keeps its id, recorded in the
    directory before its run starts, so that the run's row (put under it: `JobRun._register`) is the job's row,
    moved there; versus, renamed, the new directory's name: a second row beside the old one, whose directory is gone
    (`rlctl status --all` listed the job twice). A copy of a job dir whose original is still there is another job."""
    jd = JobDir.create("demo", explicit=tmp_path / "run")
    jd.secret()  # (every launched job has one: its launch writes it first)
    jd = ended(jd.path, "failed: trainer trainer-0 was lost", iterations=7, indexed="failed")
    checkpointed(jd, 5)
    (tmp_path / "elsewhere").mkdir()
    moved = JobDir(jd.path.rename(tmp_path / "elsewhere" / ("run-2" if renamed else "run")))
    launched, _ = launched_by(moved, monkeypatch)
    r = run_cli("launch", "--resume", str(moved.path))
    assert r.exit_code == 0 and launched["resume"] is True, r.stderr
    here = JobDir(moved.path)
    assert here.id == "run"  # what the run, its agents and `rlctl status` read
    with closing(JobDB(default_home() / "jobs.db")) as db:
        db.put(here.id, job_dir=str(here.path), spec={"name": "demo"})  # the run's `launching` row
        assert [(row.name, row.job_dir) for row in db.list()] == [("run", str(moved.path))]
    copy = JobDir(Path(shutil.copytree(moved.path, tmp_path / "copy")))
    (copy.path / ".job-id").unlink(missing_ok=True)
    launched_by(copy, monkeypatch)
    assert run_cli("launch", "--resume", str(copy.path)).exit_code == 0
    assert JobDir(copy.path).id == "copy"  # its original is still there: not taken for it


def test_a_resume_of_a_job_json_edited_into_an_invalid_value_exits_2_naming_the_field_and_the_fix(
    tmp_path: Path,
) -> None:
    # job.json is where a resumed job's settings are changed by hand; a value a job file would refuse was exit 1 (a
    # runtime failure), hinting "was it edited?"
    jd = ended(tmp_path / "run", "failed: trainer trainer-0 was lost", iterations=7, indexed="failed")
    checkpointed(jd, 5)
    data = json.loads(jd.job_json.read_text())
    data["job"]["checkpoint"]["keep"] = -1
    jd.job_json.write_text(json.dumps(data, indent=2))
    before = files(jd.path)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"rlctl: error: {jd.job_json}: job.checkpoint.keep: "), r.stderr
    assert r.stderr.rstrip().endswith(
        "(hint: edit job.checkpoint.keep in job.json to a valid value (the resume runs the job as edited there))"
    ), r.stderr
    assert files(jd.path) == before
