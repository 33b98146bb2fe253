"""CLI conventions: version, JSON on stdout only, completion scripts, usage errors exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rlctl import __version__
from rlctl.buildid import code_digest
from tests.conftest import ROOT, CliResult, run_cli


def test_version_json(cli: Callable[..., CliResult]) -> None:
    res = cli("version", "-o", "json")
    assert res.exit_code == 0
    assert json.loads(res.stdout) | {"python": "-"} == {"rlctl": __version__, "code": code_digest(), "python": "-"}


def test_version_as_an_option_prints_what_the_command_does(cli: Callable[..., CliResult]) -> None:
    # `rlctl --version` (what most tools take) was "No such option: --version", exit 2
    option, command = cli("--version"), cli("version")
    assert option.exit_code == 0 and option.stdout == command.stdout and __version__ in option.stdout


def test_check_examples_table_and_json_agree(cli: Callable[..., CliResult]) -> None:
    files = sorted(str(p) for p in (ROOT / "clusters").glob("*.yaml"))
    table = cli("check", *files)
    data = json.loads(cli("check", *files, "-o", "json").stdout)
    assert table.exit_code == 0
    assert {s["name"] for s in data["sites"]} == {"h800", "h20", "local"}
    assert data["links"] == [{"between": ["h800", "h20"], "bandwidth_gbps": 80.0, "latency_ms": 2.0}]
    for site in data["sites"]:
        assert site["name"] in table.stdout
        assert str(site["gpus"]) in table.stdout
    assert "h800 <-> h20" in table.stdout and "80 Gbps" in table.stdout
    h800 = next(s for s in data["sites"] if s["name"] == "h800")
    assert (h800["nodes"], h800["gpus"], h800["gpu"], h800["scheduler"]) == (16, 128, "H800", "slurm")
    h20 = next(s for s in data["sites"] if s["name"] == "h20")
    assert (h20["nodes"], h20["gpus"], h20["gpu"], h20["scheduler"]) == (4, 32, "H20", "ssh")


def test_check_job_file(cli: Callable[..., CliResult]) -> None:
    data = json.loads(cli("check", str(ROOT / "jobs" / "demo.yaml"), "-o", "json").stdout)
    assert data["job"]["name"] == "demo"
    assert {s["name"] for s in data["sites"]} == {"local"}


@pytest.mark.parametrize("key_here", [False, True])
def test_check_refuses_what_launch_cannot_run_in_one_line(
    cli: Callable[..., CliResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key_here: bool
) -> None:
    """The 7B planning example names a model without weights, a length-only workload and a trainer backend that
    cannot run on its GPU site: check says so (exit 2), before launch would. Its vLLM engine runs on the SSH
    rollout site, not on this machine: this machine's packages say nothing about it. The rollout site's key
    (~/.ssh/id_ed25519 in clusters/h20-rollout.yaml) is said, naming that file, only where it is not here: the
    same lines on every machine, versus whatever this machine's home held (CI has no such key)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    if key_here:
        (tmp_path / ".ssh").mkdir()
        (tmp_path / ".ssh" / "id_ed25519").write_text("")
    res = cli("check", str(ROOT / "jobs" / "cross-dc-7b.yaml"), "-o", "json")
    lines = res.stderr.splitlines()  # every problem, one line each
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    key = (
        f"rlctl: error: {ROOT / 'clusters' / 'h20-rollout.yaml'}: sites.h20.scheduler.key_file: no such file "
        f"{str(tmp_path / '.ssh' / 'id_ed25519')!r} on this machine: rlctl logs in to site 'h20' with it"
    )
    assert sum(line.startswith(key) for line in lines) == (0 if key_here else 1), lines
    lines = [line for line in lines if not line.startswith(key)]
    assert all(line.startswith(f"rlctl: error: {ROOT / 'jobs' / 'cross-dc-7b.yaml'}: ") for line in lines), lines
    fields = [line.split(": ")[3] for line in lines]  # (transport.kind too where ucxx is missing)
    assert fields[0] == "model" and "built-in 'qwen2.5-7b'" in lines[0]
    assert {"task", "trainer.backend"} <= set(fields) and "rollout.engine" not in fields
    # the README says each field it is refused for, versus 'since its weights are not on this machine' alone
    readme = (ROOT / "README.md").read_text().partition("`jobs/cross-dc-7b.yaml` (")[2].partition("machine).")[0]
    assert [f for f in [*fields, "sites.h20.scheduler.key_file"] if f"`{f}`" not in readme] == []


