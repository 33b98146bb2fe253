"""One host-key policy against the real test sshd: `rlctl check --reach` and the launch backend's runner
refuse the same unknown or changed keys, accept the site's known_hosts, and accept anything only under
the explicit opt-out (RLCTL_SSH_HOST_KEY_CHECKING=off)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch import hostkeys
from rlctl.launch.reach import probe_site
from rlctl.launch.sitefs import ssh_target
from rlctl.launch.sshrunner import SshRunner
from tests.integration.sshsite import ssh_site

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def files(services: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.delenv(hostkeys.ENV, raising=False)
    empty, wrong = tmp_path / "empty", tmp_path / "wrong"
    empty.write_text("")
    other = tmp_path / "other_host_key"  # a real ed25519 key of the right type, just not the server's
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=60)
    key = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    wrong.write_text(f"[{services['RLCTL_TEST_SSH_HOST']}]:{services['RLCTL_TEST_SSH_PORT']} {key}\n")
    return {"real": Path(services["RLCTL_TEST_SSH_KNOWN_HOSTS"]), "empty": empty, "wrong": wrong}


def run_true(s: Site) -> None:
    runner = SshRunner(ssh_target(s, connect_timeout_s=10))
    try:
        assert runner.run("true", timeout_s=20).exit_code == 0
    finally:
        runner.close()


def test_reach_and_backend_accept_the_sites_known_hosts(services: dict[str, str], files: dict[str, Path]) -> None:
    s = ssh_site(services, known_hosts=files["real"])
    res = probe_site("b", s, timeout_s=10)
    assert res.ok, res.detail
    run_true(s)


@pytest.mark.parametrize(("file", "why"), [("empty", "unknown host key"), ("wrong", "host key does not match")])
def test_reach_and_backend_refuse_the_same_keys(
    services: dict[str, str], files: dict[str, Path], file: str, why: str
) -> None:
    s = ssh_site(services, known_hosts=files[file])
    res = probe_site("b", s, timeout_s=10)
    assert not res.ok and why in res.detail, res.detail  # `check --reach` no longer accepts what launch refuses
    with pytest.raises(LaunchError, match=why):
        run_true(s)


def test_the_explicit_opt_out_accepts_any_key(
    services: dict[str, str], files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(hostkeys.ENV, "off")
    for file in ("empty", "wrong"):
        s = ssh_site(services, known_hosts=files[file])
        assert probe_site("b", s, timeout_s=10).ok
        run_true(s)
