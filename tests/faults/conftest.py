"""The fault-injection suite's table: every scenario records one row (faultlib.record); it is printed at the
end of the run, with -q too."""

from __future__ import annotations

import pytest

from . import faultlib


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not faultlib.ROWS:
        return
    terminalreporter.write_sep("=", "fault injection")
    for line in faultlib.table(faultlib.ROWS):
        terminalreporter.write_line(line)
