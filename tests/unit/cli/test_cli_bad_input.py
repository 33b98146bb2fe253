"""Bad input gets one `rlctl: error:` line naming the file / field / option and what is valid, exit 2 for usage
and config mistakes, no traceback, and loses nothing: a launch into a job's directory, job-dir files cut short or
garbled, RLCTL_HOME that is not a directory, `plan --plot` paths, timeouts, parser errors, a job without logs."""

from __future__ import annotations

import io
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlctl.config import load_job
from rlctl.errors import LaunchError
from rlctl.launch.backends import agents_from_lines, write_sites
from rlctl.launch.jobdir import JobDir
from rlctl.launch.stage import write_staged
from rlctl.ops.jobdb import JobDB, default_home
from tests.conftest import ROOT, CliResult, run_cli

DEMO = ROOT / "jobs" / "demo.yaml"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def one_error(r: CliResult, code: int = 2) -> str:
    """The result's only stderr line (an `rlctl: error:`), checked; its text."""
    assert r.exit_code == code, (r.exit_code, r.stderr)
    assert r.stderr.startswith("rlctl: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr.strip()


def prepared(path: Path) -> JobDir:
    """A job directory as `launch` prepares it (no agent started): job.json, plan.json, sites.json."""
    job = load_job(DEMO)
    jd = JobDir.create("demo", explicit=path)
    jd.write_job(job.spec, source=str(DEMO))
    jd.write_json(jd.plan_json, {"trainer": {"site": "local", "ranks": 1}, "controller_site": "local", "rollout": []})
    write_sites(jd.path, dict(job.inventory.sites))
    return jd


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# -- 1. a fresh launch never overwrites a job -----------------------------------------------------------------
def test_a_launch_into_a_directory_holding_a_job_is_refused_and_writes_nothing(tmp_path: Path, home: Path) -> None:
    jd = prepared(tmp_path / "run")
    before = snapshot(jd.path)
    line = one_error(run_cli("launch", str(DEMO), "--job-dir", str(jd.path)))
    assert f"--job-dir: {jd.path} already holds a job (job.json, plan.json)" in line
    assert f"`rlctl launch --resume {jd.path}`" in line and "choose another --job-dir" in line
    assert snapshot(jd.path) == before and not home.exists()  # nothing written, not even the job index

    job_file = tmp_path / "job.yaml"  # the job file's `job_dir` names it
    data = yaml.safe_load(DEMO.read_text())
    job_file.write_text(
        yaml.safe_dump({**data, "inventory": [str(ROOT / "clusters/local.yaml")], "job_dir": str(jd.path)})
    )
    line = one_error(run_cli("launch", str(job_file)))
    assert f"{job_file}: job_dir: {jd.path} already holds a job" in line and "choose another job_dir" in line
    assert snapshot(jd.path) == before

    dry = run_cli("launch", str(DEMO), "--dry-run", "--job-dir", str(jd.path))  # shows the scripts, notes it
    assert dry.exit_code == 0 and "a launch would be refused" in dry.stderr and "rollout-0" in dry.stdout
    assert snapshot(jd.path) == before


@pytest.mark.parametrize("reach", [False, True])
def test_check_refuses_a_job_file_whose_job_dir_holds_a_job_as_the_launch_does(
    tmp_path: Path, home: Path, reach: bool
) -> None:
    # `rlctl check` passed it, and the launch it promised was refused ("would overwrite it")
    jd = prepared(tmp_path / "run")
    job_file = tmp_path / "job.yaml"
    data = {**yaml.safe_load(DEMO.read_text()), "inventory": [str(ROOT / "clusters/local.yaml")]}
    job_file.write_text(yaml.safe_dump({**data, "job_dir": str(jd.path)}))
    launch = one_error(run_cli("launch", str(job_file)))
    line = one_error(run_cli("check", str(job_file), *(["--reach"] if reach else [])))
    assert line == launch, (line, launch)
    assert line.startswith(f"rlctl: error: {job_file}: job_dir: {jd.path} already holds a job (job.json, plan.json)")
    (tmp_path / "afile").write_text("mine\n")
    job_file.write_text(yaml.safe_dump({**data, "job_dir": str(tmp_path / "afile")}))
    line = one_error(run_cli("check", str(job_file)))
    assert line.startswith(f"rlctl: error: {job_file}: job_dir: {tmp_path / 'afile'} is a file, not a directory"), line
    job_file.write_text(yaml.safe_dump({**data, "job_dir": str(tmp_path / "new")}))  # not there yet: passes
    assert run_cli("check", str(job_file)).exit_code == 0
    assert not (tmp_path / "new").exists()


def test_a_launch_into_the_directory_of_a_job_its_launcher_runs_says_to_watch_it_not_to_resume_it(
    tmp_path: Path, home: Path
) -> None:
    # a job file whose job_dir is fixed, launched again while the job runs: the hint said `rlctl launch --resume DIR`,
    # which that job's launcher refuses (`has a launcher already`)
    jd = prepared(tmp_path / "run")
    with jd.launcher_lock():
        line = one_error(run_cli("launch", str(DEMO), "--job-dir", str(jd.path)))
    assert f"--job-dir: {jd.path} already holds a job (job.json, plan.json)" in line
    assert line.endswith(
        f"(hint: its launcher (pid {os.getpid()} on {socket.gethostname()}) runs it: watch it with "
        f"`rlctl status {jd.path}`, or choose another --job-dir)"
    ), line
    assert "--resume" not in line


def test_a_launch_into_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    line = one_error(run_cli("launch", str(DEMO), "--job-dir", str(tmp_path / "notes.txt")))
    assert f"{tmp_path / 'notes.txt'} is a file, not a directory" in line
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("under", ["file", "proc"])
def test_a_job_dir_that_cannot_be_made_is_refused_by_check_and_launch_writing_nothing(
    tmp_path: Path, home: Path, under: str
) -> None:
    """Below a file, or in /proc (which refuses root a directory that its permission bits allow): `check` passed and
    launch failed at `cannot create job directory`, exit 1, naming neither the field nor the option."""
    (tmp_path / "notes.txt").write_text("mine\n")
    where, says = tmp_path / "notes.txt" / "run", f"{tmp_path / 'notes.txt'} is a file, not a directory"
    if under == "proc":
        where, says = Path("/proc/rlctl-not-made"), "cannot make a directory in /proc"
    job_file = tmp_path / "job.yaml"
    data = yaml.safe_load(DEMO.read_text())
    data |= {"inventory": [str(ROOT / "clusters/local.yaml")], "job_dir": str(where)}
    job_file.write_text(yaml.safe_dump(data))
    for args in (["check"], ["launch"]):
        line = one_error(run_cli(*args, str(job_file)))
        assert line.startswith(f"rlctl: error: {job_file}: job_dir: {where}: {says}"), line
    line = one_error(run_cli("launch", str(DEMO), "--job-dir", str(where)))
    assert line.startswith(f"rlctl: error: --job-dir: {where}: {says}"), line
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and not home.exists()


def test_a_job_dir_named_with_dotdot_is_the_directory_it_names_and_the_root_is_refused(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--job-dir ..` gave the job the id '..' (a site's job dir W/jobs/.. is its work root itself), and `--job-dir /`
    (from /) the id ''; a `..` inside the path is resolved, the root refused in one line, nothing written."""
    from rlctl.launch.jobdir import JobDir

    monkeypatch.chdir(tmp_path)
    assert JobDir.choose_path("demo", explicit="a/../runs/..") == tmp_path and JobDir(tmp_path).id == tmp_path.name
    line = one_error(run_cli("launch", str(DEMO), "--job-dir", "/tmp/../"))
    assert line.startswith("rlctl: error: --job-dir: / is the filesystem's root, not a job directory"), line
    # --dry-run rendered it with the id '' (`#SBATCH --job-name=rlctl--trainer`, the sites' job dir ~/.rlctl/jobs/,
    # every job's) under a note: refused in the same line, nothing rendered
    dry = run_cli("launch", str(DEMO), "--dry-run", "--job-dir", "/")
    assert dry.stdout == "" and one_error(dry) == line
    assert not home.exists()


def test_a_new_job_dir_that_cannot_be_made_is_refused_before_preflight_naming_no_flag(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --job-dir, no job_dir field, and runs/ under RLCTL_HOME a file: refused once the job was checked, with
    '--job-dir: …/runs/demo-…: … is a file', naming a flag the launch was not given."""
    from rlctl.ops import preflight

    home.mkdir()
    (home / "runs").write_text("mine\n")
    checked: list[object] = []
    monkeypatch.setattr(preflight, "preflight", lambda *a, **_: checked.append(a))
    line = one_error(run_cli("launch", str(DEMO)))
    assert line.startswith(f"rlctl: error: the job's new directory: {home / 'runs'}/demo-"), line
    assert line.endswith(
        f": {home / 'runs'} is a file, not a directory (hint: name one with --job-dir (or the job file's job_dir), "
        "or set RLCTL_HOME to a directory you may write in (its runs/ holds them))"
    ), line
    assert checked == [] and (home / "runs").read_text() == "mine\n"


# -- 2. job-dir files cut short or garbled ------------------------------------------------------------------
def test_a_jsonl_skips_a_last_line_cut_short_and_names_any_other_bad_line(tmp_path: Path) -> None:
    jd = prepared(tmp_path / "run")
    jd.metrics.write_text('{"iteration": 0}\n{"iteration": 1}\n{"iterat')  # a writer in the middle of its line
    assert [r["iteration"] for r in jd.read_lines(jd.metrics)] == [0, 1]
    jd.metrics.write_text('{"iteration": 0}\n{"iterat\n{"iteration": 2}\n')
    with pytest.raises(LaunchError, match=rf"^{jd.metrics}: line 2 is not valid JSON"):
        jd.read_lines(jd.metrics)
    jd.metrics.write_text('{"iteration": 0}\n[1, 2]\n{"iteration": 2}\n')
    with pytest.raises(LaunchError, match=rf"^{jd.metrics}: line 2 is list, not a JSON object"):
        jd.read_lines(jd.metrics)
    with pytest.raises(LaunchError, match=r"^agents.jsonl: record 1 is not an agent record: no role$"):
        agents_from_lines('{"name": "rollout-0"}\n')
    assert agents_from_lines('{"name": "rollout-0", "ro') == []


@pytest.mark.parametrize("value", ['"5"', "null", "1.5", "true"])
def test_an_agent_record_whose_pid_or_pgid_is_no_integer_is_named_not_a_traceback_later(value: str) -> None:
    # a hand-edited agents.jsonl's "pgid": "5" was read as a handle, and polling or stopping its agent raised a
    # TypeError ('<' not supported between instances of 'int' and 'NoneType') from procfs.possible
    row = {"name": "rollout-0", "role": "rollout", "replica": 0, "site": "local", "backend": "local"}
    good = json.dumps({**row, "ident": {"pid": 7, "pgid": 7}})
    bad = json.dumps({**row, "name": "rollout-1", "replica": 1, "ident": {"pid": 8, "pgid": json.loads(value)}})
    with pytest.raises(LaunchError, match=r"^agents.jsonl: record 2 is not an agent record: ident.pgid is "):
        agents_from_lines(f"{good}\n{bad}\n{good}\n")
    skipped: list[str] = []
    assert [h.spec.name for h in agents_from_lines(f"{good}\n{bad}\n{good}\n", skipped=skipped)] == ["rollout-0"]
    said = f"ident.pgid is {value}, not an integer"  # as the record writes it
    assert skipped == [f"agents.jsonl: record 2 is not an agent record: {said}: left out"]


SSH_IDENT = {"host": "h1", "pid": 8, "pgid": 8, "start_ticks": 1, "exitfile": "/w/rollout-1.exit"}
# as a slurm site's submit records it
SLURM_IDENT = {"job_id": "4242", "submitter": "sbatch", "job_name": "rlctl-j-rollout-1", "stopped": False}
GOOD_IDENT = {"local": {"pid": 7, "pgid": 7}, "ssh": SSH_IDENT, "slurm": SLURM_IDENT}


@pytest.mark.parametrize(
    ("backend", "ident", "says"),
    [
        ("local", {"pid": 8}, "ident has no pgid"),
        ("local", {"pgid": 8}, "ident has no pid"),
        ("local", {"pid": 8, "pgid": 8, "start_ticks": "5"}, 'ident.start_ticks is "5", not an integer'),
        *(("ssh", {k: v for k, v in SSH_IDENT.items() if k != gone}, f"ident has no {gone}") for gone in SSH_IDENT),
        ("ssh", SSH_IDENT | {"host": 5}, "ident.host is 5, not a string"),
        ("slurm", {k: v for k, v in SLURM_IDENT.items() if k != "job_id"}, "ident has no job_id"),
        ("slurm", SLURM_IDENT | {"job_id": 4242}, "ident.job_id is 4242, not a string"),
    ],
)
def test_an_agent_record_without_a_field_its_poll_or_stop_reads_is_named_not_a_key_error_later(
    backend: str, ident: dict[str, object], says: str
) -> None:
    # a hand-edited agents.jsonl's local record without its pgid was read as a handle, and `rlctl stop` raised a
    # KeyError ('pgid') from the local backend's signal, stopping none of the agents after it; an ssh record without
    # its host, pid, pgid or start_ticks, the same from its stop script (its exitfile: from `rlctl status`'s poll);
    # a slurm record without its job_id, the same from every squeue, scancel and sacct of its poll and stop
    row = {"name": "rollout-0", "role": "rollout", "replica": 0, "site": "s", "backend": backend}
    good = json.dumps({**row, "ident": GOOD_IDENT[backend]})
    bad = json.dumps({**row, "name": "rollout-1", "replica": 1, "ident": ident})
    skipped: list[str] = []
    assert [h.spec.name for h in agents_from_lines(f"{good}\n{bad}\n", skipped=skipped)] == ["rollout-0"]
    assert skipped == [f"agents.jsonl: record 2 is not an agent record: {says}: left out"]


def test_stop_stops_every_agent_past_a_record_without_its_pgid_and_names_that_record(tmp_path: Path) -> None:
    # its KeyError ('pgid') was a traceback, and the agents recorded after it were never signalled
    jd = prepared(tmp_path / "run")
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        row = {"role": "rollout", "site": "local", "backend": "local", "host": None, "gpus": None, "log": None}
        records = [
            row | {"name": "rollout-0", "replica": 0, "ident": {"pid": agent.pid}},
            row | {"name": "rollout-1", "replica": 1, "ident": {"pid": agent.pid, "pgid": agent.pid}},
        ]
        (jd.path / "agents.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        line = one_error(run_cli("stop", str(jd.path), "--grace", "5"), code=3)
        assert line.endswith(f"{jd.path}/agents.jsonl: record 1 is not an agent record: ident has no pgid: left out"), (
            line
        )
        assert agent.wait(timeout=30) == -signal.SIGTERM
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"site": None}, "site is null, not a string"),
        ({"replica": "1"}, 'replica is "1", not an integer'),
        ({"ident": [["pid", 8]]}, 'ident is [["pid", 8]], not a JSON object'),
        ({"gpus": [0, "1"], "host": "h"}, 'gpus is [0, "1"], not a list of integers'),
        ({"gpus": [0]}, "host is null, not a string"),
        ({"log": 5}, "log is 5, not a string"),
    ],
)
def test_an_agent_record_of_a_field_of_another_type_is_named_by_its_field(edit: dict[str, object], says: str) -> None:
    # "site": null was read as a handle (rlctl stop then refused whole, blaming sites.json for "no site None"); an
    # ident of pairs said "dictionary update sequence element #0 has length 1", naming no field
    row = {"name": "rollout-0", "role": "rollout", "replica": 0, "site": "s", "backend": "local"}
    good = json.dumps({**row, "ident": {"pid": 7, "pgid": 7}})
    bad = json.dumps({**row, "name": "rollout-1", "replica": 1, "ident": {"pid": 8, "pgid": 8}} | edit)
    skipped: list[str] = []
    assert [h.spec.name for h in agents_from_lines(f"{good}\n{bad}\n", skipped=skipped)] == ["rollout-0"]
    assert skipped == [f"agents.jsonl: record 2 is not an agent record: {says}: left out"]


def test_stop_stops_every_agent_past_a_record_without_a_site_and_names_that_record(tmp_path: Path) -> None:
    # one record's "site": null made `rlctl stop` refuse whole ("sites.json: no site None, where the job's record
    # places an agent"), stopping none of the job's agents
    jd = prepared(tmp_path / "run")
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        row = {"role": "rollout", "site": "local", "backend": "local", "host": None, "gpus": None, "log": None}
        ident = {"pid": agent.pid, "pgid": agent.pid}
        records = [
            row | {"name": "rollout-0", "replica": 0, "site": None, "ident": ident},
            row | {"name": "rollout-1", "replica": 1, "ident": ident},
        ]
        (jd.path / "agents.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        line = one_error(run_cli("stop", str(jd.path), "--grace", "5"), code=3)
        assert line.endswith(
            f"{jd.path}/agents.jsonl: record 1 is not an agent record: site is null, not a string: left out"
        ), line
        assert agent.wait(timeout=30) == -signal.SIGTERM
    finally:
        agent.kill()
        agent.wait()


def test_status_reads_past_a_metrics_line_being_written(tmp_path: Path) -> None:
    jd = prepared(tmp_path / "run")
    jd.metrics.write_text('{"iteration": 4, "reward_mean": 0.5, "t": 1}\n{"iterat')
    r = run_cli("status", str(jd.path), "-o", "json")
    assert r.exit_code == 3 and "Traceback" not in r.stderr, r.stderr  # no controller: partial, as before
    assert json.loads(r.stdout)["last_iteration"]["iteration"] == 4


def test_status_of_an_ended_job_parses_its_last_metrics_row_not_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it parsed every row of metrics.jsonl to show the last (10⁴ after weeks, at each poll of `status -w`); a line
    # the job damaged long before (a controller killed mid-write, then resumed) failed every status since
    jd = prepared(tmp_path / "run")
    rows = [{"iteration": i, "reward_mean": 0.5, "t": 1.0} for i in range(300)]
    jd.metrics.write_text('{"iterat\n' + "".join(json.dumps(r) + "\n" for r in rows))
    parsed: list[object] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda s, *a, **k: parsed.append(s) or loads(s, *a, **k))
    r = run_cli("status", str(jd.path), "-o", "json")
    monkeypatch.setattr(json, "loads", loads)
    assert r.exit_code == 3 and "Traceback" not in r.stderr, r.stderr  # no controller: partial, as before
    assert json.loads(r.stdout)["last_iteration"]["iteration"] == 299
    assert len([s for s in parsed if b"reward_mean" in (s if isinstance(s, bytes) else s.encode())]) == 1


def test_status_watch_with_stdout_closed_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlctl status -w JOB >&-` (no stdout at all): the watch asked stdout whether it is a terminal first, a
    traceback (AttributeError: 'NoneType' object has no attribute 'isatty'), not the line every other command says."""
    from rlctl.cli import main

    jd = prepared(tmp_path / "run")
    monkeypatch.setattr(sys, "argv", ["rlctl", "status", "-w", str(jd.path)])
    err = io.StringIO()
    with redirect_stdout(None), redirect_stderr(err), pytest.raises(SystemExit) as e:
        main()
    assert (e.value.code, err.getvalue()) == (
        1,
        "rlctl: error: stdout is closed: nothing can be written (hint: redirect it instead, e.g. > /dev/null)\n",
    )


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        # (the line before the last, that one being written: status reads the last whole row, from the file's end)
        ("metrics.jsonl", '{"iteration": 0}\n{"iterat\n{"iteration": 1', "metrics.jsonl: line 2 is not valid JSON"),
        ("metrics.jsonl", '{"iteration": 0}\n[1, 2]\n', "metrics.jsonl: line 2 is list, not a JSON object"),
        ("sites.json", "garbage", "sites.json: not valid JSON"),
        ("sites.json", '[{"name": "local", "site": {"gpu": "CPU"}}]', "sites.json: [0].site.datacenter: "),
        ("summary.json", '{"state": "do', "summary.json: not valid JSON"),
        ("summary.json", "[]", "summary.json: not a JSON object but list"),
    ],
)
def test_status_on_a_garbled_job_file_is_one_line_naming_it(tmp_path: Path, name: str, text: str, says: str) -> None:
    jd = prepared(tmp_path / "run")
    (jd.path / name).write_text(text)
    assert f"{jd.path}/{says}" in one_error(run_cli("status", str(jd.path)), code=1)
    if name == "sites.json":
        assert f"{jd.path}/{says}" in one_error(run_cli("stop", str(jd.path)), code=1)


@pytest.mark.parametrize("text", ['{"state": "do', "[]"])
def test_a_damaged_summary_is_its_run_s_end_as_the_events_say_for_every_command(tmp_path: Path, text: str) -> None:
    """summary.json is written whole (renamed into place), the run's `job_end` event beside it: one that does not
    read (edited, damaged) is the run's end as its events say, for every command. A plain `launch --resume` of the
    finished job, `scale` and `report` failed on it (exit 1, `rlctl: error: …summary.json: not valid JSON`) where
    `launch --resume --iterations` read it as no summary and went ahead; with no `job_end` of the run to read, status
    and a plain resume say the same one line naming the file (`test_status_on_a_garbled_job_file_is_one_line…`)."""
    jd = prepared(tmp_path / "run")
    jd.event("agent_started", agent="controller-0", run="r1")
    planned = jd.read_job().iterations
    jd.event("job_end", state="done", iterations=planned)
    jd.summary_json.write_text(text)
    r = run_cli("status", str(jd.path))
    assert r.exit_code == 0 and f"ended       after {planned} iterations: done" in r.stdout, r.stderr  # was: exit 1
    finished = one_error(run_cli("launch", "--resume", str(jd.path)))  # was: exit 1, summary.json: not valid JSON
    assert f"finished ({planned}/{planned} iterations); nothing to resume" in finished
    assert "ended (done): nothing to scale" in one_error(run_cli("scale", str(jd.path), "--rollout", "+1"))
    r = run_cli("report", str(jd.path))
    assert r.exit_code == 0 and (jd.path / "report.html").is_file(), r.stderr
    bare = prepared(tmp_path / "bare")  # its run's end not in its events
    bare.event("agent_started", agent="controller-0", run="r1")
    bare.summary_json.write_text(text)
    said = one_error(run_cli("status", str(bare.path)), code=1)
    assert one_error(run_cli("launch", "--resume", str(bare.path)), code=1) == said
    assert f"{bare.summary_json}: " in said and "put it back from a copy, or move it aside" in said


def test_status_of_a_summary_without_its_state_or_iterations_says_none(tmp_path: Path) -> None:
    # edited by hand: a KeyError traceback in the table
    jd = prepared(tmp_path / "run")
    for summary, says in (({"iterations": 4}, "after 4 iterations: no state"), ({"state": "done"}, "after - iter")):
        jd.write_json(jd.summary_json, summary)
        r = run_cli("status", str(jd.path))
        assert "Traceback" not in r.stderr and says in r.stdout, r.stderr


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("t", "x", "(- s ago)"),
        ("reward_mean", "abc", "reward abc,"),
        ("t_gen_s", [1], "T_gen [1] s"),
        ("delta_s", True, ""),  # (not in the table: its JSON)
    ],
)
def test_status_of_an_ended_job_shows_a_metrics_figure_that_is_not_a_number_as_it_is(
    tmp_path: Path, field: str, value: object, shown: str
) -> None:
    # as the live view shows one (`_f`): was a ValueError traceback (float('x') of its time, format('abc', '.3f') of its
    # reward), then an error that failed the whole status (its agents, its summary unseen) for one figure edited by hand
    jd = prepared(tmp_path / "run")
    row = {"iteration": 4, "reward_mean": 0.5, "t_gen_s": 1.0, "t_train_s": 1.0, "delta_s": 0.0, "t": 1.0}
    jd.metrics.write_text(json.dumps(row | {field: value}) + "\n")
    r = run_cli("status", str(jd.path))
    assert "Traceback" not in r.stderr and "not a number" not in r.stderr, r.stderr
    assert "iterations done  5; the last: reward" in r.stdout and shown in r.stdout
    out = json.loads(run_cli("status", str(jd.path), "-o", "json").stdout)
    assert out["iterations_done"] == 5
    assert out["figures_age_s"] is None if field == "t" else out["last_iteration"][field] == value


