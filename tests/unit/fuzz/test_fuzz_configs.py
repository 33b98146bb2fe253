"""Fuzzing the config edge: mutated inventories (clusters/*.yaml) and jobs (jobs/*.yaml) through the real
`rlctl check` entry point. A file either still checks (exit 0) or is refused with exit 2 and exactly one
line on stderr naming the file — never a traceback, never another exit code.

    repo file ──yaml──▶ tree ──mutate (delete, retype, odd values, renamed keys)──▶ yaml ──▶ rlctl check
    repo file ──text mutations (cut, insert YAML syntax, tags, control characters)───────▶ rlctl check

Most inputs run in-process through `rlctl.cli.main` (as the console script does); a few run as real
subprocesses (`python -m rlctl check`).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, CliResult, run_cli

FILES = sorted((ROOT / "clusters").glob("*.yaml")) + sorted((ROOT / "jobs").glob("*.yaml"))
NUM_TREE, NUM_TEXT = 220, 100

ODD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    10**30,
    -(10**30),
    2**63,
    1e308,
    -1e-308,
    float("nan"),
    float("inf"),
    "",
    " ",
    "é漢字😀",
    "\u202eevil",
    "a\nb",
    "tab\there",
    "x" * 3000,
    "${HOME}",
    "../../etc/passwd",
    [],
    [None],
    [1, "two", 3.0],
    {},
    {"kind": "nope"},
    {"": 1},
]
KEYS = ["", "kind", "gpus", "name", "é", "a\nb", "💥", "x" * 200, "apiVersion", "nodes", "1"]
SNIPPETS = [
    ":",
    "- ",
    "{",
    "]",
    "'",
    '"',
    "&a",
    "*a",
    "!!python/object/apply:os.system ['true']",
    "!!binary AAA",
    "\t",
    "\x00",
    "\x1b[31m",
    "%YAML 9.9\n---\n",
    "<<: *nope",
    "? ",
    "\ufeff",
    "999999999999999999999999999999",
    "---\n",
]


@pytest.fixture(autouse=True, scope="module")
def _shipped_key_here(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A home that holds the key the shipped h20 site logs in with (clusters/h20-rollout.yaml: ~/.ssh/id_ed25519),
    so that a job on that site is refused for what its mutation broke alone, in lines naming it, on every machine,
    versus also for that key where this machine's home lacks it (a line naming the inventory: CI has no such key)."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        yield


def workspace(tmp: Path) -> Path:
    """A copy of clusters/ and jobs/ so that mutated jobs still find their inventories by relative path."""
    for d in ("clusters", "jobs"):
        shutil.copytree(ROOT / d, tmp / d, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return tmp


def assert_lines_or_ok(res: CliResult, path: Path, what: str) -> int:
    assert "Traceback" not in res.stderr, f"{what}: traceback\n{res.stderr[-2000:]}"
    assert res.exit_code in (0, 2), f"{what}: exit {res.exit_code}: {res.stderr[-500:]}"
    if res.exit_code == 2:  # one line per problem (a job's: `check` and `launch` say each)
        lines = res.stderr.splitlines(keepends=True)
        assert lines and all(line.endswith("\n") for line in lines), f"{what}: stderr {res.stderr[:1000]!r}"
        for line in lines:
            assert line.startswith("rlctl: error: ") and path.name in line, f"{what}: {line[:300]!r}"
    return res.exit_code


# -- tree mutations ------------------------------------------------------------------------------------------
def _nodes(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _nodes(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _nodes(v, (*prefix, i))
    return out


def mutate_tree(r: random.Random, data: Any) -> Any:
    for _ in range(r.choice([1, 1, 2, 3])):
        path = r.choice(_nodes(data)[1:] or [()])
        if not path:
            return r.choice(ODD)
        parent = data
        for p in path[:-1]:
            parent = parent[p]
        last, what = path[-1], r.randrange(6)
        if what == 0:  # delete
            del parent[last]
        elif what == 1:  # odd value
            parent[last] = r.choice(ODD)
        elif what == 2 and isinstance(parent, dict):  # renamed key
            parent[r.choice(KEYS) if r.random() < 0.7 else str(last) + "s"] = parent.pop(last)
        elif what == 3 and isinstance(parent, dict):  # unknown key
            parent[r.choice(KEYS)] = r.choice(ODD)
        elif what == 4:  # wrong container
            v = parent[last]
            parent[last] = [v] if not isinstance(v, list) else {"x": v}
        else:  # a number nudged out of range
            v = parent[last]
            parent[last] = -v if isinstance(v, int | float) and not isinstance(v, bool) else r.choice(ODD)
    return data


def mutate_text(r: random.Random, text: str) -> str:
    for _ in range(r.choice([1, 2])):
        i = r.randrange(len(text) + 1)
        what = r.randrange(4)
        if what == 0:
            text = text[:i] + r.choice(SNIPPETS) + text[i:]
        elif what == 1:
            text = text[:i]
        elif what == 2:
            lines = text.splitlines(keepends=True)
            if lines:
                del lines[r.randrange(len(lines))]
            text = "".join(lines)
        else:
            text = text[:i] + " " * r.randint(1, 3) + text[i:]  # indentation shifts
    return text


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def test_mutated_files_exit_0_or_2_with_one_line(tmp_path: Path, fuzz_count: Callable[[str, int], None]) -> None:
    ws, r = workspace(tmp_path), random.Random(7)
    codes = {0: 0, 2: 0}
    for i in range(NUM_TREE + NUM_TEXT):
        src = r.choice(FILES)
        target = ws / src.parent.name / f"m{i}-{src.name}"
        if i < NUM_TREE:
            target.write_text(_dump(mutate_tree(r, yaml.safe_load(src.read_text()))), encoding="utf-8")
        else:
            target.write_text(mutate_text(r, src.read_text()), encoding="utf-8")
        res = run_cli("check", str(target), "-o", "json")
        codes[assert_lines_or_ok(res, target, f"input {i} from {src.name}: {target.read_text()[:2000]!r}")] += 1
        target.unlink()
    fuzz_count("configs: rlctl check, mutated inventories and jobs (in-process)", NUM_TREE + NUM_TEXT)
    assert codes[2] > (NUM_TREE + NUM_TEXT) // 2  # most mutations break the file, and each said so in one line


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@settings(settings.get_profile("rlctl-fuzz"), max_examples=100)
@given(data=st.data())
def test_generated_values_anywhere(
    tmp_path_factory: pytest.TempPathFactory, fuzz_count: Callable[[str, int], None], data: st.DataObject
) -> None:
    """Hypothesis puts arbitrary values (any unicode, any int) at any place of any of the repo's files."""
    ws = _hypothesis_ws(tmp_path_factory)
    src = data.draw(st.sampled_from(FILES))
    tree = yaml.safe_load(src.read_text())
    path = data.draw(st.sampled_from(_nodes(tree)[1:]))
    parent = tree
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = data.draw(values)
    target = ws / src.parent.name / f"h-{src.name}"
    target.write_text(_dump(tree), encoding="utf-8")
    assert_lines_or_ok(run_cli("check", str(target)), target, f"{src.name} {path}={parent[path[-1]]!r:.300}")
    fuzz_count("configs: rlctl check, hypothesis values (in-process)", 1)


