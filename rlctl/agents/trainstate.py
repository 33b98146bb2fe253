"""The trainer's part of a checkpoint: the policy (an HF directory), every optimizer's state, other trained
modules (a PPO critic), the RNG states and the trainer's counters — saved and restored as one unit.

    save_trainer(ckpt, …)  ─▶ checkpoint.write_part(ckpt, "trainer", {model/, trainer/})  ─▶ manifest digest
    load_trainer(ckpt, …)  ◀─ checkpoint.read_manifest(ckpt, "trainer") must verify, else CheckpointError

Tensors go through `torch.save` and come back through `torch.load(weights_only=True)`; the RNG states of
`random` and numpy are JSON. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlctl.agents.checkpoint import read_manifest, write_part
from rlctl.engines.model import TinyGPT
from rlctl.errors import RlctlError
from rlctl.trainers.base import TrainerBackend

log = logging.getLogger(__name__)

MODEL = "model"
STATE = "trainer"


class CheckpointError(RlctlError):
    """A checkpoint that cannot be used: missing, incomplete or damaged (names the checkpoint and why)."""


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": [version, list(internal), gauss],
        "numpy": [str(kind), np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
    }


def set_rng_state(state: dict[str, Any], torch_state: torch.Tensor) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch_state)


def optimizer_digest(optimizers: dict[str, torch.optim.Optimizer]) -> str:
    """SHA-256 over every optimizer's hyper-parameters and state tensors (bytes), in a fixed order: equal
    digests before the save and after the restore mean the optimizer state came back exactly."""
    h = hashlib.sha256()
    for name in sorted(optimizers):
        sd = optimizers[name].state_dict()
        h.update(name.encode() + json.dumps(sd["param_groups"], sort_keys=True, default=str).encode())
        for index in sorted(sd["state"]):
            for key in sorted(sd["state"][index]):
                value = sd["state"][index][key]
                h.update(f"{index}.{key}".encode())
                t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_trainer(
    ckpt: Path,
    *,
    model: TinyGPT | TrainerBackend,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
    counters: dict[str, Any],
    tokenizer_from: Path | None = None,
) -> str:
    """Write the trainer's part of checkpoint `ckpt`; the SHA-256 of its manifest (the controller records it)."""

    def fill_model(tmp: Path) -> None:
        model.save_pretrained(tmp, tokenizer_from=tokenizer_from)

    def fill_state(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        tensors: dict[str, Any] = {f"optimizer.{k}": o.state_dict() for k, o in optimizers.items()}
        tensors |= {f"module.{k}": m.state_dict() for k, m in (modules or {}).items()}
        torch.save(tensors, tmp / "state.pt")
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():  # a GPU trainer: every device's generator too
            rng |= {f"cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())}
        torch.save(rng, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"counters": counters, "rng": rng_state()}, indent=1))

    meta = {"counters": counters, "optimizer_sha256": optimizer_digest(optimizers)}
    return write_part(ckpt, "trainer", {MODEL: fill_model, STATE: fill_state}, meta=meta)


def load_trainer(
    ckpt: Path,
    *,
    model: TinyGPT | TrainerBackend,
    optimizers: dict[str, torch.optim.Optimizer],
    modules: dict[str, torch.nn.Module] | None = None,
) -> tuple[dict[str, Any], str]:
    """Restore everything `save_trainer` wrote into the given objects; (counters, manifest digest)."""
    manifest = read_manifest(ckpt, "trainer")
    if manifest is None:
        raise CheckpointError(f"{ckpt}: the trainer's part is missing or does not match its manifest")
    loaded = TinyGPT.from_pretrained(ckpt / MODEL)
    model.load_state_dict(loaded.state_dict())
    tensors = torch.load(ckpt / STATE / "state.pt", weights_only=True)
    for k, o in optimizers.items():
        o.load_state_dict(tensors[f"optimizer.{k}"])
    for k, m in (modules or {}).items():
        m.load_state_dict(tensors[f"module.{k}"])
    restored = optimizer_digest(optimizers)
    if restored != manifest["optimizer_sha256"]:
        raise CheckpointError(f"{ckpt}: the optimizer state restored differs from the one saved")
    body = json.loads((ckpt / STATE / "state.json").read_text())
    rng = torch.load(ckpt / STATE / "rng.pt", weights_only=True)
    set_rng_state(body["rng"], rng["torch"])
    cuda = [rng[f"cuda.{i}"] for i in range(torch.cuda.device_count()) if f"cuda.{i}" in rng]
    if cuda and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    log.info("restored %s: optimizer state sha256 %s, as saved", ckpt.name, restored)
    return body["counters"], str(manifest["digest"])