def test_status_on_a_metrics_row_whose_time_is_null_says_its_figures_age_as_none(tmp_path: Path) -> None:
    # null passes as "no figure" for each of them: float(None) of its time was a TypeError traceback
    jd = prepared(tmp_path / "run")
    row = {"iteration": 4, "reward_mean": 0.5, "t_gen_s": 1.0, "t_train_s": 1.0, "delta_s": 0.0, "t": None}
    jd.metrics.write_text(json.dumps(row) + "\n")
    r = run_cli("status", str(jd.path))
    assert "Traceback" not in r.stderr and "iterations done  5; the last: reward 0.500" in r.stdout, r.stderr
    assert "T_train 1.00 s (- s ago)" in r.stdout


def test_status_on_an_evaluation_row_whose_version_is_not_a_number_is_one_line(tmp_path: Path) -> None:
    # a ValueError traceback: int('x') of its version (the rows are ordered by it)
    jd = prepared(tmp_path / "run")
    row = {"version": "x"}
    jd.evaluations.write_text(json.dumps({"version": 0, "greedy_reward": 0.5}) + "\n" + json.dumps(row) + "\n")
    line = one_error(run_cli("status", str(jd.path)), code=1)
    assert line.startswith(f"rlctl: error: {jd.evaluations}: row 2: 'version' is 'x', not a number")
    assert line.endswith("(hint: was it edited?)")


