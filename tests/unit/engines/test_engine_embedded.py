import gc
import sys
import weakref
from collections import Counter

import pytest
import torch

from rlctl.engines import ENGINES, EmbeddedEngine, GenRequest, VllmEngine
from rlctl.engines.base import GenResult, Prefix
from rlctl.engines.embedded import GroupBarrier
from rlctl.engines.graphs import StepGraphs
from rlctl.models.tinygpt import TinyGPT
from rlctl.rl.samples import token_logprobs
from tests.unit.tiny_models import small_config

SMALL = small_config(layers=2, heads=4, positions=64)


@pytest.fixture
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(SMALL).eval()


def requests(n: int) -> list[GenRequest]:
    return [GenRequest(f"r{i}", [1] + [3 + (7 * i + j) % 60 for j in range(i % 6)], 3 + (5 * i) % 17) for i in range(n)]


def run(engine: EmbeddedEngine, reqs: list[GenRequest]) -> dict[str, list[int]]:
    engine.add(reqs)
    return {r.request_id: r.output_tokens for r in engine.run_until_done()}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continuous_batching_equals_one_by_one(model: TinyGPT, temperature: float) -> None:
    reqs = requests(14)
    batched = EmbeddedEngine(model, max_batch_size=4, temperature=temperature)
    together = run(batched, reqs)
    alone = {}
    for r in reqs:
        alone.update(run(EmbeddedEngine(model, max_batch_size=1, temperature=temperature), [r]))
    assert together == alone
    assert batched.compactions > 0  # the tail triggered lazy compaction
    assert all(len(t) <= r.max_new_tokens for r in reqs for t in [together[r.request_id]])


def test_greedy_output_is_argmax_of_full_forward(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=2, temperature=0.0)
    engine.add([GenRequest("a", [1, 5, 6], 6, ignore_eos=True)])
    (res,) = engine.run_until_done()
    seq = torch.tensor([[1, 5, 6, *res.output_tokens]])
    expect = model(seq)[0, 2:-1].argmax(-1).tolist()
    assert res.output_tokens == expect
    assert res.finish_reason == "length"


def results(engine: EmbeddedEngine, reqs: list[GenRequest]) -> dict[str, GenResult]:
    engine.add(reqs)
    return {r.request_id: r for r in engine.run_until_done()}


@pytest.mark.parametrize("static", [False, True])
def test_greedy_requests_beside_sampled_ones_decode_as_each_would_alone(model: TinyGPT, static: bool) -> None:
    """A held-out evaluation's greedy requests share a sampling engine's batch: each greedy one gives what a
    greedy engine gives it, each sampled one what the sampling engine gives it without them (batch independence),
    compactions and static shapes included."""
    reqs = requests(14)
    greedy = [
        GenRequest(f"g{i}", r.prompt_tokens, r.max_new_tokens, group=-1, greedy=True) for i, r in enumerate(reqs[:6])
    ]
    mixed = EmbeddedEngine(model, max_batch_size=5, temperature=1.0, seed=3, static_shapes=static)
    got = results(mixed, reqs[6:] + greedy)
    sampled = results(EmbeddedEngine(model, max_batch_size=5, temperature=1.0, seed=3), reqs[6:])
    argmax = results(EmbeddedEngine(model, max_batch_size=5, temperature=0.0), reqs[:6])
    # the greedy requests' ids sampled: what they would give if the engine ignored `greedy`
    ignored = results(
        EmbeddedEngine(model, max_batch_size=5, temperature=1.0, seed=3),
        [GenRequest(g.request_id, g.prompt_tokens, g.max_new_tokens) for g in greedy],
    )
    assert mixed.compactions > 0
    for r in reqs[6:]:
        assert got[r.request_id].output_tokens == sampled[r.request_id].output_tokens
        torch.testing.assert_close(got[r.request_id].logprobs, sampled[r.request_id].logprobs, atol=1e-5, rtol=0)
    for g, r in zip(greedy, reqs[:6], strict=True):
        assert got[g.request_id].output_tokens == argmax[r.request_id].output_tokens
        torch.testing.assert_close(got[g.request_id].logprobs, argmax[r.request_id].logprobs, atol=1e-5, rtol=0)
    assert any(got[g.request_id].output_tokens != ignored[g.request_id].output_tokens for g in greedy)


def test_logprobs_are_behaviour_logprobs(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=3, temperature=0.7, seed=3)
    engine.add(requests(5))
    for res in engine.run_until_done():
        seq = torch.tensor([res.prompt_tokens + res.output_tokens])
        lp = token_logprobs(model, seq, temperature=0.7)[0, len(res.prompt_tokens) - 1 :]
        torch.testing.assert_close(lp, torch.tensor(res.logprobs), atol=1e-4, rtol=1e-4)


