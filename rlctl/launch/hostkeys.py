"""The one SSH host-key policy of rlctl, for every SSH connection and every rendered ssh command line.

Every connection (launch backends, `rlctl check --reach`, the site file views, the profiler's runs on a
site, a controller starting units on another site) opens through `rlctl.launch.remote.connect`, which
asks this module; `rendered_options` gives the same policy to the copy-pastable `ssh` command lines.

    strict (default)  trust only the keys of the site's known_hosts file (`known_hosts:` /
                      `ssh_known_hosts:` in the inventory), else ~/.ssh/known_hosts — as OpenSSH with
                      StrictHostKeyChecking=yes. An unknown host or a changed key is refused, with
                      the hint `ssh-keyscan -p PORT HOST >> FILE`.
    off               accept any key, logging a warning per connection. Only for throwaway test setups,
                      and only when asked for explicitly: `rlctl --insecure-host-keys …`, or
                      RLCTL_SSH_HOST_KEY_CHECKING=off in the environment.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rlctl.errors import LaunchError, UsageError
from rlctl.textutil import home_path

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)

ENV = "RLCTL_SSH_HOST_KEY_CHECKING"
MODES = ("strict", "off")
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def mode() -> Literal["strict", "off"]:
    """The policy in force: `strict` unless RLCTL_SSH_HOST_KEY_CHECKING=off."""
    value = os.environ.get(ENV, "strict").strip().lower() or "strict"
    if value == "strict":
        return "strict"
    if value == "off":
        return "off"
    raise UsageError(f"{ENV}={value!r} is not valid; valid: {', '.join(MODES)} (default strict)")


def known_hosts_path(known_hosts: str | None) -> Path:
    """The file trusted for a target: its site's known_hosts, else the operator's ~/.ssh/known_hosts."""
    return home_path(known_hosts or DEFAULT_KNOWN_HOSTS, named="known_hosts")


def apply(client: paramiko.SSHClient, *, known_hosts: str | None) -> Path:
    """Set the policy on `client` before it connects; returns the known_hosts file it trusts."""
    import paramiko

    known = known_hosts_path(known_hosts)
    if mode() == "off":
        client.set_missing_host_key_policy(_accept_any())
        return known
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    if known.exists():
        client.load_host_keys(str(known))
    return known


def refusal(e: Exception, *, label: str, host: str, port: int, known: Path) -> LaunchError | None:
    """The LaunchError for a connection this policy refused (unknown or changed host key); None otherwise."""
    import paramiko

    hint = f"add its key: ssh-keyscan -p {port} {host} >> {known} (after checking it)"
    if isinstance(e, paramiko.BadHostKeyException):
        return LaunchError(f"ssh {label}: host key does not match {known}", hint=hint)
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        return LaunchError(f"ssh {label}: unknown host key (not in {known})", hint=hint)
    return None


def rendered_options(known_hosts_arg: str | None) -> list[str]:
    """The policy as OpenSSH options; `known_hosts_arg` is the site's file, already quoted for a shell."""
    if mode() == "off":
        return ["-o StrictHostKeyChecking=no", "-o UserKnownHostsFile=/dev/null"]
    return [*([f"-o UserKnownHostsFile={known_hosts_arg}"] if known_hosts_arg else []), "-o StrictHostKeyChecking=yes"]


def _accept_any() -> paramiko.MissingHostKeyPolicy:
    """A policy that accepts any key and says so (defined here: only SSH users import paramiko)."""
    import paramiko

    class AcceptAny(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            log.warning(
                "ssh %s: host key %s %s accepted UNCHECKED (%s=off)",
                hostname,
                key.get_name(),
                key.fingerprint,
                ENV,
            )

    return AcceptAny()
