"""The GPU check's pieces (bench/gpu_check.py): a lent GPU machine gives one run, so a piece that fails is recorded
and the others still run, the JSON so far is on disk after every piece, and a time budget skips what is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.gpu_check import Pieces
from bench.gpu_pieces import as_text, last_json, run_capped

CAPPED = "bench.gpu_pieces.run_capped"  # what the pieces run their subprocesses with (`gpu_pieces.ran`)


def test_a_failing_piece_is_recorded_and_the_rest_run(tmp_path: Path) -> None:
    out: dict[str, object] = {"device": "cpu"}
    path = tmp_path / "gpu-check.json"
    piece = Pieces(out, path=str(path), budget_s=None)
    assert piece("a", lambda: {"x": 1}) == {"x": 1}
    assert piece("b", lambda: 1 / 0) is None
    assert json.loads(path.read_text())["errors"]["b"]["error"] == "ZeroDivisionError: division by zero"
    assert piece("c", lambda: {"y": 2}, merge=True) == {"y": 2}
    assert piece("d", lambda: None, timed=True) is not None
    r = json.loads(path.read_text())
    assert r["a"] == {"x": 1} and r["y"] == 2 and "b" not in r and isinstance(r["d"], float)
    assert set(r["piece_s"]) == {"a", "b", "c", "d"} and any(
        "test_bench_gpu_check" in f for f in r["errors"]["b"]["at"]
    )
    assert piece.artifacts == tmp_path


def test_a_write_cut_off_halfway_leaves_the_last_json(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The JSON was rewritten in place (truncated, then written): a run killed during a write left an empty or cut
    file, losing every piece measured. Now a file beside it replaces it once written."""
    path = tmp_path / "gpu-check.json"
    piece = Pieces({}, path=str(path), budget_s=None, clock=Clock())
    piece("a", lambda: {"x": 1})

    def cut(self: Path, text: str, *args: Any, **kw: Any) -> int:
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])
        raise KeyboardInterrupt  # the kill, halfway

    monkeypatch.setattr(Path, "write_text", cut)
    with pytest.raises(KeyboardInterrupt):
        piece("b", lambda: {"y": 2})
    assert json.loads(path.read_text()) == {"a": {"x": 1}, "piece_s": {"a": 0.0}}


def test_a_value_json_cannot_hold_is_written_as_text(tmp_path: Path) -> None:
    """A piece's value json.dumps cannot write (a dtype, a path) raised TypeError out of the write: the check ended
    there, its later pieces not run."""
    path = tmp_path / "gpu-check.json"
    piece = Pieces({}, path=str(path), budget_s=None)
    assert piece("a", lambda: {"dtype": torch.bfloat16, "at": tmp_path}) is not None
    assert json.loads(path.read_text())["a"] == {"dtype": "torch.bfloat16", "at": str(tmp_path)}


def test_pieces_past_the_budget_are_skipped() -> None:
    out: dict[str, object] = {}
    piece = Pieces(out, path=None, budget_s=-1.0)
    ran = []
    assert piece("late", lambda: ran.append(1)) is None
    assert ran == [] and out["skipped"] == ["late"] and piece.done() is out


def test_only_the_pieces_named_run_and_the_build() -> None:
    """`RLCTL_GPU_CHECK_ONLY`: a short second run on a lease runs the pieces it names (and the checkpoint's build)."""
    out: dict[str, object] = {}
    piece = Pieces(out, path=None, budget_s=None, only={"engine_mixed"})
    assert piece("build_s", lambda: None, timed=True) is not None
    assert piece("engine", lambda: {"64": 1.0}) is None
    assert piece("engine_mixed", lambda: {"tok_s": 1.0}) == {"tok_s": 1.0}
    assert out["skipped"] == ["engine"] and out["engine_mixed"] == {"tok_s": 1.0} and "build_s" in out


