"""Rows and settings of jobs moved over from verl: template arguments, bytes that are not UTF-8, parquet values that
are not JSON, empty prompts, and the verl shapes rlctl does not train (warned at check)."""

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.config.task import DatasetTask
from rlctl.rl.dataset import prepare_dataset
from rlctl.rl.tokenizer import load_tokenizer
from tests.unit.hf_tokenizer import SPECIALS, WORDS, write_tokenizer

ID = {t: i for i, t in enumerate(SPECIALS)}

# Qwen3's way: an empty think block after the assistant header where enable_thinking is false
THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %} <|{{ m['role'] }}|> {{ m['content'] }} <|end|>{% endfor %}"
    "{% if add_generation_prompt %} <|assistant|>"
    "{% if enable_thinking is defined and enable_thinking is false %} <|system|> <|end|>{% endif %}{% endif %}"
)


def task(**kw: Any) -> DatasetTask:
    return DatasetTask.model_validate({"kind": "dataset", "path": "train.jsonl", **kw})


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_chat_template_kwargs_reach_the_template_as_transformers_passes_them(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    """task.chat_template_kwargs (verl's apply_chat_template_kwargs: Qwen3's enable_thinking) are the template's
    variables, every row's prompt the ids transformers' apply_chat_template(..., **kwargs) gives, versus no such
    setting (refused as an unknown field: Qwen3's thinking block always on)."""
    transformers = pytest.importorskip("transformers")
    model = write_tokenizer(tmp_path / "model", chat_template=THINKING_TEMPLATE)
    messages = [{"role": "user", "content": "what is 1 + 2 ?"}]
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": messages, "ground_truth": "3"}])
    cfg = task(chat_template_kwargs=kwargs, shuffle=False)
    got = prepare_dataset(cfg, data_path=path, tokenizer=load_tokenizer(model), out_dir=tmp_path / "d")
    theirs = transformers.AutoTokenizer.from_pretrained(str(model)).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs
    )
    assert got.prompt(0).tokens == list(theirs)
    assert (ID["<|system|>"] in got.prompt(0).tokens) == (kwargs == {"enable_thinking": False})
    # a string prompt through the template (template_strings) gets them too
    string = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "what is 1 + 2 ?", "ground_truth": "3"}])
    cfg = task(chat_template_kwargs=kwargs, template_strings=True, shuffle=False)
    got = prepare_dataset(cfg, data_path=string, tokenizer=load_tokenizer(model), out_dir=tmp_path / "s")
    assert got.prompt(0).tokens == list(theirs)


def test_chat_template_kwargs_change_the_prepared_dataset_and_refuse_rlctl_s_own_arguments(tmp_path: Path) -> None:
    """Another enable_thinking is another dataset (prepared again, not the kept one); a kwarg that rlctl passes itself
    (add_generation_prompt, tools, messages) is refused in one line naming it."""
    model = write_tokenizer(tmp_path / "model", chat_template=THINKING_TEMPLATE)
    path = write_jsonl(
        tmp_path / "train.jsonl", [{"prompt": [{"role": "user", "content": "hello"}], "ground_truth": "3"}]
    )
    tok = load_tokenizer(model)
    on = prepare_dataset(task(shuffle=False), data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    off_cfg = task(shuffle=False, chat_template_kwargs={"enable_thinking": False})
    off = prepare_dataset(off_cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert off.prompt(0).tokens == [*on.prompt(0).tokens, ID["<|system|>"], ID["<|end|>"]]
    for name in ("add_generation_prompt", "tools", "messages"):
        with pytest.raises(ValueError, match=f"{name}: set by rlctl as transformers' apply_chat_template sets it"):
            task(chat_template_kwargs={name: True})


def test_a_line_that_is_not_utf8_is_one_bad_row_named_by_its_line(tmp_path: Path) -> None:
    """A latin-1 byte on one line refused the whole file at the decoder's offset into its buffer ('position 2690'),
    under `bad_rows: skip` too. Now that line is a bad row: skipped under skip, named under refuse; the lines about it
    (CRLF, a lone CR, a byte-order mark) read as before."""
    from rlctl.errors import ConfigError

    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    good = [json.dumps({"prompt": "what is 1 + 2 ?", "ground_truth": str(i)}).encode() for i in range(200)]
    bad = b'{"prompt": "caf\xe9 is", "ground_truth": "1"}'
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(good[:150]) + b"\n" + bad + b"\r" + b"\n".join(good[150:]) + b"\n")
    with pytest.raises(ConfigError, match=r"1 of 201 rows are bad: line 151: not UTF-8 at byte 0xe9 \(column 16\)"):
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "r")
    got = prepare_dataset(task(bad_rows="skip", shuffle=False), data_path=path, tokenizer=tok, out_dir=tmp_path / "s")
    assert len(got) == 200 and got.num_bad_rows == 1
    assert [got.prompt(k).source_row for k in (0, 149, 150, 199)] == ["line 1", "line 150", "line 152", "line 201"]
    assert got.prompt(150).ground_truth == "150"


