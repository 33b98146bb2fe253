"""How an agent's process ends (rlctl.exits.end_after, as rlctl.agents.__main__ ends it): a trainer rank, its
process group formed, runs its exit handlers and ends without the interpreter's finalization, where a gloo worker
thread still freeing the last collective's tensors was unwound through a C++ destructor (std::terminate: exit 134
from a rank whose run had finished); every other agent ends through finalization, as before (a rollout unit's vLLM
engine is stopped by its exit handlers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT

AGENT = textwrap.dedent(
    """
    import atexit, logging, os, sys, threading
    from rlctl.exits import end_after, end_in_group

    class Finalized:
        def __del__(self, _write=os.write):
            _write(2, b"finalized\\n")

    kept = Finalized()  # freed by the interpreter's finalization only
    atexit.register(print, "exit handlers ran", file=sys.stderr)
    logging.basicConfig(stream=sys.stderr, format="%(message)s")
    if sys.argv[1] == "trainer":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    if sys.argv[3] == "returned":
        logging.getLogger("rlctl.agents").warning("the last line")  # as the agents' _log_cpu, after the run
        end_in_group(3)


    def stopped():  # as a SIGTERM (_on_sigterm) or a failed collective leaves main, once its finally blocks ran
        logging.getLogger("rlctl.agents").warning("the last line")  # (main's _log_cpu)
        if sys.argv[3] == "sigterm":
            sys.exit(143)
        raise RuntimeError("a collective failed")


    # after end_after's gc.freeze "finalized" is never written: the threads' exit hooks mark the finalization instead
    threading._register_atexit(os.write, 2, b"threads' exit hooks ran\\n")
    end_after(stopped)
    """
)


def _end_as(role: str, tmp_path: Path, how: str = "returned") -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", AGENT, role, str(tmp_path / "rendezvous"), how],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_trainer_rank_ends_after_its_exit_handlers_without_finalization(tmp_path: Path) -> None:
    proc = _end_as("trainer", tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-2:] == ["the last line", "exit handlers ran"], proc.stderr[-2000:]


def test_an_agent_without_a_process_group_ends_through_finalization(tmp_path: Path) -> None:
    proc = _end_as("rollout", tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-3:] == ["the last line", "exit handlers ran", "finalized"], proc.stderr[-2000:]


def test_a_trainer_rank_that_leaves_main_by_sigterm_or_an_error_ends_without_finalization_too(tmp_path: Path) -> None:
    """SIGTERM (the launcher's stop: rank 0 broadcasts its stop to the ranks that follow as it unwinds) and an error
    out of a collective leave main by an exception, versus `end_in_group` reached only by its return: the interpreter's
    finalization, the gloo thread's abort open (exit 134 for 143 or 1)."""
    stopped = _end_as("trainer", tmp_path / "stopped", "sigterm")
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert stopped.stderr.splitlines()[-2:] == ["the last line", "exit handlers ran"], stopped.stderr[-2000:]
    failed = _end_as("trainer", tmp_path / "failed", "error")
    assert failed.returncode == 1, failed.stderr[-2000:]
    lines = failed.stderr.splitlines()  # (the traceback through torch.distributed's excepthook: each line "[rank0]: …")
    assert lines[-1] == "exit handlers ran" and lines[-2].endswith("RuntimeError: a collective failed"), lines[-20:]
    assert "Traceback (most recent call last):" in failed.stderr and "the last line" in lines, lines[-20:]


def test_an_agent_without_a_process_group_stopped_by_sigterm_ends_through_finalization(tmp_path: Path) -> None:
    proc = _end_as("rollout", tmp_path, "sigterm")
    assert proc.returncode == 143, proc.stderr[-2000:]
    ended = ["the last line", "threads' exit hooks ran", "exit handlers ran"]  # (gc.freeze: no "finalized")
    assert proc.stderr.splitlines()[-3:] == ended, proc.stderr[-2000:]