def test_admission_follows_priority_then_fifo(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=1, temperature=0.0)
    prios = {"a": 1.0, "b": 5.0, "c": 3.0, "d": 5.0, "e": 0.0}
    engine.add([GenRequest(k, [1, 4], 2, priority=p, ignore_eos=True) for k, p in prios.items()])
    order = [r.request_id for r in engine.run_until_done()]
    assert order == ["b", "d", "c", "a", "e"]


def test_admission_key_hook(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=1, temperature=0.0, admission_key=lambda r: -r.priority)
    engine.add([GenRequest(k, [1, 4], 1, priority=p, ignore_eos=True) for k, p in {"a": 2, "b": 1, "c": 3}.items()])
    assert [r.request_id for r in engine.run_until_done()] == ["b", "a", "c"]


def test_batch_size_bound(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=3)
    engine.trace = []
    engine.add([GenRequest(f"r{i}", [1, 4], 50, ignore_eos=True) for i in range(7)])
    engine.step()
    assert (engine.num_running(), engine.num_waiting()) == (3, 4)
    assert engine.trace == [3]


def test_load_weights_bumps_version_and_stamps_results(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=2, temperature=0.0, version=3)
    engine.add([GenRequest("old", [1, 4], 6, ignore_eos=True)])
    engine.step()
    torch.manual_seed(1)
    new = TinyGPT(SMALL).state_dict()
    engine.load_weights(new, 4)
    assert engine.version == 4
    assert torch.equal(engine.model.lm_head.weight, new["lm_head.weight"])
    engine.add([GenRequest("new", [1, 4], 2, ignore_eos=True)])
    res = {r.request_id: r for r in engine.run_until_done()}
    assert (res["old"].version, res["old"].versions_seen) == (3, [3, 4])
    assert (res["new"].version, res["new"].versions_seen) == (4, [4])


