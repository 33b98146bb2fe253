"""Decoder models: the HF checkpoint format (config.json `hf`, weight files `weightfiles`, tensor names `hfnames`, the
directory `hfdir`), rlctl's own Llama/Qwen2/Qwen3/Qwen3MoE/Mistral/Phi3 implementation (`tinygpt`), and the planner's
architecture figures (`catalog`). Importing the package imports no torch."""
