import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config.task import DatasetTask
from rlctl.errors import ConfigError
from rlctl.rl import dataset_scan, reward, reward_pool
from rlctl.rl.dataset import check_task, load_dataset, prepare_dataset, submit_reward
from rlctl.rl.dataset_scan import check_rows, keeping_rows
from rlctl.rl.reward_pool import RewardPool
from rlctl.rl.tokenizer import HFTokenizer, load_tokenizer
from tests.unit.hf_tokenizer import SPECIALS, write_tokenizer

ID = {t: i for i, t in enumerate(SPECIALS)}
ROOT = Path(__file__).resolve().parents[3]


def task(**kw: Any) -> DatasetTask:
    return DatasetTask.model_validate({"kind": "dataset", "path": "train.jsonl", **kw})


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def tok(tmp_path: Path) -> HFTokenizer:
    return load_tokenizer(write_tokenizer(tmp_path / "model"))


def verl_row(i: int, question: str = "what is 1 + 2 ?", answer: str = "3") -> dict[str, Any]:
    """A row as verl's preprocessing scripts write it."""
    return {
        "data_source": "arith",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": i},
    }


def test_config_defaults_and_validation() -> None:
    cfg = task()
    assert (cfg.prompt_key, cfg.answer_key, cfg.bad_rows, cfg.reward, cfg.reward_on_error) == (
        "prompt",
        "ground_truth",
        "refuse",
        "exact_match",
        0.0,
    )
    with pytest.raises(ValueError, match=r"use a \.jsonl or \.parquet file"):
        task(path="train.csv")
    with pytest.raises(ValueError, match=r"invalid reward 'x\.py:'"):
        task(reward="x.py:")
    assert task(reward="rewards/math.py:compute_score").reward == "rewards/math.py:compute_score"
    assert task(reward="my_rewards.math:compute_score").reward == "my_rewards.math:compute_score"


def test_a_built_in_reward_without_answers_is_refused() -> None:
    """`answer_key: null` with exact_match (the default reward) or digits passed: every row's ground truth was None,
    which no output equals, so every sample scored 0 and the job trained on nothing."""
    for name in reward.BUILTIN_REWARDS:
        with pytest.raises(ValueError, match=f"reward '{name}' compares each output with its row's ground truth, and"):
            task(answer_key=None, reward=name)
    assert task(answer_key=None, reward="r.py:f").answer_key is None


@pytest.mark.parametrize(
    ("reward", "said"),
    [
        (
            "rewards/math.py",
            "'rewards/math.py' names a file but not its function; use path/to/file.py:function "
            "(rewards/math.py:compute_score)",
        ),
        ("rewards/:compute_score", "'rewards/' is neither a .py file nor a module name"),
        ("rewards/math:compute_score", "'rewards/math' is neither a .py file nor a module name"),
        ("rewards/cfg.json:x", "'rewards/cfg.json' is neither a .py file nor a module name"),
    ],
)
def test_a_reward_of_no_form_says_which_part_is_wrong(reward: str, said: str) -> None:
    """A reward file without its function was refused as an 'unknown built-in reward', and a path not to a .py file
    as a module whose import raised `TypeError: the 'package' argument is required to perform a relative import`."""
    with pytest.raises(ValueError) as e:
        task(reward=reward)
    assert said in str(e.value)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_verl_rows_with_chat_messages(tmp_path: Path, tok: HFTokenizer, fmt: str) -> None:
    rows = [verl_row(i, "what is 1 + 2 ?", "3") for i in range(3)]
    path = tmp_path / f"train.{fmt}"
    write_jsonl(path, rows) if fmt == "jsonl" else write_parquet(path, rows)
    data = prepare_dataset(task(path=path.name, shuffle=False), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert len(data) == 3 and data.num_bad_rows == 0
    p = data.prompt(1)
    assert p.prompt_id == "p1" and p.ground_truth == "3" and p.data_source == "arith"
    assert p.extra_info == {"split": "train", "index": 1}
    assert p.tokens == tok.encode_chat(rows[0]["prompt"])
    assert p.tokens[0] == ID["<s>"] and p.tokens[-1] == ID["<|assistant|>"]
    assert p.source_row == ("line 2" if fmt == "jsonl" else "row 1")


def test_a_parquet_file_named_in_upper_case_is_read_as_parquet(tmp_path: Path, tok: HFTokenizer) -> None:
    """`path: train.PARQUET` (as some exports name it) was refused as an unsupported file by the job, and read as
    JSON lines ("cannot read: 'utf-8' codec can't decode") by the dataset reader; the held-out file's path alike."""
    from rlctl.config.lifecycle import Evaluation

    assert Evaluation.model_validate({"path": "held.Parquet"}).path == "held.Parquet"
    path = write_parquet(tmp_path / "train.PARQUET", [verl_row(i) for i in range(2)])
    data = prepare_dataset(task(path=path.name), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert len(data) == 2 and data.num_bad_rows == 0 and data.prompt(0).source_row.startswith("row ")


def test_a_missing_file_names_the_field_that_named_it(tmp_path: Path, tok: HFTokenizer) -> None:
    """A missing held-out file's line names evaluation.path, versus always 'task.path is relative to the job file'."""
    gone = tmp_path / "held.jsonl"
    with pytest.raises(ConfigError, match=r"evaluation\.path is relative"):
        prepare_dataset(task(), data_path=gone, tokenizer=tok, out_dir=tmp_path / "h", heldout=True)
    with pytest.raises(ConfigError, match=r"task\.path is relative"):
        prepare_dataset(task(), data_path=gone, tokenizer=tok, out_dir=tmp_path / "d")


def test_a_missing_file_named_by_an_absolute_path_is_not_said_relative_to_the_job_file(
    tmp_path: Path, tok: HFTokenizer
) -> None:
    """'(task.path is relative to the job file)' was said of a task.path or evaluation.path written absolute too,
    which is read as written; a relative one still says it."""
    gone = tmp_path / "held.jsonl"
    for heldout, field in ((True, "evaluation.path"), (False, "task.path")):
        with pytest.raises(ConfigError) as e:
            prepare_dataset(
                task(path=str(gone)), data_path=gone, tokenizer=tok, out_dir=tmp_path / "h", heldout=heldout
            )
        assert str(e.value) == f"{gone}: no such file ({field})"
        with pytest.raises(ConfigError) as e:
            prepare_dataset(
                task(path="held.jsonl"), data_path=gone, tokenizer=tok, out_dir=tmp_path / "h", heldout=heldout
            )
        assert str(e.value) == f"{gone}: no such file ({field} is relative to the job file)"


def test_a_missing_file_named_from_the_home_directory_is_not_said_relative_to_the_job_file(
    tmp_path: Path, tok: HFTokenizer
) -> None:
    """A task.path or evaluation.path written `~/…` is read from the home directory (`is_job_relative`, the rule of
    `rlctl check`, config/job.py and the reward's line); prepare_dataset's own `os.path.isabs` test said it 'is
    relative to the job file'."""
    gone = tmp_path / "missing.jsonl"
    for heldout, field in ((True, "evaluation.path"), (False, "task.path")):
        with pytest.raises(ConfigError) as e:
            prepare_dataset(
                task(path="~/missing.jsonl"), data_path=gone, tokenizer=tok, out_dir=tmp_path / "h", heldout=heldout
            )
        assert str(e.value) == f"{gone}: no such file ({field})"


def test_string_prompts_as_is_or_through_the_template(tmp_path: Path, tok: HFTokenizer) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "what is 1 + 2 ?", "ground_truth": 3}])
    plain = prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "a")
    assert plain.prompt(0).tokens == tok.encode("what is 1 + 2 ?")
    assert plain.prompt(0).data_source == "train"  # no data_source field: the file's stem
    chat = prepare_dataset(task(template_strings=True), data_path=path, tokenizer=tok, out_dir=tmp_path / "b")
    assert chat.prompt(0).tokens == tok.encode_chat([{"role": "user", "content": "what is 1 + 2 ?"}])


