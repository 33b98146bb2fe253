"""The embedded engine's K/V storage, sized without torch: the widths it allocates and the bytes they take, so
`rlctl check` prices a rollout unit's memory with the formula the engine allocates by.

    K/V bytes = rows × capacity × bytes per position
        rows          rollout.max_batch_size (every row is allocated at the first admission)
        capacity      the longest request (prompt + output) rounded up to a width bucket: 128, 192, 256, 384,
                      512, … positions; at most the model's max_position_embeddings
        per position  2 (K and V) × layers × kv_heads × head_dim × bytes per value (the engine's dtype)
"""

from __future__ import annotations

from rlctl.models.hf import TinyGPTConfig

MIN_WIDTH = 128  # the narrowest cache and decode width (positions)


def bucket(n: int, *, floor: int = 1) -> int:
    """The smallest of floor·2^k and 1.5·floor·2^k that is ≥ n (1, 2, 3, 4, 6, 8, 12, 16, 24, … for floor 1)."""
    size = floor
    while True:
        for s in (size, size * 3 // 2):
            if s >= n:
                return s
        size *= 2


def cache_capacity(need: int, max_positions: int) -> int:
    """Positions of the K/V storage for requests of up to `need` tokens (prompt + output)."""
    return min(bucket(need, floor=MIN_WIDTH), max_positions)


def bytes_per_position(config: TinyGPTConfig, *, value_bytes: int) -> int:
    """K/V bytes of one row's position, over every layer."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * value_bytes


def kv_cache_bytes(config: TinyGPTConfig, *, rows: int, capacity: int, value_bytes: int) -> int:
    """The K/V storage `TinyGPT.new_cache(rows, capacity)` allocates."""
    return rows * capacity * bytes_per_position(config, value_bytes=value_bytes)
