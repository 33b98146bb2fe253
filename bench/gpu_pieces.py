"""The GPU check's pieces and their limits (bench/gpu_check.py): a lent GPU machine gives one run, at most 600 s a
command, so every piece runs on its own, the JSON so far is on disk after every piece, and nothing runs past the
time budget by more than one in-process piece.

    piece(key, fn, cuda=…) ─▶ skipped? a key not in `only`, the budget spent, or `cuda` and the CUDA context
                           │  poisoned by an earlier piece     ─▶ `skipped` [key], `skipped_why` {key: why}
                           ├─ `running`: key, the JSON written  (a run killed here names the piece it was in)
                           ├─ fn() ─▶ its value │ its error: `errors[key]` (a sticky CUDA error: `cuda_poisoned`)
                           └─ `piece_s[key]`, the JSON written

A piece that runs a subprocess (`run_capped`) gives it `Pieces.timeout_s(its own)`: what is left of the budget
when that is less, so a long build, launch or test run ends inside the budget with what it printed so far.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# errors that leave the process's CUDA context unusable: every later CUDA call in it fails with the same error
STICKY_CUDA = re.compile(
    r"device-side assert|illegal memory access|illegal address|illegal instruction|unspecified launch failure"
    r"|misaligned address|launch timed out|CUBLAS_STATUS_EXECUTION_FAILED|uncorrectable ECC|hardware stack error",
    re.IGNORECASE,
)

# not sticky: the caching allocator frees the failed piece's blocks, and the next piece allocates again
OUT_OF_MEMORY = re.compile(r"out of memory|CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)


class Pieces:
    """The check's pieces, each on its own: an exception is recorded under `errors[key]` (one line and the
    innermost frames) and the check goes on, so one run on a lent machine reports every piece; each piece's
    seconds land in `piece_s`; the JSON so far is rewritten to `path` after each piece (a run cut short still
    leaves it, `running` naming the piece it was in); a piece that would start after `budget_s`, one not in a
    non-empty `only`, or one using CUDA in this process (`cuda`) after a sticky CUDA error is skipped, named in
    `skipped` and why in `skipped_why`."""

    def __init__(
        self,
        out: dict[str, Any],
        *,
        path: str | None,
        budget_s: float | None,
        only: set[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        spent_s: float = 0.0,
    ) -> None:
        """`spent_s`: seconds of the budget spent before (the device command's installs and the check's imports)."""
        self.out, self.path, self.budget_s = out, Path(path) if path else None, budget_s
        self.only = only or set()
        self.artifacts = self.path.parent if self.path else None
        self.clock = clock
        self.t0 = clock() - spent_s
        if budget_s is not None:
            out["budget_s"] = budget_s

    def elapsed_s(self) -> float:
        return self.clock() - self.t0

    def timeout_s(self, own_s: float) -> float:
        """A subprocess piece's timeout: `own_s`, or what is left of the budget when that is less (at least 1 s:
        the piece started inside the budget)."""
        if self.budget_s is None:
            return own_s
        return max(1.0, min(own_s, self.budget_s - self.elapsed_s()))

    def __call__(
        self, key: str, fn: Any, *, merge: bool = False, keep: bool = True, timed: bool = False, cuda: bool = True
    ) -> Any:
        """`fn()`'s value under `key` (`merge`: its keys into the output; `keep=False`: returned only; `timed`:
        the seconds it took instead), or None when it failed or was skipped. `cuda`: it may use CUDA in this
        process (False: a subprocess's piece or a CPU one, run after a sticky CUDA error all the same)."""
        why = self._skip_reason(key, cuda=cuda)
        if why:
            self.out.setdefault("skipped", []).append(key)
            self.out.setdefault("skipped_why", {})[key] = why
            self._write()
            return None
        print(f"[gpu-check {self.elapsed_s():6.1f} s] {key}", file=sys.stderr, flush=True)
        self.out["running"] = key
        self._write()
        t = self.clock()
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - the check reports every piece; the error is its result
            frames = traceback.extract_tb(exc.__traceback__)[-4:]
            where = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]
            line = f"{type(exc).__name__}: {exc}"[:600]
            self.out.setdefault("errors", {})[key] = {"error": line, "at": where}
            traceback.print_exc()
            if cuda and cuda_context_lost(exc):  # (after the print: it frees the traceback's frames)
                self.out["cuda_poisoned"] = {"by": key, "error": line[:300]}
            self.out.pop("running")
            self.out.setdefault("piece_s", {})[key] = round(self.clock() - t, 1)
            self._write()
            return None
        self.out.pop("running")
        seconds = self.out.setdefault("piece_s", {})[key] = round(self.clock() - t, 1)
        if timed:
            self.out[key] = value = seconds
        elif merge:
            self.out |= value
        elif keep:
            self.out[key] = value
        self._write()
        return value

    def done(self) -> dict[str, Any]:
        self._write()
        return self.out

    def _skip_reason(self, key: str, *, cuda: bool) -> str | None:
        if self.only and key not in self.only | {"build_s"}:
            return "not in RLCTL_GPU_CHECK_ONLY"
        if self.budget_s is not None and self.elapsed_s() > self.budget_s:
            return f"the budget of {self.budget_s:g} s was spent"
        if cuda and "cuda_poisoned" in self.out:
            return f"the CUDA context was lost in {self.out['cuda_poisoned']['by']}"
        return None

    def _write(self) -> None:
        """The JSON so far, whole or not at all: written beside `path`, then renamed over it (a kill during the write
        leaves the last one); a value JSON cannot hold is written as its text rather than ending the check."""
        if self.path is not None:
            part = self.path.with_name(self.path.name + ".part")
            part.write_text(json.dumps(self.out, indent=2, default=str) + "\n")
            os.replace(part, self.path)