def test_custom_and_dotted_keys(tmp_path: Path, tok: HFTokenizer) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"q": "hello", "meta": {"gold": ["a", "b"]}, "src": "s"}])
    cfg = task(prompt_key="q", answer_key="meta.gold", data_source_key="src")
    p = prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "d").prompt(0)
    assert (p.ground_truth, p.data_source, p.extra_info) == (["a", "b"], "s", None)
    no_answer = prepare_dataset(
        task(prompt_key="q", answer_key=None, reward="r.py:f"), data_path=path, tokenizer=tok, out_dir=tmp_path / "e"
    )
    assert no_answer.prompt(0).ground_truth is None


BAD_ROWS = [
    {"prompt": "hello", "ground_truth": "a"},  # line 1: good
    {"ground_truth": "a"},  # line 2: no prompt
    "{not json",  # line 3
    {"prompt": "hello"},  # line 4: no ground truth
    {"prompt": " ".join(["hello"] * 20), "ground_truth": "a"},  # line 5: 21 tokens with BOS
    {"prompt": [{"content": "x"}], "ground_truth": "a"},  # line 6: a message without role
    {"prompt": 7, "ground_truth": "a"},  # line 7
    {"prompt": [{"role": "tool", "content": "x"}], "ground_truth": "a"},  # line 8: the template refuses it
    {"prompt": "world", "ground_truth": "b", "data_source": 3},  # line 9
    {"prompt": "world", "ground_truth": "b"},  # line 10: good
]


def test_bad_rows_are_refused_with_file_and_line(tmp_path: Path, tok: HFTokenizer) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", BAD_ROWS)
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(max_prompt_tokens=16), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value) == (
        f"{path}: 8 of 10 rows are bad: line 2: prompt: missing; line 3: invalid JSON: Expecting property name "
        "enclosed in double quotes (column 2); line 4: ground_truth: missing; … 5 more"
    )
    assert e.value.hint is not None and "bad_rows: skip" in e.value.hint
    assert not (tmp_path / "d").exists()


