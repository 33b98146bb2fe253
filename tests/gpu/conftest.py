"""tests/gpu: the same code paths as CI runs on the CPU, on a CUDA device (`make gpu-check` runs them on a lent
GPU machine). Every test here carries the `gpu` marker and is skipped where torch sees no CUDA device."""

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="no CUDA device (tests/gpu runs on a GPU machine: make gpu-check)")
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
