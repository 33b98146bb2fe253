"""The one error tree of rlctl; the CLI maps each branch to an exit code.

    RlctlError                      exit 1  runtime failure
    ├── ConfigError                 exit 2  bad inventory / job / profile file (names file + field)
    │   ├── JobProblems                     every reason a job cannot run (`check --reach`): one line each
    │   └── SiteProblem                     one of them that a site (or one of its hosts) has: names both
    ├── UsageError                  exit 2  bad command-line usage
    ├── PartialFailure              exit 3  some sites / agents failed, the rest answered
    ├── PlanError                   exit 1  no feasible allocation for the job
    ├── LaunchError                 exit 1  a backend could not start or stop agents
    │   └── CommandTimeout                  a command on a host ran past its deadline (the host was reached)
    ├── CheckpointError             exit 1  a checkpoint part that cannot be used (missing, damaged) or written
    ├── Stopped                     exit 1  `rlctl stop` ended a run while its launcher started it, or killed
    │                                       its controller past the grace (no summary)
    └── TransportError              exit 1  anything on the wire
        ├── PeerUnreachable                 connect refused / no route
        ├── PeerTimeout                     connect or read deadline passed
        ├── AuthError                       HMAC challenge failed: peer refused before any payload
        │   └── CredentialsRefused (Refused)    the peer's verdict: this side lacks the job's secret
        ├── ProtocolError                   malformed frame, size bound exceeded, checksum mismatch,
        │                                   a header that does not fit its message kind
        └── Refused                         a refusal no retry changes (credentials, a format or size the
                                            peer or this side will never accept): not a fault that passes

Each interface translates foreign exceptions (OSError, yaml, pydantic, subprocess) into this tree
in one place, so callers catch `RlctlError` and nothing else.
"""

from __future__ import annotations


class RlctlError(Exception):
    """Base of every error rlctl raises on purpose."""

    exit_code = 1
    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class ConfigError(RlctlError):
    """An input file is missing, malformed or invalid. The message names file and field."""

    exit_code = 2

    def __init__(self, file: str, field: str | None, message: str, *, hint: str | None = None) -> None:
        self.file = file
        self.field = field
        self.detail = message  # what is wrong, without the file and field
        where = f"{file}: {field}: " if field else f"{file}: "
        super().__init__(where + message, hint=hint)


class JobProblems(ConfigError):
    """Several things stop a job (what its file asks for, and what its sites' hosts lack): one line each."""

    def __init__(self, file: str, lines: list[str], *, each: list[ConfigError] | None = None) -> None:
        super().__init__(file, None, f"{len(lines)} problem(s)")
        self.lines = lines
        # each line's file, field and what is wrong (`check -o json`); a line said whole where none is given
        self.each = each if each is not None else [ConfigError(file, None, line) for line in lines]


class SiteProblem(ConfigError):
    """What a site, or its `host` (None: the site as a whole), lacks or refuses (`check --reach`): its inventory file
    and field (`sites.<site>`, or one inside it), and the site and host named apart for `check -o json`."""

    def __init__(
        self, file: str, field: str, message: str, *, site: str, host: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(file, field, message, hint=hint)
        self.site, self.host = site, host


class UsageError(RlctlError):
    exit_code = 2


class PartialFailure(RlctlError):
    """Some parts answered and some did not; the partial result is still printed."""

    exit_code = 3


class PlanError(RlctlError):
    pass


class LaunchError(RlctlError):
    pass


class CommandTimeout(LaunchError):
    """A command a runner started on a host (here, over SSH) did not finish within its deadline: the host was
    reached and ran it, unlike a connection that failed (a SLURM probe's `srun` whose step waited for a node).
    `stdout`, `stderr`: what the command printed before it was ended (srun's 'job N queued and waiting for
    resources' or 'has been allocated resources'; a probe's first lines): what it had got to."""

    def __init__(self, message: str, *, stdout: str = "", stderr: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.stdout, self.stderr = stdout, stderr


class CheckpointError(RlctlError):
    """A checkpoint that cannot be used: missing, incomplete or damaged (names the checkpoint and why).
    `full_dir`: a write that failed because the disk there is full (a resume would fail the same way until space
    is freed)."""

    def __init__(self, message: str, *, hint: str | None = None, full_dir: str = "") -> None:
        super().__init__(message, hint=hint)
        self.full_dir = full_dir


class Stopped(RlctlError):
    """The operator stopped the job (`rlctl stop`) while its launcher was starting a run, or killed its controller
    past the stop's grace (it left no summary): nothing of the run runs."""


class TransportError(RlctlError):
    pass


class PeerUnreachable(TransportError):
    pass


class PeerClosed(PeerUnreachable):
    """The peer's end of the stream closed in order: every byte written to it before then has arrived (not a
    reset, a timeout or a broken send)."""


class PeerTimeout(TransportError):
    pass


class AuthError(TransportError):
    pass


class ProtocolError(TransportError):
    pass


class Refused(TransportError):
    """A refusal that retrying cannot change: the same request meets it again (a peer may still be restarting or
    behind after any other TransportError)."""


class CredentialsRefused(AuthError, Refused):
    """The peer checked this side's proof of the job's secret and said no: this side holds another secret."""