def test_bad_rows_are_skipped_counted_and_logged(
    tmp_path: Path, tok: HFTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", BAD_ROWS)
    caplog.set_level(logging.WARNING, logger="rlctl.rl.dataset_scan")
    cfg = task(max_prompt_tokens=16, bad_rows="skip", shuffle=False)
    data = prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert len(data) == 2 and data.num_bad_rows == 8
    assert [data.prompt(i).source_row for i in range(2)] == ["line 1", "line 10"]
    logged = [r.getMessage() for r in caplog.records]
    assert logged[:-1] == [
        f"skipped bad row {path}:line 2: prompt: missing",
        f"skipped bad row {path}:line 3: invalid JSON: Expecting property name enclosed in double quotes (column 2)",
        f"skipped bad row {path}:line 4: ground_truth: missing",
        f"skipped bad row {path}:line 5: prompt: 21 tokens, over max_prompt_tokens 16",
        f"skipped bad row {path}:line 6: prompt: message [0] is not a {{role, content}} mapping",
        f"skipped bad row {path}:line 7: prompt: expected a string or a non-empty list of chat messages "
        "[{role, content}], got 7",
        f"skipped bad row {path}:line 8: prompt: chat template: unknown role tool",
        f"skipped bad row {path}:line 9: data_source: expected a string, got int",
    ]
    assert logged[-1] == f"dataset {path}: skipped 8 of 10 rows (task.bad_rows: skip)"
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["num_bad_rows"] == 8 and len(manifest["bad_rows"]) == 8


def test_a_launch_s_check_and_prepare_read_and_tokenize_its_rows_once(
    tmp_path: Path, tok: HFTokenizer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A launch's preflight (`check_rows`) read and tokenized every row, then its prepare every row again: a big
    dataset's minutes twice. Kept (`keeping_rows`), the prepare writes the same files and logs the same bad rows; a
    file changed since is read again; outside it, nothing is kept (`rlctl check`)."""
    path = write_jsonl(tmp_path / "train.jsonl", BAD_ROWS)
    cfg = task(max_prompt_tokens=16, bad_rows="skip", shuffle=False)
    plain = prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "plain")
    calls: list[str] = []
    for name in ("encode", "encode_chat"):
        real = getattr(tok, name)
        monkeypatch.setattr(tok, name, lambda *a, _real=real, **k: calls.append("tokenized") or _real(*a, **k))
    with keeping_rows():
        assert check_rows(cfg, data_path=path, tokenizer=tok).good == 2
    read = len(calls)
    assert read >= 2
    caplog.set_level(logging.WARNING, logger="rlctl.rl.dataset_scan")
    caplog.clear()
    kept = prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "kept")
    assert len(calls) == read and kept.checksum == plain.checksum and kept.num_bad_rows == 8
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 9 and logged[-1] == f"dataset {path}: skipped 8 of 10 rows (task.bad_rows: skip)"
    with keeping_rows():
        check_rows(cfg, data_path=path, tokenizer=tok)
    write_jsonl(path, [{"prompt": "1 + 2", "ground_truth": "3"}])  # changed after the check
    read = len(calls)
    assert len(prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "changed")) == 1
    # (this file's rows: a launch test before this one in the worker, refused or interrupted, may leave its own)
    assert len(calls) == read + 1 and str(path) not in dataset_scan._kept
    check_rows(cfg, data_path=path, tokenizer=tok)
    assert str(path) not in dataset_scan._kept


def test_prompts_that_need_a_template_the_tokenizer_lacks_name_the_model_and_the_fixes(tmp_path: Path) -> None:
    # chat messages with a tokenizer with no template were bad rows: `job.yaml: task.path: train.jsonl: its one row:
    # prompt: chat messages need a chat template, …` blamed the data file, and named neither the model nor a template
    model = write_tokenizer(tmp_path / "m", chat_template=None)
    tok = load_tokenizer(model)
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1 + 2", "ground_truth": "3"}, verl_row(0)])
    for bad_rows in ("refuse", "skip"):  # skip said `no usable rows (1 read, 1 bad)`, and not why
        with pytest.raises(ConfigError) as e:
            prepare_dataset(task(bad_rows=bad_rows), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
        assert str(e.value) == (
            f"{model}: the tokenizer has no chat template (no chat_template.jinja, nor chat_template in "
            f"tokenizer_config.json), and {path}:line 2 holds chat messages"
        )
        assert e.value.hint is not None and e.value.hint.endswith("or give the prompts as strings")
    with pytest.raises(ConfigError, match=r"line 1 is a string prompt, which task\.template_strings renders") as e:
        prepare_dataset(task(template_strings=True), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert e.value.hint is not None and e.value.hint.endswith("set task.template_strings: false")
    job = tmp_path / "job.yaml"
    with pytest.raises(ConfigError, match=rf"^{job}: model\.path: {model}: the tokenizer has no chat template") as e:
        check_task(task(), job_file=job, model_dir=model)
    assert e.value.hint is not None and "add a chat_template.jinja" in e.value.hint


def test_a_key_no_row_has_is_named_once_with_the_fields_rows_have(tmp_path: Path, tok: HFTokenizer) -> None:
    # every row without `prompt_key`'s field was refused as `64 of 64 rows are bad: line 1: prompt: missing; line 2:
    # prompt: missing; …` with the hint to skip them and train on the others (there were none); with
    # `bad_rows: skip`, `no usable rows (64 read, 64 bad)` said nothing of why
    rows = [{"question": f"what is {i} ?", "answer": "3", "src": "x"} for i in range(5)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    for bad_rows in ("refuse", "skip"):
        with pytest.raises(ConfigError) as e:
            prepare_dataset(
                task(bad_rows=bad_rows, answer_key="answer"), data_path=path, tokenizer=tok, out_dir=tmp_path / "d"
            )
        assert str(e.value) == f"{path}: all 5 rows: prompt: missing; the first row's fields: answer, question, src"
        assert e.value.hint == "name the field that holds it: task.prompt_key"
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(prompt_key="question"), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value).endswith("all 5 rows: ground_truth: missing; the first row's fields: answer, question, src")
    assert e.value.hint == "name the field that holds it: task.answer_key"
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{"answer": "3"}, "not json"])  # all bad, not alike: no skip hint
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(), data_path=mixed, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value).startswith(f"{mixed}: 2 of 2 rows are bad: line 1: ground_truth: missing; line 2: invalid")
    assert e.value.hint == "fix the rows"
    prepare_dataset(
        task(prompt_key="question", answer_key="answer"), data_path=path, tokenizer=tok, out_dir=tmp_path / "d"
    )


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_null_ground_truth_is_said_null_not_missing(tmp_path: Path, tok: HFTokenizer, fmt: str) -> None:
    """A ground truth that is there but null was said 'missing', and in every row with the hint to name the field
    that holds it, after the row's fields listed that very one; the default key's null reads verl's nested one."""
    rows = [{**verl_row(i), "reward_model": {"style": "rule", "ground_truth": None}} for i in range(3)]
    path = write_jsonl(tmp_path / "t.jsonl", rows) if fmt == "jsonl" else write_parquet(tmp_path / "t.parquet", rows)
    cfg = task(path=path.name, answer_key="reward_model.ground_truth")
    with pytest.raises(ConfigError) as e:
        prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value) == (
        f"{path}: all 3 rows: reward_model.ground_truth: null (a row's ground truth is the reward's ground_truth "
        "argument)"
    )
    # the default reward, exact_match, compares with it: answer_key null, which the hint said to set, is refused for it
    assert e.value.hint == "give the rows their ground truth (reward 'exact_match' compares each output with it)"
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(path=path.name, answer_key="reward_model.ground_truth", reward="r.py:f"), data_path=path,
                        tokenizer=tok, out_dir=tmp_path / "o")  # fmt: skip
    assert e.value.hint == "give the rows their ground truth, or set task.answer_key: null for a reward that reads none"
    no_answers = task(path=path.name, answer_key=None, reward="r.py:f")  # (a reward of its own: the built-ins need one)
    assert prepare_dataset(no_answers, data_path=path, tokenizer=tok, out_dir=tmp_path / "n")
    both = write_jsonl(tmp_path / "both.jsonl", [{**verl_row(0), "ground_truth": None}])
    got = prepare_dataset(task(), data_path=both, tokenizer=tok, out_dir=tmp_path / "b").prompt(0).ground_truth
    assert got == "3"


