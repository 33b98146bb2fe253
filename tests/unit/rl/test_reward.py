import contextlib
import logging
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError
from rlctl.rl import reward_pool
from rlctl.rl.dataset import prepare_dataset
from rlctl.rl.reward import (
    RewardResult,
    call_reward,
    check_result,
    digits,
    exact_match,
    load_reward,
)
from rlctl.rl.reward_files import local_modules
from rlctl.rl.reward_pool import RewardPool
from rlctl.rl.reward_worker import REAP_EVERY_S
from rlctl.rl.source import DatasetSource
from rlctl.rl.tokenizer import load_tokenizer
from tests.unit.hf_tokenizer import write_tokenizer
from tests.unit.rl.test_dataset import write_jsonl

USER_FILE = """
import os, subprocess, threading, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str in ("spawn", "spawn_and_return"):  # a code-execution reward's child programs
        kids = [subprocess.Popen(["sleep", "600"]), subprocess.Popen(["sleep", "600"], start_new_session=True)]
        with open(extra_info["pids"] + ".tmp", "w") as f:
            f.write(" ".join(str(k.pid) for k in kids))
        os.replace(extra_info["pids"] + ".tmp", extra_info["pids"])
        if solution_str == "spawn_and_return":
            return 1.0  # its children left running
        threading.Event().wait()
    if solution_str in ("daemon", "daemon_and_return"):  # a daemon out of the worker's group and session, orphaned
        marker = extra_info["marker"]
        subprocess.run(["bash", "-c", f"setsid bash -c 'exec -a {marker} sleep 600' </dev/null >/dev/null 2>&1 &"])
        pid = _named(marker)
        with open(extra_info["pids"] + ".tmp", "w") as f:
            f.write(str(pid))
        os.replace(extra_info["pids"] + ".tmp", extra_info["pids"])
        if solution_str == "daemon_and_return":
            return 1.0
        threading.Event().wait()
    if solution_str == "big":
        return {"score": 1.0, "n_steps": 10**400}  # an exact count past a float's range
    if solution_str == "hang":
        threading.Event().wait()  # never returns
    if solution_str == "raise":
        raise KeyError("boom")
    if solution_str == "die":
        os._exit(3)
    if solution_str == "base":
        raise Stop("out of time")
    if solution_str == "str":
        return "1.0"
    if solution_str == "dict":
        return {"score": 0.5, "acc": True, "format": 1, "note": "kept out: not a number"}
    if solution_str == "extra":
        return float(extra_info["bonus"])
    return float(solution_str == ground_truth)

def _named(marker):  # the pid of the process whose argv[0] is `marker`, once it has exec'd
    while True:
        for name in os.listdir("/proc"):
            try:
                if name.isdigit() and open(f"/proc/{name}/cmdline", "rb").read().split(bytes(1))[0] == marker.encode():
                    return int(name)
            except OSError:
                pass
        time.sleep(0.01)

def three_args(data_source, solution_str, ground_truth):
    return 2.0

def too_few(solution_str):
    return 0.0

class Stop(BaseException):  # (as a timeout library's own)
    pass

NOT_A_FUNCTION = 3
"""
MINE_STOP_LINE = USER_FILE.splitlines().index('        raise Stop("out of time")') + 1


@pytest.fixture
def rewards_dir(tmp_path: Path) -> Path:
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "mine.py").write_text(USER_FILE)
    return tmp_path


def test_builtins() -> None:
    assert exact_match("x", " 42\n", "42") == 1.0
    assert exact_match("x", "41", "42") == 0.0
    assert exact_match("x", "b", ["a", "b"]) == 1.0
    assert exact_match("x", "7", 7) == 1.0
    assert digits("digits", "aaab", "aaab") == 1.0
    assert digits("digits", "aab", "aaab") == 0.5  # (b, 1) right, (a, 2) wrong
    assert load_reward("exact_match", Path(".")) is exact_match


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, RewardResult(1.0)),
        (0.25, RewardResult(0.25)),
        ({"score": 0.5, "acc": 1, "s": "x"}, RewardResult(0.5, extra={"acc": 1.0})),
        ("1.0", RewardResult(-1.0, "bad_type", "expected a finite number or a dict with 'score', got '1.0'")),
        (None, RewardResult(-1.0, "bad_type", "expected a finite number or a dict with 'score', got None")),
        (math.nan, RewardResult(-1.0, "bad_type", "expected a finite number or a dict with 'score', got nan")),
        ({"acc": 1.0}, RewardResult(-1.0, "bad_type", "dict without a 'score' key (keys: ['acc'])")),
        ({"score": 1.0, "n_steps": 10**400}, RewardResult(1.0)),  # an int past a float's range is not a number
        (10**400, RewardResult(-1.0, "bad_type", "expected a finite number or a dict with 'score', got 1" + "0" * 79)),
    ],
)
def test_return_values_are_checked(value: object, expected: RewardResult) -> None:
    assert check_result(value, -1.0) == expected


def test_numpy_and_torch_scalars_are_numbers_and_their_arrays_are_not() -> None:
    # numpy's bool_ (`(a == b).all()`), a 0-d array and a 0-d tensor were `bad_type`, scored on_error, where True
    # and 0.5 were not
    import numpy as np
    import torch

    for value, score in ((np.bool_(True), 1.0), (np.array(0.5), 0.5), (torch.tensor(0.25), 0.25)):
        assert check_result(value, -1.0) == RewardResult(score), value
    assert check_result({"score": torch.tensor(1.0), "acc": np.bool_(False)}, -1.0) == RewardResult(
        1.0, extra={"acc": 0.0}
    )
    for value in (torch.tensor([0.5, 1.0]), np.array("1.0"), torch.tensor(float("nan"))):
        assert check_result(value, -1.0).outcome == "bad_type", value


def test_a_sys_exit_in_the_function_is_a_failed_call() -> None:
    # in-line (reward_workers: 0) a reward's sys.exit(3) left the controller's scoring: the job stopped, its log silent
    def leaves(**_: object) -> float:
        sys.exit(3)

    result = call_reward(leaves, {}, -1.0)
    assert (result.score, result.outcome) == (-1.0, "error")
    assert result.error is not None and result.error.startswith("SystemExit: 3 (test_reward.py:")


class _Cancelled(BaseException):  # (as asyncio's CancelledError, or a timeout library's own)
    pass


@pytest.mark.parametrize("workers", [0, 1])
def test_a_base_exception_in_the_function_is_a_failed_call_named_in_the_log(
    rewards_dir: Path, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    # it escaped call_reward: in a worker it killed the process (logged as 'reward worker died (exit code 1)', what
    # was raised on the worker's stderr alone), in-line it left the controller's scoring
    def cancelled(**_: object) -> float:
        raise _Cancelled("gave up")

    result = call_reward(cancelled, {}, -1.0)
    assert (result.score, result.outcome) == (-1.0, "error")
    assert result.error is not None and result.error.startswith("_Cancelled: gave up (test_reward.py:")
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_pool")
    with RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=workers, on_error=-1.0) as pool:
        result = pool.score("s0", "src", "base", "a")
        assert (result.outcome, pool.stats.errors, pool.stats.restarts) == ("error", 1, 0)
    assert [r.getMessage() for r in caplog.records] == [
        f"reward error: sample s0: Stop: out of time (mine.py:{MINE_STOP_LINE}); scored -1.0"
    ]


class _Unreadable(float):
    def __float__(self) -> float:
        raise RuntimeError("no float for you")


def test_a_value_the_check_cannot_read_is_a_bad_type() -> None:
    """check_result raising (here a number whose float() raises) scores the call `bad_type`; it does not escape
    call_reward (in a worker it killed the process, in-line it reached the controller's loop)."""
    result = call_reward(lambda **_: _Unreadable(1.0), {}, -1.0)
    assert result == RewardResult(-1.0, "bad_type", "cannot read the value returned: RuntimeError: no float for you")


