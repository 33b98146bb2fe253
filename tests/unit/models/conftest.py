import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)  # the dev machines are shared: keep tests on one core
