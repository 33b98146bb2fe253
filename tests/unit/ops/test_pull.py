"""`rlctl pull` on a local site (the SSH site's SFTP path runs in tests/integration/ops/test_ops_pull.py): the
newest complete checkpoint's policy, every file checked against its manifest; a damaged newest one falls back
to the next older; a version that is not there, or no complete checkpoint, is one line."""

from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlctl.checkpoint.files import set_latest, write_part
from rlctl.checkpoint.trainer import save_trainer
from rlctl.config.inventory import Site
from rlctl.config.job import JobFile
from rlctl.errors import LaunchError, UsageError
from rlctl.launch.agentenv import ParallelConfig
from rlctl.launch.backends import write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.stage import write_staged
from rlctl.models.tinygpt import TinyGPT
from rlctl.ops import pull as pull_mod
from rlctl.ops.pull import pull
from rlctl.trainers.base import DataParallel
from tests.conftest import ROOT, run_cli
from tests.unit.tiny_models import small_config

SITE = {"datacenter": "a", "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 2}], "scheduler": {"kind": "local"}}


def job_dir(tmp_path: Path) -> tuple[JobDir, dict[int, TinyGPT]]:
    """A job dir as a local launch leaves it, with the trainer's part of checkpoints v1 and v2 (v2 `latest`)."""
    jd = JobDir.create("pull", explicit=tmp_path / "job")
    data = {"apiVersion": "rlctl/v1", "kind": "Job", "name": "pull", "inventory": ["x.yaml"],
            "model": {"kind": "builtin", "name": "tiny-demo"}, "task": {"kind": "digits"}, "iterations": 2,
            "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 1}]},
            "checkpoint": {"every_iterations": 1}}  # fmt: skip
    spec = JobFile.model_validate(data)
    jd.write_job(spec, source="test")
    jd.write_json(jd.plan_json, {"trainer": {"site": "local", "ranks": 1}, "controller_site": "local", "rollout": []})
    write_sites(jd.path, {"local": Site.model_validate(SITE)})
    write_staged(jd.path, {"local": {"roots": {"localhost": str(jd.path)}, "files": []}})
    models = {}
    for v in (1, 2):
        torch.manual_seed(v)
        models[v] = TinyGPT(small_config())
        opt = torch.optim.AdamW(models[v].parameters())
        digest = save_trainer(jd.checkpoint(v), model=models[v], optimizers={"policy": opt}, counters={"version": v},
                              split=ParallelConfig("trainer"), data_parallel=DataParallel())  # fmt: skip
        controller_part(jd, v, digest)
    set_latest(jd.checkpoints, 2)
    return jd, models


def controller_part(jd: JobDir, version: int, trainer_digest: str) -> None:
    """The controller's part of checkpoint `version`, naming the trainer part whose manifest has `trainer_digest`."""

    def fill(tmp: Path) -> None:
        tmp.mkdir()
        (tmp / "state.json").write_text(json.dumps({"version": version}))

    write_part(jd.checkpoint(version), "controller", {"controller": fill}, meta={"version": version,
               "trainer_digest": trainer_digest})  # fmt: skip


def damage_controller_part(jd: JobDir, version: int, damage: str) -> str:
    """Checkpoint `version`'s controller part damaged: its manifest "cut short", or written anew naming "another
    trainer part" than the one there; the start of the line `status --checkpoints` marks it with."""
    if damage == "cut short":
        manifest = jd.checkpoint(version) / "MANIFEST.controller.json"
        manifest.write_text(manifest.read_text()[:20])
        return "controller part: MANIFEST.controller.json does not parse (JSONDecodeError"
    assert damage == "another trainer part"
    controller_part(jd, version, "0" * 64)
    return "its trainer part is not the one its controller part was written with"


def same(a: TinyGPT, b: TinyGPT) -> bool:
    return all(torch.equal(x, b.state_dict()[k]) for k, x in a.state_dict().items())


def test_pull_copies_the_newest_complete_checkpoint_and_checks_every_file(tmp_path: Path) -> None:
    jd, models = job_dir(tmp_path)
    got = pull(jd.path)
    assert got.version == 2 and got.to == jd.path / "pulled" / "v2" and got.source.startswith("local:localhost:")
    assert same(TinyGPT.from_pretrained(got.to), models[2])
    # the newest one's weights damaged on the site: its manifest no longer matches, the next older is pulled
    shard = next(jd.checkpoint(2).glob("model/*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    got = pull(jd.path, to=tmp_path / "out")
    assert got.version == 1 and same(TinyGPT.from_pretrained(tmp_path / "out"), models[1])
    assert not list(tmp_path.glob(".*pull-*")) and not list((tmp_path / "out").glob(".*"))  # no partial copy left
    with pytest.raises(LaunchError, match=r"v2: model/.*safetensors: .* the manifest lists"):
        pull(jd.path, checkpoint="2", to=tmp_path / "damaged")
    assert not (tmp_path / "damaged").exists() and not list(tmp_path.glob(".damaged.pull-*"))  # nothing of it here
    with pytest.raises(UsageError, match=r"^--checkpoint 5: no such checkpoint; this job has v1, v2$"):
        pull(jd.path, checkpoint="5")
    with pytest.raises(UsageError, match=r"--checkpoint 'newest': 'latest', 'best' or a version, e\.g\. (\d+) or v\1$"):
        pull(jd.path, checkpoint="newest")
    (jd.checkpoints / "latest.json").unlink()  # the newest that verifies, as of a damaged one
    assert pull(jd.path).version == 1
    assert json.loads((jd.path / "plan.json").read_text())["trainer"]["site"] == "local"


def test_pull_of_a_local_job_counts_the_tracker_files_its_controller_wrote_here(tmp_path: Path) -> None:
    """The controller's job dir is this one: nothing to fetch, and the tracker files are those here (it said
    "tracker files: 0" of a job whose tensorboard/ held its events)."""
    jd, _ = job_dir(tmp_path)
    (jd.path / "tensorboard" / "run").mkdir(parents=True)
    (jd.path / "tensorboard" / "run" / "events.out.tfevents.1").write_bytes(b"x")
    assert pull(jd.path).trackers == ["tensorboard/run/events.out.tfevents.1"]


def test_a_pulled_checkpoint_is_said_when_the_controllers_site_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tracker files come from the controller's site, which may not be the trainer's: one that did not answer
    made the pull exit 1 after the policy was pulled and verified, with no word that it was."""
    jd, models = job_dir(tmp_path)
    site = Site.model_validate(SITE)

    def unreachable(*args: object) -> list[str]:
        raise LaunchError("ssh ctl-host: connect failed: [Errno 113] No route to host")

    far = tmp_path / "far" / "checkpoints"  # the controller's job dir, another one (its latest.json and its part of
    shutil.copytree(jd.checkpoints, far)  # each checkpoint there)
    monkeypatch.setattr(pull_mod, "record_view", lambda job_dir: (site, "ctl-host", str(tmp_path / "far")))
    monkeypatch.setattr(pull_mod, "fetch_record", unreachable)
    got = pull(jd.path)
    assert got.version == 2 and got.trackers == [] and same(TinyGPT.from_pretrained(got.to), models[2])
    assert caplog.messages == [
        "job: tracker files not fetched from the controller's site: ssh ctl-host: connect failed: [Errno 113] No "
        "route to host"
    ]


def test_pull_to_a_home_relative_directory_goes_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--to=~/models/v2` (a shell leaves a ~ after `=` as it is) went to a directory named `~` in the current one
    jd, models = job_dir(tmp_path)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "rlctl-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    r = run_cli("pull", str(jd.path), "--to=~/models/v2", "-o", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["to"] == str(tmp_path / "home" / "models" / "v2") and not (tmp_path / "~").exists()
    assert same(TinyGPT.from_pretrained(tmp_path / "home" / "models" / "v2"), models[2])


def test_pull_to_a_home_that_is_not_there_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--to '~nosuchuser/v2'` ended in a RuntimeError traceback, exit 1 (Path.expanduser's 'Could not determine home
    # directory'), versus one line naming the option, exit 2
    jd, _ = job_dir(tmp_path)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "rlctl-home"))
    r = run_cli("pull", str(jd.path), "--to", "~rlctl-no-such-user/v2")
    assert r.exit_code == 2, r.stderr
    assert "--to ~rlctl-no-such-user/v2: ~rlctl-no-such-user is no home directory here" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_ctrl_c_as_the_pull_fetches_the_tracker_files_says_the_policy_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull Ctrl-C'd as it fetched the tracker files (a long run's tensorboard/ over SSH), its policy already in
    `--to` and verified, said the pull did not finish and hinted the same pull again — which `--to` not empty then
    refuses. It says the policy is complete there, and what fetches the tracker files."""
    jd, models = job_dir(tmp_path)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "rlctl-home"))

    def fetching(job_dir: Path) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr(pull_mod, "fetch_trackers", fetching)
    to = tmp_path / "my model"
    r = run_cli("pull", str(jd.path), "--checkpoint", "1", "--to", str(to))
    assert r.exit_code == 130
    assert r.stderr == (
        f"rlctl: interrupted: the pull of job job stopped as it fetched the tracker files: checkpoint v1's policy is "
        f"complete in {to} (every file verified); `rlctl status {jd.path} --checkpoints` fetches the tracker files\n"
    )
    assert same(TinyGPT.from_pretrained(to), models[1])


def test_pull_best_of_a_job_named_by_its_directory_hints_that_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl pull DIR -c best` of a job the index lacks (a moved job dir): its hint named the job by its id,
    `rlctl status job --checkpoints`, which names no job in the index."""
    jd, _ = job_dir(tmp_path)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "rlctl-home"))
    monkeypatch.setattr(pull_mod, "fetch_trackers", lambda job_dir: [])
    r = run_cli("pull", str(jd.path), "-c", "best")
    assert r.exit_code == 2
    assert r.stderr.endswith(f"(hint: `rlctl status {jd.path} --checkpoints` says when the first comes)\n")


def test_pull_to_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--to .` was a path with an empty name: every checkpoint "failed" staging beside it
    jd, models = job_dir(tmp_path)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    got = pull(jd.path, to=Path("."))
    assert got.to == tmp_path / "here" and same(TinyGPT.from_pretrained(tmp_path / "here"), models[2])


def test_pull_to_a_directory_that_holds_files_is_refused(tmp_path: Path) -> None:
    # the user's own config.json in DIR was overwritten by the model's
    jd, models = job_dir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "own config"}')
    with pytest.raises(UsageError, match=rf"--to {mine}: not empty") as e:
        pull(jd.path, to=mine)
    assert e.value.exit_code == 2 and (mine / "config.json").read_text() == '{"my": "own config"}'
    assert sorted(p.name for p in mine.iterdir()) == ["config.json"]
    (mine / "config.json").unlink()  # an empty one is fine
    assert same(TinyGPT.from_pretrained(pull(jd.path, to=mine).to), models[2])
    again = pull(jd.path)  # the job's own copy of a version is replaced by a pull again
    assert pull(jd.path).to == again.to and same(TinyGPT.from_pretrained(again.to), models[2])


