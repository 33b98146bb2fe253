"""FSDP2 for the `torch` trainer: parameters, gradients and AdamW state sharded over the trainer's ranks.

Used when a whole replica (fp32 weights, gradients and AdamW moments: 16 bytes per parameter) does not fit one
GPU — the rule `rlctl.planner.costs.replica_fits`, applied by the plan (`trainer.parallel.fsdp`), so the planner
and the runtime agree — or when the job asks for it (`trainer.shard: fsdp`). The same code runs over gloo on CPU
ranks (CI) and over NCCL on GPUs:

    shard(model)         fully_shard every decoder layer, then the root (embeddings, final norm, lm_head; a tied
                         lm_head is the embedding's one parameter); on CUDA bf16 compute with fp32 gradient
                         reduction (MixedPrecisionPolicy), on a CPU fp32. Gradients are summed over the ranks
                         (divide factor 1: the learner divides by the iteration's token count, as unsharded),
                         in every backward, or once an optimizer step where the learner holds gradient sync off
                         (`DataParallel.reduce_per_step`: the plan's `reduce_per_step`, LoRA always). The model is
                         made on the meta device (`TinyGPT.on_meta`) and sharded before it holds any memory
    load_pretrained(...) then given its shards' memory (`TinyGPT.materialise`) and filled from the HF checkpoint one
                         full tensor at a time, each rank copying its rows: a rank never holds more than its shards
                         and one full tensor, versus the whole fp32 model before sharding (a 72B: 288 GB, on no GPU)
    shard_critic(...)    PPO's critic (a trunk of the policy's config on the meta device, without its lm_head, and a
                         value head) alike, on the same mesh, its trunk's shards copied from the policy's, its head
                         zeroed: its AdamW state and checkpoint are sharded as the policy's (the learner's `modules()`,
                         `rlctl.checkpoint.trainer` and `refsdp` alike)
    wire_weights(...)    the full tensors, gathered one at a time, cast to the wire dtype and copied to the host:
                         never a whole model on one device (the reason for sharding)
    local_state(...)     this rank's shards as plain tensors, uncopied (what its checkpoint shard holds, copied to
    load_local(...)      the host one tensor at a time: parameters and optimizer state, bit for bit) and back into
                         the DTensors, at the same number of ranks

Every rank must run every forward and backward (they are collectives): the learner gives a rank without a row
in a micro-batch a zero-weight row (`rlctl.rl.learner`), and weights are gathered on every rank, in order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from rlctl.devices import as_dtensor
from rlctl.models import lora
from rlctl.models.tensors import check_fit, check_load
from rlctl.models.tinygpt import TinyGPT


def shard(model: TinyGPT, *, cuda: bool) -> None:
    """Shard `model` in place over the default process group (every trainer rank)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    _shard(model, model.blocks(), cuda=cuda)
    register_fsdp_forward_method(model, "hidden")  # a forward of its own (the final normed hidden states)
    model.autocast_dtype = None  # the policy casts parameters for compute


def load_pretrained(model: TinyGPT, tensors: Mapping[str, torch.Tensor]) -> None:
    """Fill a sharded model made on the meta device (`TinyGPT.on_meta`, `shard`, `TinyGPT.materialise`: nothing in
    it initialised) from an HF checkpoint's tensors (`pretrained_tensors`: each read when asked for), each full
    tensor read, its rows copied into this rank's shards and dropped (`load_full`): what a rank holds beyond its
    shards is one full tensor, versus the whole model in fp32 before sharding (a 72B: 288 GB). LoRA adapters get
    `add_adapters`' initial values (`lora.initial_state`: the same draws, whole, then this rank's rows)."""
    initial = lora.initial_state(model)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    load_full(model, tensors, optional=tied | set(initial))
    if initial:
        load_full(model, initial, optional=[k for k in model.state_dict() if k not in initial])