def test_a_data_source_or_extra_info_key_no_row_has_is_refused(tmp_path: Path, tok: HFTokenizer) -> None:
    """A key the job sets for an optional field that no row has (a typo) gave every row the file's name as its
    data_source (or None as extra_info), silently; rows without the default keys still take those."""
    rows = [
        {"prompt": "hello", "ground_truth": "a", "source": "math", "meta": {"i": 0}},
        {"prompt": "x", "ground_truth": "b"},
    ]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    for setting, key in (("data_source_key", "sorce"), ("extra_info_key", "metadata")):
        with pytest.raises(ConfigError) as e:
            prepare_dataset(task(**{setting: key}), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
        assert str(e.value) == (
            f"{path}: no row has {key!r} (task.{setting}); the first row's fields: ground_truth, meta, prompt, source"
        )
        assert e.value.hint == f"name the field that holds it, or leave task.{setting} out"
    got = prepare_dataset(
        task(data_source_key="source", extra_info_key="meta"), data_path=path, tokenizer=tok, out_dir=tmp_path / "d"
    )
    assert [(p.data_source, p.extra_info) for p in (got.prompt(0), got.prompt(1))] in (
        [("math", {"i": 0}), ("train", None)],
        [("train", None), ("math", {"i": 0})],
    )


def test_a_heldout_file_whose_rows_lack_the_data_source_or_extra_info_key_takes_the_defaults(
    tmp_path: Path, tok: HFTokenizer
) -> None:
    """The training file's rows have the key the job sets (no typo), the held-out file's (evaluation.path, drawn from
    elsewhere) lack it: that refused the whole job ('no row has …'); its rows take the defaults, as a training row
    without it does."""
    held = write_jsonl(tmp_path / "held.jsonl", [{"prompt": "hello", "ground_truth": "a"}])
    cfg = task(path=held.name, data_source_key="source", extra_info_key="meta")
    assert check_rows(cfg, data_path=held, tokenizer=tok, heldout=True).good == 1
    got = prepare_dataset(cfg, data_path=held, tokenizer=tok, out_dir=tmp_path / "h", heldout=True).prompt(0)
    assert (got.data_source, got.extra_info) == ("held", None)
    with pytest.raises(ConfigError, match="no row has 'source'"):  # (a training file's: a typo)
        check_rows(cfg, data_path=held, tokenizer=tok)


def test_parquet_bad_rows_name_the_row(tmp_path: Path, tok: HFTokenizer) -> None:
    path = write_parquet(tmp_path / "train.parquet", [verl_row(0), {**verl_row(1), "prompt": None}])
    with pytest.raises(ConfigError, match=r"train\.parquet: 1 of 2 rows are bad: row 1: prompt: missing"):
        prepare_dataset(task(path=path.name), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")


def ten_rows(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "train.jsonl", [{"prompt": f"{i % 5 + 1}", "ground_truth": str(i)} for i in range(10)]
    )


def test_order_is_a_function_of_the_position(tmp_path: Path, tok: HFTokenizer) -> None:
    path = ten_rows(tmp_path)
    data = prepare_dataset(task(shuffle_seed=7), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    epoch0 = [data.row_at(k) for k in range(10)]
    epoch1 = [data.row_at(k) for k in range(10, 20)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))  # each epoch visits every row once
    assert epoch0 != epoch1 and epoch0 != list(range(10))
    batch = data.rl_prompts(2, 4)  # positions 8..11: the end of epoch 0 and the start of epoch 1
    assert [p.prompt_id for p in batch] == data.prompt_ids_for(2, 4) == ["p8", "p9", "p10", "p11"]
    assert [p.row for p in batch] == [epoch0[8], epoch0[9], epoch1[0], epoch1[1]]
    again = load_dataset(tmp_path / "d", task(shuffle_seed=7))  # a fresh reader (a resumed job, another site)
    assert [again.prompt(k) for k in range(25)] == [data.prompt(k) for k in range(25)]
    other = load_dataset(tmp_path / "d", task(shuffle_seed=8))
    assert [other.row_at(k) for k in range(10)] != epoch0


def test_other_processes_see_identical_ids_and_order(tmp_path: Path, tok: HFTokenizer) -> None:
    path = ten_rows(tmp_path)
    cfg = task(shuffle_seed=3)
    data = prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    script = (
        "import json, sys; from pathlib import Path; from rlctl.config.task import DatasetTask;"
        "from rlctl.rl.dataset import load_dataset;"
        "d = load_dataset(Path(sys.argv[1]), DatasetTask.model_validate_json(sys.argv[2]));"
        "print(json.dumps([[p.prompt_id, p.tokens, p.ground_truth] for p in d.rl_prompts(3, 7)] + [d.checksum]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "d"), cfg.model_dump_json()],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    mine = [[p.prompt_id, p.tokens, p.ground_truth] for p in data.rl_prompts(3, 7)] + [data.checksum]
    assert json.loads(out) == mine


def test_prepared_files_are_checked_and_reused(tmp_path: Path, tok: HFTokenizer) -> None:
    path = ten_rows(tmp_path)
    out = tmp_path / "d"
    first = prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=out)
    stamp = (out / "prompts.safetensors").stat().st_mtime_ns
    assert prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=out).checksum == first.checksum
    assert (out / "prompts.safetensors").stat().st_mtime_ns == stamp  # unchanged input: not rewritten
    changed = prepare_dataset(task(max_prompt_tokens=64), data_path=path, tokenizer=tok, out_dir=out)
    assert changed.checksum == first.checksum  # a settings change re-tokenizes, to the same ids here
    rows = (out / "rows.jsonl").read_text()
    (out / "rows.jsonl").write_text(rows.replace('"0"', '"9"', 1))
    with pytest.raises(ConfigError, match="changed since they were prepared"):
        load_dataset(out, task())
    with pytest.raises(ConfigError, match="no prepared dataset here"):
        load_dataset(tmp_path / "nowhere", task())
    with pytest.raises(ConfigError, match="no such file"):
        prepare_dataset(task(), data_path=tmp_path / "missing.jsonl", tokenizer=tok, out_dir=out)


def test_rewards_decode_up_to_eos(tmp_path: Path, tok: HFTokenizer) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "what is 1 + 2 ?", "ground_truth": "3"}])
    data = prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    out = [*tok.encode("3", add_special_tokens=False), ID["<|end|>"], *tok.encode("4", add_special_tokens=False)]
    with RewardPool("exact_match", base_dir=tmp_path, workers=0) as pool:
        right = submit_reward(pool, tok, sample_id="s0", prompt=data.prompt(0), output_tokens=out)
        wrong = submit_reward(pool, tok, sample_id="s1", prompt=data.prompt(0), output_tokens=out[2:])
        assert (right.result().score, wrong.result().score) == (1.0, 0.0)


