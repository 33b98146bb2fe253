"""`rlctl scale` (rlctl.ops.operate.scale): of a job whose index row says it ended, one usage line, not a
"the controller did not answer" about a controller that is gone; its wait for the new units' first samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlctl.config import load_job
from rlctl.errors import PeerTimeout, TransportError, UsageError
from rlctl.launch.jobdir import JobDir
from rlctl.ops import operate
from rlctl.ops.jobref import JobRef
from tests.conftest import ROOT, run_cli
from tests.unit.job_rows import indexed_row


def _job_dir(path: Path) -> JobDir:
    jd = JobDir.create("far", explicit=path)
    jd.write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="demo.yaml")
    return jd


@pytest.mark.parametrize("state", ["finished", "failed", "stopped"])
def test_a_scale_of_an_ended_job_says_it_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("short", explicit=tmp_path / "short2")
    jd.write_job(load_job(ROOT / "jobs" / "demo.yaml").spec, source="demo.yaml")  # prepared
    row = indexed_row("short2", jd.path, job="short", state=state)
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: pytest.fail("no controller to ask"))
    with pytest.raises(UsageError, match=rf"^job short2 ended \({state}\): nothing to scale$") as e:
        operate.scale(JobRef("short2", jd, row), +1, site=None)
    # a finished job's plain resume is refused: the hint said to run it all the same
    assert e.value.exit_code == 2 and e.value.hint == (
        "train it on with `rlctl launch --resume short2 --iterations N`"
        if state == "finished"
        else "continue it with `rlctl launch --resume short2`"
    )


def test_a_scale_of_a_job_stopped_before_it_was_prepared_hints_a_new_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its launch stopped (Ctrl-C in the SFT warm-up) before it wrote job.json: the hint said `continue it with
    rlctl launch --resume short2`, which refuses a job never prepared."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("short", explicit=tmp_path / "short2")
    row = indexed_row("short2", jd.path, job="short", state="stopped", info={"source": "jobs/short.yaml"})
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: pytest.fail("no controller to ask"))
    with pytest.raises(UsageError, match=r"^job short2 ended \(stopped\): nothing to scale$") as e:
        operate.scale(JobRef("short2", jd, row), +1, site=None)
    assert e.value.hint == "launch it anew: `rlctl launch jobs/short.yaml`"


def test_scale_waits_on_the_controllers_count_not_on_the_events_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller whose job dir is on another site (a SLURM site's workdir, an SSH site) writes its `first_sample`
    event there: the wait read the events.jsonl here, saw none, and failed after --timeout (300 s by default) with
    `rollout-1 produced no sample`. It asks the controller, which counts them."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")
    asked: list[str] = []

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        asked.append(kind)
        if kind == "scale":
            return {"adding": ["rollout-1"], "sites": ["gen"]}
        return {"state": "running", "first_sample_s": {"rollout-1": 4.6} if asked.count("status") > 1 else {}}

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--timeout", "5", "-o", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["first_sample_s"] == {"rollout-1": 4.6}
    assert asked == ["scale", "status", "status"] and not jd.read_events()


def test_a_scale_wait_whose_controller_goes_says_so_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        if kind == "scale":
            return {"adding": ["rollout-1"], "sites": ["gen"]}
        raise TransportError("tcp://10.0.0.1:5000: connect failed: [Errno 111] Connection refused")

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--timeout", "300", "-o", "json")
    assert r.exit_code == 1
    assert r.stderr.startswith(
        "rlctl: error: job far: the controller stopped answering before rollout-1 produced a sample: tcp://"
    ), r.stderr


def test_a_scale_wait_of_a_job_that_ended_meanwhile_says_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `rlctl scale demo --rollout +1` two iterations before the end: the job finished, its controller wrote its summary
    # and went, and the wait said "the controller stopped answering … Connection refused", read as a fault
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")
    indexed_row("far", jd.path, job="far", state="running")  # its launcher has not recorded the end yet

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        if kind == "scale":
            return {"adding": ["rollout-2"], "sites": ["gen"]}
        jd.write_json(jd.summary_json, {"state": "done", "iterations": 14})  # as the controller ends
        raise TransportError("tcp://127.0.0.1:5000: connect failed: [Errno 111] Connection refused")

    monkeypatch.setattr(operate, "ask_controller", controller)
    with jd.launcher_lock():
        r = run_cli("scale", "far", "--timeout", "300")
    assert r.exit_code == 1
    assert r.stderr == (
        "rlctl: error: job far ended (done) before rollout-2 produced a sample (hint: see `rlctl status far`)\n"
    )


def test_a_scale_wait_for_a_unit_that_did_not_start_says_why_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the wait read only first samples: a unit whose start failed (sbatch refused it, SSH failed) made it
    run to --timeout and then say `produced no sample`, without the controller's error."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        if kind == "scale":
            return {"adding": ["rollout-1", "rollout-2"], "sites": ["gen"]}
        return {"first_sample_s": {"rollout-1": 2.5}, "failed_starts": {"rollout-2": "sbatch: error: bad partition"}}

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--rollout", "+2", "--timeout", "300", "-o", "json")
    assert r.exit_code == 1
    assert r.stderr.startswith("rlctl: error: job far: rollout-2 did not start: sbatch: error: bad partition ("), (
        r.stderr
    )
    assert json.loads(r.stdout)["first_sample_s"] == {"rollout-1": 2.5}


def test_a_scale_wait_on_a_controller_that_does_not_count_first_samples_says_so_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job started by an older rlctl: its controller's status has no `first_sample_s`; the wait ran to --timeout."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        return {"adding": ["rollout-1"], "sites": ["gen"]} if kind == "scale" else {"state": "running"}

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--timeout", "300", "-o", "json")
    assert r.exit_code == 1
    assert "its controller does not report new units' first samples" in r.stderr.splitlines()[0], r.stderr
    assert "rlctl scale --no-wait" in r.stderr
    assert json.loads(r.stdout)["adding"] == ["rollout-1"]  # what the scale did, printed as in the other errors


@pytest.mark.parametrize("count", ["+100000000000000000000", "-100000000000000000000"])
def test_a_scale_by_more_units_than_a_message_carries_is_one_usage_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: str
) -> None:
    """`--rollout +1e20` (as digits) reached the request's encoding: a traceback (OverflowError: can't serialize
    ints > 2**64 - 1) from a job's running controller."""
    from rlctl.transport import Message
    from rlctl.transport.framing import encode_header

    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")
    asked: list[str] = []

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        encode_header(Message(kind, dict(body or {})), [])  # what the request does first
        asked.append(kind)
        return {"error": f"only 1 of {body['delta']} units fit on local: free slots local 1"}

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--rollout", count, "--no-wait")
    assert r.exit_code == 2 and not asked, r.stderr
    assert r.stderr == (
        f"rlctl: error: --rollout {count!r}: at most 10000 units at a time; e.g. +1 adds one unit, -2 drains two\n"
    )
    r = run_cli("scale", str(jd.path), "--rollout", "+10000", "--no-wait")  # the most: the controller says what fits
    assert r.exit_code == 2 and asked == ["scale"], r.stderr
    assert r.stderr == "rlctl: error: job far: only 1 of 10000 units fit on local: free slots local 1\n"


