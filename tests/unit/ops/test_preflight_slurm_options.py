"""A SLURM site's constraint and reservation against what sinfo and scontrol say where its jobs are submitted
(`rlctl.ops.preflight.slurmoptions`), on their canned output (slurm 22.05's), and `check --reach` asking them before
the probe's srun."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rlctl.config.inventory import Inventory, Site
from rlctl.config.job import Job, load_job
from rlctl.config.schedulers import SlurmScheduler
from rlctl.launch.remote import CommandResult
from rlctl.launch.slurm import SlurmBackend
from rlctl.ops.preflight.slurmoptions import (
    Submitter,
    constraint_features,
    constraint_problem,
    node_features,
    option_problems,
    reservation_problem,
    reservations,
)

REPO = Path(__file__).resolve().parents[3]
# `sinfo -h -N -p gpu,big -o '%N|%f'`: a node of both partitions is said twice
SINFO = "g-01|h800,ib\ng-02|h800,nvme\ng-02|h800,nvme\ng-03|(null)\n"
# `scontrol show reservation -o` (slurm 22.05, as the test cluster prints it)
SCONTROL = (
    "ReservationName=later StartTime=2026-12-07T19:05:59 EndTime=2026-12-07T20:05:59 Duration=01:00:00 Nodes=g-01 "
    "NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=2 Users=nobody,rl "
    "Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=theirs StartTime=2026-12-06T19:05:59 EndTime=2026-12-06T19:15:59 Duration=00:10:00 "
    "Nodes=g-[01-02] NodeCnt=2 CoreCnt=4 Features=(null) PartitionName=(null) Flags=IGNORE_JOBS,SPEC_NODES "
    "TRES=cpu=4 Users=nobody Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a "
    "MaxStartDelay=(null)\n"
    "ReservationName=elsewhere StartTime=2026-12-06T19:05:59 EndTime=2026-12-06T19:15:59 Duration=00:10:00 "
    "Nodes=cpu-[1-4] NodeCnt=4 CoreCnt=8 Features=(null) PartitionName=cpu Flags= TRES=cpu=8 Users=(null) "
    "Groups=(null) Accounts=ml Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
)
RL = Submitter("rl", frozenset({"rl", "wheel"}), None)


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("h800", ["h800"]),
        ("h800&ib", ["h800", "ib"]),
        ("h800|nvme", ["h800", "nvme"]),
        ("[ib|nvme]", ["ib", "nvme"]),
        ("h800*2", ["h800"]),
        ("[h800*2&ib*1]", ["h800", "ib"]),
        ("(h800&ib)|nvme", ["h800", "ib", "nvme"]),
        ("h800,ib", ["h800", "ib"]),
        ("!ib&h800", ["h800"]),  # newer SLURM's NOT: a feature no node has is no refusal there
        ("h800&h800", ["h800"]),
        ("gpu:a100&h800", ["h800"]),  # a word of other characters: not looked for
        ("!(ib|nvme)&h800", []),  # a group negated: which names must be there is not told
    ],
)
def test_only_a_constraint_s_plain_feature_names_are_looked_for(expression: str, names: list[str]) -> None:
    assert constraint_features(expression) == names


def test_sinfo_s_node_lines_are_each_node_s_features() -> None:
    assert node_features(SINFO) == {"g-01": {"h800", "ib"}, "g-02": {"h800", "nvme"}, "g-03": set()}
    assert node_features("") == {}


def sched(**options: object) -> SlurmScheduler:
    return SlurmScheduler.model_validate({"kind": "slurm", "partition": "gpu", **options})


@pytest.mark.parametrize("valid", ["h800&ib", "h800|nvme", "[ib|nvme]", "h800*2", "!h100&h800", "(h800&ib)|nvme"])
def test_a_constraint_of_features_the_partition_has_passes(valid: str) -> None:
    assert constraint_problem("h", sched(constraint=valid), node_features(SINFO)) is None


def test_a_constraint_naming_a_feature_no_node_has_is_one_line_with_the_partition_s_features() -> None:
    p = constraint_problem("h", sched(constraint="[h800|h100]&ibx"), node_features(SINFO))
    assert p is not None and p.field == "sites.h.scheduler.constraint"
    assert p.message == (
        "'[h800|h100]&ibx': no node of partition gpu has features 'h100', 'ibx' (sinfo): sbatch refuses every agent's "
        "job; its nodes' features: h800, ib, nvme"
    )
    bare = constraint_problem("h", sched(constraint="h800"), node_features("g-01|(null)\n"))
    assert bare is not None and bare.message.endswith("its nodes have no features")
    assert constraint_problem("h", sched(constraint="ibx"), {}) is None  # sinfo named no node: cannot be told


SPREAD = (
    "its features each on some node (sinfo): sbatch refuses every agent's job ('Requested node configuration is not "
    "available'); its nodes' features: h800,ib (1 node); h800,nvme (1 node); none (1 node)"
)


@pytest.mark.parametrize("spread", ["ib&nvme", "ib,nvme", "(ib|h800)&nvme&ib", "(h800&ib&nvme)|(ib&nvme)"])
def test_a_constraint_no_one_node_satisfies_is_one_line_with_the_nodes_feature_sets(spread: str) -> None:
    """Each feature on some node of the partition, none on one node with all of them: it passed, and srun refused
    the probe's step ('Requested node configuration is not available', naming no field) or sbatch every job."""
    p = constraint_problem("h", sched(constraint=spread), node_features(SINFO))
    assert p is not None and p.field == "sites.h.scheduler.constraint"
    assert p.message == f"{spread!r}: no node of partition gpu has all it asks, {SPREAD}"


