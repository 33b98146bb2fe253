"""The tokenizer of a Hugging Face model directory, without transformers: encode, decode, chat template, EOS ids.

    model_dir/
      tokenizer.json           vocabulary, pre-tokenizer, post-processor   → `tokenizers.Tokenizer`
      tokenizer_config.json    special tokens, `chat_template`              → template variables
      special_tokens_map.json  (older saves) special tokens: win over tokenizer_config's, unless that has
                               added_tokens_decoder (then not read), as transformers reads them
      chat_template.jinja      (newer exports) the template; wins over tokenizer_config's
      additional_chat_templates/default.jinja   wins over both (transformers' named templates; only `default` used)
      generation_config.json   eos_token_id (int or list)  ┐
      config.json              eos_token_id (int or list;  ├ EOS ids: the union, in this order
                               none: its architecture's)   │
                               tokenizer_config eos_token  ┘

The chat template is rendered the way transformers renders it (sandboxed jinja2 with trim_blocks and
lstrip_blocks, `raise_exception`, a `tojson` that keeps non-ASCII, `{% generation %}` blocks, the special tokens as
variables), and the rendered text is encoded without adding special tokens again: the template already holds them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from rlctl.errors import ConfigError

ADDITIONAL_TEMPLATES = "additional_chat_templates"  # transformers' CHAT_TEMPLATE_DIR
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TextTokenizer(Protocol):
    """What the dataset and the reward path need from a tokenizer."""

    model_dir: Path  # where it was read from: what an error about it names

    @property
    def eos_ids(self) -> tuple[int, ...]: ...

    @property
    def has_chat_template(self) -> bool: ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], *, template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...

    def fingerprint(self) -> str: ...


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(str(path), None, f"cannot read JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(str(path), None, f"top level must be an object, got {type(data).__name__}")
    return data


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _special_tokens(model_dir: Path, config: dict[str, Any]) -> dict[str, str]:
    """The special tokens as transformers reads them: tokenizer_config.json's, each one special_tokens_map.json names
    (an older save's: a bos_token there alone) taken from it instead, unless tokenizer_config.json has
    added_tokens_decoder (transformers then reads no special_tokens_map.json). Read from tokenizer_config.json alone,
    such a checkpoint's templated prompts lost their BOS ({{ bos_token }} undefined), where transformers has it."""
    merged = dict(config)
    if "added_tokens_decoder" not in config:
        merged.update(_read_json(model_dir / "special_tokens_map.json"))
    return {key: text for key in SPECIAL_TOKEN_KEYS if (text := _token_text(merged.get(key))) is not None}


def _config_eos(model_dir: Path) -> list[int]:
    """config.json's eos_token_id, or where it has no such key its architecture's as transformers reads it (Llama's
    and Mistral's 2, Phi3's 32000: `hf.read_config`), as the engines stop at it: the held-out evaluation's outputs
    end where the run's did."""
    raw = _read_json(config := model_dir / "config.json")
    if not raw or "eos_token_id" in raw:
        return _ids(raw.get("eos_token_id"))
    from rlctl.models import hf

    try:  # (the dict read, versus the file read again by `hf.read_config`)
        return list(hf.TinyGPTConfig.from_hf(raw, file=str(config)).eos_token_ids)
    except ConfigError:  # (a config check refuses, in its own words)
        return []


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _chat_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    """The template apply_chat_template renders without a name, as transformers picks it: chat_template.jinja and
    additional_chat_templates/NAME.jinja (its `default.jinja` read last, winning) over tokenizer_config.json's; of
    files, the `default` one (none: transformers refuses to pick, and so no template here)."""
    files: dict[str, str] = {}
    if (jinja_file := model_dir / "chat_template.jinja").exists():
        files["default"] = jinja_file.read_text(encoding="utf-8")
    for path in sorted((model_dir / ADDITIONAL_TEMPLATES).glob("*.jinja")):
        files[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if files:
        return files.get("default")
    template = config.get("chat_template")
    if isinstance(template, list):  # older multi-template form: [{name, template}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.cache
def _generation_extension() -> type:
    """transformers' `{% generation %}…{% endgeneration %}` tag (it marks the assistant's tokens for training masks):
    the body rendered as it is. Without it a model whose template has the tag had every chat-message row refused
    ('Encountered unknown tag generation'), where transformers renders it."""
    import jinja2.ext
    from jinja2 import nodes

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja's own Extension declares it so)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return Generation


@functools.cache
def _environment() -> Any:
    """The jinja2 environment chat templates are rendered in, as transformers makes it."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _generation_extension()]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """`template` compiled once: compiling it again for each row made a dataset of chat-message prompts ~1 ms a row
    slower to tokenize (200k rows: minutes)."""
    return _environment().from_string(template)


def template_variables(template: str) -> frozenset[str]:
    """The variables `template` reads from its caller (jinja2's find_undeclared_variables, which vLLM's
    resolve_chat_template_kwargs keeps a request's chat_template_kwargs to): the messages, the special tokens, a
    variable such as Qwen3's enable_thinking; not the environment's functions (raise_exception). A variable the
    template sets before it reads it is not one: a value passed for it is never read. ValueError: it does not parse."""
    import jinja2.meta

    env = _environment()
    try:
        parsed = env.parse(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"chat template: {e}") from e
    return frozenset(jinja2.meta.find_undeclared_variables(parsed) - set(env.globals))


def chat_template_of(model_dir: Path) -> str | None:
    """The chat template `HFTokenizer(model_dir)` renders (`_chat_template`), read without its tokenizer.json."""
    return _chat_template(model_dir, _read_json(model_dir / "tokenizer_config.json"))


def render_chat_template(template: str, messages: Sequence[dict[str, Any]], /, **variables: Any) -> str:
    """Render `template` for `messages` with `add_generation_prompt=True`, as transformers does."""
    import jinja2

    try:
        # tools and documents None, as transformers passes them: undefined, `tools is not none` held (Mistral's
        # templates), so a prompt gained the tools header that transformers leaves out
        return str(
            _compiled(template).render(
                messages=list(messages), tools=None, documents=None, add_generation_prompt=True, **variables
            )
        )
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"chat template: {e}") from e
    except Exception as e:  # the model's template is foreign code: anything it raises on a row's
        # messages (`'…' + None`, a missing key) is that row's problem, named by the caller, not a crash
        raise ValueError(f"chat template: {type(e).__name__}: {e}") from e


class HFTokenizer:
    """A model directory's tokenizer (see the module docstring for the files read)."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self.model_dir = model_dir
        tok_file = model_dir / "tokenizer.json"
        if not tok_file.exists():
            raise ConfigError(
                str(tok_file), None, "no such file; the model directory needs a fast tokenizer (tokenizer.json)"
            )
        try:
            self._tok = Tokenizer.from_file(str(tok_file))
        except Exception as e:  # the tokenizers library raises plain Exception on bad files
            raise ConfigError(str(tok_file), None, f"cannot load tokenizer: {e}") from e
        config = _read_json(model_dir / "tokenizer_config.json")
        self.special_tokens = _special_tokens(model_dir, config)
        self.chat_template = _chat_template(model_dir, config)
        eos: list[int] = []
        eos += _ids(_read_json(model_dir / "generation_config.json").get("eos_token_id"))
        eos += _config_eos(model_dir)
        eos_text = self.special_tokens.get("eos_token")
        if eos_text is not None and (i := self._tok.token_to_id(eos_text)) is not None:
            eos.append(i)
        self._eos_ids = tuple(dict.fromkeys(eos))
        pad_text = self.special_tokens.get("pad_token")
        pad = self._tok.token_to_id(pad_text) if pad_text is not None else None
        self.pad_id: int = pad if pad is not None else (self._eos_ids[0] if self._eos_ids else 0)
        bos_text = self.special_tokens.get("bos_token")
        self.bos_id: int | None = self._tok.token_to_id(bos_text) if bos_text is not None else None

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], *, template_kwargs: Mapping[str, Any] | None = None
    ) -> str:
        """The prompt text for `messages`, ending with the assistant header (`add_generation_prompt=True`);
        `template_kwargs` (task.chat_template_kwargs: Qwen3's enable_thinking) are variables of the template, over
        the special tokens of the same name, as transformers passes its apply_chat_template's extra kwargs."""
        if self.chat_template is None:
            raise ValueError(f"the tokenizer in {self.model_dir} has no chat_template")
        return render_chat_template(self.chat_template, messages, **{**self.special_tokens, **(template_kwargs or {})})

    def encode_chat(
        self, messages: Sequence[dict[str, Any]], *, template_kwargs: Mapping[str, Any] | None = None
    ) -> list[int]:
        return self.encode(
            self.apply_chat_template(messages, template_kwargs=template_kwargs), add_special_tokens=False
        )

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def fingerprint(self) -> str:
        """Hash of everything that changes token ids: the tokenizer, the template, the EOS ids."""
        h = hashlib.sha256((self.model_dir / "tokenizer.json").read_bytes())
        h.update(json.dumps([self.chat_template, self.special_tokens, self._eos_ids], sort_keys=True).encode())
        return h.hexdigest()[:16]


def load_tokenizer(model_dir: Path) -> HFTokenizer:
    if not model_dir.is_dir():
        raise ConfigError(str(model_dir), None, "no such directory; expected a Hugging Face model directory")
    return HFTokenizer(model_dir)


def cut_at_eos(ids: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """`ids` up to (not including) the first EOS id."""
    stop = set(eos_ids)
    for i, t in enumerate(ids):
        if t in stop:
            return list(ids[:i])
    return list(ids)


def decode_output(tokenizer: TextTokenizer, ids: Sequence[int]) -> str:
    """The text a reward function scores: the output cut at the first EOS, special tokens dropped."""
    return tokenizer.decode(cut_at_eos(ids, tokenizer.eos_ids), skip_special_tokens=True)