def shard_critic(critic: nn.Module, policy: TinyGPT, *, cuda: bool) -> None:
    """Shard PPO's critic (`rlctl.rl.ppo.ValueModel`, on a trunk of the policy's config without its lm_head:
    `TinyGPT.on_meta`, `rlctl.trainers.critic.headless`, holding nothing yet) in place as `shard` shards the policy:
    its trunk's decoder layers, then the root (embeddings, final norm and the value head: no lm_head to gather); give it
    its shards' memory on the policy's device, then copy the policy's shards into the trunk's, rank by rank (the same
    mesh and shapes: the same rows of each tensor; no communication), and zero the value head (as `ValueModel` makes
    it). No rank holds a whole critic."""
    trunk = critic.get_submodule("body")
    assert isinstance(trunk, TinyGPT), type(trunk)
    _shard(critic, trunk.blocks(), cuda=cuda)
    trunk.autocast_dtype = None
    device = local_tensor(next(policy.parameters())).device
    trunk.materialise(device)
    for child in critic.children():
        if child is not trunk:
            child.to_empty(device=device)
    theirs = policy.state_dict()
    with torch.no_grad():
        for name, t in critic.state_dict().items():
            if name.startswith("body."):
                local_tensor(t).copy_(local_tensor(theirs[name.removeprefix("body.")]))
            else:
                local_tensor(t).zero_()


def _shard(root: nn.Module, layers: Iterable[nn.Module], *, cuda: bool) -> None:
    """fully_shard each of `layers`, then `root`, summing the gradients over the ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda else MixedPrecisionPolicy()
    )
    # the mesh of the device the rank computes on: without one FSDP2 takes the machine's accelerator (CUDA on any
    # GPU host) and moves the parameters there, a CPU site's trainer too
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dist.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    for m in root.modules():  # each sharded module reduces its own gradients: sums (gloo has no pre-scaled sum)
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise)."""
    return d.to_local() if (d := as_dtensor(t)) is not None else t


