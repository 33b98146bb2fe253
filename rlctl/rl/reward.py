"""Reward functions: loading them (built-in or the user's), and calling them in a pool of worker processes.

A reward function has verl's signature, so functions users already have work unchanged:

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

    trainer thread                    dispatcher thread                  worker processes (forkserver)
    pool.submit(id, …) ─▶ Future ─▶  pending ─▶ idle worker ─── call ──▶ fn(**kwargs) → checked result
          │                           ◀── result / deadline passed ◀───┘
          ▼                           deadline passed: kill the worker, start a new one,
    future.result() → RewardResult    and score the call `on_error`

A call that raises, runs past `timeout_s`, returns a wrong type (or a NaN, or an int past a float's range) or kills
its worker never fails the job: it scores `on_error`, is counted (calls, errors, timeouts, bad_type, died) and logged
with its sample id (a dict's other keys that are no finite number are left out of `extra`). `workers=0` loads and
calls the function in the submitting thread (no deadline, no timeout): the in-process mode for debugging and tests.
With workers, the process that starts the pool never imports the user's module (an import that hangs there could
not be bounded): the workers load it, each start within a deadline (below).

A call that hangs holds its worker until its deadline; the pool does not let it hold the others' calls: while
calls wait and a worker's call has run longer than `stuck_s`, one more worker starts for each such worker (up
to `workers × EXTRA_FACTOR`), and a worker beyond `workers` stops as soon as it is idle with nothing waiting.
`cancel(sample_id)` drops a call nobody waits for any more (the controller filtered its sample out): a queued one
leaves the queue, a running one's worker is replaced at once instead of at the deadline; its future is cancelled.
It drops the calls submitted before it only: the same sample generated again and submitted while the dispatcher
had not got to the cancel yet is scored.

A worker killed (its call timed out or was cancelled, or the pool stops it) takes the programs its calls started
with it: each worker leads a process group of its own (os.setsid), and a kill is SIGKILL to that group, so a
code-execution reward's child and the child's children, orphaned or not, go too; on Linux the worker's descendants
that left its group for one of their own (`start_new_session=True`, as sandboxes do) are found in /proc and their
groups killed as well. A process that both left the group and lost its parent (a double-forked daemon) would escape
to init: each worker is its descendants' subreaper (Linux's PR_SET_CHILD_SUBREAPER), so such an orphan becomes the
worker's child, and the same walk of /proc finds and kills it.

A worker that cannot load the function is no reason to score calls `on_error`:

    first start (no worker has loaded it yet): a worker cannot load it ──▶ the pool fails (a config error)
    later: a worker cannot load it ──▶ down ──(1 s, 2 s, 4 s … 60 s)──▶ started again ──▶ ready, scoring again
           (each failure counted and logged; calls wait meanwhile)
    every worker unable to load it for `load_retry_s` (6 × timeout_s, at least 60 s) ──▶ the pool fails
    (`load_retry_s`: a job's task.reward_load_timeout_s where it sets one)

A start that has not loaded the function within `load_retry_s` (its import hangs: a network mount, a lock) could not
load it: the worker is killed, and it is a config error at the first start, a failed start (backoff) later. A pool
made with `wait=True` (the controller's, and `rlctl check`'s: `check_loads`) returns once a worker has loaded the
function, or raises the first start's failure as one line (ValueError), so that it ends the job before it starts.

A pool that failed logs why (the load error), keeps it in `failed`, and cancels its calls, those to come included:
the controller fails the job with it (a sample waits for a reward that will not come) instead of training on
`on_error` scores for the rest of the run.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import multiprocessing
import numbers
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext, SpawnContext
from pathlib import Path
from typing import Any, Literal, cast

from rlctl import procfs
from rlctl.errors import ConfigError
from rlctl.rl.reward_scope import ImportScope
from rlctl.textutil import did_you_mean, one_of

log = logging.getLogger(__name__)

RewardFn = Callable[..., Any]
Outcome = Literal["ok", "error", "timeout", "bad_type", "died"]
ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
EXTRA_FACTOR = 4  # at most this many times `workers` processes while calls wait behind stuck ones
STUCK_FRACTION = 0.1  # a call running longer than this part of the timeout (at least STUCK_MIN_S) is stuck
STUCK_MIN_S = 0.2
RETRY_FIRST_S = 1.0  # a worker that failed to load starts again after this, doubled on each failure in a row …
RETRY_MAX_S = 60.0  # … up to this
ORPHAN_CHECK_S = 0.05  # a worker's watch of its pool, after a call arrived: how long before it looks again
LOAD_RETRY_FACTOR = 6  # the pool fails once every worker has failed to load for this many × timeout_s …
WAIT_SLACK_S = 30.0  # a pool made with wait=True waits at most load_retry_s + this for its first start's word
LOAD_RETRY_MIN_S = 60.0  # … or this, if longer: a filesystem hiccup or an OOM kill while importing passes sooner
PR_SET_CHILD_SUBREAPER = 36  # prctl(2), Linux ≥ 3.4
REAP_EVERY_S = 1.0  # a worker reaps the zombies of the orphans it adopted at most this often, between calls
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


def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the output, stripped, equals the ground truth (or one of a list of them), else 0.0."""
    answers = ground_truth if isinstance(ground_truth, list | tuple) else [ground_truth]
    return 1.0 if solution_str.strip() in {str(a).strip() for a in answers} else 0.0


