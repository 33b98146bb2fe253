"""`rlctl status JOB --checkpoints` of a job whose trainer's site is reached over SSH: its parts' manifests checked
there (sizes, no checksum) in one command per site, that command run by the real SSH view (`SshFiles`) with bash
here in place of the SSH connection."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rlctl.checkpoint.files import write_part
from rlctl.config.inventory import Site
from rlctl.errors import LaunchError, UsageError
from rlctl.launch import sitefs
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.localrunner import LocalRunner
from rlctl.launch.remote import CommandResult, SshTarget
from rlctl.launch.stage import write_staged
from rlctl.ops.checkpoints import best_checkpoint
from rlctl.ops.pull import checkpoint_parts, pull
from tests.conftest import run_cli
from tests.unit.ops.test_checkpoint_table import _job

LOCAL = {"datacenter": "a", "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}], "scheduler": {"kind": "local"}}
FAR = {"datacenter": "b", "gpu": "CPU", "nodes": [{"host": "g1", "gpus": 2}], "scheduler": {"kind": "ssh"}}


class BashHere(LocalRunner):
    """An SSH host's runner whose commands run with bash here, each recorded (host, its first line), as is each
    connection it stands for (its host); its SFTP copies are copies here."""

    commands: ClassVar[list[tuple[str, str]]] = []
    connections: ClassVar[list[str]] = []

    def __init__(self, target: SshTarget) -> None:
        super().__init__()
        self.host = target.host
        BashHere.connections.append(self.host)

    def run(self, command: str, *, timeout_s: float, stdin: str | None = None, **_: Any) -> CommandResult:
        BashHere.commands.append((self.host, command.splitlines()[0]))
        return super().run(command, timeout_s=timeout_s, stdin=stdin)

    def get(self, remote: str, local: Path) -> None:
        shutil.copyfile(remote, local)


def far_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[JobDir, Path]:
    """`_job`'s checkpoints v10, v20, v30 of a job whose controller runs here and whose trainer runs on SSH site
    `far` (host g1; its site job dir, here under tmp_path, reached through `BashHere`)."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sitefs, "SshRunner", BashHere)
    monkeypatch.setattr(BashHere, "commands", [])
    monkeypatch.setattr(BashHere, "connections", [])
    jd = _job(tmp_path)
    far = tmp_path / "g1" / "jobs" / jd.id
    jd.write_json(jd.plan_json, {"trainer": {"site": "far", "ranks": 1}, "controller_site": "local", "rollout": []})
    write_sites(jd.path, {"local": Site.model_validate(LOCAL), "far": Site.model_validate(FAR)})
    write_staged(jd.path, {"local": {"roots": {"localhost": str(jd.path)}, "files": []},
                           "far": {"roots": {"g1": str(far)}, "files": []}})  # fmt: skip
    for v in (10, 20, 30):
        weights = {"model": lambda p, v=v: p.mkdir() or (p / "w.bin").write_bytes(bytes(v))}
        digest = write_part(far / "checkpoints" / f"iter-{v}", "trainer", weights, meta={"counters": {"version": v}})
        state = {"controller": lambda p: p.mkdir() or (p / "state.json").write_text("{}")}
        write_part(jd.checkpoint(v), "controller", state, meta={"version": v, "trainer_digest": digest})
    return jd, far / "checkpoints"


def test_status_checkpoints_checks_the_manifests_on_the_trainers_ssh_site_in_one_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's site is reached over SSH: its manifests were not read (the table listed v10 sound and v30 the
    latest, a line saying the trainer part was not checked), versus read there with every listed file's size, in one
    command to that host whatever the number of checkpoints and files."""
    jd, far = far_job(tmp_path, monkeypatch)
    (far / "iter-10" / "model" / "w.bin").write_bytes(b"")  # a weights file cut short: its size tells it
    manifest = far / "iter-30" / "MANIFEST.trainer.json"
    manifest.write_text(manifest.read_text()[:20])
    r = run_cli("status", str(jd.path), "--checkpoints", "-o", "json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["manifests_checked"] == ["controller", "trainer"]
    got = [(c["version"], c["latest"], c["damaged"]) for c in data["checkpoints"]]
    assert got[0] == (10, False, "trainer part: model/w.bin does not match MANIFEST.trainer.json: 0 bytes, 10 listed")
    assert got[1] == (20, True, None)
    assert got[2][:2] == (30, False) and got[2][2].startswith(
        "trainer part: MANIFEST.trainer.json does not parse (JSONDecodeError"
    )
    assert [host for host, _ in BashHere.commands] == ["g1"]  # one command there, not one per file or checkpoint
    # the controller part here names another trainer part than the one there (a part copied in from another run)
    manifest.write_text(json.dumps({"part": "trainer", "files": {}, "counters": {"version": 30}}))
    data = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)
    assert data["checkpoints"][-1]["damaged"] == "its trainer part is not the one its controller part was written with"
    r = run_cli("status", str(jd.path), "--checkpoints")
    assert r.exit_code == 0 and "not checked" not in r.stdout, r.stdout


def test_a_second_status_is_sent_none_of_the_manifests_the_first_read_on_the_ssh_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status --checkpoints` again: the trainer's site sends the stamps of the manifests read the time before (kept
    in the job dir), not their bytes, and the table is the same; versus every checkpoint's manifests sent again on
    every look (a weeks-long job's hundreds). A pull's look is sent none either."""
    jd, far = far_job(tmp_path, monkeypatch)
    hour_ago = time.time() - 3600
    for manifest in far.glob("iter-*/MANIFEST.*.json"):
        os.utime(manifest, (hour_ago, hour_ago))
    sent: list[str] = []
    run = BashHere.run

    def recorded(self: BashHere, command: str, **kw: Any) -> CommandResult:
        res = run(self, command, **kw)
        sent.append(res.stdout)
        return res

    monkeypatch.setattr(BashHere, "run", recorded)
    first = run_cli("status", str(jd.path), "--checkpoints", "-o", "json")
    second = run_cli("status", str(jd.path), "--checkpoints", "-o", "json")
    assert first.exit_code == 0 and second.stdout == first.stdout, first.stderr
    assert [out.count("\0Titer-") for out in sent] == [3, 0]  # (a manifest's record: T, its path, its base64)
    jd.write_json(jd.checkpoints / "latest.json", {"version": 30})
    assert pull(jd.path, to=tmp_path / "out").version == 30
    assert len(sent) > 2 and not any("\0Titer-" in out for out in sent[2:])