@pytest.mark.parametrize("untold", ["[ib&nvme]", "[ib*1&nvme*1]", "ib*2&nvme", "ib&!nvme", "ib|h800&nvme"])
def test_a_constraint_of_a_form_not_evaluated_passes(untold: str) -> None:
    assert constraint_problem("h", sched(constraint=untold), node_features(SINFO)) is None


def test_option_problems_names_a_constraint_no_one_node_satisfies(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    _on_submit_host(monkeypatch, asked)
    site = Site.model_validate({**SITE, "scheduler": {"kind": "slurm", "partition": "gpu", "constraint": "ib&nvme"}})
    found = option_problems("local", site, file="sites.yaml", timeout_s=1.0)
    assert [(p.file, p.field, p.message) for p in found] == [
        (
            "sites.yaml",
            "sites.local.scheduler.constraint",
            f"'ib&nvme': no node of partition gpu has all it asks, {SPREAD}",
        )
    ]
    assert asked == ["sinfo"]
    site = Site.model_validate({**SITE, "scheduler": {"kind": "slurm", "partition": "gpu", "constraint": "h800&ib"}})
    assert option_problems("local", site, file="sites.yaml", timeout_s=1.0) == []  # g-01 has both


def test_scontrol_s_reservation_lines_are_their_fields() -> None:
    said = reservations(SCONTROL)
    assert list(said) == ["later", "theirs", "elsewhere"]
    assert said["theirs"]["Nodes"] == "g-[01-02]" and said["theirs"]["TRES"] == "cpu=4"
    assert said["elsewhere"]["Flags"] == "" and said["elsewhere"]["Accounts"] == "ml"
    assert reservations("No reservations in the system\n") == {}


PARTITION = {"g-01", "g-02", "g-03"}


def test_a_reservation_that_is_not_there_is_one_line_naming_those_there() -> None:
    p = reservation_problem("h", sched(reservation="gone"), reservations(SCONTROL), PARTITION, RL)
    assert p is not None and p.field == "sites.h.scheduler.reservation"
    assert p.message == (
        "'gone': no such reservation (scontrol show reservation): never made, or ended (SLURM removes it at its end); "
        "sbatch refuses every agent's job; those there: elsewhere (nodes cpu-[1-4], accounts ml, ends "
        "2026-12-06T19:15:59); later (nodes g-01, users nobody,rl, starts 2026-12-07T19:05:59, ends "
        "2026-12-07T20:05:59); theirs (nodes g-[01-02], users nobody, ends 2026-12-06T19:15:59)"
    )
    none = reservation_problem("h", sched(reservation="gone"), {}, PARTITION, RL)
    assert none is not None and none.message.endswith("; no other is there")


def test_a_reservation_for_other_users_or_accounts_is_named_where_that_can_be_told() -> None:
    said = reservations(SCONTROL)
    p = reservation_problem("h", sched(reservation="theirs"), said, PARTITION, RL)
    assert p is not None
    assert "'theirs' is not for the site's jobs: its users are nobody, and the site's jobs are submitted as rl" in (
        p.message
    )
    # the site's account not given (the user's default, not known here): passes; given and not the reservation's: not
    on_cpu = {"g-01", "cpu-1"}
    assert reservation_problem("h", sched(reservation="elsewhere"), said, on_cpu, RL) is None
    charged = Submitter("rl", frozenset(), "ml")
    assert reservation_problem("h", sched(reservation="elsewhere", account="ml"), said, on_cpu, charged) is None
    other = Submitter("rl", frozenset(), "cv")
    p = reservation_problem("h", sched(reservation="elsewhere", account="cv"), said, on_cpu, other)
    assert p is not None and "its accounts are ml, and the site's jobs charge cv (scheduler.account)" in p.message
    # users and accounts both named: refused only where neither lets the job in (older SLURM: either does)
    both = {"r": {**said["elsewhere"], "ReservationName": "r", "Users": "rl"}}
    assert reservation_problem("h", sched(reservation="r", account="cv"), both, on_cpu, other) is None
    excluded = {"r": {**said["theirs"], "ReservationName": "r", "Users": "-rl"}}
    assert reservation_problem("h", sched(reservation="r"), excluded, PARTITION, RL) is not None
    assert reservation_problem("h", sched(reservation="theirs"), said, PARTITION, None) is None  # who: not known


def test_a_reservation_on_other_nodes_or_not_started_is_named() -> None:
    said = reservations(SCONTROL)
    cpu = Submitter("rl", frozenset(), "ml")
    p = reservation_problem("h", sched(reservation="elsewhere", account="ml"), said, PARTITION, cpu)
    assert p is not None and p.message.startswith(
        "'elsewhere' is on nodes cpu-[1-4], none of partition gpu's (sinfo): every agent's job would wait for ever"
    )
    p = reservation_problem("h", sched(reservation="later"), said, PARTITION, RL)
    assert p is not None and p.message == (
        "'later' starts 2026-12-07T19:05:59 (scontrol; ends 2026-12-07T20:05:59): every agent's job would wait until "
        "then"
    )
    flex = {"later": {**said["later"], "Flags": "FLEX,SPEC_NODES", "Nodes": "cpu-1"}}  # may start before, elsewhere
    assert reservation_problem("h", sched(reservation="later"), flex, PARTITION, RL) is None


# an active 5-minute reservation (slurm 22.05's line, measured): a job with --time=60 starts there, and SLURM ends it
# at the reservation's end (ResvOverRun = 0, its default)
R_TEST = (
    "ReservationName=r_test StartTime=2026-12-07T00:54:07 EndTime=2026-12-07T00:59:07 Duration=00:05:00 "
    "Nodes=sitea-[1-2],siteb-[1-2] NodeCnt=4 CoreCnt=8 Features=(null) PartitionName=(null) Flags=SPEC_NODES,ALL_NODES "
    "TRES=cpu=8 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a "
    "MaxStartDelay=(null)\n"
)
SITEA = {"sitea-1", "sitea-2"}
ROOT = Submitter("root", frozenset({"root"}), None)
NOW = "2026-12-07T00:54:40"  # the submit host's clock (`date`), 4 min 27 s before the reservation's end


def test_a_reservation_ending_before_the_site_s_time_limit_is_one_line_with_its_end_and_the_minutes_left() -> None:
    """The job started, its end shown at its full limit, and SLURM ended every agent's job at the reservation's end,
    minutes into a 60-minute (or the default week's) limit; auto-resume then found the reservation gone."""
    said = reservations(R_TEST)
    p = reservation_problem("a", sched(reservation="r_test", time_limit_min=60), said, SITEA, ROOT, now=NOW)
    assert p is not None and p.field == "sites.a.scheduler.time_limit_min"
    assert p.message == (
        "60 is past the end of reservation 'r_test' (scheduler.reservation): it ends 2026-12-07T00:59:07, 4 min from "
        "now on the submit host's clock (scontrol, date): SLURM ends every agent's job at its end (ResvOverRun 0): at "
        "most 4 min in, not 60, the reservation then gone for a resume"
    )
    ten = reservation_problem(
        "a", sched(reservation="r_test", time_limit_min=60), said, SITEA, ROOT, now=NOW, overrun="10 min"
    )
    assert ten is not None and "at its end and 10 min past it (ResvOverRun): at most 14 min in, not 60" in ten.message
    assert p.hint == "set scheduler.time_limit_min ≤ 4, or a reservation that ends later"
    five = reservation_problem("a", sched(reservation="r_test", time_limit_min=5), said, SITEA, ROOT, now=NOW)
    assert five is not None and five.hint == p.hint  # 5 min of the 4 min 27 s left
    default = reservation_problem("a", sched(reservation="r_test"), said, SITEA, ROOT, now=NOW)
    assert default is not None and default.message.startswith("10080 (the default) is past the end of reservation")
    last = reservation_problem("a", sched(reservation="r_test"), said, SITEA, ROOT, now="2026-12-07T00:58:30")
    assert last is not None and last.hint == "set a reservation that ends later, or leave reservation out"


def test_a_reservation_ending_after_the_time_limit_flex_or_whose_end_cannot_be_told_passes() -> None:
    said = reservations(R_TEST)
    for limit in (1, 4):  # 4 min of the 4 min 27 s left
        fits = sched(reservation="r_test", time_limit_min=limit)
        assert reservation_problem("a", fits, said, SITEA, ROOT, now=NOW) is None
    flex = {"r_test": {**said["r_test"], "Flags": "FLEX,SPEC_NODES"}}  # its jobs may run past its end
    assert reservation_problem("a", sched(reservation="r_test"), flex, SITEA, ROOT, now=NOW) is None
    for end in ("Tomorr 00:59", "12/07-00:59:07", "(null)", ""):  # another SLURM_TIME_FORMAT, or none said
        other = {"r_test": {**said["r_test"], "EndTime": end}}
        assert reservation_problem("a", sched(reservation="r_test"), other, SITEA, ROOT, now=NOW) is None
    for now in (None, "", "Mon Dec  7 00:54:40 UTC 2026"):  # the host's clock not said, or not in scontrol's form
        assert reservation_problem("a", sched(reservation="r_test"), said, SITEA, ROOT, now=now) is None
    fits = sched(reservation="r_test", time_limit_min=14)  # 4 min 27 s to its end, and 10 min past it
    assert reservation_problem("a", fits, said, SITEA, ROOT, now=NOW, overrun="10 min") is None
    for overrun in ("UNLIMITED", "unlimited", "10 hours"):  # jobs run on past its end, or a form not known
        assert (
            reservation_problem("a", sched(reservation="r_test"), said, SITEA, ROOT, now=NOW, overrun=overrun) is None
        )


def test_option_problems_asks_the_submit_host_s_clock_with_its_reservations(monkeypatch: pytest.MonkeyPatch) -> None:
    """`date` and ResvOverRun in the one command that asks who submits and the reservations: the host's clock and its
    cluster's overrun, not this machine's; not said of a launched job (a resume, scale), which runs as launched."""
    sent: list[str] = []
    overrun = "rlctl-overrun=0 min"

    class Host(SubmitHost):
        def run(self, command: str, *, timeout_s: float) -> CommandResult:
            sent.append(command)
            if command.endswith("scontrol show reservation -o"):
                return CommandResult(0, f"rlctl-user=root\nrlctl-groups=root\nrlctl-now={NOW}\n{overrun}\n{R_TEST}", "")
            return CommandResult(0, "sitea-1|(null)\nsitea-2|(null)\n", "")

    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: Host([])))
    scheduler = {"kind": "slurm", "partition": "gpu", "reservation": "r_test", "time_limit_min": 30}
    site = Site.model_validate({**SITE, "scheduler": scheduler})
    found = option_problems("a", site, file="sites.yaml", timeout_s=1.0)
    assert [(p.field, p.hint) for p in found] == [
        ("sites.a.scheduler.time_limit_min", "set scheduler.time_limit_min ≤ 4, or a reservation that ends later")
    ]
    assert len(sent) == 2 and 'echo "rlctl-now=$(date +%Y-%m-%dT%H:%M:%S)"; scontrol show config' in sent[1]
    assert option_problems("a", site, file="sites.yaml", timeout_s=1.0, ends=False) == []
    overrun = "rlctl-overrun=UNLIMITED"
    assert option_problems("a", site, file="sites.yaml", timeout_s=1.0) == []
    overrun = "rlctl-overrun=0 min"
    site = Site.model_validate({**SITE, "scheduler": {**scheduler, "time_limit_min": 4}})
    assert option_problems("a", site, file="sites.yaml", timeout_s=1.0) == []


