"""Reward functions: the built-ins, loading one (built-in or the user's), and calling one, its result checked.

A reward function has verl's signature, so functions users already have work unchanged:

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

(an `async def` one too: its coroutine is run to its end in the call).

The pool of worker processes that calls them, each call bounded, is rlctl.rl.reward_pool; the copy of a user's
reward file and the modules beside it into a job, rlctl.rl.reward_files.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import numbers
import re
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlctl.rl.reward_files import local_modules
from rlctl.rl.reward_math import answer_text, math_boxed
from rlctl.rl.reward_scope import ImportScope
from rlctl.textutil import did_you_mean, home_expanded, job_relative, not_a_file, one_line, one_of

if TYPE_CHECKING:
    from rlctl.rl.dataset_scan import RowsChecked

RewardFn = Callable[..., Any]
Outcome = Literal["ok", "error", "timeout", "bad_type", "died"]
ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")

log = logging.getLogger(__name__)


def exact_match(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the output, stripped, equals the ground truth (or one of a list of them), each read as text as the
    gsm8k and math built-ins read it (`answer_text`: 42.0 is "42"), stripped, else 0.0."""
    return 1.0 if solution_str.strip() in {a.strip() for a in exact_answers(ground_truth)} else 0.0


def exact_answers(ground_truth: Any) -> list[str]:
    """The answers exact_match takes: a string or a number (`answer_text`), or each of a non-empty list of them; a
    ValueError saying what is not one (a dict's, a bool's or a NaN's str was compared: every output scored 0, or
    "True" alone 1)."""
    if not isinstance(ground_truth, list | tuple):
        try:
            return [answer_text(ground_truth)]
        except ValueError as e:
            if isinstance(ground_truth, numbers.Real) and not isinstance(ground_truth, bool):
                raise  # a NaN or an infinity, said as such
            raise ValueError(f"expected a string, a number or a list of them, got {type(ground_truth).__name__}") from e
    if not ground_truth:
        raise ValueError("expected a string, a number or a list of them, got an empty list")
    answers = []
    for i, answer in enumerate(ground_truth):
        try:
            answers.append(answer_text(answer))
        except ValueError as e:
            raise ValueError(f"[{i}]: {e}") from e
    return answers


