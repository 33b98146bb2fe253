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
