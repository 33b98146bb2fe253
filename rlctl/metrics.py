"""Every Prometheus metric rlctl exposes, declared once: `rlctl_<subsystem>_<quantity>_<unit>`.

Metrics live on a registry per process (`JobMetrics(registry)`), not on the global default
registry, so several controllers in one test process do not collide. The controller owns one and
holds its port with `bind(port)` and answers scrapes once `start()`ed, its resume done; agents may expose their own.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric

STALENESS_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 8.0)
TRANSFER_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


LINGER_MAX_S = 150.0  # the longest a controller that ended on purpose waits for its last scrape


class _Scrapes:
    """A collector that yields nothing and notes when /metrics was read (the last few times)."""

    def __init__(self) -> None:
        self.times: list[float] = []  # time.monotonic() of the last scrapes
        self.seen = threading.Condition()

    def describe(self) -> Iterable[Metric]:
        return []  # (the registry asks at registration: no scrape)

    def collect(self) -> Iterable[Metric]:
        with self.seen:
            self.times = [*self.times[-5:], time.monotonic()]
            self.seen.notify_all()
        return []


class _Silent(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape is not logged."""


def _best_family(addr: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family `addr` is of (an IPv6 host binds as one), as prometheus_client's own server picks it."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family, str(sockaddr[0])


class JobMetrics:
    """The metrics of one job, as exported by its controller."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.iteration = Gauge(
            "rlctl_job_iteration",
            "Training iterations completed (a finished N-iteration job reads N), as rlctl status counts them",
            registry=r,
        )
        self.ended = Gauge(
            "rlctl_job_ended",
            "1 once the controller ends the job on purpose (every iteration trained, or `rlctl stop`), held until one "
            "more scrape before it exits; 0 while it runs and when it fails. A /metrics that vanished while it read 0 "
            "is a controller that is gone (RlctlControllerDown)",
            registry=r,
        )
        self._scrapes = _Scrapes()
        r.register(self._scrapes)
        self.last_trained = Gauge(
            "rlctl_job_last_trained_timestamp_seconds",
            "Unix time the controller took in the last trained iteration (a stalled job: time() minus it grows)",
            registry=r,
        )
        self.checkpoint_version = Gauge(
            "rlctl_checkpoint_version",
            "Version of the latest complete checkpoint (both parts, `latest` moved to it; what a resume starts "
            "from): rlctl_job_iteration minus it is the iterations a crash would lose; NaN before the job's first",
            registry=r,
        )
        self.checkpoint_version.set(float("nan"))
        self.generation_seconds = Gauge(
            "rlctl_stage_generation_seconds", "T_gen of the last iteration (generation stage time)", registry=r
        )
        self.training_seconds = Gauge(
            "rlctl_stage_training_seconds", "T_train of the last iteration (training stage time)", registry=r
        )
        self.trainer_wait_seconds = Gauge(
            "rlctl_trainer_wait_seconds",
            "Time the trainer waited for samples in the last iteration's period (async: the rebalance rule's delta)",
            registry=r,
        )
        self.imbalance_seconds = Gauge(
            "rlctl_stage_imbalance_seconds", "delta = T_gen - T_train of the last iteration", registry=r
        )
        self.rebalance_threshold_seconds = Gauge(
            "rlctl_rebalance_threshold_seconds", "delta': generation time saved by one more rollout unit", registry=r
        )
        self.samples_per_second = Gauge(
            "rlctl_throughput_samples_per_second", "Trained samples per second, the last 20 iterations", registry=r
        )
        self.tokens_per_second = Gauge(
            "rlctl_throughput_tokens_per_second", "Generated tokens per second, the last 20 iterations", registry=r
        )
        self.samples_total = Counter(
            "rlctl_ledger_samples_total", "Samples by ledger transition", ["state"], registry=r
        )
        self.queue_depth = Gauge("rlctl_queue_prompts", "Prompts queued, not yet dispatched", registry=r)
        self.staleness_versions = Histogram(
            "rlctl_sample_staleness_versions",
            "trainer_version - sample_version of every trained sample",
            buckets=STALENESS_BUCKETS,
            registry=r,
        )
        self.staleness_violations = Counter(
            "rlctl_sample_staleness_violations",
            "Samples the trainer found staler than the job's bound eta (pipeline.eta) as they reached it since this "
            "controller started; must stay 0 (a dispatch bug). Each start, a resume too, starts it at 0, which "
            "Prometheus takes for any counter's reset: increase() counts the violations that happened, never a "
            "resume's restored count. The job's count is rlctl_job_staleness_violations",
            registry=r,
        )
        self.job_staleness_violations = Gauge(
            "rlctl_job_staleness_violations",
            "The job's samples trained staler than eta, across resumes (status's and the summary's "
            "staleness_violations): a resumed controller's starts at its checkpoint's count, so it goes down where "
            "the resume rolls back past violations (they are no longer in the weights)",
            registry=r,
        )
        self.reward_mean = Gauge("rlctl_reward_mean", "Mean reward of the last iteration's samples", registry=r)
        self.skipped_steps = Counter(
            "rlctl_train_skipped_steps",
            "Optimizer steps skipped because the gradient norm was NaN or infinite (trainer.skip_nonfinite)",
            registry=r,
        )
        self.grad_norm = Gauge(
            "rlctl_train_grad_norm", "The policy's gradient norm before clipping, last step", registry=r
        )
        self.learning_rate = Gauge("rlctl_train_learning_rate", "The policy's learning rate, last step", registry=r)
        self.entropy = Gauge(
            "rlctl_train_entropy", "The policy's mean next-token entropy (nats) over the last iteration", registry=r
        )
        self.loss = Gauge(
            "rlctl_train_loss",
            "The policy's loss, last iteration: what its gradient is of (PPO's, of whitened advantages, is about 0)",
            registry=r,
        )
        self.kl = Gauge(
            "rlctl_train_kl",
            "Mean per-token KL(sampling policy || trainer policy before the step), last iteration: how off-policy "
            "the batch was (staleness, engine numerics); NaN when the iteration trained no token",
            registry=r,
        )
        self.kl_ref = Gauge(
            "rlctl_train_kl_ref",
            "Mean per-token KL to the reference policy that algorithm.kl_coef multiplies (GRPO's loss term, PPO's "
            "reward penalty), last iteration; NaN with kl_coef 0 (no reference model)",
            registry=r,
        )
        self.value_loss = Gauge(
            "rlctl_train_value_loss",
            "PPO's critic loss, 1/2 (V - R)^2 per token, last iteration; NaN without a critic (GRPO)",
            registry=r,
        )
        self.router_aux_loss = Gauge(
            "rlctl_train_router_aux_loss",
            "A MoE's router load-balancing loss (before router_aux_loss_coef), last iteration, as the loss adds it: "
            "under loss_aggregation constant times the batch's fill ratio (trained output tokens / (samples x "
            "max_output_tokens)); NaN where the model's loss has no such term (config.json's output_router_logits "
            "false, or a dense model)",
            registry=r,
        )
        # NaN, a gap on a graph, until a trained iteration has the figure: a dense model's load-balancing loss, GRPO's
        # critic loss and a job's KL to a reference it has not are no figure, not 0
        for gauge in (self.loss, self.kl, self.kl_ref, self.value_loss, self.router_aux_loss):
            gauge.set(float("nan"))
        self.no_signal_fraction = Gauge(
            "rlctl_train_no_signal_fraction",
            "Share of the last iteration's samples in groups whose rewards were all equal (no gradient)",
            registry=r,
        )
        self.dropped_groups = Counter(
            "rlctl_dropped_groups",
            "Groups dropped once scored because their rewards were all equal, a new prompt's group drawn in their "
            "place (algorithm.dynamic_sampling)",
            registry=r,
        )
        self.quarantined_prompts = Counter(
            "rlctl_quarantined_prompts",
            "Prompts set aside because the rollout units that ran them were lost (rollout.quarantine_after), a new "
            "prompt drawn in the place of each",
            registry=r,
        )
        self.clip_fraction = Gauge(
            "rlctl_train_clip_fraction", "Share of the last iteration's tokens whose ratio was clipped", registry=r
        )
        self.eval_greedy_reward = Gauge(
            "rlctl_eval_greedy_reward", "Mean reward of greedy held-out outputs, last evaluation", registry=r
        )
        self.eval_greedy_reward_by_source = Gauge(
            "rlctl_eval_greedy_reward_by_source",
            "Mean reward of greedy held-out outputs per data_source (held-out rows of several), last evaluation",
            ["data_source"],  # (a label value may hold any text: 'openai/gsm8k' as it is)
            registry=r,
        )
        self.eval_greedy_exact = Gauge(
            "rlctl_eval_greedy_exact", "Held-out prompts answered exactly (digits), last evaluation", registry=r
        )
        self.eval_version = Gauge("rlctl_eval_version", "Weight version of the last held-out evaluation", registry=r)
        self.weight_version = Gauge(
            "rlctl_weights_version", "Newest weight version published by the trainer", registry=r
        )
        self.weight_transfer_seconds = Histogram(
            "rlctl_weights_transfer_seconds", "Time to deliver one weight version", buckets=TRANSFER_BUCKETS, registry=r
        )
        self.weight_transfer_bytes = Counter(
            "rlctl_weights_transfer_bytes", "Bytes of weights pulled by rollout units (every hop)", registry=r
        )
        self.weight_inter_dc_bytes = Counter(
            "rlctl_weights_inter_dc_bytes",
            "Bytes of weights that crossed an inter-datacenter link",
            ["link"],
            registry=r,
        )
        self.weight_inter_dc_copies = Counter(
            "rlctl_weights_inter_dc_copies",
            "Weight payloads that crossed an inter-datacenter link",
            ["link"],
            registry=r,
        )
        self.weight_last_unit_seconds = Gauge(
            "rlctl_weights_last_unit_seconds",
            "Seconds from a version's publication until the last live rollout unit had it",
            registry=r,
        )
        self.agent_up = Gauge("rlctl_agent_up", "1 while the agent heartbeats", ["role", "name", "site"], registry=r)
        self.agent_heartbeat_age_seconds = Gauge(
            "rlctl_agent_heartbeat_age_seconds",
            "Seconds since the agent's last heartbeat",
            ["role", "name", "site"],
            registry=r,
        )
        self.agent_phase_seconds = Gauge(
            "rlctl_agent_phase_seconds",
            "How long the agent's current busy phase (train, optimizer step, publish, engine step, weight load) had "
            "run at its last heartbeat; 0 while it waits for work, and once it is lost or stopped. Past the job's "
            "hang_timeout_s the agent ends itself",
            ["role", "name", "site"],
            registry=r,
        )
        self.rollout_units = Gauge("rlctl_rollout_units", "Rollout DP units in dispatch", ["site"], registry=r)
        self.scale_events = Counter(
            "rlctl_scale_events", "Rollout units added or removed", ["direction", "reason"], registry=r
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Expose /metrics over HTTP; port 0 picks a free one. Returns the port."""
        bound = self.bind(port, addr)
        self.start()
        return bound

    def bind(self, port: int, addr: str = "0.0.0.0") -> int:
        """Hold /metrics's port (0 picks a free one), not answering yet: a scrape waits in the socket's backlog until
        `start` (a resumed controller's restored figures, never the 0s and NaNs they replace). Returns the port."""
        family, host = _best_family(addr, port)
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        self._server: WSGIServer = make_server(
            host, port, make_wsgi_app(self.registry), server_class, handler_class=_Silent
        )
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Answer scrapes on the port `bind` holds."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def linger_s(self) -> float:
        """How long to wait for one more scrape: twice the longest gap between the last scrapes (LINGER_MAX_S at
        most); 0 where /metrics was read less than twice (nothing scrapes it, or the job was too short to tell)."""
        times = self._scrapes.times
        if len(times) < 2:
            return 0.0
        return min(LINGER_MAX_S, 2 * max(b - a for a, b in itertools.pairwise(times)))

    def wait_scraped(self, since: float, timeout_s: float) -> bool:
        """Wait until /metrics is read at or after `since` (time.monotonic()), `timeout_s` at most; whether it was."""
        deadline = time.monotonic() + timeout_s
        with self._scrapes.seen:
            while not (self._scrapes.times and self._scrapes.times[-1] >= since):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._scrapes.seen.wait(left)
        return True

    def close(self) -> None:
        """Stop serving /metrics (a controller that ends inside a longer-lived process)."""
        server = getattr(self, "_server", None)
        if server is not None:
            if hasattr(self, "_thread"):  # (shutdown waits for serve_forever to return: forever where it never ran)
                server.shutdown()
            server.server_close()