def test_status_of_an_ended_job_shows_a_greedy_figure_that_is_not_a_number_as_it_is(tmp_path: Path) -> None:
    # as the live view shows one (`_f`): was format('a', '.3f')'s traceback, then an error failing the whole status
    jd = prepared(tmp_path / "run")
    row = {"version": 3, "greedy_reward": "a", "prompts": 8}
    jd.evaluations.write_text(json.dumps({"version": 0, "greedy_reward": 0.5}) + "\n" + json.dumps(row) + "\n")
    r = run_cli("status", str(jd.path))
    assert "Traceback" not in r.stderr and "not a number" not in r.stderr, r.stderr
    assert "v3: greedy reward a  (first v0: greedy reward 0.500)  over 8 prompts" in r.stdout


def test_status_of_a_staged_job_whose_sites_json_is_garbled_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # staged.json there (every launched job): two warnings naming it came first ("cannot fetch the record from the
    # controller's site", "the controller site's agent record is unreachable"), then the error
    jd = prepared(tmp_path / "run")
    write_staged(jd.path, {"local": {"roots": {"localhost": str(jd.path)}, "files": []}})
    (jd.path / "sites.json").write_text("garbage")
    assert f"{jd.path}/sites.json: not valid JSON" in one_error(run_cli("status", str(jd.path)), code=1)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("garbage", "not valid JSON"),
        ('{"address": 5}', 'no controller address (want {"address": "tcp://HOST:PORT", …}, got {"address": 5})'),
        ('{"address": "127.0.0.1:1"}', "address: address '127.0.0.1:1' is not a tcp address; expected tcp://"),
    ],
)
def test_a_garbled_controller_json_is_named_by_status_scale_and_stop(tmp_path: Path, text: str, says: str) -> None:
    jd = prepared(tmp_path / "run")
    jd.controller_json.write_text(text)
    status = run_cli("status", str(jd.path))
    assert f"partial status: controller error: {jd.controller_json}: {says}" in one_error(status, code=3)
    assert f"{jd.controller_json}: {says}" in one_error(run_cli("scale", str(jd.path), "--no-wait"), code=1)
    stop = run_cli("stop", str(jd.path), "-o", "json")  # forced all the same: every recorded agent is stopped
    assert stop.exit_code == 0, stop.stderr
    assert json.loads(stop.stdout)["graceful"].startswith(f"controller did not answer ({jd.controller_json}: ")


