"""Which checkpoint `launch --resume` continues from: the newest whose two parts verify, each read on its own
site, older ones in turn; a damaged `latest.json` is never read as "start over"; no complete checkpoint is a
one-line refusal. And a controller lost without a summary names the resume command."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlctl.checkpoint.choose import (
    checkpoint_bytes,
    checkpoint_versions,
    checkpoints_at,
    checkpoints_held,
    checkpoints_set_aside,
    manifest_name,
    parse_latest,
)
from rlctl.checkpoint.files import manifest_path, set_aside_newer, set_latest, write_part
from rlctl.config.algorithm import PpoAlgorithm
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.config.lifecycle import Checkpoint
from rlctl.errors import LaunchError, RlctlError, UsageError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.backends import write_sites
from rlctl.launch.base import Resources
from rlctl.launch.jobdir import JobDir
from rlctl.launch.layout import PlannedAgent
from rlctl.launch.sitefs import LocalFiles
from rlctl.ops.autoresume import Runs
from rlctl.ops.jobdb import JobDB
from rlctl.ops.resumepoint import pick_checkpoint
from rlctl.ops.run import JobRun


def spec(iterations: int = 9, every: int = 3) -> JobFile:
    return JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "resume",
            "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits"},
            "iterations": iterations,
            "placement": {"trainer": {"site": "t", "gpus": 1}, "rollout": [{"site": "c", "gpus": 1}]},
            "checkpoint": {"every_iterations": every},
        }
    )


def files_part(ckpt: Path, part: str, text: str, *, meta: dict[str, Any] | None = None) -> str:
    def fill(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "state.json").write_text(text)

    return write_part(ckpt, part, {part: fill}, meta=meta)


def sharded_meta(split: dict[str, int]) -> dict[str, Any]:
    """What a trainer part's manifest says besides its files: the split and every rank's shard."""
    ranks = [{"rank": r, "file": f"ranks/rank-{r}.pt", "optimizer_sha256": f"{r}"} for r in range(split["world"])]
    return {"split": split, "ranks": ranks}


ONE_RANK = {"tp": 1, "pp": 1, "dp": 1, "world": 1}
TP2 = {"tp": 2, "pp": 1, "dp": 1, "world": 2}
FSDP_DP2 = {"tp": 1, "pp": 1, "dp": 2, "world": 2, "fsdp": True}


class Sites:
    """Two sites that share no filesystem: the controller's job dir and the trainer's."""

    def __init__(self, tmp_path: Path) -> None:
        self.c = JobDir.create("resume", explicit=tmp_path / "controller-site" / "job")
        self.t = JobDir.create("resume", explicit=tmp_path / "trainer-site" / "job")

    def checkpoint(self, version: int, *, latest: bool = True) -> None:
        """Both parts of checkpoint `version`, in the order the agents write them; then the pointer."""
        digest = files_part(
            self.t.checkpoint(version), "trainer", json.dumps({"weights": version}), meta=sharded_meta(ONE_RANK)
        )
        files_part(
            self.c.checkpoint(version),
            "controller",
            json.dumps({"iteration": version}),
            meta={"trainer_digest": digest},
        )
        if latest:
            set_latest(self.c.path / "checkpoints", version)

    def pick(self) -> Any:
        fs = LocalFiles()
        return pick_checkpoint((fs, self.c), (fs, self.t))


def test_the_newest_checkpoint_whose_parts_verify_on_their_own_sites_is_used(tmp_path: Path) -> None:
    sites = Sites(tmp_path)
    for v in (3, 6):
        sites.checkpoint(v)
    point = sites.pick()
    assert (point.version, point.skipped, point.pointer) == (6, (), "latest.json names v6")
    # the trainer's part is read on the trainer's site only: the controller's site has none
    assert not (sites.c.checkpoint(6) / "MANIFEST.trainer.json").exists()


class Racing(LocalFiles):
    """A site where a part of checkpoint directory `ckpt` is rewritten or removed between the launcher's reads: its
    manifest read, then gone when the files' checksums are taken."""

    def __init__(self, ckpt: Path) -> None:
        super().__init__()
        self.ckpt = ckpt

    def states(self, root: str, names: list[str], *, stop: Any = None) -> dict[str, Any]:
        if Path(root) == self.ckpt:
            for name in names:
                if name.startswith("MANIFEST."):
                    (Path(root) / name).unlink(missing_ok=True)
        return super().states(root, names, stop=stop)


def test_a_manifest_gone_as_it_was_read_is_a_checkpoint_not_used(tmp_path: Path) -> None:
    """v6's trainer manifest goes between the launcher's read of it and the checksums: v6 is not used, saying why,
    and v3 is, versus KeyError out of `verified_manifest` (a traceback, where its callers take ValueError for a
    part that does not verify)."""
    sites = Sites(tmp_path)
    for v in (3, 6):
        sites.checkpoint(v)
    point = pick_checkpoint((LocalFiles(), sites.c), (Racing(sites.t.checkpoint(6)), sites.t))
    assert point.version == 3
    assert point.skipped == ((6, "trainer part: MANIFEST.trainer.json went as it was read (the part rewritten or "
                              "removed meanwhile)"),)  # fmt: skip


def test_a_damaged_latest_pointer_is_not_read_as_start_over(tmp_path: Path) -> None:
    sites = Sites(tmp_path)
    for v in (3, 6):
        sites.checkpoint(v)
    (sites.c.path / "checkpoints" / "latest.json").write_text('{"vers')
    with pytest.raises(ValueError):
        parse_latest('{"vers')
    point = sites.pick()
    assert point.version == 6 and point.pointer.startswith("latest.json is damaged")


def test_a_newest_checkpoint_that_does_not_verify_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    sites = Sites(tmp_path)
    for v in (3, 6, 9):
        sites.checkpoint(v)
    state = sites.t.checkpoint(9) / "trainer" / "state.json"
    state.write_text(state.read_text().replace("9", "8"))  # same size, other bytes: the checksum fails
    manifest_path(sites.c.checkpoint(6), "controller").write_text("{not json")  # a damaged manifest
    point = sites.pick()
    assert point.version == 3
    assert [v for v, _ in point.skipped] == [9, 6]
    assert point.skipped[0][1].startswith(
        "trainer part: trainer/state.json does not match MANIFEST.trainer.json: SHA-256"
    )
    assert point.skipped[1][1].startswith("controller part: MANIFEST.controller.json does not parse")


def test_a_trainer_part_other_than_the_one_the_controller_part_names_is_not_used(tmp_path: Path) -> None:
    sites = Sites(tmp_path)
    for v in (3, 6):
        sites.checkpoint(v)
    files_part(sites.t.checkpoint(6), "trainer", json.dumps({"weights": "rewritten"}))  # verifies on its own
    point = sites.pick()
    assert point.version == 3
    assert point.skipped == ((6, "its trainer part is not the one its controller part was written with"),)


class Flaky(LocalFiles):
    """A site whose files under `away` do not read back for a while (a filesystem mounted late, a stale mount)."""

    def __init__(self, away: list[Path]) -> None:
        self.away = [str(p) for p in away]

    def read_text(self, path: str) -> str | None:
        return None if any(path.startswith(a) for a in self.away) else super().read_text(path)