def wire_weights(model: nn.Module, *, dtype: torch.dtype, tied: bool, host: bool = True) -> dict[str, torch.Tensor]:
    """Full HF tensors in host memory in `dtype` (integers kept), gathered tensor by tensor; every rank calls it
    (the gathers are collectives). `host=False`: gathered, but kept only as their layout (meta tensors). A LoRA
    policy's adapted weights merged (W + scale·B·A, their adapters gathered beside them), the adapters left out."""
    out = {}
    skip = ("lm_head.weight",) if tied else ()
    for name, t, merged in lora.merged_items(model, model.state_dict(), whole=_full, skip=skip):
        full = t if merged else _full(t)
        want = dtype if full.is_floating_point() else full.dtype
        if host:
            out[name] = torch.empty(full.shape, dtype=want).copy_(full.detach())
        else:
            out[name] = torch.empty(full.shape, dtype=want, device="meta")
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a collective), a plain tensor as it is."""
    return d.full_tensor() if (d := as_dtensor(t)) is not None else t


def merged_shards(model: nn.Module) -> dict[str, torch.Tensor]:
    """A LoRA policy's tensors as `model.state_dict()` has them (DTensors of this rank's shards), each adapted
    weight's rows merged: W's rows + scale · B's same rows · A (A gathered: a collective, every rank in order);
    the adapters left out."""
    from torch.distributed.tensor import DTensor

    sd = model.state_dict()
    out = {}
    for name, t, merged in lora.merged_items(model, sd, whole=_full, rows=local_tensor):
        if not merged or (d := as_dtensor(sd[name])) is None:
            out[name] = t
            continue
        out[name] = DTensor.from_local(
            t.to(d.dtype), d.device_mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride()
        )
    return out


def load_full(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, optional: Collection[str] = ()) -> None:
    """Full tensors (every rank passes the same) into this rank's shards; no communication. Checked first as
    `copy_into` checks them (`check_load`: `check_fit` against the full shapes, `check_tied`): DoesNotFit with
    nothing copied, versus a missing tensor left as it was and one of another shape or name ending the load halfway
    (a resume's policy part new, part initial). A tied lm_head (the embedding's parameter) is copied once, as the
    embedding."""
    own = model.state_dict()
    alias = check_load(model, own, state_dict, optional=optional)
    with torch.no_grad():
        for name, p in own.items():
            if name not in state_dict or name in alias:
                continue
            src = state_dict[name]
            if (d := as_dtensor(p)) is not None:
                d.to_local().copy_(_own_rows(src, d))
            else:
                p.copy_(src)


def _own_rows(src: torch.Tensor, d: Any) -> torch.Tensor:
    """This rank's rows of the full tensor `src` as DTensor `d` holds them (`shard`'s Shard(0): `torch.chunk`'s cut,
    a rank past the rows holding none), cut where `src` is (a checkpoint's tensor: the host) and only they moved to
    `d`'s device and dtype, versus the full tensor moved first (a 72B's embedding: ≈ 5 GB of GPU memory a rank)."""
    from torch.distributed.tensor import Shard

    assert tuple(d.placements) == (Shard(0),), d.placements  # what `shard` makes
    mesh = d.device_mesh
    per = -(-src.shape[0] // mesh.size())
    start = min(mesh.get_local_rank() * per, src.shape[0])
    rows = src[start : start + d.to_local().shape[0]]
    return rows.to(d.device, d.dtype)


def local_state(state: Any) -> Any:
    """`state` (a state dict, an optimizer's state dict, nested) with every DTensor replaced by its local shard: the
    live shard itself, not a copy — on the device, a copy of a rank's AdamW moments is 8 bytes per local parameter
    that nothing prices. A snapshot copies it where it is kept (`rlctl.checkpoint.trainer.host_copy`: to the
    host, tensor by tensor); a digest reads it as it is."""
    if (d := as_dtensor(state)) is not None:
        return d.to_local().detach()
    if isinstance(state, Mapping):
        return {k: local_state(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(local_state(v) for v in state)
    return state


def check_local_fit(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """DoesNotFit (`check_fit`, one line) unless `state` holds `module`'s tensors at this rank's shapes (its shards':
    `local_state(module.state_dict())` as saved)."""
    check_fit(_local_shapes(module.state_dict()), _local_shapes(state))


def _local_shapes(state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each entry's shape (a DTensor's shard's); an entry that is no tensor, or a module's `_extra_state` (megatron's:
    None, bytes or a tensor of its own size), held to its name alone."""
    return {
        k: tuple(local_tensor(v).shape) if isinstance(v, torch.Tensor) and not k.endswith("_extra_state") else ()
        for k, v in state.items()
    }


def load_local(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """This rank's shards (`local_state(module.state_dict())` as saved) back into `module`'s DTensors, in place;
    a module that is not sharded loads its state dict as it is. Checked first (`check_local_fit`): DoesNotFit with
    nothing copied, versus the tensors before a missing or misshapen one copied (a KeyError, the copy's
    RuntimeError; unsharded, torch's load_state_dict copied every tensor that fit, then raised)."""
    check_local_fit(module, state)
    if not any(as_dtensor(p) is not None for p in module.parameters()):
        module.load_state_dict(state)
        return
    with torch.no_grad():
        for name, p in module.state_dict().items():
            local_tensor(p).copy_(state[name])


def redistribute_optimizer(optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter]) -> None:
    """After `optimizer.load_state_dict` of local shards: wrap each per-parameter state tensor of a sharded
    parameter back into a DTensor laid out as the parameter (scalars such as `step` stay as they are)."""
    for p in params:
        d = as_dtensor(p)
        if d is None or p not in optimizer.state:
            continue
        from torch.distributed.tensor import DTensor

        st = optimizer.state[p]
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and as_dtensor(v) is None and v.shape == d.to_local().shape:
                local = v.to(d.device)
                st[k] = DTensor.from_local(
                    local, d.device_mesh, d.placements, run_check=False, shape=d.shape, stride=d.stride()
                )
