"""SLURM backend without a cluster: rendered scripts (golden files), state mapping, the status fallback chain."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlctl.config.hostfill import placement_error, ranks_per_host, slurm_layout, trainer_slots
from rlctl.config.inventory import Site
from rlctl.config.schedulers import SlurmScheduler
from rlctl.errors import LaunchError
from rlctl.launch.base import AgentSpec, Resources
from rlctl.launch.remote import CommandResult, RemoteState
from rlctl.launch.slurm import SlurmBackend, SlurmResources, gpu_request_for, map_state
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
    resources=Resources(tasks=16, gpus_per_task=1, cpus_per_task=12),  # 16 ranks, one GPU and 12 threads each
)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RLCTL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with RLCTL_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; review, then refresh with RLCTL_UPDATE_GOLDEN=1"


def backend(**sched: object) -> SlurmBackend:
    """An 8-GPU-per-node H800 site; the spec's own resources say what to ask for."""
    s = SlurmScheduler.model_validate({"kind": "slurm", "partition": "h800", "time_limit_min": 720, **sched})
    return SlurmBackend(
        "h800",
        s,
        job="demo",
        job_dir=Path("/shared/runs/demo"),
        slots_per_node=8,
        node_gpus=[8] * 4,
        gpu_request="per_task",
        grace_s=45,
        python="python3",
    )


def test_sbatch_script_over_ssh_matches_golden() -> None:
    b = backend(submit_host="login.h800", account="rl", qos="high", ssh_user="rl")
    assert b.submitter == "sbatch-ssh"
    check_golden("sbatch_trainer.sh", b.render(SPEC))


def test_sbatch_script_asks_one_gpu_per_rank_on_two_nodes() -> None:
    text = backend(submit_host="login.h800").render(SPEC)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=16\n#SBATCH --ntasks-per-node=8\n#SBATCH --cpus-per-task=12\n" in text
    assert "#SBATCH --gpus-per-task=1\n" in text and "--gres" not in text


