"""A vLLM unit at tensor parallel > 1 on the CPU binds its workers' threads to its own cores, as many as its threads,
versus every core the process may use split among its workers (each unit of a host bound to the same cores, each
worker given as many threads as its share, whatever rollout.threads_per_unit said). vLLM is faked
(tests/unit/fake_vllm.py); that vLLM binds as told is tests/vllm/test_vllm_tensor_parallel.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rlctl.engines.vllm import VllmEngine, cpu_binding, cpu_thread_env
from rlctl.launch.agentenv import ENV_CPUS
from rlctl.models.hf import TinyGPTConfig
from tests.unit.fake_vllm import fake_vllm

BIND = "VLLM_CPU_OMP_THREADS_BIND"


def test_each_worker_gets_its_share_of_the_units_threads_on_cores_of_its_own() -> None:
    assert cpu_binding({0, 1}, 2, threads=2) == "0|1"
    assert cpu_binding(range(8), 2, threads=4) == "0,1|4,5"  # 2 threads each, on its own half of the unit's cores
    assert cpu_binding({3, 2, 5, 4, 7}, 2, threads=4) == "2,3|4,5"  # an odd one is left out
    assert cpu_binding({0, 1}, 2, threads=1) == "0|1"  # at least one each
    assert cpu_binding({0}, 2, threads=2) == "nobind"
    assert cpu_binding({0, 1, 2}, 2, threads=4) == "nobind"  # fewer cores than threads: another unit's
    assert cpu_binding(None, 2, threads=4) == "nobind"


def test_a_unit_binds_its_launchers_cores_or_an_affinity_its_own_else_none() -> None:
    host = set(range(16))
    assert cpu_thread_env({ENV_CPUS: "4,5,6,7"}, host, workers=2, threads=4) == {BIND: "4,5|6,7"}
    assert cpu_thread_env({ENV_CPUS: "4,5,6,7"}, {4, 5}, workers=2, threads=2) == {BIND: "4|5"}  # ones it may use
    assert cpu_thread_env({}, {8, 9, 10, 11}, workers=2, threads=4) == {BIND: "8,9|10,11"}  # a SLURM task's
    # every core of a local or SSH host, shared with its other units: unbound, each worker its share of the threads
    assert cpu_thread_env({}, host, workers=2, threads=6) == {BIND: "nobind", "OMP_NUM_THREADS": "3"}


@pytest.mark.parametrize(("cpus", "want"), [("0,1,2,3", "0,1|2,3"), ("4,5,6,7", "4,5|6,7"), (None, "nobind")])
def test_two_units_of_one_host_bind_disjoint_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpus: str | None, want: str
) -> None:
    fake_vllm(monkeypatch, cpu=True)
    for name in (BIND, "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS", ENV_CPUS):
        monkeypatch.setenv(name, "")  # (so that the engine's setting of it is undone after the test)
        monkeypatch.delenv(name)
    if cpus is not None:
        monkeypatch.setenv(ENV_CPUS, cpus)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)  # the unit's rollout.threads_per_unit, as set
    (tmp_path / "config.json").write_text(json.dumps(TinyGPTConfig().to_hf()))
    VllmEngine(tmp_path, max_batch_size=2, tensor_parallel=2, weights_via_file=False, weight_transfer=False)
    assert os.environ[BIND] == want  # was "0,1,2,3|4,5,6,7" for each
    assert os.environ.get("OMP_NUM_THREADS") == (None if cpus else "2")  # a bound worker's: its list's length
