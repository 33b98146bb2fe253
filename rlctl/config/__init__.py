"""Typed configuration: inventories (`clusters/*.yaml`) and jobs (`jobs/*.yaml`), validated on load.

A job file is `job.py`'s `JobFile`; its sections' models are by concept: `model.py`, `task.py`, `algorithm.py`,
`pipeline.py` (batching, staleness, placement, planning, rebalance), `runtime.py` (rollout, trainer, transport,
weight sync, metrics) and `lifecycle.py` (checkpoints, the SFT warm-up, evaluation); `tracking.py` and
`hostfill.py` beside them. The inventory is `inventory.py` (sites, links, loading), with its sites' `schedulers.py`,
`hardware.py` (custom GPUs, nodes, bandwidths: their figures' bounds) and `hosts.py` (host names, host lists).
The YAML loading and `Strict` both build on, `base.py`.
"""

from rlctl.config.inventory import Inventory, Link, Site, load_inventory
from rlctl.config.job import Job, JobFile, load_job

__all__ = ["Inventory", "Job", "JobFile", "Link", "Site", "load_inventory", "load_job"]