def test_ctrl_c_in_a_scale_wait_says_which_units_the_job_is_adding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while --wait waited printed only `rlctl: interrupted`: the scale is not undone (the units keep
    starting), and nothing named them, so a scale run again added as many more."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        if kind == "scale":
            return {"adding": ["rollout-1", "rollout-2"], "sites": ["gen", "gen"]}
        raise KeyboardInterrupt  # Ctrl-C while it asks for the first samples

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--rollout", "+2", "-o", "json")
    assert r.exit_code == 130
    assert json.loads(r.stdout) == {"id": "far", "adding": ["rollout-1", "rollout-2"], "sites": ["gen", "gen"],
                                    "first_sample_s": {}}  # fmt: skip
    assert r.stderr == (
        "rlctl: interrupted: stopped waiting; the job goes on adding rollout-1, rollout-2 "
        f"(`rlctl status {jd.path}`)\n"  # (named by its directory, not in the index: its id names no job)
    )


def test_ctrl_c_while_the_scale_request_waits_for_its_answer_says_it_may_be_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a scale to a site not staged yet waits while the controller stages it: Ctrl-C there exited 130 with no word,
    # and a scale run again (the first read as undone) asked for as many units more
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        raise KeyboardInterrupt  # while it waits for the answer to `scale`

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--rollout", "+2")
    assert (r.exit_code, r.stdout) == (130, "")
    assert r.stderr == (
        f"rlctl: interrupted: the controller may have the request and be adding 2 unit(s); `rlctl status {jd.path}` "
        "shows the job's units before you scale again\n"
    )


