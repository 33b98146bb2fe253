"""SSH backend without a host: the exact remote scripts (golden files) and how poll output is read."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.base import AgentHandle, AgentSpec
from rlctl.launch.remote import CommandResult, RemoteState, jump_target, sh_path
from rlctl.launch.ssh import LOST, SshBackend
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden" / "launch"
SITE = Site.model_validate(
    {
        "datacenter": "dc-b",
        "scheduler": {"kind": "ssh", "user": "rl", "port": 2200, "key_file": "~/.ssh/id_rl", "workdir": "~/.rlctl"},
        "gpu": "H20",
        "nodes": [{"host": "h20-[01-02]", "gpus": 8}],
    }
)
SPEC = AgentSpec(
    role="rollout",
    replica=1,
    site="h20",
    argv=["python3", "-m", "rlctl.agents", "rollout", "--job-dir", "~/.rlctl/jobs/demo", "--replica", "1"],
    env={"RLCTL_ROLE": "rollout", "WEIRD": "it's $HOME"},
)
IDENT = {
    "host": "h20-02",
    "pid": 4242,
    "pgid": 4242,
    "start_ticks": 987654,
    "pidfile": "~/.rlctl/jobs/demo/run/rollout-1.pid",
    "exitfile": "~/.rlctl/jobs/demo/run/rollout-1.exit",
    "log": "~/.rlctl/jobs/demo/logs/rollout-1.log",
}


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("RLCTL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with RLCTL_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name} changed; review, then refresh with RLCTL_UPDATE_GOLDEN=1"


def backend() -> SshBackend:
    return SshBackend("h20", SITE, job="demo", known_hosts="/etc/rlctl/known_hosts")


def test_start_command_line_matches_golden() -> None:
    text = backend().render(SPEC)
    check_golden("ssh_start_rollout.txt", text)
    assert text.startswith(
        'ssh -p 2200 -i "$HOME"/.ssh/id_rl -o IdentitiesOnly=yes -o UserKnownHostsFile=/etc/rlctl/known_hosts'
    )
    assert " rl@h20-02 bash -s" in text  # replica 1 → second host (round robin)
    assert "&&" not in text.split("setsid", 1)[1].split("\n")[0]  # no && chain before the detaching &


def test_poll_and_stop_scripts_match_golden() -> None:
    b = backend()
    h = AgentHandle(SPEC, dict(IDENT), "ssh")
    other = AgentHandle(SPEC, {**IDENT, "pid": 5000, "pgid": 5000, "start_ticks": 11}, "ssh")
    check_golden("ssh_poll_rollout.sh", b.poll_script(h))
    check_golden("ssh_stop_two.sh", b.stop_script([h, other], grace_s=7.5))
    assert "end=$((T + P + 7500000))" in b.stop_script([h], grace_s=7.5)


@pytest.mark.parametrize("pgid", [0, 1, -4242, 2**31])
def test_the_stop_script_signals_no_pgid_a_group_cannot_have(pgid: int) -> None:
    # a hand-edited agents.jsonl: pgid 1 was `kill -TERM -- -1` there (every process of the user), 0 the script's own
    b = backend()
    bad = AgentHandle(SPEC, {**IDENT, "pgid": pgid}, "ssh")
    other = AgentHandle(SPEC, {**IDENT, "pid": 5000, "pgid": 5000, "start_ticks": 11}, "ssh")
    assert "for g in 5000:11:5000; do" in b.stop_script([bad, other], grace_s=1).splitlines()


@pytest.mark.parametrize("clock", ["EPOCHREALTIME", "SECONDS"])
def test_stop_gives_a_group_that_ignores_term_its_whole_grace(clock: str, tmp_path: Path) -> None:
    """The grace period is a lower bound on both of the script's clocks. bash's SECONDS ticks on the wall clock's
    whole seconds: a script started at x.85 s with a deadline of SECONDS + ⌈1.5⌉ gave up at x + 2, after 1.15 s
    (what the SSH integration test saw as a 1.39 s stop)."""
    ready = tmp_path / "ready"
    victim = subprocess.Popen(["bash", "-c", f"trap '' TERM; touch {ready}; sleep 30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:  # its trap is set (a slow start: not yet)
            time.sleep(0.02)
        ticks = Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        h = AgentHandle(SPEC, {**IDENT, "pid": victim.pid, "pgid": victim.pid, "start_ticks": int(ticks)}, "ssh")
        script = ("unset EPOCHREALTIME\n" if clock == "SECONDS" else "") + backend().stop_script([h], grace_s=1.5)
        time.sleep((0.85 - time.time() % 1) % 1)  # late in a wall-clock second
        t0 = time.monotonic()
        out = subprocess.run(["bash", "-s"], input=script, text=True, capture_output=True, timeout=30).stdout
        waited = time.monotonic() - t0
    finally:
        victim.kill()
        victim.wait()
    assert out.split() == [str(victim.pid), "forced"], out
    assert 1.5 <= waited < 10, waited  # an upper bound only against a wait with no end (a loaded machine is slow)


def test_custom_paths_are_quoted(tmp_path: Path) -> None:
    spec = AgentSpec("rollout", 0, "h20", ["a b"], log_path=Path("/logs/with space.log"), cwd=Path("/w d"))
    text = backend().start_script(spec)
    assert "> '/logs/with space.log' 2>&1" in text and "cd '/w d'" in text and "'a b'" in text
    assert sh_path("~/x y") == "\"$HOME\"/'x y'" and sh_path("~") == '"$HOME"'


class FakeRunner:
    where = "fake"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.scripts: list[str] = []

    def run(self, command: str, *, timeout_s: float, stdin: str | None = None) -> CommandResult:
        self.scripts.append(stdin or command)
        return CommandResult(0, self.stdout, "")

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("stdout", "state", "code", "live"),
    [
        ("leader S 987654\nexit \ngroup 4242 4250 \n", RemoteState.RUNNING, None, [4242, 4250]),
        ("leader \nexit 0\ngroup \n", RemoteState.FINISHED, 0, []),
        ("leader \nexit 3\ngroup \n", RemoteState.FAILED, 3, []),
        ("leader \nexit \ngroup 4250 \n", RemoteState.FAILED, LOST, [4250]),  # leader SIGKILLed, child left
        ("leader Z 987654\nexit \ngroup \n", RemoteState.FAILED, LOST, []),  # zombie: dead
        # pid reused by an unrelated process (other start time): dead, and its group is not ours
        ("leader S 123\nexit \ngroup 4242 \n", RemoteState.FAILED, LOST, []),
    ],
)
def test_status_reads_poll_output(stdout: str, state: RemoteState, code: int | None, live: list[int]) -> None:
    b = backend()
    fake = FakeRunner(stdout)
    b._runners["h20-02"] = fake  # type: ignore[assignment]
    st = b.status(AgentHandle(SPEC, dict(IDENT), "ssh"))
    assert (st.state, st.exit_code, st.live_pids) == (state, code, live)
    assert fake.scripts == [b.poll_script(AgentHandle(SPEC, dict(IDENT), "ssh"))]


class DeadRunner(FakeRunner):
    def run(self, command: str, *, timeout_s: float, stdin: str | None = None) -> CommandResult:
        raise LaunchError("ssh rl@h20-01:2200: cannot connect: timed out")


def test_stop_reaches_every_host_and_names_the_dead_one() -> None:
    b = backend()
    alive = FakeRunner("4242 graceful\n")
    b._runners.update({"h20-01": DeadRunner(""), "h20-02": alive})  # type: ignore[dict-item]
    h1 = AgentHandle(SPEC, {**IDENT, "host": "h20-01"}, "ssh")
    h2 = AgentHandle(SPEC, dict(IDENT), "ssh")
    with pytest.raises(LaunchError, match="h20-01:2200: cannot connect"):
        b.stop([h1, h2], grace_s=3)
    assert alive.scripts == [b.stop_script([h2], 3)]
    assert h1.ident["stopped"] and h2.ident["stopped"]


def test_the_rendered_ssh_command_line_quotes_the_login_user() -> None:
    """A directory's user name (`CORP\\alice`) reached ssh unquoted: the shell ate its backslash."""
    site = SITE.model_copy(update={"scheduler": SITE.scheduler.model_copy(update={"user": "CORP\\alice"})})
    line = SshBackend("h20", site, job="demo").render(SPEC).splitlines()[0]
    assert " 'CORP\\alice@h20-02' bash -s <<'RLCTL_EOF'" in line, line
    assert subprocess.run(["bash", "-c", f"printf %s {line.split()[-4]}"], capture_output=True, text=True).stdout == (
        "CORP\\alice@h20-02"
    )


