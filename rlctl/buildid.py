"""Which rlctl this is, finer than its version: a digest of the package's own source files (`code_digest`).

The version names a release; two installs of one version can still run different code (a checkout a few commits
apart, a hand-patched site), and agents of different code speak the same version's protocol only by chance. The
launcher gives every agent its digest (`RLCTL_CODE`, rlctl.launch.agentenv) and an agent of other code exits at
start; `rlctl check --reach` asks each site's python for its digest beforehand (rlctl.launch.siteprobe)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

DIGEST_CHARS = 16  # of the SHA-256 hex: what `rlctl version` shows and the agents compare


@functools.cache
def code_digest() -> str:
    """SHA-256 (its first DIGEST_CHARS hex digits) over this package's .py files: each one's path below the
    package and its bytes, in path order. Compiled files, caches and the directory the package sits in do not
    count: the same sources installed anywhere, editable or not, have one digest. Nor does a name that is no file
    (an editor's lock, `.#NAME.py`: a symlink to nothing while NAME.py has unsaved edits), versus its
    FileNotFoundError. Read once, at the first call: a launcher (`launch`, `attach`) and an agent call it as they
    start, so that sources edited while a job runs (an editable checkout) are other code than theirs: agents started
    after the edit (a resume, `scale`, the rebalance rule) refuse to run beside them. An install with no .py files
    (a zip app of compiled files) has the digest of none."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    sources = (p for p in root.rglob("*.py") if p.is_file())
    for path in sorted(sources, key=lambda p: p.relative_to(root).as_posix()):
        name, data = path.relative_to(root).as_posix().encode(), path.read_bytes()
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()[:DIGEST_CHARS]
