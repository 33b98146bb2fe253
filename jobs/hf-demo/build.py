"""Build the HF demo's inputs: a tiny Qwen2-architecture checkpoint with a word-level tokenizer and a chat
template, and the jsonl dataset — all made here (nothing can be downloaded), in the files a user's own
job would point at:

    python jobs/hf-demo/build.py [--out jobs/hf-demo] [--rows 4096] [--sft-steps 300] [--shape qwen2-0.5b]

    model/      config.json (Qwen2ForCausalLM: 3 heads of 32, q/k/v bias, tied embeddings),
                model.safetensors, tokenizer.json, tokenizer_config.json (chat template),
                generation_config.json (two EOS ids)
    data.jsonl  {"prompt": [{"role": "user", "content": "3 1 7 2 ="}], "ground_truth": "a a a b c …",
                 "data_source": "letters", "extra_info": {"index": i}}

The task is the digits demo spelled as words: digit k asks for k copies of the k-th letter. A short
SFT warm-up on other prompts than the dataset's teaches the format, so RL starts above zero reward.

`--shape qwen2-0.5b` builds Qwen2-0.5B's architecture instead (hidden 896, 24 layers, 14 query and 2 key/value
heads, vocabulary 151,936: the tokenizer's words padded with unused tokens), random and in bf16 as such
checkpoints ship: the model a GPU check launches (`python -m bench gpu-check`), not one that learns the task.
`--shape tiny-qwen3` and `--shape tiny-llama3` build the tiny model as Qwen3 (its per-head q/k RMSNorm, head_dim 64)
and as Llama 3.1 (its `llama3` RoPE scaling over a 32-token pretraining context), to run those architectures' paths;
`--shape tiny-phi3` as Phi3 (4 query heads sharing 2 key/value heads, untied, its file holding q/k/v as one
`qkv_proj` and gate/up as one `gate_up_proj`, as transformers writes Phi-3 and Phi-4); `--shape tiny-mistral-window`
as a Mistral whose `sliding_window` binds as v0.1's does (96 of 256 positions; its 4096 of 32768), the window exactly
the hf-demo job's context (its max_prompt_tokens + max_output_tokens), so that job runs at the window's edge and
`rlctl check` refuses one asking a token more; `--shape tiny-qwen3moe` as a Qwen3MoE (top 2 of 4 routed experts in
layers 0 and 2, layer 1 dense: `mlp_only_layers`; each expert's tensors apart in its file); `--shape tiny-qwen2moe` as
a Qwen2MoE (Qwen1.5-MoE-A2.7B's: those experts, not renormalised, beside a gated shared expert 96 wide).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import time
from pathlib import Path

import torch

from rlctl.models.hf import LLAMA, MISTRAL, PHI3, QWEN2, QWEN2_MOE, QWEN3, QWEN3_MOE, MoeConfig, RopeScaling
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = [*"123456789", "=", *LETTERS]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %} <|{{ m['role'] }}|> {{ m['content'] }} <|end|>{% endfor %}"
    "{% if add_generation_prompt %} <|assistant|>{% endif %}"
)


def example(rng: random.Random) -> tuple[str, str]:
    """One prompt and its answer; the answer length is long-tailed (lognormal digit sum, capped)."""
    total = min(max(1, round(rng.lognormvariate(math.log(12), 0.6))), 54)
    k = max(math.ceil(total / 9), min(rng.randint(1, 4), total))  # ≤ 6 digits, each 1–9
    digits = [1] * k
    for _ in range(total - k):
        free = [i for i, d in enumerate(digits) if d < 9]
        digits[rng.choice(free)] += 1
    prompt = " ".join(str(d) for d in digits) + " ="
    answer = " ".join(LETTERS[i] for i, d in enumerate(digits) for _ in range(d))
    return prompt, answer


def write_tokenizer(model_dir: Path, *, vocab_size: int | None = None) -> dict[str, int]:
    """The word-level tokenizer files; `vocab_size` pads the vocabulary with unused tokens up to that many."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = [*SPECIALS, *WORDS]
    words += [f"<unused_{i}>" for i in range((vocab_size or len(words)) - len(words))]
    vocab = {t: i for i, t in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(model_dir / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    eos = [vocab["<|end|>"], vocab["</s>"]]
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}) + "\n")
    return vocab


