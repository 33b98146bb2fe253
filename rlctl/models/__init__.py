"""Decoder models: the HF checkpoint format (config.json `hf`, weight files `weightfiles`, tensor names `hfnames`, the
directory `hfdir`), rlctl's own Llama/Qwen2/Qwen3/Qwen3MoE/Mistral/Phi3 implementation (`tinygpt`; made from a
directory, empty or on the meta device, and saved: `tinyload`), and the planner's architecture figures (`catalog`).
Importing the package imports no torch."""
