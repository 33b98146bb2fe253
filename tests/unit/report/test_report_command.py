"""`rlctl report [JOB]` through its own typer app: job resolution, --out, both output formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rlctl.commands.report import register
from rlctl.errors import UsageError
from rlctl.ops.jobdb import JobDB
from tests.unit.job_rows import indexed_row
from tests.unit.report.fake_jobdir import make_job_dir


def app() -> typer.Typer:
    a = typer.Typer()

    @a.callback()
    def _root() -> None:  # with a callback the command keeps its name, as under `rlctl`
        pass

    register(a)
    return a


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("RLCTL_HOME", str(h))
    return h


def test_report_by_directory_json(tmp_path: Path, home: Path) -> None:
    d = make_job_dir(tmp_path)
    r = CliRunner().invoke(app(), ["report", str(d), "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"png": str(d / "report.png"), "html": str(d / "report.html")}
    assert (d / "report.png").read_bytes()[:4] == b"\x89PNG" and (d / "report.html").exists()


def test_report_of_the_latest_job_to_out(tmp_path: Path, home: Path) -> None:
    d = make_job_dir(tmp_path)
    db = JobDB()
    db.put(d.name, job_dir=str(d), spec={"name": "demo"}, state="running")
    db.close()
    out = tmp_path / "out" / "r.png"
    r = CliRunner().invoke(app(), ["report", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [str(out), str(tmp_path / "out" / "r.html")]
    assert out.exists() and not (d / "report.png").exists()
    r = CliRunner().invoke(app(), ["report", "demo", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["html"] == str(d / "report.html")


def test_report_of_an_unknown_job_is_a_usage_error(home: Path) -> None:
    r = CliRunner().invoke(app(), ["report", "nosuchjob"])
    assert isinstance(r.exception, UsageError)
    assert "no job 'nosuchjob' in the index" in str(r.exception)


def test_report_out_home_relative_goes_there(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `--out=~/r.png` (a shell leaves a ~ after `=` as it is) wrote into a directory named `~` in the current one
    d = make_job_dir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app(), ["report", str(d), "--out=~/r.png"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [str(tmp_path / "user" / "r.png"), str(tmp_path / "user" / "r.html")]
    assert (tmp_path / "user" / "r.png").exists() and not (tmp_path / "~").exists()


def test_report_out_under_a_home_that_is_not_there_is_refused(tmp_path: Path, home: Path) -> None:
    # `--out '~nosuchuser/r.png'` ended in a RuntimeError traceback, exit 1 (Path.expanduser's 'Could not determine
    # home directory'), versus one line naming the option
    d = make_job_dir(tmp_path)
    r = CliRunner().invoke(app(), ["report", str(d), "--out", "~rlctl-no-such-user/r.png"])
    assert isinstance(r.exception, UsageError), r.exception
    assert str(r.exception).startswith("--out ~rlctl-no-such-user/r.png: ~rlctl-no-such-user is no home directory")


def test_report_of_a_launch_stopped_before_it_wrote_job_json_says_so_and_how_to_launch_it_anew(
    tmp_path: Path, home: Path
) -> None:
    # Ctrl-C on `rlctl launch jobs/demo.yaml` in its SFT warm-up: `status`, `pull` and `status --checkpoints` said the
    # job was never prepared and how to launch it anew, `report` `not a job directory (no job.json)`
    from rlctl.launch.jobdir import JobDir

    jd = JobDir.create("demo", explicit=tmp_path / "demo-1")
    db = JobDB()
    db.put("demo-1", job_dir=str(jd.path), spec={"name": "demo"}, state="stopped", info={"source": "jobs/demo.yaml"})
    db.close()
    r = CliRunner().invoke(app(), ["report", "demo-1"])
    assert isinstance(r.exception, UsageError)
    assert str(r.exception).startswith("job demo-1 was never prepared (no job.json: its launch was stopped or failed")
    assert r.exception.hint == "launch it anew: `rlctl launch jobs/demo.yaml`"
    assert not (jd.path / "report.png").exists()


def test_report_of_a_job_that_ended_without_a_summary_says_how_it_ended_not_running(tmp_path: Path, home: Path) -> None:
    # `rlctl stop --grace 0` (the controller SIGKILLed), the OOM killer: no summary.json; `status` said the job ended,
    # `report` "state: running (no summary.json yet)" and "ledger: - (written when the job ends)"
    d = make_job_dir(tmp_path)
    indexed_row(d.name, d, job="demo", state="stopped")
    r = CliRunner().invoke(app(), ["report", d.name])
    assert r.exit_code == 0, r.output
    page = (d / "report.html").read_text()
    assert "<td>state</td><td>stopped (no summary.json: its last run ended without writing one)</td>" in page
    assert "<td>ledger</td><td>- (not written: the job ended without a summary)</td>" in page
    assert "running" not in page
    indexed_row("demo-2", d, job="demo", state="running")  # a run that may go on: as before
    r = CliRunner().invoke(app(), ["report", "demo-2"])
    assert r.exit_code == 0, r.output
    assert "<td>state</td><td>running (no summary.json yet)</td>" in (d / "report.html").read_text()


def test_report_out_refuses_a_users_file_and_writes_over_its_own(tmp_path: Path, home: Path) -> None:
    # `--out x.png` wrote over a user's x.png and its sibling x.html, which the user never named
    d = make_job_dir(tmp_path)
    out = tmp_path / "x.png"
    (tmp_path / "x.html").write_text("<html>my notes</html>")
    r = CliRunner().invoke(app(), ["report", str(d), "--out", str(out)])
    assert isinstance(r.exception, UsageError), r.exception
    assert str(r.exception).startswith(f"--out {out}: {tmp_path / 'x.html'}: a file rlctl did not write")
    assert (tmp_path / "x.html").read_text() == "<html>my notes</html>" and not out.exists()
    (tmp_path / "x.html").unlink()
    for _ in range(2):  # its own outputs, written again
        r = CliRunner().invoke(app(), ["report", str(d), "--out", str(out)])
        assert r.exit_code == 0, r.output
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.figure()
    plt.savefig(out)  # a user's own PNG (matplotlib's, without rlctl's mark)
    plt.close("all")
    mine = out.read_bytes()
    r = CliRunner().invoke(app(), ["report", str(d), "--out", str(tmp_path / "x.html")])
    assert isinstance(r.exception, UsageError) and "x.png: a file rlctl did not write" in str(r.exception)
    assert out.read_bytes() == mine
