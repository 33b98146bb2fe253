"""Small TinyGPT configurations for unit tests: thousands of parameters, fast on one thread; checkpoints that do not
fit them."""

import torch

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


def misfits(whole: dict[str, torch.Tensor], order: list[str]) -> list[tuple[dict[str, torch.Tensor], str]]:
    """A model's HF tensors (`whole`; the names of its state in its order: `order`) made not to fit it, each with the
    one line that refuses them (`rlctl.models.tensors.check_fit`): one missing, one unexpected, one of another shape,
    and all three kinds at once (more missing than are named: the first in the model's order)."""
    no = "weights do not fit this model: "
    layers = [k for k in order if k.startswith("model.layers.")]
    h, embed = list(whole["model.norm.weight"].shape), list(whole["model.embed_tokens.weight"].shape)
    return [
        ({k: v for k, v in whole.items() if k != "model.norm.weight"}, f"{no}1 missing (model.norm.weight)"),
        ({**whole, "model.extra": torch.zeros(1)}, f"{no}1 unexpected (model.extra)"),
        (
            {**whole, "model.norm.weight": torch.zeros(3)},
            f"{no}1 of another shape (model.norm.weight [3] where the model's is {h})",
        ),
        (
            {
                **{k: v for k, v in whole.items() if k not in layers[:5]},
                "a": torch.zeros(1),
                "b": torch.zeros(1),
                "model.embed_tokens.weight": torch.zeros(2, *embed[1:]),
            },
            f"{no}5 missing ({', '.join(layers[:3])}, … 2 more); 2 unexpected (a, b); 1 of another shape "
            f"(model.embed_tokens.weight {[2, *embed[1:]]} where the model's is {embed})",
        ),
    ]
