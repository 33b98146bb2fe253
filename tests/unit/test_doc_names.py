"""The docs name the code they describe as `rlctl.module.name`: every such name is one the code has."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from tests.conftest import ROOT

NAME = re.compile(r"`(rlctl(?:\.[A-Za-z_]\w*)+)`")


def _resolves(name: str) -> bool:
    """Whether `name` is a module of rlctl, or an attribute (a class's method too) reached from the longest one."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent that is no package: `rlctl.x.func.attr`
            found = False
        if found:
            obj: object = importlib.import_module(module)
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def test_every_dotted_rlctl_name_in_the_docs_is_in_the_code() -> None:
    """docs/planning.md named `rlctl.rl.learner.train_ready`, a method of `StreamingLearner` (and of
    `PpoBatchLearner`), as if it were a function of the module."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {(str(f.relative_to(ROOT)), m) for f in files for m in NAME.findall(Path(f).read_text(encoding="utf-8"))}
    assert named, "no dotted name found: the pattern no longer matches the docs"
    assert sorted(n for n in named if not _resolves(n[1])) == []