class SubmitHost:
    """A SLURM site's submit host: sinfo's features and node states, `id` and scontrol's reservations; the probe's
    srun refused alike. Each command's first word put in `asked`."""

    def __init__(self, asked: list[str]) -> None:
        self.asked = asked

    def run(self, command: str, *, timeout_s: float) -> CommandResult:
        self.asked.append(command.split()[0])
        if command.startswith("sinfo -h -N"):
            return CommandResult(0, SINFO, "")
        if command.endswith("scontrol show reservation -o"):  # (a setup line printing first)
            return CommandResult(
                0, "module rl loaded\nrlctl-env ready\nrlctl-user=rl\nrlctl-groups=rl wheel\n" + SCONTROL, ""
            )
        if command.startswith("srun"):
            return CommandResult(1, "", "srun: error: Unable to allocate resources: Invalid feature specification")
        return CommandResult(0, "2 idle\n" if "%D %t" in command else "", "")

    def close(self) -> None:
        pass


def _on_submit_host(monkeypatch: pytest.MonkeyPatch, asked: list[str]) -> None:
    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: SubmitHost(asked)))


SITE = {
    "datacenter": "dc",
    "gpu": "CPU",
    "scheduler": {"kind": "slurm", "partition": "gpu", "constraint": "h800&ibx", "reservation": "gone"},
    "nodes": [{"host": "g-[01-03]", "gpus": 4}],
}


