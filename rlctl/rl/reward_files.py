"""The user's reward file in a job: the modules beside it that it imports (`local_modules`), and its copy, with
them, into the job directory (`copy_reward`), refused where it would replace what is not its own copy."""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import importlib.util
import logging
import os
import shutil
import sys
from pathlib import Path

from rlctl.errors import ConfigError

log = logging.getLogger(__name__)

COPY_MARK = ".rlctl-copy"  # in a reward/ `copy_reward` made: what a relaunch may replace
# what `copy_reward` leaves out of a package beside a reward file: bytecode, version control, tools' caches (its mark)
NOT_COPIED = (
    COPY_MARK,
    "__pycache__",
    "*.pyc",
    ".git",
    ".hg",
    ".svn",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
)
PACKAGE_WARN_BYTES = 64 << 20  # packages beside a reward file past this are said (the job and every site copy them)
_said_size: set[tuple[str, int]] = set()  # (reward file, bytes) said in this process


def local_modules(file: Path) -> list[Path]:
    """The modules beside a reward file that it imports — `import helper`, `from helper import f`, a package
    `helper/` (a namespace package too) —, and theirs, transitively (a name the standard library has is its, not a
    file's): what the launch copies into the job with it, so a reward in several files runs on every site. Relative
    to the file's directory; a package is its directory. An import inside a function counts; one by a computed name
    (importlib) does not."""
    base = file.parent
    found: dict[str, Path] = {}
    todo = [file]
    while todo:
        for name in _imported(todo.pop()):
            if name in found or name in sys.stdlib_module_names:
                continue
            if (base / name / "__init__.py").is_file():  # before name.py beside it: Python imports the package
                found[name] = Path(name)
                todo += sorted((base / name).rglob("*.py"))
            elif (base / f"{name}.py").is_file():
                if name != file.stem:  # (the reward file itself is copied as it is)
                    found[name] = Path(f"{name}.py")
                    todo.append(base / found[name])
            elif (base / name).is_dir() and _namespace_package(name, base / name):
                found[name] = Path(name)
                todo += sorted((base / name).rglob("*.py"))
    return sorted(found.values())


def copy_reward(named: Path, dst: Path) -> None:
    """The reward file the job names (`named`) into `dst`, under that name (`resolve_inputs` rewrites the job's
    task.reward to it), with the modules beside it that it imports (`local_modules`; a link's: beside its target,
    where python and the reward's loading find them): a package as its directory, less its bytecode caches and
    version-control and tool directories (NOT_COPIED), said in one line when over PACKAGE_WARN_BYTES. What
    `dst` held is replaced: a relaunch into the same job dir kept the modules since removed from a package (and the
    reward file of an earlier launch); a `dst` that holds what no copy made (COPY_MARK: a reward/ of the user's in
    the directory launched into) is refused, not deleted."""
    src = named.resolve()
    modules = refuse_replacing_theirs(named, dst)
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    (dst / COPY_MARK).write_text("the reward file and its modules, copied by rlctl launch: replaced at a relaunch\n")
    try:
        shutil.copy2(src, dst / named.name)
    except OSError as e:  # one it cannot read: one line, as a module's below, not the OSError's traceback
        raise ConfigError(
            str(src),
            None,
            f"cannot copy the reward file into the job: {e.strerror or e}",
            hint="make it readable: the job's sites load the reward from that copy",
        ) from e
    packages = {rel: _package_bytes(src.parent / rel) for rel in modules if (src.parent / rel).is_dir()}
    total = sum(packages.values())
    if total > PACKAGE_WARN_BYTES and (str(src), total) not in _said_size:
        _said_size.add((str(src), total))  # (said once: a launch copies it for its check, then for the job)
        largest = ", ".join(f"{rel}/ {n / 2**20:.0f} MiB" for rel, n in sorted(packages.items(), key=lambda p: -p[1]))
        log.warning(
            "reward %s: the packages beside it that it imports are copied into the job whole, and staged to every "
            "site: %.0f MiB (%s); keep data and other large files out of them, or read those by a path every site has",
            named,
            total / 2**20,
            largest,
        )
    try:
        for rel in modules:
            if rel in packages:
                shutil.copytree(src.parent / rel, dst / rel, ignore=shutil.ignore_patterns(*NOT_COPIED))
            else:
                shutil.copy2(src.parent / rel, dst / rel)
    except OSError as e:  # a file it cannot read, a link to nothing in a package: one line, not shutil's traceback
        where, why = (e.args[0][0][0], e.args[0][0][2]) if isinstance(e, shutil.Error) else (e.filename, e.strerror)
        raise ConfigError(
            str(where or src),
            None,
            f"cannot copy it into the job with the reward file {named}, which imports it or the package that holds it: "
            f"{why or e}",
            hint="remove it, or make it readable: the job's sites load the reward from that copy",
        ) from e


def refuse_replacing_theirs(named: Path, dst: Path) -> list[Path]:
    """ConfigError, one line, where `copy_reward`'s replacement of `dst` would delete what is not its own copy: the
    reward file, or a module it imports, lying in it, or a `dst` that holds what no copy made (no COPY_MARK: a reward/
    of the user's in the directory launched into); else the modules the copy takes (`local_modules`). A launch asks
    before it builds anything in the job dir (`rlctl.ops.inputs.copy_inputs`), and `copy_reward` again."""
    src = named.resolve()
    if src.is_relative_to(dst.resolve()):  # (a launch into the reward's own directory): replacing it deleted it
        raise ConfigError(
            str(src),
            None,
            f"the reward file lies in the job directory's {dst.name}/, which a launch replaces with its copy of it",
            hint="keep it out of the job directory's reward/, or launch into another --job-dir",
        )
    modules = local_modules(src)  # (before `dst` is replaced: a package of the user's may be it)
    for rel in modules:
        if (src.parent / rel).resolve().is_relative_to(dst.resolve()):  # (a package named `reward` beside it)
            raise ConfigError(
                str(src.parent / rel),
                None,
                f"{rel}, which the reward file {named} imports, lies in the job directory's {dst.name}/, which a "
                "launch replaces with its copy of the reward",
                hint="launch into another --job-dir",
            )
    if not (dst / COPY_MARK).is_file():  # (no copy made it: nothing in it is rlctl's)
        from rlctl.launch.jobdir import refuse_theirs  # (here: a reward worker imports this module, and no config)

        refuse_theirs(
            dst,
            ours=(),
            did="copy there",
            then="a launch puts its copy of the reward there, in place of what it holds",
            hint="launch into another --job-dir (or move that directory)",
        )
    return modules


def _package_bytes(directory: Path) -> int:
    """The bytes of the files `copy_reward` copies of a package (NOT_COPIED left out)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if not any(fnmatch.fnmatch(d, p) for p in NOT_COPIED)]
        for f in filenames:
            if not any(fnmatch.fnmatch(f, p) for p in NOT_COPIED):
                with contextlib.suppress(OSError):  # (a dangling link: copytree says so)
                    total += os.stat(os.path.join(dirpath, f)).st_size
    return total


def _namespace_package(name: str, directory: Path) -> bool:
    """Whether `import name` takes `directory`, beside a reward file and without an __init__.py, as a namespace
    package: it holds Python files, and no module or package of that name is installed (Python takes that one)."""
    if not any(directory.rglob("*.py")):
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return True
    return spec is None or spec.origin is None  # not found, or a namespace package too


def _imported(file: Path) -> list[str]:
    """The top-level names of the absolute imports in `file` (none where it cannot be parsed: loading says why)."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.partition(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.partition(".")[0])
    return names