KILLED_PULL = """
import os, signal, sys
from pathlib import Path
from rlctl.ops import pull
pull._move = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)  # killed as it moves the verified files in
pull.pull(Path(sys.argv[1]), to=Path(sys.argv[2]) if sys.argv[2:] else None)
"""


def test_what_a_killed_pull_left_in_its_destination_goes_with_the_next_pull(tmp_path: Path) -> None:
    # its staging folder (a partial copy of the weights) stayed inside pulled/vN for good, and a `--to` given again
    # was refused as not empty
    jd, models = job_dir(tmp_path)
    out = tmp_path / "out"
    for where in ([], [str(out)]):
        killed = subprocess.run([sys.executable, "-c", KILLED_PULL, str(jd.path), *where], cwd=ROOT, check=False)
        assert killed.returncode == -signal.SIGKILL
    left = [*(jd.path / "pulled" / "v2").glob(".pull-*"), *out.glob(".pull-*")]
    assert len(left) == 2 and all(any(p.iterdir()) for p in left)  # what the killed pulls staged
    assert sorted(p.name for p in pull(jd.path).to.iterdir()) == ["config.json", "model.safetensors"]
    got = pull(jd.path, to=out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert same(TinyGPT.from_pretrained(got.to), models[2])


def test_pull_to_another_filesystem_copies_where_a_rename_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--to` a mount point: the files were staged beside it, on its parent's filesystem, and the rename into it
    # failed with EXDEV (a traceback)
    jd, models = job_dir(tmp_path)

    def across(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(pull_mod.os, "replace", across)
    got = pull(jd.path, to=tmp_path / "vol")
    assert same(TinyGPT.from_pretrained(got.to), models[2]) and not list(got.to.glob(".*"))


def test_pull_to_a_place_it_cannot_write_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each line names --to, as its 'not a directory' and 'not empty' do, versus the path alone where the write was
    refused."""
    jd, _ = job_dir(tmp_path)
    (tmp_path / "afile").write_text("hi")
    with pytest.raises(UsageError, match=rf"^--to {tmp_path}/afile: not a directory$") as e:
        pull(jd.path, to=tmp_path / "afile")
    assert e.value.exit_code == 2 and (tmp_path / "afile").read_text() == "hi"
    with pytest.raises(UsageError, match=rf"^--to {tmp_path}/afile/sub: cannot pull into it: Not a directory$"):
        pull(jd.path, to=tmp_path / "afile" / "sub")

    def read_only(src: object, dst: object) -> None:  # root writes through a chmod: the error as such a place gives
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(pull_mod.os, "replace", read_only)
    with pytest.raises(UsageError, match=rf"^--to {tmp_path}/ro: cannot pull into it: Read-only file system$"):
        pull(jd.path, to=tmp_path / "ro")
    assert not (tmp_path / "ro").exists()  # nothing of it left


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("plan.json", '{"trainer": {"si', r"plan.json: not valid JSON"),
        (
            "plan.json",
            '{"trainer": "local", "controller_site": "local"}',
            r"plan.json: trainer: no object with a site name",
        ),
        ("staged.json", '{"local": {"roo', r"staged.json: not valid JSON"),
    ],
)
def test_pull_of_a_job_whose_record_is_damaged_is_one_error(tmp_path: Path, name: str, text: str, says: str) -> None:
    jd, _ = job_dir(tmp_path)
    (jd.path / name).write_text(text)
    with pytest.raises(LaunchError, match=says):
        pull(jd.path)


def test_pull_reads_past_a_damaged_line_of_agents_jsonl(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a line cut short by a full disk stays in agents.jsonl for good: `rlctl pull` failed on it ("agents.jsonl: line 1
    # is not valid JSON"), every time, while status, logs and stop read past it
    jd, models = job_dir(tmp_path)
    trainer = {"name": "trainer-0", "role": "trainer", "replica": 0, "site": "local", "backend": "local",
               "ident": {"pid": 1, "pgid": 1}, "host": "localhost", "gpus": None, "log": None}  # fmt: skip
    (jd.path / "agents.jsonl").write_text('{"name": "rollout-1", "role": "roll\n' + json.dumps(trainer) + "\n")
    got = pull(jd.path)
    assert got.version == 2 and same(TinyGPT.from_pretrained(got.to), models[2])
    assert any(f"{jd.path}/agents.jsonl: line 1 is not valid JSON" in m for m in caplog.messages), caplog.messages


def test_pull_of_a_checkpoint_that_is_not_there_lists_those_that_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # `-c 99` said "no checkpoint could be pulled: v99: no MANIFEST.trainer.json (not written, or the part is
    # incomplete)", after a warning that said the same
    jd, _ = job_dir(tmp_path)
    with pytest.raises(UsageError, match=r"^--checkpoint 99: no such checkpoint; this job has v1, v2$") as e:
        pull(jd.path, checkpoint="99")
    assert e.value.exit_code == 2 and not caplog.records
    (jd.checkpoint(2) / "MANIFEST.trainer.json").unlink()  # v2 incomplete: not listed, and said as such
    with pytest.raises(UsageError, match=r"this job has v1$"):
        pull(jd.path, checkpoint="3")
    for named in ("v3", "V3", "03"):  # as typed: `-c v3` was said back as `--checkpoint 3`
        with pytest.raises(UsageError, match=rf"^--checkpoint {named}: no such checkpoint; this job has v1$"):
            pull(jd.path, checkpoint=named)
    with pytest.raises(
        UsageError, match=r"^--checkpoint 2: v2 is not sound \(trainer part: no MANIFEST.trainer.json\)"
    ):
        pull(jd.path, checkpoint="2")
    assert not caplog.records  # one line: the error


def test_pull_takes_a_checkpoint_as_messages_name_it_and_names_one_a_resume_set_aside(tmp_path: Path) -> None:
    # `--checkpoint v20` was refused though every message names checkpoints `v20`; a version a resume had set aside
    # in checkpoints/abandoned/ was said to be no checkpoint, with no word of where it is
    jd, models = job_dir(tmp_path)
    got = pull(jd.path, checkpoint="v1", to=tmp_path / "v1")
    assert got.version == 1 and same(TinyGPT.from_pretrained(tmp_path / "v1"), models[1])
    aside = jd.checkpoints / "abandoned" / "iter-40.0123abcd"
    (aside / "model").mkdir(parents=True)
    (aside / "model" / "config.json").write_text("{}")
    with pytest.raises(UsageError) as e:
        pull(jd.path, checkpoint="40")
    assert str(e.value) == (
        f"--checkpoint 40: no such checkpoint; a resume from an older one set it aside in {aside} (its model/ folder "
        "is the policy, not pulled from there); this job has v1, v2"
    )


def test_pull_and_status_of_a_job_without_its_sites_json_name_the_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sites.json deleted by hand: pull said "the job was never staged to its trainer site 'local'", status "site
    # 'local' is not in this job's inventory ()", logs "trainer-0 has no log at … (removed?)"
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd, _ = job_dir(tmp_path)
    trainer = {
        "name": "trainer-0",
        "role": "trainer",
        "replica": 0,
        "site": "local",
        "backend": "local",
        "ident": {"pid": 2**22 + 1, "pgid": 2**22 + 1, "start_ticks": 1},
        "host": "localhost",
        "gpus": None,
        "log": str(tmp_path / "site" / "trainer-0.log"),  # on its site: not here
    }
    (jd.path / "agents.jsonl").write_text(json.dumps(trainer) + "\n")
    (jd.path / "sites.json").unlink()
    said = (
        f"rlctl: error: {jd.path}/sites.json: missing (the launch's record of the job's sites: rlctl reaches them "
        "through it) (hint: put it back from a copy of the job dir)\n"
    )
    for args in (["pull", str(jd.path)], ["status", str(jd.path)], ["logs", str(jd.path), "trainer/0"]):
        r = run_cli(*args)
        assert r.exit_code == 1 and r.stderr == said, (args, r.stderr)
    (jd.path / "sites.json").write_text("[]\n")  # there, without the trainer's site: it was "never staged" too
    r = run_cli("pull", str(jd.path))
    assert r.exit_code == 1 and r.stderr == (
        f"rlctl: error: {jd.path}/sites.json: no site 'local', the trainer's in plan.json (the launch's record of the "
        "job's sites is damaged) (hint: put it back from a copy of the job dir)\n"
    ), r.stderr


def test_pull_takes_the_checkpoint_latest_names_though_job_json_counts_other_versions(tmp_path: Path) -> None:
    """job.json's `iterations` edited by hand since v2 (to 5, every 3: the job's versions are v5, v3): the pull took
    the versions at or below v2 only, and found none ('no checkpoint … could be pulled from site local: ' and no
    reason); after a `launch --resume --iterations` from v1 (`iterations_before: [1]`) it took v1, not the latest v2."""
    jd, models = job_dir(tmp_path)
    data = json.loads(jd.job_json.read_text())
    data["job"] |= {"iterations": 5, "checkpoint": {**data["job"]["checkpoint"], "every_iterations": 3}}
    jd.job_json.write_text(json.dumps(data))
    got = pull(jd.path)
    assert got.version == 2 and same(TinyGPT.from_pretrained(got.to), models[2])
    jd.job_json.write_text(json.dumps({**data, "iterations_before": [1]}))
    assert pull(jd.path, to=tmp_path / "again").version == 2


def test_pull_falls_back_to_a_checkpoint_on_disk_that_job_jsons_every_iterations_no_longer_counts(
    tmp_path: Path,
) -> None:
    """checkpoint.every_iterations edited from 1 to 2 in job.json since v1 was written; v2, the latest, damaged: the
    pull tried v2 alone (the job's versions now) and failed, versus taking v1, on the site and complete."""
    jd, models = job_dir(tmp_path)
    data = json.loads(jd.job_json.read_text())
    data["job"]["checkpoint"]["every_iterations"] = 2
    jd.job_json.write_text(json.dumps(data))
    shard = next(jd.checkpoint(2).glob("model/*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))
    got = pull(jd.path)
    assert got.version == 1 and same(TinyGPT.from_pretrained(got.to), models[1])


def test_pull_of_a_copied_job_dir_reads_the_copy(tmp_path: Path) -> None:
    # its staged.json names the dir it was launched in: the copy's pull read that dir's checkpoints
    jd, models = job_dir(tmp_path)
    copy = tmp_path / "elsewhere"
    shutil.copytree(jd.path, copy)
    shutil.rmtree(jd.path)
    got = pull(copy)
    assert got.version == 2 and got.to == copy / "pulled" / "v2" and same(TinyGPT.from_pretrained(got.to), models[2])


def test_pull_best_takes_the_checkpoint_with_the_highest_held_out_reward(tmp_path: Path) -> None:
    """`--checkpoint best`: of the checkpoints the run evaluated (evaluations.jsonl), the highest greedy reward;
    refused in one line where it evaluated none."""
    jd, models = job_dir(tmp_path)
    for v in (1, 2):
        jd.event("checkpoint", version=v)
    with pytest.raises(UsageError, match=r"^--checkpoint best: no complete checkpoint of job job has held-out figures"):
        pull(jd.path, checkpoint="best")
    for v, reward in ((0, 0.1), (1, 0.6), (2, 0.4)):  # v1 scored better than the newest
        jd.append(jd.evaluations, {"version": v, "greedy_reward": reward, "prompts": 8})
    got = pull(jd.path, checkpoint="best")
    assert got.version == 1 and same(TinyGPT.from_pretrained(got.to), models[1])
    r = run_cli("pull", str(jd.path), "--checkpoint", "bets")
    assert r.exit_code == 2 and "'latest', 'best' or a version" in r.stderr, r.stderr


def test_pull_best_passes_over_a_damaged_checkpoint_for_the_best_sound_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The best by held-out figures (v2) has its MANIFEST.trainer.json cut short: `best` chose it by the figures alone
    and the pull then refused it ('no checkpoint of job could be pulled ... v2: ...'), versus the best of those that
    pass the check `status --checkpoints` makes (v1), the one passed over said in one line with why."""
    jd, models = job_dir(tmp_path)
    for v, reward in ((1, 0.4), (2, 0.6)):
        jd.event("checkpoint", version=v)
        jd.append(jd.evaluations, {"version": v, "greedy_reward": reward, "prompts": 8})
    manifest = jd.checkpoint(2) / "MANIFEST.trainer.json"
    manifest.write_text(manifest.read_text()[:20])
    got = pull(jd.path, checkpoint="best")
    assert got.version == 1 and same(TinyGPT.from_pretrained(got.to), models[1])
    said = [r.getMessage() for r in caplog.records if "--checkpoint best" in r.getMessage()]
    assert len(said) == 2, said
    assert said[0].startswith(
        "--checkpoint best: v2 (held-out greedy reward 0.6000) passed over as damaged: trainer part: "
        "MANIFEST.trainer.json does not parse (JSONDecodeError"
    ), said
    assert said[1] == "--checkpoint best: v1 (held-out greedy reward 0.4000), the best sound one", said
    manifest = jd.checkpoint(1) / "MANIFEST.trainer.json"  # none sound: one line naming each, and what to do
    manifest.write_text("{")
    every = r"^--checkpoint best: every checkpoint of job job with held-out figures is damaged \(v2: trainer part: "
    with pytest.raises(UsageError, match=every + r".*; v1: trainer part: .*\); name another version instead$"):
        pull(jd.path, checkpoint="best")


@pytest.mark.parametrize("damage", ["cut short", "another trainer part"])
def test_pull_best_passes_over_a_checkpoint_whose_controller_part_is_damaged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """The best by held-out figures (v2) has a sound trainer part, but its controller part is damaged (its manifest
    cut short, or naming another trainer part than the one there): `status --checkpoints` marks it damaged
    (`parts_problem`), and `best` took it all the same (it checked the trainer part alone), versus the best sound one
    (v1), with one line for each checkpoint passed over saying why, and one for the one taken."""
    jd, models = job_dir(tmp_path)
    for v, reward in ((1, 0.4), (2, 0.6)):
        jd.event("checkpoint", version=v)
        jd.append(jd.evaluations, {"version": v, "greedy_reward": reward, "prompts": 8})
    why = damage_controller_part(jd, 2, damage)
    table = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)["checkpoints"]
    assert table[-1]["damaged"].startswith(why)  # the rule `best` follows
    got = pull(jd.path, checkpoint="best")
    assert got.version == 1 and same(TinyGPT.from_pretrained(got.to), models[1])
    said = [r.getMessage() for r in caplog.records if "--checkpoint best" in r.getMessage()]
    assert said[0].startswith(f"--checkpoint best: v2 (held-out greedy reward 0.6000) passed over as damaged: {why}")
    assert said[1:] == ["--checkpoint best: v1 (held-out greedy reward 0.4000), the best sound one"], said


@pytest.mark.parametrize("damage", ["cut short", "another trainer part"])
def test_pull_latest_is_the_checkpoint_status_calls_the_latest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """v2, the one latest.json names, has a sound trainer part and a damaged controller part: `status --checkpoints`
    marks it damaged and calls v1 the latest, and `pull` took v2 (it judged the trainer part alone), versus v1, by the
    same rule (`sound`), v2 passed over in a line saying why."""
    jd, models = job_dir(tmp_path)
    for v in (1, 2):
        jd.event("checkpoint", version=v)
    why = damage_controller_part(jd, 2, damage)
    table = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)["checkpoints"]
    assert [(r["version"], r["latest"]) for r in table] == [(1, True), (2, False)] and table[1]["damaged"].startswith(
        why
    )
    got = pull(jd.path)
    assert got.version == 1 and same(TinyGPT.from_pretrained(got.to), models[1])
    assert [m for m in caplog.messages if "not pulled" in m] == [
        f"checkpoint v2 on site local not pulled: {table[1]['damaged']}; trying an older one"
    ]


@pytest.mark.parametrize("damage", ["trainer part cut short", "another trainer part", "cut short"])
def test_pull_of_a_version_named_that_is_not_sound_is_refused_unless_only_its_controller_part_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """`--checkpoint 2` of a v2 that `status --checkpoints` marks damaged was judged by its trainer part alone: one cut
    short was refused as the copy found it (exit 1, no word of the sound ones), and one beside a controller part that
    names another trainer part was pulled as v2. Refused before any copy where the policy is not v2's whole or not the
    one the job's record of v2 was written with (one line: the damage, the sound versions; exit 2); pulled, with a
    warning, where only the controller part is damaged (the policy is whole and verified: what a pull is for)."""
    jd, models = job_dir(tmp_path)
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "rlctl-home"))
    for v in (1, 2):
        jd.event("checkpoint", version=v)
    if damage == "trainer part cut short":
        shard = next(jd.checkpoint(2).glob("model/*.safetensors"))
        shard.write_bytes(shard.read_bytes()[:-1])
    else:
        damage_controller_part(jd, 2, damage)
    table = json.loads(run_cli("status", str(jd.path), "--checkpoints", "-o", "json").stdout)["checkpoints"]
    why = table[1]["damaged"]
    to = tmp_path / "v2"
    r = run_cli("pull", str(jd.path), "--checkpoint", "v2", "--to", str(to))
    if damage == "cut short":
        assert r.exit_code == 0, r.stderr
        assert same(TinyGPT.from_pretrained(to), models[2])
        assert [m for m in caplog.messages if m.startswith("--checkpoint")] == [
            f"--checkpoint v2: v2 is not sound ({why}); its trainer part, the policy, is: pulled, every file verified "
            "(a resume cannot start from v2)"
        ]
        return
    assert r.exit_code == 2 and not to.exists(), r.stderr
    assert r.stderr == (
        f"rlctl: error: --checkpoint v2: v2 is not sound ({why}); the sound ones: v1 (hint: `rlctl status {jd.path} "
        "--checkpoints` lists them)\n"
    )