def test_check_task_names_the_job_field(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    ten_rows(tmp_path)
    check_task(task(), job_file=job)
    with pytest.raises(ConfigError, match=r"job\.yaml: task\.path: no such file .*nope\.jsonl"):
        check_task(task(path="nope.jsonl"), job_file=job)
    with pytest.raises(ConfigError, match=r"job\.yaml: task\.reward: r\.py: no such file"):
        check_task(task(reward="r.py:f"), job_file=job)


@pytest.mark.timeout(60)
def test_check_task_loads_a_reward_file_from_the_copy_the_job_runs(tmp_path: Path) -> None:
    """Before: check loaded the reward file where it is, so one reading a data file beside it (`__file__`) passed,
    and the job's copy (the file and the modules it imports, nothing else) failed at the controller's start."""
    job = tmp_path / "job.yaml"
    ten_rows(tmp_path)
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "bonus.txt").write_text("0.25\n")
    (tmp_path / "rewards" / "helper.py").write_text("def one():\n    return 1.0\n")
    (tmp_path / "rewards" / "r.py").write_text(
        "from pathlib import Path\nfrom helper import one\n"
        "BONUS = float((Path(__file__).parent / 'bonus.txt').read_text())\n\n"
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n    return BONUS * one()\n"
    )
    with pytest.raises(ConfigError) as e:
        check_task(task(reward="rewards/r.py:f"), job_file=job)
    assert str(e.value) == (
        f"{job}: task.reward: rewards/r.py loads here, but not from the job's copy of it, which holds the file and the "
        "modules and packages beside it that it imports (a package whole; not a module named as a standard library "
        "one), nothing else: cannot import: FileNotFoundError: [Errno 2] No such file or directory: '<job dir>/reward/"
        "bonus.txt'; put a file it reads in such a package, or read it by a path every site has"
    )
    (tmp_path / "rewards" / "helper").mkdir()  # a package is copied whole: a data file in it comes with it
    (tmp_path / "rewards" / "helper" / "__init__.py").write_text(
        "from pathlib import Path\n\ndef one():\n    return float((Path(__file__).parent / 'one.txt').read_text())\n"
    )
    (tmp_path / "rewards" / "helper" / "one.txt").write_text("1.0\n")
    (tmp_path / "rewards" / "helper.py").unlink()
    (tmp_path / "rewards" / "code.py").write_text("def one():\n    return 1.0\n")  # the stdlib's `code` in the copy
    (tmp_path / "rewards" / "r.py").write_text(
        "from code import one\n\ndef f(data_source, solution_str, ground_truth, extra_info=None):\n    return one()\n"
    )
    with pytest.raises(
        ConfigError, match=r"not from the job's copy .* ImportError: cannot import name 'one' from 'code'"
    ):
        check_task(task(reward="rewards/r.py:f"), job_file=job)
    (tmp_path / "rewards" / "r.py").write_text(  # its modules come with it: the copy loads
        "from helper import one\n\ndef f(data_source, solution_str, ground_truth, extra_info=None):\n    return one()\n"
    )
    check_task(task(reward="rewards/r.py:f"), job_file=job)


