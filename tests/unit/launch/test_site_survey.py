"""`HostFiles.survey`: the SSH view's one command (run with bash here in place of the connection) sees what the local
view sees — every file's size under the directories asked, the bytes of those named, odd names included."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.errors import LaunchError
from rlctl.launch import sitefs
from rlctl.launch.localrunner import LocalRunner
from rlctl.launch.sitefs import LocalFiles, Survey


def ssh_view() -> sitefs.SshFiles:
    fs = object.__new__(sitefs.SshFiles)
    fs.runner, fs.where = LocalRunner(), "test-host"  # type: ignore[assignment]
    return fs


def test_the_ssh_view_surveys_as_the_local_one_in_one_command(tmp_path: Path) -> None:
    files = {
        "iter-1/MANIFEST.trainer.json": b'{"files": {}}',
        "iter-1/model/a b.safetensors": b"x" * 100,
        "iter-1/model/new\nline": b"y",
        "iter-1/model/back\\slash": b"",
        "iter-2/MANIFEST.controller.json": b"\xff\x00not utf-8",
        "iter-2/MANIFEST.empty.json": b"",
        "iter-3/w.bin": b"z" * 7,  # not asked for
        "other": b"1",
    }
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    (tmp_path / "iter-2" / "linked").symlink_to(tmp_path / "iter-1" / "model" / "a b.safetensors")
    (tmp_path / "iter-2" / "dangling").symlink_to(tmp_path / "nowhere")
    dirs = ["iter-1", "iter-2", "iter-9"]
    want = Survey(
        True,
        {rel: len(data) for rel, data in files.items() if rel.split("/")[0] in dirs} | {"iter-2/linked": 100},
        {rel: data for rel, data in files.items() if "/MANIFEST." in rel},
    )
    commands: list[str] = []
    fs = ssh_view()
    run = fs.runner.run
    fs.runner.run = lambda command, **kw: commands.append(command) or run(command, **kw)  # type: ignore[method-assign]
    assert LocalFiles().survey(str(tmp_path), dirs, read="MANIFEST.*.json") == want
    assert fs.survey(str(tmp_path), dirs, read="MANIFEST.*.json") == want
    assert len(commands) == 1
    missing = Survey(False, {}, {})
    assert LocalFiles().survey(str(tmp_path / "gone"), dirs, read="*") == missing
    assert ssh_view().survey(str(tmp_path / "gone"), dirs, read="*") == missing
    assert ssh_view().survey(str(tmp_path), ["iter-9"], read="*") == Survey(True, {}, {})
    assert ssh_view().survey(str(tmp_path), [], read="*") == Survey(True, {}, {})


def test_what_the_site_prints_before_the_survey_is_not_read_as_a_record(tmp_path: Path) -> None:
    """A login or setup line (`module load` saying so, a banner) before the survey's output: the records are read
    from its mark on, versus the directory taken as missing and a record lost."""
    (tmp_path / "iter-1").mkdir()
    (tmp_path / "iter-1" / "MANIFEST.trainer.json").write_bytes(b"{}")
    fs = ssh_view()
    run = fs.runner.run
    fs.runner.run = lambda command, **kw: run("echo 'Loading cuda/12.4'; printf 'S9 x\\0'\n" + command, **kw)  # type: ignore[method-assign]
    want = Survey(True, {"iter-1/MANIFEST.trainer.json": 2}, {"iter-1/MANIFEST.trainer.json": b"{}"})
    assert fs.survey(str(tmp_path), ["iter-1"], read="MANIFEST.*.json") == want


def test_the_local_view_follows_a_linked_directory_as_the_ssh_view_does(tmp_path: Path) -> None:
    """A checkpoint whose model/ is a link to a directory elsewhere (its weights moved to another disk): the local
    survey lists the files under it at their sizes, as `find -L` does over SSH and as the check before it (a `stat`
    of each file the manifest lists) saw them, versus none (Python's rglob does not enter a linked directory): its
    checkpoint marked damaged (`model/… is missing`) by `status --checkpoints`, passed over by a pull of the latest
    and refused to a pull by its version. A link back up (a loop) is not entered again."""
    (tmp_path / "disk2" / "model").mkdir(parents=True)
    (tmp_path / "disk2" / "model" / "w.safetensors").write_bytes(b"w" * 5)
    (tmp_path / "ckpts" / "iter-1").mkdir(parents=True)
    (tmp_path / "ckpts" / "iter-1" / "MANIFEST.trainer.json").write_bytes(b"{}")
    (tmp_path / "ckpts" / "iter-1" / "model").symlink_to(tmp_path / "disk2" / "model")
    (tmp_path / "disk2" / "model" / "up").symlink_to(tmp_path / "ckpts" / "iter-1")
    root = str(tmp_path / "ckpts")
    got = LocalFiles().survey(root, ["iter-1"], read="MANIFEST.*.json")
    assert got == Survey(
        True,
        {"iter-1/MANIFEST.trainer.json": 2, "iter-1/model/w.safetensors": 5},
        {"iter-1/MANIFEST.trainer.json": b"{}"},
    )


def test_a_link_back_up_is_passed_by_on_the_ssh_view_as_on_the_local_one(tmp_path: Path) -> None:
    """A directory link back up (a loop find -L reports, exit 1): the rest listed as the local view lists it, versus
    the whole survey failing (the site said not to answer, nothing on it checked)."""
    (tmp_path / "iter-1" / "model").mkdir(parents=True)
    (tmp_path / "iter-1" / "model" / "w.bin").write_bytes(b"ab")
    (tmp_path / "iter-1" / "MANIFEST.trainer.json").write_bytes(b"{}")
    (tmp_path / "iter-1" / "model" / "up").symlink_to("..")
    want = LocalFiles().survey(str(tmp_path), ["iter-1"], read="MANIFEST.*.json")
    assert want.sizes == {"iter-1/model/w.bin": 2, "iter-1/MANIFEST.trainer.json": 2}
    assert ssh_view().survey(str(tmp_path), ["iter-1"], read="MANIFEST.*.json") == want


def test_what_the_site_prints_after_the_survey_is_not_read_and_a_garbled_record_is_one_error(tmp_path: Path) -> None:
    """A line after the last record (an exit trap's or a logout's "Session closed") is no record, versus a
    ValueError traceback from `status --checkpoints` and `pull` (it began with S, read as a size); a record garbled
    in the middle is a LaunchError naming the host (the site taken as not answering: `surveyed`)."""
    (tmp_path / "iter-1").mkdir()
    (tmp_path / "iter-1" / "MANIFEST.trainer.json").write_bytes(b"{}")
    want = LocalFiles().survey(str(tmp_path), ["iter-1"], read="MANIFEST.*.json")
    fs = ssh_view()
    run = fs.runner.run
    fs.runner.run = lambda command, **kw: run(f"trap 'echo Session closed' EXIT\n{command}", **kw)  # type: ignore[method-assign]
    assert fs.survey(str(tmp_path), ["iter-1"], read="MANIFEST.*.json") == want
    fs = ssh_view()
    fs.runner.run = lambda command, **kw: run(command.replace("printf 'S%s", "printf 'Sx%s"), **kw)  # type: ignore[method-assign]
    with pytest.raises(LaunchError, match=r"^ssh test-host: the look at .* printed an unreadable record: invalid lit"):
        fs.survey(str(tmp_path), ["iter-1"], read="MANIFEST.*.json")
