"""Imports of a reward file's own modules (those beside it that it imports: `reward_files.local_modules`), resolved to
its directory whenever they run — at its load and inside its functions at call time — in a process that loaded
other reward files with helpers of the same names (workers=0: tests, a notebook, two jobs' checks), without its
directory on sys.path after the load.

    reward module, and each own module loaded through the scope: builtins' __import__ = scope.import_
        import helper   (helper one of `names`) ──▶ scope.active():
            sys.modules' entries of `names` set aside, the scope's own put in their place
            a finder first on sys.meta_path: `names` found in `directory` only, loaded with the same builtins
            the import runs ──▶ what it loaded kept as the scope's own ──▶ what was set aside put back
        import anything_else ──▶ Python's import, untouched

A scope's imports are serialised (one lock for all scopes); an import of an own module already in sys.modules as
the scope's own (the common case: one reward in the process) takes no swap. `importlib.import_module` bypasses
`__import__`: a computed import is not scoped.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

_LOCK = threading.RLock()  # one scope's swap of sys.modules at a time (and its nested imports: reentrant)


class ImportScope:
    """The import of `names` (top-level module names) from `directory`, for the modules given `builtins`."""

    def __init__(self, directory: Path, names: set[str]) -> None:
        self.directory = directory
        self.names = names
        self.own: dict[str, ModuleType] = {}  # module name → the scope's module of it, loaded from `directory`
        self.builtins: dict[str, Any] = {**vars(builtins), "__import__": self.import_}
        self._finder = _Finder(self)
        self._depth = 0  # (under _LOCK) active() entered and not left: nested imports run as they are

    def import_(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> ModuleType:
        package = ((globals or {}).get("__package__") or "") if level else name
        top = package.partition(".")[0]
        if top not in self.names or self._owned(name, fromlist, level):
            return builtins.__import__(name, globals, locals, fromlist or (), level)
        with self.active():
            return builtins.__import__(name, globals, locals, fromlist or (), level)

    def _owned(self, name: str, fromlist: Sequence[str] | None, level: int) -> bool:
        """The import would take only the scope's own modules, as sys.modules holds them now: nothing to swap."""
        if level or name not in self.own:
            return False
        if any(sys.modules.get(p) is not self.own.get(p) for p in _prefixes(name)):
            return False
        return all(hasattr(self.own[name], f) for f in fromlist or ())

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """sys.modules holds the scope's own modules of `names` and its finder goes first; what was there before is
        put back after (what the scope loaded meanwhile kept as its own)."""
        with _LOCK:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            aside = {k: sys.modules.pop(k) for k in [k for k in sys.modules if k.partition(".")[0] in self.names]}
            sys.modules.update(self.own)
            sys.meta_path.insert(0, self._finder)
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
                sys.meta_path.remove(self._finder)
                for k in [k for k in sys.modules if k.partition(".")[0] in self.names]:
                    module = sys.modules.pop(k)
                    if _inside(module, self.directory):
                        self.own[k] = module
                sys.modules.update(aside)
                for k, module in self.own.items():  # (the first reward of these names: its own stay, as before)
                    sys.modules.setdefault(k, module)


class _Finder(importlib.abc.MetaPathFinder):
    """`scope.names` and their submodules from `scope.directory` only, their code run with the scope's builtins."""

    def __init__(self, scope: ImportScope) -> None:
        self.scope = scope

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.scope.names:
            return None
        where = [str(self.scope.directory)] if path is None else list(path)
        spec = importlib.machinery.PathFinder.find_spec(fullname, where)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _ScopedLoader(spec.loader.name, spec.loader.path, self.scope.builtins)
        return spec


class _ScopedLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, scope_builtins: dict[str, Any]) -> None:
        super().__init__(fullname, path)
        self.scope_builtins = scope_builtins

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__builtins__"] = self.scope_builtins  # (its functions' imports go through the scope)
        super().exec_module(module)


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _inside(module: ModuleType, directory: Path) -> bool:
    where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), "")
    return bool(where) and Path(where).resolve().is_relative_to(directory)
