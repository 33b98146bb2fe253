"""`rlctl status JOB --checkpoints`: each complete checkpoint with when it was written, the sampled reward of the
iterations that made it and its held-out figures (rlctl.ops.checkpoints)."""

from __future__ import annotations

import contextlib
import json
import re
import time
import tracemalloc
from pathlib import Path

import pytest

from rlctl.checkpoint.controller import load_controller
from rlctl.checkpoint.files import latest_complete, set_latest, write_part
from rlctl.config import load_job
from rlctl.config.inventory import Site
from rlctl.errors import CheckpointError, UsageError
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.sitefs import LocalFiles
from rlctl.launch.stage import write_staged
from rlctl.ops.checkpoints import best_checkpoint, checkpoint_table
from rlctl.ops.extend import completed_checkpoints, rollback_to
from rlctl.ops.jobdb import JobDB
from rlctl.ops.pull import checkpoint_parts
from rlctl.ops.resumepoint import pick_checkpoint
from tests.conftest import ROOT, run_cli


def _job(tmp_path: Path, *, keep: int = 0) -> JobDir:
    """A demo job dir: 30 iterations whose reward is its iteration / 100, checkpoints v10, v20, v30."""
    jd = JobDir.create("ck", explicit=tmp_path / "ck")
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    jd.write_job(spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"keep": keep})}), source="x")
    for i in range(30):
        jd.append(jd.metrics, {"iteration": i, "reward_mean": i / 100})
        if (i + 1) % 10 == 0:
            jd.event("checkpoint", version=i + 1)
    return jd


def test_each_checkpoint_has_the_reward_of_the_iterations_that_made_it_and_its_heldout_figures(tmp_path: Path) -> None:
    jd = _job(tmp_path)
    for v, exact in ((0, 0.1), (20, 0.4)):  # evaluated during the run: v0 and v20
        jd.append(jd.evaluations, {"version": v, "greedy_reward": exact + 0.2, "greedy_exact": exact, "prompts": 8})
    t = checkpoint_table(jd)
    rows = t["checkpoints"]
    assert [(r["version"], r["iterations"], r["reward_mean"], r["latest"]) for r in rows] == [
        (10, [1, 10], 0.045, False),  # iterations 0 … 9 of metrics.jsonl
        (20, [11, 20], 0.145, False),
        (30, [21, 30], 0.245, True),
    ]
    assert [r["heldout"] for r in rows] == [
        None,
        {"greedy_exact": 0.4, "greedy_reward": 0.6000000000000001, "prompts": 8},
        None,
    ]
    assert t["heldout_start"] == {"greedy_exact": 0.1, "greedy_reward": 0.30000000000000004, "prompts": 8}
    assert all(abs(r["written_at"] - time.time()) < 60 for r in rows)


def test_the_table_reads_no_event_but_the_checkpoints_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it parsed every event of the job twice: a job of weeks writes a weights_applied event per unit and weight
    # version (640,000 lines after 10^4 versions of 64 units)
    jd = _job(tmp_path)
    with jd.events.open("a") as f:
        f.write("".join(json.dumps({"t": 1.0, "event": "weights_applied", "version": v}) + "\n" for v in range(300)))
    jd.event("checkpoint", version=40)
    want = checkpoint_table(jd)
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    assert checkpoint_table(jd) == want and [r["version"] for r in want["checkpoints"]] == [10, 20, 30, 40]
    assert [s for s in parsed if "weights_applied" in s] == []


def test_a_rolled_back_job_lists_what_it_holds_now_and_the_evaluation_after_it_ended(tmp_path: Path) -> None:
    # rolled back to v10 (v20, v30 set aside), then trained on to v30 again with other rewards; evaluated after the job
    jd = _job(tmp_path)
    jd.event("resumed_from", version=10, set_aside=[20, 30])
    rows = jd.read_lines(jd.metrics)[:10] + [{"iteration": i, "reward_mean": 0.9} for i in range(10, 30)]
    jd.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))  # the run cut them back to v10
    for v in (20, 30):
        jd.event("checkpoint", version=v)
    heldout = {"prompts": 16, "greedy_exact_first": 0.0, "greedy_exact_last": 0.5}
    heldout |= {"greedy_reward_first": 0.25, "greedy_reward_last": 0.75}
    jd.summary_json.write_text(json.dumps({"state": "done", "iterations": 30, "heldout": heldout}))
    t = checkpoint_table(jd)
    assert [(r["version"], r["reward_mean"]) for r in t["checkpoints"]] == [(10, 0.045), (20, 0.9), (30, 0.9)]
    assert t["checkpoints"][-1]["heldout"] == {"greedy_exact": 0.5, "greedy_reward": 0.75, "prompts": 16}
    assert t["heldout_start"] == {"greedy_exact": 0.0, "greedy_reward": 0.25, "prompts": 16}


