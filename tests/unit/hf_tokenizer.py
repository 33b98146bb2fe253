"""A tiny Hugging Face tokenizer directory for tests: word-level, a chat template, generation_config EOS.

write_tokenizer(tmp_path / "model", words=["hello", "world"])
  tokenizer.json          WordLevel over SPECIALS + words, whitespace pre-tokenizer, BOS prepended
  tokenizer_config.json   bos/eos/pad/unk tokens, CHAT_TEMPLATE (unless chat_template=None)
  generation_config.json  eos_token_id: [<|end|>, </s>]
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|system|>", "<|assistant|>", "<|end|>"]
WORDS = ["the", "answer", "is", "what", "hello", "world", "a", "b", "c", "1", "2", "3", "4", "5", "+", "=", "?"]

# Renders: <s> <|user|> what is 1 + 2 ? <|end|> <|assistant|>
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}"
    "{% endif %}"
    " <|{{ m['role'] }}|> {{ m['content'] }} <|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %} <|assistant|>{% endif %}"
)


def write_tokenizer(
    model_dir: Path,
    *,
    words: Sequence[str] = WORDS,
    chat_template: str | None = CHAT_TEMPLATE,
    generation_eos: Sequence[str] = ("<|end|>", "</s>"),
) -> Path:
    """Write the tokenizer files into `model_dir` (created) and return it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *dict.fromkeys(words)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(model_dir / "tokenizer.json"))
    config: dict[str, object] = {
        "bos_token": "<s>",
        "eos_token": {
            "__type": "AddedToken",
            "content": "</s>",
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "special": True,
        },
        "pad_token": "<pad>",
        "unk_token": "<unk>",
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [vocab[t] for t in generation_eos]}))
    return model_dir
