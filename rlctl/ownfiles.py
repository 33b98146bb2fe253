"""Which files an output option may write over: those rlctl wrote (a mark inside them), empty ones, or none there.

`rlctl report --out x.png` writes x.png and its sibling x.html; `rlctl plan --plot p.png` writes p.png. Each wrote
over whatever was there, a user's image or page included (x.html never named by them). rlctl marks what it writes:
a PNG carries a tEXt chunk keyed `rlctl` (matplotlib's `metadata=`), a page a `<meta name="generator">` line in its
head; `refuse_foreign` lets a path be written only where it holds such a mark, holds nothing, or is not there, as
`rlctl.profiler.profile.refuse_overwriting` does for `profile -o`.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from rlctl.errors import UsageError

PNG_TEXT_KEY = "rlctl"  # savefig(metadata={PNG_TEXT_KEY: what}): a tEXt chunk before the image data
HTML_GENERATOR = '<meta name="generator" content="rlctl">'
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_HTML_HEAD_BYTES = 4096  # the marker sits in the head's first lines
_PNG_MAX_CHUNKS = 64  # text chunks come before IDAT: a handful, never this many


def png_metadata(what: str) -> dict[str, str]:
    """`metadata=` for `Figure.savefig` of a PNG that rlctl writes (`what`: the command)."""
    return {PNG_TEXT_KEY: what}


def written_by_rlctl(path: Path) -> bool:
    """Whether `path` (a regular file) is empty or holds rlctl's mark; False where it cannot be read."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_PNG_SIGNATURE))
            if not head:
                return True
            if head == _PNG_SIGNATURE:
                return _png_has_key(f)
            return HTML_GENERATOR.encode() in head + f.read(_HTML_HEAD_BYTES)
    except OSError:
        return False


def _png_has_key(f: BinaryIO) -> bool:
    for _ in range(_PNG_MAX_CHUNKS):
        header = f.read(8)
        if len(header) < 8:
            return False
        length, kind = struct.unpack(">I4s", header)
        if kind in (b"IDAT", b"IEND"):
            return False
        if kind == b"tEXt":
            keyword = f.read(min(length, 80)).split(b"\0", 1)[0]
            if keyword == PNG_TEXT_KEY.encode():
                return True
            f.seek(length - min(length, 80) + 4, 1)
        else:
            f.seek(length + 4, 1)  # the data and its CRC
    return False


def refuse_foreign(path: Path, *, named_by: str, what: str) -> None:
    """UsageError, one line, where `path` is there and rlctl did not write it (`what`: what would replace it, e.g.
    "the report's page"): a user's file named by `named_by` (e.g. "--out x.png") is not written over."""
    if not path.exists():
        return
    said = named_by if named_by.endswith(f" {path}") else f"{named_by}: {path}"  # `--plot p.png`: p.png once
    if not path.is_file():
        raise UsageError(f"{said}: no regular file, where {what} goes", hint="name another file")
    if not written_by_rlctl(path):
        raise UsageError(
            f"{said}: a file rlctl did not write; {what} would replace it",
            hint="name another file, or move it away: rlctl writes only over its own outputs or empty files",
        )
