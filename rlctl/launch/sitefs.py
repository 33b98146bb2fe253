"""The job's directory on each of its sites, and the files there, reached through the site's access path.

Sites share no filesystem. Each has a work root (`scheduler.workdir`); a job's files on it live in one
directory, the *site job dir*:

    site                                   site job dir                          reached through
    local / SLURM submitted from here      the operator's job dir (no copy)      this filesystem
      … with `workdir: W`                  W/jobs/<job id>                       this filesystem
    ssh (W default ~/.rlctl)               W/jobs/<job id> on every host         SSH to that host
    SLURM with submit_host (W ~/.rlctl)    W/jobs/<job id> as the submit host    SSH to the submit host
                                           sees it (the cluster's shared FS)

`HostFiles` is one such view: local (`LocalFiles`) or over SSH (`SshFiles`, one connection, SFTP for
copies, coreutils for the rest). `site_files()` gives every view a site needs staging to (an SSH site:
one per host, since its hosts need not share storage either).
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import math
import os
import re
import shlex
import shutil
import stat
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.config.inventory import Site
from rlctl.errors import LaunchError
from rlctl.launch.backends import kind_of
from rlctl.launch.remote import SshTarget, sh_path
from rlctl.launch.sshrunner import SshRunner
from rlctl.textutil import home_path

COMMAND_TIMEOUT_S = 60.0
# hashing files on a remote host: one command per batch of about HASH_BATCH_BYTES, each with a deadline that
# follows its size (COMMAND_TIMEOUT_S plus the time to read it at HASH_FLOOR_BYTES_PER_S, a slow disk)
HASH_BATCH_BYTES = 4 << 30
HASH_FLOOR_BYTES_PER_S = 50e6
SURVEYED = "rlctl-survey"  # printed where a survey's directory is there, its records after it
# a file a survey reads whose last write is this old on its host's clock is stamped for keeping (`Survey.stamps`):
# one written later in the same tick of a coarse file clock (ms) at the same size, in place, would keep every figure
SETTLED_S = 60.0


def site_root(site: Site, job_id: str, *, here: Path) -> str:
    """The site job dir as configured (a leading `~` is the site user's home; `resolve` makes it absolute): the
    operator's job dir `here` on this machine's filesystem unless the site names a work root."""
    workdir = kind_of(site).work_root(site)
    return str(here) if workdir is None else f"{workdir.rstrip('/')}/jobs/{job_id}"


def model_cache(root: str, digest: str) -> str | None:
    """Where a site keeps the starting model whose content digest is `digest`, beside the jobs of the work
    root that holds the site job dir `root` (`W/jobs/<job id>` → `W/models/<digest>`): jobs with the same
    model share one copy. None when `root` is not under a work root (the operator's job dir)."""
    head, sep, _ = root.rpartition("/jobs/")
    return f"{head}/models/{digest}" if sep else None


def is_remote(site: Site) -> bool:
    """Whether the site's files are reached over SSH (not this machine's filesystem)."""
    return kind_of(site).remote(site)


@dataclass(frozen=True)
class FileState:
    """What a site holds under one name: size in bytes, SHA-256 (hex), permission bits."""

    size: int
    sha256: str
    mode: int


@dataclass(frozen=True)
class Survey:
    """What `HostFiles.survey` saw under a directory in one look: whether the directory is there, each file's size in
    bytes and the bytes of those it was asked to read, by path relative to it. `stamps`: of each file it was asked to
    read, last written SETTLED_S before the look or told `known` and unchanged, what changes whenever it is written,
    replaced or its mode changed (inode, size, mtime, ctime): a caller keeps its bytes by it (no part of what was
    seen: not compared)."""

    found: bool
    sizes: dict[str, int]
    texts: dict[str, bytes]
    stamps: dict[str, str] = field(default_factory=dict, compare=False)


class StagingStopped(Exception):
    """Raised in a staging thread once its launch is stopping (`stop` set): a copy at its next chunk, a checksum
    at its next MiB here, or at once on an SSH host (its command is killed there)."""


def file_state(path: Path, *, stop: threading.Event | None = None) -> FileState:
    """The file's size, SHA-256 and mode; StagingStopped at the next MiB read once `stop` is set."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            if stop is not None and stop.is_set():
                raise StagingStopped(f"{path}: checksum stopped")
            h.update(chunk)
    st = path.stat()
    return FileState(st.st_size, h.hexdigest(), st.st_mode & 0o777)


TAIL_WINDOW_BYTES = 64 << 10  # first read from the end when looking for the last lines


class HostFiles(ABC):
    """Files on one host's view of a site (absolute paths on that host)."""

    where: str

    @abstractmethod
    def make_dirs(self, paths: list[str]) -> list[str]:
        """`mkdir -p` (new ones 0700) each path; their absolute, resolved forms, in order."""

    @abstractmethod
    def states(self, root: str, names: list[str], *, stop: threading.Event | None = None) -> dict[str, FileState]:
        """Size, checksum and mode of each of `names` (relative to root) that exists there. Once `stop` is set (the
        launch is stopping) the checksums end soon, with StagingStopped: a model's take minutes."""

    @abstractmethod
    def survey(self, root: str, dirs: list[str], *, read: str, known: Mapping[str, str] | None = None) -> Survey:
        """Every file under each of `dirs` (relative to `root`; one not there holds none) with its size, and the bytes
        of those whose name matches the glob `read` (a few small files: manifests), in one look — one command on an
        SSH host, whatever the number of files — and no file's checksum. A file whose bytes cannot be read is listed
        with its size alone; links are followed. `known`: path → the stamp (`Survey.stamps`) of files whose bytes
        the caller holds: one still at that stamp is stamped, not read (`rlctl.ops.surveycache`)."""

    @abstractmethod
    def remove(self, root: str, names: list[str]) -> None:
        """Remove each of `names` (relative to root) that is there."""

    @abstractmethod
    def chmod(self, root: str, modes: dict[str, int]) -> None:
        """Give each of `modes`' names (relative to root) its permission bits, in place."""

    @abstractmethod
    def put(
        self, local: Path, path: str, *, progress: Callable[[int], None] | None = None, resume: bool = False
    ) -> int:
        """Copy a local file to `path` (its parent exists), keeping its mode; `progress` is told the bytes as they
        go. A copy cut short before goes on from its bytes where the view can (`resume`: the caller verifies the
        result); the bytes taken as already there."""

    @abstractmethod
    def get(self, path: str, local: Path) -> None:
        """Copy the host's file `path` to `local` (its parent exists)."""

    @abstractmethod
    def get_range(self, path: str, local: Path, start: int, end: int) -> None:
        """Copy bytes [start, end) of the host's file `path` to `local` (created or replaced): the part of a log
        that grew since it was last copied."""

    @abstractmethod
    def list_files(self, root: str) -> list[str]:
        """Every file under `root`, as paths relative to it, sorted ([] when `root` does not exist)."""

    @abstractmethod
    def read_text(self, path: str) -> str | None:
        """The file's text, None if it does not exist."""

    @abstractmethod
    def append(self, path: str, text: str) -> None: ...

    @abstractmethod
    def move(self, path: str, to: str) -> bool:
        """Rename the file `path` to `to` (a file there is replaced); False, and nothing changed, where there is
        no file `path`."""

    @abstractmethod
    def link(self, target: str, path: str) -> bool:
        """Make `path` a symbolic link to the directory `target` (a link already there is replaced); False, and
        nothing changed, where `path` is a real file or directory."""

    def tail(self, path: str, lines: int) -> list[str] | None:
        """The last `lines` lines of a file (its unfinished last one included), None if it does not exist: read
        from its end (`last_lines`: a weeks-long job's log is gigabytes)."""
        got = self.last_lines(path, lines)
        if got is None:
            return None
        complete, pending, _ = got
        rows = [*complete, pending] if pending else complete
        return [r.decode("utf-8", errors="replace") for r in rows[-lines:]] if lines else []

    def last_lines(self, path: str, n: int) -> tuple[list[bytes], bytes, int] | None:
        """The file's last `n` complete lines, its unfinished last line, and the offset where it ends: read from
        the end, widening from TAIL_WINDOW_BYTES until they are all in. None if it does not exist."""
        got = self.read_from(path, 0, 0)
        if got is None:
            return None
        end = got[1]
        window = TAIL_WINDOW_BYTES
        while True:
            start = max(0, end - window)
            got = self.read_from(path, start, end - start)
            if got is None:
                return None
            data = got[0]
            if start == 0 or data.count(b"\n") > n:
                break
            window *= 4
        *complete, pending = data.split(b"\n")
        if start > 0:
            complete = complete[1:]  # the window began inside a line
        return (complete[-n:] if n else []), pending, start + len(data)

    @abstractmethod
    def read_from(self, path: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        """At most `limit` bytes of a file from byte `offset` on, and the file's size; None if it does not
        exist (what `rlctl logs -f` polls)."""

    @abstractmethod
    def close(self) -> None: ...


class LocalFiles(HostFiles):
    where = "localhost"

    def make_dirs(self, paths: list[str]) -> list[str]:
        out = []
        for p in paths:
            path = home_path(p, named="directory")
            try:
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as e:
                raise LaunchError(f"cannot create {path}: {e}") from e
            out.append(str(path.resolve()))
        return out

    def states(self, root: str, names: list[str], *, stop: threading.Event | None = None) -> dict[str, FileState]:
        return {n: file_state(Path(root) / n, stop=stop) for n in names if (Path(root) / n).is_file()}

    def survey(self, root: str, dirs: list[str], *, read: str, known: Mapping[str, str] | None = None) -> Survey:
        base = Path(root)
        if not base.is_dir():
            return Survey(False, {}, {})
        known = known or {}
        settled_ns = time.time_ns() - int(SETTLED_S * 1e9)
        sizes: dict[str, int] = {}
        texts: dict[str, bytes] = {}
        stamps: dict[str, str] = {}
        for d in dirs:
            for p, st in _files_under(base / d, frozenset()):
                rel = p.relative_to(base).as_posix()
                sizes[rel] = st.st_size
                if fnmatch.fnmatchcase(p.name, read):
                    stamp = f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"  # taken before the read
                    if known.get(rel) == stamp or st.st_mtime_ns < settled_ns:
                        stamps[rel] = stamp
                    if known.get(rel) != stamp:
                        with contextlib.suppress(OSError):
                            texts[rel] = p.read_bytes()
        return Survey(True, sizes, texts, stamps)

    def remove(self, root: str, names: list[str]) -> None:
        for n in names:
            try:
                (Path(root) / n).unlink(missing_ok=True)
            except OSError as e:
                raise LaunchError(f"cannot remove {Path(root) / n}: {e}") from e

    def chmod(self, root: str, modes: dict[str, int]) -> None:
        for n, mode in modes.items():
            try:
                os.chmod(Path(root) / n, mode)
            except OSError as e:
                raise LaunchError(f"cannot chmod {Path(root) / n}: {e}") from e

    def put(
        self, local: Path, path: str, *, progress: Callable[[int], None] | None = None, resume: bool = False
    ) -> int:
        dst = Path(path)
        if dst.exists() and os.path.samefile(local, dst):
            return 0
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}-{threading.get_ident()}.tmp")
        try:  # under a name of its own, then renamed: a reader of the old file (a job) never sees a half copy
            shutil.copyfile(local, tmp)
            os.chmod(tmp, local.stat().st_mode & 0o777)
            os.replace(tmp, dst)
        except BaseException as e:  # a launch stopped with Ctrl-C too: its name is this copy's, nothing resumes it
            tmp.unlink(missing_ok=True)
            if isinstance(e, OSError):
                raise LaunchError(f"cannot copy {local} to {dst}: {e}") from e
            raise
        if progress is not None:
            progress(dst.stat().st_size)
        return 0

    def get(self, path: str, local: Path) -> None:
        try:
            shutil.copyfile(path, local)
        except OSError as e:
            raise LaunchError(f"cannot copy {path} to {local}: {e}") from e

    def get_range(self, path: str, local: Path, start: int, end: int) -> None:
        try:
            with Path(path).open("rb") as src, local.open("wb") as dst:
                src.seek(start)
                left = end - start
                while left > 0 and (chunk := src.read(min(left, 1 << 20))):
                    dst.write(chunk)
                    left -= len(chunk)
        except OSError as e:
            raise LaunchError(f"cannot copy {path} to {local}: {e}") from e

    def list_files(self, root: str) -> list[str]:
        base = home_path(root, named="directory")
        return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) if base.is_dir() else []

    def read_text(self, path: str) -> str | None:
        p = Path(path)
        return p.read_text(errors="replace") if p.is_file() else None

    def append(self, path: str, text: str) -> None:
        with Path(path).open("a") as f:
            f.write(text)

    def move(self, path: str, to: str) -> bool:
        try:
            os.replace(path, to)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise LaunchError(f"cannot move {path} to {to}: {e}") from e
        return True

    def link(self, target: str, path: str) -> bool:
        p = Path(path)
        if p.exists() and not p.is_symlink():
            return False
        tmp = p.with_name(f".{p.name}.link-{os.getpid()}")
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target, target_is_directory=True)
            os.replace(tmp, p)
        except OSError as e:
            raise LaunchError(f"cannot link {p} to {target}: {e}") from e
        return True

    def read_from(self, path: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        try:
            with Path(path).open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(offset)
                return f.read(limit), size
        except FileNotFoundError:
            return None
        except OSError as e:  # a directory in the file's place (`rlctl logs` printed an IsADirectoryError traceback)
            raise LaunchError(f"cannot read {path}: {e.strerror or e}") from e

    def close(self) -> None:
        pass


class SshFiles(HostFiles):
    """One SSH host: commands over one connection, copies over SFTP."""

    def __init__(self, target: SshTarget) -> None:
        self.runner = SshRunner(target)
        self.where = target.label

    def _run(
        self,
        script: str,
        *,
        stdin: str | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
        stop: threading.Event | None = None,
    ) -> str:
        """The script's stdout; LaunchError when it fails. Given `stop`, its stdin is held open until that is set,
        and StagingStopped raised then (the script ends its work when its stdin does: `_hash_script`)."""
        if stop is None:
            res = self.runner.run(script, timeout_s=timeout_s, stdin=stdin)
        else:
            assert stdin is None, "a script that stops when its stdin ends reads none"
            res = self.runner.run(script, timeout_s=timeout_s, hold_stdin=stop)
            if stop.is_set():
                raise StagingStopped(f"ssh {self.where}: '{script.splitlines()[0][:80]}' stopped")
        if res.exit_code != 0:
            raise LaunchError(f"ssh {self.where}: '{script.splitlines()[0][:80]}' failed: {res.tail()}")
        return res.stdout

    def make_dirs(self, paths: list[str]) -> list[str]:
        lines = ["umask 077", "set -e"] + [f"mkdir -p {sh_path(p)} && (cd {sh_path(p)} && pwd -P)" for p in paths]
        out = self._run("\n".join(lines)).splitlines()
        assert len(out) == len(paths), out
        return out

    def states(self, root: str, names: list[str], *, stop: threading.Event | None = None) -> dict[str, FileState]:
        """Sizes and modes in one command; then the SHA-256s in batches of about HASH_BATCH_BYTES, each command's
        deadline following the bytes it reads (a 76 GB checkpoint is not one command under a fixed deadline), each
        killed on the host once `stop` is set (`_hash_script`): a stopped launch waited for the batch to end."""
        if not names:
            return {}
        cd = f"cd {sh_path(root)} 2>/dev/null || exit 0\n"
        files = " ".join(shlex.quote(n) for n in names)
        script = (
            cd
            + f'for f in {files}; do [ -f "$f" ] || continue; printf "%s %s %s\\n" $(stat -c "%s %a" "$f") "$f"; done\n'
        )
        sizes: dict[str, tuple[int, int]] = {}
        for line in self._run(script).splitlines():
            size, mode, name = line.split(" ", 2)
            sizes[name] = (int(size), int(mode, 8))
        out: dict[str, FileState] = {}
        held = stop if stop is not None else threading.Event()  # never set: the stdin the watcher reads stays open
        for batch, nbytes in _batches([(n, sizes[n][0]) for n in names if n in sizes], HASH_BATCH_BYTES):
            deadline = COMMAND_TIMEOUT_S + nbytes / HASH_FLOOR_BYTES_PER_S
            for sha, name in _hash_lines(self._run(cd + _hash_script(batch), timeout_s=deadline, stop=held)):
                if name in sizes:
                    out[name] = FileState(sizes[name][0], sha, sizes[name][1])
        return out

    def survey(self, root: str, dirs: list[str], *, read: str, known: Mapping[str, str] | None = None) -> Survey:
        """One command: the host's clock, then `find` prints each file's size, then each file matching `read` its
        stamp and, unless `known` (given on stdin) holds that stamp, its bytes as base64; records end in NUL (a name
        may hold a newline), read from the mark that the directory is there on (what the site's login or setup lines
        print before it is not a record)."""
        script = (
            # what it is sent read in any case: a command that ends without reading it fails the sending
            f"cd {sh_path(root)} 2>/dev/null || {{ cat >/dev/null; exit 0; }}\n"
            "declare -A known=()\n"
            "while IFS= read -r -d '' k; do known[$k]=1; done\n"
            f"printf '{SURVEYED}\\0'\n"  # the directory is there
            "printf 'N%s\\0' \"$(date +%s)\"\n"  # the host's clock, which its files' times are of
            f"set --; for d in {' '.join(shlex.quote(d) for d in dirs)}; do\n"
            '  [ -d "$d" ] && set -- "$@" "$d"\n'
            "done\n"
            '[ "$#" -gt 0 ] || exit 0\n'
            # what find cannot walk (a file a prune removed as it walked, a link back up) it says and passes by:
            # the rest is listed, versus the site taken as not answering and nothing there checked
            "find -L \"$@\" -ignore_readdir_race -type f -printf 'S%s %p\\0' 2>/dev/null\n"
            # the stamp before the read (a file replaced between them is read again next time: its stamp is the old)
            f"find -L \"$@\" -ignore_readdir_race -type f -name {shlex.quote(read)} -printf '%i %s %T@ %C@ %p\\0' "
            "2>/dev/null | while IFS= read -r -d '' r; do\n"
            "  printf 'K%s\\0' \"$r\"\n"
            '  [ -n "${known[$r]+x}" ] && continue\n'
            "  f=${r#* * * * }\n"
            '  b=$(base64 -w 0 -- "$f") && printf \'T%s\\0%s\\0\' "$f" "$b"\n'
            "done\n"
            "exit 0\n"
        )
        known = known or {}
        held = "".join(f"{stamp} {rel}\0" for rel, stamp in known.items())
        _, there, records = self._run(script, stdin=held).partition(f"{SURVEYED}\0")
        try:
            return self._survey_records(bool(there), records.split("\0")[:-1], known)
        except ValueError as e:  # (binascii.Error too) a record cut or garbled: said, versus a traceback
            raise LaunchError(f"ssh {self.where}: the look at {root} printed an unreadable record: {e}") from e

    @staticmethod
    def _survey_records(there: bool, fields: list[str], known: Mapping[str, str]) -> Survey:
        """`survey`'s records, each ended by its NUL (what follows the last: not one — a line an exit trap or the
        login shell's logout printed)."""
        sizes: dict[str, int] = {}
        texts: dict[str, bytes] = {}
        stamps: dict[str, str] = {}
        now_s = -math.inf  # no clock: nothing settled
        i = 0
        while i < len(fields):
            record = fields[i]
            if record.startswith("S"):
                size, _, rel = record[1:].partition(" ")
                sizes[rel] = int(size)
            elif record.startswith("N") and record[1:].isdigit():
                now_s = int(record[1:])
            elif record.startswith("K"):
                ino, size, mtime, ctime, rel = record[1:].split(" ", 4)
                stamp = f"{ino} {size} {mtime} {ctime}"
                if known.get(rel) == stamp or float(mtime) < now_s - SETTLED_S:
                    stamps[rel] = stamp
            elif record.startswith("T") and i + 1 < len(fields):
                texts[record[1:]] = base64.b64decode(fields[i + 1])
                i += 1
            i += 1
        return Survey(there, sizes, texts, stamps)

    def remove(self, root: str, names: list[str]) -> None:
        if names:
            self._run(f"cd {sh_path(root)} && rm -f -- {' '.join(shlex.quote(n) for n in names)}")

    def chmod(self, root: str, modes: dict[str, int]) -> None:
        lines = [f"cd {sh_path(root)}", *(f"chmod {mode:o} -- {shlex.quote(n)}" for n, mode in modes.items())]
        self._run("set -e\n" + "\n".join(lines))

    def put(
        self, local: Path, path: str, *, progress: Callable[[int], None] | None = None, resume: bool = False
    ) -> int:
        return self.runner.put(local, path, progress=progress, resume=resume)

    def get(self, path: str, local: Path) -> None:
        self.runner.get(path, local)

    def get_range(self, path: str, local: Path, start: int, end: int) -> None:
        self.runner.get_range(path, local, start, end)

    def list_files(self, root: str) -> list[str]:
        out = self._run(f"cd {sh_path(root)} 2>/dev/null || exit 0\nfind . -type f -printf '%P\\n'")
        return sorted(line for line in out.splitlines() if line)

    def read_text(self, path: str) -> str | None:
        res = self.runner.run(f"cat {sh_path(path)}", timeout_s=COMMAND_TIMEOUT_S)
        return res.stdout if res.exit_code == 0 else None

    def append(self, path: str, text: str) -> None:
        self._run(f"cat >> {sh_path(path)}", stdin=text)

    def move(self, path: str, to: str) -> bool:
        p = sh_path(path)
        return self._run(f"if [ -f {p} ]; then mv -f {p} {sh_path(to)} && echo moved; fi").strip() == "moved"

    def link(self, target: str, path: str) -> bool:
        p, tmp = sh_path(path), sh_path(f"{path}.link-tmp")
        script = f"if [ -e {p} ] && [ ! -L {p} ]; then echo real; exit 0; fi\n"
        script += f"ln -sfn {sh_path(target)} {tmp} && mv -T {tmp} {p}"
        return self._run(script).strip() != "real"

    def tail(self, path: str, lines: int) -> list[str] | None:
        res = self.runner.run(f"tail -n {int(lines)} {sh_path(path)}", timeout_s=COMMAND_TIMEOUT_S)
        return res.stdout.splitlines() if res.exit_code == 0 else None

    def read_from(self, path: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        # base64: the bytes arrive exactly (a chunk may end inside a UTF-8 character); the size line first
        f = sh_path(path)
        script = (
            f"[ -f {f} ] || exit 3\nstat -c %s {f}\n"
            f"tail -c +{int(offset) + 1} {f} | head -c {int(limit)} | base64 -w 0\n"
        )
        res = self.runner.run(script, timeout_s=COMMAND_TIMEOUT_S)
        if res.exit_code == 3:
            return None
        size, _, data = res.stdout.partition("\n")
        if res.exit_code != 0 or not size.strip().isdigit():
            raise LaunchError(f"ssh {self.where}: cannot read {path}: {res.tail()}")
        return base64.b64decode(data.strip()), int(size)

    def close(self) -> None:
        self.runner.close()


def _hash_script(names: list[str]) -> str:
    """Hash `names` with one sha256sum in the background, killed by a watcher when the command's stdin ends: the
    caller ends it to stop (`SshFiles._run`'s `stop`), and sshd does when the connection goes, where the command
    would hash on for minutes. Exits 0 when a file is unreadable (it is left out), with sha256sum's status else."""
    return (
        "exec 3<&0\n"  # the command's stdin: an asynchronous list's own is /dev/null
        f"sha256sum -- {' '.join(shlex.quote(n) for n in names)} & hasher=$!\n"
        "(while read -r _; do :; done <&3; kill $hasher 2>/dev/null) & watcher=$!\n"
        "wait $hasher; rc=$?\n"
        "kill $watcher 2>/dev/null\n"
        '[ "$rc" -le 1 ] || exit "$rc"\n'
    )


def _hash_lines(stdout: str) -> list[tuple[str, str]]:
    """(SHA-256, name) of each line of sha256sum's output: `HEX  NAME`, or `\\HEX  NAME` with the name's
    backslashes and newlines escaped."""
    out = []
    for line in filter(None, stdout.split("\n")):  # a name may hold a carriage return (older sha256sums keep it)
        escaped = line.startswith("\\")
        line = line[1:] if escaped else line
        sha, name = line[:64], line[66:]
        if escaped:
            name = re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m[1], m[1]), name)
        out.append((sha, name))
    return out