def test_pull_best_reads_the_evaluations_of_a_controller_on_another_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller whose job dir is elsewhere, its launcher gone before the run ended: its checkpoints and held-out
    figures are in its record there, fetched before the best is chosen (as `status --checkpoints` lists them),
    versus 'no complete checkpoint ... has held-out figures' of the stale record here."""
    jd, models = job_dir(tmp_path)
    far = JobDir(tmp_path / "far")
    far.path.mkdir()
    for v in (1, 2):
        far.event("checkpoint", version=v)
    for v, reward in ((1, 0.6), (2, 0.4)):
        far.append(far.evaluations, {"version": v, "greedy_reward": reward, "prompts": 8})
    site = Site.model_validate(SITE)
    monkeypatch.setattr(pull_mod, "record_view", lambda job_dir: (site, "localhost", str(far.path)))
    got = pull(jd.path, checkpoint="best")
    assert got.version == 1 and same(TinyGPT.from_pretrained(got.to), models[1])


def test_pull_of_a_job_whose_latest_json_is_damaged_takes_the_newest_checkpoint_that_verifies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """latest.json cut short (a disk that filled, a copy of the job dir): the pull refused, 'name a version with
    --checkpoint N', versus the rule `launch --resume` takes (choose_resume): the newest checkpoint that verifies,
    the damaged pointer said once."""
    jd, models = job_dir(tmp_path)
    (jd.checkpoints / "latest.json").write_text('{"vers')
    got = pull(jd.path)
    assert got.version == 2 and same(TinyGPT.from_pretrained(got.to), models[2])
    damaged = [r.getMessage() for r in caplog.records if "latest.json" in r.getMessage()]
    assert len(damaged) == 1 and "is damaged" in damaged[0] and "newest checkpoint that verifies" in damaged[0]
    caplog.clear()
    (jd.checkpoint(2) / "MANIFEST.trainer.json").write_text("{")  # the newest one's manifest damaged too: v1
    got = pull(jd.path, to=tmp_path / "out")
    assert got.version == 1 and same(TinyGPT.from_pretrained(tmp_path / "out"), models[1])
    assert sum("latest.json" in r.getMessage() for r in caplog.records) == 1
    (jd.checkpoint(1) / "MANIFEST.trainer.json").write_text("{")  # none verifies: the pull's own one line
    with pytest.raises(LaunchError, match=r"^no checkpoint of .* could be pulled from site local: v2: .*; v1: "):
        pull(jd.path, to=tmp_path / "none")
    # none on the site at all: said as a damaged latest.json, versus 'latest.json names none' (of a pointer that does
    # not parse)
    for v in (1, 2):
        shutil.rmtree(jd.checkpoint(v))
    with pytest.raises(UsageError) as e:
        pull(jd.path, to=tmp_path / "none")
    assert str(e.value).startswith(f"{jd.path}: no checkpoint is complete yet (latest.json is damaged ("), str(e.value)
    assert str(e.value).endswith("), and site local holds none)"), str(e.value)


@pytest.mark.parametrize("how", ["missing", "not a file"])
def test_pull_of_a_job_whose_latest_json_is_missing_takes_the_newest_checkpoint_that_verifies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """latest.json gone (or a directory in its place) beside sound checkpoints: the pull refused 'no checkpoint is
    complete yet (no latest.json)', while a damaged one fell back to the newest that verifies, as a resume does."""
    jd, models = job_dir(tmp_path)
    pointer = jd.checkpoints / "latest.json"
    pointer.unlink()
    if how == "not a file":
        pointer.mkdir()
    got = pull(jd.path)
    assert got.version == 2 and same(TinyGPT.from_pretrained(got.to), models[2])
    said = [r.getMessage() for r in caplog.records if "latest.json" in r.getMessage()]
    assert said == [f"{pointer} is {how}: pulling the newest checkpoint that verifies"]
    for v in (1, 2):  # none on the site: one true line
        shutil.rmtree(jd.checkpoint(v))
    with pytest.raises(UsageError, match=rf"no checkpoint is complete yet \(latest.json is {how}, and site local"):
        pull(jd.path, to=tmp_path / "none")
    shutil.rmtree(jd.checkpoints)
    jd.checkpoints.write_text("x")  # checkpoints/ a file
    with pytest.raises(UsageError, match=rf"^{jd.checkpoints} is not a directory: site local holds no checkpoint"):
        pull(jd.path, to=tmp_path / "none")


def test_a_directory_named_iter_and_other_digits_is_no_checkpoint() -> None:
    """`iter-²` (a superscript: str.isdigit, not int()'s) on a site: not a checkpoint, versus int()'s ValueError
    traceback from pull, and from a resume's listing of the controller's parts."""
    from rlctl.ops.pull import _checkpoints
    from rlctl.ops.resumepoint import stored_checkpoints

    files = ["iter-²/MANIFEST.trainer.json", "iter-3/MANIFEST.trainer.json", "iter-٣/x"]
    assert _checkpoints(files) == {3: True}

    class Listed:
        def list_files(self, root: str) -> list[str]:
            return ["iter-²/MANIFEST.controller.json", "iter-3/MANIFEST.controller.json"]

    class Job:
        checkpoints = "/job/checkpoints"

    assert stored_checkpoints(Listed(), Job()) == [3]  # type: ignore[arg-type]
