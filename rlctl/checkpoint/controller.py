"""The controller's part of a checkpoint, and what a resumed controller restores from it.

trained(i, v, checkpointing)  (the trainer took its snapshot of iter-v and writes it in the background)
    ─▶ the controller keeps its state as it is now: ledger (the rounds in flight), iteration, ranker history,
       rebalance window, rollout units replaced so far and per site, the sample log's length (the rounds retired),
       the steps skipped in a row (a gradient not finite), the staleness violations the trainer reported, the
       reward calls' counts (those scored task.reward_on_error)
checkpoint_written(v, D)      (the trainer's part of iter-v is on disk; D = its manifest's SHA-256)
    ─▶ save_controller(iter-v): the logs fsynced (sample log, metrics, evaluations), then that state, D
    ─▶ set_latest(v)                        (only now is iter-v a checkpoint a resume may use)

launch --resume ─▶ RLCTL_RESUME_VERSION=v (the newest checkpoint that verifies, rlctl.checkpoint.choose.choose_resume)
    ─▶ our part of every checkpoint newer than v to checkpoints/abandoned/ (an abandoned lineage; the trainer's
       rank 0 moves its part), or removed where it was never sealed; abandoned/ keeps checkpoint.keep of them
    ─▶ load_controller(iter-v) ─▶ core.restore, the sample log cut to its length, ranker.fit, rule.window,
    scaler.restore (`replaced` continues; the units `scale` / the rebalance rule added start again); metrics
    rows of iterations ≥ v move to metrics.discarded.jsonl (the curves continue from the checkpoint, as the model
    does), the sample log's lines past it to samples.discarded.jsonl; the trainer's hello must name the same
    version and D.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.agents import samplelog
from rlctl.agents.ledger import Ledger
from rlctl.checkpoint.choose import verified_manifest
from rlctl.checkpoint.cut import cut_rows
from rlctl.checkpoint.files import (
    PRUNED,
    fsync_dir,
    fsync_tree,
    prunable,
    remove_parts,
    set_latest,
    write_part,
)
from rlctl.errors import CheckpointError
from rlctl.launch.jobdir import JobDir, row_count
from rlctl.launch.sitefs import LocalFiles
from rlctl.rl.reward_pool import RewardStats

PART = "controller"


@dataclass
class ControllerState:
    version: int
    ledger: Ledger
    ranker_tokens: list[list[int]]
    ranker_lengths: list[float]
    rebalance_window: list[tuple[float, float]]
    trainer_digest: str
    resumes: int
    replaced: int  # rollout units replaced (joined) up to this checkpoint, over every run of the job
    samples_log_bytes: int | None  # the sample log's length when the ledger was taken (None: written before it)
    rollout_units: dict[str, int] | None = None  # rollout units per site (`Scaler.unit_counts`; None: written before)
    # the latest iterations whose optimizer step was skipped (a gradient not finite), in a row up to the checkpoint:
    # `trainer.skip_nonfinite` bounds the run of them across resumes (written before: none)
    skipped_in_a_row: list[int] = field(default_factory=list)
    violations: int = 0  # samples the trainer found staler than η up to the checkpoint (summary staleness_violations)
    # the reward calls up to the checkpoint, over every run of the job (summary `rewards`, `reward_failures`)
    reward_stats: RewardStats = field(default_factory=RewardStats)


def save_controller(
    jobdir: JobDir,
    version: int,
    *,
    state: dict[str, Any],
    ledger: Ledger | str,
    trainer_digest: str,
    replaced: int = 0,
) -> None:
    """Write the controller's part of checkpoint `version`, then move `latest` to it. `replaced`: the Scaler's
    count of replaced rollout units (status `resilience.replaced`), which a resumed run continues from.
    `ledger`: the ledger, or its JSON as it was when the checkpoint was due.
    (Its rollout units per site are in `state`, `rollout_units`: a resumed run starts those beyond the plan again;
    units it gave up on are not kept.)"""
    ckpt = jobdir.checkpoint(version)
    body = {**state, "version": version, "replaced": replaced}
    sync_logs(jobdir)  # what a resume from it keeps of the job's logs: on disk before `latest` names it

    def fill(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        (tmp / "ledger.json").write_text(ledger if isinstance(ledger, str) else json.dumps(ledger.to_json()))
        (tmp / "state.json").write_text(json.dumps(body))

    write_part(ckpt, PART, {PART: fill}, meta={"version": version, "trainer_digest": trainer_digest})
    set_latest(ckpt.parent, version)


def prune_controller(jobdir: JobDir, *, complete: Iterable[int], keep: int) -> list[int]:
    """Remove our part of the checkpoints `checkpoint.keep` lets go (`prunable`), once the job's record says which
    (the `PRUNED` event: what a resume may no longer take): a controller killed in between leaves parts on disk the
    record no longer offers (the next prune removes them), never a version `completed_checkpoints` offers (`status
    --checkpoints`, `launch --resume --checkpoint V`) whose part is gone ('not on the controller's site'). The
    versions pruned, oldest first."""
    going = prunable(jobdir.checkpoints, PART, complete=complete, keep=keep)
    if going:
        jobdir.event(PRUNED, versions=going, keep=keep)
    remove_parts(jobdir.checkpoints, PART, going, keep=keep)
    return going


def sync_logs(jobdir: JobDir) -> None:
    """Make the logs a resume cuts back to a checkpoint durable, with their names in the job dir: the sample log (a
    checkpoint's ledger holds only the rounds in flight; the retired ones are the log's first `samples_log_bytes`),
    the metrics rows and the held-out evaluations (`cut_metrics`, `cut_evaluations` keep those before it). Only
    flushed, a power loss after `latest` moved could cut them short: a resume keeps what is there, and the rows (the
    rounds, the curves) before the checkpoint would be lost for good."""
    for path in (jobdir.samples, jobdir.metrics, jobdir.evaluations):
        if path.is_file():
            fsync_tree(path)
    fsync_dir(jobdir.path)


def load_controller(jobdir: JobDir, version: int) -> ControllerState:
    """The controller's state at checkpoint `version`; CheckpointError naming the checkpoint, why, and what to do when
    it does not verify (a part damaged after the launcher chose it: a resume again passes it over, as the launcher's
    `pick_checkpoint` verifies every part it takes), versus a ValueError the controller's entry point let through as
    a traceback."""
    ckpt = jobdir.checkpoint(version)
    try:
        manifest = verified_manifest(LocalFiles(), str(ckpt), PART, version=version)
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{ckpt}: the controller's part is missing or does not match its manifest: {e}",
            hint=f"resume the job again (`rlctl launch --resume {shlex.quote(jobdir.id)}`): it takes the newest "
            "checkpoint before this one whose parts verify",
        ) from e
    state = json.loads((ckpt / PART / "state.json").read_text())
    units = state.get("rollout_units")
    ledger = Ledger.from_json(json.loads((ckpt / PART / "ledger.json").read_text()))
    return ControllerState(
        version=version,
        ledger=ledger,
        ranker_tokens=state["ranker"]["tokens"],
        ranker_lengths=state["ranker"]["lengths"],
        rebalance_window=[(float(g), float(t)) for g, t in state["rebalance_window"]],
        trainer_digest=str(manifest["trainer_digest"]),
        resumes=int(state.get("resumes", 0)),
        replaced=int(state.get("replaced", 0)),
        samples_log_bytes=state.get("samples_log_bytes"),
        rollout_units={str(k): int(v) for k, v in units.items()} if isinstance(units, dict) else None,
        skipped_in_a_row=[int(i) for i in state.get("skipped_in_a_row", [])],
        violations=int(state.get("violations", 0)),
        reward_stats=RewardStats(**state.get("reward_stats", {})),
    )


def sample_rows(jobdir: JobDir, version: int) -> list[dict[str, Any]]:
    """Every sample of checkpoint `version`'s lineage once, as the ledger held it (`rlctl.agents.samplelog.rows`):
    the rounds retired before it from the sample log, the rest from its ledger.json."""
    part = jobdir.checkpoint(version) / PART
    state = json.loads((part / "state.json").read_text())
    ledger = json.loads((part / "ledger.json").read_text())
    return samplelog.rows(jobdir.samples, ledger, state.get("samples_log_bytes"))


def cut_metrics(jobdir: JobDir, version: int) -> Generator[dict[str, Any], None, None]:
    """The metrics rows of iterations before `version`, one at a time as metrics.jsonl is read (`cut_rows`: a resumed
    controller's `RowBook` counts them so, versus every row of the job's iterations held at once); the others, which
    the failed run trained past its last checkpoint, move to metrics.discarded.jsonl once it is read to its end. A
    row without a number for its iteration (null, text: an older version's row, an edited one) is before no
    checkpoint: it moves aside too (`int(None)` was a TypeError that killed the resumed controller as it started)."""

    def before(r: dict[str, Any]) -> bool:
        it = row_count(r.get("iteration"))
        return it is not None and it < version

    return cut_rows(jobdir, jobdir.metrics, before)
