"""The controller's loop sets the agents' gauges once every GAUGES_EVERY_S, not at each message it handles; a trained
iteration's staleness violations reach their counter and the job's gauge; a resumed controller's first scrape reads
what its checkpoint restored."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rlctl.agents.controller import GAUGES_EVERY_S, ControllerAgent
from rlctl.agents.controller_checkpoints import Checkpoints
from rlctl.agents.messages import CheckpointWritten
from rlctl.agents.views import status
from rlctl.launch.agentenv import ENV_RESUME
from rlctl.transport import InprocTransport
from tests.unit.agents.test_agents_gone_peers import Running
from tests.unit.controller_harness import HandledController, small_job


def test_the_agents_gauges_are_set_once_a_period_and_when_the_loop_ends(tmp_path: Path) -> None:
    # an update reads every agent and every sample in the ledger: at each message of the loop, seconds an iteration
    h = HandledController(tmp_path, small_job("gauges", iterations=2), listen="inproc://gauges-every")
    try:
        value = h.ctl.metrics.registry.get_sample_value
        labels = {"role": "rollout", "name": "rollout-0", "site": h.ctl.sites.get("rollout-0", "")}
        h.ctl.peers["rollout-0"].last_seen = 0.0
        h.ctl._gauges(100.0)
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.0
        h.ctl._gauges(100.0 + GAUGES_EVERY_S / 2)
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.0  # not due yet
        h.ctl._gauges(100.0 + GAUGES_EVERY_S)
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.0 + GAUGES_EVERY_S
        h.ctl._gauges(100.5 + GAUGES_EVERY_S, due=True)  # the loop's end: what its last turn saw
        assert value("rlctl_agent_heartbeat_age_seconds", labels) == 100.5 + GAUGES_EVERY_S
    finally:
        h.close()


def test_a_staleness_violation_a_trainer_step_reports_reaches_the_counter_and_status(tmp_path: Path) -> None:
    # the violations (samples staler than η: must stay 0) were in status's `-o json` and the summary alone, no metric
    r = Running(tmp_path, "gauges-violations")
    try:
        value = r.ctl.metrics.registry.get_sample_value
        r.train()
        assert value("rlctl_sample_staleness_violations_total") == 0.0
        r.train(violations=2)
        r.train(violations=1)
        assert value("rlctl_sample_staleness_violations_total") == 3.0
        assert value("rlctl_job_staleness_violations") == 3.0  # (no resume: the job's count is this controller's)
        assert status(r.ctl.snapshot(), now=time.monotonic())["staleness_violations"] == 3
    finally:
        r.close()


def _scrape(port: int) -> dict[str, float]:
    """/metrics as Prometheus reads it: each unlabelled sample's value by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_a_resumed_controllers_first_scrape_reads_its_checkpoints_figures(tmp_path: Path, monkeypatch) -> None:
    """Checkpoint v2 holds 3 staleness violations; Prometheus scrapes the controller resumed from it while it reads the
    checkpoint. That first scrape reads v2, 2 iterations completed, the job's 3 (`rlctl_job_staleness_violations`)
    and this controller's counter at 0, versus /metrics answering before the resume: NaN, and a counter at 0 that then
    jumped to 3, which increase() took for 3 new violations (RlctlStalenessViolation paged again at each resume)."""
    job = small_job("first-scrape", iterations=6)
    h = HandledController(tmp_path, job, listen="inproc://first-scrape-a")
    try:
        h.ctl.violations = 3  # as `_trained` counted the trainer's `staleness_violations` before v2
        h.ctl._checkpoint_due(2)
        assert h.ctl._checkpoint(CheckpointWritten(version=2, checkpoint="d" * 64))
    finally:
        h.close()
    scrapes: list[dict[str, float]] = []
    scraping: list[threading.Thread] = []
    resume = Checkpoints._resume

    def scraped_while_resuming(self: Checkpoints, version: int) -> None:
        since = time.monotonic()
        scraping.append(threading.Thread(target=lambda: scrapes.append(_scrape(self.metrics_port))))
        scraping[0].start()
        # where /metrics answers already, its answer is made before the resume goes on (1 s at most where it waits)
        self.metrics.wait_scraped(since, timeout_s=1.0)
        resume(self, version)

    monkeypatch.setattr(Checkpoints, "_resume", scraped_while_resuming)
    monkeypatch.setenv(ENV_RESUME, "2")
    ctl = ControllerAgent(h.jd, job, InprocTransport(secret=h.jd.secret()), listen="inproc://first-scrape-b")
    try:
        scraping[0].join(timeout=30)
        first = scrapes[0]
        assert (first["rlctl_checkpoint_version"], first["rlctl_job_staleness_violations"]) == (2.0, 3.0)
        assert first["rlctl_job_iteration"] == 2.0  # the iterations completed, as status's (it read 0 until the next)
        assert first["rlctl_sample_staleness_violations_total"] == 0.0  # none since this controller started
        assert status(ctl.snapshot(), now=time.monotonic())["staleness_violations"] == 3
    finally:
        ctl.listener.close()
        threading.Thread(target=ctl.metrics.close, daemon=True).start()
