"""Device policy: a GPU site's agent that cannot see CUDA stops at start in one line; CPU sites compute on the CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlctl.config.job import load_job
from rlctl.devices import ENV_TASK_GPUS, DeviceError, compute_for, cuda_problem, first_device, kind_for
from rlctl.launch.jobdir import JobDir

REPO = Path(__file__).resolve().parents[3]


def test_kinds_follow_the_inventory() -> None:
    assert (kind_for("CPU"), kind_for("H100"), kind_for("H20")) == ("cpu", "cuda", "cuda")
    cpu = compute_for("cpu")
    assert (cpu.device, cpu.engine_dtype, cpu.autocast_dtype) == (torch.device("cpu"), torch.float32, None)
    assert not cpu.is_cuda
    with pytest.raises(DeviceError, match="expected one of cpu, cuda"):
        compute_for("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: nothing to refuse")
def test_cuda_without_a_device_is_refused_in_one_line(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(DeviceError) as e:
        compute_for("cuda")
    msg = str(e.value)
    assert "CUDA_VISIBLE_DEVICES=3" in msg and torch.__version__ in msg and os.uname().nodename in msg
    assert "\n" not in msg and e.value.hint and "CUDA build of torch" in e.value.hint
    assert cuda_problem() is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the agent would start")
@pytest.mark.parametrize("role", ["rollout", "trainer"])
def test_an_agent_on_a_gpu_site_without_cuda_exits_at_start(tmp_path: Path, role: str) -> None:
    """The real agent process, told by its launcher that its site has GPUs, on this CPU-only machine: exit 1 at
    start, its log's error one line naming the host, CUDA_VISIBLE_DEVICES and torch's build — no CPU run."""
    job = load_job(REPO / "jobs" / "demo.yaml")
    jd = JobDir(tmp_path / "job")
    jd.path.mkdir()
    jd.write_job(job.spec, source="demo.yaml")
    env = {**os.environ, "RLCTL_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": "0", "MASTER_PORT": "1"}
    argv = [sys.executable, "-m", "rlctl.agents", role, "--job-dir", str(jd.path), "--controller", "tcp://127.0.0.1:1"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 1, out.stderr
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out.stderr
    assert "declares GPUs (CUDA_VISIBLE_DEVICES=0)" in errors[0] and "CPU build" in errors[0], errors[0]
    assert "computing on" not in out.stderr


def test_a_slurm_task_that_sees_the_whole_nodes_gpus_takes_its_own() -> None:
    """`gpu_request: gres` shows every task of a node all of the node's GPUs: rank k of the node is on device k
    (its group of RLCTL_TASK_GPUS), not every rank on cuda:0; where only its own are visible, the first."""
    gres = {ENV_TASK_GPUS: "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert [first_device(8, {**gres, "SLURM_LOCALID": str(k)}) for k in range(8)] == list(range(8))
    assert first_device(8, {ENV_TASK_GPUS: "2", "SLURM_LOCALID": "3"}) == 6
    assert first_device(1, {ENV_TASK_GPUS: "1", "SLURM_LOCALID": "5"}) == 0  # --gpus-per-task bound its own
    assert first_device(4, {"SLURM_LOCALID": "3"}) == 0  # not a task-rank (a unit's slice, a local agent)
    with pytest.raises(DeviceError, match="SLURM task 4 of 2 GPU\\(s\\) each needs devices 8…9, but 8 are visible"):
        first_device(8, {ENV_TASK_GPUS: "2", "SLURM_LOCALID": "4"})
