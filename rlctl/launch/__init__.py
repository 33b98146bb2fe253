"""Starting an agent process on a site and what it is given: the backends (local, slurm, ssh) behind one
interface, where each agent runs and which GPUs it gets (layout, GPU slices), the job dir on each site and its
staging, site probes, and the controller's spawner. The operator flow of a job is in `rlctl.ops`.

Staging is `stage` (what is staged, per host view), `stagecopy` (one view's copy, verified) and `stagefanout` (a
multi-host SSH site's tree); the job's record fetched back from the controller's site is `record` and
`agentrecords` (docs/launch.md's table says what each module owns)."""
