"""A 2-rank fake process group in this process (torch's `fake` backend): FSDP2 lays a model out as over 2 ranks and
collectives do nothing, so layouts and each rank's local copies are checked without gloo ranks (conftest fixtures of
tests/unit/trainers and tests/unit/checkpoint import `fake_rank`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist


@pytest.fixture(params=[0, 1])
def fake_rank(request: pytest.FixtureRequest) -> Iterator[int]:
    """This process as rank 0, then rank 1, of a 2-rank fake process group."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=request.param, world_size=2)
    try:
        yield request.param
    finally:
        dist.destroy_process_group()
