"""Making a TinyGPT whose weights come from elsewhere, and saving one: from an HF checkpoint directory
(`from_pretrained`, its lazy tensors `pretrained_tensors`), with uninitialised memory to be loaded (`empty`), on the
meta device to be laid out before any weight exists (`on_meta`, then `materialise`), and back to a directory
(`save_pretrained`). `TinyGPT` carries each as its own method (`TinyGPT.from_pretrained(...)`, …).

    from_pretrained ─→ pretrained_tensors (config, names, shapes: nothing read)
                    ─→ empty (meta, then `dtype` memory on `device`) ─→ load_weights, one tensor at a time
    on_meta ─→ (fully_shard) ─→ materialise ─→ fsdp.load_pretrained       (rlctl.trainers.native, sharded)

None of them initialises a weight first (`_uninitialised`): every value is the file's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlctl.errors import ConfigError
from rlctl.models import hf, hfdir, hfnames
from rlctl.models.hf import CONFIG_FILE, TinyGPTConfig
from rlctl.models.tensors import CheckpointTensors, DoesNotFit, ModelTensors

if TYPE_CHECKING:
    from rlctl.models.tinygpt import TinyGPT


def from_pretrained(
    cls: type[TinyGPT],
    directory: str | Path,
    *,
    dtype: torch.dtype | None = torch.float32,
    device: str | torch.device = "cpu",
    context: int | None = None,
) -> TinyGPT:
    """Load an HF Llama/Qwen2/Qwen3/Qwen3MoE/Qwen2MoE/Mistral/Phi3 checkpoint directory in `dtype` (None: the
    checkpoint's own) on `device`, holding sequences of up to `context` tokens (None: the model's max_positions; see
    `empty`); ConfigError for what is not supported. The weights are never initialised first (the model is made on
    the meta device and filled from the file, one tensor at a time: `CheckpointTensors`, `load_weights`)."""
    config, tensors = pretrained_tensors(directory, context=context)
    model = cls.empty(config, dtype=dtype or hf.torch_dtype(config), device=device, context=context)
    # each tensor read (in fp32, as `load_state_dict` reads it) and cast into its parameter in turn: what is held
    # beside the model is one tensor, versus a state dict of the whole model (a 7B in bf16: ≈ 30 GB, not 15)
    try:
        model.load_weights(tensors)
    except DoesNotFit as e:  # (what match_weights passes: a tied lm_head the file holds beside the embedding)
        raise ConfigError(str(directory), None, str(e)) from e
    return model


def pretrained_tensors(directory: str | Path, *, context: int | None = None) -> tuple[TinyGPTConfig, ModelTensors]:
    """An HF checkpoint directory's config and its tensors in TinyGPT's names, each read when asked for (names and
    shapes from the files' headers: nothing read yet); ConfigError for what is not supported, or a `context` longer
    than a sliding window that binds (`hf.window_refusal`)."""
    d = Path(directory)
    config = hf.read_config(d)
    held = config.max_positions if context is None else min(context, config.max_positions)
    if (why := hf.window_refusal(config, held)) is not None:  # (before the weights are read)
        raise ConfigError(str(d / CONFIG_FILE), "sliding_window", why)
    file = CheckpointTensors(d)
    return config, ModelTensors(file, config, only=hfnames.match_weights(file.shapes(), config, where=str(d)))


def empty(
    cls: type[TinyGPT],
    config: TinyGPTConfig,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    context: int | None = None,
) -> TinyGPT:
    """A model of `config` whose weights are uninitialised memory in `dtype` on `device` (to be loaded), whose
    RoPE tables hold min(`context`, max_positions) positions (None: max_positions): a job's
    context (rlctl.agents.common.job_context), where a checkpoint says 131072 … 1,024,000."""
    with _uninitialised(), torch.device("meta"):
        model = cls(config)
    # `to_empty` (whose empty_like of a meta tensor is a decomposition that imports sympy: ≈ 0.7 s of an agent's
    # start), each weight made once (a tied embedding is met twice) in `dtype`, versus made in fp32 and cast (a
    # bf16 model on a GPU: its fp32 twin first, 2 × the model in device memory at the start)
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id → (the meta tensor, kept: its id stays its)

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            made[id(t)] = t, torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device)
        return made[id(t)][1]

    model._apply(empty)
    if config.tie_word_embeddings:  # one parameter under both names, as on construction
        model.lm_head.weight = model.model.embed_tokens.weight
    if context is not None:
        model.context = min(context, config.max_positions)
    model._rope_tables()
    return model.to(dtype)  # (the RoPE tables, made in fp32, cast as the constructor's model's are)


def on_meta(cls: type[TinyGPT], config: TinyGPTConfig, *, context: int | None = None) -> TinyGPT:
    """A model of `config` on the meta device, holding no memory (`context` as `empty`'s), to be laid out
    (FSDP2's `fully_shard`) before any weight exists, then given memory with `materialise`."""
    with _uninitialised(), torch.device("meta"):
        model = cls(config)
    if context is not None:
        model.context = min(context, config.max_positions)
    return model


def materialise(self: TinyGPT, device: torch.device) -> None:
    """`on_meta`'s model (sharded or not) given uninitialised memory on `device` (a sharded one: its shards),
    its RoPE tables (non-persistent buffers: nothing loads them) computed there in fp32."""
    self.to_empty(device=device)
    self._rope_tables()


def save_pretrained(
    self: TinyGPT,
    directory: str | Path,
    *,
    max_shard_bytes: int | None = None,
    dtype: torch.dtype = torch.float32,
    tokenizer_from: str | Path | None = None,
) -> Path:
    """Write config.json and the weights (sharded above `max_shard_bytes`, cast to `dtype`), and
    copy the tokenizer files of checkpoint `tokenizer_from` when given."""
    sd = {k: v.detach().to(dtype) if v.is_floating_point() else v for k, v in self.state_dict().items()}
    if self.fused:  # the views into the fused tensors: a file holds each tensor on its own
        sd = {k: v.clone() if v.untyped_storage().nbytes() > v.nbytes else v for k, v in sd.items()}
    if self.config.tie_word_embeddings:
        sd.pop("lm_head.weight")
    return hfdir.write_pretrained(
        directory, sd, self.config, tokenizer_from=tokenizer_from, max_shard_bytes=max_shard_bytes
    )


_INIT_FUNCTIONS = ("normal_", "uniform_", "kaiming_uniform_")  # what nn.Linear and nn.Embedding call
_init_lock = threading.Lock()


@contextlib.contextmanager
def _uninitialised() -> Iterator[None]:
    """Modules built inside it skip their parameters' initialisation (`empty`, `on_meta`: weights to be loaded). On
    the meta device an initialiser is a Python decomposition whose first call imports torch._dynamo — about 3 s of
    every rollout unit's and trainer's start on 2 cores, for values nobody reads (transformers' `no_init_weights`
    does the same)."""
    with _init_lock:
        saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
        for name in _INIT_FUNCTIONS:
            setattr(nn.init, name, _unchanged)
        try:
            yield
        finally:
            for name, f in saved.items():
                setattr(nn.init, name, f)


def _unchanged(tensor: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    return tensor