def test_a_cpu_bench_keeps_its_headline_figures(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """gpu-check's CPU benches keep the figures the issues name (and each staleness configuration's samples/s and
    all-units-idle fraction), not the curves; `bench.NAME.run` is what runs (a stand-in here: the benches run in
    their own tests)."""
    import sys
    import types

    import bench.gpu_check as gc

    full = {"eta4_over_eta1": 1.3, "eta2_over_eta1": 1.1, "eta1_over_sync": 1.0, "staleness_violations": 0}
    full |= {"lost": 0, "iterations": 12, "seeds": [0], "wall_s": 9.0}
    full["configs"] = {"eta1": {"samples_per_s": 2.0, "all_idle": 0.1, "reward_curves": [[0.1]]}}
    calls = []

    def run(*, quick: bool) -> dict[str, object]:
        calls.append(quick)
        return full

    monkeypatch.setitem(sys.modules, "bench.staleness", types.SimpleNamespace(run=run))
    got = gc._cpu_bench("staleness", quick=True)
    assert calls == [True] and "seeds" not in got and "wall_s" not in got
    assert got["eta4_over_eta1"] == 1.3 and got["configs"] == {"eta1": {"samples_per_s": 2.0, "all_idle": 0.1}}


def test_the_check_names_the_device_by_its_catalog_entry() -> None:
    """The lent machine is an H200 now: its bandwidth floor, MFU peak and the launched job's inventory were an
    H100's whatever the device (80 GB planned on a 141 GB card)."""
    from bench.gpu_check import catalog_gpu

    assert catalog_gpu("NVIDIA H200") == "H200"
    assert catalog_gpu("NVIDIA H100 80GB HBM3") == "H100"
    assert catalog_gpu("NVIDIA A100-SXM4-80GB") == "A100"
    assert catalog_gpu("NVIDIA GeForce RTX 4090") == "H100"  # not in the catalog: priced as the reference part


# ---- limits: a lent machine gives one command of at most 600 s ---------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_subprocess_piece_gets_what_is_left_of_the_budget() -> None:
    """A piece's subprocess was given its own timeout (a build 600 s, `pytest tests/gpu` 300 s) whatever was left
    of `RLCTL_GPU_CHECK_BUDGET_S`: a piece started at 440 s of 450 could run to 1040 s."""
    clock = Clock()
    piece = Pieces({}, path=None, budget_s=450.0, clock=clock)
    assert piece.timeout_s(600) == 450 and piece.timeout_s(300) == 300
    clock.now += 440
    assert piece.timeout_s(600) == 10 and piece.timeout_s(5) == 5
    clock.now += 100  # past the budget, in a piece that started inside it: its subprocess still gets a second
    assert piece.timeout_s(600) == 1.0
    assert Pieces({}, path=None, budget_s=None, clock=clock).timeout_s(600) == 600


def test_the_budget_counts_from_the_commands_start(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The budget counted from the pieces' start, after the recipe's installs and the check's imports, all within the
    device command's limit: `RLCTL_GPU_CHECK_T0` (the recipe's `date +%s`) is where it counts from now."""
    import bench.gpu_check as gc

    clock = Clock()
    assert Pieces({}, path=None, budget_s=450.0, clock=clock, spent_s=440.0).timeout_s(600) == 10
    monkeypatch.setenv(gc.ENV_BUDGET, "100")
    monkeypatch.setenv(gc.ENV_T0, str(int(time.time()) - 101))
    monkeypatch.delenv(gc.ENV_OUT, raising=False)
    monkeypatch.delenv(gc.ENV_ONLY, raising=False)
    monkeypatch.setattr(gc, "_build", lambda *a, **kw: pytest.fail("built past the budget"))
    r = gc.run(quick=True)
    assert r["skipped"] == ["build_s", "gpu_tests"] and "budget of 100 s" in r["skipped_why"]["build_s"]
    monkeypatch.setenv(gc.ENV_T0, "soon")
    with pytest.raises(ValueError, match=r"RLCTL_GPU_CHECK_T0='soon': .*Unix time"):
        gc.run(quick=True)


def test_the_json_names_the_piece_a_killed_run_was_in(tmp_path: Path) -> None:
    path = tmp_path / "gpu-check.json"
    piece = Pieces({}, path=str(path), budget_s=None)
    seen = []
    piece("engine_mixed", lambda: seen.append(json.loads(path.read_text())["running"]))
    assert seen == ["engine_mixed"] and "running" not in json.loads(path.read_text())


def test_a_sticky_cuda_error_skips_the_later_in_process_cuda_pieces() -> None:
    """After a device-side assert or an illegal memory access every CUDA call of the process fails: the later
    in-process pieces would each record the same error (or hang), so they are skipped with the reason; the pieces
    in processes of their own and on the CPU still run."""
    out: dict[str, Any] = {}
    piece = Pieces(out, path=None, budget_s=None)

    def broken() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert piece("engine_mixed", lambda: {"tok_s": 1.0}) == {"tok_s": 1.0}
    assert piece("engine_syncs", broken) is None
    assert out["cuda_poisoned"]["by"] == "engine_syncs" and "illegal memory" in out["cuda_poisoned"]["error"]
    assert piece("actmem", lambda: {"cuts": {}}) is None
    assert piece("megatron", lambda: {"min_update_cosine": 1.0}, cuda=False) == {"min_update_cosine": 1.0}
    assert piece("sampler_share", lambda: {"share": 0.1}, cuda=False) == {"share": 0.1}
    assert out["skipped"] == ["actmem"] and "engine_syncs" in out["skipped_why"]["actmem"]
    assert "actmem" not in out and out["megatron"] == {"min_update_cosine": 1.0}


def test_other_errors_leave_the_cuda_pieces_running() -> None:
    out: dict[str, Any] = {}
    piece = Pieces(out, path=None, budget_s=None)

    def oom() -> None:  # not sticky: the allocator frees and the next piece runs
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert piece("actmem", oom) is None and piece("train", lambda: 1.0 / 0) is None
    assert piece("delta", lambda: {"x": 1}) == {"x": 1} and "cuda_poisoned" not in out and "skipped" not in out


class Held:
    """A failed piece's tensor (a local of its frames, which the error's traceback holds)."""


def fake_cuda(monkeypatch, events: list[str], held: list[Any]) -> None:  # type: ignore[no-untyped-def]
    """A CUDA machine for cuda_context_lost's probe: the probe fails for want of memory while the failed piece's
    tensor is alive, as an H100 full of that piece's activations would."""
    ones = torch.ones

    def probe(*args: Any, **kw: Any) -> torch.Tensor:
        if any(ref() is not None for ref in held):
            events.append("probe, the piece's tensors held")
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        events.append("probe")
        return ones(1)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("synchronize"))
    monkeypatch.setattr(torch, "ones", probe)


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
    ],
)
def test_an_out_of_memory_error_is_not_a_lost_context(monkeypatch, error: Exception) -> None:  # type: ignore[no-untyped-def]
    """An OOM frees with the failed piece: it was probed with a small allocation while the piece's tensors were
    still held, which could run out of memory too and mark the run poisoned, skipping every later CUDA piece."""
    events: list[str] = []
    held: list[Any] = []
    fake_cuda(monkeypatch, events, held)

    def oom() -> None:
        tensor = Held()
        held.append(weakref.ref(tensor))
        raise error

    out: dict[str, Any] = {}
    assert Pieces(out, path=None, budget_s=None)("actmem", oom) is None
    assert "cuda_poisoned" not in out and events == []


