"""What differs between scheduler kinds is a hook of the kind's backend class (`rlctl.launch.base.LaunchBackend`):
each kind answers them as its sites need, and no module outside `kind_of` and the inventory looks at the kind.
The layers of ../shared/DESIGN.md §2 hold: `launch/` imports neither `ops/` nor the planner."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import kind_of, make_backend, python_for
from rlctl.launch.base import AgentSpec, GpuSlice, Resources
from rlctl.launch.local import LocalBackend
from rlctl.launch.localrunner import LocalRunner
from rlctl.launch.remote import SshTarget
from rlctl.launch.slurm import SlurmBackend
from rlctl.launch.ssh import SshBackend
from rlctl.launch.sshrunner import SshRunner
from tests.conftest import ROOT


def site(scheduler: dict[str, Any], *, gpu: str = "H800", host: str = "n[1-2]") -> Site:
    return Site.model_validate(
        {"datacenter": "dc-a", "scheduler": scheduler, "gpu": gpu, "nodes": [{"host": host, "gpus": 2}]}
    )


LOCAL = site({"kind": "local"}, host="localhost")
LOCAL_ROOT = site({"kind": "local", "workdir": "/scratch/rl"}, host="localhost")
SLURM = site({"kind": "slurm", "partition": "gpu"})
SLURM_SUBMIT = site({"kind": "slurm", "partition": "gpu", "submit_host": "login1", "ssh_user": "rl"})
SSH = site({"kind": "ssh", "user": "rl", "workdir": "/data/rl"}, host="h20-[01-03]")
SSH_SHARED = site({"kind": "ssh", "workdir": "/nfs/rl", "shared_workdir": True}, host="h20-[01-03]")


@pytest.mark.parametrize(
    ("s", "cls"), [(LOCAL, LocalBackend), (SLURM, SlurmBackend), (SLURM_SUBMIT, SlurmBackend), (SSH, SshBackend)]
)
def test_kind_of_maps_each_scheduler_to_its_backend_and_builds_it(s: Site, cls: type, tmp_path: Path) -> None:
    assert kind_of(s) is cls
    backend = make_backend("site", s, job="demo", job_dir=tmp_path)
    try:
        assert type(backend) is cls and backend.kind == s.scheduler.kind
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("s", "root", "remote", "views"),
    [
        (LOCAL, None, False, ["localhost"]),  # the operator's job dir itself
        (LOCAL_ROOT, "/scratch/rl", False, ["localhost"]),
        (SLURM, None, False, ["localhost"]),  # submitted from here: this filesystem
        (SLURM_SUBMIT, "~/.rlctl", True, ["login1"]),  # the submit host's home, which the nodes share
        (SSH, "/data/rl", True, ["h20-01", "h20-02", "h20-03"]),  # a copy on every host
        (SSH_SHARED, "/nfs/rl", True, ["h20-01"]),
    ],
)
def test_where_each_kind_keeps_the_job_files(s: Site, root: str | None, remote: bool, views: list[str]) -> None:
    kind = kind_of(s)
    assert kind.work_root(s) == root
    assert kind.remote(s) is remote
    assert kind.access_hosts(s) == views
    assert kind.agent_view(s, "h20-02") == ("h20-02" if s is SSH else views[0])
    assert kind.shared_work_root(s) is (s is not SSH)


def test_ssh_targets_name_the_host_or_the_submit_host_and_local_sites_have_none() -> None:
    assert SshBackend.ssh_target(SSH, "h20-03").host == "h20-03"
    assert SshBackend.ssh_target(SSH).host == "h20-01"
    assert (SshBackend.ssh_target(SSH).user, SshBackend.ssh_target(SSH).port) == ("rl", 22)
    submit = SlurmBackend.ssh_target(SLURM_SUBMIT)
    assert (submit.host, submit.user) == ("login1", "rl")
    with pytest.raises(LaunchError, match="not reached over SSH"):
        LocalBackend.ssh_target(LOCAL)
    with pytest.raises(LaunchError, match="without a submit_host"):
        SlurmBackend.ssh_target(SLURM)
    assert isinstance(SlurmBackend.site_runner(SLURM_SUBMIT), SshRunner)
    assert isinstance(SlurmBackend.site_runner(SLURM), LocalRunner)
    assert isinstance(SshBackend.site_runner(SSH, "h20-02"), SshRunner)


def test_flags_gpu_binding_ranks_interpreter() -> None:
    assert (LocalBackend.slices_gpus, SshBackend.slices_gpus, SlurmBackend.slices_gpus) == (True, True, False)
    assert [k.ranks_are_tasks for k in (LocalBackend, SshBackend, SlurmBackend)] == [False, False, True]
    assert [k.on_this_machine for k in (LocalBackend, SshBackend, SlurmBackend)] == [True, False, False]
    assert (LocalBackend.default_python, SlurmBackend.default_python) == (sys.executable, sys.executable)
    assert SshBackend.default_python == "python3"  # never this machine's interpreter path on another host


def test_a_site_without_python_runs_this_interpreter_only_where_it_shares_this_filesystem() -> None:
    """A SLURM site submitted through its submit host ran this machine's interpreter path on the cluster's nodes."""
    assert [python_for(s) for s in (LOCAL, SLURM)] == [sys.executable, sys.executable]
    assert [python_for(s) for s in (SLURM_SUBMIT, SSH)] == ["python3", "python3"]
    assert (
        python_for(SLURM_SUBMIT.model_copy(update={"python": "/shared/venv/bin/python"})) == "/shared/venv/bin/python"
    )


def test_probe_commands_run_where_agents_run() -> None:
    assert LocalBackend.probe_commands(LOCAL, "echo hi") == [("localhost", None, "echo hi")]
    assert SshBackend.probe_commands(SSH, "echo hi") == [(h, h, "echo hi") for h in ("h20-01", "h20-02", "h20-03")]
    assert SshBackend.probe_commands(SSH, "echo hi", first=True) == [("h20-01", "h20-01", "echo hi")]
    [(label, host, command)] = SlurmBackend.probe_commands(SLURM, "echo hi")
    assert (label, host) == ("a node of partition gpu", None)
    assert command == "srun --partition=gpu --nodes=1 --ntasks=1 --gpus-per-task=1 --time=5 bash -c 'echo hi'"
    cpu = site({"kind": "slurm", "partition": "cpu"}, gpu="CPU")
    [(_, _, command)] = SlurmBackend.probe_commands(cpu, "true")
    assert "--gpus-per-task" not in command and "--gres" not in command
    # charged as the agents' jobs are: a cluster that enforces accounts refused the probe's step without them, and
    # check --reach failed a site whose jobs would run
    charged = site({"kind": "slurm", "partition": "gpu", "account": "proj$rl", "qos": "high"})
    [(_, _, command)] = SlurmBackend.probe_commands(charged, "true")
    assert command.startswith("srun --partition=gpu --account='proj$rl' --qos=high --nodes=1 "), command
    # on the nodes and terms the agents' jobs get: a site whose GPU nodes need a feature or a reservation had the
    # probe's step run elsewhere, or wait
    # (less what srun has not: `srun: unrecognized option '--requeue'` failed the probe of a site whose jobs run)
    sbatch = {"comment": "a b", "requeue": True, "no-requeue": True, "get-user-env": "60L", "mail-type": "END"}
    opts = {"constraint": "h800&ib", "reservation": "rl", "exclusive": True, "sbatch_options": sbatch}
    [(_, _, command)] = SlurmBackend.probe_commands(site({"kind": "slurm", "partition": "gpu", **opts}), "true")
    assert command.startswith(
        "srun --partition=gpu --constraint='h800&ib' --reservation=rl --exclusive --comment='a b' --mail-type=END "
        "--nodes=1 "
    ), command


def test_agent_hooks_have_defaults_and_slurm_and_ssh_say_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import submitit

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # srun not needed to render
    spec = AgentSpec("rollout", 0, "s", ["python3", "-m", "rlctl.agents", "rollout"], gpu_slice=GpuSlice("n1", (0,)))
    local = LocalBackend()
    assert local.render(spec) == "python3 -m rlctl.agents rollout"
    assert local.request_summary(spec) is None
    assert local.host_for(spec) == "n1"
    slurm = SlurmBackend.for_site("s", SLURM, job="demo", job_dir=tmp_path)
    trainer = AgentSpec("trainer", 0, "s", ["python3"], resources=Resources(tasks=4, gpus_per_task=1, cpus_per_task=8))
    assert slurm.host_for(trainer) is None  # SLURM places it
    assert slurm.request_summary(trainer) == "2 node(s) × 2 task(s), --gpus-per-task=1, 8 cpu(s)/task"
    assert "--ntasks-per-node=2" in slurm.render(trainer)
    ssh = SshBackend.for_site("s", SSH, job="demo", job_dir=tmp_path)
    assert ssh.host_for(AgentSpec("rollout", 1, "s", ["python3"])) == "h20-02"  # round robin by replica
    on_3 = AgentSpec("rollout", 0, "s", ["python3"], gpu_slice=GpuSlice("h20-03", (1,)))
    assert ssh.host_for(on_3) == "h20-03"
    assert ssh.render(on_3).startswith("ssh ") and "rl@h20-03 bash -s" in ssh.render(on_3)
    with pytest.raises(LaunchError, match="not a host of the site"):
        ssh.host_for(spec)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_launch_imports_neither_ops_nor_the_planner() -> None:
    bad = {
        f"{p.relative_to(ROOT)} imports {m}"
        for p in (ROOT / "rlctl" / "launch").glob("*.py")
        for m in _imports(p)
        if m.startswith(("rlctl.ops", "rlctl.planner", "rlctl.agents"))
    }
    assert not bad, sorted(bad)


def test_agents_do_not_import_the_operator_side() -> None:
    bad = {
        f"{p.relative_to(ROOT)} imports {m}"
        for p in (ROOT / "rlctl" / "agents").glob("*.py")
        for m in _imports(p)
        if m.startswith(("rlctl.ops", "rlctl.commands"))
    }
    assert not bad, sorted(bad)


def test_nothing_outside_the_inventory_and_kind_of_switches_on_the_scheduler_kind() -> None:
    switch = re.compile(r"scheduler\.kind\s*[=!]=|isinstance\([^)]*scheduler|kind\s*==\s*\"(local|slurm|ssh)\"")
    allowed = {"rlctl/config/inventory.py"}
    bad = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in (ROOT / "rlctl").rglob("*.py")
        if str(p.relative_to(ROOT)) not in allowed
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if switch.search(line) and "assert isinstance" not in line
    ]
    assert not bad, bad


class _Said:
    """The fabric Connection of an SshRunner: keeps the command line sshd would hand the login shell."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def run(self, line: str, **_: Any) -> Any:
        self.lines.append(line)
        return type("Result", (), {"exited": 0, "stdout": "", "stderr": ""})()

    def close(self) -> None:
        pass


