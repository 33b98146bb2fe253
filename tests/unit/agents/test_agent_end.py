"""How an agent's process ends (rlctl.agents.__main__._end): a trainer rank, its process group formed, runs its
exit handlers and ends without the interpreter's finalization, where a gloo worker thread still freeing the last
collective's tensors was unwound through a C++ destructor (std::terminate: exit 134 from a rank whose run had
finished); every other agent ends through finalization, as before (a rollout unit's vLLM engine is stopped by
its exit handlers)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT

AGENT = textwrap.dedent(
    """
    import atexit, logging, os, sys
    from rlctl.agents.__main__ import _end

    class Finalized:
        def __del__(self, _write=os.write):
            _write(2, b"finalized\\n")

    kept = Finalized()  # freed by the interpreter's finalization only
    atexit.register(print, "exit handlers ran", file=sys.stderr)
    logging.basicConfig(stream=sys.stderr, format="%(message)s")
    if sys.argv[1] == "trainer":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    logging.getLogger("rlctl.agents").warning("the last line")  # as the agents' _log_cpu, after the run
    _end(3)
    """
)


def _end_as(role: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", AGENT, role, str(tmp_path / "rendezvous")],
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
