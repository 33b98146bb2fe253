"""Typed configuration: inventories (`clusters/*.yaml`) and jobs (`jobs/*.yaml`), validated on load."""

from rlctl.config.inventory import Inventory, Link, Site, load_inventory
from rlctl.config.job import Job, JobFile, load_job

__all__ = ["Inventory", "Job", "JobFile", "Link", "Site", "load_inventory", "load_job"]
