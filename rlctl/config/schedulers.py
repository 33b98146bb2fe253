"""A site's scheduler (`scheduler: {kind: local | slurm | ssh, ...}`), told apart by `kind`, and the checks of
the work roots, key files and login names it gives (some not held against a job's record, `inventory.RECORDED`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from rlctl.config.base import Strict, is_recorded, register_tags
from rlctl.config.hosts import host_problem, jump_host_parts
from rlctl.textutil import home_expanded

WORKDIR_HELP = (
    "work root on the site: a job's files there are <workdir>/jobs/<job id>/ (staged by `launch`, logs, "
    "checkpoints); default: ssh and a SLURM submit_host ~/.rlctl, local and SLURM submitted from here the "
    "operator's job directory itself"
)


def _work_root(v: str | None) -> str | None:
    """Only `~` and `~/…` are the site user's home: remote shells get the path quoted (`sh_path`), so `~alice/w`
    was made as a directory named `~alice` in the home of the user rlctl logs in as."""
    if v is not None and v.startswith("~") and v != "~" and not v.startswith("~/"):
        raise ValueError(
            f"{v!r}: only a leading '~/' is expanded (the home of the user rlctl logs in as); give another user's "
            "directory as an absolute path, e.g. /home/alice/rlctl"
        )
    return v


WorkRoot = Annotated[str | None, AfterValidator(_work_root)]


def _this_machine_path(v: str | None, info: ValidationInfo) -> str | None:
    """A file rlctl reads here (an SSH key, a known-hosts file): absolute or under `~`. A relative one was read from
    the directory rlctl ran in, not the inventory's: found from one directory, 'No such file' from another. Under the
    home of a user this machine does not have (`home_expanded`): refused here, where only the connection did (a job's
    own record reads back as launched: its stop, status and pull connect to the site with it)."""
    if v is not None and not v.startswith(("/", "~")):
        raise ValueError(
            f"{v!r}: give an absolute path or one under ~ (a relative path was read from the directory rlctl runs in)"
        )
    if v is not None and not is_recorded(info):
        try:
            home_expanded(v)
        except ValueError as e:
            raise ValueError(f"{v!r}: {e}; give the file as ~/… or in full") from e
    return v


HerePath = Annotated[str | None, AfterValidator(_this_machine_path)]


def _private_key(v: str | None) -> str | None:
    """The key rlctl logs in with: its private half. fabric loads the file as a private key, and with a key file
    given offers no agent's keys (`remote.connect`), so a `.pub` (which `ssh -i` pairs with an agent's key) was
    only 'Authentication failed' at launch."""
    if v is not None and v.endswith(".pub"):
        raise ValueError(
            f"{v!r} is the public half of a key pair; give the private key file ({v.removesuffix('.pub')!r}), as "
            "ssh -i takes it"
        )
    return v


KeyPath = Annotated[str | None, AfterValidator(_this_machine_path), AfterValidator(_private_key)]


def _here_relative(v: str | None, runs: str, info: ValidationInfo, *, named: str = "") -> None:
    """A work root on this machine's filesystem (a local site's; a SLURM site's submitted from here) given as a
    relative path: it was read from the directory rlctl ran in, so a job launched from one directory and resumed
    or stopped from another looked for its files elsewhere. Not in a job's record (`RECORDED`): one launched by an
    rlctl that took it reads as launched, else no command could stop it."""
    if v is not None and not v.startswith(("/", "~")) and not is_recorded(info):
        raise ValueError(
            f"{named}{v!r}: give an absolute path or one under ~ ({runs}, and a relative path was read from the "
            "directory rlctl runs in)"
        )


class _Scheduler(Strict):
    """Base of the scheduler kinds: what every kind refuses alike."""

    @model_validator(mode="before")
    @classmethod
    def _python_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "python" in data:
            raise ValueError("python is the site's, for every scheduler: move it up to sites.<site>.python")
        return data


class LocalScheduler(_Scheduler):
    kind: Literal["local"]
    workdir: WorkRoot = Field(None, min_length=1, description=WORKDIR_HELP)

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str | None, info: ValidationInfo) -> str | None:
        _here_relative(v, "the site is this machine", info)
        return v


def _login_name(v: str | None) -> str | None:
    """The user rlctl logs in as over SSH: a name with no whitespace (as proxy_jump's user is checked), not starting
    with '-' (no login name does): `launch --dry-run`'s ssh line read `-oProxyCommand=x@h20-01` as an option."""
    if v is not None and (not v or any(c.isspace() for c in v)):
        raise ValueError(f"user {v!r} is empty or has whitespace; give the login name alone, e.g. rl")
    # refused in a job's record (`RECORDED`) too, unlike the figures' bounds: `rlctl stop`, status and pull run ssh
    # with the recorded user, where `-oProxyCommand=x` is an option that runs x, not a login name
    if v is not None and v.startswith("-"):
        raise ValueError(f"user {v!r} starts with '-', as no login name does (ssh reads it as an option); e.g. rl")
    return v


LoginName = Annotated[str | None, AfterValidator(_login_name)]


SUBMIT_SSH = ("ssh_user", "ssh_port", "ssh_key_file", "ssh_known_hosts")  # how a SLURM site's submit_host is reached


MAX_TIME_LIMIT_MIN = 366 * 24 * 60  # past any partition's MaxTime: more is a typo (2880000 for 2880)

_AGENT = "rlctl sets it for each agent's job"
_RESOURCES = "rlctl asks it from each agent's resources (the job's placement and threads, the site's nodes)"
_ONE_JOB = "rlctl submits one job per agent and follows it itself"
# sbatch's long options that rlctl writes itself, or that the site has a field for, or that break how rlctl submits
# and follows a job: `sbatch_options` naming one (or an abbreviation, which sbatch takes for it) is refused, with what
# to do instead
SBATCH_OWN = {
    "partition": "use scheduler.partition",
    "account": "use scheduler.account",
    "qos": "use scheduler.qos",
    "time": "use scheduler.time_limit_min",
    "constraint": "use scheduler.constraint",
    "reservation": "use scheduler.reservation",
    "exclusive": "use scheduler.exclusive: true",
    "distribution": "rlctl puts each tensor-parallel group on one node by SLURM's default (block): leave it out",
    **dict.fromkeys(("gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "gres"), "use scheduler.gpu_request"),
    **dict.fromkeys(
        (
            "nodes",
            "ntasks",
            "ntasks-per-node",
            "ntasks-per-core",
            "ntasks-per-socket",
            "ntasks-per-gpu",
            "cpus-per-task",
            "cpus-per-gpu",
            "mem",
            "mem-per-cpu",
            "mem-per-gpu",
            "tres-per-task",
        ),
        _RESOURCES + ": leave it out",
    ),
    **dict.fromkeys(
        ("job-name", "output", "error", "open-mode", "chdir", "signal", "export", "export-file"),
        _AGENT + ": leave it out",
    ),
    **dict.fromkeys(
        ("array", "wrap", "dependency", "parsable", "wait", "test-only", "hold"), _ONE_JOB + ": leave it out"
    ),
}
LONG_OPTION = re.compile(r"[a-z][a-z0-9-]*")


def sbatch_option_problem(name: str, value: str | bool, *, own: bool = True) -> str | None:
    """Why `sbatch_options` may not pass `--name=value` (None: it may): a name that is no long option as sbatch spells
    them, one rlctl sets itself or that the site has a field for (or an abbreviation of one: sbatch takes `--part`
    for `--partition`; not looked for where `own` is false), a value with a line break (it would end the `#SBATCH`
    line)."""
    if not LONG_OPTION.fullmatch(name):
        plain = name.lstrip("-").lower().replace("_", "-")
        e_g = repr(plain) if LONG_OPTION.fullmatch(plain) else "'mail-type'"
        return (
            f"{name!r} is no long option as sbatch spells them (lower-case letters, digits and '-', without the "
            f"leading --), e.g. {e_g}"
        )
    taken = sorted(o for o in SBATCH_OWN if o.startswith(name)) if own else []
    if taken:
        said = f"--{name}" if name in SBATCH_OWN else f"--{name} (sbatch's abbreviation of --{taken[0]})"
        return f"{said} is not taken in sbatch_options: {SBATCH_OWN[name if name in SBATCH_OWN else taken[0]]}"
    if isinstance(value, str) and any(c in value for c in "\n\r\0"):
        return f"--{name}: its value {value!r} has a line break; give it on one line"
    return None


class SlurmScheduler(_Scheduler):
    kind: Literal["slurm"]
    partition: str = Field(min_length=1)
    account: str | None = Field(None, min_length=1)  # '' left --account out: the user's default account was charged
    qos: str | None = Field(None, min_length=1)
    submit_host: str | None = Field(None, description="login node reached over SSH; None = run sbatch here")
    ssh_user: LoginName = None
    ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22  # as the ssh scheduler's port: 70000 reached fabric
    ssh_key_file: KeyPath = None
    ssh_known_hosts: HerePath = Field(
        None, description="known_hosts file for the submit host (default ~/.ssh/known_hosts)"
    )
    slurm_conf: str | None = Field(None, description="SLURM_CONF for the client tools, if not the default")
    workdir: WorkRoot = Field(None, min_length=1, description=WORKDIR_HELP)
    time_limit_min: Annotated[int, Field(gt=0, le=MAX_TIME_LIMIT_MIN)] = Field(
        7 * 24 * 60, description=f"every sbatch's --time, minutes; at most {MAX_TIME_LIMIT_MIN} (a year)"
    )
    gpu_request: Literal["auto", "per_task", "gres", "none"] = Field(
        "auto",
        description="how jobs ask for GPUs: per_task = --gpus-per-task=N, gres = --gres=gpu:N per node "
        "(clusters without select/cons_tres), none = no GPU request; auto = per_task unless the site's gpu is CPU",
    )
    constraint: str | None = Field(
        None, min_length=1, description="every job's --constraint: the node features it needs, e.g. 'h800&ib'"
    )
    reservation: str | None = Field(None, min_length=1, description="every job's --reservation")
    exclusive: bool = Field(False, description="every job's --exclusive: its nodes to itself, no other job's beside")
    sbatch_options: dict[str, str | Literal[True]] = Field(
        default_factory=dict,
        description="more of sbatch's long options for every job, {name: value} (true: a flag), as --name=value; "
        "not those rlctl sets or the site has a field for",
    )

    @field_validator("partition", mode="before")
    @classmethod
    def _partitions_as_sbatch_takes_them(cls, v: Any) -> Any:
        if isinstance(v, list) and v and all(isinstance(p, str) for p in v):
            joined = ",".join(v)
            raise ValueError(f"{v!r} is a list; several partitions are one string, as sbatch takes them: {joined!r}")
        return v

    @field_validator("partition", "account", "qos", "constraint", "reservation")
    @classmethod
    def _slurm_name(cls, v: str | None, info: ValidationInfo) -> str | None:
        """sbatch gets it quoted as one word: a space in it (`'gpu '`, `'high normal'`) was sbatch's 'invalid
        partition specified' (account, qos) at launch, after staging."""
        if v is not None and any(c.isspace() for c in v):
            several = {"partition": "several partitions are one 'a,b'", "constraint": "features join as 'a&b'"}
            raise ValueError(
                f"{v!r} has whitespace, which no SLURM name has; {several.get(info.field_name or '', 'give one name')}"
            )
        return v

    @field_validator("sbatch_options", mode="before")
    @classmethod
    def _sbatch_options(cls, v: Any, info: ValidationInfo) -> Any:
        """Each `--name=value` reaches every sbatch script (and the probe's srun): names rlctl writes itself (or has a
        field for) would be given twice, the later one winning in sbatch and submitit's script alike; a line break
        in a value would end the `#SBATCH` line. A whole number is its digits (`nice: 10`)."""
        if not isinstance(v, dict):
            return v
        out: dict[Any, Any] = {}
        for name, value in v.items():
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if value is False or value is None or value == "":
                raise ValueError(
                    f"--{name}: {value!r}: give its value, or true for a flag (--{name} alone); leave the option out "
                    "to not pass it"
                )
            # a job's record (`RECORDED`) reads back as launched, past names refused since
            own = not is_recorded(info)
            if (
                isinstance(name, str)
                and isinstance(value, str | bool)
                and (why := sbatch_option_problem(name, value, own=own))
            ):
                raise ValueError(why)
            out[name] = value
        return out

    @field_validator("slurm_conf")
    @classmethod
    def _slurm_conf_as_the_tools_read_it(cls, v: str | None, info: ValidationInfo) -> str | None:
        """SLURM_CONF reaches the client tools as written (this process's environment, or a quoted `export` on the
        submit host): a leading `~` is no home there, and sbatch, squeue, sinfo all failed on a file that is there;
        `''` was no SLURM_CONF at all, the cluster's default silently. Not in a job's record (`RECORDED`)."""
        if v is None or is_recorded(info):
            return v
        if not v:
            raise ValueError("empty; give the slurm.conf's path, or leave slurm_conf out (the cluster's default)")
        if v.startswith("~"):
            raise ValueError(
                f"{v!r}: a leading ~ is not expanded (SLURM_CONF reaches sbatch and the other tools as written): give "
                "an absolute path, e.g. /etc/slurm/slurm.conf"
            )
        return v

    @field_validator("submit_host")
    @classmethod
    def _submit_host_name(cls, v: str | None) -> str | None:
        if v is not None and (why := host_problem(v)) is not None:  # fabric refused user@ or :port beside ssh_*
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _ssh_needs_submit_host(self, info: ValidationInfo) -> SlurmScheduler:
        given = [name for name in SUBMIT_SSH if getattr(self, name) != type(self).model_fields[name].default]
        if given and self.submit_host is None:
            raise ValueError(
                f"{', '.join(given)}: read only to reach submit_host (sbatch over SSH), which is not set: set "
                "submit_host, or remove them (sbatch runs here)"
            )
        if self.submit_host is None:
            _here_relative(self.workdir, "sbatch runs here", info, named="workdir ")  # a model's check: name the field
            conf = self.slurm_conf
            if conf is not None and not conf.startswith("/") and not is_recorded(info):
                raise ValueError(
                    f"slurm_conf {conf!r}: give an absolute path (sbatch runs here, and a relative path was read from "
                    "the directory rlctl runs in)"
                )
        return self


class SshScheduler(_Scheduler):
    kind: Literal["ssh"]
    user: LoginName = None
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    key_file: KeyPath = None
    proxy_jump: str | None = None
    known_hosts: HerePath = Field(
        None, description="known_hosts file trusted for these hosts (default ~/.ssh/known_hosts)"
    )
    workdir: Annotated[str, AfterValidator(_work_root)] = Field("~/.rlctl", min_length=1, description=WORKDIR_HELP)
    shared_workdir: bool = Field(
        False,
        description="the site's hosts see one filesystem at workdir (e.g. NFS inside the datacenter): the job is "
        "staged once, through the first host, instead of once per host",
    )

    @field_validator("proxy_jump")
    @classmethod
    def _one_jump_host(cls, v: str | None) -> str | None:
        """`[user@]host[:port]`, as `remote.jump_target` reads it: one hop (it took `a,b` for one host's name)."""
        if v is None:
            return v
        at = "@" in v
        why = "several jump hosts; rlctl connects through one" if "," in v else None
        if why is None and "://" in v:  # ssh -J takes one; ours took `ssh://rl` for the bastion's user
            why = f"{v!r} is a URI"
        user, host, port = "", "", None
        if why is None:
            try:
                user, host, port = jump_host_parts(v)
            except ValueError as e:
                why = str(e)
        if why is None and at and (not user or any(c.isspace() for c in user)):
            why = f"user {user!r} is empty or has a space"
        if why is None and user.startswith("-"):  # in a job's record too (`_login_name`): stop would run ssh with it
            why = f"user {user!r} starts with '-', as no login name does (ssh reads it as an option)"
        if why is None and host_problem(host) is not None:
            why = f"{host!r} is not a host name or address"
        if why is None and port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
            why = f"port {port!r} is not 1-65535"
        if why is not None:
            raise ValueError(f"{why}; give one jump host as [user@]host[:port], e.g. rl@bastion.example.com:2222")
        return v


Scheduler = Annotated[LocalScheduler | SlurmScheduler | SshScheduler, Field(discriminator="kind")]
register_tags("scheduler", Scheduler)
