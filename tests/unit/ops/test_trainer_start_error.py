"""The line `launch` ends with when a trainer ended before it joined: the first error of its log (the cause), with
the rank that said it when the trainer has several (their lines share one log, the rank in each)."""

from __future__ import annotations

from rlctl.ops.runbase import first_error

LOG = """\
2026-12-04 16:37:05,456 INFO trainer-1 rlctl.agents: starting on vm
2026-12-04 16:37:10,682 ERROR trainer-0 rlctl.agents: MASTER_ADDR 'sitea-2' does not resolve: [Errno -2] no
[W1204 16:37:12.772508604 socket.cpp:764] [c10d] The IPv6 network addresses of (sitea-2, 22571) cannot be retrieved
2026-12-04 16:39:56,300 ERROR trainer-1 rlctl.agents: trainer group: the store timed out
"""


def test_the_first_error_names_its_rank_when_the_trainer_has_several() -> None:
    assert first_error(LOG, ranks=2) == ": rank 0: MASTER_ADDR 'sitea-2' does not resolve: [Errno -2] no"


def test_one_rank_says_no_rank_and_a_log_without_an_error_adds_nothing() -> None:
    assert first_error(LOG, ranks=1) == ": MASTER_ADDR 'sitea-2' does not resolve: [Errno -2] no"
    assert first_error(LOG.splitlines()[0], ranks=2) == ""
