"""How a process that may have formed a torch.distributed (gloo) group ends: an agent (`python -m rlctl.agents`)
and a measured split's rank (`python -m rlctl.profiler.measure_split`).

    end_after(run, end=…) ─ run's return, a SystemExit's code, or 1 after an uncaught exception's traceback
        ─▶ gc.freeze ─▶ end(code): its group formed ─▶ end_without_finalization(code)   (an agent)
                                   else            ─▶ sys.exit(code): the interpreter's finalization
                        end_without_finalization(code)                                   (a measured rank)
                          exit handlers (a log's flush) ─▶ stdout/stderr flushed ─▶ os._exit(code)

Why without the interpreter's finalization: a gloo worker thread frees the group's last collective after it woke
the main thread, taking the GIL for the tensors Python holds, and CPython ends a thread that asks for it during
finalization by unwinding it through that work's C++ destructor (noexcept): std::terminate, SIGABRT, exit 134 (a
rank -6 to its parent, and a core file where cores are on) from a process whose work had finished.
destroy_process_group does not close that window: once torch._dynamo was imported after the group formed (the
learner's optimizer imports it) it leaves gloo's threads running. Imports nothing heavy (an agent's entry that
does not train, the controller, loads no torch)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def end_after(run: Callable[[], int], *, end: Callable[[int], NoReturn] | None = None) -> NoReturn:
    """Run `run` and end the process by `end` (`end_in_group` where None) with its exit code, however it left `run`:
    its return, a SystemExit's code (an agent's SIGTERM: 143), or 1 after the traceback of an exception it did not
    catch. Versus ending only after a return: a rank stopped by SIGTERM, or whose collective raised, went through
    the interpreter's finalization, open to the gloo thread's abort (exit 134 for 143 or 1)."""
    try:
        code = run()
    except SystemExit as e:
        code = exit_code(e)
    except Exception:  # noqa: BLE001 - as the interpreter says an uncaught one: its traceback, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    # the interpreter's last collections walk every object the process made (a trainer's took 2.5 s on 2 busy cores,
    # so the launcher's stop SIGTERMed a rank that had finished): its memory goes back with the process anyway
    gc.freeze()
    (end or end_in_group)(code)


def exit_code(e: SystemExit) -> int:
    """The exit code the interpreter gives a SystemExit: its int code, 0 for none, else 1 after printing it."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def end_in_group(code: int) -> NoReturn:
    """End with `code`: without the interpreter's finalization (`end_without_finalization`) where this process's
    torch.distributed group is formed (a trainer rank; a vLLM unit's engine forms one in the unit's process at tp 1:
    the exit handlers that stop vLLM's engine run first), else through it (the controller, an embedded-engine unit)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        end_without_finalization(code)
    sys.exit(code)


def end_without_finalization(code: int) -> NoReturn:
    """End with `code` after the exit handlers ran and stdout and stderr were flushed, by `os._exit`: no
    interpreter finalization (the module's docstring says why)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        # one that does not flush (a full disk under the log, a reader gone, none at all) costs its last lines, as at
        # the interpreter's own end, versus its error escaping before os._exit: the finalization this avoids
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)
