import json
from pathlib import Path

import pytest

from rlctl.errors import ConfigError
from rlctl.models.hf import TinyGPTConfig, read_config
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.tokenizer import cut_at_eos, decode_output, load_tokenizer, render_chat_template
from tests.unit.hf_checkpoints import config_reads
from tests.unit.hf_tokenizer import SPECIALS, write_tokenizer

ID = {t: i for i, t in enumerate(SPECIALS)}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return write_tokenizer(tmp_path / "model")


def test_encode_decode_and_special_ids(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    ids = tok.encode("what is 1 + 2 ?")
    assert ids[0] == ID["<s>"] == tok.bos_id  # the post-processor prepends BOS
    assert tok.encode("what is", add_special_tokens=False) == ids[1:3]
    assert tok.decode(ids) == "what is 1 + 2 ?"
    assert tok.encode("zebra", add_special_tokens=False) == [ID["<unk>"]]
    assert tok.eos_ids == (ID["<|end|>"], ID["</s>"])  # generation_config first, then tokenizer_config's eos_token
    assert tok.pad_id == ID["<pad>"]
    assert tok.vocab_size == len(SPECIALS) + 17


def test_chat_template_renders_like_transformers(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    messages = [{"role": "system", "content": "the answer"}, {"role": "user", "content": "what is 1 + 2 ?"}]
    text = tok.apply_chat_template(messages)
    assert text == "<s> <|system|> the answer <|end|> <|user|> what is 1 + 2 ? <|end|> <|assistant|>"
    ids = tok.encode_chat(messages)
    assert ids[0] == ID["<s>"] and ids.count(ID["<s>"]) == 1  # BOS from the template only, not added twice
    assert ids[-1] == ID["<|assistant|>"]
    with pytest.raises(ValueError, match="chat template: unknown role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


GENERATION_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %} <|user|> {{ m['content'] }} <|end|>"
    "{% else %}{% generation %} <|assistant|> {{ m['content'] }} <|end|>{% endgeneration %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %} <|assistant|>{% endif %}"
)


def test_a_template_with_transformers_generation_tag_renders_its_body(tmp_path: Path) -> None:
    """`{% generation %}` (transformers' mark of the assistant's tokens) was an unknown tag: every chat-message row of a
    model whose template has it was refused. Its body renders as transformers renders it (checked against
    PreTrainedTokenizerFast.apply_chat_template when these strings were written)."""
    d = write_tokenizer(tmp_path / "m")
    (d / "chat_template.jinja").write_text(GENERATION_TEMPLATE)
    tok = load_tokenizer(d)
    shot = [{"role": "user", "content": "1 + 1"}, {"role": "assistant", "content": "2"}]
    assert tok.apply_chat_template([*shot, {"role": "user", "content": "what is 1 + 2 ?"}]) == (
        "<s> <|user|> 1 + 1 <|end|> <|assistant|> 2 <|end|> <|user|> what is 1 + 2 ? <|end|> <|assistant|>"
    )


def test_a_template_sees_tools_and_documents_as_none_as_transformers_passes_them() -> None:
    """Undefined, `tools is not none` held, and a template that adds a tools header then (Mistral's) put it in every
    prompt, where transformers (tools=None, documents=None) leaves it out: 'hi' from both, checked against
    PreTrainedTokenizerFast.apply_chat_template."""
    template = (
        "{% if tools is not none %}[TOOLS]{% endif %}{% if documents is not none %}[DOCS]{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    assert render_chat_template(template, [{"role": "user", "content": "hi"}]) == "hi"


def test_template_file_wins_and_json_keeps_unicode(tmp_path: Path) -> None:
    d = write_tokenizer(tmp_path / "m")
    (d / "chat_template.jinja").write_text("{{ messages | tojson }}{% if add_generation_prompt %}!{% endif %}")
    tok = load_tokenizer(d)
    assert tok.apply_chat_template([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]!'
    assert render_chat_template("{{ eos_token }}", [], eos_token="</s>") == "</s>"


def test_no_template_and_eos_from_config_json(tmp_path: Path) -> None:
    d = write_tokenizer(tmp_path / "m", chat_template=None)
    (d / "generation_config.json").unlink()
    (d / "config.json").write_text(json.dumps({"eos_token_id": ID["<|end|>"]}))
    tok = load_tokenizer(d)
    assert not tok.has_chat_template
    assert tok.eos_ids == (ID["<|end|>"], ID["</s>"])
    with pytest.raises(ValueError, match="no chat_template"):
        tok.encode_chat([{"role": "user", "content": "hello"}])


def test_fingerprint_follows_the_template(tmp_path: Path) -> None:
    a = load_tokenizer(write_tokenizer(tmp_path / "a")).fingerprint()
    assert a == load_tokenizer(write_tokenizer(tmp_path / "b")).fingerprint()
    assert a != load_tokenizer(write_tokenizer(tmp_path / "c", chat_template="{{ 'x' }}")).fingerprint()


def test_missing_or_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such directory"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"tokenizer\.json: no such file"):
        load_tokenizer(tmp_path / "empty")
    d = write_tokenizer(tmp_path / "bad")
    (d / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"tokenizer_config\.json: cannot read JSON"):
        load_tokenizer(d)


def test_output_cut_at_first_eos(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    out = [*tok.encode("the answer is 3", add_special_tokens=False), ID["<|end|>"], *tok.encode("hello")]
    assert cut_at_eos(out, tok.eos_ids) == out[:4]
    assert cut_at_eos([5, 6], [2]) == [5, 6]
    assert decode_output(tok, out) == "the answer is 3"
    assert decode_output(tok, [ID["<s>"], *out]) == "the answer is 3"  # special tokens are dropped


def test_a_chat_template_is_compiled_once_for_every_row_it_renders() -> None:
    """It was compiled again for each row (~1 ms: 200k chat-message rows took minutes more to tokenize)."""
    from rlctl.rl import tokenizer

    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}-once-"
    before = tokenizer._compiled.cache_info()
    said = [render_chat_template(template, [{"role": "user", "content": str(i)}]) for i in range(50)]
    after = tokenizer._compiled.cache_info()
    assert said[7] == "<user>7-once-" and (after.misses - before.misses, after.hits - before.hits) == (1, 49)
    with pytest.raises(ValueError, match="chat template: "):  # one that does not compile: said as before
        render_chat_template("{% for %}", [])


@pytest.mark.parametrize(("key", "want"), [(None, (2,)), ([], ()), (7, (7,))], ids=["none", "empty", "named"])
def test_a_config_without_eos_token_id_gives_its_architectures_as_the_engines_read_it(
    tmp_path: Path, key: object, want: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Llama whose config.json has no eos_token_id (nor its tokenizer files an EOS): LlamaConfig's 2, which the
    engines stop at (`hf.read_config`), versus none — the held-out evaluation generating past the run's ends. A
    key given (a list, even empty) is as given. config.json is read once (its architecture's EOS was read from the
    file again)."""
    d = write_tokenizer(tmp_path / "m", chat_template=None)
    (d / "generation_config.json").unlink()
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    TinyGPT(TinyGPTConfig()).save_pretrained(tmp_path / "w")
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    del config["eos_token_id"]
    (d / "config.json").write_text(json.dumps(config if key is None else config | {"eos_token_id": key}))
    assert read_config(d).eos_token_ids == (want if key is not None else (2,))
    reads = config_reads(monkeypatch)
    assert load_tokenizer(d).eos_ids == want
    assert reads == [d / "config.json"]


BOS_TEMPLATE = "{{ bos_token }}{% for m in messages %} <|{{ m['role'] }}|> {{ m['content'] }}{% endfor %}"


@pytest.mark.parametrize(
    ("config_bos", "map_bos", "decoder"),
    [
        (None, "<s>", False),  # an older save's: bos_token in special_tokens_map.json alone
        ("<|system|>", "<s>", False),  # both: special_tokens_map.json's, as transformers reads it
        ("<|system|>", "<s>", True),  # added_tokens_decoder: transformers reads no special_tokens_map.json
        (None, {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False}, False),
    ],
)
def test_special_tokens_map_is_read_as_transformers_reads_it(
    tmp_path: Path, config_bos: str | None, map_bos: object, decoder: bool
) -> None:
    """special_tokens_map.json (older HF saves) was not read: a bos_token there alone was undefined in the template,
    the prompt's ids [4, …] where transformers gives [1, 4, …]. Checked against transformers' own tokenizer."""
    transformers = pytest.importorskip("transformers")
    d = write_tokenizer(tmp_path / "model", chat_template=BOS_TEMPLATE)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.pop("bos_token")
    if config_bos is not None:
        config["bos_token"] = config_bos
    if decoder:
        config["added_tokens_decoder"] = {
            "5": {"content": "<|system|>", "lstrip": False, "normalized": False, "rstrip": False, "special": True}
        }
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": map_bos, "eos_token": "</s>"}))
    messages = [{"role": "user", "content": "what is 1 + 2 ?"}]
    theirs = transformers.AutoTokenizer.from_pretrained(str(d)).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    ours = load_tokenizer(d).encode_chat(messages)
    assert ours == list(theirs)
    assert ours[0] == (ID["<|system|>"] if config_bos and decoder else ID["<s>"])


def test_the_default_of_additional_chat_templates_is_the_template_as_transformers_reads_it(tmp_path: Path) -> None:
    """additional_chat_templates/default.jinja wins over chat_template.jinja and tokenizer_config.json's (transformers
    reads its named templates after chat_template.jinja), versus the template of tokenizer_config.json rendered; and
    the directory goes with the model's tokenizer files (`copy_tokenizer_files`)."""
    transformers = pytest.importorskip("transformers")
    from rlctl.models.hfdir import copy_tokenizer_files

    d = write_tokenizer(tmp_path / "model")
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "default.jinja").write_text(BOS_TEMPLATE + " <|assistant|>")
    (d / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages | tojson }}")
    messages = [{"role": "user", "content": "hello world"}]
    theirs = transformers.AutoTokenizer.from_pretrained(str(d)).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert load_tokenizer(d).encode_chat(messages) == list(theirs)
    assert load_tokenizer(d).apply_chat_template(messages) == "<s> <|user|> hello world <|assistant|>"
    assert "additional_chat_templates" in copy_tokenizer_files(d, tmp_path / "out")
    assert load_tokenizer(tmp_path / "out").encode_chat(messages) == list(theirs)
