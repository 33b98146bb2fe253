"""The operator side of one job, what the verbs call (../shared/DESIGN.md §2: above planner/ and launch/).

The job's run, operate, preflight and inputs still live in `rlctl.launch` and move here as they are touched.
"""