def test_a_checkpoint_a_resume_passed_over_is_set_aside_and_a_lost_pointer_never_returns_to_it(tmp_path: Path) -> None:
    """Run A checkpoints v3, v6, v9; the trainer site's v6 and v9 do not read back when it is resumed, so the
    resume takes v3. Run B starts there (each agent sets its part of the newer ones aside, on its own site) and
    checkpoints v6; then latest.json is lost. The next resume takes B's v6, never A's v9, whose files read back
    again by then."""
    sites = Sites(tmp_path)
    for v in (3, 6, 9):
        sites.checkpoint(v)
    flaky = Flaky([sites.t.checkpoint(6), sites.t.checkpoint(9)])
    point = pick_checkpoint((LocalFiles(), sites.c), (flaky, sites.t))
    assert point.version == 3 and [v for v, _ in point.skipped] == [9, 6]
    moved = [
        set_aside_newer(
            sites.c.checkpoints, "controller", resumed=point.version, keep=0
        ),  # the controller, at its start
        set_aside_newer(sites.t.checkpoints, "trainer", resumed=point.version, keep=0),  # trainer rank 0, at its start
    ]
    digest = files_part(sites.t.checkpoint(6), "trainer", json.dumps({"run": "B"}), meta=sharded_meta(ONE_RANK))
    (sites.c.path / "checkpoints" / "latest.json").unlink()  # lost before B's controller part of v6
    assert sites.pick().version == 3
    assert moved == [[6, 9], [6, 9]]
    files_part(sites.c.checkpoint(6), "controller", json.dumps({"run": "B"}), meta={"trainer_digest": digest})
    point = sites.pick()
    assert (point.version, point.skipped, point.pointer) == (6, (), "no latest.json")
    assert json.loads((sites.c.checkpoint(6) / "controller" / "state.json").read_text()) == {"run": "B"}
    for jd, part in ((sites.c, "controller"), (sites.t, "trainer")):  # A's, kept whole beside the lineage
        assert sorted(p.name.split(".")[0] for p in (jd.checkpoints / "abandoned").iterdir()) == ["iter-6", "iter-9"]
        assert all((p / manifest_name(part)).is_file() for p in (jd.checkpoints / "abandoned").iterdir())


def test_no_complete_checkpoint_is_refused_in_one_line_not_restarted(tmp_path: Path) -> None:
    sites = Sites(tmp_path)
    sites.checkpoint(3)
    manifest_path(sites.t.checkpoint(3), "trainer").unlink()
    with pytest.raises(RlctlError) as e:
        sites.pick()
    msg = str(e.value)
    assert msg == (
        f"no complete checkpoint to resume from in {sites.c.checkpoints} (controller parts) and {sites.t.checkpoints} "
        "(trainer parts) (latest.json names v3; v3: trainer part: no MANIFEST.trainer.json)"
    )
    assert e.value.exit_code == 1 and e.value.hint is not None and "\n" not in msg + e.value.hint

    damaged = Sites(tmp_path / "other")  # a damaged pointer and no checkpoint at all: refused too
    (damaged.c.path / "checkpoints" / "latest.json").write_text("")
    with pytest.raises(RlctlError, match=r"latest.json is damaged .*no checkpoint on disk"):
        damaged.pick()


def test_a_job_that_never_completed_a_checkpoint_starts_over(tmp_path: Path) -> None:
    sites = Sites(tmp_path)
    files_part(sites.t.checkpoint(3), "trainer", "{}")  # the trainer's part only: the controller died first
    point = sites.pick()
    assert (point.version, point.skipped, point.pointer) == (0, (), "no latest.json")


def test_the_job_checkpoint_versions_are_the_trainers() -> None:
    assert checkpoint_versions(spec(10, 3)) == [10, 9, 6, 3]
    assert checkpoint_versions(spec(10, 0)) == [10]
    for every in (0, 1, 3, 10):  # the rule the trainer and a stopping controller ask of one version
        job = spec(10, every)
        assert [v for v in range(12) if checkpoints_at(job, v)] == sorted(checkpoint_versions(job))


def local_site(*, gpus: int = 2) -> Site:
    return Site.model_validate(
        {"datacenter": "d", "gpu": "CPU", "scheduler": {"kind": "local"}, "nodes": [{"host": "h", "gpus": gpus}]}
    )


def job_run(tmp_path: Path, *, db: Any = None) -> tuple[JobRun, Sites]:
    sites = Sites(tmp_path)
    plan = {"trainer": {"site": "t", "ranks": 1}, "rollout": [{"site": "c", "units": 1}], "controller_site": "c"}
    run = JobRun(sites.c, spec(), plan, db=db, sites={"c": local_site(), "t": local_site()})
    run.staged = {"c": {"roots": {"localhost": str(sites.c.path)}}, "t": {"roots": {"localhost": str(sites.t.path)}}}
    return run, sites


def test_job_run_resume_point_logs_what_it_used_and_says_what_it_skipped_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the skipped checkpoint's reason was a warning here and, in the same words, in the line the launcher says
    # (`Runs.start`): twice on the launch's stderr
    run, sites = job_run(tmp_path)
    for v in (3, 6):
        sites.checkpoint(v)
    (sites.t.checkpoint(6) / "trainer" / "state.json").unlink()
    trainer = PlannedAgent("trainer", 0, "t", Resources(1, 1, 1), ParallelConfig("trainer"))
    with caplog.at_level(logging.INFO, logger="rlctl.ops.runstart"):
        point = run.resume_point(trainer=trainer)
    assert point.version == 3
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{run.id}: resuming from checkpoint v3 (latest.json names v6)"]
    assert point.skipped == ((6, "trainer part: trainer/state.json is missing"),)

    def start(self: JobRun, *, resume: bool = False, checkpoint: int | None = None) -> None:
        self.resumed = point

    lines: list[str] = []
    monkeypatch.setattr(JobRun, "start", start)
    write_sites(sites.c.path, run.sites)
    Runs(sites.c, spec(), run.plan, db=None, say=lines.append).start(resume=True)
    assert lines == ["job resume: resumed from checkpoint v3; v6 not used: trainer part: trainer/state.json is missing"]


def test_a_resume_finds_the_checkpoints_on_disk_after_checkpoint_every_iterations_was_edited(tmp_path: Path) -> None:
    # the job checkpointed v3 and v6 at every_iterations 3, then job.json said 4: `--checkpoint 3` was 'not on the
    # controller's site' and a damaged v6 fell back to no checkpoint at all (the versions were those of 4: 9, 8, 4)
    run, sites = job_run(tmp_path)
    for v in (3, 6):
        sites.checkpoint(v)
    run.spec = spec(9, 4)
    trainer = PlannedAgent("trainer", 0, "t", Resources(1, 1, 1), ParallelConfig("trainer"))
    assert run.resume_point(trainer=trainer, only=3).version == 3
    (sites.t.checkpoint(6) / "trainer" / "state.json").unlink()
    point = run.resume_point(trainer=trainer)
    assert point.version == 3 and [v for v, _ in point.skipped] == [6]
    with pytest.raises(UsageError, match=r"^--checkpoint v4: not on the controller's site"):
        run.resume_point(trainer=trainer, only=4)


def test_a_controller_lost_without_a_summary_names_the_resume_command(tmp_path: Path) -> None:
    run, _ = job_run(tmp_path)
    run.controller = SimpleNamespace(spec=SimpleNamespace(site="c", log_path=tmp_path / "controller-0.log"))  # type: ignore[assignment]
    run.poll = lambda h: -9  # type: ignore[method-assign]  # SIGKILLed
    with pytest.raises(LaunchError) as e:
        run.wait(poll_s=0)
    line = f"{e.value} (hint: {e.value.hint})"
    assert "\n" not in line
    assert "the controller exited with -9 (SIGKILL) without a summary" in line
    assert line.endswith(f"`rlctl launch --resume {run.jobdir.path}`)")  # not in the index: by its directory

    class Index:
        def update(self, *a: Any, **kw: Any) -> None:
            pass

    indexed, _ = job_run(tmp_path / "indexed", db=Index())
    assert indexed.resume_command() == f"rlctl launch --resume {indexed.id}"


def sharded_part(ckpt: Path, split: dict[str, int]) -> str:
    return files_part(ckpt, "trainer", "{}", meta=sharded_meta(split))


