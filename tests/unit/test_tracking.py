"""rlctl.tracking: series names from a controller row, TensorBoard and W&B files read back, config forms,
missing-package errors."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from rlctl.config.base import validate
from rlctl.errors import ConfigError
from rlctl.tracking import (
    FanOut,
    MemoryTracker,
    TensorBoardTracker,
    Tracker,
    Tracking,
    check_tracking,
    make_trackers,
    row_to_metrics,
)


def controller_row(i: int) -> dict[str, Any]:
    """A metrics.jsonl line as ControllerAgent writes it (views.metrics_row + Scaler.rebalance + _refit_ranker)."""
    return {
        "iteration": i,
        "reward_mean": 0.25 + 0.125 * i,
        "t_gen_s": 3.0,
        "t_train_s": 1.5,
        "delta_s": 1.5,
        "samples_per_s": 21.5,
        "tokens_per_s": 4096.0,
        "weight_version": i,
        "staleness": {"0": 48, "1": 16},
        "loss": 0.0125,
        "period_s": 2.0,
        "trainer_wait_s": 0.5,
        "wall_s": 2.0 * i,
        "t": 1767225600.0 + i,
        "agents": {
            "trainer-0": {"role": "trainer", "site": "h800", "busy_s": 1.5 * i, "state": "running"},
            "rollout-0": {"role": "rollout", "site": "h20", "busy_s": 2.0 * i, "state": "lost"},
        },
        "delta_window_s": 1.25,
        "delta_prime_s": 0.75,
        "rollout_units": 2,
        "ranker_recall_20": 0.5,
    }


# -- row_to_metrics ----------------------------------------------------------------------------------
def test_row_to_metrics_names_every_numeric_field_of_a_controller_row() -> None:
    m = row_to_metrics(controller_row(2))
    assert m == {
        "reward/mean": 0.5,
        "time/gen_s": 3.0,
        "time/train_s": 1.5,
        "time/period_s": 2.0,
        "time/trainer_wait_s": 0.5,
        "time/wall_s": 4.0,
        "delta/delta_s": 1.5,
        "delta/window_s": 1.25,
        "delta/delta_prime_s": 0.75,
        "throughput/samples_per_s": 21.5,
        "throughput/tokens_per_s": 4096.0,
        "train/loss": 0.0125,
        "weights/version": 2.0,
        "rollout/units": 2.0,
        "ranker/recall_at_20": 0.5,
        "staleness/gap_0": 48.0,
        "staleness/gap_1": 16.0,
        "staleness/max": 1.0,
        "staleness/mean": 0.25,
        "agent/trainer-0/busy_s": 3.0,
        "agent/rollout-0/busy_s": 4.0,
    }
    assert all(type(v) is float for v in m.values())


def test_row_to_metrics_takes_only_what_the_row_has() -> None:
    m = row_to_metrics({"iteration": 1, "loss": 0.5, "kl": 0.02, "staleness": {}, "note": "x", "ok": True, "x": 3})
    assert m == {"train/loss": 0.5, "train/kl": 0.02, "other/x": 3.0}


# -- config ------------------------------------------------------------------------------------------
def test_tracking_accepts_the_list_form_and_the_mapping_form() -> None:
    assert Tracking.model_validate(["tensorboard", "wandb"]).backends == ["tensorboard", "wandb"]
    assert Tracking.model_validate("tensorboard").backends == ["tensorboard"]
    t = Tracking.model_validate({"backends": ["wandb"], "project": "p", "mode": "online"})
    assert (t.backends, t.project, t.mode) == (["wandb"], "p", "online")
    assert Tracking().backends == [] and Tracking().mode == "offline"
    # what job.json holds after model_dump, read back
    assert Tracking.model_validate(t.model_dump(mode="json")) == t


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["tensorbord"], "tracking.backends: unknown tracking backend 'tensorbord'; valid: tensorboard, wandb"),
        ({"backends": ["wandb", "wandb"]}, "tracking.backends: each tracking backend may appear once"),
        ({"backends": [], "mod": "online"}, "tracking.mod: unknown key (did you mean 'mode'?)"),
        ({"mode": "cloud"}, "tracking.mode: Input should be 'offline' or 'online'"),
    ],
)
def test_tracking_refuses_bad_config_with_one_line(data: Any, message: str) -> None:
    from rlctl.config.base import Strict

    class Holder(Strict):
        tracking: Tracking = Tracking()

    with pytest.raises(ConfigError) as e:
        validate(Path("jobs/x.yaml"), {"tracking": data}, Holder)
    assert str(e.value).startswith(f"jobs/x.yaml: {message}")


# -- missing packages --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("backend", "module"), [("tensorboard", "tensorboard.summary.writer.event_file_writer"), ("wandb", "wandb")]
)
def test_a_backend_whose_package_is_missing_is_a_config_error_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what `import` sees when the package is not installed
    cfg = Tracking.model_validate([backend])
    with pytest.raises(ConfigError) as e:
        check_tracking(cfg, source="jobs/x.yaml")
    assert str(e.value).startswith(
        f"jobs/x.yaml: tracking: backend {backend!r} needs the optional package {backend!r}, which is not installed"
    )
    assert e.value.hint == "pip install 'rlctl[tracking]'"
    assert e.value.exit_code == 2
    with pytest.raises(ConfigError, match="not installed"):
        make_trackers(cfg, tmp_path, "demo", {})
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


# -- fan-out -----------------------------------------------------------------------------------------
class Broken(Tracker):
    def log(self, step: int, metrics: Any) -> None:
        raise OSError("disk full")

    def close(self) -> None:
        raise AssertionError("a dropped tracker is not closed")


def test_fan_out_drops_a_failing_tracker_and_keeps_the_others(caplog: pytest.LogCaptureFixture) -> None:
    good = MemoryTracker()
    fan = FanOut([Broken(), good])
    fan.log(1, {"reward/mean": 0.5})
    fan.log(2, {"reward/mean": 0.75})
    fan.close()
    assert good.series("reward/mean") == [(1, 0.5), (2, 0.75)] and good.closed
    assert "Broken failed at step 1" in caplog.text


# -- TensorBoard -------------------------------------------------------------------------------------
def test_tensorboard_event_files_read_back_with_tags_steps_and_values(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = [controller_row(i) for i in (1, 2, 3)]
    with TensorBoardTracker(tmp_path / "tb") as tb:
        for row in rows:
            tb.log(row["iteration"], row_to_metrics(row))
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(row_to_metrics(rows[0]))
    reward = acc.Scalars("reward/mean")
    assert [e.step for e in reward] == [1, 2, 3]
    assert [e.value for e in reward] == pytest.approx([0.375, 0.5, 0.625])
    assert [e.value for e in acc.Scalars("agent/rollout-0/busy_s")] == pytest.approx([2.0, 4.0, 6.0])
    assert [e.value for e in acc.Scalars("staleness/max")] == [1.0, 1.0, 1.0]


def test_make_trackers_puts_tensorboard_events_under_the_job_dir(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert make_trackers(Tracking(), tmp_path, "demo", {}) == []
    with FanOut(make_trackers(Tracking.model_validate(["tensorboard"]), tmp_path, "demo", {})) as fan:
        fan.log(0, {"train/loss": 0.5})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(0, 0.5)]


# -- Weights & Biases (offline) ----------------------------------------------------------------------
def wandb_records(path: Path) -> list[tuple[str, Any]]:
    """Read a .wandb file: a ':W&B' header, then LevelDB-log records (32 KiB blocks, 7-byte record
    headers, FULL/FIRST/MIDDLE/LAST fragments), each a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pending, out = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the tail of a block too short for a header is padding
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(pending)
            which = r.WhichOneof("record_type")
            if which == "history":
                out.append((which, {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}))
            elif which == "run":
                config = {i.key: json.loads(i.value_json) for i in r.run.config.update}
                out.append(
                    (
                        which,
                        {
                            "project": r.run.project,
                            "name": r.run.display_name,
                            "group": r.run.run_group,
                            "config": config,
                        },
                    )
                )
            else:
                out.append((which, None))
    return out