def test_the_agents_srun_asks_each_rank_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURM 22.05 on: srun takes --cpus-per-task from sbatch no more, so the step's ranks ran on one core each while
    OMP_NUM_THREADS said 12 (a plain `srun`, in our script and in submitit's). Both ask for the rank's cores."""
    import submitit

    sbatch = [ln for ln in backend(submit_host="login.h800").render(SPEC).splitlines() if ln.startswith("srun ")]
    assert len(sbatch) == 1 and " --cpus-per-task=12 " in sbatch[0], sbatch
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # srun not needed to render
    lines = [ln for ln in backend().render(SPEC).splitlines() if ln.startswith("srun ")]
    assert len(lines) == 1 and " --cpus-per-task=12 " in lines[0], lines


def test_a_rank_count_nodes_do_not_divide_starts_that_many_tasks() -> None:
    spec = AgentSpec("trainer", 0, "h800", ["x"], resources=Resources(tasks=9, gpus_per_task=1, cpus_per_task=2))
    b = backend(submit_host="login.h800")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=9\n#SBATCH --ntasks-per-node=5\n" in b.render(spec)
    assert b.request_summary(spec) == "9 tasks on 2 node(s), ≤ 5 each, --gpus-per-task=1, 2 cpu(s)/task"


def test_names_with_spaces_or_quotes_stay_one_sbatch_argument() -> None:
    b = SlurmBackend(
        "a",
        # (a partition with a space is refused by the inventory: no SLURM name has one; a `$` is quoted as well)
        SlurmScheduler(kind="slurm", partition="gpu$large", account="it's", submit_host="login"),
        job="my run",
        job_dir=Path("/r/50%"),
        slots_per_node=8,
    )
    text = b.render(replace(SPEC, log_path=Path("/r/50%/trainer-0.log")))
    assert "#SBATCH --job-name='rlctl-my run-trainer'\n#SBATCH --partition='gpu$large'\n" in text
    assert "#SBATCH --account='it'\"'\"'s'\n" in text and "#SBATCH --output=/r/50%%/trainer-0.log\n" in text


def test_gres_request_counts_the_gpus_of_a_node() -> None:
    s = SlurmScheduler(kind="slurm", partition="p", submit_host="login", gpu_request="gres")
    b = SlurmBackend("a", s, job="j", job_dir=Path("/r"), slots_per_node=8, gpu_request="gres")
    text = b.render(SPEC)
    assert "#SBATCH --gres=gpu:8\n" in text and "--gpus-per-task" not in text
    rollout = AgentSpec("rollout", 3, "a", ["x"], resources=Resources(1, 2, 4))
    assert b.request_summary(rollout) == "1 node(s) × 1 task(s), --gres=gpu:2, 4 cpu(s)/task"


def test_sbatch_script_cpu_site_has_no_gpu_line() -> None:
    s = SlurmScheduler(kind="slurm", partition="sitea", submit_host="login")
    b = SlurmBackend("a", s, job="j", job_dir=Path("/r"), resources={"trainer": SlurmResources()})
    text = b.render(SPEC)
    assert "--gpus" not in text and "--gres" not in text and "--account" not in text and "--qos" not in text
    # no override: the spec's GPU slots place its tasks, but a `none` site asks SLURM for no GPU
    b = SlurmBackend("a", s, job="j", job_dir=Path("/r"), slots_per_node=2, gpu_request="none")
    text = b.render(SPEC)
    assert "#SBATCH --nodes=8\n#SBATCH --ntasks=16\n#SBATCH --ntasks-per-node=2\n" in text and "--gpus" not in text
    assert "#SBATCH --job-name=rlctl-j-trainer" in text and "#SBATCH --signal=B:TERM@30" in text


def test_an_inventory_node_s_memory_gb_says_the_sbatch_option_it_becomes(monkeypatch: pytest.MonkeyPatch) -> None:
    # its description said SLURM's --mem, where the script asks --mem-per-cpu (the slot's memory ÷ its threads)
    import submitit

    from rlctl.config.hardware import Node

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # srun not needed to render

    spec = replace(SPEC, resources=Resources(tasks=2, gpus_per_task=1, cpus_per_task=4, mem_mb_per_task=8000))
    line = next(x for x in backend().render(spec).splitlines() if x.startswith("#SBATCH --mem"))
    assert line.startswith("#SBATCH --mem-per-cpu=2000")  # 8000 MB ÷ 4 threads
    assert "--mem-per-cpu" in (Node.model_fields["memory_gb"].description or "")


def test_submitit_script_matches_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    import submitit

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # srun not needed to render
    b = backend(account="rl", qos="high")
    assert b.submitter == "submitit"
    text = b.render(SPEC)
    check_golden("submitit_trainer.sh", text)
    assert "#SBATCH --signal=TERM@45" in text and "#SBATCH --gpus-per-task=1" in text


SITE_OPTIONS = {
    "constraint": "h800&ib",
    "reservation": "rl-week",
    "exclusive": True,
    "sbatch_options": {"comment": "rl test", "requeue": True, "nice": 10},
}


def test_the_site_s_own_options_reach_the_sbatch_script_quoted() -> None:
    """constraint, reservation, exclusive and sbatch_options (true: the option alone) after rlctl's own lines; a
    value the shell would read apart (`&`, a space) quoted, as sbatch splits an #SBATCH line as a shell would."""
    text = backend(submit_host="login.h800", **SITE_OPTIONS).render(SPEC)
    assert (
        "#SBATCH --chdir=/shared/runs/demo\n#SBATCH --constraint='h800&ib'\n#SBATCH --reservation=rl-week\n"
        "#SBATCH --exclusive\n#SBATCH --comment='rl test'\n#SBATCH --requeue\n#SBATCH --nice=10\nset -u\n"
    ) in text
    plain = backend(submit_host="login.h800").render(SPEC)
    assert not any(o in plain for o in ("--constraint", "--reservation", "--exclusive", "--comment"))


def test_the_site_s_own_options_reach_submitit_s_script(monkeypatch: pytest.MonkeyPatch) -> None:
    import submitit

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # srun not needed to render
    lines = backend(**SITE_OPTIONS).render(SPEC).splitlines()
    asked = [ln for ln in lines if ln.startswith("#SBATCH --") and ln.split("=")[0].split()[1] in OWN_OR_SITE]
    assert asked == [
        "#SBATCH --comment='rl test'",
        "#SBATCH --constraint='h800&ib'",
        "#SBATCH --exclusive",
        "#SBATCH --nice=10",
        "#SBATCH --requeue",
        "#SBATCH --reservation=rl-week",
    ]
    plain = backend().render(SPEC)
    assert not any(o in plain for o in ("--constraint", "--reservation", "--exclusive", "--comment"))


OWN_OR_SITE = {"--comment", "--constraint", "--exclusive", "--nice", "--requeue", "--reservation"}


def test_resources_place_tasks_by_gpu_slots() -> None:
    def res(tasks: int, gpus: int, request: str = "per_task") -> SlurmResources:
        return SlurmResources.for_spec(Resources(tasks, gpus, 3), slots_per_node=8, gpu_request=request)  # type: ignore[arg-type]

    assert res(16, 1) == SlurmResources(nodes=2, tasks_per_node=8, cpus_per_task=3, gpus_per_task=1, tasks=16)
    assert res(12, 1) == SlurmResources(nodes=2, tasks_per_node=6, cpus_per_task=3, gpus_per_task=1, tasks=12)
    assert res(4, 1) == SlurmResources(nodes=1, tasks_per_node=4, cpus_per_task=3, gpus_per_task=1, tasks=4)
    # 9 ranks on 2 nodes: at most 5 a node, 9 in all (2 × 5 started a tenth rank the job does not have)
    assert res(9, 1) == SlurmResources(nodes=2, tasks_per_node=5, cpus_per_task=3, gpus_per_task=1, tasks=9)
    assert (
        res(1, 4).gpu_option == "--gpus-per-task=4" and res(1, 0).gpu_option is None
    )  # a rollout unit; the controller
    assert res(3, 4) == SlurmResources(nodes=2, tasks_per_node=2, cpus_per_task=3, gpus_per_task=4, tasks=3)
    assert res(16, 1, "none").gpu_option is None and res(16, 1, "none").nodes == 2
    with pytest.raises(LaunchError, match="a task needs 16 GPUs; the site's nodes have 8"):
        res(1, 16)


def _block(res: SlurmResources) -> list[list[int]]:
    """The ranks on each node under SLURM's default block distribution: node 0 up to tasks_per_node, then node 1 …"""
    ranks = list(range(res.ntasks))
    return [ranks[i : i + res.tasks_per_node] for i in range(0, res.ntasks, res.tasks_per_node)][: res.nodes]


@pytest.mark.parametrize(
    ("ranks", "tp", "node", "nodes", "per_node"),
    [(12, 4, 8, 3, 4), (8, 4, 6, 2, 4), (24, 8, 8, 3, 8), (6, 2, 4, 3, 2), (16, 4, 8, 2, 8)],
)
def test_a_trainer_s_tp_groups_each_get_one_node(ranks: int, tp: int, node: int, nodes: int, per_node: int) -> None:
    """As many ranks on every node, a multiple of tp dividing the ranks (12 at tp 4 on 8-GPU nodes: 3 × 4, not 2 × 6
    with ranks 4-7 on both nodes): exact, so where SLURM puts a partial last node does not matter."""
    res = SlurmResources.for_spec(
        Resources(tasks=ranks, gpus_per_task=1, group=tp), slots_per_node=node, gpu_request="gres", node_gpus=[node] * 4
    )
    assert (res.nodes, res.tasks_per_node, res.ntasks) == (nodes, per_node, ranks)
    assert res.gpu_option == f"--gres=gpu:{per_node}"
    on_node = {r: i for i, rs in enumerate(_block(res)) for r in rs}
    assert len(on_node) == ranks
    assert all(len({on_node[r] for r in range(g, g + tp)}) == 1 for g in range(0, ranks, tp))


@pytest.mark.parametrize(
    ("node_gpus", "ranks", "layout", "per_node"),
    [([8, 8], 9, (2, 5), [5, 4]), ([8, 8, 8], 17, (3, 6), [6, 6, 5]), ([8, 4, 4], 12, (3, 4), [4, 4, 4])],
)
def test_a_tp_1_trainer_asks_for_nodes_that_hold_its_tasks_per_node(
    node_gpus: list[int], ranks: int, layout: tuple[int, int], per_node: list[int]
) -> None:
    """At tp 1 as few nodes as hold ⌈ranks / nodes⌉ each, counted among the nodes that have that many GPUs: 12 on
    nodes of 8, 4, 4 are 3 × 4 (2 × 6 asked for two nodes of 6 and the planner placed 6 ranks of the 12). The
    planner's ranks per node are sbatch's, every rank placed."""
    res = SlurmResources.for_spec(
        Resources(tasks=ranks, gpus_per_task=1), slots_per_node=8, gpu_request="gres", node_gpus=node_gpus
    )
    assert (res.nodes, res.tasks_per_node, res.ntasks) == (*layout, ranks)
    assert slurm_layout(node_gpus, ranks, tp=1) == layout
    assert ranks_per_host(node_gpus, ranks, tp=1, slurm=True) == per_node
    assert trainer_slots(node_gpus, ranks, tp=1, slurm=True) == (ranks, layout[0])


@pytest.mark.parametrize(("node_gpus", "ranks"), [([8, 4], 10), ([8, 8], 20)])
def test_a_tp_1_trainer_with_no_layout_on_the_site_s_nodes_is_refused(node_gpus: list[int], ranks: int) -> None:
    """10 ranks on nodes of 8 and 4: 2 nodes of 5 need two of 5 GPUs (sbatch asked for them: a job that never
    starts, and the planner priced 5 ranks of the 10); 20 on two 8-GPU nodes do not fit. Refused by check, plan and
    launch alike."""
    assert slurm_layout(node_gpus, ranks, tp=1) is None
    assert ranks_per_host(node_gpus, ranks, tp=1, slurm=True) is None
    assert placement_error("s", node_gpus, ranks, tp=1, slurm=True) is not None
    with pytest.raises(LaunchError, match=f"site s: trainer {ranks} GPU"):
        SlurmResources.for_spec(
            Resources(tasks=ranks, gpus_per_task=1), slots_per_node=8, gpu_request="gres", node_gpus=node_gpus, site="s"
        )


def test_a_trainer_whose_tp_groups_have_no_even_layout_on_the_site_s_nodes_is_refused() -> None:
    """20 ranks at tp 4 on four 8-GPU nodes: 4 a node takes 5 nodes, 20 does not fit one; one line naming the site,
    the ranks, tp and the nodes."""
    with pytest.raises(LaunchError) as e:
        backend().request_summary(replace(SPEC, resources=Resources(tasks=20, gpus_per_task=1, group=4)))
    assert str(e.value) == (
        "site h800: trainer-0: trainer 20 GPU(s) at tp 4 on SLURM need as many ranks on each node, a "
        "multiple of tp dividing 20 (4, 20), so that no tp group spans two nodes; its 4 node(s) of 8 GPUs hold none "
        "of those"
    )


def _site(gpu: str, **sched: object) -> Site:
    return Site.model_validate(
        {
            "datacenter": "a",
            "scheduler": {"kind": "slurm", "partition": "p", **sched},
            "gpu": gpu,
            "nodes": [{"host": "n[1-4]", "gpus": 8}],
        }
    )


def test_gpu_request_depends_on_the_inventory() -> None:
    assert gpu_request_for(_site("H800")) == "per_task"
    assert gpu_request_for(_site("CPU")) == "none"  # the test clusters have no GRES: never ask there
    assert gpu_request_for(_site("H800", gpu_request="gres")) == "gres"
    assert gpu_request_for(_site("H800", gpu_request="none")) == "none"
    # an explicit GPU request on a CPU site asked for GPUs its agents never use (CUDA_VISIBLE_DEVICES ""), one per core
    # slot, and its jobs waited for them: refused by the inventory (test_config_errors)
    with pytest.raises(ValidationError, match="asks SLURM for GPUs, and the site's gpu is CPU"):
        _site("CPU", gpu_request="per_task")


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


def test_submitit_asks_ntasks_only_where_the_ranks_do_not_fill_the_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    import submitit

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    b = backend(account="rl")
    nine = AgentSpec("trainer", 0, "h800", ["x"], resources=Resources(tasks=9, gpus_per_task=1, cpus_per_task=2))
    assert "#SBATCH --ntasks=9\n" in b.render(nine) and "--ntasks=" not in b.render(SPEC)


def at_time_limit_with(answers: dict[str, CommandResult]) -> tuple[str | None, list[str]]:
    from rlctl.launch.base import AgentHandle

    b = SlurmBackend("a", SlurmScheduler(kind="slurm", partition="p"), job="j", job_dir=Path("/r"), grace_s=30)
    fake = FakeRunner(answers)
    b.runner = fake
    return b.at_time_limit(AgentHandle(SPEC, {"job_id": "42"}, "slurm")), [c.split()[0] for c in fake.commands]


@pytest.mark.parametrize(
    ("answers", "said"),
    [
        # still in the queue (its agents exiting on the TERM): run time and limit from squeue
        ({"squeue": CommandResult(0, "COMPLETING 1:31 2:00\n", "")}, "SLURM job 42 ran 0:01:31 of its 0:02:00 limit"),
        ({"squeue": CommandResult(0, "RUNNING 0:29 2:00\n", "")}, None),  # under 2:00 - 30 s grace - 60 s early
        (
            {"squeue": CommandResult(0, "RUNNING 23:59:10 1-00:00:00\n", "")},
            "SLURM job 42 ran 23:59:10 of its 24:00:00 limit",
        ),
        ({"squeue": CommandResult(0, "RUNNING 5:00 UNLIMITED\n", "")}, None),
        # left the queue: scontrol, then sacct (ElapsedRaw s, TimelimitRaw min)
        (
            {"scontrol": CommandResult(0, "JobId=42 JobState=COMPLETED RunTime=00:01:35 TimeLimit=00:02:00", "")},
            "SLURM job 42 ran 0:01:35 of its 0:02:00 limit",
        ),
        ({"scontrol": CommandResult(0, "JobId=42 JobState=FAILED RunTime=00:00:20 TimeLimit=00:02:00", "")}, None),
        ({"sacct": CommandResult(0, "TIMEOUT|125|2\n", "")}, "SLURM job 42 ran 0:02:05 of its 0:02:00 limit"),
        ({"sacct": CommandResult(0, "TIMEOUT||\n", "")}, "SLURM job 42 ended TIMEOUT"),
        ({}, None),  # no tool knows the job
        # a limit within grace_s + TERM_EARLY_S (30 + 60 s): every run is that close to it; only TIMEOUT tells
        ({"squeue": CommandResult(0, "RUNNING 0:20 1:00\n", "")}, None),
        ({"sacct": CommandResult(0, "TIMEOUT|65|1\n", "")}, "SLURM job 42 ended TIMEOUT"),
    ],
)
def test_at_time_limit_reads_run_time_and_limit(answers: dict[str, CommandResult], said: str | None) -> None:
    """A job that ran to within grace_s + TERM_EARLY_S of its --time ended at its time limit (SLURM's TERM: the
    agents exit cleanly, so its state is COMPLETED or FAILED, rarely TIMEOUT); any shorter run did not."""
    assert at_time_limit_with(answers)[0] == said


@pytest.mark.parametrize(("line", "queued"), [("PENDING (null) Priority\n", True), ("RUNNING sitea-1 None\n", False)])
def test_a_pending_job_is_queued_and_a_running_one_is_not(line: str, queued: bool) -> None:
    """The controller's join bound for a replacement counts from when SLURM starts it (Scaler.not_joining)."""
    from rlctl.launch.base import AgentHandle

    b = SlurmBackend("a", SlurmScheduler(kind="slurm", partition="p"), job="j", job_dir=Path("/r"))
    b.runner = FakeRunner({"squeue": CommandResult(0, line, "")})
    assert b.queued(AgentHandle(SPEC, {"job_id": "42"}, "slurm")) is queued


def test_the_slurm_commands_run_after_the_site_s_setup_lines(tmp_path: Path) -> None:
    """sbatch, squeue and scancel are often on PATH only after the site's `module load`: each runs in the shell its
    setup lines ran in (here they define the tools: this machine has none), and the dry-run's script says so.
    Before, the setup lines reached only the batch script, and every control command was 'command not found'."""
    from rlctl.launch.base import AgentHandle

    setup = [
        "echo loading slurm",  # output of a setup line: not read as a job id or a job's state
        "sbatch() { cat >/dev/null; echo '42;cluster'; }",
        "squeue() { echo 'RUNNING sitea-1 None'; }",
    ]
    s = SlurmScheduler(kind="slurm", partition="p")
    b = SlurmBackend("a", s, job="j", job_dir=tmp_path, setup=setup)
    spec = replace(SPEC, log_path=tmp_path / "logs" / "trainer-0.log", resources=Resources())
    assert b._submit_sbatch(spec) == "42"
    st = b.status(AgentHandle(spec, {"job_id": "42"}, "slurm"))
    assert (st.state, st.nodes, st.source) == (RemoteState.RUNNING, ["sitea-1"], "squeue")
    ssh = SlurmBackend(
        "a",
        SlurmScheduler(kind="slurm", partition="p", submit_host="login"),
        job="j",
        job_dir=Path("/r"),
        setup=["module load slurm"],
    )
    head = ssh.render(replace(SPEC, resources=Resources())).split("#SBATCH")[0]
    assert "submitted on login:22 by" in head and "#   module load slurm\n" in head
    assert "#   mkdir -p /shared/runs/demo/logs && sbatch --parsable\n" in head