def test_a_checkpoint_written_at_another_split_is_picked_and_a_sharded_one_refused_not_skipped(tmp_path: Path) -> None:
    """A trainer at another tp × pp × dp rebuilds each rank's state from the shards (`rlctl.checkpoint.resplit`):
    the checkpoint is picked. FSDP's sharded state is rebuilt at another dp, sharded or not (`refsdp`): picked; at
    another tp × pp it is not: one line, exit 2; an older checkpoint is not tried instead (it would not fit
    either)."""
    sites = Sites(tmp_path)
    for v in (3, 6):
        digest = sharded_part(sites.t.checkpoint(v), TP2)
        files_part(sites.c.checkpoint(v), "controller", "{}", meta={"trainer_digest": digest})
    set_latest(sites.c.path / "checkpoints", 6)
    fs = LocalFiles()
    for split in (ParallelConfig("trainer", tp=2, pp=1, dp=1), ParallelConfig("trainer", tp=1, pp=2, dp=1)):
        assert pick_checkpoint((fs, sites.c), (fs, sites.t), split=split).version == 6
    for v in (3, 6):
        digest = sharded_part(sites.t.checkpoint(v), FSDP_DP2)
        files_part(sites.c.checkpoint(v), "controller", "{}", meta={"trainer_digest": digest})
    for split in (ParallelConfig("trainer", dp=1), ParallelConfig("trainer", dp=3, fsdp=True)):
        assert pick_checkpoint((fs, sites.c), (fs, sites.t), split=split).version == 6
    with pytest.raises(UsageError) as e:
        pick_checkpoint((fs, sites.c), (fs, sites.t), split=ParallelConfig("trainer", tp=1, pp=2, dp=1))
    assert str(e.value) == (
        f"{sites.t.checkpoint(6)}: written by a trainer at tp 1 pp 1 dp 2 fsdp, which this trainer (tp 1 pp 2 dp 1) "
        "cannot load: FSDP's sharded state is rebuilt at another dp alone, at tp 1 pp 1"
    )
    assert e.value.exit_code == 2 and e.value.hint is not None and "\n" not in str(e.value) + e.value.hint
    old = Sites(tmp_path / "old")  # written before every rank kept its state: no split in the manifest
    digest = files_part(old.t.checkpoint(3), "trainer", "{}")
    files_part(old.c.checkpoint(3), "controller", "{}", meta={"trainer_digest": digest})
    with pytest.raises(UsageError, match=r"iter-3: written before checkpoints kept every trainer rank's state"):
        pick_checkpoint((fs, old.c), (fs, old.t), split=ParallelConfig("trainer"))


def test_launch_resume_refuses_another_split_in_one_line_before_any_agent_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlctl.launch.backends import write_sites
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("resume", explicit=tmp_path / "job")
    jd.write_job(spec(), source="test")
    split = {"tp": 1, "pp": 2, "dp": 1}  # the plan says pp 2; the checkpoint was written sharded by FSDP at dp 2
    plan = {"trainer": {"site": "t", "ranks": 2, "parallel": split}, "rollout": [{"site": "c", "units": 1}],
            "controller_site": "c"}  # fmt: skip
    jd.write_json(jd.plan_json, plan)
    write_sites(jd.path, {"c": local_site(), "t": local_site()})
    digest = sharded_part(jd.checkpoint(3), FSDP_DP2)
    files_part(jd.checkpoint(3), "controller", "{}", meta={"trainer_digest": digest})
    set_latest(jd.path / "checkpoints", 3)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "written by a trainer at tp 1 pp 1 dp 2 fsdp, which this trainer (tp 1 pp 2 dp 1) cannot load" in r.stderr
    assert not (jd.path / "agents.jsonl").exists() or not (jd.path / "agents.jsonl").read_text()  # nothing started


def test_checkpoint_writers_or_resumed_ranks_over_ssh_hosts_without_a_shared_work_root_are_refused() -> None:
    """Replica 0's ranks write their shards into the job dir they see and rank 0 seals the part: on several hosts
    of an SSH site they must share the work root. A torch trainer's rank 0 writes alone, so its ranks may run
    apart; but a resumed rank reads the checkpoint from its own host's copy, so resuming them apart is refused."""
    from rlctl.launch.base import GpuSlice
    from rlctl.ops.agentplan import refuse_unshared_trainer

    def site(**sched: object) -> Site:
        return Site.model_validate({"datacenter": "a", "gpu": "CPU", "nodes": [{"host": "h[1-2]", "gpus": 1}],
                                    "scheduler": {"kind": "ssh", **sched}})  # fmt: skip

    def rank(i: int, host: str) -> PlannedAgent:
        return PlannedAgent("trainer", i, "t", Resources(1, 1, 1), ParallelConfig("trainer"), GpuSlice(host, (0,)))

    apart = [rank(0, "h1"), rank(1, "h2")]
    with pytest.raises(
        RlctlError,
        match=r"the trainer ranks that write each checkpoint's shards \(data-parallel replica 0: ranks 0, 1\) run on "
        r"hosts h1, h2 of site 't', which share no work root \(sites.t.scheduler.shared_workdir is false\)",
    ):
        refuse_unshared_trainer("t", site(), apart, writers=[0, 1])  # megatron tp 2: a tp group across hosts
    refuse_unshared_trainer("t", site(), apart, writers=[0])  # torch dp 2: rank 1 writes nothing
    with pytest.raises(
        RlctlError,
        match=r"the trainer's ranks run on hosts h1, h2 of site 't', which share no work root \(.*\): each rank "
        r"restores the checkpoint from its own host's job dir, and only h1's holds it",
    ):
        refuse_unshared_trainer("t", site(), apart, writers=[0], resume=True)
    for resume in (False, True):
        refuse_unshared_trainer("t", site(shared_workdir=True), apart, writers=[0, 1], resume=resume)  # one filesystem
        refuse_unshared_trainer("t", site(), [rank(0, "h1"), rank(1, "h1")], writers=[0, 1], resume=resume)  # one host
        refuse_unshared_trainer("t", local_site(), apart, writers=[0, 1], resume=resume)  # the operator's job dir


def test_the_checkpoints_a_job_holds_at_once_and_their_size() -> None:
    assert checkpoints_held(spec(9, 3)) == 3  # keep 0: every one it writes (3, 6, 9)
    assert checkpoints_held(spec(10, 3)) == 4  # … and the last (10)
    assert checkpoints_held(spec(9, 0)) == 1  # only at the end
    kept = spec(30, 3).model_copy(update={"checkpoint": Checkpoint(every_iterations=3, keep=2)})
    assert checkpoints_held(kept) == 3  # two kept, and the newest while it is written
    # and beside them, in checkpoints/abandoned/, the two sealed ones set aside last by resumes (keep bounds them
    # too), however few the job writes: each resume sets aside its own copy
    once = spec(9, 0).model_copy(update={"checkpoint": Checkpoint(every_iterations=0, keep=2)})
    assert checkpoints_set_aside(kept) == checkpoints_set_aside(once) == 2
    assert checkpoints_set_aside(spec(9, 3)) == 0  # keep 0 bounds nothing: not counted (check's line says so)
    grpo = spec()
    ppo = grpo.model_copy(update={"algorithm": PpoAlgorithm(kind="ppo")})
    arch = grpo.model.arch
    assert checkpoint_bytes(grpo) == 12 * arch.params
    # + the critic's: the policy's trunk without its (untied) lm_head, and a value head (versus 24 × params before)
    critic = arch.params - arch.vocab * arch.hidden + arch.hidden + 1
    assert not arch.tied and checkpoint_bytes(ppo) == 12 * (arch.params + critic)