_WS: list[Path] = []


def _hypothesis_ws(factory: pytest.TempPathFactory) -> Path:
    if not _WS:
        _WS.append(workspace(factory.mktemp("fuzz-configs")))
    return _WS[0]


def test_mutated_files_through_the_console_script(tmp_path: Path, fuzz_count: Callable[[str, int], None]) -> None:
    """The same contract for real processes: `python -m rlctl check` (slow here, so only a few)."""
    ws = workspace(tmp_path)
    cases: list[tuple[str, Callable[[Any], Any]]] = [
        ("jobs/demo.yaml", lambda t: {**t, "batch": {**t["batch"], "prompts_per_iteration": -(10**30)}}),
        ("clusters/local.yaml", lambda t: {**t, "sites": {"local": {**t["sites"]["local"], "nodes": "é漢字\n"}}}),
    ]
    for name, mutate in cases:
        target = ws / name
        target.write_text(_dump(mutate(yaml.safe_load(target.read_text()))), encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, "-m", "rlctl", "check", str(target)], capture_output=True, text=True, timeout=300
        )
        res = CliResult(proc.returncode, proc.stdout, proc.stderr)
        assert assert_lines_or_ok(res, target, f"{name}: {target.read_text()[:1000]!r}") == 2
    fuzz_count("configs: rlctl check, mutated files (subprocess)", len(cases))
