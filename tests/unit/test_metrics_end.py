"""The controller's end on purpose on /metrics (rlctl_job_ended), and its wait for one more scrape before it exits:
RlctlControllerDown tells a controller that is gone from one that ended its job by the last value scraped."""

from __future__ import annotations

import threading
import time
import urllib.request

from rlctl.metrics import LINGER_MAX_S, JobMetrics


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_an_ended_job_waits_for_one_more_scrape_and_one_nobody_scrapes_does_not_wait() -> None:
    m = JobMetrics()
    try:
        port = m.serve(0, addr="127.0.0.1")
        assert "rlctl_job_ended 0.0" in _scrape(port)
        assert m.linger_s() == 0.0  # one scrape: no interval to go by (nothing waits where nobody scrapes)
        _scrape(port)
        assert 0 < m.linger_s() <= LINGER_MAX_S
        m.ended.set(1)
        ending = time.monotonic()
        assert not m.wait_scraped(ending, timeout_s=0.0)  # no scrape since
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(m.wait_scraped(ending, timeout_s=60.0)))
        waiter.start()
        assert "rlctl_job_ended 1.0" in _scrape(port)  # what Prometheus keeps as the job's last word
        waiter.join(timeout=60)
        assert got == [True]
    finally:
        m.close()
