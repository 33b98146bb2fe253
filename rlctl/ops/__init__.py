"""The operator side of one job, what the verbs call (../shared/DESIGN.md §2): run (start, wait, stop,
resume), operate (status, scale, stop of a running job), preflight (`check`), inputs, evaluation, the job index
(jobdb, jobref), agent logs and pull. It sits above `rlctl.planner` and `rlctl.launch`; neither imports it.

`run.py`'s `JobRun` is made of `runbase` (state, logs, index row, stop), `runstart` (start, attach, `--dry-run`) and
`runwait` (wait); beside it `jobprep`, `launchdir`, `agentplan`, `resumepoint`, `refusals`, `client` and `runstate`
(docs/launch.md's table says what each owns); `preflight/` is a package of checks by concept."""
