"""SFT warm-up of the demo model, cached on disk by a hash of everything that determines the result.

    warmup(task, steps=… | seconds=…, seed=…) -> state_dict
        cache hit  : $RLCTL_CACHE_DIR/sft/<hash>/ (default ~/.cache/rlctl/sft/<hash>/), HF directory
        cache miss : train (AdamW, linear warm-up then cosine decay to `final_lr`), save, return

The demo's warm-up is short and not annealed (`final_lr` = `lr`): it teaches the answer format and
leaves the policy noisy, with room for RL to improve it (DESIGN §10: an SFT decayed to 1e-4 left RL
only sharpening — sampled reward up, greedy accuracy down). The first RL iterations then run at a
lower LR than SFT ended with, not a higher one; part of what RL gains here, continued SFT at RL's LR
would gain too (see docs/demo.md).

Batches are length-bucketed (draw 8 batches' worth of prompts, sort by length, cut) so the long
tail does not make every batch pad to 250 tokens. The loss covers the answer and EOS only.
With `seconds=` the LR schedule follows elapsed time, so the result depends on machine speed;
`steps=` is reproducible.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rlctl.models.tensors import ModelTensors
from rlctl.models.tinygpt import TinyGPT, TinyGPTConfig, load_state_dict
from rlctl.rl.tasks import EOS, PAD, DigitsTask, Prompt, encode

log = logging.getLogger(__name__)

CACHE_ENV = "RLCTL_CACHE_DIR"
DEMO_STEPS = 500  # 69–75 s on one thread (load 5 on 2 cores); held-out greedy exact 0.02–0.04: docs/demo.md


@dataclass(frozen=True)
class SftConfig:
    lr: float = 3e-3
    final_lr: float = 3e-3  # = lr: no decay (see the module docstring)
    warmup_steps: int = 50
    batch_size: int = 32
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    buckets: int = 8


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block on one intra-op thread (the previous count restored after).

    The demo model's ops are too small to split: with two threads on this loaded 2-core machine each
    op waits for the descheduled one (30 SFT steps: 3.5–4.2 s on one thread, 6–27 s on two; greedy
    answers to 64 prompts: 1.0 s vs 3–42 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "rlctl") / "sft"


def sequences(prompts: list[Prompt]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [prompt, answer, EOS] token rows and a mask of the positions whose *next* token is
    answer/EOS (i.e. the loss mask aligned with logits[:, :-1])."""
    rows = [p.tokens + encode(p.answer) + [EOS] for p in prompts]
    t = max(len(r) for r in rows)
    tokens = torch.full((len(rows), t), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), t - 1), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, rows, strict=True)):
        tokens[i, : len(r)] = torch.tensor(r)
        mask[i, len(p.tokens) - 1 : len(r) - 1] = True
    return tokens, mask


