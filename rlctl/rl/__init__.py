"""RL pieces: the demo task and its verifier, SFT warm-up, GRPO/PPO learners, the output-length ranker."""