def test_check_reach_names_a_job_s_slurm_options_before_its_probe_srun(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's srun was refused on the first wrong option, its raw error one line naming no field (or, for a
    reservation on other nodes, waited out its deadline); sinfo and scontrol now name each, and the probe is not
    run there."""
    from rlctl.commands import check

    asked: list[str] = []
    _on_submit_host(monkeypatch, asked)
    demo = load_job(REPO / "jobs" / "demo.yaml")
    job = Job(demo.spec, Inventory({"local": Site.model_validate(SITE)}, [], ["x"], {"local": "sites.yaml"}), demo.path)
    lines, hosts = check.job_problem_lines(job, timeout_s=1.0)
    said = [line for line in lines if line.startswith("sites.yaml: sites.local.scheduler.")]
    assert [line.split(": ")[1:3] for line in said] == [
        ["sites.local.scheduler.constraint", "'h800&ibx'"],
        ["sites.local.scheduler.reservation", "'gone'"],
    ]
    assert not any("srun" in line for line in lines) and hosts == []
    assert "srun" not in asked and asked[:2] == ["sinfo", "echo"]


def test_check_reach_names_an_inventory_s_slurm_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli) -> None:
    asked: list[str] = []
    _on_submit_host(monkeypatch, asked)
    path = tmp_path / "sites.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"local": SITE}}))
    res = cli("check", str(path), "--reach")
    assert res.exit_code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert [line.split(": ")[3] for line in lines] == [
        "sites.local.scheduler.constraint",
        "sites.local.scheduler.reservation",
    ]
    assert all(line.startswith(f"rlctl: error: {path}: ") for line in lines), lines
    fixed: Callable[[dict], dict] = lambda s: {**s, "scheduler": {"kind": "slurm", "partition": "gpu"}}  # noqa: E731
    path.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"local": fixed(SITE)}}))
    asked[:] = []
    assert cli("check", str(path), "--reach").exit_code == 0 and asked == ["sinfo"]  # nothing more asked


@pytest.mark.parametrize(
    ("said", "field", "value"),
    [
        ("Unable to allocate resources: Invalid account or account/partition combination specified", "account", "'ml'"),
        ("Unable to allocate resources: Invalid qos specification", "qos", "not set (the user's default)"),
        ("invalid partition specified: gpu", "partition", "'gpu'"),
        ("Unable to allocate resources: Access denied to requested reservation", "reservation", "'rl-week'"),
    ],
)
def test_srun_refusing_the_probe_s_step_for_a_site_field_is_that_field_s_line(
    monkeypatch: pytest.MonkeyPatch, said: str, field: str, value: str
) -> None:
    """What sinfo and scontrol cannot tell (an account or qos the cluster does not associate with the user, a
    reservation's access through an account): srun refuses the probe's step, and its raw error was the site's host
    line, naming no field. It is now the field's line, with srun's words."""
    from rlctl.commands import check

    class Refusing(SubmitHost):
        def run(self, command: str, *, timeout_s: float) -> CommandResult:
            if command.startswith("srun"):
                return CommandResult(1, "", f"srun: error: {said}")
            if command.endswith("scontrol show reservation -o"):  # ml's, on the partition's nodes
                return CommandResult(
                    0, "rlctl-user=rl\nReservationName=rl-week Nodes=g-01 Accounts=ml State=ACTIVE", ""
                )
            return super().run(command, timeout_s=timeout_s)

    monkeypatch.setattr(SlurmBackend, "site_runner", classmethod(lambda cls, s, h=None: Refusing([])))
    demo = load_job(REPO / "jobs" / "demo.yaml")
    scheduler = {"kind": "slurm", "partition": "gpu", "account": "ml", "reservation": "rl-week"}
    site = Site.model_validate({**SITE, "scheduler": scheduler})
    job = Job(demo.spec, Inventory({"local": site}, [], ["x"], {"local": "sites.yaml"}), demo.path)
    lines = check.job_problem_lines(job, timeout_s=1.0)[0]
    said_there = [line for line in lines if "srun" in line]
    assert said_there == [
        f"sites.yaml: sites.local.scheduler.{field}: {value}: srun refused the probe's step on partition gpu (srun: "
        f"error: {said}): sbatch refuses every agent's job alike (hint: "
        + {
            "account": "`sacctmgr show assoc user=$USER format=account,partition,qos` lists yours",
            "qos": "`sacctmgr show assoc user=$USER format=account,partition,qos` lists yours",
            "partition": "`sinfo -s` lists the partitions",
            "reservation": "`scontrol show reservation` lists them",
        }[field]
        + ")"
    ]
