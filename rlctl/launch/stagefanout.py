"""The fan-out of a multi-host SSH site's staging: its large files cross the site's link once, to its first host
(the seed), and the hosts serve them to each other as they land, in a tree (`fan_out`; the `fanout serve` and
`fanout fetch` it runs on the hosts are rlctl.launch.fanout's)."""

from __future__ import annotations

import json
import logging
import shlex
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import python_for
from rlctl.launch.base import site_setup
from rlctl.launch.remote import CommandResult, sh_path
from rlctl.launch.sitefs import FileState, StagingStopped, ssh_target
from rlctl.launch.sshrunner import SshRunner
from rlctl.launch.stagecopy import StagingProgress, View, copy_files, copy_pool

log = logging.getLogger(__name__)

FANOUT_MIN_BYTES = 8 << 20  # a multi-host SSH site's files this large cross its link once, then fan out there
FANOUT_CHILDREN = 2  # hosts each host of the site's fan-out tree serves
FANOUT_FLOOR_S = 60.0  # the fan-out server's start; a fetch's deadline: this plus its bytes at the floor rate
FANOUT_FLOOR_BYTES_PER_S = 1e6


def fanned(views: list[View], want: dict[str, FileState]) -> dict[str, list[str]]:
    """What the site's hosts other than the first (the seed) fetch from it instead of from the operator: their
    missing files of at least FANOUT_MIN_BYTES (the secret always goes straight: the fetch authenticates with it)."""
    out = {v.host: [n for n in v.todo if want[n].size >= FANOUT_MIN_BYTES and n != "secret"] for v in views[1:]}
    return {h: ns for h, ns in out.items() if ns}


