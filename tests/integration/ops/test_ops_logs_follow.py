"""`rlctl logs -f` on a unit that runs on the SSH site (its log exists only there, behind the shaped link,
in the site's private /tmp): the follower prints the log's last lines, then lines written on the site
while it follows, then the unit's last words when the job is stopped — and exits by itself once the
site's backend says the unit is gone. Ctrl-C stops a follower at once."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import RLCTL_AT_A_TERMINAL
from tests.integration.netsite import on_site, site_workdir

from .conftest import events, job_yaml, metrics_rows, rlctl, rlctl_json, wait_for
from .test_ops_cross_site import cross_site_inventory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


class Follower:
    """`rlctl logs JOB AGENT -f` in the background, its stdout lines collected as they come."""

    def __init__(self, job_dir: Path, agent: str) -> None:
        self.proc = subprocess.Popen(
            [*RLCTL_AT_A_TERMINAL, "logs", str(job_dir), agent, "-f", "-n", "5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def wait(self, timeout_s: float) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def test_follow_a_remote_units_log_until_the_job_is_stopped(services, tmp_path, launcher):
    workdir = site_workdir()
    inv = cross_site_inventory(services, tmp_path / "sites.yaml", Path(workdir))
    job = job_yaml(tmp_path / "follow.yaml", inventory=[str(inv)], trainer="train", rollout="gen", iterations=5000)
    job_dir = tmp_path / "run"
    site_log = f"{workdir}/jobs/run/logs/rollout-0.log"
    proc = launcher(str(job), "--job-dir", str(job_dir))
    wait_for("a trained iteration", lambda: len(metrics_rows(job_dir)) >= 1, 180, alive=proc)
    assert not Path(site_log).exists()  # only the site sees it

    shown = rlctl("logs", str(job_dir), "rollout/0", "-n", "3")  # without -f: the tail, read on the site
    assert shown.returncode == 0 and 0 < len(shown.stdout.splitlines()) <= 3, shown.stderr
    every = rlctl("logs", str(job_dir), "-n", "2")  # every agent's: the unit's read on its site, the others' here
    heads = [line for line in every.stdout.splitlines() if line.startswith("==> ")]
    assert every.returncode == 0 and heads[:1] == ["==> controller-0 <=="], every.stdout + every.stderr
    unit = every.stdout.split("==> rollout-0 <==\n", 1)[1].split("==> ", 1)[0].splitlines()
    assert len(unit) == 2 and not any(line.startswith("(log on site") for line in unit), every.stdout
    follower = Follower(job_dir, "rollout/0")
    interrupted = Follower(job_dir, "rollout/0")
    try:
        wait_for("the log's first lines", lambda: follower.saw("starting on"), 60)
        marker = f"written on the site while following {uuid.uuid4().hex[:8]}"
        t0 = time.monotonic()
        wrote = on_site(services, f"echo '{marker}' >> {site_log}")
        assert wrote.returncode == 0, wrote.stderr
        wait_for("the new line", lambda: follower.saw(marker), 30)
        print(f"\na line written on the SSH site showed up {time.monotonic() - t0:.2f} s later")
        assert follower.proc.poll() is None  # the unit still runs: still following

        wait_for("the second follower's first lines", lambda: interrupted.saw("starting on"), 60)
        interrupted.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert interrupted.wait(timeout_s=30) == 130  # the CLI's exit code for an interrupt

        code, stopped = rlctl_json("stop", str(job_dir), timeout_s=180)
        assert code == 0 and stopped["problems"] == [], stopped
        proc.wait(timeout=60)
        t_stop = time.monotonic()
        assert follower.wait(timeout_s=60) == 0  # the SSH backend says rollout-0 exited: the follower ends
        print(f"the follower ended {time.monotonic() - t_stop:.2f} s after `rlctl stop` returned")
    finally:
        follower.kill()
        interrupted.kill()
    assert any(e["event"] == "job_end" for e in events(job_dir))
    last_words = "rollout-0: stopped after"  # what the unit logs as it leaves (agents/rollout.py)
    assert follower.saw(last_words), follower.lines[-5:]
    assert sum(marker in line for line in follower.lines) == 1  # printed once
    assert follower.lines.index(next(x for x in follower.lines if marker in x)) < follower.lines.index(
        next(x for x in follower.lines if last_words in x)
    )
    there = on_site(services, f"grep -c '{last_words}' {site_log}")
    assert there.stdout.strip() == "1"
