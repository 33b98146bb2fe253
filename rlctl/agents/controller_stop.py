"""Stop requests to the controller (`StopRequests`): `rlctl stop` (and a second one while the first waits),
the deadline a stop gives the checkpoint the trainer reached, every agent told to stop once, and whether a
SIGTERM was a stop asked for."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from rlctl.agents.controller_checkpoints import Checkpoints
from rlctl.agents.messages import LAUNCHER_STOP, STOP_GRACE_S, make
from rlctl.errors import RlctlError, TransportError
from rlctl.launch.jobdir import event_time

log = logging.getLogger(__name__)

# `rlctl stop` while a checkpoint is being written: the longest the controller waits for it (a model and its
# optimizer state, fsynced to shared storage, can take minutes), within the stop's grace (`_stop_deadline`)
STOP_CHECKPOINT_WAIT_S = 600.0


class StopRequests(Checkpoints):
    """A stop asked for, and every agent told to stop."""

    def _stop_asked(self, by: str, grace_s: float | None) -> dict[str, Any]:
        """`rlctl stop`'s request: the loop ends, and the reply says how long the end may take (`grace_s`: the
        operator's `--grace`, after which it kills this process; none given: STOP_GRACE_S, and STOP_CHECKPOINT_WAIT_S
        more while the trainer may complete a checkpoint, so that a default stop keeps the checkpoint the trainer
        reached) and which checkpoint the stop waits for (`checkpoint`, or None)."""
        now = time.monotonic()
        coming = self._checkpoint_coming()
        if grace_s is None:
            grace_s = STOP_GRACE_S + (STOP_CHECKPOINT_WAIT_S if coming else 0.0)
        self.stop_requested, self.stop_at, self.stop_by = True, now, now + float(grace_s)
        version = self._checkpoint_version() if coming else None
        self.jobdir.event("stop_requested", by=by, grace_s=grace_s, checkpoint=version)
        # told now, before the answer, not once the loop has ended: a trainer holding its next iteration began that
        # step when the stop had not reached it yet (an iteration more, trained for nothing)
        self._tell_stop()
        return {"ok": True, "grace_s": grace_s, "checkpoint": version}

    def _stop_again(self, grace_s: float | None, *, waiting: bool) -> dict[str, Any]:
        """A stop request while this controller ends (`_shutdown`: a second `rlctl stop` while the first waits for
        the checkpoint the trainer reached): answered, so the asker joins the wait — the grace left (a shorter
        `grace_s` shortens it), the checkpoint waited for (`waiting`: the end still waits for one), `stopping`.
        Before, the end no longer answered, and a second stop, hearing nothing in 10 s, killed every agent with the
        checkpoint's write."""
        now = time.monotonic()
        if grace_s is not None:
            self.stop_by = min(self.stop_by, now + float(grace_s))
        left = self.stop_by - now if math.isfinite(self.stop_by) else STOP_GRACE_S
        version = self._checkpoint_version() if waiting else None
        self.jobdir.event("stop_requested_again", grace_s=grace_s, checkpoint=version)
        return {"ok": True, "grace_s": round(max(0.0, left), 1), "checkpoint": version, "stopping": True}

    def _stop_deadline(self) -> float:
        """Until when a stop (`rlctl stop`) waits for the checkpoint the trainer reached, so that the job resumes from
        it: STOP_CHECKPOINT_WAIT_S after the request, and a second before the stop's grace ends (then it kills this
        process: the summary is written in that second)."""
        asked = self.stop_at if self.stop_at is not None else time.monotonic()
        return min(asked + STOP_CHECKPOINT_WAIT_S, self.stop_by - 1.0)

    def _tell_stop(self) -> None:
        """Every running agent is told to stop (once), and nothing new is sent from then on (`_send`)."""
        if self._closing:
            return
        self._closing = True
        for p in self.peers.values():
            if p.state == "running" and p.role != "client":
                if p.broken is not None:
                    p.state = "lost"
                    continue
                try:
                    p.conn.send(make("stop"))
                except TransportError:
                    p.state = "lost"

    def _told_to_stop(self, name: str) -> bool:
        """Whether agent `name` was sent `stop`: every agent once the job ends, a unit once its drain retired it
        (`core.told_to_stop`, kept while it is connected), or it came back after it was counted lost."""
        return self._closing or name in self.core.told_to_stop or name in self.core.left

    def _stop_meant(self) -> bool:
        """Whether the job's end was asked for since this controller started, where it can tell: a `rlctl stop`
        whose request it did not answer (its `stop_requested` event, written first), or its launcher's own stop (Ctrl-C,
        a stop while it started the run). A controller whose job dir is on another site sees neither: its launcher
        says `stopped` for it (`rlctl.ops.run.JobRun`). Events it cannot read (a damaged line, a full disk) tell
        nothing: the SIGTERM stays the run's end, as a failure."""
        try:
            events = self.jobdir.read_events(LAUNCHER_STOP, "stop_requested")  # (only these lines are parsed)
        except (RlctlError, OSError) as e:
            log.warning("controller: cannot read the job's events to tell whether a stop was asked for: %s", e)
            return False
        since = self.t_start_wall - 0.001  # events' times are rounded to the millisecond
        return any(
            event_time(e) >= since
            and (e.get("event") == LAUNCHER_STOP or (e.get("event") == "stop_requested" and "by" not in e))
            for e in events
        )