def digits(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The demo task's verifier (rlctl.rl.tasks.score): partial credit per (letter, count) run."""
    from rlctl.rl.tasks import score

    return score(str(ground_truth), solution_str)


BUILTIN_REWARDS: dict[str, RewardFn] = {"digits": digits, "exact_match": exact_match}


# ── loading ───────────────────────────────────────────────────────────────────────────────────────


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


def _from_file(file: Path, shown: str, fn: str, *, own_process: bool) -> Any:
    if not file.is_file():
        raise ValueError(f"{shown}: no such file (relative paths are relative to the job file)")
    digest = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]
    mod_name = f"rlctl_reward_{file.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # before exec: dataclasses and pickle look the module up by name
    beside = file.resolve().parent  # a link's target's: where `python file.py` and the launch's copy look
    if own_process:  # a worker's, which loads this reward alone: its directory on sys.path, as `python file.py`
        sys.path.insert(0, str(beside))
    # its own modules (`local_modules`) from its directory, at its import and in its functions' imports at call
    # time, versus another reward's of the same name that this process loaded (workers=0); no sys.path left behind
    scope = ImportScope(beside, {rel.name.removesuffix(".py") for rel in local_modules(file.resolve())})
    module.__dict__["__builtins__"] = scope.builtins
    try:
        with scope.active():
            spec.loader.exec_module(module)
    except Exception as e:  # any error in the user's file is reported as one line
        del sys.modules[mod_name]
        raise ValueError(f"{shown}: cannot import: {type(e).__name__}: {e}{_own_package(file, fn, e)}") from e
    return module


def _own_package(file: Path, fn: str, e: Exception) -> str:
    """What to do, where `file` imports the package that holds it (`from myrewards.helpers import f` in
    myrewards/score.py): a reward file is loaded by its path, its own directory on the import path, not its
    parent's, so that package is no module here (and the launch copies no parent directory); else ''."""
    if not isinstance(e, ModuleNotFoundError) or not e.name:
        return ""
    top = e.name.partition(".")[0]
    file = file.resolve()
    for package in file.parents:
        if package.name == top:
            module = ".".join(file.relative_to(package.parent).with_suffix("").parts)
            return (
                f"; {top}/ holds the file, and is no module here: a reward file is loaded by its path, with its own "
                f"directory on the import path, not {top}/'s parent; import the modules beside it by their own names "
                f"(from helpers import …: the launch copies them with it), or install {top} and name the function "
                f"by its module, {module}:{fn}"
            )
    return ""


