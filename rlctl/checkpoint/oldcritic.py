"""A PPO checkpoint shard written while the torch trainer's critic held the policy's lm_head, read as one of now.

Until 2026-12-07 the critic's trunk was a whole copy of the policy (`rlctl.trainers.critic`: now without its lm_head).
Its shards hold, beside what a shard holds now:

    module.critic      body.lm_head.weight (this rank's rows, sharded): unused by the values, so its value is dropped
    optimizer.critic   untied, one parameter more, the lm_head, at the index after the trunk's parameters (the
                       value head's two follow it): its state, if any (AdamW's zero moments where an unsharded dp > 1
                       summed zero gradients into it; none where no gradient reached it), dropped, and the indices
                       after it one less; tied, the lm_head was the embedding's parameter: nothing to drop

Such a shard is verified against its digest as its rank wrote it (`shardcheck.check_digest`, before the upgrade: the
upgraded state is not what was hashed), then upgraded (`upgraded`), and read as any shard of now; its optimizer state
is not hashed again as restored (`rlctl.checkpoint.trainer.load_trainer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlctl.checkpoint import shardcheck

MODULE, OPTIMIZER = "module.critic", "optimizer.critic"
HEAD = "body.lm_head.weight"


def applies(shard: Mapping[str, Any], modules: Mapping[str, nn.Module]) -> bool:
    """Whether `shard` holds a critic's lm_head that this trainer's critic (`modules['critic']`) does not hold."""
    critic, state = modules.get("critic"), shard.get(MODULE)
    return critic is not None and isinstance(state, Mapping) and HEAD in state and HEAD not in critic.state_dict()


def upgraded(shard: Mapping[str, Any], *, critic: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """`shard` (`applies`) without its critic's lm_head: a new dict (its tensors shared, not copied). The lm_head's
    optimizer index is the one after the trunk's parameters (`critic`'s `body.` ones, in order: TinyGPT registers
    lm_head after them), dropped where the shard's critic optimizer holds one parameter more than `optimizer`."""
    out = dict(shard)
    out[MODULE] = {k: v for k, v in shard[MODULE].items() if k != HEAD}
    sd = shard.get(OPTIMIZER)
    if optimizer is None or not isinstance(sd, Mapping) or not isinstance(sd.get("param_groups"), list):
        return out  # (refused by `shardcheck.check_held` as it is)
    had = sum(len(g.get("params", ())) for g in sd["param_groups"])
    now = sum(len(g["params"]) for g in optimizer.param_groups)
    if had != now + 1:  # tied (nothing to drop), or another optimizer (refused by `shardcheck.check_optimizers`)
        return out
    head = sum(1 for name, _ in critic.named_parameters() if name.startswith("body."))

    def moved(i: int) -> int:
        return i - 1 if i > head else i

    groups = [g | {"params": [moved(i) for i in g["params"] if i != head]} for g in sd["param_groups"]]
    state = {moved(i): st for i, st in sd["state"].items() if i != head}
    out[OPTIMIZER] = {**sd, "state": state, "param_groups": groups}
    return out


def read_as_now(
    ckpt: Path,
    rel: str,
    shard: dict[str, Any],
    *,
    rank: int,
    optimizers: Mapping[str, torch.optim.Optimizer],
    modules: Mapping[str, nn.Module],
    recorded: str,
) -> tuple[dict[str, Any], bool]:
    """(`shard` as this trainer reads it, whether its optimizer state was verified here): an old critic's shard
    (`applies`) checked to be rank `rank`'s and to hold the optimizer state its rank wrote (`recorded`: the manifest's
    digest of it), then `upgraded`; any other as it is. A refusal is `shardcheck.damaged`'s line naming `rel`."""
    if not applies(shard, modules):
        return shard, False
    try:
        shardcheck.check_held(shard, rank=rank, optimizers=optimizers)
        shardcheck.check_digest(shard, optimizers=optimizers, recorded=recorded)
    except ValueError as e:
        raise shardcheck.damaged(ckpt, rel, str(e)) from e
    return upgraded(shard, critic=modules["critic"], optimizer=optimizers.get("critic")), True
