"""SLURM backend without a cluster: rendered scripts (golden files), state mapping, the status fallback chain."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlctl.config.inventory import Site, SlurmScheduler
from rlctl.launch.base import AgentSpec
from rlctl.launch.remote import CommandResult, RemoteState
from rlctl.launch.slurm import SlurmBackend, SlurmResources, map_state
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / "launch"
SPEC = AgentSpec(
    role="trainer",
    replica=0,
    site="h800",
    argv=["python3", "-m", "rlctl.agents", "trainer", "--job-dir", "/shared/runs/demo"],
    env={"RLCTL_ROLE": "trainer", "NCCL_SOCKET_IFNAME": "ib0", "QUOTED": "a b'c"},
    log_path=Path("/shared/runs/demo/logs/trainer-0.log"),
    cwd=Path("/shared/runs/demo"),
)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RLCTL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with RLCTL_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; review, then refresh with RLCTL_UPDATE_GOLDEN=1"


def backend(**sched: object) -> SlurmBackend:
    s = SlurmScheduler.model_validate({"kind": "slurm", "partition": "h800", "time_limit_min": 720, **sched})
    res = {"trainer": SlurmResources(nodes=2, tasks_per_node=8, cpus_per_task=12, gpus_per_node=8)}
    return SlurmBackend(
        "h800", s, job="demo", job_dir=Path("/shared/runs/demo"), resources=res, grace_s=45, python="python3"
    )


def test_sbatch_script_over_ssh_matches_golden() -> None:
    b = backend(submit_host="login.h800", account="rl", qos="high", ssh_user="rl")
    assert b.submitter == "sbatch-ssh"
    check_golden("sbatch_trainer.sh", b.render(SPEC))


def test_sbatch_script_cpu_site_has_no_gpu_line() -> None:
    s = SlurmScheduler(kind="slurm", partition="sitea", submit_host="login")
    b = SlurmBackend("a", s, job="j", job_dir=Path("/r"), resources={"trainer": SlurmResources()})
    text = b.render(SPEC)
    assert "--gpus-per-node" not in text and "--account" not in text and "--qos" not in text
    assert "#SBATCH --job-name=rlctl-j-trainer" in text and "#SBATCH --signal=B:TERM@30" in text


def test_submitit_script_matches_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    import submitit

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # srun not needed to render
    b = backend(account="rl", qos="high")
    assert b.submitter == "submitit"
    text = b.render(SPEC)
    check_golden("submitit_trainer.sh", text)
    assert "#SBATCH --signal=TERM@45" in text and "#SBATCH --gpus-per-node=8" in text


def test_resources_one_task_per_gpu() -> None:
    site = Site.model_validate(
        {
            "datacenter": "a",
            "scheduler": {"kind": "slurm", "partition": "p"},
            "gpu": "H800",
            "nodes": [{"host": "n[1-4]", "gpus": 8}],
        }
    )
    assert SlurmResources.for_gpus(site, 16) == SlurmResources(nodes=2, tasks_per_node=8, gpus_per_node=8)
    assert SlurmResources.for_gpus(site, 4) == SlurmResources(nodes=1, tasks_per_node=4, gpus_per_node=4)
    cpu = site.model_copy(update={"gpu": "CPU"})
    assert SlurmResources.for_gpus(cpu, 2).gpus_per_node == 0


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("PENDING", RemoteState.PENDING),
        ("RUNNING", RemoteState.RUNNING),
        ("COMPLETING", RemoteState.COMPLETING),
        ("COMPLETED", RemoteState.FINISHED),
        ("FAILED", RemoteState.FAILED),
        ("TIMEOUT", RemoteState.FAILED),
        ("CANCELLED by 0", RemoteState.CANCELLED),
        ("CANCELLED+", RemoteState.CANCELLED),
        ("WEIRD", RemoteState.UNKNOWN),
    ],
)
def test_map_state(raw: str, state: RemoteState) -> None:
    assert map_state(raw) is state


class FakeRunner:
    """Answers SLURM commands from a table keyed by the command's first word; records every command."""

    where = "fake"

    def __init__(self, answers: dict[str, CommandResult]) -> None:
        self.answers = answers
        self.commands: list[str] = []

    def run(self, command: str, *, timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.commands.append(command)
        return self.answers.get(command.split()[0], CommandResult(1, "", f"{command.split()[0]}: error"))

    def close(self) -> None:
        pass


def status_with(answers: dict[str, CommandResult]) -> tuple[object, list[str]]:
    from rlctl.launch.base import AgentHandle

    b = SlurmBackend("a", SlurmScheduler(kind="slurm", partition="p"), job="j", job_dir=Path("/r"))
    fake = FakeRunner(answers)
    b.runner = fake
    st = b.status(AgentHandle(SPEC, {"job_id": "42"}, "slurm"))
    return st, [c.split()[0] for c in fake.commands]


def test_status_from_squeue_expands_nodes() -> None:
    st, cmds = status_with({"squeue": CommandResult(0, "RUNNING sitea-[1-2] None\n", "")})
    assert cmds == ["squeue"]
    assert (st.state, st.nodes, st.source) == (RemoteState.RUNNING, ["sitea-1", "sitea-2"], "squeue")  # type: ignore[attr-defined]


def test_status_falls_back_to_scontrol_without_sacct() -> None:
    line = "JobId=42 JobName=x JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 NodeList=siteb-[1,3]"
    st, cmds = status_with({"squeue": CommandResult(0, "", ""), "scontrol": CommandResult(0, line, "")})
    assert cmds == ["squeue", "scontrol"]
    assert (st.state, st.exit_code, st.nodes, st.source) == (RemoteState.FAILED, 3, ["siteb-1", "siteb-3"], "scontrol")  # type: ignore[attr-defined]


def test_status_uses_sacct_last_then_unknown() -> None:
    st, cmds = status_with({"sacct": CommandResult(0, "CANCELLED by 0|sitea-1|0:15\n", "")})
    assert cmds == ["squeue", "scontrol", "sacct"]
    assert (st.state, st.exit_code) == (RemoteState.CANCELLED, -15)  # type: ignore[attr-defined]
    st, _ = status_with({})
    assert st.state is RemoteState.UNKNOWN  # type: ignore[attr-defined]
