"""RL pieces: the demo task and its verifier, SFT warm-up, GRPO/PPO learners, the output-length ranker.

Rewards: `reward.py` (the built-ins, loading one, one checked call), `reward_files.py` (a reward file and the
modules beside it, copied into the job), `reward_worker.py` (a worker process, its kill), `reward_pool.py` (the
workers' pool, each call bounded) and `reward_scope.py` (a reward file's own imports).
"""
