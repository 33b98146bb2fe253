"""The checkpoint manifests read on a job's sites over SSH, kept here between looks (`JobDir.manifest_cache`), so that
a look (`rlctl status --checkpoints`, `rlctl pull`) asks a site for the bytes of those new or changed only:

    here                                         the site's host (one command, `HostFiles.survey`)
    kept: path → (stamp, bytes)  ── stamps ──▶   each manifest stamped (inode, size, mtime, ctime); the bytes
                                                 of those whose stamp is not the one sent
    bytes filled in by stamp     ◀── stamps ──   + bytes read
    the settled ones kept again

A finished checkpoint's manifest never changes, and a look sent every kept checkpoint's again (a weeks-long job keeps
hundreds: ≈ 1.3 MB a look for 200 checkpoints of an 8-rank trainer), versus a stat line each. What a look judges is
what a look reading every manifest judges: kept bytes stand in only for a file the site stamps as it was when they
were read; one written, replaced or gone since is read again or dropped. Kept are what the last look of a place (site,
view, directory) saw. A file that cannot be read or parsed is no cache (rebuilt); one that cannot be written is not
kept: neither is an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from rlctl.launch.recordfiles import replace_text
from rlctl.launch.sitefs import HostFiles, Survey

log = logging.getLogger(__name__)

Place = tuple[str, str, str]  # (site name, host view, the directory looked in)


class _Place(BaseModel):
    model_config = ConfigDict(extra="forbid")

    site: str
    view: str
    dir: str
    manifests: dict[str, tuple[str, str]]  # path under dir → (its stamp, its text)


class _Kept(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = 1
    places: list[_Place]


@dataclass
class ManifestCache:
    """The manifests kept in `path`, by place; `survey` looks through them, `save` writes them back if they changed."""

    path: Path
    places: dict[Place, dict[str, tuple[str, str]]] = field(default_factory=dict)
    changed: bool = False

    @classmethod
    def load(cls, path: Path) -> ManifestCache:
        try:
            kept = _Kept.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValidationError) as e:  # damaged, or another rlctl's: read every manifest again
            log.info("%s ignored (every manifest read again): %s", path, str(e).splitlines()[0])
            return cls(path)
        return cls(path, {(p.site, p.view, p.dir): dict(p.manifests) for p in kept.places})

    def survey(self, fs: HostFiles, place: Place, dirs: list[str], *, read: str) -> Survey:
        """`fs.survey` of `place`'s directory, told the stamps of the manifests kept there: what it saw, with the kept
        bytes of those it stamps unchanged (and so did not send); the settled ones it saw kept."""
        kept = self.places.get(place, {})
        got = fs.survey(place[2], dirs, read=read, known={rel: stamp for rel, (stamp, _) in kept.items()})
        texts = dict(got.texts)
        for rel, stamp in got.stamps.items():
            if rel not in texts and rel in kept and kept[rel][0] == stamp:
                texts[rel] = kept[rel][1].encode()
        now: dict[str, tuple[str, str]] = {}
        for rel, stamp in got.stamps.items():
            if rel in texts:
                try:
                    now[rel] = (stamp, texts[rel].decode())
                except UnicodeDecodeError:  # (no manifest: read again each look, refused each time)
                    continue
        if now != kept:
            self.places[place] = now
            self.changed = True
        return Survey(got.found, got.sizes, texts)

    def save(self) -> None:
        """Write what changed, under a temporary name then renamed (a reader sees the old file or the new); a job dir
        that cannot take it keeps none (said in the log)."""
        if not self.changed:
            return
        kept = _Kept(places=[_Place(site=s, view=v, dir=d, manifests=m) for (s, v, d), m in self.places.items() if m])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_text(self.path, kept.model_dump_json())
        except OSError as e:
            log.info("%s not written (the next look reads every manifest again): %s", self.path, e)
        self.changed = False