def test_checkpoints_let_go_are_not_listed_and_the_next_counts_from_them(tmp_path: Path) -> None:
    jd = _job(tmp_path, keep=2)  # checkpoint.keep 2: v10 pruned
    rows = checkpoint_table(jd)["checkpoints"]
    assert [(r["version"], r["iterations"]) for r in rows] == [(20, [11, 20]), (30, [21, 30])]


def test_a_keep_lowered_since_lets_go_only_what_the_controller_pruned(tmp_path: Path) -> None:
    # keep 3 when v10…v30 were written, lowered to 1 in job.json since (to free a full disk): nothing is pruned until
    # the next checkpoint completes, so v10 is still one to go back to; the current keep listed v30 alone and
    # `launch --resume --checkpoint 10` was refused ('no such complete checkpoint; this job has v30')
    jd = JobDir.create("ck", explicit=tmp_path / "ck")
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    jd.write_job(spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"keep": 1})}), source="x")
    for v in (10, 20, 30):
        jd.event("checkpoint", version=v, keep=3)
    assert completed_checkpoints(jd) == [10, 20, 30]
    assert rollback_to(jd, "v10") == 10
    jd.event("checkpoint", version=40, keep=1)
    jd.event("checkpoints_pruned", versions=[10, 20, 30], keep=1)  # as the controller says it at v40
    assert completed_checkpoints(jd) == [40]
    with pytest.raises(UsageError, match="no such complete checkpoint; this job has v40"):
        rollback_to(jd, "10")


def test_a_checkpoint_event_without_its_time_is_listed_with_none(tmp_path: Path) -> None:
    jd = _job(tmp_path)
    jd.append(jd.events, {"event": "checkpoint", "version": 40, "t": "noon"})  # edited by hand
    assert checkpoint_table(jd)["checkpoints"][-1]["written_at"] is None
    for t in (1e20, -5.0):  # a number no clock reads: status and report raised on it (localtime's OverflowError)
        jd.append(jd.events, {"event": "checkpoint", "version": 40, "t": t})
        assert checkpoint_table(jd)["checkpoints"][-1]["written_at"] is None


def test_status_checkpoints_prints_the_table_and_how_to_go_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job(tmp_path)
    r = run_cli("status", str(jd.path), "--checkpoints")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"Job {jd.path.name}: 3 complete checkpoints"
    assert [line.split()[0::4] for line in lines if line.startswith("v")] == [
        ["v10", "0.045"],
        ["v20", "0.145"],
        ["v30", "0.245"],
    ]
    assert lines[-1] == (
        f"`rlctl launch --resume {jd.path} --checkpoint V` continues from V; `rlctl pull {jd.path} --checkpoint V` "
        "copies its model here"
    )
    data = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)
    assert [c["version"] for c in data["checkpoints"]] == [10, 20, 30]


@pytest.mark.parametrize(("extra", "says"), [("--all", "--all"), ("--watch", "--watch")])
def test_status_checkpoints_refuses_all_and_watch(
    extra: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    r = run_cli("status", "--checkpoints", extra)
    assert r.exit_code == 2
    assert f"--checkpoints lists one job's checkpoints once: it takes no {says}" in r.stderr


def test_status_checkpoints_of_a_job_never_prepared_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job in the index whose launch ended before it wrote job.json (or still prepares it): one usage line naming
    that, exit 2, versus 'cannot read the resolved job: [Errno 2] …', exit 1."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("ck", explicit=tmp_path / "ck")
    with contextlib.closing(JobDB()) as db:
        db.put(jd.id, job_dir=str(jd.path), spec={}, info={"source": "jobs/demo.yaml"})
        db.update(jd.id, state="failed")
    r = run_cli("status", jd.id, "--checkpoints")
    assert r.exit_code == 2, r.stderr
    assert "was never prepared" in r.stderr and "no checkpoints to list" in r.stderr, r.stderr


def test_best_of_a_job_that_evaluates_during_the_run_says_why_no_checkpoint_has_figures(tmp_path: Path) -> None:
    # it said "set evaluation.heldout_prompts and every_iterations to evaluate during the run" of a job that sets
    # them: one that completed no checkpoint yet, or whose checkpoints are none of the versions it evaluated
    jd = JobDir.create("ev", explicit=tmp_path / "ev")
    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    jd.write_job(spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"every_iterations": 25})}),
                 source="x")  # fmt: skip
    with pytest.raises(UsageError) as e:
        best_checkpoint(jd)
    assert str(e.value) == "--checkpoint best: job ev completed no checkpoint yet"
    for v in (10, 20):
        jd.event("checkpoint", version=v)
    jd.append(jd.evaluations, {"version": 0, "greedy_reward": 0.3, "prompts": 8})
    with pytest.raises(UsageError) as e:
        best_checkpoint(jd)
    assert str(e.value) == (
        "--checkpoint best: no complete checkpoint of job ev has held-out figures (the run evaluates every 25 "
        "versions; none of its checkpoints (v10, v20) is one it evaluated yet); name a version instead"
    )


