"""Fuzz targets count the inputs they ran; the counts, and each fuzz test's wall time, are printed at the
end of every run (also under `pytest -q`, without `-s`):

    fuzz_count("frames: tcp receiver, mutated streams", 100000)
    ──▶ fuzz frames: tcp receiver, mutated streams: 100000 inputs
        fuzz time test_fuzz_frames.py::test_mutated_frames_only_documented_errors: 5.4 s

Hypothesis runs derandomized (the same examples every run, so CI is reproducible) and without deadlines
(the machine is shared: a slow example is not a failure).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "rlctl-fuzz",
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_PENDING: dict[str, int] = {}  # target → inputs run by the running test (its report carries them: under
# pytest-xdist the tests run in workers and only their reports reach the process that prints the summary)


def record(target: str, n: int) -> None:
    _PENDING[target] = _PENDING.get(target, 0) + n


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    if _PENDING:
        outcome.get_result().user_properties.append(("fuzz_counts", dict(_PENDING)))
        _PENDING.clear()


@pytest.fixture(scope="session")  # session scope: hypothesis tests may use it too
def fuzz_count() -> Callable[[str, int], None]:
    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts: dict[str, int] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for key, value in getattr(rep, "user_properties", ()):
                if key == "fuzz_counts":
                    for target, n in value.items():
                        counts[target] = counts.get(target, 0) + n
    if not counts:
        return
    terminalreporter.write_sep("-", "fuzz counts")
    for target, n in counts.items():
        terminalreporter.write_line(f"fuzz {target}: {n} inputs")
    codec = sum(n for t, n in counts.items() if t.startswith(("frames", "codec")))
    terminalreporter.write_line(f"fuzz total over the frame decoder and message codec: {codec} inputs")
    total_s = 0.0
    for outcome in ("passed", "failed"):
        for rep in terminalreporter.stats.get(outcome, []):
            if "/fuzz/" in getattr(rep, "nodeid", "") and getattr(rep, "when", "") == "call":
                total_s += rep.duration
                terminalreporter.write_line(f"fuzz time {rep.nodeid.split('/fuzz/')[1]}: {rep.duration:.1f} s")
    terminalreporter.write_line(f"fuzz time, all fuzz tests: {total_s:.1f} s")
