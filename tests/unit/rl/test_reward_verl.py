"""A verl job's reward moves over unchanged: every signature verl can call, an async compute_score, verl's built-in
scorers by name; and what a reward's failure says is one line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import pytest

from rlctl.config.task import DatasetTask
from rlctl.rl import dataset_scan
from rlctl.rl.dataset_scan import RowsChecked, check_rows, keeping_rows
from rlctl.rl.reward import ERROR_CHARS, RewardResult, builtin_scorer_hints, call_reward, gsm8k, load_reward
from rlctl.rl.reward_pool import RewardPool
from rlctl.rl.source import heldout_task
from rlctl.rl.tokenizer import load_tokenizer
from tests.unit.hf_tokenizer import write_tokenizer
from tests.unit.rl.test_dataset import write_jsonl

SIGNATURES = """
def required_extra(data_source, solution_str, ground_truth, extra_info):
    return float(extra_info["bonus"])

def keyword_only(data_source, solution_str, ground_truth, *, extra_info):
    return 1.0

def any_keywords(**kwargs):
    return float(len(kwargs))

def three(data_source, solution_str, ground_truth):
    return 3.0

def needs_more(data_source, solution_str, ground_truth, extra_info, method):
    return 0.0

def positional_only(data_source, solution_str, ground_truth, /, extra_info=None):
    return 0.0
"""


@pytest.fixture
def signatures(tmp_path: Path) -> Path:
    (tmp_path / "sigs.py").write_text(SIGNATURES)
    return tmp_path


@pytest.mark.parametrize("name", ["required_extra", "keyword_only", "any_keywords", "three"])
def test_every_signature_verl_calls_loads(signatures: Path, name: str) -> None:
    # verl passes extra_info as a keyword always: a function that requires it was refused, its signature tried with
    # the first three arguments alone ("missing a required argument: 'extra_info'")
    assert callable(load_reward(f"sigs.py:{name}", signatures))


def test_a_required_extra_info_is_given_the_rows(signatures: Path) -> None:
    with RewardPool("sigs.py:required_extra", base_dir=signatures, workers=0) as pool:
        assert pool.score("s0", "d", "x", "y", {"bonus": 2}).score == 2.0
    with RewardPool("sigs.py:any_keywords", base_dir=signatures, workers=0) as pool:
        assert pool.score("s0", "d", "x", "y").score == 4.0  # extra_info among them, as verl calls it


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("needs_more", "missing a required argument: 'method'"),
        ("positional_only", "'data_source' parameter is positional only, but was passed as a keyword"),
    ],
)
def test_a_signature_verl_cannot_call_is_refused_saying_why(signatures: Path, name: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        load_reward(f"sigs.py:{name}", signatures)
    called = "cannot be called as compute_score(data_source=, solution_str=, ground_truth=, extra_info=): "
    assert called in str(e.value)
    assert str(e.value).endswith(why)


ASYNC = """
import asyncio

LOOPS = []

async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    LOOPS.append(asyncio.get_running_loop())  # a client made in one call is bound to the loop of the next
    if solution_str == "hang":
        await asyncio.Event().wait()
    if solution_str == "raise":
        raise KeyError("boom")
    await asyncio.sleep(0)
    return {"score": float(solution_str == ground_truth), "same_loop": float(LOOPS[0] is LOOPS[-1])}