@pytest.mark.parametrize(
    ("heldout_prompts", "why"),
    [
        (512, "the job evaluates its final checkpoint only, once its last iteration is done; set "
              "evaluation.every_iterations to evaluate during the run"),
        (0, "set evaluation.heldout_prompts and evaluation.every_iterations to evaluate during the run"),
    ],
)  # fmt: skip
def test_best_of_a_job_that_evaluates_after_the_run_only_names_the_evaluations_fields(
    heldout_prompts: int, why: str, tmp_path: Path
) -> None:
    # a job stopped before its end (the demo's held-out prompts, no every_iterations): it said "set
    # evaluation.heldout_prompts and every_iterations", of a job that sets the one, naming the other as the
    # checkpoint's field is named (checkpoint.every_iterations)
    jd = _job(tmp_path)
    spec = jd.read_job()
    jd.write_job(
        spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"heldout_prompts": heldout_prompts})}),
        source="x",
    )
    with pytest.raises(UsageError) as e:
        best_checkpoint(jd)
    assert str(e.value) == (
        f"--checkpoint best: no complete checkpoint of job ck has held-out figures ({why}); name a version instead"
    )


def test_the_table_holds_a_reward_per_iteration_not_the_metrics_rows(tmp_path: Path) -> None:
    # a job of weeks: 10⁵ metrics rows of a few kB each (its agents' figures), hundreds of MB that the table read
    # whole (the text, then every row parsed) to keep one number per row
    jd = _job(tmp_path)
    agents = {f"rollout-{k}": {"role": "rollout", "site": "h20", "busy_s": 1.5, "state": "running"} for k in range(64)}
    rows = ({"iteration": i, "reward_mean": 0.5, "agents": agents} for i in range(30, 630))
    with jd.metrics.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    jd.event("checkpoint", version=630)
    size = jd.metrics.stat().st_size
    tracemalloc.start()
    try:
        rows = checkpoint_table(jd)["checkpoints"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(r["version"], r["reward_iterations"], r["reward_mean"]) for r in rows][-1] == (630, 600, 0.5)
    assert size > 2_500_000 and peak < size // 10, (size, peak)  # was the file's size and more (~4 × it)


def _parts(jd: JobDir) -> None:
    """`_job`'s checkpoints written by a local launch: both parts of each, on the local site, in the job dir."""
    site = {"datacenter": "a", "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}]}
    site["scheduler"] = {"kind": "local"}
    jd.write_json(jd.plan_json, {"trainer": {"site": "local", "ranks": 1}, "controller_site": "local", "rollout": []})
    write_sites(jd.path, {"local": Site.model_validate(site)})
    write_staged(jd.path, {"local": {"roots": {"localhost": str(jd.path)}, "files": []}})
    for v in (10, 20, 30):
        weights = {"model": lambda p, v=v: p.mkdir() or (p / "w.bin").write_bytes(bytes(v))}
        digest = write_part(jd.checkpoint(v), "trainer", weights, meta={"counters": {"version": v}})
        state = {"controller": lambda p: p.mkdir() or (p / "state.json").write_text("{}")}
        write_part(jd.checkpoint(v), "controller", state, meta={"version": v, "trainer_digest": digest})


def test_status_checkpoints_marks_one_whose_manifest_is_damaged_and_does_not_call_it_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v30's MANIFEST.trainer.json cut short: the table, which read the events alone, listed v30 as 'latest' (under a
    column without a header), and the pull then warned and fell back; its manifests are read here (a local site),
    not its weights hashed: v30 damaged, v20 the latest."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job(tmp_path)
    _parts(jd)
    data = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)
    assert [(c["version"], c["latest"], c["damaged"]) for c in data["checkpoints"]] == [
        (10, False, None), (20, False, None), (30, True, None),
    ]  # fmt: skip
    assert data["manifests_checked"] == ["controller", "trainer"]
    manifest = jd.checkpoint(30) / "MANIFEST.trainer.json"
    manifest.write_text(manifest.read_text()[:20])
    (jd.checkpoint(10) / "model" / "w.bin").write_bytes(b"")  # a weights file cut short: its size tells it
    r = run_cli("status", str(jd.path), "--checkpoints")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"Job {jd.path.name}: 3 complete checkpoints (2 of them damaged since)"
    assert lines[1].split()[-3:] == ["held-out", "(greedy)", "state"]  # the last column has a header
    rows = {line.split()[0]: line for line in lines if line.startswith("v")}
    assert rows["v10"].endswith(
        "damaged: trainer part: model/w.bin does not match MANIFEST.trainer.json: 0 bytes, 10 listed"
    )
    assert rows["v20"].endswith(" latest")
    assert "damaged: trainer part: MANIFEST.trainer.json does not parse (JSONDecodeError" in rows["v30"]
    assert "latest" not in rows["v30"] and "not checked" not in r.stdout
    # the controller's part names another trainer part than the one there (a part copied in from another run)
    manifest.write_text(json.dumps({"part": "trainer", "files": {}, "counters": {"version": 30}}))
    data = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)
    assert data["checkpoints"][-1]["damaged"] == "its trainer part is not the one its controller part was written with"


