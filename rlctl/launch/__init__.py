"""Starting an agent process on a site and what it is given: the backends (local, slurm, ssh) behind one
interface, where each agent runs and which GPUs it gets (layout, GPU slices), the job dir on each site and its
staging, site probes, and the controller's spawner. The operator flow of a job is in `rlctl.ops`."""
