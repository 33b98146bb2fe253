"""The trajectory store: what running generations have produced so far (partial rollouts, seed 004 §5).

StaleFlow keeps every trajectory in a trajectory server so that an interrupted generation resumes on any
instance. Here the store lives in the controller, beside the ledger, and is filled by the units' reports:

    unit ──partial(sample, start, tokens, log-probs, versions)──▶ extend (the sample's current attempt only)
    sample finished ──▶ drop            unit lost ──▶ kept: the sample is queued again with its output so far
    migration (`withdrawn`) ──▶ replaced by the whole output the unit gave back, sent on to another unit
    dispatch ──▶ prefix(sample) ─▶ the request resumes from it (prefill prompt + prefix), on any unit

A report covers what the unit generated since its last one (`rollout.partial_report_s`), so a lost unit
costs at most that much generation per sample instead of everything. The store is bounded
(`rollout.partial_store_mb`): a sample that would grow it past the bound is not kept (it restarts when
interrupted; counted in `over_budget`). It is saved with the ledger in every checkpoint; a resumed run keeps
the partials whose tokens all came from versions at or before the checkpoint's.

Per token: the token id (int32), its behaviour log-prob (float32) and the version that sampled it (int32).
"""

from __future__ import annotations

import base64
from array import array
from dataclasses import dataclass, field
from typing import Any

from rlctl.engines.base import Prefix

TOKEN_BYTES = 12  # int32 token + float32 log-prob + int32 version


@dataclass
class PartialTrajectory:
    tokens: array[int] = field(default_factory=lambda: array("i"))
    logprobs: array[float] = field(default_factory=lambda: array("f"))
    versions: array[int] = field(default_factory=lambda: array("i"))

    def __len__(self) -> int:
        return len(self.tokens)

    def truncate(self, n: int) -> None:
        for a in (self.tokens, self.logprobs, self.versions):
            del a[n:]


@dataclass
class TrajectoryStore:
    budget_bytes: int = 256 << 20
    parts: dict[str, PartialTrajectory] = field(default_factory=dict)
    nbytes: int = 0
    over_budget: int = 0  # reports not kept: the store was full
    resumed: int = 0  # samples dispatched with a prefix
    resumed_tokens: int = 0  # … and the tokens those prefixes held (not generated again)
    too_old: int = 0  # kept outputs dropped at dispatch: too old for any buffer with room (the sample restarted)
    too_old_tokens: int = 0  # … and their tokens (also in the ledger's discarded_tokens)
    # generations cut by the loss of their unit (or its silence): what the store kept of them, and at most how many
    # tokens their unit generated past its last report (lost with it, generated again) — `interrupted`
    interrupted: int = 0
    interrupted_kept_tokens: int = 0
    interrupted_lost_tokens_max: int = 0
    # … and what the lost units whose flight records the controller could read had really not sent (agents.flight)
    lost_units_measured: int = 0
    interrupted_lost_tokens_measured: int = 0

    def interrupt(self, sample_id: str, *, lost_at_most: int) -> None:
        """The sample's unit is gone: count what is kept of its output and the bound on what is not."""
        self.interrupted += 1
        self.interrupted_kept_tokens += len(self.parts.get(sample_id, ()))
        self.interrupted_lost_tokens_max += lost_at_most

    def measured(self, unsent: int) -> None:
        """A lost unit's flight record: the tokens it had generated and not sent (its generations' real loss)."""
        self.lost_units_measured += 1
        self.interrupted_lost_tokens_measured += unsent

    def extend(self, sample_id: str, start: int, tokens: list[int], logprobs: list[float], versions: list[int]) -> bool:
        """Output index `start` on of a running sample (the caller checked that it runs where the report came
        from); False when it is not kept (a gap after a lost report, or no room)."""
        p = self.parts.get(sample_id)
        have = len(p) if p is not None else 0
        if start > have:
            return False
        grow = (start + len(tokens) - have) * TOKEN_BYTES
        if grow > 0 and self.nbytes + grow > self.budget_bytes:
            self.over_budget += 1
            return False
        if p is None:
            p = self.parts[sample_id] = PartialTrajectory()
        if start < have:
            p.truncate(start)
        p.tokens.extend(tokens)
        p.logprobs.extend(logprobs)
        p.versions.extend(versions)
        self.nbytes += (len(p) - have) * TOKEN_BYTES
        return True

    def prefix(self, sample_id: str) -> Prefix | None:
        p = self.parts.get(sample_id)
        if not p:
            return None
        return Prefix(p.tokens.tolist(), p.logprobs.tolist(), p.versions.tolist())

    def oldest(self, sample_id: str) -> int | None:
        """The oldest version that sampled a kept token of the sample (None: nothing kept)."""
        p = self.parts.get(sample_id)
        return min(p.versions) if p else None

    def resume(self, sample_id: str) -> Prefix | None:
        """The prefix a dispatch of `sample_id` resumes from (counted), or None."""
        got = self.prefix(sample_id)
        if got is not None:
            self.resumed += 1
            self.resumed_tokens += len(got.tokens)
        return got

    def drop(self, sample_id: str) -> int:
        """Forget the sample's partial output (it finished, or restarts); the tokens dropped."""
        p = self.parts.pop(sample_id, None)
        if p is None:
            return 0
        self.nbytes -= len(p) * TOKEN_BYTES
        return len(p)

    def expire(self, sample_id: str) -> int:
        """Drop the sample's output as too old to resume within the staleness bound (counted); the tokens dropped."""
        n = self.drop(sample_id)
        self.too_old += 1
        self.too_old_tokens += n
        return n

    def keep_upto(self, version: int) -> int:
        """Drop every partial with a token sampled after `version` (a resumed run's weights do not descend from
        it); the samples dropped."""
        gone = [s for s, p in self.parts.items() if p and max(p.versions) > version]
        for s in gone:
            self.drop(s)
        return len(gone)

    # -- checkpoint ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def enc(a: array[Any]) -> str:
            return base64.b64encode(a.tobytes()).decode()

        return {
            "counters": {
                "over_budget": self.over_budget,
                "resumed": self.resumed,
                "resumed_tokens": self.resumed_tokens,
                "too_old": self.too_old,
                "too_old_tokens": self.too_old_tokens,
                "interrupted": self.interrupted,
                "interrupted_kept_tokens": self.interrupted_kept_tokens,
                "interrupted_lost_tokens_max": self.interrupted_lost_tokens_max,
                "lost_units_measured": self.lost_units_measured,
                "interrupted_lost_tokens_measured": self.interrupted_lost_tokens_measured,
            },
            "parts": {s: [enc(p.tokens), enc(p.logprobs), enc(p.versions)] for s, p in self.parts.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None, *, budget_bytes: int = 256 << 20) -> TrajectoryStore:
        store = cls(budget_bytes=budget_bytes, **(data or {}).get("counters", {}))
        for s, (t, lp, v) in (data or {}).get("parts", {}).items():
            p = PartialTrajectory()
            p.tokens.frombytes(base64.b64decode(t))
            p.logprobs.frombytes(base64.b64decode(lp))
            p.versions.frombytes(base64.b64decode(v))
            if not len(p.tokens) == len(p.logprobs) == len(p.versions):
                raise ValueError(f"partial trajectory {s}: {len(p.tokens)} tokens, {len(p.logprobs)} log-probs")
            store.parts[s] = p
            store.nbytes += len(p) * TOKEN_BYTES
        return store