def _from_module(name: str, fn: str, base_dir: Path) -> Any:
    """The installed module `name`. Not one beside the job file (`base_dir`): the launch copies no module to the
    job's sites, so one found there let `rlctl check` pass a job whose controller then could not import it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and name.startswith(e.name):
            file = f"{name.replace('.', '/')}.py"
            if (base_dir / file).is_file():
                raise ValueError(
                    f"no module named {e.name!r} installed; {file} beside the job file is not copied to the job's "
                    f"sites as a module: name the file, {file}:{fn}"
                ) from e
            raise ValueError(f"no module named {e.name!r} (install it, or name a file: path/to/file.py:fn)") from e
        raise ValueError(f"module {name!r}: cannot import: {e}") from e
    except Exception as e:  # any error in the user's module is reported as one line
        raise ValueError(f"module {name!r}: cannot import: {type(e).__name__}: {e}") from e


def load_reward(spec: str, base_dir: Path, *, own_process: bool = False) -> RewardFn:
    """The reward function named by `spec`: a built-in name, `path/to/file.py:name` or `package.module:name`.

    Raises ValueError with one line naming what is missing (file, module, function) or wrong (not
    callable, a signature that cannot take verl's arguments). A file's own modules are imported from its directory
    (`reward_scope`); `own_process` (a worker's, which loads it alone) also puts that directory on sys.path, as
    `python file.py` does, where an in-process load (workers=0) leaves sys.path as it was.
    """
    target, sep, name = spec.rpartition(":")
    if not sep:
        if spec not in BUILTIN_REWARDS:
            raise ValueError(
                f"unknown built-in reward {spec!r}; built-ins: {one_of(BUILTIN_REWARDS)}"
                f"{did_you_mean(spec, BUILTIN_REWARDS)}; or a user function: path/to/file.py:name or module:name"
            )
        return BUILTIN_REWARDS[spec]
    if target.endswith(".py"):
        file = Path(target) if Path(target).is_absolute() else base_dir / target
        module, where = _from_file(file, target, name, own_process=own_process), target
    else:
        module, where = _from_module(target, name, base_dir), f"module {target!r}"
    fn = getattr(module, name, None)
    if fn is None:
        # the module's own functions, not what it imported (`from typing import Any` listed Any)
        defined = [
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
        has = f"defined: {one_of(defined)}" if defined else "it defines no functions"
        raise ValueError(f"{where}: no function {name!r}{did_you_mean(name, defined)}; {has}")
    if not callable(fn):
        raise ValueError(f"{where}: {name!r} is a {type(fn).__name__}, not a function")
    _check_signature(fn, f"{target}:{name}")
    return fn


def _check_signature(fn: RewardFn, shown: str) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: the first call tells
    try:
        sig.bind(**dict.fromkeys(ARGS[:3]))
    except TypeError as e:
        raise ValueError(
            f"{shown}{sig}: cannot be called as compute_score(data_source=, solution_str=, ground_truth=, "
            f"extra_info=None): {e}"
        ) from e


def _takes_extra_info(fn: RewardFn) -> bool:
    try:
        inspect.signature(fn).bind(**dict.fromkeys(ARGS))
    except (TypeError, ValueError):
        return False
    return True


# ── one call, checked ─────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class RewardResult:
    score: float
    outcome: Outcome = "ok"
    error: str | None = None
    extra: dict[str, float] = field(default_factory=dict)  # the other numeric keys of a dict return

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def _real(v: Any) -> bool:
    """A finite real number: a Python or numpy one, or a scalar array or tensor (numpy's bool_, `array(0.5)` and
    `tensor(0.5)` were scored `bad_type` where True and 0.5 were not)."""
    if getattr(v, "ndim", None) == 0 and callable(getattr(v, "item", None)):
        v = v.item()  # a numpy scalar, 0-d array or 0-d tensor: its Python value (a str array's stays no number)
    try:
        return isinstance(v, numbers.Real) and math.isfinite(float(v))
    except OverflowError:  # an int past a float's range (10**400): not a finite float either
        return False


def check_result(value: Any, on_error: float) -> RewardResult:
    """A function's return value as a RewardResult: a finite number, or a dict with a numeric 'score'."""
    if isinstance(value, dict):
        if "score" not in value:
            return RewardResult(on_error, "bad_type", f"dict without a 'score' key (keys: {sorted(map(str, value))})")
        extra = {str(k): float(v) for k, v in value.items() if k != "score" and _real(v)}
        value, rest = value["score"], extra
    else:
        rest = {}
    if not _real(value):
        return RewardResult(on_error, "bad_type", f"expected a finite number or a dict with 'score', got {value!r:.80}")
    return RewardResult(float(value), "ok", None, rest)


def call_reward(fn: RewardFn, kwargs: dict[str, Any], on_error: float) -> RewardResult:
    """Call `fn` once in this thread; an exception scores `on_error`, a sys.exit() in it too (in-line, with
    reward_workers 0, it ended the controller's scoring without a word: the job stopped, its log silent), and any
    other BaseException but a KeyboardInterrupt (asyncio's CancelledError, a timeout library's own: in a worker it
    killed the process, its log line saying only 'reward worker died'; in-line it left the controller's scoring)."""
    try:
        value = fn(**kwargs)
    except KeyboardInterrupt:  # in-line, a Ctrl-C of the process: not the function's failure
        raise
    except BaseException as e:  # noqa: BLE001 - a user function's failure is scored, counted and logged
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f" ({Path(frame.filename).name}:{frame.lineno})"
        return RewardResult(on_error, "error", f"{type(e).__name__}: {e}{where}")
    try:
        return check_result(value, on_error)
    except Exception as e:  # noqa: BLE001 - a value that breaks the check (its repr or float() raises) is a wrong type
        return RewardResult(on_error, "bad_type", f"cannot read the value returned: {type(e).__name__}: {e}")


def _worker_main(spec: str, base_dir: str, on_error: float, conn: Connection) -> None:
    """Worker process: load the function, say "ready" (or why not), then answer each kwargs with a RewardResult."""
    os.setsid()  # a group of its own: killing the worker kills what its calls started (see _kill_tree)
    _adopt_orphans()
    _die_with_the_pool(conn)
    try:
        fn = load_reward(spec, Path(base_dir), own_process=True)
    except ValueError as e:
        conn.send(str(e))
        return
    takes_extra_info = _takes_extra_info(fn)
    conn.send("ready")
    reaped_at = time.monotonic()
    while True:
        try:
            kwargs = conn.recv()
        except EOFError:
            return
        if not takes_extra_info:
            kwargs.pop("extra_info", None)
        conn.send(call_reward(fn, kwargs, on_error))
        if time.monotonic() >= reaped_at + REAP_EVERY_S:
            _reap_zombies()
            reaped_at = time.monotonic()


def _adopt_orphans() -> None:
    """Make this worker the subreaper of its descendants: one whose parent exits — a daemon that double-forked out of
    the worker's group and session (`setsid cmd &`) — becomes the worker's child instead of init's, so `_kill_tree`'s
    walk of the worker's descendants finds it; nothing but a descendant can become its child. Set in each worker,
    not in the pool's process: there it would adopt every orphan below the controller (its forkserver's, torch's
    compile workers') and leave their zombies to a process that reaps only its own children. The worker reaps the
    zombies of those that exit between calls (`_reap_zombies`). A no-op off Linux."""
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # no libc to load: the double-forked daemon escapes, as before
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_zombies() -> None:
    """Reap this worker's children that have exited: the orphans it adopts (`_adopt_orphans`: a `cmd &` a call's
    shell left behind) are nobody else's to wait for, and a worker that lives for weeks would pile up their zombies
    until the machine has no pid left. Between calls, so that a call's own child is waited for by its call; a child
    a reward keeps across calls and waits for in a later one reads exit 0 there (Python's ECHILD rule)."""
    me = str(os.getpid())
    for pid, fields in procfs.every_stat():
        if fields[procfs.STATE] == "Z" and fields[procfs.PPID] == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _die_with_the_pool(conn: Connection) -> None:
    """A worker in a group of its own is out of reach of its agent's stop (the backends kill the agent's process
    group), and the forkserver that started it outlives a controller killed on its own (the OOM killer): when the
    pool's end of `conn` closes — its process gone, however — the worker kills what its calls started outside its
    group (`_kill_below`: in sessions of their own, adopted daemons), then its own group, itself included. A thread
    waiting on the socket's hang-up (never reading it: the calls are the loop's), so a call hung in a system call (a
    wait on its child) does not hold it up."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLRDHUP)
    gone = select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL

    def watch() -> None:
        while not any(events & gone for _, events in poller.poll()):
            time.sleep(ORPHAN_CHECK_S)  # a call arrived (the loop reads it): look again after a while
        _kill_below(os.getpid())  # those in sessions of their own (an adopted daemon's included) first
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="reward-orphan-watch", daemon=True).start()


def _descendants(pid: int) -> list[int]:
    """The processes below `pid`, children first, from Linux's /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for child, fields in procfs.every_stat():
        children.setdefault(int(fields[procfs.PPID]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL worker `pid`'s process group (itself, once it ran os.setsid, and what its calls started, orphaned or
    not) and its descendants outside it (`_kill_below`). The worker's group is stopped first, so that it starts
    nothing more while /proc is read; a signal to a process gone meanwhile is no error."""

    def signal_(kill: Callable[[int, int], None], target: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(target, sig)

    signal_(os.killpg, pid, signal.SIGSTOP)  # no such group (killed before its os.setsid): nothing below it yet
    _kill_below(pid)
    signal_(os.killpg, pid, signal.SIGKILL)


def _kill_below(pid: int) -> None:
    """SIGKILL `pid`'s descendants (the worker's adopted orphans among its children), each with the group it leads.
    Those outside the worker's stopped group run on while /proc is read: read again until it shows none not killed
    yet (one killed cannot start more)."""
    killed: set[int] = set()
    while found := [child for child in _descendants(pid) if child not in killed]:
        for child in found:
            with contextlib.suppress(OSError):
                if os.getpgid(child) == child:  # it leads a group (start_new_session=True): its members go too
                    os.killpg(child, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        killed.update(found)


# ── the pool ──────────────────────────────────────────────────────────────────────────────────────


@dataclass
class _Call:
    sample_id: str
    kwargs: dict[str, Any]
    future: Future[RewardResult]
    seq: int = 0  # its place in the order of submits (a cancel drops only the calls before it)
    origin: str | None = None  # where its prompt came from ("data.jsonl line 7"), for the log


@dataclass
class _Worker:
    proc: Any  # multiprocessing.process.BaseProcess
    conn: Connection
    state: Literal["starting", "ready", "down"] = "starting"  # down: it could not load the function
    call: _Call | None = None
    deadline: float = math.inf  # starting: when its load has failed (load_retry_s); else its call's deadline
    stuck_at: float = math.inf  # when its call counts as stuck (another worker may start for the calls waiting)
    load_failures: int = 0  # its starts in a row that could not load the function (0 once one loads)
    retry_at: float = math.inf  # down: when it starts again


@dataclass
class RewardStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    bad_type: int = 0
    died: int = 0  # calls whose worker died (a segfault, an OOM kill, os._exit) while it ran them
    restarts: int = 0  # workers replaced (killed on a timeout or a cancel, or died)
    cancelled: int = 0  # calls dropped by `cancel` before they finished
    extra_started: int = 0  # workers started beside stuck ones for the calls waiting behind them
    load_failures: int = 0  # worker starts that could not load the function (each started again after a backoff)
    first_failure: str | None = None  # the first call scored on_error: its outcome, sample, origin and error

    @property
    def failures(self) -> int:
        return self.errors + self.timeouts + self.bad_type + self.died

    def plus(self, later: RewardStats) -> RewardStats:
        """The job's counts: these (the runs before a resume, up to its checkpoint) and a later run's `later`; the
        first failure the earliest one."""
        ints = [f.name for f in dataclass_fields(self) if f.type == "int"]
        counts = {name: getattr(self, name) + getattr(later, name) for name in ints}
        return RewardStats(**counts, first_failure=self.first_failure or later.first_failure)


def load_deadline_s(timeout_s: float, load_timeout_s: float | None = None) -> float:
    """How long a pool gives a worker to load the function (`load_retry_s`): a job's `task.reward_load_timeout_s`
    (`load_timeout_s`), else a bound that follows its calls' `timeout_s`."""
    return load_timeout_s if load_timeout_s is not None else max(LOAD_RETRY_MIN_S, LOAD_RETRY_FACTOR * timeout_s)


class RewardPool:
    """Reward calls in `workers` processes, each call bounded by `timeout_s` (see the module docstring).

    `load_retry_s`: how long every worker may stay unable to load the function before the pool fails, and how long
    one start may take to load it: a job's `task.reward_load_timeout_s` (a reward model's load takes minutes), by
    default LOAD_RETRY_FACTOR × timeout_s, at least LOAD_RETRY_MIN_S (long enough for an import of torch or sympy
    from cold shared storage)."""

    def __init__(
        self,
        spec: str,
        *,
        base_dir: Path,
        workers: int = 2,
        timeout_s: float = 10.0,
        on_error: float = 0.0,
        load_retry_s: float | None = None,
        loaded: bool = False,
        wait: bool = False,
    ) -> None:
        """`loaded`: the function is known to load (another pool of the job loaded it): a first start that fails
        is then retried as a restart is, not a config error. `wait`: return once a worker has loaded the function,
        or raise ValueError with one line naming the function and why none could (the caller reports it: the pool
        does not log it) — within the pool's deadline for a start, `load_retry_s`."""
        self.spec = spec
        self.base_dir = base_dir
        self.timeout_s = timeout_s
        self.on_error = float(on_error)
        self.load_retry_s = load_deadline_s(timeout_s) if load_retry_s is None else load_retry_s
        # what sets that bound, for the line of a load that outlasts it: the job field that raises it
        self._bound_by = (
            f" ({LOAD_RETRY_FACTOR} × reward_timeout_s, at least {LOAD_RETRY_MIN_S:g} s; a longer load: set "
            "task.reward_load_timeout_s)"
            if load_retry_s is None
            else " (task.reward_load_timeout_s)"
        )
        self.stats = RewardStats()
        self.failed: str | None = None  # why the pool stopped for good (its calls are cancelled), once it has
        # a bad spec fails here, in the caller, when the caller calls the function (workers=0) or it is a built-in;
        # a user's module is imported by the workers only, where its load has a deadline (the first start's failure
        # is the pool's, a config error: `failed`)
        self._fn = load_reward(spec, base_dir) if workers == 0 or ":" not in spec else None
        self.base_workers = workers
        self.stuck_s = max(STUCK_MIN_S, STUCK_FRACTION * timeout_s)
        self._inline = workers == 0
        self._lock = threading.Lock()
        self._pending: deque[_Call] = deque()
        self._seq = 0  # calls submitted so far
        self._cancels: dict[str, int] = {}  # sample id → its calls up to this seq are dropped (the dispatcher does it)
        self._closed = False
        self._loaded = loaded  # a worker has loaded the function: the first start is over
        self._wait = wait  # the constructor waits for the first start (and raises its failure)
        self._down_since: float | None = None  # since when every worker has been unable to load the function
        self._load_error: str | None = None  # why the last start that failed could not load it
        self.load_error: str | None = None  # the same, as one line that names the function's file, module or spec
        self._load_timed_out = False  # the first start failed for want of time (a slow import), not an error
        self._first_start_over = threading.Event()  # a worker loaded the function, or the pool failed or ended
        self._workers: list[_Worker] = []
        if self._inline:
            return
        methods = multiprocessing.get_all_start_methods()
        # never fork: the trainer has threads (and torch's); forkserver forks from a clean process
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self._ctx = cast("ForkServerContext | SpawnContext", ctx)
        self._wake_r, self._wake_w = socket.socketpair()
        self._workers = [self._start_worker() for _ in range(workers)]
        self._thread = threading.Thread(target=self._dispatch, name="reward-pool", daemon=True)
        self._thread.start()
        if wait and (why := self._wait_loaded()) is not None:
            self.close()
            raise (LoadTimedOut if self._load_timed_out else ValueError)(why)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        sample_id: str,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: Any = None,
        *,
        origin: str | None = None,
    ) -> Future[RewardResult]:
        """Queue one call and return at once; the future's result is always a RewardResult. `origin` (where the
        prompt came from: "data.jsonl line 7") is named beside the sample id where the call fails."""
        kwargs = {
            "data_source": data_source,
            "solution_str": solution_str,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
        }
        call = _Call(sample_id, kwargs, Future(), origin=origin)
        if self._inline:
            assert self._fn is not None
            if not _takes_extra_info(self._fn):
                kwargs.pop("extra_info")
            self._finish(call, call_reward(self._fn, kwargs, self.on_error))
            return call.future
        with self._lock:
            if self.failed is not None:  # cancelled like those it had: whoever waits for it learns it will not come
                call.future.cancel()
                return call.future
            if self._closed:
                raise RuntimeError("reward pool is closed")
            self._seq += 1
            call.seq = self._seq
            self._pending.append(call)
        self._wake_w.send(b"x")
        return call.future

    def cancel(self, sample_id: str) -> None:
        """Drop `sample_id`'s calls submitted so far, queued or running (their futures are cancelled); nothing for
        one that has finished, or one submitted after this."""
        if self._inline:
            return
        with self._lock:
            if self._closed:
                return
            self._cancels[sample_id] = self._seq
        self._wake_w.send(b"x")

    def score(
        self, sample_id: str, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> RewardResult:
        """One call, waiting for its result."""
        return self.submit(sample_id, data_source, solution_str, ground_truth, extra_info).result()

    def close(self) -> None:
        """Stop the workers; calls not finished yet are cancelled."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._inline:
            return
        self._wake_w.send(b"x")
        self._thread.join()
        self._wake_r.close()
        self._wake_w.close()

    # ── the dispatcher thread ──

    def _start_worker(self, load_failures: int = 0) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main,
            args=(self.spec, str(self.base_dir), self.on_error, child),
            name="rlctl-reward",
            daemon=True,
        )
        proc.start()
        child.close()
        return _Worker(proc, parent, load_failures=load_failures, deadline=time.monotonic() + self.load_retry_s)

    def _stop(self, w: _Worker) -> None:
        """Kill worker `w` and what its calls started (`_kill_tree`), and reap it."""
        _kill_tree(w.proc.pid)
        w.proc.kill()  # killed before its os.setsid, it was in no group of its own
        w.proc.join()
        w.conn.close()

    def _finish(self, call: _Call, result: RewardResult) -> None:
        s = self.stats
        s.calls += 1
        if result.outcome == "error":
            s.errors += 1
        elif result.outcome == "timeout":
            s.timeouts += 1
        elif result.outcome == "bad_type":
            s.bad_type += 1
        elif result.outcome == "died":
            s.died += 1
        if not result.ok:
            who = f"sample {call.sample_id}" + (f" ({call.origin})" if call.origin else "")
            if s.first_failure is None:
                s.first_failure = f"{result.outcome}: {who}: {result.error}"
            log.warning("reward %s: %s: %s; scored %s", result.outcome, who, result.error, result.score)
        call.future.set_result(result)

    def _replace(self, i: int) -> None:
        self._stop(self._workers[i])
        self.stats.restarts += 1
        self._workers[i] = self._start_worker()

    def _assign(self) -> None:
        for i, w in enumerate(self._workers):
            if w.state != "ready" or w.call is not None:
                continue
            with self._lock:
                if not self._pending:
                    return
                call = self._pending.popleft()
            try:
                w.conn.send(call.kwargs)
            except OSError:  # died while idle: its replacement takes the call once ready
                with self._lock:
                    self._pending.appendleft(call)
                self._replace(i)
                continue
            now = time.monotonic()
            w.call, w.deadline, w.stuck_at = call, now + self.timeout_s, now + self.stuck_s
        self._grow()

    def _grow(self) -> None:
        """Calls wait and no worker is free: one more worker for each stuck call beyond those already started
        beside them, up to workers × EXTRA_FACTOR."""
        with self._lock:
            waiting = len(self._pending)
        if not waiting or any(w.state == "starting" or (w.state == "ready" and w.call is None) for w in self._workers):
            return
        now = time.monotonic()
        stuck = sum(1 for w in self._workers if w.call is not None and now >= w.stuck_at)
        extra = len(self._workers) - self.base_workers
        room = self.base_workers * EXTRA_FACTOR - len(self._workers)
        for _ in range(min(stuck - extra, waiting, room)):
            self._workers.append(self._start_worker())
            self.stats.extra_started += 1

    def _shrink(self, i: int) -> None:
        """Worker `i` is idle: stop it if it is beyond the pool's size and nothing waits."""
        with self._lock:
            waiting = bool(self._pending)
        if waiting or len(self._workers) <= self.base_workers:
            return
        self._stop(self._workers.pop(i))  # idle: nothing to lose, and the dispatcher must not wait for a clean exit

    def _receive(self, i: int) -> None:
        w = self._workers[i]
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            w.proc.join(1.0)
            code, call = w.proc.exitcode, w.call
            if w.state == "starting":  # crashed while loading the function
                self._load_failed(i, f"died while loading it (exit code {code})")
                return
            self._replace(i)
            if call is not None:
                self._finish(call, RewardResult(self.on_error, "died", f"reward worker died (exit code {code})"))
            return
        if w.state == "starting":
            if msg == "ready":
                w.state, w.load_failures, w.deadline, self._loaded = "ready", 0, math.inf, True
                self._first_start_over.set()
            else:
                self._load_failed(i, msg, named=True)
            return
        call, w.call, w.deadline, w.stuck_at = w.call, None, math.inf, math.inf
        assert call is not None and isinstance(msg, RewardResult), msg
        self._finish(call, msg)
        self._shrink(i)

    def _load_failed(self, i: int, why: str, *, named: bool = False) -> None:
        """Worker `i` could not load the function: on the pool's first start a config error (the pool fails);
        later (an NFS hiccup, an OOM kill while importing) it is down and starts again after a backoff.
        `named`: `why` is the loader's own line, which names the file or module (else the spec is put before it)."""
        w = self._workers[i]
        self._stop(w)
        self.stats.load_failures += 1
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2**w.load_failures)
        w.state, w.load_failures, w.retry_at = "down", w.load_failures + 1, time.monotonic() + delay
        self._load_error = why
        self.load_error = why if named else f"{self.spec}: {why}"
        if not self._loaded:
            self._fail(f"a reward worker cannot load {self.spec}: {why}")
            return
        log.error(
            "reward worker %d cannot load %s: %s; starting it again in %.0f s (%d failed start(s) in a row)",
            i, self.spec, why, delay, w.load_failures,
        )  # fmt: skip

    def _retry(self) -> None:
        """Start again the workers whose backoff has passed (one beyond the pool's size goes, if nothing waits);
        fail the pool when every worker has been unable to load the function for `load_retry_s`."""
        now = time.monotonic()
        for w in list(self._workers):
            if w.state != "down" or now < w.retry_at:
                continue
            with self._lock:
                waiting = bool(self._pending)
            if not waiting and len(self._workers) > self.base_workers:
                self._workers.remove(w)
                continue
            self._workers[self._workers.index(w)] = self._start_worker(w.load_failures)
        if not self._workers or not all(w.load_failures for w in self._workers):
            self._down_since = None
            return
        if self._down_since is None:
            self._down_since = now
        if now - self._down_since >= self.load_retry_s:
            self._fail(
                f"no reward worker could load {self.spec} for {now - self._down_since:.0f} s "
                f"({self.stats.load_failures} failed starts); the last error: {self._load_error}"
            )

    def _wait_loaded(self) -> str | None:
        """Wait for the first start to end: None once a worker has loaded the function, else why none could, in one
        line naming the function (`load_error`). Bounded by the pool's deadline: a start has `load_retry_s` to load
        it, and the first start that cannot fails the pool."""
        if not self._first_start_over.wait(self.load_retry_s + WAIT_SLACK_S):  # a dispatcher that died: no hang
            self._load_timed_out = True
            return f"{self.spec}: no reward worker said whether it loaded within {self.load_retry_s:.0f} s"
        if self._loaded and self.failed is None:
            return None
        return self.load_error or self.failed or f"{self.spec}: the reward pool ended before a worker loaded it"

    def _fail(self, why: str) -> None:
        """Stop the pool for good: the dispatcher ends, and every call, queued, running or to come, is cancelled."""
        if not self._wait or self._loaded:  # (a constructor that waits raises the first start's failure itself)
            log.error("reward pool failed: %s; its calls are cancelled", why)
        with self._lock:
            self.failed = why
        self._first_start_over.set()

    def _drop_cancelled(self) -> None:
        with self._lock:
            drop, self._cancels = self._cancels, {}
            if not drop:
                return
            keep: deque[_Call] = deque()
            gone: list[_Call] = []
            for c in self._pending:
                (gone if c.seq <= drop.get(c.sample_id, 0) else keep).append(c)
            self._pending = keep
        for i, w in enumerate(self._workers):
            if w.call is not None and w.call.seq <= drop.get(w.call.sample_id, 0):
                gone.append(w.call)
                self._replace(i)  # a running call cannot be interrupted: its process goes
        for call in gone:
            self.stats.cancelled += 1
            call.future.cancel()

    def _dispatch(self) -> None:
        try:
            while not self._closed and self.failed is None:
                self._drop_cancelled()
                self._retry()
                if self.failed is not None:
                    break
                self._assign()
                waiting = [w for w in self._workers if w.state == "starting" or w.call is not None]
                next_deadline = min((w.deadline for w in waiting), default=math.inf)
                next_deadline = min([next_deadline, *(w.retry_at for w in self._workers if w.state == "down")])
                if self._down_since is not None:  # wake to fail the pool if no retry has loaded the function by then
                    next_deadline = min(next_deadline, self._down_since + self.load_retry_s)
                with self._lock:
                    queued = bool(self._pending)
                if queued:  # wake when a running call becomes stuck: a worker may start for the waiting calls
                    next_deadline = min(
                        [next_deadline, *(w.stuck_at for w in waiting if w.stuck_at > time.monotonic())]
                    )
                timeout = None if math.isinf(next_deadline) else max(0.0, next_deadline - time.monotonic())
                ready = wait([self._wake_r, *(w.conn for w in waiting)], timeout)
                if self._wake_r in ready:
                    self._wake_r.recv(4096)
                for w in list(self._workers):
                    if w not in self._workers:  # stopped by _shrink meanwhile
                        continue
                    i = self._workers.index(w)
                    if w.conn in ready:
                        self._receive(i)
                        if self.failed is not None:
                            break
                    elif w.call is not None and time.monotonic() >= w.deadline:
                        call = w.call
                        self._replace(i)  # a running call cannot be interrupted: its process goes
                        self._finish(call, RewardResult(self.on_error, "timeout", f"no result in {self.timeout_s}s"))
                    elif w.state == "starting" and time.monotonic() >= w.deadline:  # its import hangs
                        self._load_timed_out = self._load_timed_out or not self._loaded
                        self._load_failed(
                            i, f"it did not finish loading within {self.load_retry_s:g} s{self._bound_by}"
                        )
                        if self.failed is not None:
                            break
        except Exception:  # a dead dispatcher would leave futures hanging: log, cancel them
            log.exception("reward pool dispatcher failed; pending reward calls are cancelled")
        finally:
            with self._lock:
                self._closed = True
            self._shutdown()
            self._first_start_over.set()

    def _shutdown(self) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), deque()
        for call in pending:
            call.future.cancel()
        for w in self._workers:
            if w.call is not None:  # a running call is not waited for
                w.call.future.cancel()
            if w.state != "down":  # (a down worker is stopped already)
                # killed, idle ones too: a clean exit would orphan what their calls left running in groups of
                # their own, where no kill finds it any more
                self._stop(w)


# ── `rlctl check` ─────────────────────────────────────────────────────────────────────────────────


class LoadTimedOut(ValueError):
    """A reward's first start did not load it within its deadline (its import hangs, or is slow): no error of its
    own to say."""


def check_loads(spec: str, base_dir: Path, *, timeout_s: float, load_timeout_s: float | None = None) -> None:
    """What `rlctl check` verifies of a reward: that it loads — a built-in by its name, a user's function in one
    reward worker, as the job's pool loads it and within the pool's deadline for `timeout_s` (`load_retry_s`): the
    operator's process never imports the user's module, so a module whose import hangs (a network mount, a lock)
    is refused in one line at the deadline instead of hanging the check. Raises ValueError with that line (an
    error inside the module: the loader's, as `load_reward` words it; else the spec and the deadline)."""
    if ":" not in spec:
        load_reward(spec, base_dir)
        return
    RewardPool(spec, base_dir=base_dir, workers=1, timeout_s=timeout_s, load_retry_s=load_timeout_s, wait=True).close()
