"""Profiles: the cost functions the planner needs, modelled from GPU specs or measured on a site.

analytical.py     roofline decode / prefill / KV capacity / training cost from catalog specs
actmem.py         a trainer rank's activation memory, priced from the model's shape and the cut's tokens
saved.py          the bytes a forward saves for backward, counted as it runs (what actmem.py prices, measured)
traincost.py      which model passes an RL iteration runs per token, per algorithm (FLOPs, what streams)
measure.py        microbenchmarks of a generation engine (embedded CPU engine, vLLM, fakes in tests)
measure_train.py  seconds per token of a training step of rlctl's own learners on a trainer backend
measure_split.py  the same at a megatron tp × pp split: its ranks run as processes, timed by wall clock
probe.py          what a site measures (`python -m rlctl.profiler.probe`), run in-process or on the site
remote.py         the probe on a SLURM or SSH site through its launch backend
build.py          `rlctl profile`: a profile file from options or a job, analytical or measured
profile.py        the versioned profile file (apiVersion rlctl/v1, kind Profile): models, load, save
"""