def _batches(sized: list[tuple[str, int]], limit: int) -> list[tuple[list[str], int]]:
    """`sized` (name, bytes) in order, cut into runs of at most `limit` bytes (a larger file alone)."""
    out: list[tuple[list[str], int]] = []
    for name, size in sized:
        if out and out[-1][1] + size <= limit:
            out[-1][0].append(name)
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append(([name], size))
    return out


def ssh_target(site: Site, host: str | None = None, *, connect_timeout_s: float = 10.0) -> SshTarget:
    """Where an SSH site's host (default: its first) or a SLURM site's submit host is reached."""
    return kind_of(site).ssh_target(site, host, connect_timeout_s=connect_timeout_s)


def access_hosts(site: Site) -> list[str]:
    """The views of a site that need their own copy: an SSH site's hosts (its first host when they share the
    work root), else one ("localhost" or the submit host)."""
    return kind_of(site).access_hosts(site)


def agent_view(site: Site, agent_host: str | None) -> str:
    """The host view holding an agent's files: its own host on an SSH site, else the site's one view."""
    return kind_of(site).agent_view(site, agent_host)


def host_files(site: Site, host: str) -> HostFiles:
    """The view of `site` on `host` (one of `access_hosts(site)`)."""
    return SshFiles(ssh_target(site, host)) if is_remote(site) else LocalFiles()


def _files_under(d: Path, above: frozenset[tuple[int, int]]) -> Iterator[tuple[Path, os.stat_result]]:
    """Each regular file under the directory `d` with its stat, links followed as `find -L` follows them (a linked
    directory entered: a checkpoint's model/ linked to another disk; Path.rglob does not enter one, and its files were
    missing here while the SSH view listed them); a directory that is one of those `above` it (a link back up: a loop)
    is not entered again. What goes as it is listed, or cannot be read, is left out."""
    try:
        st = d.stat()
        with os.scandir(d) as listed:
            entries = [Path(e.path) for e in listed]
    except OSError:
        return
    key = (st.st_dev, st.st_ino)
    if key in above:
        return
    for p in entries:
        try:
            pst = p.stat()
        except OSError:  # gone as it was listed, a dangling link
            continue
        if stat.S_ISDIR(pst.st_mode):
            yield from _files_under(p, above | {key})
        elif stat.S_ISREG(pst.st_mode):
            yield p, pst
