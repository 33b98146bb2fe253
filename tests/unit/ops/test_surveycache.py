"""`ManifestCache`: a look at a site's checkpoints asks it for the manifests new or changed since the last look only,
and judges what a look reading every manifest judges — through the local view and the SSH view's one command (run
with bash here in place of the connection)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from rlctl.checkpoint.files import write_part
from rlctl.launch.sitefs import HostFiles, LocalFiles, Survey
from rlctl.ops.checkpoints import sound
from rlctl.ops.surveycache import ManifestCache
from tests.unit.launch.test_site_survey import ssh_view

READ = "MANIFEST.*.json"
NUM_CHECKPOINTS = 12
ODD = "iter-1/model/new\nline $(x) ]\\/MANIFEST.odd.json"  # a name the SSH view's lookup of stamps must take as it is
HOUR_AGO = time.time() - 3600


def checkpoints(root: Path) -> list[str]:
    """NUM_CHECKPOINTS checkpoints' both parts under `root`, their manifests last written an hour ago."""
    for v in range(1, NUM_CHECKPOINTS + 1):
        weights = {"model": lambda p, v=v: p.mkdir() or (p / "w.bin").write_bytes(bytes(v))}
        digest = write_part(root / f"iter-{v}", "trainer", weights, meta={"counters": {"version": v}})
        state = {"controller": lambda p: p.mkdir() or (p / "state.json").write_text("{}")}
        write_part(root / f"iter-{v}", "controller", state, meta={"version": v, "trainer_digest": digest})
    (root / ODD).parent.mkdir(parents=True)
    (root / ODD).write_text("{}")
    for manifest in root.glob(f"*/**/{READ}"):
        os.utime(manifest, (HOUR_AGO, HOUR_AGO))
    return [f"iter-{v}" for v in range(1, NUM_CHECKPOINTS + 1)]


def verdicts(seen: Survey) -> list[str | None]:
    return [sound({"trainer": seen, "controller": seen}, v) for v in range(1, NUM_CHECKPOINTS + 1)]


class Looks:
    """Looks at one directory through `fs`, each through the cache file `path` loaded anew (as each `rlctl status`),
    recording the manifests each look was sent."""

    def __init__(self, fs: HostFiles, root: Path, dirs: list[str]) -> None:
        self.fs, self.root, self.dirs, self.path = fs, root, dirs, root.parent / "kept.json"
        self.sent: list[set[str]] = []
        survey = fs.survey

        def recorded(*args: object, **kw: object) -> Survey:
            got = survey(*args, **kw)  # type: ignore[arg-type]
            self.sent.append(set(got.texts))
            return got

        fs.survey = recorded  # type: ignore[method-assign]

    def look(self) -> Survey:
        kept = ManifestCache.load(self.path)
        seen = kept.survey(self.fs, ("far", "g1", str(self.root)), self.dirs, read=READ)
        kept.save()
        return seen

    def every_manifest(self) -> Survey:
        """What a look reading every manifest sees."""
        return LocalFiles().survey(str(self.root), self.dirs, read=READ)


@pytest.fixture(params=["local", "ssh"])
def looks(request: pytest.FixtureRequest, tmp_path: Path) -> Looks:
    root = tmp_path / "checkpoints"
    dirs = checkpoints(root)
    return Looks(LocalFiles() if request.param == "local" else ssh_view(), root, dirs)


def test_a_second_look_at_unchanged_checkpoints_is_sent_no_manifest(looks: Looks) -> None:
    """A finished checkpoint's manifests never change: the second look is sent none (their stamps alone) and judges as
    the first, versus every checkpoint's manifests sent again on each look."""
    first = looks.look()
    assert first == looks.every_manifest() and len(looks.sent[0]) == 2 * NUM_CHECKPOINTS + 1
    second = looks.look()
    assert looks.sent[1] == set()
    assert second == first and second.texts[ODD] == b"{}"
    assert verdicts(second) == verdicts(first) == [None] * NUM_CHECKPOINTS


def test_a_manifest_rewritten_at_its_size_is_read_again(looks: Looks) -> None:
    """A manifest written again in place at the same size, its time set back as `cp -p` sets it: read again (its
    inode's change time moved) and judged by its new bytes, versus the kept ones."""
    looks.look()
    manifest = looks.root / "iter-3" / "MANIFEST.trainer.json"
    text = manifest.read_text()
    manifest.write_text(text.replace('"bytes": 3', '"bytes": 4'))  # the weights listed a byte longer than they are
    os.utime(manifest, (HOUR_AGO, HOUR_AGO))
    seen = looks.look()
    assert looks.sent[1] == {"iter-3/MANIFEST.trainer.json"}
    assert seen == looks.every_manifest()
    assert verdicts(seen)[2] == "trainer part: model/w.bin does not match MANIFEST.trainer.json: 3 bytes, 4 listed"
    looks.look()
    assert looks.sent[2] == set()  # (its new bytes kept)


def test_a_removed_checkpoint_is_gone_from_the_look_and_from_what_is_kept(looks: Looks) -> None:
    looks.look()
    shutil.rmtree(looks.root / "iter-5")
    seen = looks.look()
    assert looks.sent[1] == set()
    assert seen == looks.every_manifest() and not any(rel.startswith("iter-5/") for rel in seen.sizes)
    assert verdicts(seen)[4] == "trainer part: no MANIFEST.trainer.json"
    assert "iter-5/" not in looks.path.read_text()


def test_a_manifest_written_within_the_last_minute_is_not_kept(looks: Looks) -> None:
    """One written just now may be written again within the same tick of the file clock at the same size, its stamp
    unchanged: it is read again on each look until it is SETTLED_S old."""
    manifest = looks.root / "iter-2" / "MANIFEST.controller.json"
    manifest.write_text(manifest.read_text())
    looks.look()
    looks.look()
    assert looks.sent[1] == {"iter-2/MANIFEST.controller.json"}


DAMAGED = [b"\x00\xffnot json", b'{"format": 1, "places": [{"site": "far"', b'{"format": 1, "places": "x"}', b"[]"]


@pytest.mark.parametrize("damage", [*DAMAGED, b'{"format": 99, "places": []}'])
def test_a_damaged_cache_file_is_read_as_none(looks: Looks, damage: bytes) -> None:
    """Bytes that are no cache of this rlctl's (damaged, cut short, another format): every manifest read again and
    the file written anew, versus an error."""
    looks.path.write_bytes(damage)
    assert looks.look() == looks.every_manifest()
    assert len(looks.sent[0]) == 2 * NUM_CHECKPOINTS + 1
    looks.look()
    assert looks.sent[1] == set()


def test_kept_bytes_whose_stamp_the_site_no_longer_gives_are_not_used(looks: Looks) -> None:
    """A cache file holding other bytes under a stamp the file no longer has (a manifest replaced since): the file's
    bytes read, versus the kept ones."""
    looks.look()
    manifest = looks.root / "iter-7" / "MANIFEST.trainer.json"
    replaced = manifest.with_name("replaced")
    shutil.copy2(manifest, replaced)
    os.replace(replaced, manifest)  # the same bytes and times, another inode
    assert looks.look() == looks.every_manifest()
    assert looks.sent[1] == {"iter-7/MANIFEST.trainer.json"}