# -- 3. RLCTL_HOME -------------------------------------------------------------------------------------------
def test_rlctl_home_that_is_a_file_is_one_line_and_an_empty_one_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "home-file").write_text("")
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home-file"))
    line = one_error(run_cli("status", "--all"))
    assert f"RLCTL_HOME={tmp_path / 'home-file'}: not a directory" in line
    monkeypatch.setenv("RLCTL_HOME", "")
    assert default_home() == Path.home() / ".rlctl"


# -- 4. plan --plot ------------------------------------------------------------------------------------------
def test_plan_plot_paths_are_checked_before_planning_and_the_written_one_is_named(tmp_path: Path) -> None:
    line = one_error(run_cli("plan", str(DEMO), "--plot", str(tmp_path / "no" / "x.png")))
    assert f"--plot {tmp_path / 'no' / 'x.png'}: no such directory {tmp_path / 'no'}" in line
    line = one_error(run_cli("plan", str(DEMO), "--plot", str(tmp_path / "out.txt")))
    assert "cannot write a '.txt' image; valid suffixes: " in line and "png" in line and "svg" in line
    assert f"--plot {tmp_path}: is a directory" in one_error(run_cli("plan", str(DEMO), "--plot", str(tmp_path)))
    r = run_cli("plan", str(DEMO), "--plot", str(tmp_path / "breakdown"))
    assert r.exit_code == 0, r.stderr
    assert r.stderr == f"wrote {tmp_path / 'breakdown.png'}\n"
    assert (tmp_path / "breakdown.png").read_bytes()[:4] == b"\x89PNG"


