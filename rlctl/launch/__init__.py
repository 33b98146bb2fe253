"""The operator side of a job: launch backends (local, slurm, ssh), where each agent runs and which GPUs
it gets (layout, GPU slices), starting / operating / stopping a job, and site reachability probes."""