def test_a_roll_back_takes_the_checkpoint_named_or_says_why_not(tmp_path: Path) -> None:
    # `launch --resume --checkpoint 3`: v3, though v6 is newer and complete; never an older one in its place
    sites = Sites(tmp_path)
    for v in (3, 6):
        sites.checkpoint(v)
    fs = LocalFiles()
    point = pick_checkpoint((fs, sites.c), (fs, sites.t), only=3)
    assert (point.version, point.pointer, point.skipped) == (3, "--checkpoint v3", ())
    (sites.t.checkpoint(3) / manifest_name("trainer")).unlink()
    with pytest.raises(UsageError, match=r"^--checkpoint v3: trainer part: no MANIFEST.trainer.json"):
        pick_checkpoint((fs, sites.c), (fs, sites.t), only=3)
    with pytest.raises(UsageError, match=r"^--checkpoint v9: not on the controller's site \(.*/iter-9\)$"):
        pick_checkpoint((fs, sites.c), (fs, sites.t), only=9)


def prepared(tmp_path: Path) -> JobDir:
    """A job dir its launch prepared, for a resume: its job.json, plan.json (controller site c, trainer site t, both
    local) and sites.json."""
    jd = JobDir.create("resume", explicit=tmp_path / "job")
    jd.write_job(spec(), source="test")
    jd.write_json(jd.plan_json, {"trainer": {"site": "t", "ranks": 1}, "rollout": [{"site": "c", "units": 1}],
                                 "controller_site": "c"})  # fmt: skip
    write_sites(jd.path, {"c": local_site(), "t": local_site()})
    return jd


def test_a_refused_roll_back_leaves_the_jobs_index_row_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # its state was put back, but its run's `launching` row had replaced the rest: the job file it was launched from
    # (`source`), its controller's exit (-9: status then said 'status unknown'), its launcher, when it was launched
    from rlctl.ops.jobdb import JobDB
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    files_part(jd.checkpoint(3), "controller", "{}", meta={"trainer_digest": "0" * 64})  # its trainer part lost
    jd.event("checkpoint", version=3)
    info = {"source": "jobs/resume.yaml", "controller_exit": -9, "launcher": {"pid": 1, "host": "elsewhere"}}
    db = JobDB()
    db.put(jd.id, job_dir=str(jd.path), spec={"name": "resume"}, state="failed", info=info)
    db.update(jd.id, controller="tcp://10.0.0.1:5000")
    before = db.get(jd.id)
    db.close()
    r = run_cli("launch", "--resume", jd.id, "--checkpoint", "3")
    assert r.exit_code == 2, r.stderr
    assert "--checkpoint v3: trainer part" in r.stderr, r.stderr
    db = JobDB()
    after = db.get(jd.id)
    db.close()
    assert (after.state, after.controller, after.spec, after.info) == (
        before.state,
        before.controller,
        before.spec,
        before.info,
    )


@pytest.mark.parametrize("more", [False, True])
def test_a_resume_whose_staging_fails_leaves_the_job_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, more: bool
) -> None:
    # a plain resume (or one with --iterations) whose site could not be reached: its summary stayed set aside as
    # summary.1.json, its index row said `stopped` where it said `failed`, and the count --iterations wrote stayed
    from rlctl.errors import LaunchError
    from rlctl.ops import runstart
    from rlctl.ops.jobdb import JobDB
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    jd.event("checkpoint", version=3)
    summary = '{"state": "failed: trainer trainer-0 was lost", "iterations": 4}'
    jd.summary_json.write_text(summary)
    info = {"source": "jobs/resume.yaml", "controller_exit": 1, "launcher": {"pid": 1, "host": "elsewhere"}}
    db = JobDB()
    db.put(jd.id, job_dir=str(jd.path), spec={"name": "resume"}, state="failed", info=info)
    before = db.get(jd.id)
    db.close()
    job_json = jd.job_json.read_text()

    def unreachable(*_: object, **__: object) -> None:
        raise LaunchError("site t: cannot reach host h: connection refused")

    monkeypatch.setattr(runstart, "stage_all", unreachable)
    r = run_cli("launch", "--resume", jd.id, *(["--iterations", "30"] if more else []))
    assert r.exit_code == 1 and "cannot reach host h" in r.stderr, r.stderr
    assert jd.summary_json.read_text() == summary and not list(jd.path.glob("summary.*.json"))
    db = JobDB()
    after = db.get(jd.id)
    db.close()
    assert (after.state, after.info) == (before.state, before.info)
    assert jd.job_json.read_text() == job_json


def test_a_resume_whose_staging_fails_still_says_the_job_file_changed_since_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the job file's change, which the resume does not take up, was said only once the run had started: a resume
    # whose staging then failed (a host the user's edit had dropped) ended on the error alone
    import yaml

    from rlctl.ops import runstart
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    source = tmp_path / "resume.yaml"
    source.write_text(yaml.safe_dump(spec().model_dump(mode="json", by_alias=True, exclude_unset=True)))
    jd.write_job(spec(), source=str(source))
    jd.event("checkpoint", version=3)
    jd.write_json(jd.summary_json, {"state": "failed: trainer trainer-0 was lost", "iterations": 4})
    source.write_text(source.read_text().replace("iterations: 9", "iterations: 12"))

    def unreachable(*_: object, **__: object) -> None:
        raise LaunchError("site t: cannot reach host h: connection refused")

    monkeypatch.setattr(runstart, "stage_all", unreachable)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 1 and "cannot reach host h" in r.stderr, r.stderr
    assert f"{source} changed since the launch (iterations); the resume runs the job as launched" in r.stderr, r.stderr


def test_a_refused_roll_back_of_a_job_dir_the_index_lacks_leaves_it_out_of_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (a copied job dir, an index lost) its run's `launching` row stayed, and was then set `stopped`: `rlctl status`
    # said 'job index: stopped' of a job whose summary says done
    from rlctl.ops.jobdb import JobDB
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    jd.write_json(jd.summary_json, {"state": "done", "iterations": 9, "iterations_planned": 9})
    jd.event("checkpoint", version=3)  # its parts not here
    r = run_cli("launch", "--resume", str(jd.path), "--checkpoint", "3")
    assert r.exit_code == 2 and r.stderr.startswith("rlctl: error: --checkpoint v3: not on the controller's site")
    assert r.stderr.count("\n") == 1, r.stderr
    db = JobDB()
    rows = db.list()
    db.close()
    assert rows == []
    assert json.loads(jd.summary_json.read_text())["state"] == "done"