def test_a_reward_whose_modules_cannot_be_copied_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """Before: a package the reward imports holding a link to nothing (or a file it cannot read) made check, the
    launch's copy and a resume's comparison of the reward end in shutil.Error's traceback: the reward loads where it
    is, and its copy into the job (the file and the modules it imports) was made only since."""
    from rlctl.launch.jobdir import JobDir
    from rlctl.ops.jobchanges import launch_changes
    from rlctl.rl.reward_files import copy_reward
    from tests.unit.controller_harness import small_job

    job = tmp_path / "job.yaml"
    ten_rows(tmp_path)
    (tmp_path / "rewards" / "helper").mkdir(parents=True)
    (tmp_path / "rewards" / "helper" / "__init__.py").write_text("ONE = 1.0\n")
    (tmp_path / "rewards" / "r.py").write_text(
        "from helper import ONE\n\ndef f(data_source, solution_str, ground_truth, extra_info=None):\n    return ONE\n"
    )
    jd = JobDir.create("kt", explicit=tmp_path / "job")
    job.write_text(yaml.safe_dump({"task": {"kind": "dataset", "reward": "rewards/r.py:f"}}))
    jd.write_job(small_job("kt", iterations=2), source=str(job))
    copy_reward(tmp_path / "rewards" / "r.py", jd.path / "reward")  # as the launch copied it
    (tmp_path / "rewards" / "helper" / "data.json").symlink_to(tmp_path / "gone.json")
    gone = tmp_path / "rewards" / "helper" / "data.json"
    with pytest.raises(ConfigError) as e:
        check_task(task(reward="rewards/r.py:f"), job_file=job)
    assert str(e.value).startswith(f"{job}: task.reward: {gone}: cannot copy it into the job with the reward file")
    with pytest.raises(ConfigError, match="cannot copy it into the job with the reward file"):
        copy_reward(tmp_path / "rewards" / "r.py", jd.path / "reward")  # the launch's: one line
    assert launch_changes(jd) == []  # a resume runs the job's copy: nothing to compare with, nothing refused


