"""Experiment tracking: each iteration's metrics row, as scalar series, to TensorBoard and Weights & Biases.

    controller ──row (the metrics.jsonl line)──▶ row_to_metrics ──{"reward/mean": 0.42, …}──▶ FanOut
        ├──▶ TensorBoardTracker   <job dir>/tensorboard/events.out.tfevents.*   (`tensorboard --logdir runs`)
        ├──▶ WandbTracker         <job dir>/wandb/offline-run-*/run-*.wandb     (offline: `wandb sync` later)
        └──▶ MemoryTracker        in-process, for tests

In a job file (`Tracking`, defined in rlctl/config/tracking.py and re-exported here):

    tracking: [tensorboard, wandb]                                 # W&B offline: no server, no login
    tracking: {backends: [wandb], project: my-proj, mode: online}  # the user's own W&B login

Both packages are the optional extra `rlctl[tracking]`, imported on first use; a backend whose package
is missing is a ConfigError with the install hint, so `rlctl check` refuses the job before it starts.
The step of every series is the row's `iteration`.
"""

from __future__ import annotations

import importlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from rlctl.config.tracking import Backend, Mode, Tracking
from rlctl.errors import ConfigError, LaunchError

log = logging.getLogger(__name__)

__all__ = [
    "Backend",
    "FanOut",
    "MemoryTracker",
    "Mode",
    "TensorBoardTracker",
    "Tracker",
    "Tracking",
    "WandbTracker",
    "check_tracking",
    "make_trackers",
    "row_to_metrics",
]

INSTALL_HINT = "pip install 'rlctl[tracking]'"
DEFAULT_PROJECT = "rlctl"
TENSORBOARD_DIR = "tensorboard"  # under the job dir; wandb adds its own `wandb/` under the job dir

# What each backend imports, in full module names (so a missing one is found before any run starts).
_MODULES: dict[Backend, tuple[str, ...]] = {
    "tensorboard": (
        "tensorboard.compat.proto.event_pb2",
        "tensorboard.compat.proto.summary_pb2",
        "tensorboard.summary.writer.event_file_writer",
    ),
    "wandb": ("wandb",),
}


# -- the interface -----------------------------------------------------------------------------------
class Tracker(ABC):
    """Where scalar series go: `log` once per iteration, `close` once at the end."""

    @abstractmethod
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class MemoryTracker(Tracker):
    """Keeps every logged step in memory: the test double."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        assert not self.closed, "log after close"
        self.steps.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(step, m[name]) for step, m in self.steps if name in m]


class FanOut(Tracker):
    """Several trackers as one. A declared fault-tolerance point: a tracker that raises is logged and
    dropped, because a tracking outage (disk, W&B service) must not stop training; metrics.jsonl has
    the same figures regardless."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for t in list(self.trackers):
            try:
                t.log(step, metrics)
            except Exception:
                log.exception("tracking: %s failed at step %d; no more metrics go to it", type(t).__name__, step)
                self.trackers.remove(t)

    def close(self) -> None:
        for t in self.trackers:
            try:
                t.close()
            except Exception:
                log.exception("tracking: closing %s failed", type(t).__name__)
        self.trackers = []


# -- TensorBoard -------------------------------------------------------------------------------------
class TensorBoardTracker(Tracker):
    """One TensorBoard event file under `log_dir`, scalars as `simple_value` summaries.

    Uses the `tensorboard` package's own EventFileWriter (the one torch's SummaryWriter wraps) with
    its protos: no torch/TF import on this path, and the same package reads the files back and serves
    them. Flushed after every step so a live `tensorboard` shows each iteration as it ends.

    Each run's file begins with a session START at `start_step` (a resumed run's checkpoint version): TensorBoard
    then drops the points of steps ≥ it that an earlier run wrote in the same directory, as `metrics.jsonl` moves
    those rows aside, so the curves continue from the checkpoint instead of doubling back over discarded
    iterations (the first START it reads is a plain start: every run writes one).
    """

    def __init__(self, log_dir: Path, *, start_step: int = 0) -> None:
        event_pb2, summary_pb2, writer = _require("tensorboard", source=str(log_dir))
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self.log_dir = log_dir
        try:
            self._writer = writer.EventFileWriter(str(log_dir))
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            self._writer.add_event(self._event(wall_time=time.time(), step=start_step, session_log=start))
            self._writer.flush()
        except OSError as e:
            raise LaunchError(f"tracking: cannot write TensorBoard events in {log_dir}: {e}") from e

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=name, simple_value=float(v)) for name, v in metrics.items()]
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=values)))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