def test_parquet_dates_decimals_and_maps_reach_the_reward_as_json_and_bytes_are_one_bad_row_each(
    tmp_path: Path,
) -> None:
    """A timestamp, date or decimal in extra_info refused the whole file ('not JSON-serialisable'), with no way
    around: now an ISO string and a float; a map column (Spark's map<string,string>) a dict, versus a list of
    (key, value) pairs; bytes (no text a reward could tell from a string) refuse the row, and `extra_info_key:
    null` reads no extra_info at all."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.errors import ConfigError

    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    table = pa.table(
        {
            "prompt": ["what is 1 + 2 ?", "what is 2 + 2 ?"],
            "ground_truth": [decimal.Decimal("3.50"), decimal.Decimal("4")],
            "extra_info": pa.array(
                [
                    {"created": when, "day": datetime.date(2024, 1, 2), "price": decimal.Decimal("1.25")},
                    {"created": when, "day": datetime.date(2024, 1, 3), "price": None},
                ]
            ),
            "meta": pa.array(
                [[("split", "train"), ("index", "0")], [("split", "test")]], pa.map_(pa.string(), pa.string())
            ),
            "blob": [b"\x89PNG", b"ok"],
        }
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    got = prepare_dataset(
        task(path="train.parquet", shuffle=False), data_path=path, tokenizer=tok, out_dir=tmp_path / "a"
    )
    assert got.prompt(0).extra_info == {"created": "2024-01-02T03:04:05+00:00", "day": "2024-01-02", "price": 1.25}
    assert [got.prompt(k).ground_truth for k in (0, 1)] == [3.5, 4.0]
    maps = task(path="train.parquet", extra_info_key="meta", shuffle=False)
    got = prepare_dataset(maps, data_path=path, tokenizer=tok, out_dir=tmp_path / "m")
    assert [got.prompt(k).extra_info for k in (0, 1)] == [{"split": "train", "index": "0"}, {"split": "test"}]
    blob = task(path="train.parquet", extra_info_key="blob")
    with pytest.raises(ConfigError, match=r"all 2 rows: blob: not JSON-serialisable: blob is of type bytes \(task"):
        prepare_dataset(blob, data_path=path, tokenizer=tok, out_dir=tmp_path / "b")
    none = task(path="train.parquet", extra_info_key=None, shuffle=False)
    got = prepare_dataset(none, data_path=path, tokenizer=tok, out_dir=tmp_path / "n")
    assert [got.prompt(k).extra_info for k in (0, 1)] == [None, None]


def test_whitespace_prompts_and_messages_with_no_content_are_bad_rows(tmp_path: Path) -> None:
    """A prompt of whitespace ('   ', '\\n\\t') tokenized to BOS alone and chat messages with no content to the
    template's headers alone, each trained on as a prompt; now each is a bad row as '' is. An empty system message
    beside a user's that says something (a placeholder some datasets carry) is no bad row."""
    from rlctl.errors import ConfigError

    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    rows: list[Any] = [
        "what is 1 + 2 ?",
        "   ",
        "\n\t",
        "",
        [{"role": "user", "content": ""}],
        [{"role": "system", "content": " "}, {"role": "user", "content": [{"type": "text", "text": "  "}]}],
        [{"role": "system", "content": "the answer"}, {"role": "user", "content": "\n"}],
        [{"role": "system", "content": ""}, {"role": "user", "content": "hello"}],
    ]
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": p, "ground_truth": "3"} for p in rows])
    with pytest.raises(ConfigError) as e:
        prepare_dataset(task(), data_path=path, tokenizer=tok, out_dir=tmp_path / "r")
    assert str(e.value).startswith(
        f"{path}: 6 of 8 rows are bad: line 2: prompt: empty prompt (whitespace only: '   '); line 3: prompt: empty "
        "prompt (whitespace only: '\\n\\t'); line 4: prompt: empty prompt; … 3 more"
    )
    got = prepare_dataset(task(bad_rows="skip", shuffle=False), data_path=path, tokenizer=tok, out_dir=tmp_path / "s")
    assert [got.prompt(k).source_row for k in range(len(got))] == ["line 1", "line 8"]
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["bad_rows"][3:] == [
        f"{path}:line 5: prompt: empty prompt (every message's content is empty)",
        f"{path}:line 6: prompt: empty prompt (every message's content is empty)",
        f"{path}:line 7: prompt: message [1]: empty prompt (a user message with no content)",
    ]