def test_profile_of_a_model_path_that_is_no_directory_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`profile -m /nonexistent` (a path: a '/' in it, or a file there) says there is no such directory, versus
    "unknown model '/nonexistent'; known: …" (the built-in names, for a name no one meant as one); a bare name that is
    no file keeps the names known."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("")
    local = str(ROOT / "clusters" / "local.yaml")
    tail = "; a Hugging Face checkpoint is a directory holding config.json and the weights (hint: give the checkpoint's"
    for model, said in (
        (str(tmp_path / "nonexistent"), "no such directory"),
        ("models/qwen", "no such directory"),
        ("notes.txt", "is not a directory"),
    ):
        line = one_error(run_cli("profile", "-m", model, "-c", local))
        assert line.startswith(f"rlctl: error: --model {model}: {said}{tail}"), line
    assert "--model: unknown model 'qwen2.5-7'; known: " in one_error(
        run_cli("profile", "-m", "qwen2.5-7", "-c", local)
    )


def test_profile_without_job_names_the_option_missing() -> None:
    """`profile -m phi4-14b` (no -c) names --cluster as what is missing, versus 'give --cluster and --model, or
    --job' with --model given; -c alone names --model; neither, both."""
    local = str(ROOT / "clusters" / "local.yaml")
    assert one_error(run_cli("profile", "-m", "phi4-14b")) == (
        "rlctl: error: --model needs --cluster: the inventory file(s) whose sites to profile (-c clusters/local.yaml); "
        "or --job"
    )
    assert one_error(run_cli("profile", "-c", local)).startswith("rlctl: error: --cluster needs --model: a built-in ")
    assert one_error(run_cli("profile")) == "rlctl: error: give --cluster and --model, or --job"


def test_plan_profile_not_there_is_the_option_s_one_line(tmp_path: Path) -> None:
    """`plan --profile nope.yaml` said 'nope.yaml: no such file', naming no option (the job's planning.profile is
    said alike, with its field): '--profile nope.yaml: no such file', as --plot's lines; a directory alike."""
    nope = tmp_path / "nope.yaml"
    r = run_cli("plan", str(DEMO), "--profile", str(nope))
    assert (r.exit_code, r.stderr) == (2, f"rlctl: error: --profile {nope}: no such file\n"), r
    r = run_cli("plan", str(DEMO), "--profile", str(tmp_path))
    assert (r.exit_code, r.stderr) == (2, f"rlctl: error: --profile {tmp_path}: is a directory, expected a YAML file\n")
    r = run_cli("plan", str(DEMO), "--profile", str(DEMO))  # a file there, of another kind: the file's own line
    assert r.exit_code == 2 and r.stderr.startswith(f"rlctl: error: {DEMO}: kind: must be 'Profile'"), r.stderr


