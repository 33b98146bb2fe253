"""How a rank of the multi-process tests' gloo groups ends once its work is done: what it put on its queues
flushed to the pipe, then `os._exit`, never the interpreter's finalization.

A gloo worker thread frees the last collective's work after it woke the rank's main thread; freeing a tensor
that Python also holds takes the GIL. When the main thread reached finalization first (a loaded machine), CPython
ends that thread by unwinding it through the work's C++ destructor, which is noexcept: std::terminate, SIGABRT, a
rank that did everything right exiting -6 ("terminate called without an active exception"; its core:
ProcessGroupGloo::runLoop → ~AsyncBroadcastWork → TensorImpl::decref_pyobject → take_gil → PyThread_exit_thread).
`destroy_process_group` does not close that window: it leaves the gloo backend and its threads running once
torch._dynamo was imported after the group was formed (the first optimizer imports it). The zygote's forked
ranks (tests/unit/trainers/zygote.py) end this way already."""

from __future__ import annotations

import os
import sys
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import pytest


def end_rank(*queues: Queue[Any]) -> NoReturn:
    """Exit 0 now: `queues`' items written to their pipes first (an exit skips the queues' own flush)."""
    for q in queues:
        q.close()
        q.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# imported by every python a test starts (first on PYTHONPATH): `rank-PID` for a process running the module named,
# and `finalized-PID` once more at its interpreter's finalization (the object's __del__, run only there), which a
# rank that ended by os._exit skips
_ENDS_PROBE = """
import os, sys

class _Finalized:
    def __del__(self, _open=os.open, _close=os.close, _path=f"{os.environ['RANK_ENDS_DIR']}/finalized-{os.getpid()}"):
        _close(_open(_path, os.O_CREAT | os.O_WRONLY))

if os.environ["RANK_ENDS_MODULE"] in sys.orig_argv:
    open(f"{os.environ['RANK_ENDS_DIR']}/rank-{os.getpid()}", "w").close()
    _kept = _Finalized()
"""


def probe_rank_ends(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str) -> Path:
    """A directory where each process of `python -m MODULE` started from here (its PYTHONPATH kept) leaves
    `rank-PID`, and `finalized-PID` if it ended through the interpreter's finalization: how a test sees that ranks
    end by os._exit."""
    probe, ends = tmp_path / "ends-probe", tmp_path / "ends"
    probe.mkdir()
    ends.mkdir()
    (probe / "sitecustomize.py").write_text(_ENDS_PROBE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(probe), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("RANK_ENDS_DIR", str(ends))
    monkeypatch.setenv("RANK_ENDS_MODULE", module)
    return ends
