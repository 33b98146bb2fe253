"""rlctl's backend for vLLM's weight-transfer protocol: how a version reaches vLLM's workers.

`VllmEngine.load_weights` runs vLLM's four phases on every worker (`collective_rpc`): the backend once
(`init_weight_transfer_engine`), then per version `start_weight_update` (vLLM's layerwise reload: each layer
is processed once all its tensors arrived, so checkpoint-format weights need no whole-model staging on the
device), one `update_weights` per chunk of the version, `finish_weight_update`. An update names its chunk,
it does not carry it:

- `key`: the chunk's tensors were handed over in this process (`hand_over`): the engine core and its one
  worker run in the caller's process (tensor parallel 1, rlctl's default), so nothing is copied or pickled;
- `path`: a safetensors file (in shared memory) that every worker maps and takes its shard of through the
  model's weight loader (tensor parallel > 1: workers are processes). The sender removes it once the call
  returned, so shared memory holds one chunk at a time, never the version.

vLLM builds the backend from the name `rlctl` (`vllm_plugin.register`, loaded in every vLLM process by the
`vllm.general_plugins` entry point)."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from rlctl.engines.vllm_moe import patch_expert_reload

_HANDED: dict[str, list[tuple[str, torch.Tensor]]] = {}
_LOCK = threading.Lock()
_KEYS = itertools.count()


def hand_over(tensors: list[tuple[str, torch.Tensor]]) -> str:
    """Leave one chunk for this process's worker; the key its `update_weights` names."""
    with _LOCK:
        key = f"chunk-{next(_KEYS)}"
        _HANDED[key] = tensors
    return key


def take_back(key: str) -> None:
    """Drop a chunk the worker did not take (its update failed)."""
    with _LOCK:
        _HANDED.pop(key, None)


@dataclass
class RlctlInit(WeightTransferInitInfo):
    """Nothing to set up: the sender and the workers share a host (a unit's process and its workers)."""


@dataclass
class RlctlUpdate(WeightTransferUpdateInfo):
    key: str = ""  # a chunk handed over in this process
    path: str = ""  # … or a safetensors file every worker reads its shard from


class RlctlWeightTransfer(WeightTransferEngine[RlctlInit, RlctlUpdate]):
    """The worker's side: loads each named chunk into the model under vLLM's layerwise reload."""

    init_info_cls = RlctlInit
    update_info_cls = RlctlUpdate

    def init_transfer_engine(self, init_info: RlctlInit) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        patch_expert_reload()  # (a MoE's experts laid out as on the first load: rlctl.engines.vllm_moe)
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: RlctlUpdate) -> None:
        if update_info.key:
            with _LOCK:
                tensors = _HANDED.pop(update_info.key, None)
            if tensors is None:
                raise RuntimeError(
                    f"weight chunk {update_info.key!r} was not handed over in this worker's process "
                    "(an engine core in a process of its own: push through files, weights_via_file=True)"
                )
            self.model.load_weights(tensors)
            return
        from safetensors import safe_open

        with safe_open(update_info.path, framework="pt") as f:
            self.model.load_weights((name, f.get_tensor(name)) for name in f.keys())  # noqa: SIM118

    def shutdown(self) -> None:
        pass


def chunks(state_dict: dict[str, torch.Tensor], limit: int) -> list[list[tuple[str, torch.Tensor]]]:
    """The version in order, cut into chunks of at most `limit` bytes (a larger tensor is a chunk alone)."""
    out: list[list[tuple[str, torch.Tensor]]] = []
    size = 0
    for name, t in state_dict.items():
        n = t.numel() * t.element_size()
        if not out or (size + n > limit and out[-1]):
            out.append([])
            size = 0
        out[-1].append((name, t))
        size += n
    return out