def test_plan_plot_a_path_the_write_is_refused_at_is_the_option_s_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --plot path that passes the checks before planning and is refused as the PNG is written (a folder not this
    user's: root writes anything, so the refusal is made here): the operator's path, exit 2 as --plot's other lines
    and profile -o's, pull --to's, versus exit 1."""
    from matplotlib.figure import Figure

    def refused(self: Figure, path: object, **_: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Figure, "savefig", refused)
    png = tmp_path / "x.png"
    r = run_cli("plan", str(DEMO), "--plot", str(png))
    line = f"rlctl: error: --plot {png}: cannot write: Permission denied (hint: write elsewhere)\n"
    assert (r.exit_code, r.stderr) == (2, line), r


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        ([1, 2], "(top level): a JSON list, where the plan is an object"),
        ({"rollout": []}, "trainer: no object with a site name"),
        ({"trainer": {"site": "local", "ranks": "x"}, "rollout": []}, "trainer.ranks: 'x' is not a count of 1 or more"),
        ({"trainer": {"site": "local", "ranks": 1}, "rollout": {}}, "rollout: no list of rollout groups"),
        (
            {"trainer": {"site": "local", "ranks": 1}, "rollout": [{"site": "local", "units": -1}]},
            "rollout[0].units: -1 is not a count of 0 or more",
        ),
        (
            {"trainer": {"site": "local", "ranks": 1, "parallel": {"tp": 0, "pp": 1, "dp": 1}}, "rollout": []},
            "trainer.parallel.tp: 0 is not a count of 1 or more",
        ),
        ({"trainer": {"site": "local", "ranks": 1}, "rollout": []}, "controller_site: None is not a site name"),
    ],
)
def test_a_resume_of_a_job_whose_plan_json_was_edited_out_of_shape_names_the_field(
    tmp_path: Path, plan: Any, says: str
) -> None:
    """It stopped on a KeyError, TypeError or ValueError traceback as it laid out the agents, after it took the job's
    launcher lock and wrote its events."""
    jd = prepared(tmp_path / "run")
    jd.write_json(jd.plan_json, plan)
    before = snapshot(jd.path)
    line = one_error(run_cli("launch", "--resume", str(jd.path)), code=1)
    assert line.startswith(f"rlctl: error: {jd.plan_json}: {says} (hint: was it edited?"), line
    assert snapshot(jd.path) == before


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (
            {"trainer": {"site": "nosuch", "ranks": 1}, "rollout": [], "controller_site": "local"},
            "the plan places trainer 1 rank(s) on site 'nosuch', which is not among the job's sites (local)",
        ),
        (
            {"trainer": {"site": "local", "ranks": 1}, "rollout": [], "controller_site": "gone"},
            "the plan places the controller on site 'gone', which is not among the job's sites (local)",
        ),
    ],
)
def test_a_resume_whose_plan_names_a_site_the_job_lacks_says_so(tmp_path: Path, plan: Any, says: str) -> None:
    """It stopped on a KeyError traceback as it counted the sites' GPUs."""
    jd = prepared(tmp_path / "run")
    jd.write_json(jd.plan_json, plan)
    line = one_error(run_cli("launch", "--resume", str(jd.path)), code=1)
    assert line.startswith(f"rlctl: error: {says} (hint: was the job dir's plan.json or sites.json edited?"), line


# -- 5. timeouts ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_check_reach_timeout_must_be_a_positive_number_of_seconds(value: str) -> None:
    line = one_error(run_cli("check", str(ROOT / "clusters/local.yaml"), "--reach", "--timeout", value))
    assert "Invalid value for '--timeout'" in line and "is not a number of seconds ≥ 0.1" in line


@pytest.mark.parametrize(
    "args",
    [
        ["status", "myjob", "--timeout", "1e12"],  # it waited on a queue: OverflowError, a traceback
        ["status", "myjob", "-w", "--interval", "1e12"],
        ["stop", "myjob", "--grace", "1e12"],
        ["scale", "myjob", "--rollout", "+1", "--wait", "--timeout", "1e12"],
        ["check", str(ROOT / "clusters/local.yaml"), "--reach", "--timeout", "1e12"],
    ],
)
def test_an_option_in_seconds_is_at_most_a_week(args: list[str]) -> None:
    line = one_error(run_cli(*args))
    assert "1e+12 s is more than a week; valid: " in line and " to 604800 s (7 days)" in line, line


# -- 6. a profile's empty generation curve -------------------------------------------------------------------
def demo_profile_edited(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """The demo job's profile, written by `rlctl profile --job`, with `edit` made to its data."""
    prof = tmp_path / "prof.yaml"
    made = run_cli("profile", "--job", str(DEMO), "-o", str(prof))
    assert made.exit_code == 0, made.stderr
    data = yaml.safe_load(prof.read_text())
    edit(data)
    prof.write_text(yaml.safe_dump(data))
    return prof


def test_a_profile_written_to_a_json_file_is_json(tmp_path: Path) -> None:
    """`rlctl profile -o x.json` wrote YAML into x.json (a JSON reader refused it); the plan reads either."""
    import json

    made = run_cli("profile", "--job", str(DEMO), "-o", str(tmp_path / "prof.json"))
    assert made.exit_code == 0, made.stderr
    data = json.loads((tmp_path / "prof.json").read_text())
    assert data["kind"] == "Profile" and "local" in data["sites"]
    assert run_cli("plan", str(DEMO), "--profile", str(tmp_path / "prof.json")).exit_code == 0


@pytest.mark.parametrize(
    ("name", "content", "holds"),
    [
        ("job.yaml", DEMO.read_text(), "a file of kind 'Job'"),
        ("local.yaml", (ROOT / "clusters" / "local.yaml").read_text(), "a file of kind 'Inventory'"),
        ("data.jsonl", '{"prompt": "1 2 =", "ground_truth": "a b"}\n', "a file that is no profile"),
        ("reward.py", "def f(*a):\n    return 0.0\n", "a file that is no profile"),
    ],
)
def test_a_profile_is_not_written_over_a_file_that_is_no_profile(
    tmp_path: Path, name: str, content: str, holds: str
) -> None:
    """`rlctl profile -o jobs/demo.yaml` wrote the profile over the job file, exit 0: the job was lost."""
    path = tmp_path / name
    path.write_text(content)
    line = one_error(run_cli("profile", "--job", str(DEMO), "-o", str(path)))
    assert line.startswith(f"rlctl: error: -o {path}: holds {holds}; the profile written there would replace it"), line
    assert path.read_text() == content


def test_a_profile_is_written_over_an_earlier_profile_or_an_empty_file(tmp_path: Path) -> None:
    prof, empty = tmp_path / "prof.yaml", tmp_path / "empty.yaml"
    empty.write_text("")
    for path in (prof, prof, empty):
        made = run_cli("profile", "--job", str(DEMO), "-o", str(path))
        assert made.exit_code == 0, made.stderr
        assert yaml.safe_load(path.read_text())["kind"] == "Profile"


def test_a_profile_without_generation_entries_for_a_rollout_site_names_the_file_and_field(tmp_path: Path) -> None:
    prof = demo_profile_edited(tmp_path, lambda d: d["sites"]["local"].update(generation=[]))
    line = one_error(run_cli("plan", str(DEMO), "--profile", str(prof)))
    assert line.startswith(f"rlctl: error: {prof}: sites.local.generation: empty: the job generates on this site")


def test_a_profile_without_training_entries_for_the_trainer_s_site_names_the_file_and_field(tmp_path: Path) -> None:
    """It said 'jobs/demo.yaml: placement.trainer.gpus: 1: tiny-demo training state does not fit in 1 × CPU …
    (FSDP2 shards it over 2 or more)': of a model of 345k parameters, and of the job, not the profile."""
    prof = demo_profile_edited(tmp_path, lambda d: d["sites"]["local"].update(training=[]))
    line = one_error(run_cli("plan", str(DEMO), "--profile", str(prof)))
    assert line.startswith(f"rlctl: error: {prof}: sites.local.training: empty: the job trains on this site")


def test_a_bad_key_of_a_profile_s_model_is_named(tmp_path: Path) -> None:
    """A profile's `model` is a mapping of keys, not a job's model told apart by its kind: the key was dropped as if it
    were the kind's tag ('prof.yaml: model: Input should be greater than 0')."""
    prof = demo_profile_edited(tmp_path, lambda d: d["model"].update(layers=0))
    line = one_error(run_cli("plan", str(DEMO), "--profile", str(prof)))
    assert line == f"rlctl: error: {prof}: model.layers: Input should be greater than 0"


# -- 7. the parser's errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["launch", "x.yaml", "--iterations", "abc"], "Invalid value for '--iterations': "),
        # taken, unchecked (the job file's own count is): the launched controller failed at its start (msgpack)
        (
            ["launch", str(DEMO), "--dry-run", "--iterations", "100000000000000000000"],
            "Invalid value for '--iterations': Input should be less than or equal to 1000000000",
        ),
        (
            ["launch", "--resume", "myjob", "--iterations", "100000000000000000000"],
            "Invalid value for '--iterations': Input should be less than or equal to 1000000000",
        ),
        (["version", "-o", "xml"], "Invalid value for '--output' / '-o': 'xml' is not one of 'table', 'json'."),
        (["plan"], "Missing argument 'job'. (hint: `rlctl plan --help`)"),
        (["no-such-command"], "No such command 'no-such-command'."),
        (["launch", str(DEMO), "--dry-run", "--detach"], "--dry-run starts nothing: it takes no --detach"),
        (["status", "--all", "myjob"], "--all lists every job: it takes no JOB ('myjob'); `rlctl status myjob` shows"),
        # as a shell reads it: a job dir with a space was printed bare, which a shell splits
        (["status", "--all", "my run (2)"], "it takes no JOB ('my run (2)'); `rlctl status 'my run (2)'` shows that"),
        (["status", "--all", "-w"], "--all lists every job once: it takes no --watch; `rlctl status -w JOB` follows"),
        # a job file with an inventory: it was read as an inventory ("kind: must be 'Inventory' …, got 'Job'")
        (["check", str(DEMO), str(ROOT / "clusters" / "local.yaml")], f"{DEMO}: a job file is checked alone"),
        # profile's -o is a file: `-o json` (other commands' output format) wrote a profile named `json`
        (["profile", "--job", str(DEMO), "-o", "json"], "-o json: profile's -o is the file to write (a YAML profile)"),
    ],
)
def test_a_usage_error_is_one_line(args: list[str], says: str) -> None:
    assert says in one_error(run_cli(*args))