def digits(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The demo task's verifier (rlctl.rl.tasks.score): partial credit per (letter, count) run."""
    from rlctl.rl.tasks import score

    return score(str(ground_truth), solution_str)


GSM8K_TAIL_CHARS = 300  # verl's scorer reads the output's end only (a regex over a long output is slow)
GSM8K_ANSWER = re.compile(r"#### (-?[0-9.,]+)")  # the answer line GSM8K's solutions end with: `#### 1,234`


def gsm8k(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """verl's GSM8K scorer (its default, strict extraction): 1.0 where the last `#### <number>` in the output's last
    300 characters, its commas dropped, is the ground truth as written ("72"; a number in decimal: `answer_text`), else
    0.0 — none for a number written otherwise (`#### 72.0`, `#### $72`, `####72`), nor for a number without `#### `
    before it."""
    found = GSM8K_ANSWER.findall(solution_str[-GSM8K_TAIL_CHARS:])
    return 1.0 if found and found[-1].replace(",", "") == answer_text(ground_truth).strip() else 0.0


# the built-ins that compare an answer read from the output with the ground truth as text (`answer_text`)
TEXT_ANSWER_REWARDS = ("gsm8k", "math")


def ground_truth_problem(reward: str, ground_truth: Any) -> str | None:
    """What is wrong with a row's ground truth for built-in `reward` (the gsm8k and math built-ins read it as text,
    `answer_text`, exact_match it or each of a list of them, `exact_answers`): a list or dict (its str compared)
    scored 0 on every output; None where it is fine."""
    try:
        if reward == "exact_match":
            exact_answers(ground_truth)
        elif reward in TEXT_ANSWER_REWARDS:
            answer_text(ground_truth)
    except ValueError as e:
        compared = "the output" if reward == "exact_match" else "the output's answer"
        return f"{e} (reward {reward} compares {compared} with it as text)"
    return None


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "digits": digits,
    "exact_match": exact_match,
    "gsm8k": gsm8k,
    "math": math_boxed,
}
# the built-in that scores a dataset by its rows' data_source, as verl's default scorer chooses its own: the
# built-in's name, verl's scorer's, how an output's answer ends
BUILTIN_FOR_DATA_SOURCE = {
    "openai/gsm8k": ("gsm8k", "GSM8K", "… #### 72"),
    "lighteval/MATH": ("math", "MATH", "… \\boxed{\\frac{1}{2}}"),
    "DigitalLearningGmbH/MATH-lighteval": ("math", "MATH", "… \\boxed{\\frac{1}{2}}"),
}


def builtin_scorer_hint(
    reward: str, data_sources: set[str], *, heldout: bool = False, files: tuple[Path, Path] | None = None
) -> str | None:
    """What `rlctl check` warns of where the rows are a dataset a built-in scores (each row's data_source
    openai/gsm8k) and the reward is exact_match, the default: its outputs end in a worked answer (`… #### 72`),
    which exact_match scores 0 against the ground truth "72" — every sample 0, nothing said; else None. `heldout`:
    the rows are the held-out file's (evaluation.path), which the held-out evaluation scores with the same reward;
    `files`: the rows are the training file's and the held-out file's alike (those two), said in one line."""
    scorer = _scorer(reward, data_sources)
    if scorer is None:
        return None
    builtin, verls, example = scorer
    if files is not None:
        rows = f"every row's data_source in task.path ({files[0]}) and in evaluation.path ({files[1]})"
    else:
        rows = "the data_source of every held-out row (evaluation.path)" if heldout else "every row's data_source"
    figures = " (the held-out figures read 0 with it)" if heldout or files is not None else ""
    return (
        f"task.reward: exact_match compares the whole output with the ground truth, and {rows} is "
        f"{one_of(data_sources)}, whose outputs end in a worked answer ('{example}'; verl scores them with its "
        f"{verls} scorer): an output that is not the bare answer scores 0{figures}; set reward: {builtin}"
    )


def _scorer(reward: str, data_sources: set[str]) -> tuple[str, str, str] | None:
    """The built-in that scores rows of `data_sources`, all one built-in's, where `reward` is exact_match."""
    named = {BUILTIN_FOR_DATA_SOURCE.get(source) for source in data_sources}
    return named.pop() if reward == "exact_match" and len(named) == 1 else None


def builtin_scorer_hints(reward: str, *, train: RowsChecked | None, heldout: RowsChecked | None) -> list[str]:
    """`builtin_scorer_hint` of the rows `rlctl check` and the launch's preflight read (`check_rows`: the training
    file's, the held-out file's, where read), in the order read (the held-out file's first): one line naming both
    files where both files' rows are the same built-in's, versus the same warning twice, once per file."""
    if (
        train is not None
        and heldout is not None
        and _scorer(reward, set(train.data_sources)) == _scorer(reward, set(heldout.data_sources))
    ):
        both = set(train.data_sources | heldout.data_sources)  # (neither's a built-in's: nor are both)
        hint = builtin_scorer_hint(reward, both, files=(train.path, heldout.path))
        return [] if hint is None else [hint]
    hints = [
        builtin_scorer_hint(reward, set(rows.data_sources), heldout=held)
        for rows, held in ((heldout, True), (train, False))
        if rows is not None
    ]
    return [hint for hint in hints if hint is not None]


# ── loading ───────────────────────────────────────────────────────────────────────────────────────


def _from_file(file: Path, shown: str, fn: str, *, own_process: bool) -> Any:
    if not file.is_file():
        raise ValueError(f"{shown}: {not_a_file(file)}{job_relative(shown)}")
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
    # any error in the user's file is reported as one line, a sys.exit() in it too (a worker died of it, saying
    # 'died while loading it (exit code 1)', its message printed by the process; in-line it ended the caller)
    except (Exception, SystemExit) as e:
        del sys.modules[mod_name]
        raise ValueError(f"{shown}: cannot import: {_said(e)}{_own_package(file, fn, e)}") from e
    return module


def _own_package(file: Path, fn: str, e: BaseException) -> str:
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
    except (Exception, SystemExit) as e:  # any error in the user's module is reported as one line (`_from_file`)
        raise ValueError(f"module {name!r}: cannot import: {_said(e)}") from e


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
        # `~/…` read from the home directory, as `load_job` reads the job file's (and the line says so): needed here
        # too, as job.json's task.reward reaches the agents (`JobDir.read_job`) unexpanded, a hand edit's `~/…` too;
        # by its one rule (`home_expanded`): a home this machine does not know is said so, not a folder `~user` here
        try:
            file = base_dir / home_expanded(target)
        except ValueError as e:
            raise ValueError(f"{target}: {e}") from e
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
        # (its type's name after no article: it said "'X' is a int")
        raise ValueError(f"{where}: {name!r} is not a function: it is of type {type(fn).__name__}")
    _check_signature(fn, f"{target}:{name}")
    return fn


def _check_signature(fn: RewardFn, shown: str) -> None:
    """Refuse a function that cannot be called as it will be: with the four keywords as verl calls it (a required
    extra_info too, which a 3-argument trial refused), or with the first three where it takes no extra_info (rlctl
    leaves it out for such a function: `takes_extra_info`)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: the first call tells
    # a function that names extra_info (or takes **kwargs) is called with it, another without it
    named = "extra_info" in sig.parameters or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    try:
        sig.bind(**dict.fromkeys(ARGS if named else ARGS[:3]))
    except TypeError as e:
        raise ValueError(
            f"{shown}{sig}: cannot be called as compute_score(data_source=, solution_str=, ground_truth=, "
            f"extra_info=): {e}"
        ) from e


def takes_extra_info(fn: RewardFn) -> bool:
    try:
        inspect.signature(fn).bind(**dict.fromkeys(ARGS))
    except (TypeError, ValueError):
        return False
    return True


ERROR_CHARS = 300  # a reward's error message at most: in its log line, the summary's first failure, check's line


def _line(text: str) -> str:
    """`text` as one line of at most ERROR_CHARS (line breaks written as `\\n`, as the CLI writes an error): a
    message with line breaks made log lines of several, and one holding a whole output or traceback was kept whole."""
    return one_line(text, max_chars=ERROR_CHARS)


def _said(e: BaseException) -> str:
    """An exception as one line: its type, and its message (`_line`) where it has one."""
    return f"{type(e).__name__}: {_line(str(e))}" if str(e) else type(e).__name__


# ── one call, checked ─────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class RewardResult:
    score: float
    outcome: Outcome = "ok"
    error: str | None = None
    extra: dict[str, float] = field(default_factory=dict)  # the other keys of a dict return fit to be figures
    # the keys of a dict return left out of `extra` (as shown: repr'd, bounded) → why (the pool warns of each once):
    # what is said of the call, not its result
    dropped: dict[str, str] = field(default_factory=dict, compare=False)

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


EXTRA_NAME_CHARS = 64  # an extra figure's key at most (verl's reward_extra_info keys: 'acc', 'pred_len')
EXTRA_NAME = re.compile(rf"[A-Za-z0-9_]{{1,{EXTRA_NAME_CHARS}}}")
DROPPED_KEYS = 8  # of one call's keys left out, those said (a dict of 1000 bad keys: its first 8)


def extra_figures(value: dict[Any, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """The keys of a dict return beside 'score' that are figures (verl's reward_extra_info), and those left out with
    why: a key is a name of letters, digits and `_` of at most EXTRA_NAME_CHARS (it becomes a tracker's series
    reward_extra/<key>: a '/' nested W&B's panels, a space or a 5000-character key broke a Prometheus or TensorBoard
    name), its value a finite number (a bool is one, as verl's 'acc' often is). Of those left out the first
    DROPPED_KEYS are said, the others passed over (each value's repr was made, then thrown away)."""
    kept: dict[str, float] = {}
    dropped: dict[str, str] = {}
    for k, v in value.items():
        if k == "score":
            continue
        named = isinstance(k, str) and EXTRA_NAME.fullmatch(k) is not None
        if named and _real(v):
            kept[k] = float(v)
        elif len(dropped) < DROPPED_KEYS:
            why = (
                f"its value is no finite number ({_line(f'{v!r:.40}')})"
                if named
                else f"a key is a name of letters, digits and _, at most {EXTRA_NAME_CHARS} characters"
            )
            dropped[_line(f"{k!r:.80}")] = why
    return kept, dropped


def check_result(value: Any, on_error: float) -> RewardResult:
    """A function's return value as a RewardResult: a finite number, or a dict with a numeric 'score' (its other keys
    the figures `extra_figures` keeps)."""
    extra: dict[str, float] = {}
    dropped: dict[str, str] = {}
    if isinstance(value, dict):
        if "score" not in value:
            keys = _line(f"dict without a 'score' key (keys: {sorted(map(str, value))})")
            return RewardResult(on_error, "bad_type", keys)
        extra, dropped = extra_figures(value)
        value = value["score"]
    if not _real(value):
        got = _line(f"{value!r:.80}")
        return RewardResult(on_error, "bad_type", f"expected a finite number or a dict with 'score', got {got}")
    return RewardResult(float(value), "ok", None, extra, dropped)


_loops = threading.local()  # each thread's event loop for async reward functions (`_awaited`)


def _awaited(coroutine: Any) -> Any:
    """What an `async def` reward's call returns, run to its end on this thread's event loop, made at the first such
    call and kept: a client the function keeps between calls (an HTTP session to a judge model) stays bound to a loop
    that runs. A worker's calls are one at a time in its main thread, where no loop runs; an in-line caller's thread
    that runs one of its own cannot run another (a RuntimeError, scored as the function's)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        coroutine.close()  # (one that never started: no "coroutine was never awaited" warning at its collection)


def call_reward(fn: RewardFn, kwargs: dict[str, Any], on_error: float) -> RewardResult:
    """Call `fn` once in this thread, an `async def` one's coroutine run to its end (`_awaited`, as verl's reward
    loop awaits it, bounded as any call is by the pool's deadline: it was scored `bad_type`, a coroutine never
    awaited); an exception scores `on_error`, a sys.exit() in it too (in-line, with reward_workers 0, it ended the
    controller's scoring without a word: the job stopped, its log silent), and any other BaseException but a
    KeyboardInterrupt (asyncio's CancelledError, a timeout library's own: in a worker it killed the process, its log
    line saying only 'reward worker died'; in-line it left the controller's scoring)."""
    try:
        value = fn(**kwargs)
        if inspect.iscoroutine(value):
            value = _awaited(value)
    except KeyboardInterrupt:  # in-line, a Ctrl-C of the process: not the function's failure
        raise
    except BaseException as e:  # noqa: BLE001 - a user function's failure is scored, counted and logged
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f" ({Path(frame.filename).name}:{frame.lineno})"
        return RewardResult(on_error, "error", f"{_said(e)}{where}")
    try:
        return check_result(value, on_error)
    except Exception as e:  # noqa: BLE001 - a value that breaks the check (its repr or float() raises) is a wrong type
        return RewardResult(on_error, "bad_type", f"cannot read the value returned: {_said(e)}")
