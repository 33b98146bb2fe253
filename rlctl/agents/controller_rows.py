"""The controller's metrics rows (`Rows`): an iteration trained becomes a row (metrics.jsonl, the tracker,
/metrics, the rebalance rule, the ranker's refit), and the agents gone leave the books once a row lists them."""

from __future__ import annotations

import time
from typing import Any

from rlctl.agents.books import GoneAgent
from rlctl.agents.controller_checkpoints import Checkpoints
from rlctl.agents.ledger import State
from rlctl.agents.messages import Trained
from rlctl.agents.views import LIVE_STATES, forget_agent_gauges, iteration_gauges, metrics_row
from rlctl.rl.ranker import recall_at
from rlctl.tracking import row_to_metrics


class Rows(Checkpoints):
    """An iteration trained, written as a metrics row."""

    def _trained(self, t: Trained) -> None:
        generated = self._generated(t)  # before the core retires the round it completes
        outs = self.core.trained(
            iteration=t.iteration,
            version=t.version,
            sample_ids=t.sample_ids,
            stats={"reward_mean": t.reward_mean, "train_s": t.train_s, "loss": t.loss, "busy_s": t.busy_s},
            skipped=t.skipped,
        )
        if t.skipped:
            self.jobdir.event(
                "step_skipped",
                iteration=t.iteration,
                grad_norm=repr(t.grad_norm),
                in_a_row=len(self.core.skipped_in_a_row),
            )
        self.violations += t.staleness_violations
        self.metrics.job_staleness_violations.set(self.violations)  # (the counter: `iteration_gauges`)
        trainer = self.peers.get(self.core.trainer.name if self.core.trainer else "")
        if trainer is not None:
            trainer.figures.busy_s, trainer.figures.version = t.busy_s, t.version
        row = metrics_row(self.snapshot(), t, wall_time=time.time())
        if extras := self.task.reward_extras(t.sample_ids):  # a dict reward's other figures, over what it trained
            row["reward_extra"] = {k: round(v, 6) for k, v in extras.items()}
        if self.evaluator is not None and self.evaluator.overlapped():
            row["evaluating"] = True  # a held-out evaluation decoded beside this iteration's generation
        self.scaler.rebalance(row, stopping=self._closing)
        self._refit_ranker(row, *generated)
        self.rows.add(row)
        self.jobdir.append(self.jobdir.metrics, row)
        # the version published before the agents gone leave the weight book: a trainer rank's root gone held it, and
        # a unit that pulled it from that root may report after this row (`WeightBook.forget`)
        self.book.published(t.version, time.monotonic())
        self._prune()
        self.tracker.log(t.iteration, row_to_metrics(row))
        if t.checkpointing:
            self._checkpoint_due(t.version)
        self._send(outs)
        iteration_gauges(self.metrics, row, t, self.core.stats[t.iteration], self.rows)
        self.jobdir.event("trained", iteration=t.iteration, version=t.version)

    def _prune(self) -> None:
        """A metrics row was written: the agents gone (lost or stopped) leave `peers`, which holds the live ones and
        those gone since the last row (that row lists them once: `views.metrics_row`), and /metrics, so that a run
        whose units are replaced for weeks holds, shows, watches and exports the agents it has. What summary.json and
        the status reply's counts say of each is kept (`gone`: every one counted, the latest GONE_KEPT by name), and
        a lost unit that says hello again is still told to stop (`_hello`); its weight nodes' addresses (a trainer's:
        every rank's) leave the weight book once the open versions they held are delivered (`WeightBook.forget`)."""
        for p in [p for p in self.peers.values() if p.role != "client" and p.state not in LIVE_STATES]:
            del self.peers[p.name]
            self.core.told_to_stop.discard(p.name)  # (its bye came, or its connection ended)
            self.gone.add(p.name, GoneAgent(p.role, p.state, p.figures.busy_s))
            self.book.forget(p.name)  # its weight nodes' addresses (a unit's, for weeks of units; a trainer's ranks')
            forget_agent_gauges(self.metrics, p, self.sites)
            p.conn.close()  # a lost one's is closed; a stopped one said bye (its reader's end is ignored: `_handle`)

    def _generated(self, t: Trained) -> tuple[list[list[int]], list[float], list[float]]:
        """What the groups iteration `t` trained generated (a slow one of its round moved on): each prompt's tokens,
        mean output length and predicted length, read before `core.trained` retires them."""
        by_prompt: dict[str, list[int]] = {}
        for sid in t.sample_ids:
            e = self.core.ledger.entries.get(sid)
            if e is not None and e.state is State.DELIVERED and e.iteration == t.iteration:
                by_prompt.setdefault(e.prompt_id, []).append(e.output_tokens)
        tokens = [self.core.prompts[p].tokens for p in by_prompt]
        lengths = [sum(v) / len(v) for v in by_prompt.values()]
        return tokens, lengths, [self.core.pred_len[p] for p in by_prompt]

    def _refit_ranker(
        self, row: dict[str, Any], tokens: list[list[int]], lengths: list[float], preds: list[float]
    ) -> None:
        """Online refit on what the policy actually generated; records the ranker's recall on it in `row`."""
        if len(tokens) >= 5:
            row["ranker_recall_20"] = round(recall_at(preds, lengths, 0.2), 3)
        self.ranker.update(tokens, lengths)