def sft_loss(model: TinyGPT, prompts: list[Prompt]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean token cross-entropy over answers, and per-row greedy exact match (teacher-forced argmax
    right at every answer position ⇔ greedy decoding reproduces the answer)."""
    tokens, mask = sequences(prompts)
    logits = model(tokens)[:, :-1]
    target = tokens[:, 1:]
    ce = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    loss = (ce * mask).sum() / mask.sum()
    right = (logits.argmax(-1) == target) | ~mask
    return loss, right.all(dim=1)


@torch.no_grad()
def greedy_exact(model: TinyGPT, prompts: list[Prompt], batch_size: int = 64) -> float:
    was = model.training
    model.eval()
    hits = 0
    for i in range(0, len(prompts), batch_size):
        hits += int(sft_loss(model, prompts[i : i + batch_size])[1].sum())
    model.train(was)
    return hits / len(prompts)


def _key(task: DigitsTask, model_cfg: TinyGPTConfig, cfg: SftConfig, budget: dict[str, float], seed: int) -> str:
    blob = json.dumps(
        {
            "task": task.cfg.model_dump(exclude={"growth_per_iteration"}),  # RL-only: SFT draws no RL prompts
            "model": asdict(model_cfg),
            "sft": asdict(cfg),
            "budget": budget,
            "seed": seed,
            "v": 2,  # 2: SFT prompts drawn below rlctl.rl.tasks.RL_OFFSET
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train(
    model: TinyGPT,
    task: DigitsTask,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    seed: int = 0,
    cfg: SftConfig | None = None,
    log_every: int = 100,
    check: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Train `model` in place; returns a few figures (steps, seconds, final loss). `check`, called before each
    step, ends the training by raising (a launch's `rlctl stop`: a warm-up takes minutes)."""
    if (steps is None) == (seconds is None):
        raise ValueError("give exactly one of steps= or seconds=")
    cfg = cfg or SftConfig()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    model.train()
    t0 = time.monotonic()
    step, queue, loss_ema = 0, list[list[Prompt]](), float("nan")
    while True:
        done = step / steps if steps is not None else (time.monotonic() - t0) / (seconds or 1.0)
        if done >= 1.0:
            break
        if check is not None:
            check()
        warm = min(1.0, (step + 1) / cfg.warmup_steps)
        lr = warm * (cfg.final_lr + (cfg.lr - cfg.final_lr) * 0.5 * (1 + math.cos(math.pi * done)))
        for g in opt.param_groups:
            g["lr"] = lr
        if not queue:
            pool = sorted(task.sample_prompts(cfg.batch_size * cfg.buckets, rng), key=lambda p: len(p.answer))
            queue = [pool[i : i + cfg.batch_size] for i in range(0, len(pool), cfg.batch_size)]
            rng.shuffle(queue)
        loss, _ = sft_loss(model, queue.pop())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        val = loss.item()
        loss_ema = val if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * val
        step += 1
        if log_every and step % log_every == 0:
            log.info("sft step %d lr %.2e loss %.4f (%.0f s)", step, lr, loss_ema, time.monotonic() - t0)
    model.eval()
    return {"steps": step, "seconds": time.monotonic() - t0, "loss": loss_ema}


def warmup(
    task: DigitsTask,
    *,
    steps: int | None = None,
    seconds: float | None = None,
    seed: int = 0,
    model_cfg: TinyGPTConfig | None = None,
    cfg: SftConfig | None = None,
    use_cache: bool = True,
    check: Callable[[], None] | None = None,
) -> dict[str, torch.Tensor]:
    """State dict of a TinyGPT warmed up on `task`; reused from the on-disk cache when present. `check`: see
    `train` (a warm-up it ends caches nothing)."""
    model_cfg = model_cfg or TinyGPTConfig()
    cfg = cfg or SftConfig()
    budget: dict[str, float] = {"steps": steps} if steps is not None else {"seconds": seconds or 0.0}
    where = _cached_at(task, model_cfg, cfg, budget, seed)
    if use_cache and (where / "config.json").exists():
        log.info("SFT warm-up: cached %s", where)
        return dict(ModelTensors(load_state_dict(where), model_cfg))
    torch.manual_seed(seed)
    model = TinyGPT(model_cfg)
    with one_thread():
        figures = train(model, task, steps=steps, seconds=seconds, seed=seed, cfg=cfg, check=check)
    if use_cache:
        _cache(model, figures, where)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _cached_at(task: DigitsTask, model_cfg: TinyGPTConfig, cfg: SftConfig, budget: dict[str, float], seed: int) -> Path:
    return cache_dir() / _key(task, model_cfg, cfg, budget, seed)


def will_be_cached(task: DigitsTask, *, steps: int, seed: int) -> bool:
    """Whether `warmup(task, steps=steps, seed=seed)` finds its result in the cache or can keep it there: the cache
    directory, or the nearest of its parents that exists, a directory this user can write (RLCTL_CACHE_DIR naming a
    file, or a directory of another user's, is not). A disk that fills as the warm-up writes is said by `_cache`."""
    where = _cached_at(task, TinyGPTConfig(), SftConfig(), {"steps": steps}, seed)
    if (where / "config.json").exists():
        return True
    here = where.parent
    while not here.exists() and here != here.parent:
        here = here.parent
    return here.is_dir() and os.access(here, os.W_OK | os.X_OK)


def _cache(model: TinyGPT, figures: dict[str, float], where: Path) -> None:
    """Keep a warm-up's result at `where` for the next launch. The cache only saves time: one that cannot be written
    (a cache directory that is a file, not writable, a full disk) is said and skipped, versus the OSError that failed
    the launch after the warm-up had trained (a traceback, exit 1)."""
    tmp = where.with_name(where.name + f".tmp{os.getpid()}")
    unwritable: tuple[type[Exception], ...] = (OSError,)
    try:  # a full disk as the weights are written: safetensors says so with its own error (os error 28), no OSError
        from safetensors import SafetensorError

        unwritable = (OSError, SafetensorError)
    except ImportError:  # (the weights go through torch.save: an OSError)
        pass
    try:
        model.save_pretrained(tmp)
        (tmp / "sft.json").write_text(json.dumps(figures) + "\n")
    except unwritable as e:
        shutil.rmtree(tmp, ignore_errors=True)
        log.warning(
            "SFT warm-up: not cached at %s (%s); the next launch trains it again (set %s to a directory this user "
            "can write)",
            where,
            e,
            CACHE_ENV,
        )
        return
    try:
        tmp.replace(where)
    except OSError:  # another process cached the same key first; keep theirs
        log.info("SFT cache %s already written by another process", where)
    log.info("SFT warm-up: %d steps in %.0f s, cached at %s", figures["steps"], figures["seconds"], where)