# -- Weights & Biases --------------------------------------------------------------------------------
class WandbTracker(Tracker):
    """One W&B run. Offline: written under `dir`/wandb/ (no server, no login; `wandb sync` uploads it
    later). Online: the user's login (WANDB_API_KEY or `wandb login`); refused up front without one,
    never prompted for. stdout is not captured and no system stats are sampled: rlctl logs and its
    Prometheus metrics already cover both."""

    def __init__(
        self,
        *,
        project: str,
        run_name: str,
        dir: Path,
        mode: Mode = "offline",
        config: Mapping[str, Any] | None = None,
        group: str | None = None,
    ) -> None:
        (wandb,) = _require("wandb", source=str(dir))
        if mode == "online":
            _require_wandb_login(wandb, source=str(dir))
        settings = wandb.Settings(console="off", silent=True, save_code=False, disable_git=True, x_disable_stats=True)
        try:
            dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=project,
                name=run_name,
                group=group,
                dir=str(dir),
                mode=mode,
                config=dict(config or {}),
                settings=settings,
                reinit="create_new",  # several runs in one process (tests, in-process jobs) stay apart
            )
        except (wandb.errors.Error, OSError) as e:
            raise LaunchError(f"tracking: wandb could not start a {mode} run in {dir}: {e}") from e
        self._wandb = wandb
        self.run_dir = Path(self._run.dir).parent  # …/wandb/offline-run-<time>-<id>

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()
        # finish() returns before wandb-core has closed the run's stream: for some ms the .wandb file
        # can still lack the last records. teardown() waits for the service to exit, so that close
        # means "on disk"; only when no other run of this process is active (it would finish those too).
        if self._wandb.run is None:
            self._wandb.teardown()


def _require_wandb_login(wandb: Any, *, source: str) -> None:
    wandb.setup(settings=wandb.Settings(silent=True))
    try:
        ok = wandb.login(prompt=False, verify=False)  # env, settings file or .netrc; never a prompt
    except wandb.errors.Error as e:
        raise ConfigError(source, "tracking.mode", f"online W&B login failed: {e}") from e
    if not ok:
        raise ConfigError(
            source,
            "tracking.mode",
            "online needs a W&B login and none was found",
            hint="run `wandb login` or set WANDB_API_KEY; or use mode: offline and `wandb sync` later",
        )


# -- wiring ------------------------------------------------------------------------------------------
def _require(backend: Backend, *, source: str) -> list[ModuleType]:
    """Import the backend's modules or raise a ConfigError naming the extra to install."""
    try:
        return [importlib.import_module(m) for m in _MODULES[backend]]
    except ImportError as e:
        raise ConfigError(
            source,
            "tracking",
            f"backend {backend!r} needs the optional package {backend!r}, which is not installed ({e})",
            hint=INSTALL_HINT,
        ) from e


def check_tracking(cfg: Tracking, *, source: str) -> None:
    """What `rlctl check` runs where the controller, which logs the run, runs (here, or on its site by `check
    --reach`: `siteprobe.controller_tracking_problems`): every backend's package importable, and a W&B login for
    online mode."""
    for backend in cfg.backends:
        modules = _require(backend, source=source)
        if backend == "wandb" and cfg.mode == "online":
            _require_wandb_login(modules[0], source=source)