"""


def test_an_async_reward_is_awaited_in_its_worker_and_bounded_by_the_timeout(tmp_path: Path) -> None:
    # its coroutine was the value returned: `bad_type ... got <coroutine ...>`, every sample scored on_error
    (tmp_path / "r.py").write_text(ASYNC)
    with RewardPool("r.py:compute_score", base_dir=tmp_path, workers=1, timeout_s=2.0, on_error=-1.0) as pool:
        assert pool.score("s0", "d", "72", "72") == RewardResult(1.0, extra={"same_loop": 1.0})
        assert pool.score("s1", "d", "71", "72") == RewardResult(0.0, extra={"same_loop": 1.0})
        raised = pool.score("s2", "d", "raise", "72")
        assert (raised.outcome, raised.error) == ("error", "KeyError: 'boom' (r.py:11)")
        assert pool.score("s3", "d", "hang", "72") == RewardResult(-1.0, "timeout", "no result in 2.0s")
        assert pool.score("s4", "d", "72", "72").ok


def test_an_async_reward_is_awaited_in_line(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text(ASYNC)
    with RewardPool("r.py:compute_score", base_dir=tmp_path, workers=0) as pool:
        assert [pool.score(f"s{i}", "d", "72", "72").extra for i in range(2)] == [{"same_loop": 1.0}] * 2


def test_an_async_reward_in_line_in_a_thread_whose_loop_runs_is_a_failed_call_not_a_warning() -> None:
    async def f(data_source: str, solution_str: str, ground_truth: str) -> float:
        return 1.0

    async def inside() -> RewardResult:
        return call_reward(f, {"data_source": "d", "solution_str": "x", "ground_truth": "x"}, -1.0)

    result = asyncio.run(inside())  # (pytest's warnings as errors: an un-awaited coroutine's would fail it)
    assert (result.outcome, str(result.error).split(" (")[0]) == (
        "error",
        "RuntimeError: Cannot run the event loop while another loop is running",
    )


@pytest.mark.parametrize(
    ("output", "ground_truth", "score"),
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),
        ("#### 1,234", "1234", 1.0),  # its commas dropped
        ("#### -3", "-3", 1.0),
        ("first #### 5, then #### 72", "72", 1.0),  # the last one
        ("#### 72 " + "x" * 300, "72", 0.0),  # the output's last 300 characters only, as verl reads it
        ("#### 72", 72, 1.0),  # a number as its str
        ("#### 71", "72", 0.0),
        ("72", "72", 0.0),  # no '#### ' before it: none (verl's strict extraction)
        ("####72", "72", 0.0),
        ("#### 72.0", "72", 0.0),  # the ground truth as written
    ],
)
def test_the_gsm8k_builtin_scores_as_verls_gsm8k_scorer(output: str, ground_truth: object, score: float) -> None:
    assert gsm8k("openai/gsm8k", output, ground_truth) == score
    assert load_reward("gsm8k", Path(".")) is gsm8k


def test_check_warns_where_every_row_is_a_dataset_a_builtin_scores_and_the_reward_is_exact_match(
    tmp_path: Path,
) -> None:
    # verl's GSM8K parquet with the default reward: every output ending '#### 72' scored 0, and check said nothing
    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    rows = [{"data_source": "openai/gsm8k", "prompt": "what is 1 + 2 ?", "ground_truth": "3"}] * 2
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = DatasetTask.model_validate({"kind": "dataset", "path": "train.jsonl"})  # (exact_match: the default)
    for kept in (False, True):  # `rlctl check`'s, and a launch's preflight's
        with keeping_rows() if kept else contextlib.nullcontext():
            read = check_rows(cfg, data_path=path, tokenizer=tok)
        assert read == RowsChecked(2, frozenset({"openai/gsm8k"}), path, string_prompts=2)
        assert builtin_scorer_hints(cfg.reward, train=read, heldout=None) == [
            "task.reward: exact_match compares the whole output with the ground truth, and every row's data_source "
            "is openai/gsm8k, whose outputs end in a worked answer ('… #### 72'; verl scores them with its GSM8K "
            "scorer): an output that is not the bare answer scores 0; set reward: gsm8k"
        ]
    dataset_scan._kept.clear()
    quiet = [
        ("gsm8k", rows),
        ("r.py:f", rows),
        ("exact_match", [*rows, {"data_source": "mine", "prompt": "what is 1 + 2 ?", "ground_truth": "3"}]),
    ]
    for reward, these in quiet:  # the built-in itself, a reward of the user's, rows of other data too: nothing said
        write_jsonl(path, these)
        cfg = DatasetTask.model_validate({"kind": "dataset", "path": "train.jsonl", "reward": reward})
        read = check_rows(cfg, data_path=path, tokenizer=tok)
        assert builtin_scorer_hints(reward, train=read, heldout=None) == []


def test_check_warns_where_every_held_out_row_is_a_dataset_a_builtin_scores_and_the_reward_is_exact_match(
    tmp_path: Path,
) -> None:
    # the held-out evaluation scores its rows with task.reward too: a held-out file of GSM8K rows read 0 in every
    # evaluation, and check said nothing (its training file of other rows, or mixed ones, said nothing either)
    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    gsm = {"data_source": "openai/gsm8k", "prompt": "what is 1 + 2 ?", "ground_truth": "3"}
    train = write_jsonl(tmp_path / "train.jsonl", [gsm, {**gsm, "data_source": "mine"}])
    held = write_jsonl(tmp_path / "held.jsonl", [gsm] * 2)
    cfg = DatasetTask.model_validate({"kind": "dataset", "path": "train.jsonl"})
    trained = check_rows(cfg, data_path=train, tokenizer=tok)
    assert trained == RowsChecked(2, frozenset({"openai/gsm8k", "mine"}), train, string_prompts=2)
    assert builtin_scorer_hints(cfg.reward, train=trained, heldout=None) == []
    heldout = check_rows(heldout_task(cfg, "held.jsonl"), data_path=held, tokenizer=tok, heldout=True)
    assert heldout == RowsChecked(2, frozenset({"openai/gsm8k"}), held, string_prompts=2)
    assert builtin_scorer_hints(cfg.reward, train=trained, heldout=heldout) == [
        "task.reward: exact_match compares the whole output with the ground truth, and the data_source of every "
        "held-out row (evaluation.path) is openai/gsm8k, whose outputs end in a worked answer ('… #### 72'; verl "
        "scores them with its GSM8K scorer): an output that is not the bare answer scores 0 (the held-out figures "
        "read 0 with it); set reward: gsm8k"
    ]
    assert builtin_scorer_hints("gsm8k", train=trained, heldout=heldout) == []


FAILING = """
def f(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "long":
        raise ValueError("x" * 5000)
    if solution_str == "keys":
        return {f"key{i}": "not a number" for i in range(1000)}
    raise RuntimeError("first line\\nsecond line")
"""


def test_a_rewards_error_is_one_line_of_at_most_error_chars(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a message with line breaks made the pool's warning (and the summary's first failure) several lines, and one of
    # 5000 characters was kept and logged whole
    caplog.set_level(logging.WARNING, logger="rlctl.rl.reward_pool")
    (tmp_path / "r.py").write_text(FAILING)
    with RewardPool("r.py:f", base_dir=tmp_path, workers=0) as pool:
        for output in ("lines", "long", "keys"):
            pool.score(output, "d", output, "72")
        assert pool.stats.first_failure == "error: sample lines: RuntimeError: first line\\nsecond line (r.py:7)"
    logged = [r.getMessage() for r in caplog.records]
    assert logged[0] == "reward error: sample lines: RuntimeError: first line\\nsecond line (r.py:7); scored 0.0"
    assert logged[1] == f"reward error: sample long: ValueError: {'x' * (ERROR_CHARS - 1)}… (r.py:4); scored 0.0"
    assert logged[2].startswith("reward bad_type: sample keys: dict without a 'score' key (keys: ['key0', 'key1', ")
    assert len(logged[2]) < ERROR_CHARS + 60 and logged[2].endswith("…; scored 0.0")
    assert all("\n" not in line for line in logged)


def test_a_reward_files_import_error_is_one_line_of_at_most_error_chars(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text(f"raise RuntimeError('first line\\nsecond line' + 'x' * 5000)\n{FAILING}")
    with pytest.raises(ValueError) as e:
        load_reward("r.py:f", tmp_path)
    assert str(e.value) == f"r.py: cannot import: RuntimeError: first line\\nsecond line{'x' * (ERROR_CHARS - 24)}…"


@pytest.mark.parametrize(("exit_with", "said"), [("'bye'", "SystemExit: bye"), ("", "SystemExit")])
def test_a_sys_exit_at_import_is_said_as_the_import_s_error(tmp_path: Path, exit_with: str, said: str) -> None:
    # a worker died of it: 'died while loading it (exit code 1)', and "bye" printed by the process (twice by check,
    # which loads the job's copy, then the file); in-line it ended the process that loaded it
    (tmp_path / "r.py").write_text(f"import sys\nsys.exit({exit_with})\n{FAILING}")
    with pytest.raises(ValueError) as e:
        load_reward("r.py:f", tmp_path)
    assert str(e.value) == f"r.py: cannot import: {said}"
    if exit_with:
        with pytest.raises(ValueError) as e:
            RewardPool("r.py:f", base_dir=tmp_path, workers=1, wait=True)
        assert str(e.value) == "r.py: cannot import: SystemExit: bye"
