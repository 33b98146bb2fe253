"""Running one job from the operator's side: resolve, plan, prepare the job directory, start the
agents through a launch backend, watch the controller's status, stop everything.

    resolve_job ─▶ plan_counts (counts.py)
        ─▶ prepare (jobprep.py: job.json, plan.json, secret, SFT warm-up → model/init)
        ─▶ layout (host, GPU slice / SLURM request, threads, tp/pp/dp of every agent; see layout.py)
        ─▶ JobRun.start: stage the job dir to every site (stage.py, stagecopy.py: copy, verify size + SHA-256)
           ─▶ controller on its site ─(its site's controller.json, read through the site)─▶
              trainer ranks, rollout units: --job-dir <their site's copy> --controller ADDR
        ─▶ JobRun.wait: status RPC every poll_s ─▶ on_progress(status) … controller exits
           (lost without a summary: LaunchError naming `rlctl launch --resume JOB`, or Stopped after a `rlctl
           stop` asked for the end, its forced part the controller's; a trainer rank that ended before the trainer
           joined: LaunchError naming the rank and its log's error line)
        ─▶ the controller's record (summary, metrics, events) fetched to the operator's job dir
        ─▶ summary.json (+ wall_s) ;  JobRun.stop(): every agent, SIGTERM → grace → SIGKILL

`start(resume=True)` first picks the checkpoint to continue from: the newest whose controller part (on the
controller's site) and trainer part (on the trainer's) both verify and belong together (`pick_checkpoint`),
and passes its version to both as RLCTL_RESUME_VERSION (each sets its part of the newer ones aside:
`rlctl.checkpoint.files.set_aside_newer`).

The operator's job dir keeps what launch started (agents.jsonl) and the job index; when the controller
runs elsewhere its site job dir is the job's record, and the launcher mirrors its agent records there
(the controller's Spawner claims GPU slices from them).

Its parts, by concept: `runbase` (the run's state, its agents' logs, its index row, its stop), `runstart` (start,
attach, `--dry-run`'s render), `runwait` (wait); and beside JobRun: `jobprep` (prepare, StopCheck), `launchdir` (a
fresh launch's job dir), `agentplan` (planned_agents), `resumepoint` (pick_checkpoint), `refusals` (what `launch
--resume` refuses), `client` (connect_client), `runstate` (the job's runs as its job dir records them).
"""

from __future__ import annotations

from rlctl.ops.runstart import RunStart
from rlctl.ops.runwait import RunWait


class JobRun(RunStart, RunWait):
    """One job from the operator's side: start its agents on their sites, watch it, stop it for sure."""
