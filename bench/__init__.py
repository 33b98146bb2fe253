"""Benchmarks: `python -m bench <name> [--json] [--quick]`; `make bench` runs them all."""
