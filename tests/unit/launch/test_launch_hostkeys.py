"""The one SSH host-key policy (`rlctl.launch.hostkeys`), against a real SSH server in this process
(paramiko over a socketpair): unknown and changed keys refused, known keys accepted, the explicit
opt-out accepts anything and says so; reach, the backends and the rendered command lines all use it."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

import paramiko
import pytest

from rlctl.config.inventory import Site
from rlctl.errors import UsageError
from rlctl.launch import hostkeys
from rlctl.launch.reach import probe_site
from rlctl.launch.ssh import SshBackend

HOST, PORT = "site-b.example", 2222
SERVER_KEY = paramiko.ECDSAKey.generate()
OTHER_KEY = paramiko.ECDSAKey.generate()


def known_hosts(tmp: Path, key: paramiko.PKey | None) -> Path:
    path = tmp / "known_hosts"
    path.write_text(f"[{HOST}]:{PORT} {key.get_name()} {key.get_base64()}\n" if key else "")
    return path


def connect_to_server(known: Path | None) -> Exception:
    """Connect a client under the policy to an in-process server; the exception the attempt ended with.

    The server accepts no login, so a client past the host-key check ends in AuthenticationException."""
    ours, theirs = socket.socketpair()
    server = paramiko.Transport(theirs)
    server.add_server_key(SERVER_KEY)
    serving = threading.Thread(target=_serve, args=(server,), daemon=True)  # start_server waits for the client
    serving.start()
    client = paramiko.SSHClient()
    hostkeys.apply(client, known_hosts=str(known) if known else None)
    try:
        client.connect(HOST, PORT, username="u", password="p", sock=ours, look_for_keys=False, allow_agent=False)
    except (paramiko.SSHException, OSError) as e:
        return e
    finally:
        client.close()
        server.close()
        ours.close()
        serving.join(timeout=10)
    raise AssertionError("the server accepts no login: connect cannot succeed")


def _serve(server: paramiko.Transport) -> None:
    with contextlib.suppress(paramiko.SSHException, EOFError, OSError):  # the client may hang up first
        server.start_server(server=paramiko.ServerInterface())


@pytest.fixture(autouse=True)
def strict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(hostkeys.ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no operator known_hosts leaks in


def test_unknown_host_is_refused_with_the_keyscan_hint(tmp_path: Path) -> None:
    known = known_hosts(tmp_path, None)
    e = connect_to_server(known)
    refused = hostkeys.refusal(e, label=f"u@{HOST}:{PORT}", host=HOST, port=PORT, known=known)
    assert refused is not None and "unknown host key" in str(refused)
    assert refused.hint is not None and f"ssh-keyscan -p {PORT} {HOST} >> {known}" in refused.hint


def test_known_key_is_accepted(tmp_path: Path) -> None:
    e = connect_to_server(known_hosts(tmp_path, SERVER_KEY))
    assert isinstance(e, paramiko.AuthenticationException)  # got as far as logging in


def test_changed_key_is_refused(tmp_path: Path) -> None:
    known = known_hosts(tmp_path, OTHER_KEY)
    e = connect_to_server(known)
    assert isinstance(e, paramiko.BadHostKeyException)
    refused = hostkeys.refusal(e, label=HOST, host=HOST, port=PORT, known=known)
    assert refused is not None and "does not match" in str(refused)


def test_without_a_site_file_the_operators_known_hosts_is_trusted(tmp_path: Path) -> None:
    home_ssh = tmp_path / "home" / ".ssh"
    home_ssh.mkdir(parents=True)
    known_hosts(home_ssh, SERVER_KEY)
    assert hostkeys.known_hosts_path(None) == home_ssh / "known_hosts"
    assert isinstance(connect_to_server(None), paramiko.AuthenticationException)
    assert "not found in known_hosts" in str(connect_to_server(known_hosts(tmp_path, None)))


def test_explicit_opt_out_accepts_any_key_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(hostkeys.ENV, "off")
    with caplog.at_level(logging.WARNING, logger="rlctl.launch.hostkeys"):
        assert isinstance(connect_to_server(known_hosts(tmp_path, None)), paramiko.AuthenticationException)
        assert isinstance(connect_to_server(known_hosts(tmp_path, OTHER_KEY)), paramiko.AuthenticationException)
    assert any("UNCHECKED" in r.getMessage() and HOST in r.getMessage() for r in caplog.records)


def test_a_bad_opt_out_value_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hostkeys.ENV, "no")
    with pytest.raises(UsageError, match="RLCTL_SSH_HOST_KEY_CHECKING='no' is not valid; valid: strict, off"):
        hostkeys.mode()


def test_a_bad_opt_out_value_is_check_reach_s_usage_error_not_each_site_s_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlctl check --reach` of an SSH site with RLCTL_SSH_HOST_KEY_CHECKING=no said each site 'FAILED  UsageError:
    …' in its reach table and exited 3 (`unreachable site(s): …`), as if the sites were down."""
    from tests.conftest import run_cli

    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "apiVersion: rlctl/v1\nkind: Inventory\nsites:\n  b:\n    datacenter: b\n    scheduler: {kind: ssh}\n"
        "    gpu: CPU\n    nodes: [{host: 127.0.0.1, gpus: 1}]\n"
    )
    monkeypatch.setenv(hostkeys.ENV, "no")
    res = run_cli("check", str(inv), "--reach", "--timeout", "3")
    assert (res.exit_code, res.stdout) == (2, ""), res
    assert res.stderr == (
        "rlctl: error: RLCTL_SSH_HOST_KEY_CHECKING='no' is not valid; valid: strict, off (default strict)\n"
    )