def make_trackers(
    cfg: Tracking,
    job_dir: Path,
    job_name: str,
    job_config: Mapping[str, Any],
    *,
    start_step: int = 0,
    run_name: str | None = None,
) -> list[Tracker]:
    """The trackers a job asks for, writing under its job dir; the W&B run is named `run_name` (the job's id, unique
    per job; the job dir's name when not given) and grouped by job name; `start_step`: the first step this run logs
    (a resumed run's checkpoint version). Wrap the result in `FanOut` for the controller."""
    check_tracking(cfg, source=str(job_dir / "job.json"))
    trackers: list[Tracker] = []
    try:
        for backend in cfg.backends:
            if backend == "tensorboard":
                trackers.append(TensorBoardTracker(job_dir / TENSORBOARD_DIR, start_step=start_step))
            else:
                trackers.append(
                    WandbTracker(
                        project=cfg.project or DEFAULT_PROJECT,
                        run_name=run_name or job_dir.name,
                        dir=job_dir,
                        mode=cfg.mode,
                        config=job_config,
                        group=job_name,
                    )
                )
    except BaseException:
        for t in trackers:
            t.close()
        raise
    return trackers


# -- the controller's row as series --------------------------------------------------------------------
# Row field → series name. Names are stable: dashboards and comparisons across runs key on them.
SERIES: dict[str, str] = {
    "reward_mean": "reward/mean",
    "t_gen_s": "time/gen_s",
    "t_train_s": "time/train_s",
    "period_s": "time/period_s",
    "trainer_wait_s": "time/trainer_wait_s",
    "wall_s": "time/wall_s",  # since the job's first start, across resumes
    "resumes": "job/resumes",  # the resumes before the run that wrote the row
    "delta_s": "delta/delta_s",
    "delta_window_s": "delta/window_s",
    "delta_prime_s": "delta/delta_prime_s",
    "samples_per_s": "throughput/samples_per_s",
    "tokens_per_s": "throughput/tokens_per_s",
    "loss": "train/loss",
    "kl": "train/kl",
    "kl_ref": "train/kl_ref",
    "value_loss": "train/value_loss",
    "router_aux_loss": "train/router_aux_loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "clip_frac": "train/clip_frac",
    "entropy": "train/entropy",
    "no_signal_frac": "train/no_signal_frac",
    "dropped_groups": "train/dropped_groups",
    "weight_version": "weights/version",
    "rollout_units": "rollout/units",
    "ranker_recall_20": "ranker/recall_at_20",
}
# The step itself, and the Unix time (every backend stamps its own wall time).
NOT_SERIES = {"iteration", "t"}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def row_to_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """One controller metrics row as flat scalar series; only what the row has, non-numbers skipped.

    `staleness` ({version gap: samples}) gives staleness/max, staleness/mean and staleness/gap_<k>;
    `agents` gives agent/<name>/busy_s; `reward_extra` (a dict reward's other keys) reward_extra/<key>; a numeric
    field not in SERIES lands under other/<field>.
    """
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in NOT_SERIES:
            continue
        if key == "staleness" and isinstance(value, Mapping):
            out.update(_staleness(value))
        elif key == "reward_extra" and isinstance(value, Mapping):  # a dict reward's other figures
            out.update({f"reward_extra/{k}": float(v) for k, v in value.items() if _number(v)})
        elif key == "agents" and isinstance(value, Mapping):
            for name, figures in value.items():
                if isinstance(figures, Mapping) and _number(figures.get("busy_s")):
                    out[f"agent/{name}/busy_s"] = float(figures["busy_s"])
        elif _number(value):
            out[SERIES.get(key, f"other/{key}")] = float(value)
    return out


def _staleness(counts: Mapping[str, Any]) -> dict[str, float]:
    gaps = {int(k): int(n) for k, n in counts.items() if str(k).isdigit() and _number(n)}
    out = {f"staleness/gap_{k}": float(n) for k, n in sorted(gaps.items())}
    total = sum(gaps.values())
    if total:
        out["staleness/max"] = float(max(k for k, n in gaps.items() if n > 0))
        out["staleness/mean"] = sum(k * n for k, n in gaps.items()) / total
    return out
