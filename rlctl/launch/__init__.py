"""Launch backends (local, slurm, ssh) and site reachability probes."""