def cuda_context_lost(exc: BaseException) -> bool:
    """Whether `exc` left this process's CUDA context unusable (a device-side assert, an illegal memory access):
    by its message, or, for another CUDA error on a CUDA machine but running out of memory (which the next piece
    recovers from), by a small operation that fails after it. Before that operation the failed piece's tensors,
    locals of the traceback's frames, are freed and the allocator's cache emptied: it could fail for want of memory.
    """
    text = str(exc)
    if STICKY_CUDA.search(text):
        return True
    if "CUDA" not in text or OUT_OF_MEMORY.search(text):
        return False
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError) or not torch.cuda.is_available():
        return False
    traceback.clear_frames(exc.__traceback__)
    gc.collect()
    torch.cuda.empty_cache()
    try:
        torch.ones(1, device="cuda").add_(1).item()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any failure here is the answer
        return True
    return False


def run_capped(argv: list[str], *, timeout_s: float, grace_s: float = 20.0) -> subprocess.CompletedProcess[str]:
    """`argv` from the repository, in a process group of its own. Past `timeout_s` the group gets SIGTERM (`rlctl
    launch` stops its job's agents on it), SIGKILL `grace_s` later, and `subprocess.TimeoutExpired` is raised with
    all it printed as text (`subprocess.run` kills the child alone, leaving what it started on the GPU, and hands
    back bytes).

    A group, not a session: the device tool ends what a command leaves running when it returns, but not processes
    of a new session, which would keep the GPU into the next run. Its stdin is /dev/null: a group in the background
    of a terminal that read it would be stopped (SIGTTIN) until its deadline."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        process_group=0,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out, err = _end(proc, grace_s=grace_s)
        raise subprocess.TimeoutExpired(argv, timeout_s, output=out, stderr=err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def ran(argv: list[str], *, timeout_s: float) -> tuple[int | None, str, str]:
    """`run_capped`'s (exit status, stdout, stderr), the status None where it was ended past `timeout_s` (what it
    printed by then kept)."""
    try:
        proc = run_capped(argv, timeout_s=timeout_s)
    except subprocess.TimeoutExpired as e:
        return None, as_text(e.stdout), as_text(e.stderr)
    return proc.returncode, proc.stdout, proc.stderr


def _end(proc: subprocess.Popen[str], *, grace_s: float) -> tuple[str, str]:
    out: Any = ""
    err: Any = ""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.communicate(timeout=wait_s)
        except subprocess.TimeoutExpired as e:  # (`communicate` keeps what it read: the next call returns it too)
            out, err = e.stdout, e.stderr
    for stream in (proc.stdout, proc.stderr):  # held open by one that left the group: what it read so far
        if stream is not None:
            stream.close()
    proc.wait()
    return as_text(out), as_text(err)


def as_text(out: bytes | str | None) -> str:
    """What a command printed before its deadline (`TimeoutExpired` keeps it as bytes, text mode or not)."""
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""


def last_json(stdout: str) -> dict[str, Any] | None:
    """The last line of `stdout` that is a JSON object, or None."""
    for line in reversed(stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return None
