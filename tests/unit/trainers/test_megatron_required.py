"""The Megatron tests skip where megatron-core is missing, unless RLCTL_REQUIRE_MEGATRON=1 (what `make unit`
and `make integration` set once the install succeeded) makes that skip a failure."""

from __future__ import annotations

import pytest

from tests.unit.trainers import megatron_required
from tests.unit.trainers.megatron_required import REQUIRE_ENV, require_megatron


def test_missing_megatron_skips_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(megatron_required, "megatron_available", lambda: "pip install 'rlctl[megatron]'")
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"not installed: pip install 'rlctl\[megatron\]'"):
        require_megatron()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"RLCTL_REQUIRE_MEGATRON=1: the Megatron tests must run here"):
        require_megatron()
    monkeypatch.setattr(megatron_required, "megatron_available", lambda: None)
    require_megatron()  # installed: runs, required or not
