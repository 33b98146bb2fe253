"""Replaying the embedded engine's decode step and its prefills as CUDA graphs, one per (rows, width) bucket.

A decode step of a small model on a GPU is bound by kernel launches, not by the GPU: a few hundred kernels
of microseconds each, launched one by one from Python (measured on an H100, 254M parameters, batch 64: 17.7
ms eager, 4.6 ms as one graph). The engine's step is written for capture: static shapes for a given
(rows, width), every tensor in storage that does not move, results written in place, no value read back
on the host (rlctl.models.tinygpt.TinyGPT.decode, rlctl.engines.sampling). So:

    run(rows, width)   first time for this bucket: run eagerly on a side stream (warms up cuBLAS and the
                       allocator outside capture; it is a real step)
                       second time: capture the step into a graph from one shared memory pool, replay it
                       then on: replay
    reset()            the storage the graphs read moved (the cache grew): drop them, capture again

The engine's prefills (admissions between decode steps) are graphs of the same kind (`run(rows, width)` of a
prefill into static input buffers); they share the decode graphs' memory pool: every graph writes its results
into storage of its own, so what one leaves in the pool is dead when the next runs.

Buckets keep the number of graphs small (`rlctl.engines.kvsize.bucket`): rows round up to 1, 2, 3, 4, 6, 8, 12,
16, 24, 32, 48, 64, … and widths to 128, 192, 256, 384, 512, … positions (at most 1.5× what is needed); the rows
beyond the live ones are free rows that compute and are ignored, the positions beyond a row's length are masked.
Replaying a graph re-runs exactly what was captured, so whatever the step reads must live in the same storage on
every replay: the weights (loaded in place, `TinyGPT.load_weights`), the cache and the engine's per-row state.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch


class StepGraphs:
    """CUDA graphs of `step(rows, width)`, captured on the second call for a shape and replayed after."""

    def __init__(self, step: Callable[[int, int], None], *, pool: Any = None) -> None:
        """`pool`: a memory pool to share (`torch.cuda.graph_pool_handle()`); None: one of its own, made at the
        first capture."""
        # weakly: an engine holds its graphs, and a strong reference to its bound method would hold the engine in
        # a cycle, which only a garbage collection frees — its weights, K/V cache and graphs' pool kept on the GPU
        # after its last reference went (an evaluation's next policy loaded beside them, one probe engine per shape)
        self._step = weakref.WeakMethod(step)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._warm: set[tuple[int, int]] = set()
        self._pool: Any = pool  # one memory pool for every graph of this engine
        self.captures = 0

    def run(self, rows: int, width: int) -> None:
        key = (rows, width)
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        if key not in self._warm:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._call(rows, width)
            torch.cuda.current_stream().wait_stream(side)
            self._warm.add(key)
            return
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the agent's other threads (weights fetch, reports) may call CUDA while this one captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            self._call(rows, width)
        self._graphs[key] = graph
        self.captures += 1
        graph.replay()

    def _call(self, rows: int, width: int) -> None:
        step = self._step()
        assert step is not None, "the engine whose step this is was freed"
        step(rows, width)

    def reset(self) -> None:
        """Forget every graph (what they read was reallocated)."""
        self._graphs.clear()
        self._warm.clear()