def test_rejects_requests_longer_than_the_model(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.add([GenRequest("x", [1] * 40, 30)])
    assert engine.num_waiting() == 0


def test_measured_profile_of_the_real_engine(model: TinyGPT) -> None:
    from rlctl.profiler.measure import measure_generation

    entry = measure_generation(
        lambda bs: EmbeddedEngine(model, max_batch_size=bs),
        contexts=[8],
        batch_sizes=[1, 4],
        kv_capacity_tokens=10**6,
        steps=3,
    )
    assert len(entry.ptl_s) == 1 and len(entry.ptl_s[0]) == 2 and all(v > 0 for v in entry.ptl_s[0])
    assert entry.compact_fraction == 0.25  # read off the engine for the simulator


def test_engine_table_and_vllm_install_hint(monkeypatch) -> None:
    assert {"embedded": EmbeddedEngine, "vllm": VllmEngine} == ENGINES
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install 'rlctl\[vllm\]'"):
        VllmEngine("/nonexistent")


def test_each_step_says_how_many_tokens_it_added(model: TinyGPT) -> None:
    """`step_tokens`, what a unit's flight record counts: over a run with requests arriving mid-run, a resumed
    one (its prefix was generated elsewhere) and one taken out, the steps' sum is every token generated here."""
    reqs = requests(10)
    resumed = GenRequest("p", [1, 5, 6], 12, prefix=Prefix([7, 8, 9], [-0.5] * 3, [0] * 3))
    engine = EmbeddedEngine(model, max_batch_size=4, temperature=1.0)
    engine.add([*reqs[:6], resumed])
    added, made = 0, 0
    for i in range(200):
        if i == 3:
            engine.add(reqs[6:])
            made += sum(len(r.output_tokens) for r in engine.interrupt(["r0"]))
        made += sum(len(r.output_tokens) - (3 if r.request_id == "p" else 0) for r in engine.step())
        added += engine.step_tokens
    assert not engine.has_work() and engine.step_tokens == 0
    assert added == made > 0


def test_requests_arriving_mid_run_match_one_by_one(model: TinyGPT) -> None:
    reqs = requests(12)
    engine = EmbeddedEngine(model, max_batch_size=4, temperature=1.0)
    engine.add(reqs[:5])
    got = {}
    for i in range(200):
        if i == 4:
            engine.add(reqs[5:9])  # while rows run and some are free
        if i == 30:
            assert not engine.has_work() and engine.compactions > 0
            engine.add(reqs[9:])  # into an empty engine whose cache was dropped
        got.update({r.request_id: r.output_tokens for r in engine.step()})
    assert not engine.has_work()
    alone = {}
    for r in reqs:
        alone.update(run(EmbeddedEngine(model, max_batch_size=1, temperature=1.0), [r]))
    assert got == alone


@pytest.mark.parametrize(
    ("barrier", "max_batch", "new_done"),
    [
        ("auto", 2, [23, 23]),  # group 0 (3 requests) > a batch: group 1 waits for its last row
        ("never", 2, [7, 10]),  # group 1 takes each freed row at once
        ("auto", 3, [5, 5]),  # group 0 fits in one batch: its freed rows go to group 1 at once
        ("always", 3, [23, 23]),
    ],
)
def test_a_later_group_waits_while_a_larger_than_batch_group_runs(
    model: TinyGPT, barrier: GroupBarrier, max_batch: int, new_done: list[int]
) -> None:
    engine = EmbeddedEngine(model, max_batch_size=max_batch, temperature=0.0, group_barrier=barrier)
    engine.trace = []
    engine.add(
        [
            GenRequest("old-long", [1, 4], 20, priority=10.0, ignore_eos=True),
            GenRequest("old-b", [1, 5], 2, ignore_eos=True),
            GenRequest("old-c", [1, 6], 2, ignore_eos=True),
        ]
    )
    engine.step()
    engine.add([GenRequest(f"new{i}", [1, 6], 3, group=1, priority=100.0, ignore_eos=True) for i in range(2)])
    finished: dict[str, int] = {}
    step = 1
    while engine.has_work():
        step += 1
        finished.update({r.request_id: step for r in engine.step()})
    assert finished["old-long"] == 20
    assert sorted(finished[f"new{i}"] for i in range(2)) == new_done
    if new_done == [23, 23]:
        assert engine.trace[4:19] == [1] * 15 and engine.compactions >= 1  # the tail ran alone, compacted


def test_an_earlier_group_arriving_late_goes_before_the_later_one(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=1, temperature=0.0)
    engine.add([GenRequest("g2", [1, 4], 1, group=2, priority=9.0), GenRequest("g1", [1, 4], 1, group=1)])
    engine.add([GenRequest("g0", [1, 4], 1, group=0, priority=-9.0)])
    assert [r.request_id for r in engine.run_until_done()] == ["g0", "g1", "g2"]


@pytest.mark.parametrize(("barrier", "evals", "done_at"), [("always", 2, 4), ("auto", 3, 6)])
def test_a_negative_group_goes_first_and_holds_no_later_group_back(
    model: TinyGPT, barrier: GroupBarrier, evals: int, done_at: int
) -> None:
    """Held-out evaluation requests (group −1; with "auto", more than a batch) are admitted before an iteration's,
    and a long one running holds no iteration's request back: a freed row goes to the iteration's request once no
    evaluation request waits (a barrier on group −1 would keep it waiting for the 20-token request)."""
    engine = EmbeddedEngine(model, max_batch_size=2, temperature=0.0, group_barrier=barrier)
    engine.add([GenRequest(f"eval{i}", [1, 5], 20 if i == 0 else 2, group=-1, ignore_eos=True) for i in range(evals)])
    engine.step()
    engine.add([GenRequest("it-a", [1, 4], 2, group=0, ignore_eos=True)])
    finished: dict[str, int] = {}
    step = 1
    while engine.has_work():
        step += 1
        finished.update({r.request_id: step for r in engine.step()})
    assert finished["eval0"] == 20 and finished["it-a"] == done_at, finished


def test_group_barrier_names_its_choices(model: TinyGPT) -> None:
    with pytest.raises(ValueError, match="auto, always, never"):
        EmbeddedEngine(model, group_barrier="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_shapes_give_the_tokens_of_exact_shapes(model: TinyGPT, temperature: float) -> None:
    """The step a CUDA graph captures (rows and width rounded up to buckets, free rows riding along) yields the
    tokens and log-probs of the exact-shape step; on the CPU it runs eagerly, so CI runs the captured code."""
    reqs = requests(14)
    exact = EmbeddedEngine(model, max_batch_size=10, temperature=temperature)
    static = EmbeddedEngine(model, max_batch_size=10, temperature=temperature, static_shapes=True)
    exact.trace, static.trace = [], []
    a = {r.request_id: r for r in (exact.add(reqs) or exact.run_until_done())}
    b = {r.request_id: r for r in (static.add(reqs) or static.run_until_done())}
    assert {k: r.output_tokens for k, r in a.items()} == {k: r.output_tokens for k, r in b.items()}
    for k, r in a.items():
        torch.testing.assert_close(torch.tensor(r.logprobs), torch.tensor(b[k].logprobs), atol=1e-5, rtol=1e-5)
    assert set(static.trace) <= {1, 2, 3, 4, 6, 8, 10}  # buckets, at most the storage's rows
    assert len(exact.trace) == len(static.trace) and any(s > e for s, e in zip(static.trace, exact.trace, strict=True))


def test_static_prefills_run_at_buckets_padded_with_the_first_request(
    model: TinyGPT, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With static shapes a prefill runs at bucketed (rows, width) — what a CUDA graph captures — its extra rows
    repeating the first admitted request (same cache row, same tokens), and the cache holds what a prefill at the
    exact shape writes; one past PREFILL_GRAPH_TOKENS runs at its own shape."""
    import rlctl.engines.embedded as embedded

    reqs = [GenRequest(f"p{i}", [1] + [3 + (11 * i + j) % 60 for j in range(2 + 2 * i)], 4) for i in range(5)]
    caches, shapes = {}, []
    prefill = model.prefill

    def spy(cache, rows, tokens, lengths):  # type: ignore[no-untyped-def]
        shapes.append((tuple(tokens.shape), rows.tolist(), lengths.tolist()))
        prefill(cache, rows, tokens, lengths)

    monkeypatch.setattr(model, "prefill", spy)
    for static in (False, True):
        engine = EmbeddedEngine(model, max_batch_size=8, temperature=1.0, static_shapes=static)
        engine.add(reqs)
        engine._admit()
        assert engine._cache is not None and engine.prefills == 1
        caches[static] = engine._cache
    (exact, rows, lengths), (padded, prow, plen) = shapes
    assert exact == (5, 10) and padded == (6, 16)  # 5 rows → 6, 10 positions → 16
    assert prow == rows + rows[:1] and plen == lengths + lengths[:1]
    for li in range(SMALL.num_hidden_layers):
        for r, n in zip(rows, lengths, strict=True):
            for a, b in ((caches[False].k[li], caches[True].k[li]), (caches[False].v[li], caches[True].v[li])):
                torch.testing.assert_close(a[r, :, :n], b[r, :, :n], atol=1e-6, rtol=1e-6)
    assert torch.equal(caches[False].lengths, caches[True].lengths)

    shapes.clear()
    monkeypatch.setattr(embedded, "PREFILL_GRAPH_TOKENS", 64)  # 6 × 16 = 96 bucketed tokens: past it
    engine = EmbeddedEngine(model, max_batch_size=8, temperature=1.0, static_shapes=True)
    engine.add(reqs)
    engine._admit()
    assert shapes[0][0] == (5, 10)


def test_the_engine_runs_in_the_checkpoints_low_precision(model: TinyGPT) -> None:
    """bf16 weights (as a GPU engine holds a bf16 checkpoint): the behaviour log-probs are the bf16 model's own,
    and close to the fp32 model's."""
    low = TinyGPT.empty(model.config, dtype=torch.bfloat16, device="cpu")
    low.load_weights(model.hf_weights(torch.bfloat16))
    engine = EmbeddedEngine(low, max_batch_size=4, temperature=1.0, seed=5)
    assert engine.model.lm_head.weight.dtype == torch.bfloat16 and engine.model.rope_cos.dtype == torch.bfloat16
    engine.add(requests(6))
    for res in engine.run_until_done():
        seq = torch.tensor([res.prompt_tokens + res.output_tokens])
        start = len(res.prompt_tokens) - 1
        own = token_logprobs(low, seq, temperature=1.0)[0, start:].float()
        torch.testing.assert_close(torch.tensor(res.logprobs), own, atol=0.05, rtol=0.0)
        full = token_logprobs(model, seq, temperature=1.0)[0, start:]
        torch.testing.assert_close(torch.tensor(res.logprobs), full, atol=0.1, rtol=0.0)


def test_weights_load_in_place_and_tied_embeddings_travel_once() -> None:
    cfg = small_config(layers=1, heads=4, positions=32)
    cfg.tie_word_embeddings = True
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    engine = EmbeddedEngine(model, max_batch_size=2)
    where = {k: v.data_ptr() for k, v in engine.model.state_dict().items()}
    torch.manual_seed(1)
    sent = TinyGPT(cfg).hf_weights(torch.bfloat16)
    assert "lm_head.weight" not in sent and all(v.dtype == torch.bfloat16 for v in sent.values())
    engine.load_weights(sent, 1)
    assert {k: v.data_ptr() for k, v in engine.model.state_dict().items()} == where  # a graph still reads them
    assert torch.equal(engine.model.lm_head.weight, sent["model.embed_tokens.weight"].float())
    with pytest.raises(ValueError, match="do not fit"):
        engine.load_weights({"model.norm.weight": torch.ones(32), "nope": torch.ones(1)}, 2)
    # a refused version copies nothing (it copied every tensor that fitted, credited to the old version)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    for bad in (
        {k: v for k, v in sent.items() if k != "model.norm.weight"},
        {**sent, "model.norm.weight": torch.ones(3)},
    ):
        with pytest.raises(ValueError, match="do not fit"):
            engine.load_weights({k: v + 1 for k, v in bad.items()}, 3)
        assert engine.version == 1 and all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_interrupted_request_resumed_elsewhere_continues_as_if_never_stopped(
    model: TinyGPT, temperature: float
) -> None:
    """Partial rollouts: interrupt after a few steps (running and waiting requests), resume each on another
    engine with its output as the prefix: tokens, log-probs and versions equal an uninterrupted run's."""
    reqs = [GenRequest(f"r{i}", [1, 3 + i, 9], 12, ignore_eos=True) for i in range(5)]
    one = EmbeddedEngine(model, max_batch_size=2, temperature=temperature, seed=5)
    one.add(reqs)
    whole = {r.request_id: r for r in one.run_until_done()}

    first = EmbeddedEngine(model, max_batch_size=2, temperature=temperature, seed=5, version=2)
    first.add(reqs)
    for _ in range(4):
        assert first.step() == []
    running = {r.request_id: len(r.output_tokens) for r in first.partials()}
    assert running == {"r0": 4, "r1": 4} and first.num_waiting() == 3
    cut = first.interrupt(["r1", "r3", "nobody"])
    assert {r.request_id: (len(r.output_tokens), r.finish_reason, r.version) for r in cut} == {
        "r3": (0, "interrupted", -1),
        "r1": (4, "interrupted", 2),
    }
    assert (first.num_running(), first.num_waiting()) == (1, 2)
    rest = {r.request_id: r for r in first.run_until_done()}

    second = EmbeddedEngine(model, max_batch_size=2, temperature=temperature, seed=5, version=2)
    second.add(
        [
            GenRequest(
                c.request_id,
                c.prompt_tokens,
                12,
                ignore_eos=True,
                prefix=Prefix(c.output_tokens, c.logprobs, c.token_versions) if c.output_tokens else None,
            )
            for c in cut
        ]
    )
    rest |= {r.request_id: r for r in second.run_until_done()}
    assert sorted(rest) == sorted(whole)
    for k, w in whole.items():
        assert rest[k].output_tokens == w.output_tokens, k
        torch.testing.assert_close(torch.tensor(rest[k].logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=1e-5)
        assert rest[k].token_versions == [2] * 12 and rest[k].versions_seen == [2]


def test_a_resumed_prefix_keeps_its_versions_and_counts_toward_the_length(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=2, temperature=0.0, version=7)
    prefix = Prefix([5, 6, 7], [-0.1, -0.2, -0.3], [4, 4, 5])
    engine.add([GenRequest("a", [1, 2], 5, ignore_eos=True, prefix=prefix)])
    (res,) = engine.run_until_done()
    assert res.output_tokens[:3] == [5, 6, 7] and len(res.output_tokens) == 5
    assert res.logprobs[:3] == [-0.1, -0.2, -0.3]
    assert (res.token_versions, res.version, res.versions_seen) == ([4, 4, 5, 7, 7], 4, [4, 5, 7])
    seq = torch.tensor([[1, 2, 5, 6, 7, *res.output_tokens[3:]]])
    assert res.output_tokens[3:] == model(seq)[0, 4:-1].argmax(-1).tolist()  # conditioned on the prefix
    with pytest.raises(ValueError, match="leaves nothing to generate"):
        engine.add([GenRequest("b", [1, 2], 3, prefix=prefix)])
    with pytest.raises(ValueError, match="3 tokens, 2 log-probs"):
        Prefix([1, 2, 3], [0.0, 0.0], [1, 1, 1])


def test_interrupting_every_row_leaves_an_engine_that_still_runs(model: TinyGPT) -> None:
    engine = EmbeddedEngine(model, max_batch_size=2, temperature=0.0)
    engine.add([GenRequest(f"r{i}", [1, 4], 6, ignore_eos=True) for i in range(2)])
    engine.step()
    assert len(engine.interrupt(["r0", "r1"])) == 2 and not engine.has_work()
    assert engine.step() == []
    engine.add([GenRequest("c", [1, 4], 3, ignore_eos=True)])
    assert [len(r.output_tokens) for r in engine.run_until_done()] == [3]


def test_the_running_counts_a_step_reads_follow_every_row_that_starts_and_ends(model: TinyGPT) -> None:
    """A step reads counts kept as rows start, finish, are interrupted and compacted (not a scan of every row):
    after each of those they equal what a scan of the rows finds."""
    engine = EmbeddedEngine(model, max_batch_size=5, temperature=1.0, eos_token_ids=[5, 9])
    engine.add(
        [
            GenRequest(f"r{i}", [1] + [3 + i % 50] * (i % 4), 2 + (5 * i) % 13, group=i // 7 - 1, greedy=i % 4 == 1)
            for i in range(24)
        ]
    )

    def check() -> None:
        rows = [r for r in engine._rows if r is not None]
        assert engine.num_running() == len(rows)
        assert engine._n_greedy == sum(r.req.greedy for r in rows)
        assert dict(engine._running_groups) == Counter(r.req.group for r in rows if r.req.group >= 0)
        assert engine._max_pos == max((r.pos for r in rows), default=-1)

    steps = 0
    while engine.has_work():
        engine.step()
        check()
        steps += 1
        if steps in (2, 6):  # the longest row (the width a step reads), and one not admitted yet
            longest = max((r for r in engine._rows if r is not None), key=lambda r: r.pos)
            assert len(engine.interrupt([longest.req.request_id, "r20"])) == (2 if steps == 2 else 1)
            check()
    assert engine.compactions > 0


def test_a_compiled_step_gives_the_eager_steps_outputs() -> None:
    """`compile_step`: the decode step through torch.compile (symbolic shapes) at bucketed shapes (what a CUDA
    graph captures): the same tokens and log-probs as the eager step, over rows of different lengths, waves of
    admission and a width past the first bucket (128 positions)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyGPT(small_config(layers=2, heads=4, positions=256)).eval()
    prompts = [[1] + [3 + (5 * i + j) % 60 for j in range(2 + i % 5)] for i in range(10)]
    reqs = [GenRequest(f"c{i}", p, 40 + 50 * (i % 3), ignore_eos=True) for i, p in enumerate(prompts)]
    got = {}
    for compiled in (False, True):
        engine = EmbeddedEngine(
            model, max_batch_size=6, temperature=1.0, seed=3, static_shapes=True, compile_step=compiled
        )
        engine.add(list(reqs))
        got[compiled] = {r.request_id: r for r in engine.run_until_done()}
    assert got[True].keys() == got[False].keys() == {r.request_id for r in reqs}
    for rid, eager in got[False].items():
        assert got[True][rid].output_tokens == eager.output_tokens, rid
        assert got[True][rid].logprobs == pytest.approx(eager.logprobs, abs=1e-4), rid


def test_the_kv_storage_check_prices_is_what_the_engine_allocates() -> None:
    """`rlctl check` sizes a unit's K/V by `rlctl.engines.kvsize` (torch-free): the bytes the engine's first
    admission allocates, for a short request (a 128-position bucket) and one that takes the model's whole context."""
    from rlctl.engines.kvsize import cache_capacity, kv_cache_bytes

    cfg = small_config(layers=2, heads=4, positions=320)
    for prompt, new in ((3, 5), (40, 250)):
        engine = EmbeddedEngine(TinyGPT(cfg).eval(), max_batch_size=3, temperature=0.0)
        engine.add([GenRequest("a", [1] * prompt, new)])
        engine.step()
        assert engine._cache is not None
        allocated = sum(t.nbytes for t in (*engine._cache.k, *engine._cache.v))
        capacity = cache_capacity(prompt + new, cfg.max_position_embeddings)
        assert capacity == (128 if prompt + new <= 128 else 320)
        assert allocated == kv_cache_bytes(cfg, rows=3, capacity=capacity, value_bytes=4)


def test_an_engine_is_freed_when_its_last_reference_goes(model: TinyGPT) -> None:
    """No reference cycle through the engine: its K/V cache (and, on a GPU, its weights and CUDA graphs' memory
    pool) is freed with its last reference, not at some later garbage collection. Each engine held its eager
    step as a bound method, and on CUDA its step graphs held its step methods: `rlctl.rl.evaluate` loaded the
    next policy beside the previous one's engine, and a GPU probe kept an engine per measured shape. The graphs
    are attached here as a CUDA engine makes them (nothing is captured on the CPU)."""
    gc.disable()  # a collection must not be what frees it
    try:
        engine = EmbeddedEngine(model, max_batch_size=4, static_shapes=True)
        run(engine, requests(6))
        engine._graphs = StepGraphs(engine._decode)
        engine._prefill_graphs = StepGraphs(engine._prefill_step)
        freed = weakref.ref(engine)
        del engine
        assert freed() is None
    finally:
        gc.enable()


def test_a_compiled_step_engine_is_freed_when_its_last_reference_goes(model: TinyGPT) -> None:
    """`compile_step` (rollout.compile): the engine held `torch.compile` of its bound `_forward`, whose wrapper holds
    the engine, a reference cycle that kept its K/V cache (on a GPU its weights too) until a garbage collection."""
    gc.disable()  # a collection must not be what frees it
    try:
        engine = EmbeddedEngine(model, max_batch_size=4, static_shapes=True, compile_step=True)
        freed = weakref.ref(engine)
        del engine
        assert freed() is None
    finally:
        gc.enable()


def _waves(seed: int) -> list[GenRequest]:
    """Rows of different lengths, greedy rows among sampled ones, two groups: steps that admit, finish and compact."""
    return [
        GenRequest(
            f"w{seed}-{i}", [1] + [3 + (seed + 5 * i) % 50] * (i % 4), 2 + (7 * i) % 13, group=i // 9, greedy=i % 5 == 1
        )
        for i in range(20)
    ]


@pytest.mark.parametrize("static", [False, True])
def test_a_step_collects_the_tokens_and_logprobs_its_rows_hold_bit_for_bit(model: TinyGPT, static: bool) -> None:
    """A step reads its sampled tokens and log-probs to the host in one transfer (views of one byte buffer): what
    `_collect` gets is, bit for bit, what reading the two device tensors one by one gives (the path it replaced)."""
    engine = EmbeddedEngine(model, max_batch_size=6, temperature=1.0, seed=5, static_shapes=static)
    engine.add(_waves(0))
    collect = engine._collect
    checked = 0

    def compare(tokens: list[int], logprobs: list[float]) -> list[GenResult]:
        nonlocal checked
        n = len(engine._rows)
        assert tokens == engine._next[:n].tolist() and all(type(t) is int for t in tokens)
        bits = torch.tensor(logprobs, dtype=torch.float64).float().view(torch.int32)
        assert torch.equal(bits, engine._logprobs[:n].view(torch.int32))
        checked += n
        return collect(tokens, logprobs)

    engine._collect = compare  # type: ignore[method-assign]
    done = engine.run_until_done()
    assert len(done) == 20 and checked > 20 and engine.compactions > 0


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts the reads of values out of `state` (tensors on the engine's device) into the host: what waits for the
    device on a GPU. A copy out of the state into other storage counts, reads of that copy do not."""

    READS = frozenset({"tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "to"})

    def __init__(self, state: list[torch.Tensor]) -> None:
        super().__init__()
        self.state = {t.untyped_storage().data_ptr() for t in state}
        self.reads: list[str] = []

    def _of_state(self, t: object) -> bool:
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.state

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", "")
        if name == "copy_":  # into other storage
            read = self._of_state(args[1]) and not self._of_state(args[0])
        else:
            read = name in self.READS and self._of_state(args[0])
        if read:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("static", [False, True])
def test_a_step_reads_the_device_once(model: TinyGPT, static: bool) -> None:
    """One transfer to the host a step, whatever the step did (admit, finish, compact): its tokens and log-probs
    together. It made two (`tolist` of each), and on a GPU each waits for the device."""
    engine = EmbeddedEngine(model, max_batch_size=6, temperature=1.0, seed=5, static_shapes=static)
    engine.add(_waves(1))
    engine.step()  # the first admission allocates the cache
    assert engine._cache is not None
    cache = engine._cache
    state = [engine._next, engine._logprobs, engine._seeds, engine._steps, engine._live, engine._greedy]
    state += [cache.lengths, *cache.k, *cache.v, *model.parameters()]
    per_step = []
    while engine.has_work():
        with _HostReads(state) as mode:
            engine.step()
        per_step.append(len(mode.reads))
    assert engine.compactions > 0 and len(per_step) > 10
    assert set(per_step) == {1}


class _HostToDevice(torch.overrides.TorchFunctionMode):
    """Counts the copies of host values onto the engine's device, in each way the engine makes one: a tensor made
    there from Python values (`torch.tensor(..., device=)`), a host tensor moved there (`.to(device)`), a host
    tensor copied into the engine's device state (`copy_`), a number put at a tensor's indices (`t[idx] = 0`: on a
    CUDA tensor torch makes the number a host tensor and `index_put_` copies it over). On a CPU none moves anything;
    on a GPU each is a copy (from pageable memory, a wait for the stream)."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        super().__init__()
        self.engine = engine
        self.moved: set[int] = set()  # storages the counted copies made on the device
        self.copies: list[str] = []

    def _on_device(self, t: torch.Tensor) -> bool:
        e = self.engine
        state = [e._next, e._logprobs, e._seeds, e._steps, e._live, e._greedy, e._pf_tokens, e._pf_rows, e._pf_lengths]
        if e._cache is not None:
            state += [e._cache.lengths, *e._cache.k, *e._cache.v]
        ptr = t.untyped_storage().data_ptr()
        return ptr in self.moved or ptr in {s.untyped_storage().data_ptr() for s in state}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "copy_":
            copy = self._on_device(args[0]) and not self._on_device(args[1])
        elif name == "to":
            copy = any(isinstance(a, torch.device) for a in (*args[1:], kwargs.get("device")))
        elif name == "__setitem__":
            copy = isinstance(args[1], torch.Tensor) and isinstance(args[2], int | float)
        else:
            copy = name in ("tensor", "as_tensor") and "device" in kwargs
        out = func(*args, **kwargs)
        if copy:
            self.copies.append(name)
            if isinstance(out, torch.Tensor):
                self.moved.add(out.untyped_storage().data_ptr())
        return out


@pytest.mark.parametrize("static", [False, True])
def test_an_admission_copies_to_the_device_once_and_its_prefill_once(model: TinyGPT, static: bool) -> None:
    """The host values a step sends to the device go in one copy each: an admission's rows, tokens, seeds, output
    indices and greedy flags; its prefill's tokens, rows and lengths; the rows a step (or `interrupt`) frees; the rows
    a compaction keeps. An admission made nine (five `torch.tensor(..., device=)`, `_live[idx] = 1`, three for its
    prefill) and a step that freed rows three, each a wait for the stream on a GPU."""
    engine = EmbeddedEngine(model, max_batch_size=6, temperature=1.0, seed=5, static_shapes=static)
    engine.add(_waves(2))
    checked = Counter[str]()
    interrupted = False
    while engine.has_work():
        prefills, compactions = engine.prefills, engine.compactions
        with _HostToDevice(engine) as mode:
            done = engine.step()
        admitted = engine.prefills - prefills
        expected = 2 * admitted + (len(done) > 0) + (engine.compactions - compactions)
        assert len(mode.copies) == expected, (mode.copies, admitted, len(done))
        checked.update(admissions=admitted, frees=len(done) > 0, compactions=engine.compactions - compactions)
        if checked["admissions"] >= 2 and engine.num_running() > 0 and not interrupted:
            running = next(r for r in engine._rows if r is not None)
            with _HostToDevice(engine) as mode:
                interrupted = len(engine.interrupt([running.req.request_id])) == 1
            assert len(mode.copies) == 1
    assert interrupted and checked["admissions"] > 3 and checked["frees"] > 3 and checked["compactions"] > 0


@pytest.mark.parametrize("static", [False, True])
def test_what_admissions_frees_and_compactions_copy_lands_in_each_requests_own_row(
    model: TinyGPT, static: bool
) -> None:
    """The state admissions, prefills, finishes and compactions copy to the device (views of one copy each) is each
    request's own: after every step a running row holds its request's next token, seed, output index, greedy flag
    and length, a free row is dead at position 0; and each request (greedy ones among sampled ones, resumed
    prefixes, rows of different lengths, waves of admission) decodes what an engine of one row gives it."""
    from rlctl.engines.embedded import request_seed

    reqs = _waves(3) + [
        GenRequest(f"p{i}", [1, 4 + i], 9, prefix=Prefix([7 + i, 8], [-0.5, -0.25], [0, 0]), greedy=i == 1)
        for i in range(3)
    ]
    engine = EmbeddedEngine(model, max_batch_size=5, temperature=1.0, seed=5, static_shapes=static)
    engine.add(reqs[:12])
    got: dict[str, GenResult] = {}
    steps = 0
    while engine.has_work():
        if steps == 4:
            engine.add(reqs[12:])
        got |= {r.request_id: r for r in engine.step()}
        steps += 1
        assert engine._cache is not None
        state = [t.tolist() for t in (engine._next, engine._seeds, engine._steps, engine._live, engine._greedy)]
        lengths = engine._cache.lengths.tolist()
        for i in range(engine.max_batch_size):
            row = engine._rows[i] if i < len(engine._rows) else None
            if row is None:
                assert (state[3][i], lengths[i]) == (0, 0), i
                continue
            r = row.req
            own = [row.tokens[-1], request_seed(5, r.request_id), len(row.tokens), 1, r.greedy]
            assert [s[i] for s in state] == own and lengths[i] == row.pos, (i, r.request_id)
    assert engine.compactions > 0 and engine.prefills > 3 and got.keys() == {r.request_id for r in reqs}
    for r in reqs:
        alone = results(EmbeddedEngine(model, max_batch_size=1, temperature=1.0, seed=5, static_shapes=static), [r])
        assert got[r.request_id].output_tokens == alone[r.request_id].output_tokens, r.request_id
        torch.testing.assert_close(got[r.request_id].logprobs, alone[r.request_id].logprobs, atol=1e-5, rtol=0)
