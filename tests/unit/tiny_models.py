"""Small TinyGPT configurations for unit tests: thousands of parameters, fast on one thread."""

from rlctl.models.tinygpt import TinyGPTConfig


def small_config(*, hidden: int = 32, layers: int = 1, heads: int = 2, positions: int = 32) -> TinyGPTConfig:
    """hidden → intermediate 2·hidden; always 2 K/V heads (grouped-query attention when heads > 2)."""
    return TinyGPTConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        max_position_embeddings=positions,
    )
