"""Trainer backends: how a trainer rank holds, trains and exports the policy (`trainer.backend`).

base.py      TrainerBackend (the interface) and `load_backend`, chosen by BACKENDS[name]
native.py    `torch`: TinyGPT, the embedded engine's model, one full replica per rank, or one over every rank
             (FSDP2, fsdp.py: made on the meta device and loaded shard by shard)
megatron/    `megatron`: megatron-core's GPTModel (optional extra `rlctl[megatron]`)
"""