def test_help_and_no_arguments_still_print_the_help() -> None:
    r = run_cli("launch", "--help")
    assert r.exit_code == 0 and "Usage: rlctl launch" in r.stdout and r.stderr == ""
    r = run_cli()
    assert r.exit_code == 2 and "Usage: rlctl" in r.stdout and "launch" in r.stdout and r.stderr == ""


# -- 8. a job without logs -----------------------------------------------------------------------------------
def test_logs_of_a_job_without_any_says_so(tmp_path: Path) -> None:
    jd = prepared(tmp_path / "run")
    assert f"job run: no logs yet: none of its agents has started (no {jd.path}/logs/*.log)" in one_error(
        run_cli("logs", str(jd.path))
    )


def test_logs_of_a_job_without_any_hint_its_status_as_a_shell_reads_it(tmp_path: Path) -> None:
    """A job dir `my run (2)`: the hint said `rlctl status /…/my run (2)`, which a shell splits and refuses."""
    jd = prepared(tmp_path / "my run (2)")
    line = one_error(run_cli("logs", str(jd.path)))
    assert f"(hint: `rlctl status {shlex.quote(str(jd.path))}` says where it stands)" in line, line


def test_logs_of_every_agent_show_the_lines_n_asks_for_each(tmp_path: Path) -> None:
    # without an agent, -n was ignored: always 10 lines per agent
    jd = prepared(tmp_path / "run")
    (jd.path / "logs").mkdir(exist_ok=True)
    for name in ("controller-0", "rollout-0"):
        (jd.path / "logs" / f"{name}.log").write_text("".join(f"{name} line {i}\n" for i in range(60)))

    def shown(*args: str) -> list[str]:
        r = run_cli("logs", str(jd.path), *args)
        assert r.exit_code == 0, r.stderr
        return r.stdout.splitlines()

    three = ["==> controller-0 <=="] + [f"controller-0 line {i}" for i in (57, 58, 59)]
    assert shown("-n", "3") == three + ["==> rollout-0 <=="] + [f"rollout-0 line {i}" for i in (57, 58, 59)]
    assert len(shown()) == 2 * (1 + 10)  # the default: 10 lines of each
    assert len(shown("controller")) == 40 and len(shown("controller", "-n", "2")) == 2  # one agent's: 40


