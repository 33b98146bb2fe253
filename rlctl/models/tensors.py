"""An HF checkpoint directory's tensors read one at a time: each from its weight file when it is asked for, in fp32,
and not kept.

    CheckpointTensors(dir)[name] ─▶ safe_open(its file).get_tensor(name)   (model.safetensors, or the index's shard)
                                 ─▶ torch.load(pytorch_model.bin, mmap=True)[name]

What a reader that cuts each tensor to its own part holds at once is that tensor, not the model: a megatron rank
resuming a checkpoint (`rlctl.checkpoint.trainer`) reads its shard so, versus `weightfiles.load_state_dict`'s whole copy
of the model (70B in fp32: 280 GB on every rank of a node). `copy_into` loads a whole module (a `torch` rank's
TinyGPT, every `TinyGPT.from_pretrained`) so: torch's `load_state_dict` would first make a dict of every tensor of a
lazy mapping.

    ModelTensors(file tensors, config)[name] ─▶ the model's names: a Phi3 file's qkv_proj read as q, k, v (its rows)

Every full-model load checks the names and shapes (`check_fit`, from the files' headers: nothing read) and a tied
lm_head (`check_tied`) before it copies a tensor, and refuses in one line (DoesNotFit): `copy_into`,
`rlctl.trainers.fsdp.load_full`, megatron's `MegatronPolicy.load_hf`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

from rlctl.models import hfnames, weightfiles
from rlctl.models.hf import TinyGPTConfig


class CheckpointTensors(Mapping[str, torch.Tensor]):
    """The tensors of the checkpoint in `directory` by name, each read when it is asked for (floating ones cast to
    fp32); `shapes` from the files' headers, nothing read. ConfigError as
    `weightfiles.weight_files` and the header readers say it (no weights, a missing shard, a truncated file)."""

    def __init__(self, directory: str | Path) -> None:
        self._files: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._mapped: dict[str, torch.Tensor] = {}  # a pytorch_model.bin's tensors, mapped (read as they are used)
        for f in weightfiles.weight_files(directory):
            if f.name == weightfiles.TORCH_FILE:
                weightfiles.torch_bin_header(f)  # refused in one line where torch cannot map it
                self._mapped = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
                header = {k: ("", tuple(v.shape)) for k, v in self._mapped.items()}
            else:
                header = weightfiles.safetensors_header(f)
            for name, (_, shape) in header.items():
                self._files[name], self._shapes[name] = f, shape

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._mapped:
            t = self._mapped[name]
        else:
            from safetensors import safe_open

            with safe_open(str(self._files[name]), framework="pt") as f:
                t = f.get_tensor(name)
        return t.float() if t.is_floating_point() else t

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows `start` … `stop` − 1 of tensor `name` (fp32 where floating, as `self[name]`), those rows alone read."""
        if name in self._mapped:
            t = self._mapped[name][start:stop]
        else:
            from safetensors import safe_open

            with safe_open(str(self._files[name]), framework="pt") as f:
                t = f.get_slice(name)[start:stop]
        return t.float() if t.is_floating_point() else t

    def __contains__(self, name: object) -> bool:  # (Mapping's reads the tensor)
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


