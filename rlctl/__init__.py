"""rlctl: plan, launch and operate disaggregated RL post-training of LLMs across sites."""

__version__ = "0.1.0"
