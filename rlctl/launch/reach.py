"""Reachability of a site through its scheduler: local always, SSH login, SLURM controller.

Each probe has a deadline and never raises for an unreachable site: it returns a result row,
so `rlctl check --reach` can report every site and exit 3 when some failed. SSH probes connect as
the launch backends do (`rlctl.launch.remote`), under the one host-key policy of `rlctl.launch.hostkeys`:
a host whose key is unknown is unreachable for `check` exactly as it would be for `launch`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rlctl.config.inventory import Site
from rlctl.errors import RlctlError, UsageError
from rlctl.launch.backends import kind_of


@dataclass
class ReachResult:
    site: str
    ok: bool
    detail: str
    seconds: float


def probe_site(name: str, site: Site, *, timeout_s: float = 10.0) -> ReachResult:
    t0 = time.monotonic()
    try:
        detail = kind_of(site).reach(site, timeout_s=timeout_s)
        ok = True
    except UsageError:  # the operator's command or environment (RLCTL_SSH_HOST_KEY_CHECKING=bogus), not the site's: one
        raise  # line, exit 2, versus every site's row 'FAILED  UsageError: …' and exit 3 (unreachable site(s))
    except FileNotFoundError as e:  # fault-tolerance point: one row per site, never a crash
        ok, detail = False, f"command not found: {e.filename}"
    except Exception as e:  # noqa: BLE001 - fault-tolerance point, see docstring
        ok, detail = False, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if isinstance(e, RlctlError) and e.hint:  # what to do: an unknown host key's is the ssh-keyscan line
            detail += f" (hint: {e.hint})"
    return ReachResult(name, ok, detail, time.monotonic() - t0)
