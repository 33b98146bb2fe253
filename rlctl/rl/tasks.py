"""The demo task (DESIGN §10): synthetic, verifiable, with long-tailed, prompt-dependent output lengths.

    prompt  3172=          k digits (1–9) then '='
    answer  aaabcccccccdd  d₁ copies of 'a', d₂ of 'b', … (letters a–z then A–Z), then EOS

The answer length is the digit sum. For prompt i the sum L is drawn lognormal (median
`median_output_tokens`, σ = `sigma`, capped so that answer + EOS ≤ `max_output_tokens`), the number
of digits k uniformly in [num_digits_min, num_digits_max] and raised to ⌈L/9⌉ when L needs more
digits; L is then split into k digits 1–9. With the defaults: median 30, p95 ≈ 111, p99 ≈ 178.

Reward (rule-based verifier): 1.0 for an exact answer, else the fraction of (letter, count) runs that
are right, position by position, over max(#expected runs, #produced runs).
Prompts are a pure function of (task seed, index), so every prompt id can be regenerated. The index
space is cut in three, so no index is drawn by two uses:

    [0, RL_OFFSET)                 SFT warm-up (drawn at random)
    [RL_OFFSET, HELDOUT_OFFSET)    RL: `rl_index(iteration, j)`
    [HELDOUT_OFFSET, …)            held-out evaluation: `heldout_index(i)` (rlctl.rl.evaluate)

With `growth_per_iteration` g the median length of RL iteration i is median × (1 + g·i) (a run whose
outputs lengthen, as with inference-time scaling: StreamRL Fig. 11); SFT and held-out prompts keep the
base median. Disjoint indices are not disjoint texts: short prompts (`5=`) recur in every stream.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from rlctl.config.task import DigitsTask as DigitsTaskConfig

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_DIGITS = len(LETTERS)  # one letter per digit position
RL_OFFSET = 10**12  # RL prompt indices start here; SFT draws indices below it at random
RL_STRIDE = 10**6  # indices per RL iteration: the iteration is recoverable from the index alone
HELDOUT_OFFSET = 2**62  # held-out prompts: above every RL index of any feasible run (4.6·10¹² iterations)


def rl_index(iteration: int, j: int) -> int:
    assert 0 <= j < RL_STRIDE, j
    return RL_OFFSET + iteration * RL_STRIDE + j


def heldout_index(i: int) -> int:
    assert i >= 0, i
    return HELDOUT_OFFSET + i


class CharTokenizer:
    """Character tokenizer: PAD, BOS, EOS, then the digits, '=', a–z, A–Z (66 ids)."""

    PAD = 0
    BOS = 1
    EOS = 2
    CHARS = "0123456789=" + LETTERS

    def __init__(self) -> None:
        self._id = {c: i + 3 for i, c in enumerate(self.CHARS)}

    @property
    def vocab_size(self) -> int:
        return 3 + len(self.CHARS)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._id[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the demo vocabulary {self.CHARS!r}") from None

    def decode(self, tokens: list[int]) -> str:
        """Text of `tokens` up to the first EOS; PAD and BOS are dropped."""
        out = []
        for t in tokens:
            if t == self.EOS:
                break
            if t >= 3:
                out.append(self.CHARS[t - 3])
        return "".join(out)


TOKENIZER = CharTokenizer()
PAD, BOS, EOS = CharTokenizer.PAD, CharTokenizer.BOS, CharTokenizer.EOS
VOCAB_SIZE = TOKENIZER.vocab_size


def encode(text: str) -> list[int]:
    return TOKENIZER.encode(text)


def decode(tokens: list[int]) -> str:
    return TOKENIZER.decode(tokens)


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str  # "3172="
    tokens: list[int]  # [BOS] + encode(text)
    answer: str  # "aaabcccccccdd"

    @property
    def target_tokens(self) -> int:
        """Length of the correct output, EOS included."""
        return len(self.answer) + 1


def answer_for(digits: str) -> str:
    return "".join(LETTERS[i] * int(d) for i, d in enumerate(digits))


def _runs(text: str) -> list[tuple[str, int]]:
    return [(c, len(list(g))) for c, g in itertools.groupby(text)]


def score(answer: str, output: str) -> float:
    if output == answer:
        return 1.0
    want, got = _runs(answer), _runs(output)
    right = sum(1 for w, g in zip(want, got, strict=False) if w == g)
    return right / max(len(want), len(got), 1)


class DigitsTask:
    """Prompt source and verifier of the demo task."""

    def __init__(self, cfg: DigitsTaskConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else DigitsTaskConfig(kind="digits")
        if self.cfg.num_digits_min > MAX_DIGITS:
            raise ValueError(f"num_digits_min must be ≤ {MAX_DIGITS} (one letter per digit)")
        # answer + EOS must fit max_output_tokens, and ≤ MAX_DIGITS digits of 9 must reach the sum
        self.max_answer_chars = max(1, min(self.cfg.max_output_tokens - 1, 9 * MAX_DIGITS))

    @property
    def max_new_tokens(self) -> int:
        return self.max_answer_chars + 1

    @property
    def max_prompt_tokens(self) -> int:
        return 1 + MAX_DIGITS + 1  # BOS, digits, '='

    @property
    def context(self) -> int:
        """Tokens of its longest sequence, a prompt and its output (held-out prompts are no longer): what its models'
        RoPE tables hold (rlctl.agents.common.job_context)."""
        return self.max_prompt_tokens + self.max_new_tokens

    def prompt(self, index: int) -> Prompt:
        """Prompt number `index` of this task's deterministic stream (id `p<index>`)."""
        rng = np.random.default_rng([self.cfg.seed, index])
        c = self.cfg
        total = round(float(rng.lognormal(math.log(self.median_at(index)), c.sigma)))
        total = min(max(total, 1), self.max_answer_chars)
        k = int(rng.integers(c.num_digits_min, c.num_digits_max + 1))
        k = min(max(k, math.ceil(total / 9)), total, MAX_DIGITS)
        digits = np.ones(k, dtype=np.int64)
        for _ in range(total - k):  # spread the rest over digits that are not yet 9
            free = np.flatnonzero(digits < 9)
            digits[free[int(rng.integers(len(free)))]] += 1
        text = "".join(str(d) for d in digits) + "="
        return Prompt(f"p{index}", text, [BOS, *encode(text)], answer_for(text[:-1]))

    def median_at(self, index: int) -> float:
        """The median output length for prompt `index` (grows with the RL iteration, if configured)."""
        c = self.cfg
        if c.growth_per_iteration == 0 or not RL_OFFSET <= index < HELDOUT_OFFSET:
            return c.median_output_tokens
        return c.median_output_tokens * (1 + c.growth_per_iteration * ((index - RL_OFFSET) // RL_STRIDE))

    def rl_prompts(self, iteration: int, n: int) -> list[Prompt]:
        """The n prompts of RL iteration `iteration`."""
        return [self.prompt(rl_index(iteration, j)) for j in range(n)]

    def heldout_prompts(self, n: int) -> list[Prompt]:
        """The first n held-out prompts: indices no SFT step or RL iteration draws."""
        return [self.prompt(heldout_index(i)) for i in range(n)]

    def prompts(self, start: int, n: int) -> list[Prompt]:
        return [self.prompt(i) for i in range(start, start + n)]

    def sample_prompts(self, n: int, rng: np.random.Generator) -> list[Prompt]:
        """n prompts at random indices below RL_OFFSET drawn from `rng` (the SFT warm-up's; ids stay
        regenerable via `prompt(index)`)."""
        return [self.prompt(int(i)) for i in rng.integers(0, RL_OFFSET, size=n)]

    def reward(self, prompt: Prompt, output_tokens: list[int]) -> float:
        return score(prompt.answer, decode(output_tokens))

    def exact(self, prompt: Prompt, output_tokens: list[int]) -> bool:
        return decode(output_tokens) == prompt.answer and EOS in output_tokens
