"""Whether the Megatron tests run here: skipped, with the install command, when megatron-core is not
installed; failed instead under RLCTL_REQUIRE_MEGATRON=1, which `make unit` and `make integration` set once
the install succeeded, so a broken install cannot skip them silently."""

from __future__ import annotations

import os

import pytest

from rlctl.trainers.base import megatron_available

REQUIRE_ENV = "RLCTL_REQUIRE_MEGATRON"


def require_megatron() -> None:
    """Skip the calling test (or fixture) when megatron-core cannot be imported; fail under RLCTL_REQUIRE_MEGATRON=1."""
    hint = megatron_available()
    if hint is None:
        return
    msg = f"megatron-core is not installed: {hint}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1: the Megatron tests must run here)", pytrace=False)
    pytest.skip(msg)
