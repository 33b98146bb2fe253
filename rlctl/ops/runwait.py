"""A `JobRun`'s wait (rlctl.ops.run): the controller's status polled until it exits, a trainer rank that ended
before the trainer joined, a site this machine cannot reach, the first trainer rank that ended, and the run's
summary."""

from __future__ import annotations

import logging
import math
import shlex
import time
from collections.abc import Callable
from typing import Any

from rlctl.agents.messages import STOP_GRACE_S
from rlctl.errors import LaunchError, RlctlError, Stopped
from rlctl.launch.base import LOST, AgentHandle, exit_text
from rlctl.launch.record import fetch_record
from rlctl.ops.client import connect_client
from rlctl.ops.runbase import RunBase, first_error
from rlctl.ops.runstate import run_summary, stop_requested, update_summary
from rlctl.transport import Message

log = logging.getLogger(__name__)

ERROR_LOOKBACK_LINES = 400  # how far back in a failed trainer's log its first error is sought (its peers' retries)
TRAINER_POLL_S = 5.0  # how often `wait` asks the trainer ranks' sites whether a rank ended before the job had one
# … and once the trainer joined, whether a rank ended (which one died first, `first_ended_rank`): a poll per rank
# (an SSH command each on an SSH site), so less often; the failure's own sweep decides where these saw none
RANK_SWEEP_S = 30.0
UNREACHABLE_POLL_S = 5.0  # how often `wait` tries a site it cannot reach (its agents run on without the launcher)
UNREACHABLE_SAY_S = 300.0  # … and how often it says so again