@pytest.mark.parametrize(
    ("spec", "user", "host", "port"),
    [
        ("bastion", None, "bastion", 22),
        ("rl@bastion:2222", "rl", "bastion", 2222),  # fabric refused a port given twice (ValueError)
        ("bastion.example:22", None, "bastion.example", 22),
        ("fe80::1", None, "fe80::1", 22),  # a bare IPv6 address has no port
        ("[::1]:2222", None, "::1", 2222),  # one with a port, as ssh -J writes it (refused, no way to write it)
        ("rl@[fd00::1]:2222", "rl", "fd00::1", 2222),
        ("rl@[fd00::1]", "rl", "fd00::1", 22),
    ],
)
def test_a_proxy_jump_is_read_as_ssh_j_reads_it(spec: str, user: str | None, host: str, port: int) -> None:
    t = jump_target(spec, known_hosts=None)
    assert (t.user, t.host, t.port) == (user, host, port)


def test_a_rendered_command_line_reaches_the_bastion_with_the_sites_host_key_file() -> None:
    """`ssh -J` applies the options given to the target only: the bastion was checked against ~/.ssh/known_hosts,
    where rlctl's own connection checks it against the site's file (run through a real bastion, the old line said
    'Host key verification failed'). Now the jump is a ProxyCommand that carries the same host-key options."""
    sched = SITE.scheduler.model_copy(update={"proxy_jump": "ops@bastion:2022", "known_hosts": "/etc/rl/kh"})
    site = SITE.model_copy(update={"scheduler": sched})
    line = SshBackend.for_site("h20", site, job="demo", job_dir=Path("/tmp")).render(SPEC).splitlines()[0]
    args = line.removesuffix(" bash -s <<'RLCTL_EOF'")
    argv = subprocess.run(["bash", "-c", f"printf '%s\\n' {args}"], capture_output=True, text=True).stdout.splitlines()
    keys = ["-o", "UserKnownHostsFile=/etc/rl/kh", "-o", "StrictHostKeyChecking=yes"]
    assert "-J" not in argv and argv[-5:] == [*keys, "rl@h20-02"], argv
    own = " ".join(f'-o IdentityFile="$HOME"/.ssh/{k}' for k in ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519"))
    jump = (
        f'ssh -p 2022 -i "$HOME"/.ssh/id_rl -o IdentitiesOnly=yes {own} -o IdentityFile="$HOME"/.ssh/id_ed25519_sk '
        "-o UserKnownHostsFile=/etc/rl/kh -o StrictHostKeyChecking=yes -W '[%h]:%p' ops@bastion"
    )
    assert next(a for a in argv if a.startswith("ProxyCommand=")) == f"ProxyCommand={jump}", argv


def test_a_rendered_jump_through_an_ipv6_bastion_with_a_port_gives_ssh_its_address_and_port() -> None:
    """`proxy_jump: ops@[fd00::9]:2022` was refused by the inventory ('not a host name or address'): an IPv6 bastion
    could not be given a port."""
    sched = SITE.scheduler.model_copy(update={"proxy_jump": "ops@[fd00::9]:2022"})
    site = SITE.model_copy(update={"scheduler": sched})
    line = SshBackend.for_site("h20", site, job="demo", job_dir=Path("/tmp")).render(SPEC).splitlines()[0]
    args = line.removesuffix(" bash -s <<'RLCTL_EOF'")
    argv = subprocess.run(["bash", "-c", f"printf '%s\\n' {args}"], capture_output=True, text=True).stdout.splitlines()
    proxy = next(a for a in argv if a.startswith("ProxyCommand=")).removeprefix("ProxyCommand=")
    assert proxy.startswith("ssh -p 2022 ") and proxy.endswith(" -W '[%h]:%p' ops@fd00::9"), proxy


def test_a_rendered_jump_to_an_ipv6_node_names_it_as_ssh_reads_it() -> None:
    """Before: `-W %h:%p` became `-W fd00::2:2200` for a node at an IPv6 address, which ssh refuses ('Bad stdio
    forwarding specification'); ssh -J, and now the ProxyCommand, write `[%h]:%p`."""
    sched = SITE.scheduler.model_copy(update={"proxy_jump": "bastion"})
    site = SITE.model_copy(update={"scheduler": sched})
    line = SshBackend.for_site("h20", site, job="demo", job_dir=Path("/tmp")).command_line("fd00::2", "true\n")
    args = line.splitlines()[0].removesuffix(" bash -s <<'RLCTL_EOF'")
    argv = subprocess.run(["bash", "-c", f"printf '%s\\n' {args}"], capture_output=True, text=True).stdout.splitlines()
    proxy = next(a for a in argv if a.startswith("ProxyCommand=")).removeprefix("ProxyCommand=")
    via = subprocess.run(["bash", "-c", f"printf '%s\\n' {proxy}"], capture_output=True, text=True).stdout.split()
    assert via[via.index("-W") + 1] == "[%h]:%p", via  # ssh puts the node's address in the brackets


def _outer_expansion(text: str, host: str, port: int) -> str:
    """What ssh does to a ProxyCommand before it runs it: %h, %p and %% expanded (ssh's percent_expand)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "%":
            out.append({"%": "%", "h": host, "p": str(port)}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client (ssh -G)")
def test_a_percent_in_a_rendered_path_or_user_reaches_ssh_literally() -> None:
    """ssh expands %-tokens in ProxyCommand, IdentityFile and UserKnownHostsFile: a host-key file `/etc/rl/kh%h` was
    read as `/etc/rl/kh` + the host's name, and a jump user `ops%h` as `ops` + the node's name. ssh -G says how ssh
    reads the rendered line (the outer expansion of the ProxyCommand done as ssh does it)."""
    sched = SITE.scheduler.model_copy(
        update={"proxy_jump": "ops%h@bastion:2022", "known_hosts": "/etc/rl/kh%h", "key_file": "/keys/50%off"}
    )
    site = SITE.model_copy(update={"scheduler": sched})
    line = SshBackend.for_site("h20", site, job="demo", job_dir=Path("/tmp")).command_line("h20-02", "true\n")
    args = line.splitlines()[0].removesuffix(" bash -s <<'RLCTL_EOF'")
    argv = subprocess.run(["bash", "-c", f"printf '%s\\n' {args}"], capture_output=True, text=True).stdout.splitlines()
    assert "-o" in argv and "IdentityFile=/keys/50%%off" in argv  # not -i, which looks for `/keys/50%%off` itself

    def config(argv: list[str]) -> dict[str, str]:
        # -F /dev/null: the rendered line alone, not the machine's ~/.ssh/config or /etc/ssh/ssh_config (a `Host
        # bastion` block's HostName, a CanonicalizeHostname there, changed what ssh -G said of the jump)
        args = [*argv[:1], "-G", "-F", "/dev/null", *argv[1:]]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        said: dict[str, str] = {}
        for line in out.splitlines():  # a key's first value (identityfile: the first file ssh tries)
            said.setdefault(*line.partition(" ")[::2])
        return said

    outer = config(argv)
    assert outer["userknownhostsfile"] == "/etc/rl/kh%h" and outer["user"] == "rl"
    proxy = next(a for a in argv if a.startswith("ProxyCommand=")).removeprefix("ProxyCommand=")
    via = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {_outer_expansion(proxy, 'h20-02', 2200)}"], capture_output=True, text=True
    ).stdout.splitlines()
    inner = config([a for a in via if a not in ("-W", "[h20-02]:2200")])
    assert (inner["user"], inner["hostname"], inner["port"]) == ("ops%h", "bastion", "2022")
    assert inner["userknownhostsfile"] == "/etc/rl/kh%h"
    assert inner["identityfile"] == outer["identityfile"] == "/keys/50%%off"  # ssh -G: before its %-expansion


def test_the_bastion_is_logged_in_to_with_the_sites_key_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A site's key_file is the identity for its bastion too, on rlctl's own connections (the jump's fabric
    Connection) and the rendered command line (the ProxyCommand's ssh; `ssh -J` would not pass `-i` on). Before,
    the bastion was offered the user's default keys and agent only: one that knows only the site's key refused."""
    import fabric

    from rlctl.launch.remote import SshTarget, connect

    made: list[dict[str, object]] = []

    class Conn:  # fabric's Connection, recording what it was asked to connect with; it connects nowhere
        def __init__(self, host: str, **kw: object) -> None:
            import paramiko

            made.append({"host": host, **kw})
            self.client = paramiko.SSHClient()

        def open(self) -> None:
            pass

    monkeypatch.setattr(fabric, "Connection", Conn)
    connect(SshTarget("h20-02", user="rl", key_file="/keys/id_rl", proxy_jump="ops@bastion:2022"))
    assert [c["host"] for c in made] == ["bastion", "h20-02"]
    jump_kw, node_kw = made[0]["connect_kwargs"], made[1]["connect_kwargs"]
    assert jump_kw["key_filename"] == node_kw["key_filename"] == "/keys/id_rl", (jump_kw, node_kw)  # type: ignore[index]
    # the bastion: the site's key first, then the user's own keys and agent, as `ssh -i` offers them; a node: the key
    assert (jump_kw["look_for_keys"], jump_kw["allow_agent"]) == (True, True), jump_kw  # type: ignore[index]
    assert (node_kw["look_for_keys"], node_kw["allow_agent"]) == (False, False), node_kw  # type: ignore[index]

    sched = SITE.scheduler.model_copy(update={"proxy_jump": "ops@bastion", "key_file": "/keys/id_rl"})
    line = SshBackend.for_site("h20", SITE.model_copy(update={"scheduler": sched}), job="d", job_dir=Path("/tmp"))
    args = line.command_line("h20-02", "true\n").splitlines()[0].removesuffix(" bash -s <<'RLCTL_EOF'")
    argv = subprocess.run(["bash", "-c", f"printf '%s\\n' {args}"], capture_output=True, text=True).stdout.splitlines()
    proxy = next(a for a in argv if a.startswith("ProxyCommand=")).removeprefix("ProxyCommand=")
    via = subprocess.run(["bash", "-c", f"printf '%s\\n' {proxy}"], capture_output=True, text=True).stdout.split()
    assert via[via.index("-i") + 1] == "/keys/id_rl", via


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's client (ssh -G)")
def test_a_rendered_key_file_is_the_only_identity_offered_so_an_agents_keys_do_not_end_the_login(
    tmp_path: Path,
) -> None:
    """`ssh -i KEY` offers every key of the user's ssh-agent before KEY's (OpenSSH's order), and a server that
    allows MaxAuthTries (6) closes the connection after that many ('Too many authentication failures'): an agent of
    six keys kept the site's key from ever being tried. Now the node's ssh and the bastion's offer the key files
    alone (IdentitiesOnly): the site's key, and at the bastion the user's default key files after it."""
    key = tmp_path / "id_rl"  # ssh -i leaves out a file that is not there, and offers its default ones instead
    key.write_text("")
    sched = SITE.scheduler.model_copy(update={"proxy_jump": "ops@bastion:2022", "key_file": str(key)})
    site = SITE.model_copy(update={"scheduler": sched})
    line = SshBackend.for_site("h20", site, job="demo", job_dir=Path("/tmp")).command_line("h20-02", "true\n")
    args = line.splitlines()[0].removesuffix(" bash -s <<'RLCTL_EOF'")
    argv = subprocess.run(["bash", "-c", f"printf '%s\\n' {args}"], capture_output=True, text=True).stdout.splitlines()

    def config(argv: list[str]) -> list[tuple[str, str]]:  # ssh -G's lines, as (key, value), of the line alone
        args = [*argv[:1], "-G", "-F", "/dev/null", *argv[1:]]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        return [(k, v) for k, _, v in (line.partition(" ") for line in out.splitlines())]

    outer = config(argv)
    assert ("identitiesonly", "yes") in outer and [v for k, v in outer if k == "identityfile"] == [str(key)], outer
    proxy = next(a for a in argv if a.startswith("ProxyCommand=")).removeprefix("ProxyCommand=")
    via = subprocess.run(
        ["bash", "-c", f"printf '%s\\n' {_outer_expansion(proxy, 'h20-02', 2200)}"], capture_output=True, text=True
    ).stdout.splitlines()
    inner = config([a for a in via if a not in ("-W", "[h20-02]:2200")])
    home = os.environ["HOME"]
    own = [f"{home}/.ssh/{name}" for name in ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk")]
    assert ("identitiesonly", "yes") in inner
    assert [v for k, v in inner if k == "identityfile"] == [str(key), *own], inner


def test_a_key_file_under_a_home_that_is_not_there_is_refused_naming_the_field() -> None:
    # an inventory's `key_file: ~nosuchuser/id_rl` ended in a RuntimeError traceback, exit 1 (Path.expanduser's
    # 'Could not determine home directory'), versus one line naming the field
    from rlctl.errors import UsageError
    from rlctl.launch.remote import SshTarget, connect

    with pytest.raises(UsageError, match=r"^key_file ~rlctl-no-such-user/id_rl: ~rlctl-no-such-user is no home"):
        connect(SshTarget("h20-02", user="rl", key_file="~rlctl-no-such-user/id_rl"))


def test_a_local_directory_under_a_home_that_is_not_there_is_refused() -> None:
    from rlctl.errors import UsageError
    from rlctl.launch.sitefs import LocalFiles

    with pytest.raises(UsageError, match=r"^directory ~rlctl-no-such-user/w: ~rlctl-no-such-user is no home"):
        LocalFiles().make_dirs(["~rlctl-no-such-user/w"])
    assert LocalFiles().list_files("/nonexistent-rlctl-dir") == []


@pytest.mark.parametrize(
    ("host", "user", "port", "said"),
    [
        ("fd00::9", "rl", 2022, "rl@[fd00::9]:2022"),
        ("::1", None, 22, "[::1]:22"),
        ("fe80::1%eth0", "rl", 22, "rl@[fe80::1%eth0]:22"),
        ("h20-01", "rl", 2200, "rl@h20-01:2200"),
        ("10.0.0.1", None, 22, "10.0.0.1:22"),
    ],
)
def test_a_connection_that_fails_names_an_ipv6_host_in_brackets_as_ssh_does(
    monkeypatch: pytest.MonkeyPatch, host: str, user: str | None, port: int, said: str
) -> None:
    """Before: `ssh rl@fd00::9:2022: cannot connect`, whose port reads as the address's last group (fd00::9:2022 is
    an address of its own); now `ssh rl@[fd00::9]:2022: …`, as ssh writes a host and port."""
    import fabric

    from rlctl.launch.remote import SshTarget, connect

    class Conn:  # fabric's Connection, refused at its open
        def __init__(self, host: str, **kw: object) -> None:
            import paramiko

            self.client = paramiko.SSHClient()

        def open(self) -> None:
            raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(fabric, "Connection", Conn)
    with pytest.raises(LaunchError) as refused:
        connect(SshTarget(host, user=user, port=port))
    assert str(refused.value) == f"ssh {said}: cannot connect: [Errno 111] Connection refused"
