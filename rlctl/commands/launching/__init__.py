"""The parts of `rlctl launch` (`rlctl.commands.launch`) by concept, which `attach` shares.

views.py       what a launch shows: the live progress line, the end-of-run summary table, the --dry-run table
interrupts.py  a Ctrl-C (or SIGTERM) said in one line: what became of the job and how to go on
launcher.py    this process as the job's launcher: start or take over a run, watch it, evaluate, summarise
detached.py    `--detach`: the launch as a launcher in the background, followed until the job runs
resume.py      `--resume JOB`: the same job directory and plan, from its latest (or a chosen) checkpoint
"""
