"""The prompts dynamic sampling draws in place of dropped groups (`TaskSource.refill_prompt`): the same for the same
round and number, none of any iteration's own, and readable from the id alone (the trainer's `prompt_tokens`,
the reward)."""

from __future__ import annotations

from pathlib import Path

from rlctl.config.task import DatasetTask, DigitsTask
from rlctl.rl.dataset import ORDERS_KEPT, prepare_dataset
from rlctl.rl.source import DatasetSource, DigitsSource
from rlctl.rl.tokenizer import load_tokenizer
from tests.unit.hf_tokenizer import write_tokenizer
from tests.unit.rl.test_dataset import write_jsonl


def test_digits_refills_are_numbered_after_their_round_s_own_prompts() -> None:
    source = DigitsSource(DigitsTask(kind="digits", growth_per_iteration=1.0))
    own = {p.prompt_id for it in range(3) for p in source.rl_prompts(it, 4)}
    refills = [source.refill_prompt(it, 4, j) for it in range(3) for j in range(5)]
    assert len({p.prompt_id for p in refills}) == 15 and not own & {p.prompt_id for p in refills}
    assert source.refill_prompt(2, 4, 1) == refills[11]  # a function of (round, number)
    assert all(source.prompt_tokens(p.prompt_id) == p.tokens for p in refills)
    # the round's own length schedule: the median grows with the round a refill was drawn for
    assert source.task.median_at(int(refills[12].prompt_id[1:])) == 3 * source.task.median_at(
        int(refills[0].prompt_id[1:])
    )


def test_dataset_refills_come_from_a_region_of_the_stream_no_iteration_reads(tmp_path: Path) -> None:
    tok = load_tokenizer(write_tokenizer(tmp_path / "model"))
    rows = [{"prompt": f"what is {i} + 1 ?", "ground_truth": str(i + 1)} for i in range(7)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = DatasetTask.model_validate({"kind": "dataset", "path": "train.jsonl", "reward_workers": 0})
    prepare_dataset(cfg, data_path=path, tokenizer=tok, out_dir=tmp_path / "data")
    source = DatasetSource(cfg, tmp_path, tmp_path / "model", scoring=True)
    try:
        own = {p.prompt_id for it in range(100) for p in source.rl_prompts(it, 4)}
        refills = [source.refill_prompt(it, 4, j) for it in range(100) for j in range(3)]
        assert len({p.prompt_id for p in refills}) == 300 and not own & {p.prompt_id for p in refills}
        assert source.refill_prompt(7, 4, 2) == refills[23]
        assert all(source.prompt_tokens(p.prompt_id) == p.tokens for p in refills)
        assert len(source.data._orders) == ORDERS_KEPT  # 100 rounds' refills read 100 epochs: the last 8 kept
        answer = tok.encode(source.data.prompt(int(refills[5].prompt_id[1:])).ground_truth, add_special_tokens=False)
        assert source.score("s", refills[5].prompt_id, answer).result() == 1.0  # scored against its own row
    finally:
        source.close()
