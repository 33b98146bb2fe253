import pytest
import torch

from rlctl.rl import sft
from rlctl.rl.tasks import EOS, DigitsTask, encode
from tests.unit.tiny_models import small_config

TINY = small_config(hidden=16, positions=320)


def test_sequences_mask_covers_answer_and_eos() -> None:
    p = DigitsTask().prompt(0)
    tokens, mask = sft.sequences([p, DigitsTask().prompt(1)])
    row = tokens[0, 1:][mask[0]].tolist()
    assert row == [*encode(p.answer), EOS]


def test_warmup_is_cached_by_config(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(sft.CACHE_ENV, str(tmp_path))
    task = DigitsTask()
    cfg = sft.SftConfig(batch_size=4, warmup_steps=1, buckets=1)
    first = sft.warmup(task, steps=2, seed=0, model_cfg=TINY, cfg=cfg)
    assert len(list((tmp_path / "sft").iterdir())) == 1

    def no_training(*a: object, **k: object) -> None:
        raise AssertionError("trained again despite a cached result")

    monkeypatch.setattr(sft, "train", no_training)
    again = sft.warmup(task, steps=2, seed=0, model_cfg=TINY, cfg=cfg)
    assert all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(AssertionError, match="trained again"):
        sft.warmup(task, steps=3, seed=0, model_cfg=TINY, cfg=cfg)  # another budget is another key


def test_a_cache_that_cannot_be_written_is_skipped_and_said(tmp_path, monkeypatch, caplog) -> None:
    """RLCTL_CACHE_DIR naming a file (or a directory this user cannot write): the warm-up trained, then its cache's
    NotADirectoryError failed the launch (a traceback, exit 1). The warm-up's weights are used, uncached."""
    taken = tmp_path / "cache"
    taken.write_text("a file\n")
    monkeypatch.setenv(sft.CACHE_ENV, str(taken))
    cfg = sft.SftConfig(batch_size=4, warmup_steps=1, buckets=1)
    with caplog.at_level("WARNING", logger=sft.__name__):
        state = sft.warmup(DigitsTask(), steps=1, seed=0, model_cfg=TINY, cfg=cfg)
    assert state and all(torch.isfinite(v).all() for v in state.values())
    (said,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said.startswith(f"SFT warm-up: not cached at {taken / 'sft'}/")
    assert said.endswith(f"the next launch trains it again (set {sft.CACHE_ENV} to a directory this user can write)")
    assert taken.read_text() == "a file\n"


def test_a_cache_on_a_full_disk_is_skipped_and_said(tmp_path, monkeypatch, caplog) -> None:
    """The cache's disk fills as the warm-up's weights are written: safetensors says so with a SafetensorError (os
    error 28), no OSError, which failed the launch after the warm-up had trained (a traceback, exit 1). The warm-up's
    weights are used, uncached, and nothing is left under a temporary name."""
    from safetensors import SafetensorError

    def full(*_: object, **__: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setenv(sft.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr("safetensors.torch.save_file", full)
    cfg = sft.SftConfig(batch_size=4, warmup_steps=1, buckets=1)
    with caplog.at_level("WARNING", logger=sft.__name__):
        state = sft.warmup(DigitsTask(), steps=1, seed=0, model_cfg=TINY, cfg=cfg)
    assert state and all(torch.isfinite(v).all() for v in state.values())
    (said,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said.startswith(f"SFT warm-up: not cached at {tmp_path / 'sft'}/") and "os error 28" in said, said
    assert list((tmp_path / "sft").iterdir()) == []


def test_the_launch_s_warm_up_line_says_cached_only_where_it_will_be(tmp_path, monkeypatch) -> None:
    """The launch said 'SFT warm-up: N steps (cached after the first run)' and then, with RLCTL_CACHE_DIR a file,
    warned that the warm-up was not cached: the line says 'cached' only where the cache holds the warm-up or can be
    written (a directory to be made below one this user can write)."""
    from rlctl.config import load_job
    from rlctl.config.job import sft_steps
    from rlctl.ops.inputs import warmup_line
    from tests.conftest import ROOT

    spec = load_job(ROOT / "jobs" / "demo.yaml").spec
    steps = sft_steps(spec)
    assert steps > 0
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    monkeypatch.setenv(sft.CACHE_ENV, str(taken))
    assert warmup_line(spec) == f"SFT warm-up: {steps} steps"
    monkeypatch.setenv(sft.CACHE_ENV, str(taken / "below"))
    assert warmup_line(spec) == f"SFT warm-up: {steps} steps"
    monkeypatch.setenv(sft.CACHE_ENV, str(tmp_path / "new" / "cache"))
    assert warmup_line(spec) == f"SFT warm-up: {steps} steps (cached after the first run)"
    assert warmup_line(spec.model_copy(update={"warmup": spec.warmup.model_copy(update={"sft_steps": 0})})) is None


def test_a_warm_up_in_the_cache_is_cached_where_the_cache_is_no_longer_writable(tmp_path, monkeypatch) -> None:
    """`will_be_cached` finds the warm-up where `warmup` kept it (the same key): a cache this user can no longer
    write still holds it."""
    monkeypatch.setenv(sft.CACHE_ENV, str(tmp_path))
    task = DigitsTask()
    assert sft.will_be_cached(task, steps=1, seed=0)
    sft.warmup(task, steps=1, seed=0, cfg=sft.SftConfig())
    monkeypatch.setattr(sft.os, "access", lambda *_: False)  # root writes anything: the refusal is made here
    assert sft.will_be_cached(task, steps=1, seed=0)
    assert not sft.will_be_cached(task, steps=2, seed=0)


def test_training_lowers_the_loss() -> None:
    from rlctl.models.tinygpt import TinyGPT

    torch.manual_seed(0)
    task = DigitsTask()
    model = TinyGPT(TINY)
    prompts = task.prompts(0, 16)
    before = float(sft.sft_loss(model, prompts)[0].detach())
    sft.train(model, task, steps=30, seed=0, cfg=sft.SftConfig(batch_size=8, warmup_steps=3, buckets=2))
    assert float(sft.sft_loss(model, prompts)[0].detach()) < before - 0.5
    with pytest.raises(ValueError, match="exactly one"):
        sft.train(model, task, seed=0)
