"""`rlctl profile -o FILE` decides whether FILE is a profile by streaming it, never holding it whole
(refuse_overwriting)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from rlctl.errors import UsageError
from rlctl.profiler.profile import refuse_overwriting


def test_a_large_file_is_judged_from_its_head_not_read_whole(tmp_path: Path) -> None:
    """`-o` naming a dataset read all of it (and YAML-parsed it) to find it no profile: 32 MiB held in memory."""
    big = tmp_path / "data.jsonl"
    with big.open("wb") as f:
        f.truncate(32 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(UsageError, match="holds a file that is no profile"):
            refuse_overwriting(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, peak


def test_a_file_larger_than_any_profile_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "huge.yaml"
    with big.open("wb") as f:
        f.truncate(65 * 1024 * 1024)
    with pytest.raises(UsageError, match=r"holds a file of 68157440 bytes, larger than any profile"):
        refuse_overwriting(big)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_profile_past_the_head_s_size_is_written_over_and_another_kind_is_named(tmp_path: Path, suffix: str) -> None:
    pad = [{"tp": i, "seconds": 0.5} for i in range(6000)]  # past 64 KiB
    for kind, refused in (("Profile", False), ("Job", True)):
        data = {"apiVersion": "rlctl/v1", "kind": kind, "sites": {"a": {"generation": pad}}}
        path = tmp_path / f"p{suffix}"
        path.write_text(json.dumps(data, indent=2) if suffix == ".json" else _yaml(data))
        assert path.stat().st_size > 64 * 1024
        if refused:
            with pytest.raises(UsageError, match="holds a file of kind 'Job'"):
                refuse_overwriting(path)
        else:
            refuse_overwriting(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".yaml"])
def test_a_dataset_past_64_kib_whose_first_row_reads_as_a_profile_is_not_written_over(
    tmp_path: Path, suffix: str
) -> None:
    """Past 64 KiB the head's first `kind` line said: a JSON-lines dataset whose first row began
    `{"kind": "Profile"` (or a YAML stream whose first document was a profile) was taken for a profile and
    replaced. The whole file must be one document of a profile's shape."""
    row = {"kind": "Profile", "prompt": "x" * 100, "answer": "7"}
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        text = "".join(json.dumps(row) + "\n" for _ in range(1000))
    else:
        rows = [dict(row, answer=str(i)) for i in range(1000)]
        text = _yaml({"apiVersion": "rlctl/v1", "kind": "Profile", "sites": {"a": {}}}) + "---\n" + _yaml(rows)
    path.write_text(text)
    assert path.stat().st_size > 64 * 1024
    with pytest.raises(UsageError, match="holds a file that is no profile"):
        refuse_overwriting(path)
    assert path.read_text() == text


def test_a_directory_or_a_path_below_a_file_is_refused_before_profiling(tmp_path: Path) -> None:
    """`-o profiles/` (a directory) was refused by save_profile, after a measured profile's minutes, as
    'cannot write profile: [Errno 21] Is a directory', naming no option."""
    with pytest.raises(UsageError, match=r"^-o .*: is a directory") as e:
        refuse_overwriting(tmp_path)
    assert e.value.hint == f"give a file name, e.g. {tmp_path / 'profile.yaml'}"
    job = tmp_path / "demo.yaml"
    job.write_text("kind: Job\n")
    with pytest.raises(UsageError, match=rf"^-o {job}/p/x.yaml: {job} is a file, not a directory"):
        refuse_overwriting(job / "p" / "x.yaml")
    refuse_overwriting(tmp_path / "new" / "p.yaml")  # a folder not made yet: save_profile makes it


def test_a_profile_the_write_is_refused_at_is_o_s_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path that passes refuse_overwriting and is refused as the profile is written (a folder not this user's: root
    writes anything, so the refusal is made here): -o's one line, exit 2, versus 'PATH: cannot write profile: [Errno
    13] Permission denied: 'PATH'', naming no option."""
    from tests.conftest import ROOT, run_cli

    out = tmp_path / "p.yaml"
    write_text = Path.write_text

    def refused(self: Path, *args: object, **kwargs: object) -> int:
        if self == out:
            raise PermissionError(13, "Permission denied", str(self))
        return write_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", refused)
    r = run_cli("profile", "-c", str(ROOT / "clusters" / "local.yaml"), "-m", "tiny-demo", "-o", str(out))
    line = f"rlctl: error: -o {out}: cannot write the profile: Permission denied (hint: write elsewhere)\n"
    assert (r.exit_code, r.stderr) == (2, line), r


def _yaml(data: object) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
