"""`rollout.compile` with the embedded engine needs a C++ compiler on a CPU (torch inductor) and triton with a C
compiler on a CUDA GPU: `rlctl check --reach` names a site's host without them, `rlctl check` this machine for a local
site, and a unit on such a host ends as it starts, in one line, versus each unit failing at its first decode step
(inductor's InvalidCxxCompiler traceback), replaced, and failing again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from rlctl.config.inventory import Site
from rlctl.config.job import load_job
from rlctl.engines.compiletools import compile_tools, compile_tools_problem
from rlctl.errors import RlctlError
from rlctl.launch.siteprobe import host_problems, probe_site_hosts
from rlctl.ops import preflight
from tests.unit.launch.test_site_probe import job

ROOT = Path(__file__).resolve().parents[3]
NO_CXX = "torch.compile on a CPU needs a C++ compiler ($CXX, else g++), which it lacks: apt install g++"


def only_path(monkeypatch: pytest.MonkeyPatch, directory: Path, *tools: str) -> None:
    """PATH is `directory` alone, holding `tools` (scripts that succeed) and bash (the local runner's); no CXX or CC."""
    directory.mkdir(exist_ok=True)
    if not (directory / "bash").exists():
        (directory / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
    for tool in tools:
        (directory / tool).write_text("#!/bin/sh\nexit 0\n")
        (directory / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(directory))
    for name in ("CXX", "CC"):
        monkeypatch.delenv(name, raising=False)


def local_site(tmp_path: Path) -> Site:
    return Site.model_validate(
        {
            "datacenter": "dc",
            "scheduler": {"kind": "local", "workdir": str(tmp_path / "w")},
            "gpu": "CPU",
            "nodes": [{"host": "localhost", "gpus": 1}],
        }
    )


@pytest.mark.parametrize("tools", [(), ("g++",)])
def test_the_site_probe_says_a_host_has_no_cpp_compiler_for_a_compiled_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools: tuple[str, ...]
) -> None:
    only_path(monkeypatch, tmp_path / "bin", *tools)
    here = local_site(tmp_path)
    (report,) = probe_site_hosts("cpu", here, timeout_s=120)  # the probe itself, run here with that PATH
    assert report.error is None, report.error
    assert {k: report.facts[k] for k in ("cxx", "cc", "triton")} == compile_tools()  # as the unit asks it
    compiled = job(rollout={"compile": True}, placement={"trainer": {"site": "cpu", "gpus": 1},
                                                         "rollout": [{"site": "cpu", "gpus": 1}]})  # fmt: skip
    lines = host_problems(report, here, roles={"rollout"}, job=compiled)
    if tools:
        assert lines == []
        return
    assert lines == [f"site cpu host localhost: rollout.compile: true: {NO_CXX} there, or set rollout.compile: false"]
    assert host_problems(report, here, roles={"rollout"}, job=job()) == []  # not compiled: nothing needed
    assert host_problems(report, here, roles={"trainer"}, job=compiled) == []  # no unit there
    vllm = job(rollout={"engine": "vllm"})
    assert not [x for x in host_problems(report, here, roles={"rollout"}, job=vllm) if "compile" in x]


def test_a_gpu_host_needs_triton_and_a_c_compiler() -> None:
    said = compile_tools_problem({"cxx": None, "cc": "/usr/bin/gcc", "triton": False}, gpu=True)
    assert said == "torch.compile on a CUDA GPU needs triton, which it lacks: pip install triton there, or set " \
        "rollout.compile: false"  # fmt: skip
    said = compile_tools_problem({"cxx": None, "cc": None, "triton": True}, gpu=True)
    assert said is not None and "a C compiler ($CC, gcc or clang)" in said and "apt install gcc" in said
    assert compile_tools_problem({"cxx": None, "cc": "/usr/bin/gcc", "triton": True}, gpu=True) is None
    assert compile_tools_problem({}, gpu=False) is None  # an older probe says nothing of them


def test_compile_tools_follow_cxx_and_cc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only_path(monkeypatch, tmp_path / "bin", "clang++", "clang")
    assert compile_tools()["cxx"] is None and compile_tools()["cc"] == str(tmp_path / "bin" / "clang")
    monkeypatch.setenv("CXX", "clang++")  # inductor's cpp.cxx reads $CXX
    assert compile_tools()["cxx"] == str(tmp_path / "bin" / "clang++")


def test_check_refuses_a_compiled_step_on_a_local_site_without_a_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "job.yaml"
    spec = {
        "apiVersion": "rlctl/v1",
        "kind": "Job",
        "name": "c",
        "inventory": [str(ROOT / "clusters" / "local.yaml")],
        "model": {"kind": "builtin", "name": "tiny-demo"},
        "task": {"kind": "digits"},
        "placement": {"trainer": {"site": "local", "gpus": 1}, "rollout": [{"site": "local", "gpus": 1}]},
        "rollout": {"compile": True},
    }
    path.write_text(yaml.safe_dump(spec))
    only_path(monkeypatch, tmp_path / "bin")
    said = [p.message for p in preflight.problems(load_job(path)) if p.field == "rollout.compile"]
    assert said == [
        f"true: the units of site 'local' run on this machine: {NO_CXX} here, or set rollout.compile: false"
    ]
    only_path(monkeypatch, tmp_path / "bin", "g++")
    assert not [p for p in preflight.problems(load_job(path)) if p.field == "rollout.compile"]


def test_a_unit_without_a_compiler_ends_as_it_starts_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlctl.agents.common import AgentContext
    from rlctl.agents.rollout import RolloutAgent
    from rlctl.launch.jobdir import JobDir
    from rlctl.models.tinygpt import TinyGPT
    from rlctl.transport import InprocTransport

    jd = JobDir.create("compiled", explicit=tmp_path / "job")
    jd.write_job(job(rollout={"compile": True}, transport={"kind": "inproc"}), source="test")
    TinyGPT().save_pretrained(jd.init_model)
    transport = InprocTransport(secret=jd.secret())
    listener = transport.listen("inproc://compile-tools")
    try:
        only_path(monkeypatch, tmp_path / "bin")
        with pytest.raises(RlctlError) as e:  # was: built, joined, and InvalidCxxCompiler at its first decode step
            RolloutAgent(AgentContext(jd, jd.read_job(), transport, listener.address), replica=0)
        assert str(e.value) == f"rollout.compile: true: on {os.uname().nodename}, {NO_CXX} on this host, or set " \
            "rollout.compile: false"  # fmt: skip
        only_path(monkeypatch, tmp_path / "bin", "g++")
        unit = RolloutAgent(AgentContext(jd, jd.read_job(), transport, listener.address), replica=0)
        assert unit.engine.compile_step
    finally:
        listener.close()