@pytest.mark.timeout(60)
def test_check_task_loads_the_reward_in_a_worker_within_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl check` loads a user's reward as the job's pool does, in a reward worker within the pool's deadline for
    a start (here 1 s): a module whose import hangs is refused in one line naming the function and the deadline
    (check once imported it in its own process and hung for ever); an error inside the module is the loader's line,
    as before; the check's process imports neither."""
    monkeypatch.setattr(reward_pool, "LOAD_RETRY_MIN_S", 1.0)  # the pool's deadline: max(this, 6 × reward_timeout_s)
    job = tmp_path / "job.yaml"
    ten_rows(tmp_path)
    (tmp_path / "hang.py").write_text("import threading\nthreading.Event().wait()\n")
    (tmp_path / "bad.py").write_text("x = 1 / 0\n")
    (tmp_path / "ok.py").write_text(
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    with pytest.raises(ConfigError) as e:
        check_task(task(reward="hang.py:f", reward_timeout_s=0.1), job_file=job)
    assert str(e.value) == (
        f"{job}: task.reward: hang.py:f: it did not finish loading within 1 s (6 × reward_timeout_s, at least 1 s; "
        "a longer load: set task.reward_load_timeout_s)"
    )
    with pytest.raises(ConfigError) as e:
        check_task(task(reward="bad.py:f"), job_file=job)
    assert str(e.value) == f"{job}: task.reward: bad.py: cannot import: ZeroDivisionError: division by zero"
    check_task(task(reward="ok.py:f"), job_file=job)
    here = [m for m in list(sys.modules.values()) if str(getattr(m, "__file__", None)).startswith(str(tmp_path))]
    assert here == []  # the user's modules: never imported in the check's process


@pytest.mark.timeout(120)
def test_a_reward_that_loads_longer_than_its_calls_bound_takes_reward_load_timeout_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reward whose load takes longer than the bound its calls' timeout sets (a reward model's weights: minutes,
    against 6 × reward_timeout_s, at least 60 s) loads with `task.reward_load_timeout_s`, without a longer timeout
    for every call; the refusal of the default bound says so (before, the only way was to raise
    reward_timeout_s)."""
    monkeypatch.setattr(reward_pool, "LOAD_RETRY_MIN_S", 1.0)  # the default bound: max(this, 6 × reward_timeout_s)
    job = tmp_path / "job.yaml"
    ten_rows(tmp_path)
    (tmp_path / "model.py").write_text(
        "import time\ntime.sleep(3)  # a reward model's load\n\n"
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    with pytest.raises(ConfigError, match=r"within 1 s .*a longer load: set task\.reward_load_timeout_s\)$"):
        check_task(task(reward="model.py:f", reward_timeout_s=0.1), job_file=job)
    check_task(task(reward="model.py:f", reward_timeout_s=0.1, reward_load_timeout_s=60.0), job_file=job)


@pytest.mark.timeout(120)
def test_a_reward_whose_copy_only_timed_out_loading_is_said_slow_not_reading_a_file_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reward whose first import is slow (a cold cache) timed out from the job's copy, then loaded where it is: the
    refusal said the copy lacked a file it reads beside it, and to put that file in a package."""
    monkeypatch.setattr(reward_pool, "LOAD_RETRY_MIN_S", 1.0)
    job = tmp_path / "job.yaml"
    ten_rows(tmp_path)
    (tmp_path / "slow.py").write_text(
        f"import pathlib, time\nwarm = pathlib.Path({str(tmp_path / 'warm')!r})\n"
        "if not warm.exists():\n    warm.touch()\n    time.sleep(5)  # the first import: a cold cache\n\n"
        "def f(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    with pytest.raises(ConfigError) as e:
        check_task(task(reward="slow.py:f", reward_timeout_s=0.1), job_file=job)
    assert str(e.value) == (
        f"{job}: task.reward: slow.py:f: it did not finish loading within 1 s (6 × reward_timeout_s, at least 1 s; "
        "a longer load: set task.reward_load_timeout_s)"
    )


def test_check_task_reads_every_row_as_the_launch_will(tmp_path: Path) -> None:
    """Given the model's directory, check tokenizes every row (nothing written) and refuses bad ones as
    `prepare_dataset` would, naming the job field and the data file; `bad_rows: skip` passes."""
    job, model = tmp_path / "job.yaml", write_tokenizer(tmp_path / "model")
    path = write_jsonl(tmp_path / "train.jsonl", BAD_ROWS)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ConfigError) as e:
        check_task(task(max_prompt_tokens=16), job_file=job, model_dir=model)
    assert str(e.value) == (
        f"{job}: task.path: {path}: 8 of 10 rows are bad: line 2: prompt: missing; line 3: invalid JSON: Expecting "
        "property name enclosed in double quotes (column 2); line 4: ground_truth: missing; … 5 more"
    )
    assert e.value.hint is not None and "bad_rows: skip" in e.value.hint
    check_task(task(max_prompt_tokens=16, bad_rows="skip"), job_file=job, model_dir=model)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing prepared or written
    write_jsonl(path, ["not json"])
    with pytest.raises(ConfigError, match=r"task\.path: .*its one row: invalid JSON"):
        check_task(task(bad_rows="skip"), job_file=job, model_dir=model)


class _DropsWhitespace:
    """A tokenizer whose vocabulary makes nothing of a zero-width space (no BOS, no token for it)."""

    def __init__(self, inner: HFTokenizer) -> None:
        self.inner = inner

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text) if text.strip("\u200b") else []  # (a zero-width space: its normalizer drops it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_prompt_the_tokenizer_makes_nothing_of_is_a_bad_row(tmp_path: Path, tok: HFTokenizer) -> None:
    # a batch row with no prompt token has no position to predict the first output token from
    path = write_jsonl(
        tmp_path / "train.jsonl", [verl_row(0) | {"prompt": "\u200b"}, verl_row(1) | {"prompt": "hello"}]
    )
    data = prepare_dataset(
        task(bad_rows="skip"),
        data_path=path,
        tokenizer=_DropsWhitespace(tok),
        out_dir=tmp_path / "d",  # type: ignore[arg-type]
    )
    assert len(data) == 1 and data.num_bad_rows == 1
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert "prompt: no tokens" in json.dumps(manifest["bad_rows"])


def test_a_row_the_models_template_fails_on_is_a_named_bad_row(tmp_path: Path) -> None:
    """A template that concatenates content (as Qwen's does) raises TypeError on content parts: that row is bad,
    named, not a crash of `check` or `launch`; null content is refused before the template sees it."""
    concat = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|> ' + m['content'] + ' <|end|>' }}{% endfor %}"
        "{% if add_generation_prompt %} <|assistant|>{% endif %}"
    )
    tok = load_tokenizer(write_tokenizer(tmp_path / "m", chat_template=concat))
    rows = [verl_row(0), verl_row(1), verl_row(2)]
    rows[1]["prompt"] = [{"role": "user", "content": None}]
    rows[2]["prompt"] = [{"role": "user", "content": [{"type": "text", "text": "what is 1 + 2 ?"}]}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value) == (
        f"{path}: 2 of 3 rows are bad: line 2: prompt: message [0] content: expected a string or a list of "
        "{type, …} parts, got None; line 3: prompt: chat template: TypeError: can only concatenate str (not "
        '"list") to str'
    )


def test_check_task_names_model_path_for_a_missing_tokenizer(tmp_path: Path) -> None:
    """The tokenizer is the model directory's, so its absence is model.path's, versus task.path before."""
    job, model = tmp_path / "job.yaml", write_tokenizer(tmp_path / "model")
    ten_rows(tmp_path)
    (model / "tokenizer.json").unlink()
    with pytest.raises(ConfigError) as e:
        check_task(task(), job_file=job, model_dir=model)
    assert str(e.value) == (
        f"{job}: model.path: {model / 'tokenizer.json'}: no such file; the model directory needs a fast tokenizer "
        "(tokenizer.json)"
    )


def test_a_value_json_cannot_hold_is_named_by_its_path_in_the_row(tmp_path: Path, tok: HFTokenizer) -> None:
    # parquet bytes inside extra_info's struct said `extra_info: not JSON-serialisable (dict)`: the struct's type
    # (a date there: its ISO string, test_dataset_verl.py)
    blob = b"\x89PNG"
    path = write_parquet(
        tmp_path / "train.parquet", [{**verl_row(0), "extra_info": {"index": 0, "when": blob}}, verl_row(1)]
    )
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(path=path.name), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value) == (
        f"{path}: 1 of 2 rows are bad: row 0: extra_info: not JSON-serialisable: extra_info.when is of type bytes "
        "(task.extra_info_key: null reads none)"
    )
    path = write_parquet(tmp_path / "dates.parquet", [{**verl_row(0), "reward_model": {"ground_truth": [blob]}}])
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(path=path.name), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    # (the default key read verl's nested field: named as it is in the row, versus `ground_truth`, which it has not)
    assert str(e.value) == (
        f"{path}: its one row: reward_model.ground_truth: not JSON-serialisable: "
        "reward_model.ground_truth[0] is of type bytes"
    )


def test_a_value_json_cannot_hold_is_said_of_its_type_without_an_article() -> None:
    """As the reward's line: 'is of type int64', versus 'is a int64' (a NumPy scalar a row's list held)."""
    import numpy as np

    from rlctl.rl.dataset_rows import _json_safe

    with pytest.raises(ValueError, match=r"^extra_info\.ids\[1\] is of type int64$"):
        _json_safe({"ids": [1, np.int64(2)]}, "extra_info")


def test_a_jsonl_file_that_starts_with_a_byte_order_mark_reads_every_row(tmp_path: Path, tok: HFTokenizer) -> None:
    # its first row was bad: `line 1: invalid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) (column 1)`
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(verl_row(i)) + "\n" for i in range(2)).encode())
    data = prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert (len(data), data.num_bad_rows) == (2, 0)


def test_a_json_document_named_jsonl_is_told_one_object_per_line(tmp_path: Path, tok: HFTokenizer) -> None:
    # `json.dump(rows, f)` into a .jsonl said `expected a JSON object, got list`; indented, `invalid JSON: Expecting
    # value (column 1)` on line 1: neither said what a .jsonl file holds
    rows = [verl_row(i) for i in range(2)]
    hint = "a .jsonl file holds one JSON object per line (pandas: to_json(orient='records', lines=True))"
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(rows))
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value) == f"{path}: its one row: expected a JSON object, got list; {hint}"
    path.write_text(json.dumps(rows, indent=1))
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert f"line 1: invalid JSON: Expecting value (column 1); {hint}; line 2: invalid JSON: Expecting" in str(e.value)


