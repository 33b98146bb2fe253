"""The `ssh` launch backend: agents as detached process groups on SSH hosts (fabric).

Every remote action is one bash script sent to `bash -s` on the host; `render()` returns those
scripts as copy-pastable command lines (`rlctl launch --dry-run`). Per agent, under the run dir:

    <run>/<role>-<replica>.pid    {"pid", "pgid", "start_ticks"}  written right after the start
    <run>/<role>-<replica>.exit   the agent's exit code, written by its wrapper when it exits
    log file                      stdout + stderr of the agent (spec.log_path or <workdir>/logs/)

    start: setsid nohup bash -c '"$@"; echo $? > EXIT' …  &   (pid = pgid: a new session)
    poll : pid alive AND /proc/PID/stat field 22 (start time) = the recorded one → running;
           else the exit file → finished / failed; a pid with another start time is someone else's
    stop : TERM to the group ─▶ wait ≤ grace_s ─▶ KILL ─▶ verify `pgrep -g` lists no live process
           (a pid whose start time differs is reported gone and never signalled)

Host: the one of the spec's GPU slice (`spec.gpu_slice`, handed out by `rlctl.launch.gpus`);
a spec without one goes round robin over the site's hosts by replica.

Host keys: `rlctl.launch.hostkeys`, for the connections and for the rendered command lines alike (site
known_hosts file, else ~/.ssh/known_hosts; unknown hosts refused). Connect and command deadlines raise
LaunchError naming the host.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rlctl import procfs
from rlctl.config.inventory import Site
from rlctl.config.schedulers import SshScheduler
from rlctl.errors import LaunchError
from rlctl.launch import hostkeys
from rlctl.launch.base import LOST, AgentHandle, AgentSpec, LaunchBackend, site_setup
from rlctl.launch.remote import RemoteState, SshTarget, jump_target, sh_path
from rlctl.launch.sshrunner import SshRunner

log = logging.getLogger(__name__)

# field 22 of /proc/PID/stat (start time, clock ticks since boot); fields are counted after the
# "(comm)" part, which may itself contain spaces: field 3 is the first after ") ".
_STAT = "sed -E 's/^.*\\) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f{fields}"
# live members of a process group (zombies excluded: they are dead, only not yet reaped)
_LIVE_FN = (
    'live() { for p in $(pgrep -g "$1" 2>/dev/null); do '
    "s=$(sed -E 's/^.*\\) //' /proc/$p/stat 2>/dev/null | cut -c1); "
    '[ -n "$s" ] && [ "$s" != Z ] && echo "$p"; done; return 0; }'
)
# T = now in µs. bash ≥ 5 has EPOCHREALTIME; an older one only whole SECONDS, so its deadlines add one second (P):
# a wait that ends at SECONDS + n lasts between n - 1 and n seconds, and a grace period must not end early.
_CLOCK_FN = (
    'clock() { if [ -n "${EPOCHREALTIME:-}" ]; then T=${EPOCHREALTIME/[.,]/}; P=0; '
    "else T=$((SECONDS * 1000000)); P=1000000; fi; }"
)


def _sched(site: Site) -> SshScheduler:
    assert isinstance(site.scheduler, SshScheduler), site.scheduler.kind
    return site.scheduler


# the key files ssh tries where it is given none (ssh_config's IdentityFile): a bastion's after the site's key_file
OWN_KEY_FILES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519", "~/.ssh/id_ed25519_sk")


def _literal(text: str, expanded: int) -> str:
    """`text` as ssh reads it literally where it expands %-tokens (ProxyCommand, IdentityFile, UserKnownHostsFile),
    `expanded` times on its way: each `%` doubled per expansion (a host-key file `/etc/rl/kh%h` was read as
    `/etc/rl/kh` and the host's name; a key file `~/keys/50%off` ended ssh on `%o`, an unknown token)."""
    return text.replace("%", "%" * 2**expanded)


@dataclass(frozen=True)
class SshStatus:
    state: RemoteState
    exit_code: int | None
    live_pids: list[int]
    detail: str


def round_robin(hosts: list[str]) -> Callable[[AgentSpec], str]:
    return lambda spec: hosts[spec.replica % len(hosts)]


class SshBackend(LaunchBackend):
    kind = "ssh"
    default_python = "python3"  # the hosts' own, not this machine's interpreter path

    @classmethod
    def for_site(cls, site_name: str, site: Site, *, job: str, job_dir: Path) -> SshBackend:
        return cls(site_name, site, job=job, known_hosts=_sched(site).known_hosts)

    @classmethod
    def work_root(cls, site: Site) -> str | None:
        return _sched(site).workdir

    @classmethod
    def remote(cls, site: Site) -> bool:
        return True

    @classmethod
    def ssh_target(cls, site: Site, host: str | None = None, *, connect_timeout_s: float = 10.0) -> SshTarget:
        sched = _sched(site)
        return SshTarget(
            host or site.hosts[0][0],
            user=sched.user,
            port=sched.port,
            key_file=sched.key_file,
            known_hosts=sched.known_hosts,
            proxy_jump=sched.proxy_jump,
            connect_timeout_s=connect_timeout_s,
        )

    @classmethod
    def access_hosts(cls, site: Site) -> list[str]:
        """Every host has its own work root, unless they share one (`shared_workdir`): then the first."""
        hosts = [h for h, _ in site.hosts]
        return hosts[:1] if _sched(site).shared_workdir else hosts

    @classmethod
    def agent_view(cls, site: Site, agent_host: str | None) -> str:
        if agent_host and not _sched(site).shared_workdir:
            return agent_host
        return cls.access_hosts(site)[0]

    @classmethod
    def shared_work_root(cls, site: Site) -> bool:
        return _sched(site).shared_workdir

    @classmethod
    def site_runner(cls, site: Site, host: str | None = None) -> SshRunner:
        return SshRunner(cls.ssh_target(site, host))

    @classmethod
    def probe_commands(cls, site: Site, command: str, *, first: bool = False) -> list[tuple[str, str | None, str]]:
        hosts = [h for h, _ in site.hosts][: 1 if first else None]
        return [(host, host, command) for host in hosts]

    @classmethod
    def reach(cls, site: Site, *, timeout_s: float) -> str:
        """An SSH login (with the site's host-key policy) on every host."""
        hosts = [h for h, _ in site.hosts]
        for host in hosts:
            runner = SshRunner(cls.ssh_target(site, host, connect_timeout_s=timeout_s))
            try:
                res = runner.run("true", timeout_s=timeout_s)
            finally:
                runner.close()
            if res.exit_code != 0:
                raise LaunchError(f"{host}: 'true' exited {res.exit_code}: {res.tail()[:200]}")
        return f"ssh login ok on {len(hosts)} host(s)"

    def __init__(
        self,
        site_name: str,
        site: Site,
        *,
        job: str,
        known_hosts: str | None = None,
        placement: Callable[[AgentSpec], str] | None = None,
        connect_timeout_s: float = 10.0,
        command_timeout_s: float = 30.0,
    ) -> None:
        self.site = site_name
        self._site = site
        self.sched = _sched(site)
        self.setup = list(site.setup)
        self.job = job
        self.known_hosts = known_hosts
        self._hosts = [h for h, _ in site.hosts]
        self.placement = placement or round_robin(self._hosts)
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self._runners: dict[str, SshRunner] = {}

    # ---------------------------------------------------------------- paths
    def workdir(self) -> str:
        return f"{self.sched.workdir.rstrip('/')}/jobs/{self.job}"

    def _paths(self, spec: AgentSpec) -> dict[str, str]:
        run = f"{self.workdir()}/run"
        return {
            "cwd": str(spec.cwd) if spec.cwd else self.workdir(),
            "run": run,
            "pidfile": f"{run}/{spec.name}.pid",
            "exitfile": f"{run}/{spec.name}.exit",
            "log": str(spec.log_path) if spec.log_path else f"{self.workdir()}/logs/{spec.name}.log",
        }

    def target(self, host: str) -> SshTarget:
        """The site's target for `host`, with this backend's host-key file and connect deadline."""
        t = self.ssh_target(self._site, host, connect_timeout_s=self.connect_timeout_s)
        return dataclasses.replace(t, known_hosts=self.known_hosts)

    def _runner(self, host: str) -> SshRunner:
        if host not in self._runners:
            self._runners[host] = SshRunner(self.target(host))
        return self._runners[host]

    # ---------------------------------------------------------------- scripts
    def start_script(self, spec: AgentSpec) -> str:
        p = self._paths(spec)
        log_dir = str(PurePosixPath(p["log"]).parent)
        lines = [
            "set -eu",
            f"mkdir -p {sh_path(p['run'])} {sh_path(log_dir)} {sh_path(p['cwd'])}",
            f"cd {sh_path(p['cwd'])}",
            f"rm -f {sh_path(p['exitfile'])}",
            *(f"export {k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())),
            *site_setup(self.setup),
            # no `&&` chain before the `&` (the channel would stay open); TERM is trapped by the
            # wrapper so it lives to record the exit code (a trap, unlike an ignore, is not inherited)
            'setsid nohup bash -c \'trap : TERM HUP; "$@"; echo $? > "$0"\' '
            f"{sh_path(p['exitfile'])} {shlex.join(spec.argv)} > {sh_path(p['log'])} 2>&1 < /dev/null &",
            "pid=$!",
            f"start=$({_STAT.format(pid='$pid', fields=20)})",
            'printf \'{"pid": %s, "pgid": %s, "start_ticks": %s}\\n\' "$pid" "$pid" "${start:-0}"'
            f" > {sh_path(p['pidfile'])}",
            f"cat {sh_path(p['pidfile'])}",
        ]
        return "\n".join(lines) + "\n"

    def poll_script(self, handle: AgentHandle) -> str:
        i = handle.ident
        return "\n".join(
            [
                _LIVE_FN,
                f'echo "leader $({_STAT.format(pid=i["pid"], fields="1,20")})"',
                f'echo "exit $(cat {sh_path(i["exitfile"])} 2>/dev/null)"',
                f'echo "group $(live {i["pgid"]} | tr "\\n" " ")"',
                "",
            ]
        )

    def stop_script(self, handles: list[AgentHandle], grace_s: float) -> str:
        """One script per host: TERM every group that is still ours, wait, KILL, verify. The waits end at a time
        (`clock`), not after a count of passes: a pass lists every group's processes, which takes longer the
        more there are, and the caller's deadline is the grace period's. A pgid no group can have (a hand-edited
        agents.jsonl: `procfs.possible`) is left out, as the local backend's signal does, versus `kill -TERM -- -1`
        (every process of the user there) for pgid 1 and the script's own group for 0 (`pgrep -g 0`)."""
        grace_us = max(0, round(grace_s * 1e6))
        kept = []
        for h in handles:
            if procfs.possible(h.ident["pgid"], group=True):
                kept.append(f"{h.ident['pid']}:{h.ident['start_ticks']}:{h.ident['pgid']}")
            else:
                pgid = h.ident["pgid"]
                log.warning("%s: agents.jsonl's pgid %s is no process group: not signalled", h.spec.name, pgid)
        groups = " ".join(kept)
        return "\n".join(
            [
                _LIVE_FN,
                _CLOCK_FN,
                "mine=''",
                f"for g in {groups}; do",
                "  pid=${g%%:*}; rest=${g#*:}; start=${rest%%:*}; pg=${rest#*:}",
                f"  now=$({_STAT.format(pid='$pid', fields=20)})",
                '  if [ -n "$now" ] && [ "$now" != "$start" ]; then echo "$pg reused"; continue; fi',
                '  if [ -z "$(live "$pg")" ]; then echo "$pg gone"; continue; fi',
                '  kill -TERM -- "-$pg" 2>/dev/null || true; mine="$mine $pg"',
                "done",
                f"clock; end=$((T + P + {grace_us}))",
                'while clock; [ "$T" -lt "$end" ]; do any=""; for pg in $mine; do [ -n "$(live "$pg")" ] && any=1;'
                " done",
                '  [ -z "$any" ] && break; sleep 0.1; done',
                'for pg in $mine; do if [ -n "$(live "$pg")" ]; then kill -KILL -- "-$pg" 2>/dev/null || true;'
                ' echo "$pg forced"; else echo "$pg graceful"; fi; done',
                "end=$((SECONDS + 5))",
                'while [ "$SECONDS" -lt "$end" ]; do any=""; for pg in $mine; do [ -n "$(live "$pg")" ] && any=1; done',
                '  [ -z "$any" ] && break; sleep 0.1; done',
                'for pg in $mine; do left=$(live "$pg" | tr "\\n" " "); [ -n "$left" ] && echo "$pg left $left"; done',
                "exit 0",
                "",
            ]
        )

    def command_line(self, host: str, script: str) -> str:
        """The exact command to run `script` on `host` by hand (what fabric does: `bash -s` + stdin)."""
        t = self.target(host)

        def keys(expanded: int) -> list[str]:  # the host-key options, their path through `expanded` %-expansions
            return hostkeys.rendered_options(sh_path(_literal(t.known_hosts, expanded)) if t.known_hosts else None)

        def identity(expanded: int) -> list[str]:  # the key file's options, its path through `expanded` %-expansions
            if not t.key_file:
                return []
            if "%" in t.key_file:  # `-i` looks for the file as written, then expands its %-tokens
                key = f"-o IdentityFile={sh_path(_literal(t.key_file, expanded))}"
            else:
                key = f"-i {sh_path(t.key_file)}"
            # without it ssh offers every key of the user's agent before the file's, and a server that allows
            # MaxAuthTries (6) of them closes the connection first ('Too many authentication failures')
            return [key, "-o IdentitiesOnly=yes"]

        opts = [f"-p {t.port}", *identity(1)]
        if t.proxy_jump:  # not `-J`, whose bastion connection ignores the options given here (host-key and key file)
            j = jump_target(t.proxy_jump, known_hosts=t.known_hosts)
            # `[%h]:%p`, as ssh -J writes it: ssh reads `fd00::2:22` as no host and port. The rest is literal: the
            # outer ssh expands the ProxyCommand's %-tokens, and the bastion's ssh its IdentityFile's and
            # UserKnownHostsFile's again
            via = [
                "ssh",
                f"-p {j.port}",
                *identity(2),
                # then the user's own key files, as rlctl's connection (`jump_target`) tries them after the site's
                *(f"-o IdentityFile={sh_path(f)}" for f in OWN_KEY_FILES if t.key_file),
                *keys(2),
                "-W '[%h]:%p'",
                shlex.quote(_literal(f"{j.user}@{j.host}" if j.user else j.host, 1)),
            ]
            opts += [f"-o {shlex.quote('ProxyCommand=' + ' '.join(via))}"]
        opts += keys(1)
        user = f"{t.user}@" if t.user else ""
        return f"ssh {' '.join(opts)} {shlex.quote(user + host)} bash -s <<'RLCTL_EOF'\n{script}RLCTL_EOF\n"

    def host_for(self, spec: AgentSpec) -> str:
        """The host of the spec's GPU slice; without one, the placement rule (round robin by replica)."""
        if spec.gpu_slice is None:
            return self.placement(spec)
        if spec.gpu_slice.host not in self._hosts:
            raise LaunchError(
                f"site {self.site}: {spec.name} is placed on {spec.gpu_slice.host!r}, "
                f"not a host of the site ({', '.join(self._hosts)})"
            )
        return spec.gpu_slice.host

    def render(self, spec: AgentSpec) -> str:
        return self.command_line(self.host_for(spec), self.start_script(spec))

    # ---------------------------------------------------------------- start / poll / stop
    def start(self, spec: AgentSpec) -> AgentHandle:
        host = self.host_for(spec)
        res = self._runner(host).run("bash -s", timeout_s=self.command_timeout_s, stdin=self.start_script(spec))
        try:
            if res.exit_code != 0:
                raise ValueError(res.tail())
            rec = json.loads(res.stdout.strip().splitlines()[-1])
            ident = {k: int(rec[k]) for k in ("pid", "pgid", "start_ticks")}
        except (ValueError, KeyError, IndexError) as e:
            raise LaunchError(f"site {self.site}: cannot start {spec.name} on {host}: {e}") from e
        if ident["start_ticks"] == 0:
            raise LaunchError(f"site {self.site}: {spec.name} on {host} exited at once; see its log")
        ident_all = {"host": host, **ident, **{k: self._paths(spec)[k] for k in ("pidfile", "exitfile", "log")}}
        log.info("site %s: %s started on %s, pid %s", self.site, spec.name, host, ident["pid"])
        return AgentHandle(spec, ident_all, self.kind)

    def status(self, handle: AgentHandle) -> SshStatus:
        i = handle.ident
        res = self._runner(i["host"]).run("bash -s", timeout_s=self.command_timeout_s, stdin=self.poll_script(handle))
        lines = dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)
        leader = lines.get("leader", "").split()
        exit_s = lines.get("exit", "").strip()
        live = [int(p) for p in lines.get("group", "").split()]
        ours = len(leader) == 2 and leader[1] == str(i["start_ticks"]) and leader[0] != "Z"
        if ours:
            return SshStatus(RemoteState.RUNNING, None, live, "running")
        reused = len(leader) == 2 and leader[1] != str(i["start_ticks"])
        if reused:
            live = []  # that group is someone else's now
        code = int(exit_s) if exit_s.lstrip("-").isdigit() else None
        detail = "pid reused by another process" if reused else ("exited" if code is not None else "vanished")
        if code is None:
            code, detail = LOST, detail + " without an exit code"
        if i.get("stopped"):  # ended because we stopped it, whatever its exit code
            return SshStatus(RemoteState.CANCELLED, code, live, detail + " after stop")
        return SshStatus(RemoteState.FINISHED if code == 0 else RemoteState.FAILED, code, live, detail)

    def poll(self, handle: AgentHandle) -> int | None:
        return self.status(handle).exit_code

    def stop(self, handles: list[AgentHandle], *, grace_s: float = 10.0) -> None:
        by_host: dict[str, list[AgentHandle]] = {}
        for h in handles:
            h.ident["stopped"] = True
            by_host.setdefault(h.ident["host"], []).append(h)

        def one(host: str) -> list[str]:
            script = self.stop_script(by_host[host], grace_s)
            try:
                res = self._runner(host).run("bash -s", timeout_s=grace_s + self.command_timeout_s, stdin=script)
            except LaunchError as e:  # one dead host must not keep the others from being stopped
                return [str(e)]
            if res.exit_code != 0:
                return [f"{host}: stop script failed: {res.tail()}"]
            for line in res.stdout.splitlines():
                log.info("site %s: %s: group %s", self.site, host, line)
            return [f"{host}: group {line}" for line in res.stdout.splitlines() if " left " in line]

        with ThreadPoolExecutor(max_workers=min(8, len(by_host) or 1)) as pool:
            problems = [p for ps in pool.map(one, by_host) for p in ps]
        if problems:
            raise LaunchError(f"site {self.site}: could not stop everything: {'; '.join(problems)}")

    def close(self) -> None:
        for r in self._runners.values():
            r.close()
        self._runners.clear()