def test_wandb_offline_run_is_written_under_the_job_dir_and_its_history_reads_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("HOME", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home"))  # nothing of wandb's lands in the real home
    monkeypatch.delenv("WANDB_MODE", raising=False)
    job_dir = tmp_path / "demo-20260101-000000"
    job_dir.mkdir()
    trackers = make_trackers(Tracking.model_validate(["wandb"]), job_dir, "demo", {"name": "demo", "iterations": 2})
    (wb,) = trackers
    with FanOut(trackers) as fan:
        for i in (1, 2):
            fan.log(i, row_to_metrics(controller_row(i)))
    run_dir = wb.run_dir  # type: ignore[attr-defined]
    assert run_dir.parent == job_dir / "wandb" and run_dir.name.startswith("offline-run-")
    (wandb_file,) = run_dir.glob("run-*.wandb")
    records = wandb_records(wandb_file)
    history = [h for kind, h in records if kind == "history"]
    assert [h["_step"] for h in history] == [1, 2]
    assert [h["reward/mean"] for h in history] == [0.375, 0.5]
    assert [h["staleness/mean"] for h in history] == [0.25, 0.25]
    (run,) = [r for kind, r in records if kind == "run"]
    assert (run["project"], run["name"], run["group"]) == ("rlctl", "demo-20260101-000000", "demo")
    assert run["config"]["name"] == "demo" and run["config"]["iterations"] == 2
    assert records[-1][0] == "exit"  # finished cleanly


def test_wandb_online_without_a_login_is_refused_not_prompted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HOME", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = Tracking.model_validate({"backends": ["wandb"], "mode": "online"})
    with pytest.raises(ConfigError) as e:
        check_tracking(cfg, source="jobs/x.yaml")
    assert str(e.value) == "jobs/x.yaml: tracking.mode: online needs a W&B login and none was found"
    assert e.value.hint is not None and "WANDB_API_KEY" in e.value.hint


def test_a_resumed_runs_tensorboard_curves_continue_from_its_checkpoint(tmp_path: Path) -> None:
    """The first run logs iterations 0–5 and fails; the resumed one continues from checkpoint 3 in the same
    directory: TensorBoard shows 0–7 once (the first run's 3–5 were discarded, as in metrics.jsonl), not 3–5 twice."""
    from tensorboard.backend.event_processing import plugin_event_accumulator

    for start, steps, offset in ((0, range(6), 0.0), (3, range(3, 8), 1.0)):
        with TensorBoardTracker(tmp_path / "tb", start_step=start) as tb:
            for it in steps:
                tb.log(it, {"reward/mean": offset + 0.1 * it})
    acc = plugin_event_accumulator.EventAccumulator(str(tmp_path / "tb"))  # what the TensorBoard server reads
    acc.Reload()
    points = [(e.step, round(float(e.tensor_proto.float_val[0]), 3)) for e in acc.Tensors("reward/mean")]
    assert points == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 1.3), (4, 1.4), (5, 1.5), (6, 1.6), (7, 1.7)]