class ModelTensors(Mapping[str, torch.Tensor]):
    """A checkpoint file's tensors `file` (by the file's names: `CheckpointTensors`, or a state dict) under the names
    of the model of `config`: each part of a fused tensor (Phi3's q, k, v of qkv_proj, gate, up of gate_up_proj:
    `hfnames.fusions`) its rows of it, in the file's order; the other names as they are; `only`: the file's names to
    read (`hfnames.match_weights`'s, leaving out an older Llama's rotary_emb.inv_freq and a tied lm_head; None: all).
    The fused tensor last read is kept for its next part, so a reader asking for q, k and v in a row reads qkv_proj
    once."""

    def __init__(
        self, file: Mapping[str, torch.Tensor], config: TinyGPTConfig, *, only: Collection[str] | None = None
    ) -> None:
        self._file, fused, shapes = file, hfnames.fusions(config), hfnames.expected_shapes(config)
        self._parts: dict[str, tuple[str, int, int]] = {}  # part → (fused tensor, first row, rows)
        for name, parts in fused.items():
            at = 0
            for p in parts:
                self._parts[p] = (name, at, shapes[p][0])
                at += shapes[p][0]
        self._names = [p for name in file if only is None or name in only for p in fused.get(name, (name,))]
        self._known = set(self._names)
        self._last: tuple[str, torch.Tensor] | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._known:
            raise KeyError(name)
        if name not in self._parts:
            return self._file[name]
        fused, at, rows = self._parts[name]
        if self._last is None or self._last[0] != fused:
            self._last = (fused, self._file[fused])
        return self._last[1][at : at + rows]

    def __contains__(self, name: object) -> bool:
        return name in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each name's shape, from the file's (its headers: nothing read, where it is `CheckpointTensors`)."""
        file = shapes_of(self._file)
        out: dict[str, tuple[int, ...]] = {}
        for name in self._names:
            if name in self._parts:
                fused, _, rows = self._parts[name]
                out[name] = (rows, *file[fused][1:])
            else:
                out[name] = file[name]
        return out


class DoesNotFit(ValueError):
    """A checkpoint's tensors are not the model's (`check_fit`, `check_tied`): one line, nothing copied yet."""


def check_fit(
    model: Mapping[str, tuple[int, ...]], checkpoint: Mapping[str, tuple[int, ...]], *, optional: Collection[str] = ()
) -> None:
    """DoesNotFit (one line) unless the `checkpoint`'s tensor names and shapes are the `model`'s (`optional`'s
    may be missing): how many are missing, unexpected and of another shape, and the first few of each. Every
    full-model load calls it before it copies a tensor (`copy_into`, `fsdp.load_full`, megatron's `load_hf`): a
    refused load leaves the model as it was, versus some tensors new and the rest as they were."""
    missing = [k for k in model if k not in checkpoint and k not in optional]
    unexpected = [k for k in checkpoint if k not in model]
    wrong = [
        f"{k} {list(checkpoint[k])} where the model's is {list(model[k])}"
        for k in model
        if k in checkpoint and tuple(checkpoint[k]) != tuple(model[k])
    ]
    said = [
        f"{len(names)} {what} ({_first(names)})"
        for what, names in (("missing", missing), ("unexpected", unexpected), ("of another shape", wrong))
        if names
    ]
    if said:
        raise DoesNotFit(f"weights do not fit this model: {'; '.join(said)}")


def _first(names: list[str], said: int = 3) -> str:
    """The first `said` of `names`, and how many more."""
    return ", ".join(names[:said]) + (f", … {len(names) - said} more" if len(names) > said else "")


def check_tied(tensors: Mapping[str, torch.Tensor]) -> None:
    """DoesNotFit where `tensors` (of a model whose lm_head is its embedding: tie_word_embeddings) hold an
    `lm_head.weight` other than `model.embed_tokens.weight`: one tensor cannot be both. Transformers loads such a
    checkpoint untied (its config notwithstanding), versus rlctl's load, which copied one over the other (the
    embedding silently the file's lm_head, or the lm_head its embedding). Equal, or absent: nothing to say."""
    if "lm_head.weight" not in tensors:
        return
    lm_head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    if _view(lm_head) == _view(embed):
        return  # one tensor under both names (a tied model's state dict, megatron's `weights()`): not compared
    if not torch.equal(lm_head, embed):
        raise DoesNotFit(TIED_DIFFER)


TIED_DIFFER = (
    "weights do not fit this model: lm_head.weight differs from model.embed_tokens.weight, and this model holds one "
    "tensor for both (tie_word_embeddings: true; transformers loads such a checkpoint untied); a model of "
    "tie_word_embeddings: false trains both"
)
TIED_BLOCK_ROWS = 4096  # rows of each tensor `check_tied_files` holds at once (a 152k vocabulary: 38 blocks)


def check_tied_files(tensors: CheckpointTensors) -> None:
    """`check_tied` of a tied model's checkpoint before any load (`rlctl check`: `hfdir.tied_head_refusal`), the two
    tensors read and compared TIED_BLOCK_ROWS rows at a time (in fp32, as the loader compares them), versus both held
    whole (a tied 3B's embedding, 151936 × 2048: 1.2 GB in fp32 each). Absent lm_head.weight: nothing read."""
    if "lm_head.weight" not in tensors:
        return
    shapes = tensors.shapes()
    if shapes["lm_head.weight"] != shapes["model.embed_tokens.weight"]:
        raise DoesNotFit(TIED_DIFFER)
    for start in range(0, shapes["lm_head.weight"][0], TIED_BLOCK_ROWS):
        stop = start + TIED_BLOCK_ROWS
        if not torch.equal(
            tensors.rows("lm_head.weight", start, stop), tensors.rows("model.embed_tokens.weight", start, stop)
        ):
            raise DoesNotFit(TIED_DIFFER)


def _view(t: torch.Tensor) -> tuple[object, ...]:
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device


@torch.no_grad()
def copy_into(module: nn.Module, tensors: Mapping[str, torch.Tensor], *, optional: Collection[str] = ()) -> None:
    """`tensors` copied into `module`'s state in place (any dtype or device: each is converted), each read as it is
    copied: what is held beyond the module is one tensor (`CheckpointTensors`), versus torch's `load_state_dict`,
    which makes a dict of the whole mapping first (+1 × the model on a rank's resume). Checked first (`check_fit`:
    the names and shapes from `shapes()` where it has them, nothing read; `check_tied` where the module ties its
    lm_head to its embedding), DoesNotFit with nothing copied. A tensor the module holds under two names (a tied
    lm_head) is copied once."""
    own = module.state_dict()
    alias = check_load(module, own, tensors, optional=optional)
    for name, t in own.items():  # the module's order, as load_state_dict copies
        if name in tensors and name not in alias:
            t.copy_(tensors[name])


def check_load(
    module: nn.Module,
    own: Mapping[str, torch.Tensor],
    tensors: Mapping[str, torch.Tensor],
    *,
    optional: Collection[str] = (),
) -> dict[str, str]:
    """What every full load into `module` (its state dict `own`) checks before it copies a tensor: `check_fit` (the
    full shapes), and `check_tied` where the module ties its lm_head to its embedding; DoesNotFit with nothing
    copied. Returns the module's aliases (`aliases`: names whose tensor an earlier name holds, copied once)."""
    check_fit({k: tuple(t.shape) for k, t in own.items()}, shapes_of(tensors), optional=optional)
    alias = aliases(module)
    if alias:
        check_tied(tensors)
    return alias


def aliases(module: nn.Module) -> dict[str, str]:
    """Each name of `module`'s state that holds a parameter an earlier name holds (a tied `lm_head.weight`) → that
    earlier name."""
    first: dict[int, str] = {}
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def shapes_of(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape: from the files' headers where `tensors` has them (nothing read), else its own."""
    if isinstance(tensors, CheckpointTensors | ModelTensors):
        return tensors.shapes()
    return {k: tuple(t.shape) for k, t in tensors.items()}