def test_logs_of_a_recorded_agent_whose_log_is_gone_names_where_it_looked(tmp_path: Path) -> None:
    # it said "no log for rollout-0; known: rollout-0" (rollout-0 both without a log and known; the controller's log
    # file not among those known), and of the launcher's log "no log for launcher; known: rollout-0"
    jd = prepared(tmp_path / "run")
    rec = {"name": "rollout-0", "role": "rollout", "replica": 0, "site": "local", "backend": "local",
           "ident": {"pid": 1, "pgid": 1}, "host": None, "gpus": None, "log": None}  # fmt: skip
    (jd.path / "agents.jsonl").write_text(json.dumps(rec) + "\n")
    (jd.path / "logs").mkdir(exist_ok=True)
    (jd.path / "logs" / "controller-0.log").write_text("up\n")
    for args in (["rollout/0"], ["rollout/0", "-f"]):
        line = one_error(run_cli("logs", str(jd.path), *args))
        assert line == f"rlctl: error: job run: rollout-0 has no log at {jd.path}/logs/rollout-0.log (removed?)"
    line = one_error(run_cli("logs", str(jd.path), "trainer/3"))  # one the job never had: the agents it has
    assert line == "rlctl: error: job run: no log for trainer-3; known: controller-0, rollout-0"
    line = one_error(run_cli("logs", str(jd.path), "launcher"))  # its launcher had a terminal
    assert line == (
        f"rlctl: error: job run: no launcher log at {jd.path}/logs/launcher.log: a launcher writes one only without a "
        "terminal (`launch --detach`, `attach --detach`, or after a SIGHUP)"
    )


def test_an_agent_recorded_on_a_site_sites_json_lacks_is_one_line_naming_sites_json(tmp_path: Path) -> None:
    # agents.jsonl (or sites.json) edited by hand: "site 'gone' is not in this job's inventory (local)", naming no file
    jd = prepared(tmp_path / "run")
    rec = {"name": "rollout-0", "role": "rollout", "replica": 0, "site": "gone", "backend": "local",
           "ident": {"pid": 1, "pgid": 1}, "host": None, "gpus": None, "log": None}  # fmt: skip
    (jd.path / "agents.jsonl").write_text(json.dumps(rec) + "\n")
    assert one_error(run_cli("status", str(jd.path)), code=1) == (
        f"rlctl: error: {jd.path}/sites.json: no site 'gone', where the job's record places an agent (its sites: "
        "local) (hint: the launch's record of the sites is damaged: put it back from a copy of the job dir)"
    )
    stop = one_error(run_cli("stop", str(jd.path)), code=3)  # the agents it can reach stopped, that one said
    assert f"site gone: {jd.path}/sites.json: no site 'gone'" in stop


@pytest.mark.parametrize("state", ["running", "stopped"])
@pytest.mark.parametrize("command", ["logs", "report", "pull", "attach", "scale", "stop", "status", "launch --resume"])
def test_a_job_whose_directory_is_gone_is_said_so_by_each_command(tmp_path: Path, command: str, state: str) -> None:
    # its index row outlived it: logs said "no logs yet: none of its agents has started", report "not a job
    # directory (no job.json)", pull and attach "cannot read the resolved job: [Errno 2] …", launch --resume
    # "never prepared"; attach of an ended one "ended (stopped): nothing to watch", hinting `rlctl status JOB` and
    # `rlctl launch --resume JOB`, which both fail on it; scale "launch it anew: `rlctl launch JOB.yaml`" (stopped) and
    # "the controller did not answer" (running); stop a FileNotFoundError traceback (running: its stop request written
    # into the directory that is gone)
    gone = tmp_path / "demo-1"
    db = JobDB()
    try:
        db.put("demo-1", job_dir=str(gone), spec={"name": "demo"})
        db.update("demo-1", state=state, info={"launcher": {"pid": 2**22 + 1, "host": socket.gethostname()}})
    finally:
        db.close()
    assert one_error(run_cli(*command.split(), "demo-1"), code=1) == (
        f"rlctl: error: job demo-1: its job directory {gone} is gone (removed, or not mounted on this machine); the "
        f"job index says {state} (hint: moved elsewhere? name the job by its directory where it is now, not demo-1; "
        "`rlctl status --all` lists the jobs in the index)"
    )


def test_logs_read_past_a_damaged_line_of_agents_jsonl(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a line cut short by a full disk: `rlctl logs` failed on it, for every agent, for good
    jd = prepared(tmp_path / "run")
    (jd.path / "agents.jsonl").write_text('{"name": "rollout-1", "role": "roll\n{"name": "rollout-2"}\n')
    (jd.path / "logs").mkdir(exist_ok=True)
    (jd.path / "logs" / "controller-0.log").write_text("the controller's last words\n")
    r = run_cli("logs", str(jd.path), "controller/0")
    assert r.exit_code == 0 and "the controller's last words" in r.stdout, r.stderr
    assert "Traceback" not in r.stderr
    assert any("agents.jsonl: line 1 is not valid JSON" in m for m in caplog.messages)


def test_a_missing_choice_lists_the_choices_on_its_line() -> None:
    # click's list, one choice a line, came out as "Choose from:\n\tbash,\n\tzsh,\n\tfish", escapes and all
    assert one_error(run_cli("completion")) == (
        "rlctl: error: Missing argument 'shell'. Choose from: bash, zsh, fish (hint: `rlctl completion --help`)"
    )


def test_scale_and_status_tables_say_per_site_figures_as_text_not_as_python() -> None:
    """`first_sample_s {'rollout-2': 3.004}` and `free slots {'local': 1}` were a Python dict's text in the tables."""
    from rlctl.commands.scale import _table
    from rlctl.commands.status import _per_site

    table = _table({"id": "j", "adding": ["rollout-2"], "first_sample_s": {"rollout-2": 3.004}, "wall_s": 3.2})
    assert "rollout-2 3.0 s" in table and "{" not in table, table
    assert _per_site({"local": 1, "h20": 0}) == "local 1, h20 0" and _per_site({}) == "-"


def test_a_launch_into_the_directory_of_a_finished_job_names_a_resume_that_works(tmp_path: Path, home: Path) -> None:
    # the hint said `rlctl launch --resume DIR`, which refuses a finished job: `nothing to resume`, exit 2
    jd = prepared(tmp_path / "run")
    planned = jd.read_job().iterations
    jd.summary_json.write_text(json.dumps({"state": "done", "iterations": planned, "iterations_planned": planned}))
    line = one_error(run_cli("launch", str(DEMO), "--job-dir", str(jd.path)))
    assert f"continue that job with `rlctl launch --resume {jd.path} --iterations {2 * planned}`" in line, line
    from rlctl.errors import UsageError
    from rlctl.ops.extend import with_iterations
    from rlctl.ops.refusals import refuse_if_finished

    with pytest.raises(UsageError, match="nothing to resume"):  # the plain resume it named before
        refuse_if_finished(jd, state=None)
    assert with_iterations(jd, 2 * planned, since=None, ref=str(jd.path))[1] is not None  # the one it names now
