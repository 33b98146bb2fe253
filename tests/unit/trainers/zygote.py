"""Rank processes forked from one interpreter that has imported torch and megatron-core once.

Each rank of the model-parallel tests is its own process, and importing megatron-core takes ≈ 8 s of CPU here
(4 ranks on 2 cores: ≈ 16 s a phase before the first gloo message). This zygote imports it once per test session;
every rank is a fork of it running its script as `python script ARGS` would (its argv, environment, script
directory on sys.path, `__main__`), with its own stderr file and exit code. It forks only while it is a single
OS thread (a fork of a threaded process may inherit a held lock); otherwise, or when it is gone, the caller
starts the script with `subprocess` as before.

    test ── JSON line {script, argv, env, err, status} ──▶ zygote ── fork ──▶ rank (runpy, then _exit)
         ◀── JSON line {pid} | {refused} ──────────────────      └── reaps it: exit code → the status file

Run as `python zygote.py` by `ForkedRanks`; never imported by a rank.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

PRELOAD = (
    "torch",
    "torch.distributed",
    "rlctl.trainers.megatron.model",
    "rlctl.trainers.megatron.backend",
    "rlctl.trainers.native",
    "rlctl.rl.learner",
    "rlctl.checkpoint.trainer",
    "rlctl.agents.weights",
)


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def _child(req: dict[str, Any]) -> None:
    """In the fork: become `python script ARGV` with the request's environment and stderr, and exit."""
    code: Any = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the zygote's command stream is not the rank's stdin
        err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(err, 2)
        os.dup2(err, 1)  # the zygote's stdout answers the test: a rank's prints go with its stderr
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's own streams)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(req["env"])
        if os.environ.get("PYTHONFAULTHANDLER"):  # as `python` would at start: a fatal signal's stacks to stderr
            import faulthandler

            faulthandler.enable(file=sys.stderr, all_threads=True)
        script = req["script"]
        sys.argv = [script, *req["argv"]]
        sys.path[0] = os.path.dirname(script)
        import runpy

        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (a rank's failure is its exit code and traceback, as a process's)
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core warns at import that Transformer Engine is missing
        for name in PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        with contextlib.suppress(ImportError):  # megatron-core itself (absent: the ranks say so themselves)
            importlib.import_module("rlctl.trainers.megatron.model").import_megatron()
    running: dict[int, str] = {}  # pid → status file
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    stdin_open, pending = True, b""
    while stdin_open or running:
        if stdin_open and b"\n" not in pending and sel.select(timeout=0.05):
            data = os.read(0, 1 << 16)
            if not data:
                stdin_open = False
                for pid in running:  # the test session ended: no rank outlives it
                    os.kill(pid, 9)
                continue
            pending += data
        if b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            if _threads() > 1:
                answer: dict[str, Any] = {"refused": f"{_threads()} threads"}
            else:
                pid = os.fork()
                if pid == 0:
                    _child(req)
                running[pid] = req["status"]
                answer = {"pid": pid}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
        elif not stdin_open:
            time.sleep(0.05)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            path = running.pop(pid)
            tmp = path + ".tmp"
            Path(tmp).write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(tmp, path)


class ForkedRank:
    """The part of `subprocess.Popen` the tests use, for a rank the zygote forked."""

    def __init__(self, pid: int, err: Path, status: Path) -> None:
        self.pid, self.err, self.status = pid, err, status
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.status.exists():
            self.returncode = int(self.status.read_text())
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return None, self.err.read_text(errors="replace")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)


class ForkedRanks:
    """The session's zygote (started on first use, with `env`) and the ranks it forks."""

    def __init__(self, *, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.scratch: Path | None = None  # the ranks' stderr and exit-status files
        self.count = 0

    def _zygote(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.scratch = Path(tempfile.mkdtemp(prefix="rlctl-ranks-"))
            self.proc = subprocess.Popen(
                [sys.executable, __file__], env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            atexit.register(self.close)
        return self.proc

    def start(self, script: Path, argv: list[str], env: dict[str, str]) -> ForkedRank | None:
        """`python script ARGV` with `env`, forked; None where the zygote cannot fork (start a process instead)."""
        proc = self._zygote()
        assert self.scratch is not None and proc.stdin is not None and proc.stdout is not None
        self.count += 1
        err, status = self.scratch / f"rank-{self.count}.err", self.scratch / f"rank-{self.count}.status"
        req = {"script": str(script), "argv": argv, "env": env, "err": str(err), "status": str(status)}
        try:
            proc.stdin.write(json.dumps(req) + "\n")
            proc.stdin.flush()
            answer = json.loads(proc.stdout.readline() or "{}")
        except (OSError, ValueError):
            return None
        return ForkedRank(int(answer["pid"]), err, status) if "pid" in answer else None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stdin: IO[str] | None = self.proc.stdin
            if stdin is not None:
                stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


if __name__ == "__main__":
    serve()