class RunWait(RunBase):
    """A run watched until its controller exits (`wait`)."""

    def _watch(self, h: AgentHandle) -> int | None:
        """`poll` for `wait`: a site this machine cannot reach (its SSH reset, its login node down) is not the end
        of the agent, whose job runs on there without the launcher: None, said once (and every UNREACHABLE_SAY_S
        while it lasts), and when the site answers again."""
        site = h.spec.site
        try:
            code = self.poll(h)
        except LaunchError as e:
            now = time.monotonic()
            since, said = self._unreachable.get(site, (now, -math.inf))
            if now - said >= UNREACHABLE_SAY_S:
                self._say(
                    f"cannot reach site {site} to watch {h.spec.name} ({e}); the job runs on there: trying again "
                    f"every {UNREACHABLE_POLL_S:g} s (`rlctl stop {shlex.quote(str(self.jobdir.path))}` to end it)"
                    + (f"; unreachable for {now - since:.0f} s" if now > since else "")
                )
                said = now
            self._unreachable[site] = (since, said)
            return None
        if site in self._unreachable:
            since, _ = self._unreachable.pop(site)
            self._say(f"site {site} answers again after {time.monotonic() - since:.0f} s")
        return code

    def _say(self, text: str) -> None:
        log.warning("%s", text)
        if self.say is not None:
            self.say(text)

    def status(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The controller's live status, or None when it does not answer."""
        try:
            if self._status_conn is None:
                self._status_conn = connect_client(self.jobdir, timeout_s=timeout_s, name="launch")
            reply = self._status_conn.request(Message("status", {}), timeout_s=timeout_s)
            return dict(reply.header)
        except (RlctlError, OSError, ValueError, KeyError):
            if self._status_conn is not None:
                self._status_conn.close()
            self._status_conn = None
            return None

    def agent_codes(self) -> dict[str, int | None]:
        return {h.spec.name: self.poll(h) for h in self.handles}

    def wait(
        self, *, on_progress: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 1.0
    ) -> dict[str, Any]:
        """Until the controller exits; returns the job summary (summary.json + wall_s). A trainer rank that ends
        before the job's trainer joined the controller (it could not form its group, load the model, see its GPUs)
        ends the wait with a LaunchError naming it and its log's last lines: the controller would wait for it. A
        controller gone without a summary is a LaunchError too, or Stopped once `rlctl stop` asked for the end (its
        forced part killed the controller past the grace). A site this machine cannot reach for a while does not
        end it: the job runs on there (`_watch`). A file of the job dir here that does not read or write (another
        user's, a symlink loop, a disk's error) is one RlctlError naming it, versus the OSError's traceback; not a
        LaunchError, which an automatic resume takes for the run's failure (`rlctl.ops.autoresume`)."""
        try:
            return self._wait(on_progress=on_progress, poll_s=poll_s)
        except OSError as e:
            where = e.filename if e.filename is not None else f"a file in {self.jobdir.path}"
            here = shlex.quote(str(self.jobdir.path))
            raise RlctlError(
                f"{where}: the launcher could not read or write it as it waited for the run ({e.strerror or e})",
                hint=f"look at it, its owner and permissions (`ls -la {here}`); `rlctl status {here}` says where the "
                "job is",
            ) from e

    def _wait(self, *, on_progress: Callable[[dict[str, Any]], None] | None, poll_s: float) -> dict[str, Any]:
        assert self.controller is not None
        ranks = [h for h in self.handles if h.spec.role == "trainer"]
        trainers = ranks if self._starting else []
        next_check = time.monotonic() + TRAINER_POLL_S
        while (code := self._watch(self.controller)) is None:
            due = bool(ranks) and time.monotonic() >= next_check
            watching = bool(trainers) and due
            st = self.status() if on_progress is not None or watching else None
            if st is not None and on_progress is not None:
                on_progress(st)
            if due:
                next_check = time.monotonic() + (TRAINER_POLL_S if trainers else RANK_SWEEP_S)
            if watching and st is not None:
                if any(a.get("name") == "trainer-0" for a in st.get("agents", [])):
                    trainers = []  # the trainer joined: its end is the controller's to handle (a lost trainer)
                else:
                    self._ended_before_joining(trainers)
            elif due:
                self._note_ended_ranks(ranks)  # which rank ended first, for the controller's `trainer-0 was lost`
            time.sleep(UNREACHABLE_POLL_S if self._unreachable else poll_s)
        if self._status_conn is not None:
            self._status_conn.close()
        if self._record is not None:
            try:
                fetch_record(self.jobdir.path, *self._record)
            except (LaunchError, OSError) as e:  # (an OSError: a file here it could not write, versus its traceback)
                site = self.plan["controller_site"]
                raise LaunchError(
                    f"the job ended (controller exit {exit_text(code)}); its record on site {site} could not be "
                    f"fetched: {e}",
                    hint=f"`rlctl status {shlex.quote(str(self.jobdir.path))}` fetches it once the site answers",
                ) from e
        found = run_summary(self.jobdir, self.run_id)
        if found is None and stop_requested(self.jobdir, since=self.stop_since):
            # `rlctl stop` killed the controller past its grace (its forced part): the operator's end, not a failure
            # to resume from; exit 1 as for a graceful stop's `did not finish: stopped`
            self._register("stopped", controller_exit=code)
            raise Stopped(
                f"job {self.id} was stopped by `rlctl stop` (forced: its controller ended with {exit_text(code)} "
                f"after the stop request, without a summary; its log: {self.controller.spec.log_path})",
                hint=f"continue it with `{self.resume_command()}`",
            )
        if found is None:
            self._register("failed", controller_exit=code)
            log.warning("the end of %s:\n%s", self.controller.spec.log_path, self.log_tail("controller", 0))
            raise LaunchError(
                f"the controller exited with {exit_text(code)} without a summary (its log: "
                f"{self.controller.spec.log_path})",
                hint=f"continue the job from its latest complete checkpoint: `{self.resume_command()}`",
            )
        if stop_requested(self.jobdir, since=self.stop_since):  # a `rlctl stop` whose request it did not answer
            self._stopped_by_term(found)
        summary = found
        here = str(self.jobdir.path)  # the job dir `status` and `report` name; the summary says the controller's
        if summary.get("job_dir") not in (None, here):  # on its site (an SSH site, a SLURM site's workdir)
            summary["controller_job_dir"] = {"site": self.plan["controller_site"], "path": summary["job_dir"]}
        summary["job_dir"] = here
        summary["wall_s"] = round(time.monotonic() - self.t_start, 2)
        summary["controller_exit"] = code
        if str(summary.get("state", "")).startswith("failed: trainer "):
            self._note_ended_ranks(ranks)
            self._name_first_rank(summary)
        state = "finished" if summary["state"] == "done" else "stopped" if summary["state"] == "stopped" else "failed"
        self._register(state, controller_exit=code)
        return summary

    def _note_ended_ranks(self, ranks: list[AgentHandle]) -> None:
        """Record each trainer rank newly seen ended, with its exit code and the sweep that saw it."""
        ended = [(h, c) for h in ranks if h.spec.name not in self._ended_ranks and (c := self._watch(h)) is not None]
        for h, c in ended:
            self._ended_ranks[h.spec.name] = (h.spec.replica, c, self._sweeps)
        self._sweeps += 1

    def first_ended_rank(self) -> tuple[str, int, int] | None:
        """The trainer rank (name, rank, exit code) that ended first as far as the launcher can tell, or None: of
        those its earliest sweep saw ended, one a signal ended (kill -9, the OOM killer, LOST) before one that
        exited, then a rank other than 0 (the controller hears of rank 0 only: when a peer dies, rank 0 fails on
        its broken group and the controller says `trainer trainer-0 was lost`), then the lowest rank."""
        if not self._ended_ranks:
            return None
        name, (rank, code, _) = min(
            self._ended_ranks.items(),
            key=lambda kv: (kv[1][2], not (kv[1][1] < 0 or kv[1][1] == LOST), kv[1][0] == 0, kv[1][0]),
        )
        return name, rank, code

    def _name_first_rank(self, summary: dict[str, Any]) -> None:
        """The controller's `failed: trainer trainer-0 was lost (…)` names the rank it talks to, which is rarely the
        one that died: prefix the rank that ended first and how (state, event, summary.json), versus naming rank 0
        for a kill of rank 1 before."""
        first = self.first_ended_rank()
        if first is None:
            return
        name, rank, code = first
        state = str(summary["state"]).removeprefix("failed: ")
        then = "; " if name == "trainer-0" else " first; then "  # (rank 0 alone: how the one the controller lost ended)
        summary["state"] = f"failed: trainer rank {rank} ({name}) exited with {exit_text(code)}{then}{state}"
        summary["trainer_ranks_ended"] = {n: c for n, (_, c, _) in self._ended_ranks.items()}
        self.jobdir.event(
            "trainer_rank_ended",
            agent=name,
            rank=rank,
            exit_code=code,
            exit=exit_text(code),
            first=True,
            ended=summary["trainer_ranks_ended"],
        )
        # what `rlctl status` and `report` read say so too
        changes = {"state": summary["state"], "trainer_ranks_ended": summary["trainer_ranks_ended"]}
        update_summary(self.jobdir, self.run_id, changes)

    def _ended_before_joining(self, trainers: list[AgentHandle]) -> None:
        for h in trainers:
            code = self._watch(h)
            if code is None:
                continue
            self._register("failed", trainer_exit=code)
            self._end_failed(f"{h.spec.name} exited with {exit_text(code)} before the job's trainer joined")
            tail = self.log_tail(h.spec.role, h.spec.replica, lines=ERROR_LOOKBACK_LINES)
            log.warning("the end of %s:\n%s", h.spec.log_path, "\n".join(tail.splitlines()[-15:]))
            said = first_error(tail, ranks=int(self.plan["trainer"]["ranks"]))
            raise LaunchError(
                f"{h.spec.name} exited with {exit_text(code)} before the job's trainer joined (its log: "
                f"{h.spec.log_path})" + said,
                hint=self.unloadable_hint(said) or "fix what its log says, then launch the job again",
            )

    def _end_failed(self, why: str, *, grace_s: float = STOP_GRACE_S) -> None:
        """Tell the controller the job failed (`why`) where it cannot see it, and wait (at most `grace_s`) for it
        to end: its summary says `failed: why`, as the index does. Before, the launcher's stop (SIGTERM) ended it
        and the summary said `stopped`, which `status` showed beside the index's `failed`. A controller that does
        not answer is left to that stop (logged)."""
        assert self.controller is not None
        try:
            conn = connect_client(self.jobdir, timeout_s=5.0, name="launch-failed")
            try:
                conn.request(Message("shutdown", {"failed": why}), timeout_s=5.0)
            finally:
                conn.close()
        except (RlctlError, OSError, ValueError, KeyError) as e:
            log.warning("could not tell the controller the job failed (%s); its summary may say stopped", e)
            return
        deadline = time.monotonic() + grace_s
        while self._watch(self.controller) is None and time.monotonic() < deadline:
            time.sleep(0.2)