@pytest.mark.parametrize("workers", [0, 1])
def test_an_int_past_a_float_s_range_neither_kills_the_worker_nor_raises(rewards_dir: Path, workers: int) -> None:
    with RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=workers, timeout_s=30.0) as pool:
        assert pool.score("s0", "d", "big", "a") == RewardResult(1.0)
        assert (pool.stats.restarts, pool.stats.errors) == (0, 0)


def test_load_user_file_and_module(rewards_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fn = load_reward("rewards/mine.py:compute_score", rewards_dir)
    assert fn("d", "a", "a") == 1.0
    (rewards_dir / "myrewards").mkdir()
    (rewards_dir / "myrewards" / "__init__.py").write_text("")
    (rewards_dir / "myrewards" / "math_rw.py").write_text(
        "def score(data_source, solution_str, ground_truth):\n    return 0.75\n"
    )
    # a module beside the job file is no module the job's sites can import (the launch copies none: the controller
    # failed `no module named 'myrewards'` where `rlctl check` had loaded it from there): refused, naming the file
    with pytest.raises(ValueError) as e:
        load_reward("myrewards.math_rw:score", rewards_dir)
    assert str(e.value) == (
        "no module named 'myrewards' installed; myrewards/math_rw.py beside the job file is not copied to the job's "
        "sites as a module: name the file, myrewards/math_rw.py:score"
    )
    assert load_reward("myrewards/math_rw.py:score", rewards_dir)("d", "s", "g") == 0.75
    monkeypatch.setattr(sys, "path", [*sys.path, str(rewards_dir)])  # installed (on the path): loaded as a module
    try:
        assert load_reward("myrewards.math_rw:score", rewards_dir)("d", "s", "g") == 0.75
    finally:  # the import's modules are this test's: not 'installed' for a later test in the process (or its rerun)
        for name in ("myrewards.math_rw", "myrewards"):
            sys.modules.pop(name, None)


def test_a_reward_file_importing_its_own_package_is_told_what_to_do(rewards_dir: Path) -> None:
    # `from myrewards.helpers import norm` in myrewards/score.py said `No module named 'myrewards'` and no more: the
    # file's own directory is on the import path, not its package's parent
    (rewards_dir / "ownrewards").mkdir()
    (rewards_dir / "ownrewards" / "__init__.py").write_text("")
    (rewards_dir / "ownrewards" / "helpers.py").write_text("def norm(s):\n    return s.strip()\n")
    (rewards_dir / "ownrewards" / "score.py").write_text(
        "from ownrewards.helpers import norm\n\n\ndef f(data_source, solution_str, ground_truth):\n    return 1.0\n"
    )
    with pytest.raises(ValueError) as e:
        load_reward("ownrewards/score.py:f", rewards_dir)
    assert str(e.value) == (
        "ownrewards/score.py: cannot import: ModuleNotFoundError: No module named 'ownrewards'; ownrewards/ holds "
        "the file, and is no module here: a reward file is loaded by its path, with its own directory on the import "
        "path, not ownrewards/'s parent; import the modules beside it by their own names (from helpers import …: "
        "the launch copies them with it), or install ownrewards and name the function by its module, "
        "ownrewards.score:f"
    )
    (rewards_dir / "ownrewards" / "score.py").write_text(
        "from no_such_pkg_xyz import norm\n\n\ndef f(data_source, solution_str, ground_truth):\n    return 1.0\n"
    )
    with pytest.raises(ValueError) as e:  # a module missing that is no package of the file's: as it was
        load_reward("ownrewards/score.py:f", rewards_dir)
    assert str(e.value).endswith("ModuleNotFoundError: No module named 'no_such_pkg_xyz'")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("exact", "unknown built-in reward 'exact'; built-ins: digits, exact_match, gsm8k, math"),
        ("rewards/nope.py:f", "rewards/nope.py: no such file"),
        ("rewards/mine.py:compute_scor", "no function 'compute_scor' (did you mean 'compute_score'?)"),
        ("rewards/mine.py:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is not a function: it is of type int"),
        ("rewards/mine.py:too_few", "rewards/mine.py:too_few(solution_str): cannot be called as compute_score("),
        ("no_such_pkg_xyz.mod:f", "no module named 'no_such_pkg_xyz'"),
        ("rewards/syntax.py:f", "rewards/syntax.py: cannot import: SyntaxError"),
        ("rewards/empty.py:compute_score", "rewards/empty.py: no function 'compute_score'; it defines no functions"),
        # its own functions only: `from typing import Any` was listed as "defined: Any, compute_score"
        ("rewards/typed.py:score", "rewards/typed.py: no function 'score'; defined: compute_score"),
    ],
)
def test_load_errors_are_one_line(rewards_dir: Path, monkeypatch: pytest.MonkeyPatch, spec: str, message: str) -> None:
    (rewards_dir / "rewards" / "syntax.py").write_text("def f(:\n")
    (rewards_dir / "rewards" / "empty.py").write_text("SCALE = 2\n")
    (rewards_dir / "rewards" / "typed.py").write_text(
        "from typing import Any\nfrom os.path import join\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> Any:\n    return 1.0\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ValueError) as e:
        load_reward(spec, rewards_dir)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_missing_reward_file_says_relative_to_the_job_file_only_where_written_relative(rewards_dir: Path) -> None:
    """A reward path written absolute is read as written: its line said "(relative paths are relative to the job
    file)" of it too. One rule now, `textutil.job_relative`, as task.path's and evaluation.path's lines say it."""
    absolute = rewards_dir / "rewards" / "nope.py"
    with pytest.raises(ValueError) as e:
        load_reward(f"{absolute}:f", rewards_dir)
    assert str(e.value) == f"{absolute}: no such file"
    with pytest.raises(ValueError) as e:
        load_reward("rewards/nope.py:f", rewards_dir)
    assert str(e.value) == "rewards/nope.py: no such file (relative to the job file)"


def test_a_missing_file_written_under_home_is_said_as_written_by_every_line(
    rewards_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~/…` is read from the home directory (load_job expands it), not relative to the job file: config/job.py's
    own rule said so of the inventory's and planning.profile's lines, `textutil.job_relative` said "(relative to the
    job file)" of it (the reward file's, task.path's, evaluation.path's lines). One rule now, `is_job_relative`."""
    from rlctl.config.job import load_job
    from rlctl.errors import ConfigError
    from rlctl.textutil import job_relative

    home = rewards_dir / "home"
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ValueError) as e:
        load_reward("~/missing.py:f", rewards_dir)
    assert str(e.value) == "~/missing.py: no such file"  # was: "... (relative to the job file)"
    assert (job_relative("~/missing"), job_relative("missing")) == ("", " (relative to the job file)")
    from tests.unit.config.test_config_errors import JOB

    job = rewards_dir / "job.yaml"
    job.write_text(JOB.replace("[inv.yaml]", "[~/missing.yaml]"))
    with pytest.raises(ConfigError) as c:
        load_job(job)
    assert str(c.value) == f"{job}: inventory[0]: no such file {str(home / 'missing.yaml')!r}"  # the same rule


def test_a_hand_edited_job_jsons_reward_under_home_is_read_from_the_home(
    rewards_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """job.json's task.reward reaches the agents as written there (`JobDir.read_job`): a hand edit's `~/…` is read
    from the home directory by `load_reward` itself (`home_expanded`, load_job's rule), not from the job dir."""
    import json

    from rlctl.launch.jobdir import JobDir
    from tests.unit.controller_harness import small_job

    home = rewards_dir / "home"
    (home / "rw").mkdir(parents=True)
    (home / "rw" / "mine.py").write_text("def f(data_source, solution_str, ground_truth):\n    return 0.25\n")
    monkeypatch.setenv("HOME", str(home))
    jd = JobDir.create("kt", explicit=rewards_dir / "job")
    jd.write_job(small_job("kt", iterations=2), source="kt")
    data = json.loads(jd.job_json.read_text())
    data["job"]["task"] = {"kind": "dataset", "path": "data/train.jsonl", "reward": "~/rw/mine.py:f"}  # by hand
    jd.job_json.write_text(json.dumps(data))
    task = jd.read_job().task
    assert isinstance(task, DatasetTask) and task.reward == "~/rw/mine.py:f"  # unexpanded
    assert load_reward(task.reward, jd.path)("d", "s", "g") == 0.25


def test_a_reward_under_a_home_that_is_not_here_is_said_so_not_read_from_a_folder_beside(rewards_dir: Path) -> None:
    """`~nosuchuser/r.py:f` (a home this machine does not know) is refused naming it, as load_job refuses it;
    before, os.path left it as written and the file of a folder named `~nosuchuser` in the job dir was loaded."""
    (rewards_dir / "~rlctl-no-such-user").mkdir()
    (rewards_dir / "~rlctl-no-such-user" / "r.py").write_text(
        "def f(data_source, solution_str, ground_truth):\n    return 1.0\n"
    )
    with pytest.raises(ValueError) as e:
        load_reward("~rlctl-no-such-user/r.py:f", rewards_dir)
    assert str(e.value) == ("~rlctl-no-such-user/r.py: ~rlctl-no-such-user is no home directory here (no such user)")


def _reward_in_three_files(d: Path) -> Path:
    """uses.py imports a module and a package beside it (one inside a function), the package a third module."""
    d.mkdir(parents=True)
    (d / "rlctl_helper_zz.py").write_text("import json\n\ndef norm(s):\n    return s.split()\n")
    (d / "rlctl_pkg_zz").mkdir()
    (d / "rlctl_pkg_zz" / "__init__.py").write_text("from rlctl_pkg_zz.inner import SCALE\n")
    (d / "rlctl_pkg_zz" / "inner.py").write_text("from rlctl_deep_zz import BASE\n\nSCALE = 2 * BASE\n")
    (d / "rlctl_pkg_zz" / "__pycache__").mkdir()
    (d / "rlctl_pkg_zz" / "__pycache__" / "inner.cpython-311.pyc").write_bytes(b"stale")
    (d / "rlctl_deep_zz.py").write_text("BASE = 1.5\n")
    (d / "unrelated.py").write_text("X = 1\n")
    (d / "uses.py").write_text(
        "import os.path\nfrom rlctl_helper_zz import norm\n\n"
        "def f(data_source, solution_str, ground_truth):\n"
        "    import rlctl_pkg_zz\n"
        "    return rlctl_pkg_zz.SCALE * len(norm(solution_str))\n"
    )
    return d / "uses.py"


def test_a_reward_file_in_several_files_names_the_modules_beside_it_that_it_imports(tmp_path: Path) -> None:
    uses = _reward_in_three_files(tmp_path / "rewards")
    # transitively, a package as its directory; not os (the standard library's), not unrelated.py
    assert local_modules(uses) == [Path("rlctl_deep_zz.py"), Path("rlctl_helper_zz.py"), Path("rlctl_pkg_zz")]
    (tmp_path / "rewards" / "broken.py").write_text("def f(:\n")
    assert local_modules(tmp_path / "rewards" / "broken.py") == []  # loading it says what is wrong


def test_a_package_and_a_module_of_one_name_beside_a_reward_file_name_the_package(tmp_path: Path) -> None:
    """Before: helper.py was named, though `import helper` imports the package helper/ beside it: the job's copy
    then ran helper.py's code, which check never loaded."""
    (tmp_path / "helper").mkdir()
    (tmp_path / "helper" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "helper.py").write_text("X = 2\n")
    (tmp_path / "r.py").write_text("import helper\n")
    assert local_modules(tmp_path / "r.py") == [Path("helper")]


def test_a_package_named_as_the_reward_file_is_copied_with_it(tmp_path: Path) -> None:
    """Before: score.py's `from score.impl import X` was taken for an import of itself, so the package score/ beside
    it, which that import loads (check passed), was left out, and the job's copy failed ('score' is not a package).
    """
    (tmp_path / "score").mkdir()
    (tmp_path / "score" / "__init__.py").write_text("")
    (tmp_path / "score" / "impl.py").write_text("X = 1\n")
    (tmp_path / "score.py").write_text("from score.impl import X\n")
    assert local_modules(tmp_path / "score.py") == [Path("score")]
    (tmp_path / "other.py").write_text("import other\n")  # a file's import of itself copies nothing more
    assert local_modules(tmp_path / "other.py") == []


def test_a_namespace_package_beside_a_reward_file_is_copied_with_it(tmp_path: Path) -> None:
    """Before: a package without an __init__.py (a namespace package) was not named, so check loaded the reward
    (its import finds the directory) and every site's copy of the job failed at its start ('No module named')."""
    from rlctl.ops.inputs import copy_reward

    (tmp_path / "src" / "rlctl_ns_zz").mkdir(parents=True)
    (tmp_path / "src" / "rlctl_ns_zz" / "grade.py").write_text("SCORE = 4.0\n")
    (tmp_path / "src" / "pytest").mkdir()  # installed: `import pytest` takes that one, not this directory
    (tmp_path / "src" / "pytest" / "x.py").write_text("")
    (tmp_path / "src" / "data").mkdir()  # no Python in it: no package
    (tmp_path / "src" / "r.py").write_text(
        "import data, pytest\nfrom rlctl_ns_zz.grade import SCORE\n\n"
        "def f(data_source, solution_str, ground_truth):\n    return SCORE\n"
    )
    assert local_modules(tmp_path / "src" / "r.py") == [Path("rlctl_ns_zz")]
    (tmp_path / "job").mkdir()
    copy_reward(tmp_path / "src" / "r.py", tmp_path / "job" / "reward")
    assert (tmp_path / "job" / "reward" / "rlctl_ns_zz" / "grade.py").is_file()


def test_a_reward_file_in_the_job_dirs_own_reward_dir_is_refused_not_deleted(tmp_path: Path) -> None:
    """A launch into the job file's own directory (`--job-dir .`, no job there yet) whose reward lies in its reward/:
    the copy's replacement of reward/ deleted the user's reward file and its modules, then failed on the file gone
    (FileNotFoundError)."""
    from rlctl.errors import ConfigError
    from rlctl.ops.inputs import copy_reward

    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "score.py").write_text("def f(data_source, solution_str, ground_truth):\n    return 1\n")
    with pytest.raises(ConfigError, match="lies in the job directory's reward/"):
        copy_reward((tmp_path / "reward" / "score.py").resolve(), tmp_path / "reward")
    assert (tmp_path / "reward" / "score.py").is_file()


def test_a_package_the_reward_imports_named_as_the_job_dirs_reward_dir_is_refused_not_deleted(tmp_path: Path) -> None:
    """A launch into the job file's own directory (`--job-dir .`) whose reward file, score.py beside the job file,
    imports a package of its own named `reward` there: the check named only the reward file, and the copy's
    replacement of the job dir's reward/ deleted the user's package, then failed on it gone."""
    from rlctl.ops.inputs import copy_reward

    (tmp_path / "reward").mkdir()
    (tmp_path / "reward" / "__init__.py").write_text("SCORE = 1.0\n")
    (tmp_path / "score.py").write_text(
        "from reward import SCORE\n\ndef f(data_source, solution_str, ground_truth):\n    return SCORE\n"
    )
    with pytest.raises(ConfigError, match=r"reward, which the reward file .*score\.py imports, lies in the job"):
        copy_reward(tmp_path / "score.py", tmp_path / "reward")
    assert (tmp_path / "reward" / "__init__.py").read_text() == "SCORE = 1.0\n"


def test_a_reward_dir_of_the_users_in_the_dir_launched_into_is_refused_not_deleted(tmp_path: Path) -> None:
    """A launch into a directory that is no job's but holds a reward/ of its own (unrelated to the job's reward):
    the copy's replacement of reward/ deleted it."""
    from rlctl.ops.inputs import copy_reward

    (tmp_path / "score.py").write_text("def f(data_source, solution_str, ground_truth):\n    return 1\n")
    (tmp_path / "run" / "reward").mkdir(parents=True)
    (tmp_path / "run" / "reward" / "notes.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match=r"run/reward: holds notes\.txt, which rlctl did not copy there"):
        copy_reward(tmp_path / "score.py", tmp_path / "run" / "reward")
    assert [p.name for p in (tmp_path / "run" / "reward").iterdir()] == ["notes.txt"]
    (tmp_path / "run" / "reward" / "notes.txt").unlink()  # an empty one: nothing to lose
    copy_reward(tmp_path / "score.py", tmp_path / "run" / "reward")
    copy_reward(tmp_path / "score.py", tmp_path / "run" / "reward")  # a relaunch replaces its own copy
    assert (tmp_path / "run" / "reward" / "score.py").is_file()


def test_a_reward_file_that_cannot_be_read_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reward file the launch cannot read (another user's, mode 600): its copy into the job, moved out of the
    copy's one-line error when the packages beside it were measured, ended check, the launch and a resume's
    comparison in the OSError's traceback. Root reads any file: its read is refused here as the OS refuses it."""
    from rlctl.ops.inputs import copy_reward

    (tmp_path / "r.py").write_text("def f(data_source, solution_str, ground_truth):\n    return 1.0\n")
    copy2 = shutil.copy2

    def refused(src: object, dst: object, **kwargs: object) -> object:
        if Path(str(src)) == tmp_path / "r.py":
            raise PermissionError(13, "Permission denied", str(src))
        return copy2(src, dst, **kwargs)  # type: ignore[arg-type]

    (tmp_path / "job").mkdir()
    monkeypatch.setattr(shutil, "copy2", refused)
    with pytest.raises(ConfigError) as e:
        copy_reward(tmp_path / "r.py", tmp_path / "job" / "reward")
    assert str(e.value).startswith(f"{tmp_path / 'r.py'}: cannot copy the reward file into the job: Permission denied")


def test_a_reward_files_copy_in_the_job_loads_on_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: only the reward file was copied, so one importing a helper beside it was refused ("fold it in, or
    install it"). Now its modules come with it, and the copy loads in a fresh process far from the original."""
    from rlctl.ops.inputs import copy_reward

    uses = _reward_in_three_files(tmp_path / "rewards")
    job = tmp_path / "job" / "reward"
    job.parent.mkdir()
    copy_reward(uses, job)
    (tmp_path / "rewards" / "rlctl_pkg_zz" / "gone.py").write_text("X = 1\n")
    copy_reward(uses, job)
    (tmp_path / "rewards" / "rlctl_pkg_zz" / "gone.py").unlink()  # taken out of the package before a relaunch
    copy_reward(uses, job)
    assert sorted(str(p.relative_to(job)) for p in job.rglob("*") if p.is_file()) == [
        ".rlctl-copy", "rlctl_deep_zz.py", "rlctl_helper_zz.py", "rlctl_pkg_zz/__init__.py", "rlctl_pkg_zz/inner.py",
        "uses.py",
    ]  # fmt: skip
    shutil.rmtree(tmp_path / "rewards")  # the job's copy alone, as on a remote site
    code = "from pathlib import Path; from rlctl.rl.reward import load_reward; print(load_reward(" \
        "'reward/uses.py:f', Path('.'))('d', 'a b c', ''))"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=job.parent, capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "9.0"), out.stderr
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading puts the file's directory first
    assert load_reward("reward/uses.py:f", job.parent)("d", "a b", "") == 6.0  # in this process too


def test_a_linked_reward_file_loads_with_the_modules_beside_its_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a reward file that is a link loaded the modules beside the link, while the launch copied those beside
    its target (`copy_reward` of the resolved file): `check` refused a reward whose job's copy loads, and passed one
    whose copy would not."""
    from rlctl.ops.inputs import copy_reward

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "rlctl_linked_zz.py").write_text("SCORE = 3.0\n")
    (tmp_path / "lib" / "r.py").write_text("from rlctl_linked_zz import SCORE\n\ndef f(data_source, solution_str, "
                                           "ground_truth):\n    return SCORE\n")  # fmt: skip
    (tmp_path / "job" / "rewards").mkdir(parents=True)
    (tmp_path / "job" / "rewards" / "r.py").symlink_to(tmp_path / "lib" / "r.py")
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading puts the file's directory first
    monkeypatch.delitem(sys.modules, "rlctl_linked_zz", raising=False)
    assert load_reward("rewards/r.py:f", tmp_path / "job")("d", "a b", "") == 3.0
    copy_reward((tmp_path / "job" / "rewards" / "r.py").resolve(), tmp_path / "copy")  # as copy_inputs does
    assert (tmp_path / "copy" / "rlctl_linked_zz.py").is_file()
    sys.modules.pop("rlctl_linked_zz", None)


def test_a_reward_link_named_otherwise_than_its_target_is_copied_under_the_name_the_job_gives(
    tmp_path: Path,
) -> None:
    """`task.reward: rewards/score.py:f`, a link to lib/impl.py: the launch rewrites it to reward/score.py:f
    (`resolve_inputs`), but its copy was named as the target (reward/impl.py), which no site's agent then found."""
    from rlctl.ops.inputs import copy_reward

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "rlctl_linked2_zz.py").write_text("SCORE = 3.0\n")
    (tmp_path / "lib" / "impl.py").write_text("from rlctl_linked2_zz import SCORE\n")
    (tmp_path / "job" / "rewards").mkdir(parents=True)
    (tmp_path / "job" / "rewards" / "score.py").symlink_to(tmp_path / "lib" / "impl.py")
    copy_reward(tmp_path / "job" / "rewards" / "score.py", tmp_path / "copy")  # as copy_inputs names it
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == [".rlctl-copy", "rlctl_linked2_zz.py", "score.py"]
    assert not (tmp_path / "copy" / "score.py").is_symlink()


def test_inline_pool_scores_and_counts(rewards_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    pool = RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=0, on_error=-1)
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_pool")
    assert pool.score("s0", "d", "a", "a") == RewardResult(1.0)
    assert pool.score("s1", "d", "extra", "a", {"bonus": 3}).score == 3.0
    bad = pool.score("s2", "d", "raise", "a")
    assert (bad.score, bad.outcome) == (-1.0, "error") and "KeyError: 'boom' (mine.py:" in str(bad.error)
    assert pool.score("s3", "d", "str", "a").outcome == "bad_type"
    assert (pool.stats.calls, pool.stats.errors, pool.stats.bad_type, pool.stats.timeouts) == (4, 1, 1, 0)
    assert [r.message.split(":")[0] for r in caplog.records] == ["reward error", "reward bad_type"]
    assert "sample s2" in caplog.records[0].getMessage()
    pool.close()


def test_a_failed_call_names_the_row_of_the_user_s_file_and_the_first_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # it named the sample by its place in the data stream alone (`sample p1/0`), which no user can find in their
    # file, and the summary kept only counts
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_pool")
    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    rows = [{"prompt": f"what is {i} + 1 ?", "ground_truth": str(i + 1), "extra_info": {"i": i}} for i in range(3)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    (tmp_path / "r.py").write_text(
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if extra_info['i'] == 1:\n        raise KeyError('boom')\n    return None if extra_info['i'] else 1.0\n"
    )
    cfg = DatasetTask.model_validate(
        {"kind": "dataset", "path": "train.jsonl", "reward": "r.py:f", "reward_workers": 0, "shuffle": False}
    )
    prepare_dataset(cfg, data_path=tmp_path / "train.jsonl", tokenizer=tok, out_dir=tmp_path / "data")
    src = DatasetSource(cfg, tmp_path, tmp_path / "model", scoring=True)
    try:
        scores = [src.score(f"p{k}/0", f"p{k}", [5]).result() for k in range(3)]
        assert scores == [1.0, 0.0, 0.0]
        stats = src.reward_stats()
        assert stats.first_failure == "error: sample p1/0 (train.jsonl line 2): KeyError: 'boom' (r.py:3)"
        assert [r.getMessage() for r in caplog.records] == [
            "reward error: sample p1/0 (train.jsonl line 2): KeyError: 'boom' (r.py:3); scored 0.0",
            "reward bad_type: sample p2/0 (train.jsonl line 3): expected a finite number or a dict with 'score', "
            "got None; scored 0.0",
        ]
    finally:
        src.close()


def test_three_argument_functions_get_no_extra_info(rewards_dir: Path) -> None:
    with RewardPool("rewards/mine.py:three_args", base_dir=rewards_dir, workers=1) as pool:
        assert pool.score("s", "d", "x", "y", {"k": 1}) == RewardResult(2.0)


def test_worker_pool_survives_exceptions_hangs_and_deaths(rewards_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_pool")
    # one deadline for every call (the pool has no other): 5 s, which the hanging calls wait out, so that an
    # ordinary call's worker run late on a loaded machine is not a timeout (at 1 s, one 1 s late was)
    with RewardPool(
        "rewards/mine.py:compute_score", base_dir=rewards_dir, workers=2, timeout_s=5.0, on_error=-1.0
    ) as pool:
        inputs = ["a", "hang", "raise", "str", "dict", "die", "b", "hang", "a", "extra"]
        futures = [
            pool.submit(f"s{i}", "src", s, "a", {"bonus": 4}) for i, s in enumerate(inputs)
        ]  # returns at once, even with both workers stuck
        results = [f.result(timeout=60) for f in futures]
        assert [r.outcome for r in results] == [
            "ok",
            "timeout",
            "error",
            "bad_type",
            "ok",
            "died",
            "ok",
            "timeout",
            "ok",
            "ok",
        ]  # fmt: skip  (a worker's death was an "error", said "raised" as an exception in the user's function)
        assert [r.score for r in results] == [1.0, -1.0, -1.0, -1.0, 0.5, -1.0, 0.0, -1.0, 1.0, 4.0]
        assert results[4].extra == {"acc": 1.0, "format": 1.0}
        assert results[5].error == "reward worker died (exit code 3)"
        s = pool.stats
        assert (s.calls, s.errors, s.timeouts, s.bad_type, s.died, s.restarts) == (10, 1, 2, 1, 1, 3)
        assert s.failures == 5
        assert pool.score("after", "src", "a", "a").ok  # the replaced workers answer
    said = [r.getMessage() for r in caplog.records]
    left_out = [m for m in said if "beside 'score'" in m]  # the dict's "note", no number: said once
    assert left_out == [
        "reward rewards/mine.py:compute_score returned 'note' beside 'score' (sample s4): left out of its figures "
        "(reward_extra/<key>): its value is no finite number ('kept out: not a number'); said once a key"
    ]
    failed = sorted(m.split(":")[1].strip() for m in said if m not in left_out)
    assert failed == ["sample s1", "sample s2", "sample s3", "sample s5", "sample s7"]


def test_submit_from_another_thread_and_close_cancels(rewards_dir: Path) -> None:
    pool = RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=60.0)
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(pool.score("t", "d", "a", "a").score))
    t.start()
    t.join()
    assert out == [1.0]
    stuck = pool.submit("stuck", "d", "hang", "a")
    queued = pool.submit("queued", "d", "a", "a")
    pool.close()
    assert stuck.cancelled() and queued.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit("late", "d", "a", "a")


def test_broken_spec_fails_in_the_caller_or_the_first_start(tmp_path: Path) -> None:
    """In-line, the caller loads the function: a broken one raises there. With workers, the caller imports no user
    module (an import that hangs there could not be bounded): the first start's failure fails the pool."""
    (tmp_path / "r.py").write_text("raise ImportError('needs sympy')\n")
    with pytest.raises(ValueError, match=r"r\.py: cannot import: ImportError: needs sympy"):
        RewardPool("r.py:f", base_dir=tmp_path, workers=0)
    with pytest.raises(ValueError, match=r"unknown built-in reward 'exact'"):  # a built-in's name: no user code
        RewardPool("exact", base_dir=tmp_path, workers=1)
    with RewardPool("r.py:f", base_dir=tmp_path, workers=1) as pool:
        with pytest.raises(CancelledError):
            pool.score("s0", "d", "a", "a")
        assert pool.failed == "a reward worker cannot load r.py:f: r.py: cannot import: ImportError: needs sympy"


def test_a_hung_call_holds_only_its_own_worker(rewards_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker, a call that hangs, then three ordinary calls: past the stuck limit (0.5 s here) a second
    worker starts and answers them long before the hung call's deadline; once nothing waits, it stops again."""
    monkeypatch.setattr(reward_pool, "STUCK_FRACTION", 0.05)  # 0.5 s of the 10 s timeout: room to start a worker
    with RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=10.0) as pool:
        assert pool.stuck_s == 0.5
        assert pool.score("warm", "d", "a", "a").ok  # the first worker is up
        hung = pool.submit("hung", "d", "hang", "a")
        rest = [pool.submit(f"s{i}", "d", "a", "a") for i in range(3)]
        assert [f.result(timeout=8.0).score for f in rest] == [1.0, 1.0, 1.0]
        assert not hung.done()  # answered while the hung call still runs
        assert pool.stats.extra_started == 1
        deadline = time.monotonic() + 5.0
        while len(pool._workers) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(pool._workers) == 1  # the extra worker stopped: the pool is back to its size
        assert hung.result(timeout=10.0).outcome == "timeout"


def _wait_held(pool: RewardPool, sample_id: str) -> None:
    """Wait until a worker runs `sample_id`'s call (the dispatcher sent it there): a cancel then replaces that
    worker, where before it only takes the call out of the queue."""
    deadline = time.monotonic() + 30.0
    while not any(w.call is not None and w.call.sample_id == sample_id for w in list(pool._workers)):
        assert time.monotonic() < deadline, f"no worker took {sample_id}'s call within 30 s"
        time.sleep(0.01)


def test_a_cancelled_call_frees_its_worker_at_once(rewards_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker running a call that hangs and one call queued behind it: cancelling both drops the queued one
    and replaces the worker now (a restart, not a timeout at the 30 s deadline), so the next call is answered."""
    monkeypatch.setattr(reward_pool, "STUCK_FRACTION", 1.0)  # no extra worker takes the queued call (at 3 s: a stall)
    with RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=30.0) as pool:
        assert pool.score("warm", "d", "a", "a").ok
        hung = pool.submit("hung", "d", "hang", "a")
        queued = pool.submit("queued", "d", "a", "a")
        _wait_held(pool, "hung")
        pool.cancel("queued")
        pool.cancel("hung")
        assert pool.score("next", "d", "a", "a").score == 1.0
        assert hung.cancelled() and queued.cancelled()
        assert pool.stats.cancelled == 2 and pool.stats.restarts == 1 and pool.stats.timeouts == 0
        assert pool.stats.extra_started == 0
        pool.cancel("next")  # finished already: nothing happens
        assert pool.stats.cancelled == 2 and pool.stats.restarts == 1


def test_a_cancel_spares_the_same_sample_submitted_after_it(rewards_dir: Path) -> None:
    """The controller cancels a sample's hung call and its group is generated again: the new call for the same
    sample id, submitted before the dispatcher got to the cancel, is answered (it once was dropped with the old
    one, and the job waited for its reward for ever). The dispatcher is held at the cancel's door meanwhile."""
    with RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=30.0) as pool:
        assert pool.score("warm", "d", "a", "a").ok
        old = pool.submit("p7/0", "d", "hang", "a")
        _wait_held(pool, "p7/0")  # the old call is running
        entered, go = threading.Event(), threading.Event()
        drop = pool._drop_cancelled

        def held() -> None:
            if pool._cancels and not go.is_set():
                entered.set()
                go.wait(10.0)
            drop()

        pool._drop_cancelled = held  # type: ignore[method-assign]
        pool.cancel("p7/0")
        assert entered.wait(10.0)
        new = pool.submit("p7/0", "d", "a", "a")  # generated again, in before the cancel is carried out
        go.set()
        assert new.result(timeout=10.0).score == 1.0
        assert old.cancelled() and pool.stats.cancelled == 1 and pool.stats.restarts == 1 and pool.stats.timeouts == 0


def _alive(pid: int) -> bool:
    """`pid` runs (a zombie has ended: its parent, init here, has not reaped it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _still_alive(pids: list[int]) -> list[int]:
    """Those of `pids` alive 10 s from now at the latest (a SIGKILL takes effect soon after it is sent)."""
    deadline = time.monotonic() + 10.0
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _pids(file: Path) -> list[int]:
    deadline = time.monotonic() + 30.0
    while not file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(p) for p in file.read_text().split()]


linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


@linux_only
def test_a_timed_out_call_takes_its_child_programs_with_it(rewards_dir: Path) -> None:
    """A reward starts `sleep 600` twice (one in a session of its own, as sandboxes do) and hangs: past its
    timeout its worker is killed, and both children with it (they once ran on, orphaned, one per timed-out call)."""
    with RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=3.0) as pool:
        pids = rewards_dir / "pids"
        assert pool.score("s0", "d", "spawn", "a", {"pids": str(pids)}).outcome == "timeout"
        children = _pids(pids)
        assert len(children) == 2
        assert _still_alive(children) == []
        assert pool.score("s1", "d", "a", "a").ok  # the replacement answers


@linux_only
def test_close_takes_the_programs_a_finished_call_left_running(rewards_dir: Path) -> None:
    """At close, the programs a finished call left running (one in a session of its own) are killed too."""
    pool = RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=60.0)
    assert pool.score("s0", "d", "spawn_and_return", "a", {"pids": str(rewards_dir / "left")}).ok
    children = _pids(rewards_dir / "left")
    assert len(children) == 2
    pool.close()  # its worker is idle
    assert _still_alive(children) == []


@linux_only
def test_close_takes_a_running_call_s_child_programs_with_it(rewards_dir: Path) -> None:
    """… and those of a call still running, and those a call before it left running."""
    pool = RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=60.0)
    assert pool.score("s0", "d", "spawn_and_return", "a", {"pids": str(rewards_dir / "left")}).ok
    running = pool.submit("s1", "d", "spawn", "a", {"pids": str(rewards_dir / "running")})
    children = _pids(rewards_dir / "left") + _pids(rewards_dir / "running")
    assert len(children) == 4
    pool.close()
    assert running.cancelled()
    assert _still_alive(children) == []


OWNER = """
import sys, time
from pathlib import Path
from rlctl.rl.reward_pool import RewardPool

pool = RewardPool("rewards/mine.py:compute_score", base_dir=Path(sys.argv[1]), workers=1, timeout_s=600.0)
pool.submit("s0", "d", sys.argv[3], "a", {"pids": sys.argv[2], "marker": sys.argv[4]})
while not Path(sys.argv[2]).exists():
    time.sleep(0.05)
print(pool._workers[0].proc.pid, flush=True)
time.sleep(600)
"""


@linux_only
def test_a_worker_and_its_calls_programs_die_with_the_process_that_started_the_pool(rewards_dir: Path) -> None:
    """The controller killed without closing its pool (after its stop's grace, by the OOM killer): its workers lead
    groups of their own, out of reach of the backend's kill of the agent's group, so each kills its own group — its
    hung call and the programs that call started — once the process that started it is gone."""
    import subprocess

    pids = rewards_dir / "pids"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(rewards_dir), str(pids), "spawn", "-"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        worker = int(owner.stdout.readline())
        in_its_group = _pids(pids)[0]  # the other started a session of its own: out of any group's reach
        assert _alive(worker) and _alive(in_its_group)
    finally:
        owner.kill()
        owner.wait()
    assert _still_alive([worker, in_its_group]) == []
    for pid in _pids(pids)[1:]:  # the test's own cleanup
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


FLAKY_FILE = """
from pathlib import Path

HERE = Path(__file__).parent
if (HERE / "flag").exists():  # import-time work that can fail for a while: shared storage not answering
    (HERE / "failed").touch()
    raise OSError("shared filesystem not answering")

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "die":
        import os
        os._exit(3)
    return float(solution_str == ground_truth)
"""
# The tests below need a worker replaced: a call that kills its worker has it replaced at once, whatever the
# calls' deadline, so that deadline can be long (30 s) — a call that hung until a deadline short enough to wait out
# (1 s) bound the ordinary calls too, and an ordinary call's worker run 1 s late on a loaded machine was a timeout.


def _loaded_then_bound(pool: RewardPool, *, load_retry_s: float) -> None:
    """The pool's first start loads the function within the pool's floor for a start (made with LOAD_RETRY_MIN_S),
    and then the starts after it, and the pool's wait on them, get `load_retry_s`: a bound short enough to wait out
    was the first start's deadline too, and a first import that took longer on a loaded machine failed the pool
    (a config error: its calls cancelled) before the test began."""
    assert pool.score("s0", "d", "a", "a").ok
    pool.load_retry_s = load_retry_s


def _break_the_worker_s_next_load(pool: RewardPool, tmp_path: Path) -> None:
    """The function loads no more; a call that kills its worker has it replaced, and the replacement's start fails."""
    (tmp_path / "flag").touch()
    assert pool.score("gone", "d", "die", "a").outcome == "died"
    deadline = time.monotonic() + 30.0
    while not (tmp_path / "failed").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "failed").exists()


def test_a_worker_that_failed_to_load_starts_again_and_scores(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A replacement's start fails (a transient import error) and the failure passes: the worker starts again
    after its backoff and the calls are scored (they once all scored `on_error` for the rest of the job)."""
    caplog.set_level(logging.ERROR, logger="rlctl.rl.reward_pool")
    (tmp_path / "flaky.py").write_text(FLAKY_FILE)
    with RewardPool("flaky.py:compute_score", base_dir=tmp_path, workers=1, timeout_s=30.0, on_error=-1.0) as pool:
        assert pool.score("s0", "d", "a", "a").ok
        _break_the_worker_s_next_load(pool, tmp_path)
        (tmp_path / "flag").unlink()  # the hiccup is over
        assert pool.score("s1", "d", "a", "a") == RewardResult(1.0)
        assert pool.failed is None and pool.stats.load_failures >= 1 and pool.stats.errors == 0
    assert "OSError: shared filesystem not answering; starting it again in 1 s" in caplog.text


def test_workers_that_stay_unable_to_load_fail_the_pool(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The failure does not pass: past `load_retry_s` the pool fails, saying why, and cancels its calls, those
    waiting and those to come (the controller fails the job with it) instead of scoring them `on_error`."""
    caplog.set_level(logging.ERROR, logger="rlctl.rl.reward_pool")
    (tmp_path / "flaky.py").write_text(FLAKY_FILE)
    first_s = reward_pool.LOAD_RETRY_MIN_S
    with RewardPool(
        "flaky.py:compute_score", base_dir=tmp_path, workers=1, timeout_s=30.0, on_error=-1.0, load_retry_s=first_s
    ) as pool:
        _loaded_then_bound(pool, load_retry_s=3.0)
        _break_the_worker_s_next_load(pool, tmp_path)
        waiting = pool.submit("s1", "d", "a", "a")
        with pytest.raises(CancelledError):  # (a cancel does not wake concurrent.futures.wait: result() it is)
            waiting.result(timeout=30.0)
        assert pool.failed is not None
        assert pool.failed.startswith("no reward worker could load flaky.py:compute_score for ")
        assert pool.failed.endswith("the last error: flaky.py: cannot import: OSError: shared filesystem not answering")
        assert pool.submit("s2", "d", "a", "a").cancelled()  # a call after it: cancelled at once
        assert pool.stats.errors == 0
    assert "reward pool failed: no reward worker could load" in caplog.text


def test_a_function_no_worker_of_the_first_start_can_load_fails_the_pool(tmp_path: Path) -> None:
    """A function that loads in the caller but not in a worker process: a config error, the pool fails at once
    (no retries) and its calls are cancelled (they once all scored `on_error`)."""
    (tmp_path / "r.py").write_text(
        "import multiprocessing\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    raise ImportError('only in the caller')\n"
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0\n"
    )
    with RewardPool("r.py:f", base_dir=tmp_path, workers=1, timeout_s=30.0) as pool:
        call = pool.submit("s0", "d", "a", "a")
        with pytest.raises(CancelledError):
            call.result(timeout=30.0)
        assert pool.failed == "a reward worker cannot load r.py:f: r.py: cannot import: ImportError: only in the caller"
        assert pool.stats.load_failures == 1


@pytest.mark.timeout(60)
def test_the_controllers_source_refuses_a_reward_no_worker_can_load_as_it_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's task source waits for its pool's first start: a module that raises at import, or whose
    import outlasts the pool's deadline for a start (here 1 s), is a config error there, in one line naming the
    function and why — before any prompt is dispatched (the job once ran until its first sample's reward was
    cancelled). A function that loads is scored as before."""
    caplog.set_level(logging.ERROR, logger="rlctl.rl.reward_pool")
    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "what is 1 + 2 ?", "ground_truth": "3"}])
    (tmp_path / "bad.py").write_text("raise ImportError('needs sympy')\n")
    (tmp_path / "hang.py").write_text("import threading\nthreading.Event().wait()\n")
    (tmp_path / "ok.py").write_text(
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )

    def source(spec: str) -> DatasetSource:
        cfg = DatasetTask.model_validate(
            {"kind": "dataset", "path": "train.jsonl", "reward": spec, "reward_workers": 1, "reward_timeout_s": 0.1}
        )
        prepare_dataset(cfg, data_path=tmp_path / "train.jsonl", tokenizer=tok, out_dir=tmp_path / "data")
        return DatasetSource(cfg, tmp_path, tmp_path / "model", scoring=True)

    with pytest.raises(ConfigError) as e:
        source("bad.py:f")
    assert str(e.value) == "job.json: task.reward: bad.py: cannot import: ImportError: needs sympy"
    monkeypatch.setattr(reward_pool, "LOAD_RETRY_MIN_S", 1.0)  # the pool's deadline: max(this, 6 × reward_timeout_s)
    with pytest.raises(ConfigError) as e:
        source("hang.py:f")
    assert str(e.value) == (
        "job.json: task.reward: hang.py:f: it did not finish loading within 1 s (6 × reward_timeout_s, at least 1 s; "
        "a longer load: set task.reward_load_timeout_s)"
    )
    assert "reward pool failed" not in caplog.text  # the one line is the config error's
    monkeypatch.setattr(reward_pool, "LOAD_RETRY_MIN_S", 60.0)  # a loaded machine may take over 1 s to start a worker
    ok = source("ok.py:f")
    try:
        assert ok.reward_failure() is None
        assert ok.score("s0", ok.rl_prompts(0, 1)[0].prompt_id, [1]).result(timeout=30.0) == 1.0
    finally:
        ok.close()


def _named(marker: str) -> list[int]:
    """The live processes whose argv[0] is `marker`."""
    found = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if name.isdigit() and Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")[0] == marker.encode():
                found.append(int(name))
    return [p for p in found if _alive(p)]


@linux_only
@pytest.mark.parametrize("when", ["timeout", "close"])
def test_a_double_forked_daemon_dies_with_its_worker(rewards_dir: Path, when: str) -> None:
    """A reward starts `setsid … &` from a shell that exits at once: a daemon outside the worker's group and session
    whose parent is gone (it once went to init, out of every kill's reach, one per call). Its worker adopts it
    (a subreaper), so the worker's timeout kills it, and so does the pool's close when the call returned."""
    marker = f"rlctl-test-daemon-{os.getpid()}-{time.monotonic_ns()}"
    pids = rewards_dir / "pids"
    extra = {"marker": marker, "pids": str(pids)}
    try:
        with RewardPool("rewards/mine.py:compute_score", base_dir=rewards_dir, workers=1, timeout_s=5.0) as pool:
            if when == "timeout":
                assert pool.score("s0", "d", "daemon", "a", extra).outcome == "timeout"
                assert _pids(pids) and _still_alive(_pids(pids)) == [] and _named(marker) == []
                assert pool.score("s1", "d", "a", "a").ok  # the replacement answers
            else:
                assert pool.score("s0", "d", "daemon_and_return", "a", extra).ok
                assert _named(marker) == _pids(pids)  # running on after the call returned
        assert _still_alive(_pids(pids)) == [] and _named(marker) == []
    finally:  # the test's own cleanup, should the daemon have escaped
        for pid in _named(marker):
            os.kill(pid, 9)


HANGING_FILE = """
import threading
from pathlib import Path

HERE = Path(__file__).parent
if (HERE / "hang").exists():  # an import that never ends: a network mount not answering, a lock never released
    (HERE / "loading").touch()
    threading.Event().wait()

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "die":
        import os
        os._exit(3)
    return float(solution_str == ground_truth)
"""


@pytest.mark.timeout(60)
def test_a_first_start_that_does_not_finish_loading_fails_the_pool(tmp_path: Path) -> None:
    """The module's import hangs at the pool's first start: past `load_retry_s` the pool fails, a config error
    naming the function, and its calls are cancelled (the pool, and the controller in it, once waited for ever)."""
    (tmp_path / "slow.py").write_text(HANGING_FILE)
    (tmp_path / "hang").touch()
    with RewardPool("slow.py:compute_score", base_dir=tmp_path, workers=1, timeout_s=1.0, load_retry_s=1.0) as pool:
        call = pool.submit("s0", "d", "a", "a")
        with pytest.raises(CancelledError):
            call.result(timeout=30.0)
        assert pool.failed == (
            "a reward worker cannot load slow.py:compute_score: it did not finish loading within 1 s "
            "(task.reward_load_timeout_s)"
        )
        assert pool.stats.load_failures == 1


@pytest.mark.parametrize(("passes", "load_retry_s"), [(True, 5.0), (False, 3.0)])
def test_a_replacement_that_does_not_finish_loading_is_a_failed_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, passes: bool, load_retry_s: float
) -> None:
    """A replacement's import hangs: past `load_retry_s` it is a failed start (killed, started again after its
    backoff); the calls are scored once the hang passes, and the pool fails once it has lasted `load_retry_s`
    (the replacement once held its slot for ever: the calls waited and no failure was counted). When it passes, the
    start after the backoff (1 s) loads within the 4 s left of `load_retry_s`."""
    caplog.set_level(logging.ERROR, logger="rlctl.rl.reward_pool")
    (tmp_path / "slow.py").write_text(HANGING_FILE)
    first_s = reward_pool.LOAD_RETRY_MIN_S
    with RewardPool(
        "slow.py:compute_score", base_dir=tmp_path, workers=1, timeout_s=30.0, on_error=-1.0, load_retry_s=first_s
    ) as pool:  # (30 s for the calls: the worker goes by a call that kills it, see _break_the_worker_s_next_load)
        _loaded_then_bound(pool, load_retry_s=load_retry_s)
        (tmp_path / "hang").touch()
        assert pool.score("gone", "d", "die", "a").outcome == "died"  # its replacement hangs loading
        waiting = pool.submit("s1", "d", "a", "a")
        deadline = time.monotonic() + 30.0
        if passes:  # the hang passes once the replacement hangs in its import (it hangs on): the next start loads
            # (passed after the failure was counted, it raced that start, 1 s later, with this thread's next look)
            while not (tmp_path / "loading").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            (tmp_path / "hang").unlink()
        while not pool.stats.load_failures and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.stats.load_failures >= 1  # the hung start counted as failed
        if passes:
            assert waiting.result(timeout=30.0) == RewardResult(1.0)
            assert pool.failed is None and pool.stats.errors == 0
        else:
            with pytest.raises(CancelledError):
                waiting.result(timeout=30.0)
            assert pool.failed is not None and pool.failed.startswith("no reward worker could load slow.py:")
            assert pool.failed.endswith(
                f"the last error: it did not finish loading within {load_retry_s:g} s (task.reward_load_timeout_s)"
            )
    assert (
        f"it did not finish loading within {load_retry_s:g} s (task.reward_load_timeout_s); starting it again in 1 s "
        "(1 failed start(s) in a row)" in caplog.text
    )


@linux_only
def test_a_double_forked_daemon_dies_with_the_process_that_started_the_pool(rewards_dir: Path) -> None:
    """… and so does a double-forked daemon its call started (adopted by the worker, in a session of its own)."""
    import subprocess

    marker = f"rlctl-test-daemon-{os.getpid()}-{time.monotonic_ns()}"
    pids = rewards_dir / "pids"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(rewards_dir), str(pids), "daemon", marker], stdout=subprocess.PIPE, text=True
    )
    try:
        try:
            assert owner.stdout is not None
            worker = int(owner.stdout.readline())
            assert _alive(worker) and _named(marker) == _pids(pids)
        finally:
            owner.kill()
            owner.wait()
        assert _still_alive([worker, *_pids(pids)]) == [] and _named(marker) == []
    finally:  # the test's own cleanup, should the daemon have escaped
        for pid in _named(marker):
            os.kill(pid, 9)


ORPHANING = """
import os, subprocess


def f(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "orphan":  # the shell exits at once: its sleep is the worker's orphan
        subprocess.run(["bash", "-c", "sleep 0.05 &"], check=True)
    return {"score": 1.0, "worker": os.getpid()}
"""


def _zombie_children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
            if name.isdigit() and fields[0] == "Z" and int(fields[1]) == pid:
                out.append(int(name))
    return out


@linux_only
def test_a_worker_reaps_the_orphans_it_adopted(tmp_path: Path) -> None:
    """A call whose shell leaves a `cmd &` behind gives its worker (their subreaper) an orphan; one per call, their
    zombies would pile up in a worker that lives for weeks until no pid is left. The worker reaps them between
    calls (at most every REAP_EVERY_S)."""
    (tmp_path / "r.py").write_text(ORPHANING)
    with RewardPool("r.py:f", base_dir=tmp_path, workers=1, timeout_s=30.0) as pool:
        worker = int(pool.score("s0", "d", "orphan", "a").extra["worker"])
        deadline = time.monotonic() + 30.0  # a bound on the wait, not a timing assertion
        while not _zombie_children(worker):  # the orphan's sleep ended: a zombie of the worker's
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(REAP_EVERY_S)
        assert pool.score("s1", "d", "a", "a").ok  # after it, the worker reaps
        deadline = time.monotonic() + 30.0
        while _zombie_children(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _zombie_children(worker) == []


@pytest.mark.timeout(30)
def test_a_pool_that_waits_for_its_first_start_is_bounded_when_its_dispatcher_never_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the wait relied on the dispatcher thread's word: one that ended on a bug of its own hung the controller's
    # start and `rlctl check` for ever
    (tmp_path / "ok.py").write_text("def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n")
    monkeypatch.setattr(reward_pool, "WAIT_SLACK_S", 0.5)
    monkeypatch.setattr(RewardPool, "_dispatch", lambda self: None)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"^ok.py:f: no reward worker said whether it loaded within 1 s$"):
        RewardPool("ok.py:f", base_dir=tmp_path, workers=1, timeout_s=0.1, load_retry_s=1.0, wait=True)
    assert time.monotonic() - t0 < 10


def test_a_large_package_beside_a_reward_file_is_said_once_and_its_junk_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A package beside the reward file is copied whole into the job (and staged to every site): one holding a
    checkout's .git, or gigabytes of data, was copied without a word, .git and all."""
    from rlctl.ops.inputs import copy_reward
    from rlctl.rl import reward_files

    pkg = tmp_path / "src" / "rlctl_big_zz"
    (pkg / ".git" / "objects").mkdir(parents=True)
    (pkg / ".git" / "objects" / "pack").write_bytes(b"g" * 5000)
    (pkg / "__init__.py").write_text("")
    (pkg / "table.bin").write_bytes(b"t" * (3 << 20))
    (tmp_path / "src" / "r.py").write_text("import rlctl_big_zz\n")
    monkeypatch.setattr(reward_files, "PACKAGE_WARN_BYTES", 2 << 20)
    monkeypatch.setattr(reward_files, "_said_size", set())
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_files")
    for job in ("check", "job"):  # a launch copies it for its check, then into the job: said once
        (tmp_path / job).mkdir()
        copy_reward(tmp_path / "src" / "r.py", tmp_path / job / "reward")
    assert [r.getMessage() for r in caplog.records] == [
        f"reward {tmp_path / 'src' / 'r.py'}: the packages beside it that it imports are copied into the job whole, "
        "and staged to every site: 3 MiB (rlctl_big_zz/ 3 MiB); keep data and other large files out of them, or read "
        "those by a path every site has"
    ]
    copied = tmp_path / "job" / "reward" / "rlctl_big_zz"
    assert sorted(p.name for p in copied.iterdir()) == ["__init__.py", "table.bin"]
    (pkg / "table.bin").unlink()
    caplog.clear()
    copy_reward(tmp_path / "src" / "r.py", tmp_path / "job" / "reward")  # under the bound: nothing said
    assert caplog.records == []


def test_two_rewards_in_one_process_each_import_the_helper_beside_it(tmp_path: Path) -> None:
    """Two reward files, each with a `rlctl_utils_zz.py` beside it, loaded in one process (workers=0: tests, a
    notebook, two jobs' checks): the second's `import rlctl_utils_zz` took the first's module from sys.modules, and
    scored with it."""
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rlctl_utils_zz.py").write_text(f"NAME = {name!r}\n")
        (tmp_path / name / "r.py").write_text(
            "import rlctl_utils_zz\n\ndef f(data_source, solution_str, ground_truth):\n"
            f"    return 1.0 if rlctl_utils_zz.NAME == {name!r} else 0.0\n"
        )
    (tmp_path / "c" / "s.py").write_text((tmp_path / "c" / "r.py").read_text())
    try:
        for name, file in (("a", "r.py"), ("b", "r.py"), ("c", "r.py"), ("a", "r.py"), ("c", "s.py")):
            with RewardPool(f"{file}:f", base_dir=tmp_path / name, workers=0, timeout_s=5.0) as pool:
                assert pool.score("s0", "d", "x", "y") == RewardResult(1.0), (name, file)
    finally:
        sys.modules.pop("rlctl_utils_zz", None)


def test_two_rewards_in_one_process_import_their_own_helpers_inside_their_functions_too(tmp_path: Path) -> None:
    """As above, the helper imported inside the function (at call time, not at the module's top), and by that helper
    inside its own function: the second reward's call took the first's module from sys.modules. And a reward's
    directory stayed on sys.path after its in-process load, first for every later import of the process."""
    path = list(sys.path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rlctl_lazy_zz.py").write_text(
            "def name():\n    import rlctl_lazy_sib_zz\n\n    return rlctl_lazy_sib_zz.NAME\n"
        )
        (tmp_path / name / "rlctl_lazy_sib_zz.py").write_text(f"NAME = {name!r}\n")
        (tmp_path / name / "r.py").write_text(
            "def f(data_source, solution_str, ground_truth):\n    import rlctl_lazy_zz\n\n"
            f"    return 1.0 if rlctl_lazy_zz.name() == {name!r} else 0.0\n"
        )
    pools = [RewardPool("r.py:f", base_dir=tmp_path / name, workers=0, timeout_s=5.0) for name in ("a", "b")]
    try:
        for pool in (*pools, *pools):  # each called after the other loaded and called
            assert pool.score("s0", "d", "x", "y") == RewardResult(1.0)
        assert sys.path == path
    finally:
        for pool in pools:
            pool.close()
        for mod in ("rlctl_lazy_zz", "rlctl_lazy_sib_zz"):
            sys.modules.pop(mod, None)
