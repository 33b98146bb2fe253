"""Output-length ranker (StreamRL §5.2): predicts output lengths from prompts, used only to rank them.

Ridge regression on a bag-of-tokens (how often each token id occurs in the prompt) plus the prompt
length: cheap enough to refit every iteration, and it needs nothing task-specific. Bootstrap it on
(prompt, generated length) pairs from a first run, then `update()` with each iteration's finished
samples; it refits on a sliding window of the most recent pairs, following the policy as it changes.

    recall_at(pred, true, frac) = |top-frac by pred ∩ top-frac by true| / ⌈frac·n⌉
(paper, 7B ranker: 0.87 / 0.82 / 0.76 at 20 / 10 / 5 %)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class _HasTokens(Protocol):
    @property
    def tokens(self) -> list[int]: ...


PromptLike = Sequence[int] | _HasTokens


def _tokens(p: PromptLike) -> Sequence[int]:
    return p.tokens if hasattr(p, "tokens") else p


class LengthRanker:
    def __init__(self, vocab_size: int, *, l2: float = 1.0, window: int = 4096) -> None:
        self.vocab_size = vocab_size
        self.l2 = l2
        self._history: deque[tuple[tuple[int, ...], float]] = deque(maxlen=window)
        self._w: np.ndarray | None = None
        self._mean_len = 1.0

    @property
    def fitted(self) -> bool:
        return self._w is not None

    def features(self, prompts: Sequence[PromptLike]) -> np.ndarray:
        x = np.zeros((len(prompts), self.vocab_size + 2))
        for i, p in enumerate(prompts):
            toks = _tokens(p)
            np.add.at(x[i], np.asarray(toks, dtype=np.int64) % self.vocab_size, 1.0)
            x[i, -2] = len(toks)
        x[:, -1] = 1.0
        return x

    def fit(self, prompts: Sequence[PromptLike], lengths: Sequence[float]) -> LengthRanker:
        """Replace the history with these pairs and refit."""
        self._history.clear()
        return self.update(prompts, lengths)

    def update(self, prompts: Sequence[PromptLike], lengths: Sequence[float]) -> LengthRanker:
        """Add (prompt, length) pairs to the sliding window and refit (online refit)."""
        if len(prompts) != len(lengths):
            raise ValueError("one length per prompt")
        self._history.extend((tuple(_tokens(p)), float(n)) for p, n in zip(prompts, lengths, strict=True))
        if not self._history:
            return self
        x = self.features([list(t) for t, _ in self._history])
        y = np.array([n for _, n in self._history])
        reg = self.l2 * np.eye(x.shape[1])
        reg[-1, -1] = 0.0  # no penalty on the bias
        self._w = np.linalg.solve(x.T @ x + reg, x.T @ y)
        self._mean_len = float(y.mean())
        return self

    def predict(self, prompts: Sequence[PromptLike]) -> np.ndarray:
        """Predicted output lengths (≥ 1); the history mean for every prompt before the first fit."""
        if self._w is None:
            return np.full(len(prompts), self._mean_len)
        return np.maximum(self.features(prompts) @ self._w, 1.0)


def recall_at(pred: Sequence[float] | np.ndarray, true: Sequence[float] | np.ndarray, frac: float) -> float:
    """Recall of the true top-`frac` set by the predicted top-`frac` set (ties broken by index)."""
    p, t = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    if p.shape != t.shape or p.ndim != 1 or len(p) == 0:
        raise ValueError("pred and true must be 1-D and of the same, non-zero length")
    if not 0 < frac <= 1:
        raise ValueError("frac must be in (0, 1]")
    k = max(1, math.ceil(frac * len(t) - 1e-9))
    top_true = set(np.argsort(-t, kind="stable")[:k].tolist())
    top_pred = set(np.argsort(-p, kind="stable")[:k].tolist())
    return len(top_true & top_pred) / k
