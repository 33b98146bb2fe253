"""The `megatron` trainer backend: megatron-core's GPTModel with rlctl's own HF ⇄ Megatron table.

names.py  the name and layout table (pure torch: no megatron import)
model.py  GPTModel from an HF config (one pipeline stage of it), the policy module, parallel state
pipeline.py  the stages chained inside the policy's forward (GPipe within the call, gloo p2p)
cpu.py    the narrow shim that lets megatron-core run without CUDA
rope.py   the RoPE scaling GPTModel runs (no megatron import: `rlctl check` asks it)
backend.py MegatronBackend (rlctl.trainers.base.TrainerBackend): on CPU over gloo, tp ≥ 1 × pp ≥ 1

Importing this package imports neither megatron-core nor its warnings; `model.import_megatron` does.
"""