def sft(model: TinyGPT, vocab: dict[str, int], *, steps: int, seed: int) -> None:
    """Teacher-forced warm-up on prompts drawn apart from the dataset's (loss on the answer tokens only)."""
    rng = random.Random(seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30) * (1 - s / max(steps, 1)) + 0.05)
    head = [vocab["<s>"], vocab["<|user|>"]]
    model.train()
    for _ in range(steps):
        rows, masks = [], []
        for _ in range(32):
            p, a = example(rng)
            ptoks = [*head, *(vocab[w] for w in p.split()), vocab["<|end|>"], vocab["<|assistant|>"]]
            atoks = [*(vocab[w] for w in a.split()), vocab["<|end|>"]]
            rows.append(ptoks + atoks)
            masks.append([0] * len(ptoks) + [1] * len(atoks))
        n = max(map(len, rows))
        x = torch.tensor([r + [vocab["<pad>"]] * (n - len(r)) for r in rows])
        m = torch.tensor([r + [0] * (n - len(r)) for r in masks], dtype=torch.float32)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        loss = (loss * m[:, 1:]).sum() / m[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()


# the hf-demo job's context: jobs/hf-demo.yaml's max_prompt_tokens 32 + max_output_tokens 64 (tiny-mistral-window's
# sliding_window)
HF_DEMO_CONTEXT = 32 + 64

# architecture keys by --shape: the demo's tiny model (as Qwen2, Qwen3, Llama 3.1, Phi3 or a windowed Mistral), or
# Qwen2-0.5B's (hidden 896, 24 layers, 14/2 heads)
TINY = {
    "hidden_size": 96,
    "intermediate_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 3,
    "num_key_value_heads": 3,
    "max_position_embeddings": 256,
}
SHAPES: dict[str, dict[str, object]] = {
    "tiny": TINY,
    "tiny-qwen3": {**TINY, "architecture": QWEN3, "explicit_head_dim": 64},
    "tiny-llama3": {
        **TINY,
        "architecture": LLAMA,
        "rope_scaling": RopeScaling("llama3", 8.0, 1.0, 4.0, 32),
        "tie_word_embeddings": False,
    },
    "tiny-phi3": {
        **TINY,
        "architecture": PHI3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    },
    "tiny-mistral-window": {
        **TINY,
        "architecture": MISTRAL,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
        "sliding_window": HF_DEMO_CONTEXT,
    },
    "tiny-qwen3moe": {  # Qwen3-30B-A3B's architecture: top 2 of 4 experts renormalised, layer 1 dense
        **TINY,
        "architecture": QWEN3_MOE,
        "tie_word_embeddings": False,
        "moe": MoeConfig(4, 2, moe_intermediate_size=64, norm_topk_prob=True, mlp_only_layers=(1,)),
    },
    "tiny-qwen2moe": {  # Qwen1.5-MoE-A2.7B's architecture: top 2 of 4 experts and a shared expert, layer 1 dense
        **TINY,
        "architecture": QWEN2_MOE,
        "tie_word_embeddings": False,
        "moe": MoeConfig(4, 2, moe_intermediate_size=64, mlp_only_layers=(1,), shared_expert_intermediate_size=96),
    },
    "qwen2-0.5b": {
        "vocab_size": 151_936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "rope_fp64_angles": False,
    },
}


def build(out: Path, *, rows: int, sft_steps: int, seed: int = 0, shape: str = "tiny") -> None:
    t0 = time.monotonic()
    torch.manual_seed(seed)
    keys = {"architecture": QWEN2, "tie_word_embeddings": True, **SHAPES[shape]}
    vocab = write_tokenizer(out / "model", vocab_size=keys.pop("vocab_size", None))  # type: ignore[arg-type]
    cfg = TinyGPTConfig(
        vocab_size=len(vocab),
        **keys,  # type: ignore[arg-type]
        bos_token_id=vocab["<s>"],
        eos_token_id=[vocab["<|end|>"], vocab["</s>"]],
        pad_token_id=vocab["<pad>"],
    )
    # a window that binds refuses a model holding every position (TinyGPT's RoPE tables hold max_position_embeddings):
    # the model is made and warmed up without it (the SFT sequences are shorter) and saved with it
    model = TinyGPT(dataclasses.replace(cfg, sliding_window=None))
    if sft_steps:
        sft(model, vocab, steps=sft_steps, seed=seed)
    model.config = cfg
    model.save_pretrained(out / "model", dtype=torch.float32 if shape.startswith("tiny") else torch.bfloat16)
    rng = random.Random(seed)
    with (out / "data.jsonl").open("w") as f:
        for i in range(rows):
            p, a = example(rng)
            row = {
                "prompt": [{"role": "user", "content": p}],
                "ground_truth": a,
                "data_source": "letters",
                "extra_info": {"index": i},
            }
            f.write(json.dumps(row) + "\n")
    print(
        f"built {out}/model ({sft_steps} SFT steps) and {out}/data.jsonl ({rows} rows) in {time.monotonic() - t0:.1f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=list(SHAPES), default="tiny")
    args = ap.parse_args()
    if args.shape.startswith("tiny"):
        torch.set_num_threads(1)
    build(args.out, rows=args.rows, sft_steps=args.sft_steps, seed=args.seed, shape=args.shape)


if __name__ == "__main__":
    main()