def test_no_usable_row_says_why(tmp_path: Path, tok: HFTokenizer) -> None:
    # an empty file said `no usable rows (0 read, 0 bad)`; with `bad_rows: skip`, rows all bad in several ways said
    # `no usable rows (2 read, 2 bad)` and not one of them
    path = write_jsonl(tmp_path / "train.jsonl", [])
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value) == f"{path}: no rows: the file holds none"
    write_jsonl(path, [{"ground_truth": "3"}, "not json"])
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(bad_rows="skip"), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert str(e.value) == f"{path}: no usable rows (2 read, 2 bad; the first: line 1: prompt: missing)"


def test_the_check_before_a_launch_says_the_rows_it_will_skip_in_one_line(
    tmp_path: Path, tok: HFTokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    # a launch with `bad_rows: skip` logged every skipped row twice: its check's read, then its prepare's
    caplog.set_level(logging.WARNING, logger="rlctl.rl.dataset_scan")
    path = write_jsonl(tmp_path / "train.jsonl", [verl_row(0), {"ground_truth": "3"}, "not json"])
    assert check_rows(task(bad_rows="skip"), data_path=path, tokenizer=tok).good == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"dataset {path}: 2 of 3 rows will be skipped (task.bad_rows: skip); the first: line 2: prompt: missing"
    ]
    caplog.clear()
    prepare_dataset(task(bad_rows="skip"), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        f"skipped bad row {path}",
        f"skipped bad row {path}",
        f"dataset {path}",
    ]


def test_a_prepared_dataset_is_reused_whatever_directory_names_its_file(
    tmp_path: Path, tok: HFTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its manifest kept the file's path as given, relative to where rlctl ran: the same job launched again into the
    same job dir from another directory read and tokenized every row again."""
    from rlctl.rl import dataset

    path = tmp_path / "data" / "train.jsonl"
    path.parent.mkdir()
    write_jsonl(path, [verl_row(i, "what is 1 + 2 ?", "3") for i in range(3)])
    cfg = task(path="train.jsonl", shuffle=False)
    monkeypatch.chdir(tmp_path)
    prepare_dataset(cfg, data_path=Path("data/train.jsonl"), tokenizer=tok, out_dir=tmp_path / "d")
    monkeypatch.chdir(path.parent)

    def read_again(*_: object, **__: object) -> None:
        raise AssertionError("the rows were read and tokenized again")

    monkeypatch.setattr(dataset, "tokenized_rows", read_again)
    assert len(prepare_dataset(cfg, data_path=Path("train.jsonl"), tokenizer=tok, out_dir=tmp_path / "d")) == 3


def test_a_data_dir_of_the_users_is_refused_not_written_into(tmp_path: Path, tok: HFTokenizer) -> None:
    """A launch into the job file's own directory, its data file in data/: that data/ is the user's."""
    out = tmp_path / "data"
    out.mkdir()
    path = write_jsonl(out / "rows.jsonl", [verl_row(i) for i in range(4)])  # named as the tokenized rows are
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"data: the data file .*rows.jsonl lies in it, which rlctl did not write"):
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == ["rows.jsonl"] and path.read_bytes() == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"mine: holds notes\.txt, which rlctl did not write"):
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_an_oss_litter_in_a_job_dirs_data_dir_is_no_ones(tmp_path: Path, tok: HFTokenizer) -> None:
    """A Mac's .DS_Store, NFS's .nfs<hex> (a removed file still open) in the job dir's data/ were taken for the user's
    files, and the relaunch refused ('holds .DS_Store, which rlctl did not write')."""
    path = write_jsonl(tmp_path / "train.jsonl", [verl_row(i) for i in range(2)])
    out = tmp_path / "run" / "data"
    out.mkdir(parents=True)
    litter = [".DS_Store", "._train.jsonl", ".nfs000000000123abcd00000001", "Thumbs.db"]
    for name in litter:
        (out / name).write_bytes(b"\0")
    assert len(prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=out)) == 2
    (out / ".nfsnotes").write_text("mine")  # (not NFS's: its name is hex)
    with pytest.raises(ConfigError, match=r"data: holds \.nfsnotes, which rlctl did not write"):
        prepare_dataset(task(shuffle=False), data_path=path, tokenizer=tok, out_dir=out)