def test_a_trainer_site_that_does_not_answer_leaves_the_table_listed_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SSH host does not answer: the table as the events and the controller's part have it, and one line under it
    naming the part not checked and why, versus a status that failed with the connection."""
    jd, _ = far_job(tmp_path, monkeypatch)

    def unreachable(self: BashHere, command: str, **_: Any) -> CommandResult:
        raise LaunchError("ssh g1: cannot connect: [Errno 113] No route to host")

    monkeypatch.setattr(BashHere, "run", unreachable)
    r = run_cli("status", str(jd.path), "--checkpoints")
    assert r.exit_code == 0, r.stderr
    assert (
        "the trainer part's manifests not checked (site far did not answer: ssh g1: cannot connect: [Errno 113] No "
        "route to host): a pull or a resume verifies every file"
    ) in r.stdout.splitlines(), r.stdout
    data = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)
    assert data["manifests_checked"] == ["controller"] and list(data["manifests_unchecked"]) == ["trainer"]
    assert [(c["version"], c["latest"], c["damaged"]) for c in data["checkpoints"]][-1] == (30, True, None)


def test_best_passes_over_a_checkpoint_whose_trainer_part_on_an_ssh_site_is_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pull --checkpoint best` judges by the parts `status --checkpoints` checks, the trainer's over SSH among them:
    the best by its figures (v30) has a weights file cut short there, and is passed over for v20."""
    jd, far = far_job(tmp_path, monkeypatch)
    for v, reward in ((10, 0.1), (20, 0.5), (30, 0.6)):
        jd.append(jd.evaluations, {"version": v, "greedy_reward": reward, "prompts": 8})
    (far / "iter-30" / "model" / "w.bin").write_bytes(b"")
    version, _, passed = best_checkpoint(jd, parts=checkpoint_parts(jd.path, remote=True))
    assert version == 20
    assert [(r["version"], r["damaged"]) for r in passed] == [
        (30, "trainer part: model/w.bin does not match MANIFEST.trainer.json: 0 bytes, 30 listed")
    ]
    assert [host for host, _ in BashHere.commands] == ["g1"]


def test_pull_best_of_a_job_on_an_ssh_site_connects_there_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pull --checkpoint best` looks at the checkpoints' manifests on the trainer's SSH site, then copies the best
    one's policy from there: one connection for both (the pull's view handed to the survey), versus one each."""
    jd, far = far_job(tmp_path, monkeypatch)
    for v, reward in ((10, 0.1), (20, 0.5), (30, 0.6)):
        jd.append(jd.evaluations, {"version": v, "greedy_reward": reward, "prompts": 8})
    (far / "iter-30" / "model" / "w.bin").write_bytes(b"")
    got = pull(jd.path, checkpoint="best", to=tmp_path / "out")
    assert got.version == 20 and (tmp_path / "out" / "w.bin").read_bytes() == bytes(20)
    assert BashHere.connections == ["g1"], BashHere.connections


def test_pull_latest_and_a_version_named_are_judged_on_the_trainers_ssh_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's part of v30, the latest, cut short on the SSH site: `pull` takes v20, as `status --checkpoints`
    calls it the latest, and `--checkpoint 30` is refused before any copy naming the sound ones; each over one
    connection to the host (the look at the manifests and the copy)."""
    jd, far = far_job(tmp_path, monkeypatch)
    jd.write_json(jd.checkpoints / "latest.json", {"version": 30})
    (far / "iter-30" / "model" / "w.bin").write_bytes(b"")
    got = pull(jd.path, to=tmp_path / "out")
    assert got.version == 20 and (tmp_path / "out" / "w.bin").read_bytes() == bytes(20)
    assert BashHere.connections == ["g1"], BashHere.connections
    with pytest.raises(UsageError) as e:
        pull(jd.path, checkpoint="30", to=tmp_path / "v30")
    assert str(e.value) == (
        "--checkpoint 30: v30 is not sound (trainer part: model/w.bin does not match MANIFEST.trainer.json: 0 bytes, "
        "30 listed); the sound ones: v10, v20"
    )
    assert BashHere.connections == ["g1", "g1"] and not (tmp_path / "v30").exists()