def test_another_cuda_error_is_probed_once_the_pieces_tensors_are_freed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    events: list[str] = []
    held: list[Any] = []
    fake_cuda(monkeypatch, events, held)

    def fails() -> None:
        tensor = Held()
        held.append(weakref.ref(tensor))
        raise RuntimeError("CUDA error: operation not supported on this device")

    out: dict[str, Any] = {}
    assert Pieces(out, path=None, budget_s=None)("engine_compiled", fails) is None
    assert "cuda_poisoned" not in out and events == ["empty_cache", "probe", "synchronize"]


def test_a_capped_subprocess_ends_with_its_group_and_keeps_what_it_printed() -> None:
    """`run_capped` past its timeout: what the command printed comes back as text, and what it started (a test's
    own subprocess, a launched job's processes) is ended with it, not left on the GPU."""
    piece = Pieces({}, path=None, budget_s=450.0, clock=Clock())
    piece.clock.now += 449  # type: ignore[attr-defined]
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_capped(["sh", "-c", "sleep 60 & echo $!; echo started; wait"], timeout_s=piece.timeout_s(600))
    child, said = as_text(e.value.stdout).split()
    assert said == "started" and e.value.timeout == 1.0
    assert _gone(int(child))


def _gone(pid: int) -> bool:
    """The process has ended (gone, or a zombie its new parent has not reaped yet)."""
    for _ in range(100):
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_gpu_tests_past_its_timeout_counts_the_tests_that_ended(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`pytest tests/gpu` cut off at its timeout lost everything (no counts, no gpu-tests.txt): now each test's
    `-v` line so far is counted and the test it was in is named."""
    import bench.gpu_check as gc

    printed = (
        "tests/gpu/test_gpu_engine.py::test_a PASSED [ 10%]\n"
        "tests/gpu/test_gpu_engine.py::test_b FAILED [ 20%]\n"
        "tests/gpu/test_gpu_trainer.py::test_c PASSED [ 30%]\n"
        "tests/gpu/test_gpu_megatron.py::test_d "
    )
    calls = []

    def capped(argv: list[str], *, timeout_s: float) -> Any:
        calls.append((argv, timeout_s))
        raise subprocess.TimeoutExpired(argv, timeout_s, output=printed.encode(), stderr=b"")

    monkeypatch.setattr(CAPPED, capped)
    r = gc._gpu_tests(tmp_path, timeout_s=42)
    assert (r["passed"], r["failed"], r["skipped"], r["error"], r["rc"]) == (2, 1, 0, 0, None)
    assert r["timed_out"] == "after 42 s, in tests/gpu/test_gpu_megatron.py::test_d"
    assert r["failing"] == ["tests/gpu/test_gpu_engine.py::test_b FAILED [ 20%]"]
    assert (tmp_path / "gpu-tests.txt").read_text() == printed
    argv, timeout_s = calls[0]
    assert timeout_s == 42 and "-v" in argv and f"--timeout={gc.TEST_TIMEOUT_S}" in argv  # pytest-timeout is here


def test_gpu_tests_that_ended_are_counted_from_pytest_summary(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import bench.gpu_check as gc

    printed = "tests/gpu/a.py::t SKIPPED (no CUDA device) [100%]\n=== 1 passed, 9 skipped in 3.1s ===\n"
    monkeypatch.setattr(CAPPED, lambda argv, **kw: subprocess.CompletedProcess(argv, 0, printed, ""))
    r = gc._gpu_tests(None)
    assert (r["passed"], r["failed"], r["skipped"], r["rc"]) == (1, 0, 9, 0) and "timed_out" not in r


MEGATRON_JSON = '{"min_update_cosine": 0.99, "tensors": 36, "train_tok_s": {"torch": 10.0, "megatron": 6.0}}'


@pytest.mark.parametrize("ended", ["aborted at teardown", "hung at teardown"], ids=["aborted", "hung"])
def test_a_megatron_result_printed_before_a_failing_teardown_is_kept(monkeypatch, ended: str) -> None:  # type: ignore[no-untyped-def]
    """bench.gpu_megatron prints its result, then destroys its process group: an abort or a hang there threw the
    measured result away ("exited -6")."""
    import bench.gpu_check as gc

    stdout = f"loading\n{MEGATRON_JSON}\n"

    def capped(argv: list[str], *, timeout_s: float) -> Any:
        if ended == "hung at teardown":
            raise subprocess.TimeoutExpired(argv, timeout_s, output=stdout.encode(), stderr=b"NCCL watchdog")
        return subprocess.CompletedProcess(argv, -6, stdout, "terminate called ... Aborted")

    monkeypatch.setattr(CAPPED, capped)
    r = gc._megatron(Path("model"), "cuda", timeout_s=30)
    assert r["min_update_cosine"] == 0.99 and r["tensors"] == 36
    if ended == "hung at teardown":
        assert r["rc"] is None and r["after_result"] == "did not end within 30 s" and "NCCL" in r["stderr_tail"]
    else:
        assert r["rc"] == -6 and r["after_result"] == "exited -6" and "Aborted" in r["stderr_tail"]


def test_a_megatron_run_with_no_result_is_an_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import bench.gpu_check as gc

    monkeypatch.setattr(CAPPED, lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "ImportError: megatron"))
    with pytest.raises(RuntimeError, match=r"bench\.gpu_megatron exited 1: ImportError: megatron"):
        gc._megatron(Path("model"), "cuda")
    monkeypatch.setattr(CAPPED, lambda argv, **kw: subprocess.CompletedProcess(argv, 0, MEGATRON_JSON, ""))
    assert "rc" not in gc._megatron(Path("model"), "cuda")


# piece → its function in bench.gpu_check: those with no GPU figures yet (docs/gpu.md), and those with some
NEVER_ON_A_GPU = {
    **{"engine_syncs": "engine_syncs", "engine_mixed": "engine_mixed", "actmem": "actmem_check"},
    **{"archs_vs_cpu": "_archs_vs_cpu", "megatron": "_megatron", "gpu_tests": "_gpu_tests"},
}
MEASURED_ON_ONE = {
    **{"engine": "engine_tok_s", "engine_vs_cpu": "engine_vs_cpu", "hf_generate_tok_s": "hf_generate_tok_s"},
    **{"engine_step_ops": "step_ops", "train": "_train", "delta": "_delta", "publisher": "_publisher_host_bytes"},
    **{"launch": "_launch", "grpo_step_vs_cpu": "_grpo_vs_cpu", "sampler_share": "_sampler_share"},
    "transport": "_transport",
}


def test_the_check_runs_what_no_gpu_has_measured_first_within_its_budget(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`run`'s order and limits, each piece's function a stand-in recording its call: the pieces with no GPU figures
    yet come before those that have some (a spent budget skips the latter), and every subprocess piece's timeout is
    within the budget (`RLCTL_GPU_CHECK_BUDGET_S`), where each had its own 300 or 600 s."""
    import types

    import bench.gpu_check as gc

    calls: list[tuple[str, float | None]] = []

    def fake(name: str) -> Any:
        def call(*args: Any, timeout_s: float | None = None, limit: Any = None, **kw: Any) -> Any:
            calls.append((name, timeout_s if limit is None else limit(600)))
            return {"4": {"tok_s": 1.0, "step_ms": 1.0}} if name == "engine_tok_s" else {}

        return call

    for name in ("_build", "engine_compiled", *NEVER_ON_A_GPU.values(), *MEASURED_ON_ONE.values()):
        monkeypatch.setattr(gc, name, fake(name))
    arch = types.SimpleNamespace(params=1, weight_bytes=2)
    monkeypatch.setattr(gc, "check_hf_dir", lambda d: types.SimpleNamespace(arch=arch))
    monkeypatch.setenv(gc.ENV_BUDGET, "100")
    monkeypatch.delenv(gc.ENV_OUT, raising=False)
    monkeypatch.delenv(gc.ENV_ONLY, raising=False)

    r = gc.run(quick=True)
    assert "errors" not in r and "skipped" not in r, r
    order = [name for name, _ in calls]
    assert max(map(order.index, NEVER_ON_A_GPU.values())) < min(map(order.index, MEASURED_ON_ONE.values())), order
    timeouts = dict(calls)
    for name in ("_build", "_archs_vs_cpu", "_megatron", "_gpu_tests", "_launch"):
        assert timeouts[name] is not None and 0 < timeouts[name] <= 100, (name, timeouts[name])


def test_a_megatron_result_survives_a_teardown_ended_by_sigterm(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """bench.gpu_megatron printed its result into a pipe without flushing, then hung in destroy_process_group:
    run_capped's SIGTERM ended it with the line still in Python's buffer, and the result was lost (the machine's
    shell sets no PYTHONUNBUFFERED). The hang is a SIGTERM the teardown sends itself here, as run_capped's would
    land (no sleep to time)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # the child inherits this environment
    child = (
        "import os, signal, sys\n"
        "import bench.gpu_megatron as m\n"
        "m.compare = lambda model_dir, device: {'min_update_cosine': 0.99, 'tensors': 36}\n"
        "m.dist.init_process_group = lambda *a, **kw: None\n"
        "def hang():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    signal.pause()\n"
        "m.dist.destroy_process_group = hang\n"
        "m.main(['model', 'cpu'])\n"
    )
    proc = run_capped([sys.executable, "-c", child], timeout_s=120, grace_s=1)
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert last_json(proc.stdout) == {"min_update_cosine": 0.99, "tensors": 36}, proc.stdout


def test_a_capped_subprocess_stays_in_the_commands_session_in_a_group_of_its_own() -> None:
    """run_capped started its command in a new session: the device tool ends what a command leaves running when it
    returns, except processes of a new session, so a piece cut off by the command's limit kept the GPU into the
    next run. Now a process group of its own (what run_capped ends at the deadline) in the check's session."""
    child = "import os; print(os.getsid(0), os.getpgid(0), os.getpid())"
    sid, pgid, pid = map(int, run_capped([sys.executable, "-c", child], timeout_s=60).stdout.split())
    assert sid == os.getsid(0) and pgid == pid != os.getpgid(0)
