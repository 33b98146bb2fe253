"""LoRA on TinyGPT's projections: the base weights frozen, a low-rank update trained beside each target linear.

    y = x·Wᵀ + b + scale · (x·Aᵀ)·Bᵀ        A [rank, in] kaiming-uniform (as PEFT), B [out, rank] zeros,
                                             scale = alpha / rank; A and B in fp32 (the optimizer's only parameters)
    merged weight = W + scale · B·A          what rollout engines and HF checkpoints get: the same model, no adapters

`add_adapters(model, …)` swaps each target `nn.Linear` for a `LoraLinear` holding the same weight and bias
Parameters, so the model's state-dict names are unchanged and the adapters add `<linear>.lora_A` / `.lora_B`
beside them; `merged_weights` is the state dict under HF names with each target's weight merged and the adapters
left out (`merged_items`, the merge FSDP's gathers and shards run too). A model without adapters is untouched:
nothing here runs on its path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

ADAPTER_NAMES = ("lora_A", "lora_B")
INIT_SEED = 0  # every rank draws the same A: data-parallel replicas and FSDP shards start from one model


class LoraLinear(nn.Linear):
    """An `nn.Linear` (its weight and bias the wrapped one's Parameters) plus a trained low-rank update."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, generator: torch.Generator) -> None:
        nn.Module.__init__(self)  # (not nn.Linear's: the weight is the base's, never allocated anew)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        self.scale = alpha / rank
        a = _initial_a(rank, base.in_features, generator)
        device = base.weight.device
        self.lora_A = nn.Parameter(a.to(device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=torch.float32, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)

    def merged(self, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """`weight` + scale · `b`·`a` in fp32 (full tensors, or the rows of them one rank holds)."""
        return weight.float() + self.scale * (b.float() @ a.float())


def add_adapters(model: nn.Module, *, rank: int, alpha: float, targets: tuple[str, ...]) -> list[str]:
    """Put an adapter on every linear of `model` named one of `targets`, freeze every other parameter; the names
    of the adapted linears, in module order. Every call draws the same A's (`INIT_SEED`)."""
    generator = torch.Generator().manual_seed(INIT_SEED)
    adapted = []
    for name, module in list(model.named_modules()):
        for child, linear in list(module.named_children()):
            if child in targets and isinstance(linear, nn.Linear) and not isinstance(linear, LoraLinear):
                setattr(module, child, LoraLinear(linear, rank=rank, alpha=alpha, generator=generator))
                adapted.append(f"{name}.{child}" if name else child)
    assert adapted, f"no linear named one of {targets}"
    for pname, p in model.named_parameters():
        p.requires_grad_(pname.rsplit(".", 1)[-1] in ADAPTER_NAMES)
    return adapted


def initial_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full fp32 A's and B's `add_adapters` gave `model`'s adapters (by state-dict name; empty: no LoRA), drawn
    again in the same order from `INIT_SEED`: what a model made on the meta device (`fsdp.load_pretrained`: its
    adapters' values lost there) loads."""
    generator = torch.Generator().manual_seed(INIT_SEED)
    out = {}
    for name, m in adapters(model).items():
        out[f"{name}.lora_A"] = _initial_a(m.lora_A.shape[0], m.in_features, generator)
        out[f"{name}.lora_B"] = torch.zeros(m.out_features, m.lora_A.shape[0], dtype=torch.float32)
    return out


def _initial_a(rank: int, in_features: int, generator: torch.Generator) -> torch.Tensor:
    a = torch.empty(rank, in_features, dtype=torch.float32)
    return nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)  # on the CPU: the same on every device


def adapters(model: nn.Module) -> dict[str, LoraLinear]:
    """The adapted linears of `model` by name (empty: a model without LoRA)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLinear)}


def is_adapter(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in ADAPTER_NAMES


def merged_weights(model: nn.Module, state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """`model`'s state dict (or `state`, one of its state dicts) under HF names: each adapted linear's weight
    merged (W + scale·B·A, a new fp32 tensor), the adapters left out, every other tensor as it is (detached)."""
    sd = model.state_dict() if state is None else state
    return {name: t if merged else t.detach() for name, t, merged in merged_items(model, sd)}


class MergedWeights(Mapping[str, torch.Tensor]):
    """`merged_weights` of `model`'s live state, each adapted weight merged as it is read: a reader of one tensor at
    a time (a wire snapshot, a checkpoint's host copy, the delta encoder) holds one merged weight beside the model,
    versus every target's merged copy at once (fp32: 4 B a parameter of every adapted linear, most of the model's,
    on its device at every publish and checkpoint, beside the frozen weights and unpriced). Read twice, merged
    twice: a new tensor each time."""

    def __init__(self, model: nn.Module) -> None:
        self._state, self._adapted = model.state_dict(), adapters(model)
        self._names = [n for n in self._state if not is_adapter(n)]
        self._known = set(self._names)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._known:
            raise KeyError(name)
        t, owner = self._state[name], name.removesuffix(".weight")
        lin = self._adapted.get(owner) if name.endswith(".weight") else None
        if lin is None:
            return t.detach()
        with torch.no_grad():
            return lin.merged(t, self._state[f"{owner}.lora_A"], self._state[f"{owner}.lora_B"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def merged_items(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    whole: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
    skip: Container[str] = (),
) -> Iterator[tuple[str, torch.Tensor, bool]]:
    """`state` (one of `model`'s state dicts) in order, one tensor at a time, the adapters and the names in `skip` left
    out: each adapted linear's weight merged, `rows`(W) + scale · `rows`(B)·`whole`(A) (a new fp32 tensor, True beside
    it), every other tensor as it is (False). `whole` gives a tensor whole (FSDP: a DTensor gathered, a collective:
    every rank iterates in order), `rows` the rows of W and B to merge (default `whole`: all of them; FSDP: this
    rank's shard's). The one merge of `merged_weights`, FSDP's gathered `wire_weights` and its `merged_shards`."""
    rows = rows or whole
    adapted = adapters(model)
    for name, t in state.items():
        if is_adapter(name) or name in skip:
            continue
        owner = name.removesuffix(".weight")
        lin = adapted.get(owner) if name.endswith(".weight") else None
        if lin is None:
            yield name, t, False
            continue
        with torch.no_grad():  # (not around the yield: the caller's code would run without gradients too)
            merged = lin.merged(rows(t), whole(state[f"{owner}.lora_A"]), rows(state[f"{owner}.lora_B"]))
        yield name, merged, True


class AdapterState(nn.Module):
    """The adapters of `model` as one module (the same Parameter objects): what a checkpoint's rank shard holds of
    a LoRA policy (`module.lora`), its frozen weights being the job's model. State names are the adapters' with
    '.' written '-' (a module's parameter name holds no dot)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.adapters = nn.ParameterDict({n.replace(".", "-"): p for n, p in model.named_parameters() if is_adapter(n)})