def test_an_ssh_command_after_setup_lines_is_one_bash_c_line_any_login_shell_reads() -> None:
    # `{ …setup… } </dev/null >&2; cmd` and `export K=v; ` were sent as they are: Bourne syntax the user's login
    # shell read, so a tcsh or fish one broke every SLURM command of a site with setup lines
    import subprocess

    runner = SshRunner(SshTarget("login1", user="rl"), env={"X": "it's"}, setup=["echo set up", "Y=1"])
    said = _Said()
    runner._conn = said  # type: ignore[assignment]
    runner.run('echo "$X" $Y; cat', timeout_s=5, stdin="in\n")
    (line,) = said.lines
    quoted = re.fullmatch(r"timeout -k \d+ \d+ bash -c '([^'\\\n]*)'", line)  # (the host's own deadline first)
    assert quoted is not None, line  # one single-quoted word: no newline, quote or backslash a tcsh/fish reads
    # what bash then runs: the setup lines (to stderr), then the command, with its env and stdin
    done = subprocess.run(["sh", "-c", line], input="in\n", capture_output=True, text=True, check=True)
    assert (done.stdout, done.stderr) == ("it's 1\nin\n", "set up\n")


def test_sbatch_refusing_a_submitit_job_is_a_launch_error_naming_the_site_and_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submitit raises FailedJobError when sbatch exits non-zero (a feature no node has, a partition not there): it
    went past the launch as a traceback, exit 1, versus the site's one line."""
    from submitit.core.utils import FailedJobError

    class Refused:
        def submit(self, fn: Any) -> Any:
            raise FailedJobError("sbatch: error: Batch job submission failed: Invalid feature specification")

    slurm = SlurmBackend.for_site("s", SLURM, job="demo", job_dir=tmp_path)
    monkeypatch.setattr(slurm, "_executor", lambda spec: Refused())
    with pytest.raises(LaunchError) as e:
        slurm.start(AgentSpec("rollout", 0, "s", ["python3"]))
    assert str(e.value) == (
        "site s: sbatch (submitit) refused rollout-0: sbatch: error: Batch job submission failed: Invalid feature "
        "specification"
    )