def test_check_json_says_a_refusal_on_stdout_too(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """`check -o json` prints one object whether the check passes or not: ok, and each problem's file, field,
    message and hint (the lines stderr says), exit codes as before; versus nothing on stdout where it was refused,
    a CI gate reading the JSON getting none."""
    passed = cli("check", str(ROOT / "jobs" / "demo.yaml"), "-o", "json")
    data = json.loads(passed.stdout)
    assert passed.exit_code == 0 and (data["ok"], data["problems"], data["job"]["name"]) == (True, [], "demo")
    job = str(ROOT / "jobs" / "cross-dc-7b.yaml")
    refused = cli("check", job, "-o", "json")
    data = json.loads(refused.stdout)
    assert refused.exit_code == 2 and data["ok"] is False and data["job"]["name"] == "cross-dc-7b"
    lines = refused.stderr.splitlines()
    assert len(data["problems"]) == len(lines) > 1
    for p, line in zip(data["problems"], lines, strict=True):
        hint = f" (hint: {p['hint']})" if p["hint"] else ""
        assert line == f"rlctl: error: {p['file']}: {p['field']}: {p['message']}{hint}"
    assert {"file": job, "field": "task", "hint": None} == {
        k: v for k, v in data["problems"][1].items() if k != "message"
    }
    missing = cli("check", str(tmp_path / "no.yaml"), "-o", "json")  # one problem, the file unread
    assert missing.exit_code == 2 and json.loads(missing.stdout) == {
        "ok": False,
        "problems": [{"file": str(tmp_path / "no.yaml"), "field": None, "message": "no such file", "hint": None}],
    }
    inv = tmp_path / "inv.yaml"  # --reach of a site that refuses the connection: its rows, and why, exit 3
    inv.write_text(
        "apiVersion: rlctl/v1\nkind: Inventory\nsites:\n  b:\n    datacenter: b\n    scheduler: {kind: ssh, port: 1}\n"
        "    gpu: CPU\n    nodes: [{host: 127.0.0.1, gpus: 1}]\n"
    )
    gone = cli("check", str(inv), "--reach", "--timeout", "3", "-o", "json")
    data = json.loads(gone.stdout)
    assert gone.exit_code == 3 and data["ok"] is False and [r["ok"] for r in data["reach"]] == [False]
    assert [(p["file"], p["field"]) for p in data["problems"]] == [(str(inv), "sites.b")]


def test_check_reach_json_names_the_site_and_host_of_a_problem_and_the_field_of_the_files(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """`check JOB --reach -o json`: a site's host that the probe cannot ask is a problem naming its inventory file,
    `sites.<site>`, the site and the host, and the job file's own problem its field, each as its line on stderr says
    it; versus every problem of a job with --reach a message alone (the whole line, field null)."""
    inv = tmp_path / "sites.yaml"  # the trainer here, the rollout units on an SSH site that refuses the connection
    inv.write_text(
        (ROOT / "clusters" / "local.yaml").read_text()
        + "  b:\n    datacenter: b\n    scheduler: {kind: ssh, port: 1}\n    gpu: CPU\n"
        "    nodes: [{host: 127.0.0.1, gpus: 2}]\nlinks:\n  - {between: [local, b], bandwidth_gbps: 10}\n"
    )
    job = tmp_path / "job.yaml"
    text = (ROOT / "jobs" / "demo.yaml").read_text().replace("../clusters/local.yaml", str(inv))
    text = text.replace("rollout: [{site: local, gpus: 2}]", "rollout: [{site: b, gpus: 2}]")
    job.write_text(text.replace("heldout_prompts: 512", "heldout_prompts: all"))  # (digits has no held-out file)
    res = cli("check", str(job), "--reach", "--timeout", "3", "-o", "json")
    lines = res.stderr.splitlines()
    assert res.exit_code == 2 and len(lines) == 2, res.stderr
    own, site = json.loads(res.stdout)["problems"]
    assert {k: v for k, v in own.items() if k != "message"} == {
        "file": str(job),
        "field": "evaluation.heldout_prompts",
        "hint": None,
    }
    assert lines[0] == f"rlctl: error: {own['file']}: {own['field']}: {own['message']}"
    assert {k: v for k, v in site.items() if k != "message"} == {
        "file": str(inv),
        "field": "sites.b",
        "site": "b",
        "host": "127.0.0.1",
        "hint": None,
    }
    assert site["message"].startswith("cannot be asked: ssh 127.0.0.1:1: cannot connect")
    assert lines[1] == f"rlctl: error: site {site['site']} host {site['host']}: {site['message']}"
    gone = cli("check", str(inv), "--reach", "--timeout", "3", "-o", "json")  # the inventory's: the site alone
    [row] = json.loads(gone.stdout)["problems"]
    assert gone.exit_code == 3 and (row["field"], row["site"], row["host"]) == ("sites.b", "b", None)


def test_check_says_a_warning_as_it_says_an_error(tmp_path: Path) -> None:
    """A one-shot command's warning reads `rlctl: warning: …`, as its errors read `rlctl: error: …`, versus the raw
    log line (`2026-12-07 04:23:45,039 WARNING rlctl.ops.preflight.fields: …`); `--debug` keeps the time and the
    logger (a fresh interpreter: the CLI configures logging once, where pytest's own handlers are not)."""
    job = tmp_path / "warn.yaml"
    text = (ROOT / "jobs" / "demo.yaml").read_text().replace("../clusters", str(ROOT / "clusters"))
    job.write_text(text.replace("weight_sync: {mode: full}", "weight_sync: {mode: delta, anchor_every: 400}"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    said = [
        subprocess.run(
            [sys.executable, "-m", "rlctl", *debug, "check", str(job)], env=env, capture_output=True, text=True
        )
        for debug in ([], ["--debug"])
    ]
    assert [res.returncode for res in said] == [0, 0]
    assert said[0].stderr == (
        f"rlctl: warning: {job}: weight_sync.anchor_every: 400 is more than the job's 300 iterations: the job ends "
        "before its first anchor, and every version after the first full copy is a delta; use at most 300 for periodic "
        "anchors, or leave it out\n"
    )
    (line,) = [line for line in said[1].stderr.splitlines() if "anchor_every" in line]
    assert " WARNING rlctl.ops.preflight.fields: " in line and not line.startswith("rlctl:")


@pytest.mark.parametrize("shell,marker", [("bash", "complete -o"), ("zsh", "compdef"), ("fish", "complete --command")])
def test_completion_scripts(cli: Callable[..., CliResult], shell: str, marker: str) -> None:
    res = cli("completion", shell)
    assert res.exit_code == 0
    assert marker in res.stdout and "_RLCTL_COMPLETE" in res.stdout


def test_bash_completes_with_the_script_rlctl_prints(tmp_path: Path) -> None:
    """The script `rlctl completion bash` prints, sourced in a real bash, completes commands and choices (before,
    every Tab got nothing: 'Shell bash not supported.', typer's completion classes never registered)."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    (tmp_path / "rlctl").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rlctl "$@"\n')
    (tmp_path / "rlctl").chmod(0o755)
    script = run_cli("completion", "bash").stdout
    (tmp_path / "comp.bash").write_text(script)
    tabs = {"st": "COMP_WORDS=(rlctl st); COMP_CWORD=1", "mode": 'COMP_WORDS=(rlctl launch --mode ""); COMP_CWORD=3'}
    body = "; ".join(
        f'{words}; _rlctl_completion rlctl; echo "{name}=[${{COMPREPLY[*]}}]"' for name, words in tabs.items()
    )
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [bash, "-c", f"source {tmp_path / 'comp.bash'}; {body}"], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.stdout.splitlines() == ["st=[status stop]", "mode=[sync stream async]"], res.stderr
    assert res.stderr == ""


@pytest.mark.parametrize(
    "shell,env,expected",
    [
        ("zsh", {"_TYPER_COMPLETE_ARGS": "rlctl st"}, ['"status":', '"stop":']),
        (
            "fish",
            {"_TYPER_COMPLETE_ARGS": "rlctl st", "_TYPER_COMPLETE_FISH_ACTION": "get-args"},
            ["status\t", "stop\t"],
        ),
    ],
)
def test_zsh_and_fish_completion_requests_are_answered(
    monkeypatch: pytest.MonkeyPatch, shell: str, env: dict[str, str], expected: list[str]
) -> None:
    """What the zsh and fish scripts run on a Tab (the environment each sets, as its text says), answered by the
    real entry point: the matching commands (no zsh or fish needed here)."""
    script = run_cli("completion", shell).stdout
    assert all(name in script for name in env) and f"_RLCTL_COMPLETE=complete_{shell}" in script
    monkeypatch.setenv("_RLCTL_COMPLETE", f"complete_{shell}")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    res = run_cli()
    assert (res.exit_code, res.stderr) == (0, "")
    assert all(e in res.stdout for e in expected) and "launch" not in res.stdout, res.stdout


def test_a_scale_count_without_its_option_is_shown_where_it_goes(cli: Callable[..., CliResult]) -> None:
    """`rlctl scale JOB +1` / `-1` (the count as scale's docs and issues write it) says where the count goes, versus
    click's 'Got unexpected extra argument(s) (+1)' / 'No such option: -1' and `--help` only; `rlctl scale +2` (the
    job omitted) says it in the same words, versus a text of its own."""
    said = {
        "+1": "`rlctl scale [JOB] --rollout +1` adds 1 rollout unit(s)",
        "-2": "`rlctl scale [JOB] --rollout -2` drains and removes 2 rollout unit(s)",
        "3": "`rlctl scale [JOB] --rollout +3` adds 3 rollout unit(s)",  # a bare 3 adds three: --rollout sets no total
        "0": "`rlctl scale [JOB] --rollout +N` adds N rollout unit(s), -N removes N",  # not `--rollout +0`
    }
    for count, how in said.items():
        res = cli("scale", "some-job", count)
        assert res.exit_code == 2, res.stderr
        assert res.stderr.endswith(f"(hint: the count goes in --rollout: {how})\n"), res.stderr
    bare = cli("scale", "+2")  # the job omitted: +2 is no job name (they start with a letter or digit)
    assert bare.exit_code == 2, bare.stderr
    assert bare.stderr == (
        "rlctl: error: '+2' is a count, not a job "
        "(hint: the count goes in --rollout: `rlctl scale [JOB] --rollout +2` adds 2 rollout unit(s))\n"
    )
    other = cli("scale", "some-job", "more")
    assert other.exit_code == 2 and other.stderr.endswith("(hint: `rlctl scale --help`)\n"), other.stderr


def test_usage_errors_exit_2(cli: Callable[..., CliResult]) -> None:
    assert cli("completion", "tcsh").exit_code == 2
    assert cli("no-such-command").exit_code == 2
    assert cli("check").exit_code == 2


def test_debug_is_the_commands_own_not_the_last_ones_in_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--debug` set a process-global flag at each command's root options and left it set: after an in-process
    `rlctl --debug version`, `rlctl --version` into a stdout that cannot take it (said before the root options are
    read) raised its RlctlError's traceback, versus one line, exit 1, as in a fresh process."""
    from rlctl import render
    from rlctl.errors import RlctlError

    def full(text: str, *, end: str = "\n") -> None:
        raise RlctlError("cannot write the output to stdout: No space left on device")

    assert run_cli("--debug", "version").exit_code == 0
    monkeypatch.setattr(render, "write_out", full)
    said = run_cli("--version")
    line = "rlctl: error: cannot write the output to stdout: No space left on device\n"
    assert (said.exit_code, said.stderr) == (1, line)
    with pytest.raises(RlctlError, match="No space left"):  # (a command's own --debug: its traceback)
        run_cli("--debug", "version")
    assert run_cli("version").stderr == said.stderr