def test_rendered_command_lines_follow_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    site = Site.model_validate(
        {
            "datacenter": "b",
            "scheduler": {"kind": "ssh", "port": 2200},
            "gpu": "CPU",
            "nodes": [{"host": "h1", "gpus": 1}],
        }
    )
    backend = SshBackend("b", site, job="j", known_hosts="/etc/kh")
    assert "-o UserKnownHostsFile=/etc/kh -o StrictHostKeyChecking=yes" in backend.command_line("h1", "true\n")
    monkeypatch.setenv(hostkeys.ENV, "off")
    line = backend.command_line("h1", "true\n")
    assert "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null" in line and "/etc/kh" not in line


def test_reach_goes_through_the_same_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlctl check --reach` connects as the backends do: hostkeys.apply with the site's known_hosts."""
    applied: list[Any] = []
    real = hostkeys.apply

    def spy(client: paramiko.SSHClient, *, known_hosts: str | None) -> Path:
        applied.append(known_hosts)
        return real(client, known_hosts=known_hosts)

    monkeypatch.setattr(hostkeys, "apply", spy)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nobody listens there: the probe fails after the policy was set
    site = Site.model_validate(
        {
            "datacenter": "b",
            "scheduler": {"kind": "ssh", "port": port, "known_hosts": "/etc/site-kh"},
            "gpu": "CPU",
            "nodes": [{"host": "127.0.0.1", "gpus": 1}],
        }
    )
    res = probe_site("b", site, timeout_s=3)
    assert not res.ok and "cannot connect" in res.detail
    assert applied == ["/etc/site-kh"]


@pytest.mark.parametrize("before", [None, "strict", "off"])
def test_the_cli_flag_is_the_explicit_opt_out(monkeypatch: pytest.MonkeyPatch, before: str | None) -> None:
    """`rlctl --insecure-host-keys …` turns the policy off for that command (and what it starts), and only then:
    the environment is put back as it was after it, versus left at `off` in the process (an in-process caller,
    every later test of a pytest worker, kept the opt-out)."""
    from rlctl.commands import version
    from tests.conftest import run_cli

    seen: list[str] = []
    monkeypatch.setattr(version, "emit", lambda *_: seen.append(hostkeys.mode()))
    if before is None:
        monkeypatch.delenv(hostkeys.ENV, raising=False)
    else:
        monkeypatch.setenv(hostkeys.ENV, before)
    assert run_cli("version").exit_code == 0
    assert run_cli("--insecure-host-keys", "version").exit_code == 0
    assert seen == [before or "strict", "off"]
    assert os.environ.get(hostkeys.ENV) == before


def test_a_known_hosts_file_under_a_home_that_is_not_there_is_refused_naming_the_field() -> None:
    # an inventory's `known_hosts: ~nosuchuser/kh` ended in a RuntimeError traceback, exit 1 (Path.expanduser's
    # 'Could not determine home directory'), versus one line naming the field
    with pytest.raises(UsageError, match=r"^known_hosts ~rlctl-no-such-user/kh: ~rlctl-no-such-user is no home"):
        hostkeys.known_hosts_path("~rlctl-no-such-user/kh")