def test_verl_shapes_rlctl_does_not_train_are_warned_of_at_check_one_line_each_with_their_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows of a reward model (reward_model.style 'model'), with images, or whose prompt is a JSON string of chat
    messages passed check unsaid (scored by the rule function, trained on text alone, tokenized as JSON text)."""
    import logging

    from rlctl.rl.dataset_scan import check_rows

    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    messages = [{"role": "user", "content": "what is 1 + 2 ?"}]
    rows: list[dict[str, Any]] = [
        {"prompt": messages, "reward_model": {"style": "model", "ground_truth": "3"}, "images": [{"path": "a.png"}]},
        {"prompt": messages, "reward_model": {"style": "model", "ground_truth": "3"}, "images": []},
        {"prompt": messages, "reward_model": {"style": "rule", "ground_truth": "3"}, "images": None},
        {"prompt": json.dumps(messages), "ground_truth": "3"},
        {"prompt": "[{not json", "ground_truth": "3"},
    ]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    caplog.set_level(logging.WARNING, logger="rlctl.rl.dataset_scan")
    assert check_rows(task(reward="r.py:f"), data_path=path, tokenizer=tok).good == 5
    assert [r.getMessage() for r in caplog.records] == [
        f"dataset {path}: 2 of 5 rows have reward_model.style 'model' (verl scores them with a reward model); rlctl "
        "runs none: task.reward 'r.py:f' scores them",
        f"dataset {path}: 1 of 5 rows have images (or videos); rlctl trains on text: their prompts are tokenized "
        "without them",
        f"dataset {path}: 1 of 5 prompts (task.prompt_key 'prompt') are strings holding JSON chat messages, "
        "tokenized as that text; store them as lists of messages (json.loads the column) for the chat template",
    ]
    caplog.clear()
    plain = write_jsonl(tmp_path / "plain.jsonl", rows[2:3])
    assert check_rows(task(), data_path=plain, tokenizer=tok).good == 1
    assert caplog.records == []


def test_a_parquet_maps_date_keys_are_iso_strings_and_bytes_keys_one_bad_row(tmp_path: Path) -> None:
    """A map column keyed by dates (map<date32, string>) reaches the reward with ISO-string keys, and one keyed by
    bytes is one bad row naming the field, versus each row passed by check and the launch's prepare ending in
    `TypeError: keys must be str, int, float, bool or None` after tokenizing the whole file (the keys were never
    converted, only the values)."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.errors import ConfigError

    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    table = pa.table(
        {
            "prompt": ["what is 1 + 2 ?", "what is 2 + 2 ?"],
            "ground_truth": ["3", "4"],
            "days": pa.array([[(datetime.date(2024, 1, 2), "a")], []], pa.map_(pa.date32(), pa.string())),
            "raw": pa.array([[(b"k", "a")], [(b"j", "b")]], pa.map_(pa.binary(), pa.string())),
        }
    )
    path = tmp_path / "train.parquet"
    pq.write_table(table, path)
    days = task(path="train.parquet", extra_info_key="days", shuffle=False)
    got = prepare_dataset(days, data_path=path, tokenizer=tok, out_dir=tmp_path / "d")
    assert [got.prompt(k).extra_info for k in (0, 1)] == [{"2024-01-02": "a"}, {}]
    raw = task(path="train.parquet", extra_info_key="raw")
    with pytest.raises(ConfigError, match=r"all 2 rows: raw: not JSON-serialisable: raw has a key of type bytes"):
        prepare_dataset(raw, data_path=path, tokenizer=tok, out_dir=tmp_path / "r")


def test_template_kwargs_are_json_values_and_may_be_named_template(tmp_path: Path) -> None:
    """An unquoted YAML date in chat_template_kwargs is refused in one line naming it, versus passed by check and the
    launch's prepare ending in a TypeError at the manifest (its value not JSON, and the job's record holding it as a
    string: a resume's identity never the launch's); a variable named `template` reaches the template, versus a
    TypeError from render_chat_template (its own parameter's name)."""
    import datetime

    with pytest.raises(ValueError, match=r"today: datetime\.date\(2024, 7, 26\) is not a JSON value .*quote a date"):
        task(chat_template_kwargs={"today": datetime.date(2024, 7, 26)})
    model = write_tokenizer(tmp_path / "model", chat_template="{{ bos_token }}{{ template }}")
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": [{"role": "user", "content": "hi"}], "ground_truth": "3"}])
    got = prepare_dataset(
        task(shuffle=False, chat_template_kwargs={"template": "hello"}),
        data_path=path,
        tokenizer=load_tokenizer(model),
        out_dir=tmp_path / "d",
    )
    assert got.prompt(0).tokens == [ID["<s>"], len(SPECIALS) + WORDS.index("hello")]
