"""The Megatron tests' process group: one gloo rank with megatron's parallel state (tp = pp = 1), per module;
skipped, with the install command, when megatron-core is not installed (`make unit` installs it), failed
instead under RLCTL_REQUIRE_MEGATRON=1 (megatron_required.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.unit.fake_group import fake_rank  # noqa: F401  (a fixture: the fake 2-rank group)
from tests.unit.trainers.megatron_required import require_megatron


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # the dev machines are shared: keep tests on one core


@pytest.fixture(scope="module")
def megatron_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This process as the one rank of a gloo group, with megatron's tp/pp/dp groups formed over it."""
    require_megatron()
    from rlctl.trainers.megatron.model import import_megatron, init_parallel

    assert not dist.is_initialized()
    rendezvous = Path(tmp_path_factory.mktemp("gloo")) / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    try:
        init_parallel()
        yield
    finally:
        import_megatron().parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
