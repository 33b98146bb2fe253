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
from typing import Any, NoReturn


def end_rank(*queues: Queue[Any]) -> NoReturn:
    """Exit 0 now: `queues`' items written to their pipes first (an exit skips the queues' own flush)."""
    for q in queues:
        q.close()
        q.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