@pytest.mark.parametrize(
    ("digest", "why"),
    [
        (None, "no trainer_digest"),  # left out
        ("", "trainer_digest '' is not a SHA-256"),
        ("d", "trainer_digest 'd' is not a SHA-256"),
        (7, "trainer_digest 7 is not a SHA-256"),
    ],
)
def test_a_controller_part_that_names_no_trainer_part_is_damaged_to_status_a_pull_a_resume_and_the_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digest: object, why: str
) -> None:
    """v30's MANIFEST.controller.json without its trainer_digest (or with one that is no SHA-256), the pointer at v30,
    v30 the best evaluated: `status --checkpoints` called it sound and the latest, `latest_complete` took it and so
    did a pull of the best, while a resume refused it (as naming another trainer part) and `load_controller` raised
    a KeyError's traceback. Now every one of them says it is damaged, why, and takes v20."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job(tmp_path)
    _parts(jd)
    set_latest(jd.checkpoints, 30)
    for v in (10, 20, 30):
        jd.append(jd.evaluations, {"version": v, "greedy_reward": v / 100, "greedy_exact": v / 100, "prompts": 8})
    manifest = jd.checkpoint(30) / "MANIFEST.controller.json"
    body = json.loads(manifest.read_text())
    body.pop("trainer_digest")
    manifest.write_text(json.dumps(body if digest is None else body | {"trainer_digest": digest}))
    line = f"controller part: MANIFEST.controller.json names no trainer part ({why})"
    data = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)
    assert [(c["version"], c["latest"], c["damaged"]) for c in data["checkpoints"]] == [
        (10, False, None), (20, True, None), (30, False, line),
    ]  # fmt: skip
    assert latest_complete(jd.checkpoints) == 20
    fs = LocalFiles()
    point = pick_checkpoint((fs, jd), (fs, jd))
    assert (point.version, point.skipped) == (20, ((30, line),))
    version, _, passed = best_checkpoint(jd, parts=checkpoint_parts(jd.path, remote=True))
    assert (version, [(r["version"], r["damaged"]) for r in passed]) == (20, [(30, line)])
    said = re.escape(line.removeprefix("controller part: "))
    with pytest.raises(CheckpointError, match=rf"iter-30: the controller's part is .*: {said}$"):
        load_controller(jd, 30)


def test_status_checkpoints_says_which_parts_it_did_not_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose record does not say where its parts are (here: never launched): the events' checkpoints as they
    are, and one line saying the manifests were not checked (a site reached over SSH is checked there:
    test_checkpoint_table_remote.py)."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job(tmp_path)
    r = run_cli("status", str(jd.path), "--checkpoints")
    assert r.exit_code == 0, r.stderr
    assert (
        "the trainer and controller parts' manifests not checked here (their site's files are not on this machine): "
        "a pull or a resume verifies every file"
    ) in r.stdout.splitlines()


@pytest.mark.parametrize("how", ["is missing", "is not a directory"])
def test_status_checkpoints_of_a_local_job_whose_checkpoints_directory_is_lost_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Its checkpoints/ gone from the job dir of a local launch: the table listed 3 complete checkpoints, v30 the
    latest, said 'their site's files are not on this machine' (they are: none are there) and suggested --resume
    and pull --checkpoint V."""
    import shutil

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job(tmp_path)
    _parts(jd)
    shutil.rmtree(jd.checkpoints)
    if how == "is not a directory":
        jd.checkpoints.write_text("x")
    r = run_cli("status", str(jd.path), "--checkpoints")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"Job {jd.path.name}: 3 complete checkpoints (3 of them damaged since)"
    assert lines[-1] == f"{jd.checkpoints} {how}: no checkpoint's files are there; put the directory back"
    assert "not on this machine" not in r.stdout and "--checkpoint V" not in r.stdout and " latest" not in r.stdout
    data = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)
    assert data["dirs_lost"] == [f"{jd.checkpoints} {how}"]
    assert [c["latest"] for c in data["checkpoints"]] == [False] * 3