def test_a_scale_of_an_ended_job_dir_the_index_lacks_says_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a job dir copied from another machine, or an index lost: "the controller did not answer … is the job running?",
    # exit 1, of a job whose summary says it is done
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "copied")
    jd.write_json(jd.summary_json, {"state": "done"})
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: pytest.fail("no controller to ask"))
    r = run_cli("scale", str(jd.path), "--rollout", "-1")
    assert r.exit_code == 2 and r.stderr.startswith("rlctl: error: job copied ended (done): nothing to scale"), r.stderr
    # by its directory: `rlctl launch --resume copied` found no such job in the index
    assert f"(hint: train it on with `rlctl launch --resume {jd.path} --iterations N`)" in r.stderr


def test_a_scale_of_a_job_its_launcher_prepares_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `rlctl scale` in a launch's SFT warm-up: `the controller did not answer: … has not written controller.json (not
    # started?) (hint: is the job running?)`, exit 1
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = JobDir.create("prep", explicit=tmp_path / "prep1")
    row = indexed_row("prep1", jd.path, job="prep")
    monkeypatch.setattr(operate, "ask_controller", lambda *a, **k: pytest.fail("no controller to ask"))
    with jd.launcher_lock(), pytest.raises(UsageError) as e:
        operate.scale(JobRef("prep1", jd, row), +1, site=None)
    assert str(e.value) == (
        "job prep1 is being prepared by its launcher (SFT warm-up, tokenizing, staging); nothing to scale yet"
    )
    assert e.value.exit_code == 2 and e.value.hint == "scale it once it runs: `rlctl status prep1` says when"


@pytest.mark.parametrize(("timeout", "waited"), [("5", 5.0), ("300", 30.0)])
def test_a_scale_whose_controller_does_not_answer_waits_its_timeout_and_says_what_to_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: str, waited: float
) -> None:
    """A controller that takes the connection and answers nothing (stuck): the request waited a fixed 30 s whatever
    --timeout said, then 'the controller did not answer: …' with the hint 'is the job running?', of a job that
    `rlctl status` says runs. It waits --timeout, at most SCALE_ANSWER_S (the controller answers a scale at once: its
    units start in the background), says how long it waited and what to look at."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    jd = _job_dir(tmp_path / "far")
    asked: list[float] = []

    def controller(ref: JobRef, kind: str, body: Any = None, *, timeout_s: float) -> dict[str, Any]:
        asked.append(timeout_s)
        raise PeerTimeout(f"tcp://10.0.0.1:5000: no message within {timeout_s}s")

    monkeypatch.setattr(operate, "ask_controller", controller)
    r = run_cli("scale", str(jd.path), "--timeout", timeout)
    assert r.exit_code == 1 and asked == [waited], (asked, r.stderr)
    assert r.stderr == (
        f"rlctl: error: job far: the controller did not answer the scale request within {waited:.0f} s "
        f"(tcp://10.0.0.1:5000: no message within {waited}s) (hint: `rlctl status {jd.path}` says whether the job "
        f"runs; if it does, its controller may be stuck: `rlctl logs {jd.path} controller` shows its log)\n"
    )