def fan_out(
    site_name: str,
    site: Site,
    src: Path,
    views: list[View],
    fan: dict[str, list[str]],
    want: dict[str, FileState],
    progress: StagingProgress | None,
) -> dict[str, Any]:
    """Stage a multi-host site with one copy over its link: the small files straight to every host, the large ones
    to the seed (the first host); the hosts form a tree of FANOUT_CHILDREN children per host (in inventory order,
    the seed at its root), and every host with children serves what lands in it to their fetches
    (rlctl.launch.fanout), so no host sends more than FANOUT_CHILDREN copies. A fetch that fails is tried again
    from the seed's verified copy, then copied straight from here (a warning); a relay whose server does not start
    leaves its children to the seed. Returns staged.json's `fanout` entry: the seed, the bytes the servers sent (in
    all and by host), the relays, the files copied from here instead."""
    seed, others = views[0], views[1:]
    big = {n for ns in fan.values() for n in ns} | {n for n in seed.todo if want[n].size >= FANOUT_MIN_BYTES}
    big.discard("secret")
    with copy_pool(min(8, len(views)), progress) as pool:  # the secret first: the fan-out needs it
        list(
            pool.map(
                lambda v: copy_files(site_name, src, v, [n for n in v.todo if n not in big], want, progress), views
            )
        )
    tick = progress.advance if progress is not None else None
    stop = progress.stopping if progress is not None else None
    seed_files = [n for n in seed.todo if n in big]
    parent = {views[i].host: views[(i - 1) // FANOUT_CHILDREN] for i in range(1, len(views))}
    relaying = [seed, *{parent[h].host: parent[h] for h in fan if parent[h] is not seed}.values()]
    with copy_pool(min(8, len(relaying)), progress) as pool:  # before any server can serve them
        list(pool.map(lambda v: _clear_stale(site, v, seed_files if v is seed else fan.get(v.host, [])), relaying))
    servers = {seed.host: _Server(site, seed)}
    try:
        servers[seed.host].start()
    except LaunchError as e:  # e.g. no rlctl in the site's python: every host's copy crosses the link
        log.warning("site %s: %s; copying to each host from here", site_name, e)
        with copy_pool(min(8, len(views)), progress) as pool:
            direct = [(seed, seed_files), *((v, fan.get(v.host, [])) for v in others)]
            list(pool.map(lambda vn: copy_files(site_name, src, vn[0], vn[1], want, progress), direct))
        direct_n = {h: len(ns) for h, ns in fan.items()}
        return {"seed": seed.host, "served_bytes": 0, "served_by": {}, "relays": [], "direct": direct_n}
    try:
        relays = {v.host: v for v in relaying[1:]}
        with copy_pool(min(8, len(views)), progress) as pool:
            for host, started in zip(relays, pool.map(lambda v: _start(site, v), relays.values()), strict=True):
                if started is None:
                    log.warning("site %s: %s does not relay; its hosts fetch from %s", site_name, host, seed.host)
                else:
                    servers[host] = started

        def source(v: View) -> str:
            return servers.get(parent[v.host].host, servers[seed.host]).address

        ahead = sum(want[n].size for n in seed_files)  # a fetch may wait for the seed's copy of all of them
        with copy_pool(1 + len(views), progress) as pool:
            copy = pool.submit(copy_files, site_name, src, seed, seed_files, want, progress)
            fetches = {v.host: pool.submit(_fetch, site, v, fan[v.host], want, source(v), tick, ahead, stop)
                       for v in others if v.host in fan}  # fmt: skip
            try:
                copy.result()
            except BaseException:
                if progress is not None:  # first (as `copy_pool` would next): a fetch the seed's stop ends is stopped,
                    progress.stop()  # not a failed fetch, a warning per host of a launch the operator stopped
                for server in servers.values():  # the fetches waiting on the seed's files end now
                    server.stop()
                raise
            failed = {h: f.result() for h, f in fetches.items()}
        again = [v for v in others if failed.get(v.host)]
        for v in again:
            log.warning("site %s: %s: %d files did not arrive from %s; fetching them again from %s", site_name,
                        v.host, len(failed[v.host]), parent[v.host].host, seed.host)  # fmt: skip
            if progress is not None:
                progress.add(sum(want[n].size for n in failed[v.host]))
        with copy_pool(len(again), progress) as pool:  # the seed's copy is whole and verified
            address = servers[seed.host].address
            retried = pool.map(lambda v: _fetch(site, v, failed[v.host], want, address, tick, stop=stop), again)
            failed.update(zip((v.host for v in again), retried, strict=True))
    finally:
        for server in servers.values():
            server.stop()
    for v in others:
        if failed.get(v.host):
            log.warning("site %s: %s: %d files did not arrive twice; copying them from here", site_name, v.host,
                        len(failed[v.host]))  # fmt: skip
            if progress is not None:
                progress.add(sum(want[n].size for n in failed[v.host]))
            copy_files(site_name, src, v, failed[v.host], want, progress)
    return {
        "seed": seed.host,
        "served_bytes": sum(server.served for server in servers.values()),
        "served_by": {h: server.served for h, server in servers.items()},
        "relays": sorted(h for h in servers if h != seed.host),
        "direct": {h: len(ns) for h, ns in failed.items() if ns},
    }


def _start(site: Site, v: View) -> _Server | None:
    """A fan-out server on the view's host, started (None, with the reason logged, when it does not start)."""
    server = _Server(site, v)
    try:
        server.start()
    except LaunchError as e:
        log.warning("site fan-out: %s", e)
        return None
    return server


def _fetch(
    site: Site,
    v: View,
    names: list[str],
    want: dict[str, FileState],
    source: str,
    tick: Callable[[int], None] | None,
    ahead: int = 0,
    stop: threading.Event | None = None,
) -> list[str]:
    """Run `fanout fetch` on the view's host for `names` from `source`; the names that did not arrive whole (each
    file's SHA-256 is computed there as it is written and compared with the operator's). `ahead`: bytes the
    source may copy before it has these (its deadline allows for them at the floor rate too). Once `stop` is set
    the fetch is killed there (`_fetch_script`) and StagingStopped raised: the launch waited for its next
    progress line (a resumed file's hash, up to a model's shard), and the host went on fetching after it."""
    if not names:
        return []
    ok: set[str] = set()
    errors: list[str] = []

    def line(text: str) -> None:
        row = _row(text)
        if row is None:
            return
        if tick is not None and row.get("progress"):
            tick(int(row["progress"]))
        if "path" in row and row.get("ok"):
            ok.add(str(row["path"]))
        if "error" in row:
            errors.append(str(row["error"]))

    files = json.dumps([[n, want[n].size, want[n].sha256, want[n].mode] for n in names])
    command = _fetch_script(site, f"{sh_path(v.resolved)} --source {shlex.quote(source)}")
    held = stop if stop is not None else threading.Event()  # never set: stdin stays open until the fetch ends
    deadline = FANOUT_FLOOR_S + (ahead + sum(want[n].size for n in names)) / FANOUT_FLOOR_BYTES_PER_S
    runner = SshRunner(ssh_target(site, v.host))
    try:
        res: CommandResult | LaunchError = runner.run(
            command, timeout_s=deadline, stdin=files + "\n", hold_stdin=held, on_line=line
        )
    except LaunchError as e:
        res = e
    finally:
        runner.close()
    if held.is_set():
        raise StagingStopped(f"ssh {v.host}: fetch from {source} stopped")
    if isinstance(res, LaunchError):
        log.warning("site fan-out: %s: %s", v.host, res)
    elif res.exit_code != 0:
        log.warning("site fan-out: %s: fetch from %s failed: %s", v.host, source, "; ".join(errors) or res.tail())
    return [n for n in names if n not in ok]


def _row(text: str) -> dict[str, Any] | None:
    """A JSON object line of a fan-out command's stdout (None for any other line: a site's setup may print)."""
    try:
        row = json.loads(text)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _clear_stale(site: Site, v: View, names: list[str]) -> None:
    """Remove the view's other versions of `names` (on its host, not the bytes wanted) before its server starts:
    a whole file of the right size would otherwise be served before the new copy replaces it."""
    stale = [n for n in names if n in v.have]
    if not stale:
        return
    runner = SshRunner(ssh_target(site, v.host))
    try:
        paths = " ".join(sh_path(f"{v.resolved}/{n}") for n in stale)
        res = runner.run(f"rm -f -- {paths}", timeout_s=FANOUT_FLOOR_S)
        if res.exit_code != 0:
            raise LaunchError(f"ssh {v.host}: could not remove the old versions of {len(stale)} files: {res.tail()}")
    finally:
        runner.close()


def _site_python(site: Site, args: str) -> str:
    """A `python -m rlctl.launch.fanout ARGS` command line for one of the site's hosts (its setup lines first)."""
    return "\n".join([*site_setup(site.setup), f"exec {shlex.quote(python_for(site))} -m rlctl.launch.fanout {args}"])


def _fetch_script(site: Site, args: str) -> str:
    """`python -m rlctl.launch.fanout fetch ARGS` on a host of the site, given the first line of the command's stdin
    (the files, as JSON) and killed there by a watcher when the rest of its stdin ends: the operator ends it to
    stop (`_fetch`'s `stop`), and sshd does when the connection goes, where the fetch went on until it next wrote
    to the closed connection. Exits with the fetch's status (143 when killed)."""
    return "\n".join([
        *site_setup(site.setup),
        "exec 3<&0",  # the command's stdin: an asynchronous list's own is /dev/null
        "IFS= read -r files",
        f"{shlex.quote(python_for(site))} -m rlctl.launch.fanout fetch {args} <<EOF & fetcher=$!",
        "$files",
        "EOF",
        "(while read -r _; do :; done <&3; kill $fetcher 2>/dev/null) & watcher=$!",
        "wait $fetcher; rc=$?",
        "kill $watcher 2>/dev/null",
        'exit "$rc"',
    ])  # fmt: skip


class _Server:
    """`fanout serve` on a host of the site (the seed, or a relay) from `start` to `stop` (its stdin is held open
    until then)."""

    def __init__(self, site: Site, seed: View) -> None:
        self.runner = SshRunner(ssh_target(site, seed.host))
        self.command = _site_python(site, f"serve {sh_path(seed.resolved)} --advertise {shlex.quote(seed.host)}")
        self.where = seed.host
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._result: list[CommandResult | LaunchError] = []
        self.address = ""
        self.served = 0

    def _line(self, text: str) -> None:
        row = _row(text)
        if row is None:
            return
        if "listening" in row:
            self.address = str(row["listening"])
            self._listening.set()
        self.served = int(row.get("served", self.served))

    def _run(self) -> None:
        try:
            res = self.runner.run(self.command, timeout_s=None, on_line=self._line, hold_stdin=self._stop)
            self._result.append(res)
        except LaunchError as e:
            self._result.append(e)
        finally:
            self._listening.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fanout-seed", daemon=True)
        self._thread.start()
        self._listening.wait(FANOUT_FLOOR_S)
        if not self.address:
            self.stop()
            why = self._result[0] if self._result else "no answer"
            if isinstance(why, CommandResult):
                why = f"exit {why.exit_code}: {why.tail()}"
            raise LaunchError(f"ssh {self.where}: the fan-out server did not start ({why})")

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=FANOUT_FLOOR_S)
        self.runner.close()
        if self.address:
            log.info("site fan-out: %s served %d B to the site's other hosts", self.where, self.served)
