"""The `rlctl` command: a typer app, one module per command, and the error → exit-code mapping.

Exit codes: 0 ok, 1 runtime error, 2 usage or config error, 3 partial failure (see rlctl.errors).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import sys
from collections.abc import Callable
from typing import Annotated, NoReturn

import typer

from rlctl.commands import (
    attach,
    check,
    completion,
    launch,
    logs,
    plan,
    profile,
    pull,
    report,
    scale,
    status,
    stop,
    version,
)
from rlctl.errors import JobProblems, RlctlError
from rlctl.launch import hostkeys
from rlctl.render import ClosedStdout
from rlctl.textutil import one_line

app = typer.Typer(
    name="rlctl",
    help="Plan, launch and operate disaggregated RL post-training across GPU clusters and datacenters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False}


def _print_version(asked: bool) -> None:
    """`rlctl --version`: what `rlctl version` prints, then exit (before any command is parsed)."""
    if asked:
        import platform

        from rlctl import __version__
        from rlctl.buildid import code_digest
        from rlctl.render import write_out

        # as `rlctl version` says it: a full disk too
        write_out(f"rlctl {__version__} (code {code_digest()}, python {platform.python_version()})")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks and debug logs")] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the rlctl version and exit"),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="info logs on stderr")] = False,
    insecure_host_keys: Annotated[
        bool,
        typer.Option(
            "--insecure-host-keys",
            help="accept any SSH host key (throwaway test setups only; each connection logs a warning), the same as "
            f"{hostkeys.ENV}=off; default: only keys of the site's known_hosts",
        ),
    ] = False,
) -> None:
    _state["debug"] = debug
    if insecure_host_keys:  # the environment carries it to every process this command starts here
        ctx.call_on_close(_restore_env(hostkeys.ENV))  # and no further: a caller in this process keeps its policy
        os.environ[hostkeys.ENV] = "off"
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    if debug or ctx.invoked_subcommand in TIMESTAMPED:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(SaidFormatter())
    logging.basicConfig(level=level, handlers=[handler])
    # paramiko's transport thread logs what rlctl reports itself in one line (a host that never sends its
    # banner, a connection given up at a deadline), and at a time of its own: shown with -v / --debug only
    logging.getLogger("paramiko").setLevel(level if level < logging.WARNING else logging.CRITICAL)


# commands that follow a job for as long as it runs (a detached launcher's log file too): each line says its time and
# logger; the others (check, plan, profile, status, …) answer at once, and say a warning as they say an error
TIMESTAMPED = {"launch", "attach"}


class SaidFormatter(logging.Formatter):
    """A log line as the CLI says its errors: `rlctl: warning: …`, versus `2026-12-07 04:23:45,039 WARNING
    rlctl.ops.preflight.data: …` beside `rlctl: error: …` lines."""

    def format(self, record: logging.LogRecord) -> str:
        return f"rlctl: {record.levelname.lower()}: {super().format(record)}"


def _restore_env(name: str) -> Callable[[], None]:
    """What puts environment variable `name` back as it is now (set to its value, or unset)."""
    before = os.environ.get(name)

    def restore() -> None:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before

    return restore


for module in (version, check, completion, profile, plan, launch, attach, status, scale, stop, logs, pull, report):
    module.register(app)


def main() -> None:
    """Console entry point: run the app; an RlctlError, or a usage error the parser found (a bad option value,
    a missing argument, an unknown command), becomes one stderr line and its exit code. Output into a pipe whose
    reader went away (`rlctl status --all | head -1`) ends it as it ends a standard Unix tool: quietly, exit status
    141 (128 + SIGPIPE), as the shell says of `seq 100000 | head -1`; not 0, which would say all of it was written
    (`set -o pipefail` sees the cut as it sees cat's), nor 1, an error that did not happen."""
    if sys.stdout is None:  # closed before rlctl started (`>&-`): what is written to it says so, typer's help too
        sys.stdout = ClosedStdout()
    first = _first_stdout()
    try:
        _exits(first)
    finally:
        if first is not None:
            os.close(first)


def _exits(first: int | None) -> None:
    """`_main`, its exit 141 where its output met a reader gone (`first`: `_first_stdout`)."""
    try:
        _main()  # (always ends in sys.exit)
    except SystemExit as e:
        # typer ends a write to a closed pipe as exit 1, unsaid, and so does rich, which prints typer's help, once it
        # put /dev/null in stdout's place: the BrokenPipeError is what that exit came from
        if isinstance(e.__context__, BrokenPipeError) and stdout_reader_gone(first):  # not a socket's, a child's stdin
            _reader_gone()
        try:  # what print() left in the buffer: written here, not at exit, where a closed pipe cannot be told
            if sys.stdout is not None:  # None: closed before rlctl started (`>&-`), said by rlctl.render.emit
                sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()
        raise
    except BrokenPipeError:
        if stdout_reader_gone():
            _reader_gone()
        raise


def _first_stdout() -> int | None:
    """A copy of the descriptor of the stdout rlctl started with (None: it has none): rich, meeting a reader gone as
    it prints typer's help, puts /dev/null in its place (`Console.on_broken_pipe`), where the pipe can no more be
    asked."""
    try:
        return os.dup(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # closed (`>&-`), or a stdout with no descriptor
        return None


def stdout_reader_gone(fd: int | None = None) -> bool:
    """Whether stdout (`fd`: a copy of its descriptor) is a pipe whose reader went away (poll says POLLERR of its
    write end); not when the broken pipe was another's: a peer's socket, a child process's stdin."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno() if fd is None else fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # a stdout with no descriptor
        return False


def writing_stdout(e: OSError) -> bool:
    """Whether `e` came from a write to stdout outside `rlctl.render.write_out`: typer's help, which rich prints
    (`rlctl --help > /dev/full`); the innermost frame it passed is a writer's whose `file` is stdout."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    writer = tb.tb_frame.f_locals.get("self") if tb is not None else None
    return sys.stdout is not None and getattr(writer, "file", None) is sys.stdout


def _reader_gone() -> NoReturn:
    """Exit 141, quietly: what is still buffered for stdout goes to /dev/null at exit (else Python says its
    BrokenPipeError there: 'Exception ignored in: <_io.TextIOWrapper name='<stdout>' …>')."""
    with contextlib.suppress(OSError, ValueError):  # (a stdout with no descriptor: nothing is flushed at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)


def _main() -> None:
    """`_command`, with `--debug` its own: off unless it asks for it (`_root`), and as it was before once it ends,
    versus `_state` left as the last command that parsed its root options set it: after an in-process `rlctl --debug
    …`, a later call failing before its own root options were read (`rlctl --version` into a full stdout) raised its
    traceback instead of one line. (Kept past the command's context: the error that ends it is said after its close.)"""
    before = _state["debug"]
    _state["debug"] = False
    try:
        _command()
    finally:
        _state["debug"] = before


def _bare_count(message: str) -> str | None:
    """The ±N a parser error of `rlctl scale` names as an extra argument or an unknown option (`rlctl scale JOB +1`,
    `… -1`: the count without its --rollout), else None."""
    m = re.fullmatch(r"(?:Got unexpected extra argument(?:\(s\))? \(([+-]?\d+)\)|No such option: (-\d+))", message)
    return None if m is None else m.group(1) or m.group(2)


def _command() -> None:
    completion.enable()  # a Tab in a shell that sourced `rlctl completion SHELL`: answered in app(), then exit
    try:
        # not standalone: the parser's errors come here (typer would print each as a box of 5-6 lines)
        code = app(prog_name="rlctl", standalone_mode=False)
    except typer.TyperException as e:  # click's ClickException, UsageError, BadParameter (typer vendors click)
        if type(e).__name__ == "NoArgsIsHelpError":  # `rlctl` alone: its help, printed already
            sys.exit(e.exit_code)
        ctx = getattr(e, "ctx", None)
        hint = f" (hint: `{ctx.command_path} --help`)" if ctx is not None else ""
        if ctx is not None and ctx.command_path == "rlctl scale" and (count := _bare_count(e.format_message())):
            hint = f" (hint: {scale.count_hint(count)})"
        message = e.format_message().replace("Value error, ", "")  # pydantic's prefix, as typer passes it on
        message = re.sub(r"\n\s*", " ", message)  # click lists choices one a line ("Choose from:\n\tbash,\n\tzsh")
        sys.stderr.write(one_line(f"rlctl: error: {message}{hint}") + "\n")
        sys.exit(e.exit_code)
    except typer.Abort:  # Ctrl-C (click turns KeyboardInterrupt into Abort)
        sys.stderr.write("rlctl: interrupted\n")
        sys.exit(130)
    except RlctlError as e:
        if _state["debug"]:
            raise
        lines = e.lines if isinstance(e, JobProblems) else [f"{e}" + (f" (hint: {e.hint})" if e.hint else "")]
        sys.stderr.write("".join(one_line(f"rlctl: error: {line}") + "\n" for line in lines))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("rlctl: interrupted\n")
        sys.exit(130)
    except OSError as e:  # a help that stdout could not take (a full disk): said as `write_out` says it, exit 1
        if isinstance(e, BrokenPipeError) or not writing_stdout(e) or _state["debug"]:
            raise
        sys.stderr.write(f"rlctl: error: cannot write the output to stdout: {e.strerror or e}\n")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)  # as standalone: typer.Exit(n) and Ctrl-C (130) give their n