def test_a_resume_of_a_job_the_index_lacks_interrupted_before_it_started_names_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a resume of a job the index did not hold stages it: its `launching` row is taken out again, so
    the command to continue it names its directory, versus its id, which no job of the index has now."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    db = JobDB()
    run, sites = job_run(tmp_path, db=db)

    def interrupted(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(JobRun, "_prepare", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run.start(resume=True)
    assert run.unstarted and [r.name for r in db.list()] == []
    assert run.resume_command() == f"rlctl launch --resume {sites.c.path}"
    run.stop()  # (the launcher's `finally`): nothing of the index to change
    assert [r.name for r in db.list()] == []
    db.close()


@pytest.mark.parametrize("was", ["finished", "failed"])
def test_a_resume_stopped_by_the_operator_while_it_staged_leaves_the_jobs_index_row_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, was: str
) -> None:
    """`rlctl stop` while a `--resume --iterations` of a finished job staged: no agent of the run started and its
    summary (done) was put back, but its index row stayed `stopped` (the stop's, over the run's `launching`): status
    then said 'job index: stopped' of a job whose summary says done. A failed job's resume (an auto-resume's too)
    the operator stopped as it staged is `stopped`, as the stop said (the CI's integration test of it once read
    `failed`)."""
    from rlctl.checkpoint.choose import ResumePoint
    from rlctl.errors import Stopped
    from rlctl.ops.jobdb import LIVE
    from rlctl.ops.runstate import STOP_REQUESTED, resumes

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    db = JobDB()
    run, sites = job_run(tmp_path, db=db)
    write_sites(sites.c.path, run.sites)
    db.put(run.id, job_dir=str(sites.c.path), spec={"name": "resume"}, state=was, info={"source": "j.yaml"})
    before = db.get(run.id)
    ended = "done" if was == "finished" else "failed: trainer trainer-0 was lost"
    sites.c.write_json(sites.c.summary_json, {"state": ended, "iterations": 9, "iterations_planned": 9})

    def stopped_while_staging(self: JobRun, aside: str, *, resume: bool, checkpoint: int | None) -> None:
        self.jobdir.event(STOP_REQUESTED)  # what `rlctl stop` writes first, then the index row
        assert self.db is not None and self.db.update(self.id, state="stopped", only_from=LIVE)
        self.resumed = ResumePoint(version=9, pointer="latest.json names v9", skipped=())  # as `_prepare` does
        self.jobdir.event("resumed", version=9, pointer=self.resumed.pointer, skipped=[])
        self._stop_if_asked()  # as `_prepare` asks once its staging is done

    monkeypatch.setattr(JobRun, "_prepare", stopped_while_staging)
    with pytest.raises(Stopped):
        run.start(resume=True)
    assert run.unstarted
    assert json.loads(sites.c.summary_json.read_text())["state"] == ended
    assert resumes(sites.c.read_events()) == []  # its `resumed` event is void: the job went on from none of it
    after = db.get(run.id)
    db.close()
    if was == "finished":
        assert (after.state, after.info) == (before.state, before.info)
    else:
        assert after.state == "stopped"


def test_a_resume_stopped_while_it_staged_says_the_job_is_as_it_was(tmp_path: Path) -> None:
    """Its hint said `continue it with rlctl launch --resume ID`, which a finished job given more iterations then
    refused as finished, and which continues a roll-back from the latest checkpoint instead of the one named."""
    from rlctl.checkpoint.choose import ResumePoint
    from rlctl.errors import Stopped
    from rlctl.ops.runstate import STOP_REQUESTED

    run, sites = job_run(tmp_path)
    write_sites(sites.c.path, run.sites)
    run.resumed = ResumePoint(version=3, pointer="latest.json names v3", skipped=())  # `_prepare` chose it
    sites.c.event(STOP_REQUESTED)
    with pytest.raises(Stopped) as e:
        run._stop_if_asked()  # as `_prepare` asks once its staging is done, before any agent starts
    assert e.value.hint == (
        f"the job is as it was before this resume: continue it with `rlctl launch --resume {sites.c.path}` (and the "
        "resume's --iterations / --checkpoint / --trainer-split, where it had them)"
    )


def test_a_resume_refuses_a_fixed_field_edit_where_its_site_holds_a_checkpoint_its_events_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """job.json's seed edited (0 → 7) of a job whose events name no checkpoint (its controller killed before it said
    v3) while its site holds v3 whole: the resume's first check takes it for a job that starts over, and `_prepare`,
    which picks v3 from the site, refuses the edit in one line; the job is left as it was (its summary, its index
    row, no `resumed` event, no agent started), as any resume refused before its first agent."""
    from rlctl.ops.jobdb import JobDB
    from rlctl.ops.runstate import resumes
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    digest = files_part(jd.checkpoint(3), "trainer", json.dumps({"weights": 3}), meta=sharded_meta(ONE_RANK))
    files_part(jd.checkpoint(3), "controller", json.dumps({"iteration": 3}), meta={"trainer_digest": digest})
    set_latest(jd.path / "checkpoints", 3)
    summary = '{"state": "failed: trainer trainer-0 was lost", "iterations": 4}'
    jd.summary_json.write_text(summary)
    db = JobDB()
    db.put(jd.id, job_dir=str(jd.path), spec={"name": "resume"}, state="failed", info={"source": "jobs/resume.yaml"})
    before = db.get(jd.id)
    db.close()
    data = json.loads(jd.job_json.read_text())
    data["job"]["seed"] = 7
    jd.job_json.write_text(json.dumps(data))
    r = run_cli("launch", "--resume", jd.id)
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr  # versus "… was edited …: the resume runs the job as edited there" first
    assert r.stderr.startswith(f"rlctl: error: {jd.job_json}: job.seed was edited since the launch (0 → 7); "), r.stderr
    assert jd.summary_json.read_text() == summary and not list(jd.path.glob("summary.*.json"))
    db = JobDB()
    after = db.get(jd.id)
    db.close()
    assert (after.state, after.info) == (before.state, before.info)
    assert resumes(jd.read_events()) == [] and not jd.read_events("resumed", "agent_started")
    assert json.loads(jd.job_json.read_text())["job"]["seed"] == 7  # the edit kept, for the operator to put back


def test_a_resume_whose_every_checkpoint_is_damaged_names_where_they_are_and_the_job_file_to_launch_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it named MANIFEST.controller.json in no directory (on which site: the controller's or the trainer's?), and
    # hinted `rlctl launch JOB.yaml`, though job.json names the file the job was launched from
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    source = tmp_path / "resume.yaml"
    source.write_text("name: resume\n")
    jd.write_job(spec(), source=str(source))
    digest = files_part(jd.checkpoint(3), "trainer", "{}", meta=sharded_meta(ONE_RANK))
    files_part(jd.checkpoint(3), "controller", "{}", meta={"trainer_digest": digest})
    set_latest(jd.path / "checkpoints", 3)
    jd.event("checkpoint", version=3)
    manifest_path(jd.checkpoint(3), "controller").write_text("{not json")
    summary = '{"state": "failed: trainer trainer-0 was lost", "iterations": 4}'
    jd.summary_json.write_text(summary)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 1, r.stderr
    assert r.stderr == (
        f"rlctl: error: no complete checkpoint to resume from in {jd.checkpoints} (latest.json names v3; v3: "
        "controller part: MANIFEST.controller.json does not parse (JSONDecodeError: Expecting property name enclosed "
        f"in double quotes: line 1 column 2 (char 1))) (hint: `rlctl launch {source}` starts the job over in a new "
        "directory)\n"
    ), r.stderr
    assert jd.summary_json.read_text() == summary and not list(jd.path.glob("summary.*.json"))


def test_a_resume_interrupted_as_it_compares_the_job_file_leaves_the_count_iterations_wrote_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C while `launch --resume --iterations 30` compared the job file, inventory and reward with the launch's
    # (reading them: a slow mount): job.json kept the count --iterations wrote, with no run started on it, versus a
    # resume that ends before any agent started leaving job.json as it was
    from rlctl.ops import jobchanges
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    jd.event("checkpoint", version=3)
    jd.summary_json.write_text('{"state": "failed: trainer trainer-0 was lost", "iterations": 4}')
    job_json = jd.job_json.read_text()

    def interrupted(*_: object, **__: object) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(jobchanges, "source_changes", interrupted)
    r = run_cli("launch", "--resume", str(jd.path), "--iterations", "30")
    assert r.exit_code != 0, r.stderr
    assert jd.job_json.read_text() == job_json


def split_job(
    tmp_path: Path,
    *,
    algorithm: str = "grpo",
    gpus: int = 2,
    model: dict[str, Any] | None = None,
    gpu: str = "CPU",
    cut_tokens: int | None = None,
) -> JobDir:
    """A megatron job launched at tp 2 on a local site of `gpus` GPUs (`gpu`; a model that tp 1, 2, 4 and pp 1, 2
    split; not tp 3 or pp 3, or `model`), its checkpoint v3 written at tp 2; `cut_tokens`: its
    batch.train_micro_batch_tokens (a rank's activations: `rlctl.profiler.actmem`)."""
    job = spec().model_dump(mode="json", by_alias=True, exclude_unset=True)
    if cut_tokens is not None:
        job.setdefault("batch", {})["train_micro_batch_tokens"] = cut_tokens
    job["model"] = model or {"kind": "arch", "name": "m", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 4,
                             "vocab": 64, "intermediate": 128, "params": 1e5}  # fmt: skip
    job["trainer"] = {"backend": "megatron", "tensor_parallel": 2}
    job["placement"]["trainer"]["gpus"] = 2
    job["algorithm"] = {"kind": algorithm}
    jd = JobDir.create("resume", explicit=tmp_path / "job")
    jd.write_job(JobFile.model_validate(job), source="test")
    plan = {"trainer": {"site": "t", "ranks": 2, "parallel": {"tp": 2, "pp": 1, "dp": 1}},
            "rollout": [{"site": "c", "units": 1}], "controller_site": "c"}  # fmt: skip
    jd.write_json(jd.plan_json, plan)
    t = Site.model_validate(
        {"datacenter": "d", "gpu": gpu, "scheduler": {"kind": "local"}, "nodes": [{"host": "h", "gpus": gpus}]}
    )
    write_sites(jd.path, {"c": local_site(), "t": t})
    digest = sharded_part(jd.checkpoint(3), TP2)
    files_part(jd.checkpoint(3), "controller", "{}", meta={"trainer_digest": digest})
    set_latest(jd.path / "checkpoints", 3)
    return jd


def test_launch_resume_trainer_split_is_checked_and_shown_by_dry_run_and_written_to_the_plan_as_the_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--trainer-split tp=1,pp=2`: the trainer's section of plan.json recomputed on its site (ranks tp × pp × dp, the
    plan's dp kept), shown by --dry-run with nothing written, and written as the run starts: its agents are laid out
    by it (the checkpoint written at tp 2 is rebuilt for it, `rlctl.checkpoint.resplit`). Before, a resume always
    ran the plan's split: the loader's resplit was reached only by editing plan.json by hand."""
    from rlctl.commands.launching import resume as resume_mod
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4)
    before = jd.plan_json.read_text()
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=1,pp=2", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == (
        "trainer on site t: tp2 pp1 dp1 (2 ranks) → tp1 pp2 dp1 (2 ranks): the resume writes it to plan.json (dry "
        "run: nothing written)"
    )
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=1,dp=4", "--dry-run", "-o", "json")
    assert r.exit_code == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["trainer"] == {"site": "t", "ranks": 4, "parallel": {"tp": 1, "pp": 1, "dp": 4}}
    assert jd.plan_json.read_text() == before  # nothing written

    started: list[dict[str, Any]] = []

    def be_launcher(jd_: JobDir, spec_: Any, plan: dict[str, Any], db: Any, begin: Any, *a: Any, **k: Any) -> None:
        runs = SimpleNamespace(start=lambda **kw: started.append(jd_.read_plan()) or "run", run=None)
        begin(runs, lambda line: said.append(line))
        assert plan == jd_.read_plan()  # the run's plan object is the one written

    said: list[str] = []
    monkeypatch.setattr(resume_mod, "be_launcher", be_launcher)
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=1,pp=2")
    assert r.exit_code == 0, r.stderr
    assert [p["trainer"] for p in started] == [{"site": "t", "ranks": 2, "parallel": {"tp": 1, "pp": 2, "dp": 1}}]
    assert "job resume: trainer on site t: tp2 pp1 dp1 (2 ranks) → tp1 pp2 dp1 (2 ranks), written to plan.json" in said


@pytest.mark.parametrize(
    "args,algorithm,said",
    [
        (
            ["tp=3"],
            "grpo",
            "--trainer-split tp=3: tp 3 does not divide the model's num_attention_heads 4; use a divisor",
        ),
        (
            ["pp=3"],
            "grpo",
            "--trainer-split pp=3: pp 3 does not divide the model's num_hidden_layers 4 (every stage "
            "holds as many); use a divisor",
        ),
        (
            ["tp=2,dp=4"],
            "grpo",
            "--trainer-split tp=2,dp=4: site t: trainer 8 rank(s) need 8 GPU(s); the inventory gives it 4 (h: 4)",
        ),
        (
            ["tp=1,pp=2"],
            "ppo",
            "--trainer-split tp=1,pp=2: a PPO critic's state is not rebuilt at another tp × pp (the plan's tp 2 pp 1)",
        ),
        (
            ["tp=two"],
            "grpo",
            "--trainer-split 'tp=two': 'tp=two' is not one of tp=, pp=, dp= with a count of 1 or "
            "more; use tp=T,pp=P[,dp=D]",
        ),
        (  # a digit int() does not read (isdigit, not isdecimal): a ValueError's traceback, versus this line
            ["tp=\u00b2"],
            "grpo",
            "--trainer-split 'tp=\u00b2': 'tp=\u00b2' is not one of tp=, pp=, dp= with a count of 1 or more",
        ),
        (["tp=1", "--dry-run", "--detach"], "grpo", "--resume JOB --dry-run shows a --trainer-split alone"),
    ],
)
def test_launch_resume_trainer_split_a_launch_would_refuse_is_one_line_exit_2_and_the_plan_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], algorithm: str, said: str
) -> None:
    """The checks a launch makes of a split (the model's heads and layers: `planner.split.split_refusals`, what
    `rlctl check` says of trainer.tensor_parallel; the site's room, as the run lays the agents out) and what the
    checkpoint loader cannot rebuild (a PPO critic at another tp × pp): one line naming the option, exit 2, plan.json
    as it was, nothing started."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, algorithm=algorithm, gpus=4)
    before = jd.plan_json.read_text()
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", *args)
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1 and said in r.stderr, r.stderr
    assert jd.plan_json.read_text() == before
    assert not (jd.path / "agents.jsonl").exists() or not (jd.path / "agents.jsonl").read_text()


def test_launch_resume_trainer_split_a_rank_of_which_does_not_fit_the_sites_gpus_is_refused_with_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A megatron 7B trainer launched at tp 2 on 4 H100s (62 GB a rank), resumed at tp 1: each rank would hold the
    whole model's weights, gradients and AdamW state (123.9 GB, and 4.7 GB of a rank's 512-token share of a cut's
    activations; megatron has no distributed optimizer), and an H100
    80 GB. Refused as `rlctl check` refuses such a plan (`preflight.memory.trainer_memory_refusal`, its figures),
    naming the option and the fewest GPUs a replica fits in at the asked dp; before, the split was written and the
    trainer ran out of memory as it loaded. A split that fits (dp 2 at tp 2) passes."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    before = jd.plan_json.read_text()
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=1,dp=2", "--dry-run")
    assert r.exit_code == 2, r.stderr
    assert r.stderr == (
        "rlctl: error: --trainer-split tp=1,dp=2: the trainer's 2 rank(s) at tp 1 pp 1 dp 2 need 128.6 GB each "
        "(weights and gradients 32.5 GB, optimizer state 91.4 GB, activations of a cut's 512 tokens a rank 4.7 GB), "
        "and a H100 holds 80 GB (90% usable) (hint: use --trainer-split tp=2,pp=1,dp=2, the fewest GPUs a replica fits "
        "in)\n"
    )
    assert jd.plan_json.read_text() == before
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "dp=2", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert "tp2 pp1 dp1 (2 ranks) → tp2 pp1 dp2 (4 ranks)" in r.stdout


def test_trainer_split_refused_for_memory_suggests_only_a_split_the_sites_room_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 7B trainer above on H100s on hosts of 2, 1 and 1 GPUs, asked tp 1 at dp 2 (refused: 123.9 GB a rank). The
    fewest GPUs a replica fits in by memory is tp 2, but dp 2 at tp 2 is two tp groups of 2 and one host holds 2: the
    hint named it, and the try it suggested was refused for room. It names tp 1 pp 2, which the site's hosts hold and
    the next try passes."""
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=2, model={"kind": "builtin", "name": "qwen2.5-7b"}, gpu="H100", cut_tokens=512)
    nodes = [{"host": "h1", "gpus": 2}, {"host": "h2", "gpus": 1}, {"host": "h3", "gpus": 1}]
    t = Site.model_validate({"datacenter": "d", "gpu": "H100", "scheduler": {"kind": "local"}, "nodes": nodes})
    write_sites(jd.path, {"c": local_site(), "t": t})
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=1,dp=2", "--dry-run")
    assert r.exit_code == 2, r.stderr
    hint = "(hint: use --trainer-split tp=1,pp=2,dp=2, the fewest GPUs a replica fits in)\n"
    assert r.stderr.endswith(hint), r.stderr
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=2,pp=1,dp=2", "--dry-run")
    assert r.exit_code == 2 and "room for 1 group(s)" in r.stderr, r.stderr  # what the old hint named
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "tp=1,pp=2,dp=2", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert "tp2 pp1 dp1 (2 ranks) → tp1 pp2 dp2 (4 ranks)" in r.stdout


def test_trainer_split_of_an_fsdp_plan_changes_dp_and_is_refused_at_another_tp_pp(tmp_path: Path) -> None:
    """FSDP's sharded state is rebuilt at another dp, sharded or not (`checkpoint.refsdp`): with `trainer.shard:
    fsdp`, dp 3 is an FSDP plan; with `auto` (a tiny model: a replica fits), dp 1 an unsharded one. At another
    tp × pp it is refused at the option, before the plan is judged further (versus any split refused: a node lost
    meant the job started over); so is `fsdp` over one rank, as `rlctl check` refuses it."""
    from rlctl.models.catalog import BUILTIN_MODELS
    from rlctl.ops.trainersplit import resplit_plan

    plan = {"trainer": {"site": "t", "ranks": 2, "parallel": {"tp": 1, "pp": 1, "dp": 2, "fsdp": True}},
            "rollout": [], "controller_site": "t"}  # fmt: skip
    arch, sites = BUILTIN_MODELS["tiny-demo"], {"t": local_site(gpus=4)}
    data = spec().model_dump(mode="json", by_alias=True, exclude_unset=True)
    fsdp = JobFile.model_validate(data | {"trainer": {"shard": "fsdp"}})
    new = resplit_plan(plan, {"dp": 3}, spec=fsdp, sites=sites, arch=arch)
    assert new is not None and new["trainer"]["parallel"] == {
        "tp": 1,
        "pp": 1,
        "dp": 3,
        "fsdp": True,
        "reduce_per_step": True,
    }
    assert new["trainer"]["ranks"] == 3
    new = resplit_plan(plan, {"dp": 1}, spec=spec(), sites=sites, arch=arch)
    assert new is not None and new["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 1}
    with pytest.raises(UsageError) as e:
        resplit_plan(plan, {"pp": 2}, spec=spec(), sites=sites, arch=arch)
    assert str(e.value) == (
        "--trainer-split pp=2: the trainer's state is sharded by FSDP (trainer.shard 'auto', the plan at tp1 pp1 dp2 "
        "fsdp), which a resume rebuilds at another dp alone, at tp 1 pp 1"
    )
    assert e.value.exit_code == 2
    with pytest.raises(UsageError, match=r"^--trainer-split dp=1: trainer.shard 'fsdp' over the trainer's 1 GPU"):
        resplit_plan(plan, {"dp": 1}, spec=fsdp, sites=sites, arch=arch)


def test_trainer_split_to_a_dp_the_planner_shards_is_sharded() -> None:
    """Qwen3-4B's torch trainer on a CPU site (4 GB a GPU by the catalog: 16 bytes per parameter do not fit; no
    memory_gb, so `rlctl check` judges no rank's memory): at dp 1 one unsharded rank, and `trainer.shard: auto`
    shards it at dp 2 (`planner.split.trainer_sharding`, what a launch at dp 2 writes). Resumed at dp 2 the new plan
    is sharded as a launch at dp 2 would be, and the unsharded checkpoint is rebuilt into FSDP's shards
    (`checkpoint.refsdp`), versus refused at the option. `shard: none` stays unsharded."""
    from rlctl.config.inventory import Inventory
    from rlctl.config.job import Job
    from rlctl.models.catalog import BUILTIN_MODELS
    from rlctl.ops.trainersplit import resplit_plan
    from rlctl.planner.split import trainer_sharding

    data = spec().model_dump(mode="json", by_alias=True, exclude_unset=True)
    data["model"] = {"kind": "builtin", "name": "qwen3-4b"}
    job, sites = JobFile.model_validate(data), {"t": local_site()}
    launched = trainer_sharding(Job(job, Inventory(sites, [], ["x"]), Path("x")), tp=1, pp=1, dp=2)
    assert launched == {"fsdp": True}  # what a launch at dp 2 runs
    plan = {"trainer": {"site": "t", "ranks": 1, "parallel": {"tp": 1, "pp": 1, "dp": 1}}, "rollout": [],
            "controller_site": "t"}  # fmt: skip
    arch = BUILTIN_MODELS["qwen3-4b"]
    new = resplit_plan(plan, {"dp": 2}, spec=job, sites=sites, arch=arch)
    assert new is not None and new["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 2} | launched
    data["trainer"] = {"shard": "none"}
    new = resplit_plan(plan, {"dp": 2}, spec=JobFile.model_validate(data), sites=sites, arch=arch)
    assert new is not None and new["trainer"]["parallel"] == {"tp": 1, "pp": 1, "dp": 2}


def test_trainer_split_past_an_exclusive_slurm_sites_nodes_is_refused_at_the_option(tmp_path: Path) -> None:
    """4 nodes of 8 GPUs whose scheduler gives each SLURM job its nodes whole: the controller, the trainer on 8 GPUs
    and 2 rollout units of tp 2 take the 4. At dp 16 the trainer takes 2 nodes, 5 in all: the site's GPUs hold them
    (20 of 32) and the split was written, and a unit past the nodes waited for ever; refused at the option in check's
    line (`exclusive_room_problems`). dp 4 fits (one node)."""
    import yaml

    from rlctl.config import load_job
    from rlctl.ops import counts
    from rlctl.ops.trainersplit import resplit_plan
    from tests.unit.ops.test_preflight_controller_room import h800_job

    tiny = {"kind": "builtin", "name": "tiny-demo"}
    h800_job(tmp_path, trainer_gpus=8, node={"gpus": 8}, hosts="h800-[001-004]", rollout_at=("h800", 4), model=tiny)
    inv = yaml.safe_load((tmp_path / "h800.yaml").read_text())
    inv["sites"]["h800"]["scheduler"]["exclusive"] = True
    (tmp_path / "h800.yaml").write_text(yaml.safe_dump(inv))
    job = load_job(tmp_path / "job.yaml")
    plan = counts.plan_counts(job, job.spec)
    sites = {"h800": job.inventory.sites["h800"]}
    with pytest.raises(UsageError) as e:
        resplit_plan(plan, {"dp": 16}, spec=job.spec, sites=sites, arch=job.spec.model.arch)
    assert str(e.value) == (
        "--trainer-split dp=16: sites.h800.scheduler.exclusive true: each of the job's 4 SLURM jobs on site h800 takes "
        "its nodes whole, 5 node(s) in all (1 for the controller, 2 for the trainer, 2 for its 2 rollout units), and "
        "the site's 4 node(s) do not hold them at once: a job past them waits for ever for a node another holds until "
        "the job ends"
    )
    assert e.value.exit_code == 2
    fits = resplit_plan(plan, {"dp": 4}, spec=job.spec, sites=sites, arch=job.spec.model.arch)
    assert fits is not None and fits["trainer"] == {"site": "h800", "ranks": 4, "parallel": {"tp": 1, "pp": 1, "dp": 4}}


def resume_ended_before_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, *args: str
) -> tuple[JobDir, str]:
    """A job of `split_job` resumed at tp 1 pp 2 (with `args` besides) whose launcher ends before it made a run: a
    Ctrl-C as it says the split is written (`say`), or a start that fails (`start`: none to say it is unstarted);
    its job dir and its job.json from before the resume. plan.json is as it was."""
    from rlctl.commands.launching import resume as resume_mod
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4)

    def start(**_: Any) -> None:
        raise LaunchError("the run could not be made")

    def say(line: str) -> None:
        if where == "say" and "written to plan.json" in line:
            raise KeyboardInterrupt

    def be_launcher(jd_: JobDir, spec_: Any, plan: dict[str, Any], db: Any, begin: Any, *a: Any, **k: Any) -> None:
        begin(SimpleNamespace(start=start, run=None), say)

    monkeypatch.setattr(resume_mod, "be_launcher", be_launcher)
    before = jd.job_json.read_text(), jd.plan_json.read_text()
    r = run_cli("launch", "--resume", str(jd.path), *args, "--trainer-split", "tp=1,pp=2")
    assert r.exit_code != 0
    assert jd.plan_json.read_text() == before[1]
    return jd, before[0]


@pytest.mark.parametrize("where", ["say", "start"])
def test_a_resume_at_another_trainer_split_ended_before_a_run_was_made_leaves_the_plan_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """plan.json is written as the run starts; a Ctrl-C as the launcher says so (`say`), or a start that fails before
    it made a run (`start`: none to say it is unstarted), puts it back, versus leaving the new split in plan.json with
    no run of it (the next plain resume then ran a split the operator had not kept)."""
    resume_ended_before_a_run(tmp_path, monkeypatch, where)


@pytest.mark.parametrize("where", ["say", "start"])
def test_a_resume_with_iterations_ended_before_a_run_was_made_leaves_job_json_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """`--iterations` writes job.json's count before the run is made: a Ctrl-C as the launcher says the count, or a
    start that fails before it made a run, puts job.json back as it puts plan.json back, versus the new count left
    there with the split put back (and the interrupt saying the job is as it was)."""
    jd, job_before = resume_ended_before_a_run(tmp_path, monkeypatch, where, "--iterations", "12")
    assert jd.job_json.read_text() == job_before


def test_a_resume_at_another_trainer_split_whose_staging_fails_leaves_the_plan_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split takes effect only with a run of it: a resume refused as it stages (a site unreachable) puts plan.json
    back, as it puts back the count --iterations wrote, so the next plain resume runs the plan's split."""
    from rlctl.ops import runstart
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4)
    jd.event("checkpoint", version=3)
    before = jd.plan_json.read_text()

    def unreachable(*_: object, **__: object) -> None:
        raise LaunchError("site t: cannot reach host h: connection refused")

    monkeypatch.setattr(runstart, "stage_all", unreachable)
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "pp=2")
    assert r.exit_code == 1 and "cannot reach host h" in r.stderr, r.stderr
    assert "trainer on site t: tp2 pp1 dp1 (2 ranks) → tp2 pp2 dp1 (4 ranks), written to plan.json" in r.stderr
    assert jd.plan_json.read_text() == before


def test_a_resume_at_another_trainer_split_whose_index_row_cannot_be_written_leaves_the_job_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's `launching` row refused by the job index (its database locked, its disk full; or a Ctrl-C as it is
    written), after the run before's summary was set aside and before any agent started: the job as it was, plan.json
    at the plan's split and the summary back in place, as a resume refused as it stages leaves it, versus the split
    left in plan.json with no run of it and the summary set aside as summary.1.json (the run taken as started)."""
    from rlctl.ops.runbase import RunBase
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = split_job(tmp_path, gpus=4)
    jd.event("checkpoint", version=3)
    summary = '{"state": "failed: trainer trainer-0 was lost", "iterations": 4}'
    jd.summary_json.write_text(summary)
    before = jd.plan_json.read_text()
    register = RunBase._register

    def locked(self: RunBase, state: str, **info: Any) -> None:
        if state == "launching":
            raise RlctlError("the job index is locked")
        register(self, state, **info)

    monkeypatch.setattr(RunBase, "_register", locked)
    r = run_cli("launch", "--resume", str(jd.path), "--trainer-split", "pp=2")
    assert r.exit_code == 1 and "the job index is locked" in r.stderr, r.stderr
    assert jd.plan_json.read_text() == before
    assert jd.summary_json.read_text() == summary and not list(jd.path.glob("summary.*.json"))


def lose_checkpoints(jd: JobDir, how: str) -> None:
    """The job's checkpoints/ directory gone (`missing`), a file in its place (`file`), or emptied (`empty`)."""
    import shutil

    shutil.rmtree(jd.checkpoints)
    if how == "file":
        jd.checkpoints.write_text("x")
    elif how == "empty":
        jd.checkpoints.mkdir()


@pytest.mark.parametrize("how", ["missing", "file", "empty"])
def test_a_resume_of_a_job_whose_checkpoints_directory_is_lost_is_refused_not_started_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # its events record v3 and v6, its checkpoints/ gone: the resume said 'resumed from the start (no checkpoint was
    # completed)' and trained from iteration 0, its metrics and samples moved to *.discarded.jsonl, summary.json to
    # summary.1.json
    from tests.conftest import run_cli

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = prepared(tmp_path)
    (jd.path / "staged.json").write_text(json.dumps({s: {"roots": {"localhost": str(jd.path)}} for s in "ct"}))
    for v in (3, 6):
        digest = files_part(jd.checkpoint(v), "trainer", "{}", meta=sharded_meta(ONE_RANK))
        files_part(jd.checkpoint(v), "controller", "{}", meta={"trainer_digest": digest})
        jd.event("checkpoint", version=v, keep=0)
    summary = '{"state": "failed: trainer trainer-0 was lost", "iterations": 7}'
    jd.summary_json.write_text(summary)
    jd.metrics.write_text('{"iteration": 0}\n')
    lose_checkpoints(jd, how)
    before = sorted(p.name for p in jd.path.iterdir())

    def staged(*_: object, **__: object) -> None:  # (no agent of a run the old code started over is ever started)
        raise LaunchError("staged: the run went on")

    from rlctl.ops import runstart

    monkeypatch.setattr(runstart, "stage_all", staged)
    r = run_cli("launch", "--resume", str(jd.path))
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    state = {"missing": "is missing", "file": "is not a directory", "empty": "holds no checkpoint's controller part"}
    assert f"{jd.checkpoints} {state[how]}" in r.stderr
    assert "events.jsonl records 2 completed checkpoints (v3…v6)" in r.stderr
    assert sorted(p.name for p in jd.path.iterdir() if not p.name.startswith(".")) == [
        n for n in before if not n.startswith(".")
    ]
    assert jd.summary_json.read_text() == summary

    # the run refuses it too where the launcher did not (an automatic resume; a staged.json not yet written)
    run, sites = job_run(tmp_path / "run")
    sites.checkpoint(3)
    sites.c.event("checkpoint", version=3, keep=0)
    lose_checkpoints(sites.c, how)
    trainer = PlannedAgent("trainer", 0, "t", Resources(1, 1, 1), ParallelConfig("trainer"))
    with pytest.raises(UsageError, match=r"records 1 completed checkpoint \(v3\): not resumed"):
        run.resume_point(trainer=trainer)


def test_a_controller_on_another_site_resumes_from_its_checkpoints_there_though_this_job_dir_lacks_them(
    tmp_path: Path,
) -> None:
    run, sites = job_run(tmp_path)
    elsewhere = Sites(tmp_path / "site")  # the controller's site job dir: its parts there, none here
    elsewhere.t = sites.t
    elsewhere.checkpoint(3)
    sites.c.event("checkpoint", version=3, keep=0)
    assert not sites.c.checkpoints.joinpath("iter-3").exists()
    run._record = (local_site(), "localhost", str(elsewhere.c.path))
    trainer = PlannedAgent("trainer", 0, "t", Resources(1, 1, 1), ParallelConfig("trainer"))
    assert run.resume_point(trainer=trainer).version == 3