def _no_wandb_login(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    for var in ("HOME", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(home))
    monkeypatch.setenv("NETRC", str(home / "no-netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_a_remote_controller_s_wandb_login_is_asked_where_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The controller logs an online W&B run with its own host's login, and `check` asked this machine's: a job
    whose controller runs on an SSH site was refused for this machine's missing login (and passed with one here,
    whatever its site had). `check` now leaves it to `check --reach`, which asks the controller's site."""
    import yaml

    from rlctl.config import load_job
    from rlctl.config.inventory import Site
    from rlctl.launch.localrunner import LocalRunner
    from rlctl.launch.siteprobe import controller_tracking_problems
    from rlctl.launch.ssh import SshBackend
    from rlctl.ops.preflight import problems
    from tests.conftest import ROOT

    _no_wandb_login(monkeypatch, tmp_path / "home")
    gen = {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "CPU", "python": sys.executable,
           "nodes": [{"host": "g1", "gpus": 2}]}  # fmt: skip
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"gen": gen}}))
    job_file = tmp_path / "job.yaml"
    demo = yaml.safe_load((ROOT / "jobs" / "demo.yaml").read_text())
    demo["inventory"] = [str(ROOT / "clusters" / "local.yaml"), str(inv)]
    demo["tracking"] = {"backends": ["wandb"], "mode": "online"}
    for controller, refused in (("gen", False), ("local", True)):  # this machine's login: only for one here
        demo["placement"]["controller_site"] = controller
        job_file.write_text(yaml.safe_dump(demo))
        found = [p for p in problems(load_job(job_file)) if p.field == "tracking.mode"]
        assert bool(found) is refused, found

    monkeypatch.setattr(SshBackend, "site_runner", classmethod(lambda cls, s, h=None: LocalRunner()))  # bash here
    site, spec = Site.model_validate(gen), load_job(job_file).spec
    [line] = controller_tracking_problems("gen", site, spec, timeout_s=120)
    assert line.startswith(
        "site gen host g1: tracking.mode: online needs a W&B login and none was found there, where the controller "
        "logs the run (with its host's packages and login, not this machine's): run `wandb login` or set "
        "WANDB_API_KEY"
    ), line
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # a login there (the probe's environment is the host's)
    assert controller_tracking_problems("gen", site, spec, timeout_s=120) == []


def test_a_remote_controller_s_tracking_packages_are_asked_where_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The trackers run in the controller: a job whose controller runs on an SSH site was refused for a package
    missing on this machine, which never imports it. Here it is made missing (an import that fails in this
    process only); the controller's site (the probe, another process) has it."""
    import yaml

    from rlctl import tracking
    from rlctl.config import load_job
    from rlctl.config.inventory import Site
    from rlctl.launch.localrunner import LocalRunner
    from rlctl.launch.siteprobe import controller_tracking_problems
    from rlctl.launch.ssh import SshBackend
    from rlctl.ops.preflight import problems
    from tests.conftest import ROOT

    monkeypatch.setitem(tracking._MODULES, "tensorboard", ("rlctl_no_such_module",))
    gen = {"datacenter": "d", "scheduler": {"kind": "ssh"}, "gpu": "CPU", "python": sys.executable,
           "nodes": [{"host": "g1", "gpus": 2}]}  # fmt: skip
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"apiVersion": "rlctl/v1", "kind": "Inventory", "sites": {"gen": gen}}))
    job_file = tmp_path / "job.yaml"
    demo = yaml.safe_load((ROOT / "jobs" / "demo.yaml").read_text())
    demo["inventory"] = [str(ROOT / "clusters" / "local.yaml"), str(inv)]
    demo["tracking"] = ["tensorboard"]
    for controller, refused in (("gen", False), ("local", True)):
        demo["placement"]["controller_site"] = controller
        job_file.write_text(yaml.safe_dump(demo))
        found = [p for p in problems(load_job(job_file)) if p.field == "tracking"]
        assert bool(found) is refused, found
    monkeypatch.setattr(SshBackend, "site_runner", classmethod(lambda cls, s, h=None: LocalRunner()))  # bash here
    assert controller_tracking_problems("gen", Site.model_validate(gen), load_job(job_file).spec, timeout_s=120) == []
