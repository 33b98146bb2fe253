"""Loading YAML files into typed models, and turning every failure into one ConfigError line.

Every config model derives from `Strict`: unknown keys are refused with the closest valid key,
so `gpuss: 8` fails as `sites.h20.gpuss: unknown key (did you mean 'gpus'?)`, and so are infinite and NaN
numbers (YAML's `.inf`, `.nan`): no field means "unbounded" by infinity. A key written twice in one mapping
is refused too, rather than the last one silently winning, and so is a YAML boolean where a number goes
(pydantic reads `iterations: true` as 1), and a whole number past 2^63 - 1 in a field with no bound of its own.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from rlctl.errors import ConfigError
from rlctl.textutil import did_you_mean, one_of, read_config_bytes, undecodable_at

API_VERSION = "rlctl/v1"
M = TypeVar("M", bound=BaseModel)

NAME_RE = r"^[a-z0-9][a-z0-9_-]{0,62}$"

# Fields whose value is a union told apart by `kind` -> the valid kinds. Pydantic puts the tag into
# the error location (`scheduler.slurm.partition`); we drop it so paths match the file.
_TAGGED_FIELDS: dict[str, list[str]] = {}
_TAGGED_KEYS: dict[str, dict[str, set[str]]] = {}  # field -> kind -> its keys: a key of another kind is said so


def register_tags(field: str, union: Any) -> None:
    """Remember the kinds of an `Annotated[A | B, Field(discriminator="kind")]` field, and each kind's keys, for
    error messages."""
    models = get_args(get_args(union)[0])
    kinds = {k for m in models for k in get_args(m.model_fields["kind"].annotation)}
    _TAGGED_FIELDS[field] = sorted(kinds | set(_TAGGED_FIELDS.get(field, [])))
    for m in models:
        keys = {f.alias or name for name, f in m.model_fields.items()}
        for kind in get_args(m.model_fields["kind"].annotation):
            _TAGGED_KEYS.setdefault(field, {})[kind] = keys


def _other_kinds_key(loc: tuple[int | str, ...], key: str) -> str | None:
    """Where `loc` is a tagged field's member (`algorithm`, `grpo`) and `key` is no key of its kind: the line saying
    which other kinds take it (`critic_lr` is PPO's), versus 'unknown key', as if misspelt; else None."""
    if len(loc) < 2 or not isinstance(loc[-2], str) or not isinstance(loc[-1], str):
        return None
    field, kind = loc[-2], loc[-1]
    others = sorted(k for k, keys in _TAGGED_KEYS.get(field, {}).items() if k != kind and key in keys)
    if kind not in _TAGGED_KEYS.get(field, {}) or not others:
        return None
    which = " or ".join(repr(k) for k in others)
    return f"a key of {field} kind {which} only, and this {field} is kind {kind!r}: drop it, or use kind {which}"


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _listen_host(v: str) -> str:
    """`auto`, an IP address or an RFC 1123 host name: what an agent can bind and its peers can dial."""
    if v == "auto":
        return v
    try:
        ipaddress.ip_address(v)
        return v
    except ValueError:
        pass
    labels = v.split(".")
    if len(v) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit():
        return v
    raise ValueError(
        f"invalid listen address {v!r}; valid: an IPv4 or IPv6 address, a host name (labels of letters, digits "
        "and '-' joined by '.'), or 'auto'"
    )


ListenHost = Annotated[str, AfterValidator(_listen_host)]

# The longest any seconds field of a job may say: a week. Every such field reaches a timer, a poll or
# faulthandler, which overflow near 2^63 ns (≈ 292 years) and fail only once the job runs; no wait, watch or
# report period of a real job is longer than a week (a hang watch that should never fire is `never`).
MAX_WAIT_S = 7 * 24 * 3600
MAX_THREADS = 4096  # CPU threads of one agent (torch.set_num_threads takes an int; no node has more cores)


def _at_most_a_week(v: float) -> float:
    if v > MAX_WAIT_S:
        raise ValueError(f"more than a week; valid: up to {MAX_WAIT_S} s (7 days)")
    return v


Seconds = Annotated[float, Field(gt=0), AfterValidator(_at_most_a_week)]
"""Seconds a job waits, watches or sleeps: more than 0, at most MAX_WAIT_S."""
SecondsOrZero = Annotated[float, Field(ge=0), AfterValidator(_at_most_a_week)]
"""As `Seconds`, where 0 means off."""


def _takes(annotation: Any) -> tuple[bool, bool, bool, list[str]]:
    """What a field's type takes of a scalar: (a bool, an int, a float, its literal strings)."""
    origin = get_origin(annotation)
    if annotation is Any:
        return True, True, True, []
    if origin is Annotated:
        return _takes(get_args(annotation)[0])
    if origin is Union or origin is UnionType:
        parts = [_takes(a) for a in get_args(annotation)]
        return (
            any(p[0] for p in parts),
            any(p[1] for p in parts),
            any(p[2] for p in parts),
            [w for p in parts for w in p[3]],
        )
    if origin is Literal:
        values = get_args(annotation)
        takes_int = any(isinstance(v, int) and not isinstance(v, bool) for v in values)
        return (
            any(isinstance(v, bool) for v in values),
            takes_int,
            False,
            [repr(v) for v in values if isinstance(v, str)],
        )
    return annotation is bool, annotation is int, annotation is float, []


def _items(annotation: Any) -> Any:
    """The type of a list's items or a mapping's values (None for another type)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _items(get_args(annotation)[0])
    if origin in (list, tuple, set, frozenset) and get_args(annotation):
        return get_args(annotation)[0]
    if origin is dict:
        return get_args(annotation)[1]
    if origin is Union or origin is UnionType:
        return next((t for a in get_args(annotation) if (t := _items(a)) is not None), None)
    return None


def bool_for_number(annotation: Any, value: Any) -> tuple[tuple[int | str, ...], str] | None:
    """Where in `value` (() for itself, else the path to an item) a YAML boolean stands for a number of
    `annotation`, which takes no boolean (pydantic's lax mode reads true as 1), and what is valid there."""
    if isinstance(value, bool):
        takes_bool, takes_int, takes_float, words = _takes(annotation)
        if takes_bool or not (takes_int or takes_float):
            return None
        valid = ["a valid integer" if takes_int and not takes_float else "a valid number", *words]
        said = valid[0] if len(valid) == 1 else f"{', '.join(valid[:-1])} or {valid[-1]}"
        return (), f"Input should be {said}, not a boolean (got {value!r})"
    items = _items(annotation) if isinstance(value, list | dict) else None
    if items is None:
        return None
    pairs = value.items() if isinstance(value, dict) else enumerate(value)
    for key, v in pairs:
        if (found := bool_for_number(items, v)) is not None:
            return (key, *found[0]), found[1]
    return None


INT64_MAX = 2**63 - 1


def huge_int(value: Any) -> tuple[tuple[int | str, ...], str] | None:
    """Where in `value` (() for itself, else the path to an item) a whole number lies past ±(2^63 - 1), and what is
    valid: no field of rlctl takes one (each reaches an int64 or msgpack, which takes none: a job with
    `checkpoint.every_iterations: 1e30` written out passed check, and its controller failed at its start on
    OverflowError)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        return (), f"{value} is past the largest whole number rlctl takes, 2^63 - 1 ({INT64_MAX})"
    pairs = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, v in pairs:
        if (found := huge_int(v)) is not None:
            return (key, *found[0]), found[1]
    return None


def is_recorded(info: ValidationInfo) -> bool:
    """Whether the model is read from a job's own record (its sites.json, its job.json: `inventory.RECORDED`'s
    context), which reads back as launched past checks added since."""
    return bool((info.context or {}).get("recorded"))


class Strict(BaseModel):
    """Base of every config model: frozen, no unknown keys, suggestions for typos, no boolean for a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            valid = {f.alias or name for name, f in cls.model_fields.items()}
            for key in data:
                if key not in valid:
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key{hint}; valid keys: {valid}",
                        {"key": str(key), "hint": did_you_mean(str(key), valid), "valid": one_of(valid)},
                    )
            fields = {key: f for name, f in cls.model_fields.items() for key in {name, f.alias or name}}
            for key, value in data.items():
                if (found := bool_for_number(fields[key].annotation, value)) is not None:
                    path, why = found
                    raise PydanticCustomError("bool_for_number", "{why}", {"key": str(key), "path": path, "why": why})
        return data

    @model_validator(mode="after")
    def _refuse_huge_ints(self) -> Strict:
        # after each field's own bounds (`le=`), which say more where a field has one
        for name, field in type(self).model_fields.items():
            if (found := huge_int(getattr(self, name))) is not None:
                path, why = found
                key = field.alias or name
                raise PydanticCustomError("bool_for_number", "{why}", {"key": key, "path": path, "why": why})
        return self


def format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    parts = list(loc)
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        if i > 0 and part in _TAGGED_FIELDS.get(str(parts[i - 1]), ()):  # a kind's tag, not a key (a profile's
            continue  # `model` is a mapping of keys: `model.layers`, not `model`)
        if part.startswith(("function-", "tagged-union", "constrained-", "literal[")) or part == "[key]":
            continue  # pydantic's labels of a validator or a union's member (`gpus: 8 | auto`), not keys of the file
        out += ("." if out else "") + part
    return out


def first_error(exc: ValidationError, *, only: Callable[[ErrorDetails], bool] | None = None) -> tuple[str, str]:
    """The first error as (field path, message) — one line is what the operator reads. `only`: the first of the
    errors it keeps (at least one)."""
    errors = [e for e in exc.errors(include_url=False) if only is None or only(e)]
    err = errors[0]
    loc = tuple(err["loc"])
    # `auto | seconds`, `count | auto`: the union's number member, which read the value and refused it, says why, and
    # the words it also takes follow, whichever member pydantic tried first (the members' locs: the same field, then
    # the member's tag; a plain Literal field's error is not merged with another field's)
    members = [e for e in errors if len(e["loc"]) == len(loc) and tuple(e["loc"][:-1]) == loc[:-1]]
    words = next(
        (e for e in members if e["type"] == "literal_error" and str(e["loc"][-1]).startswith("literal[")), None
    )
    why = next((e for e in members if e is not words), None)
    if words is not None and why is not None:
        err = {**why, "msg": f"{why['msg']}; or {words['ctx']['expected']}"}
        # the field's own path: the member's tag is pydantic's (`str` of `str | Literal[True]` was said as a key of
        # the file: `sbatch_options.mail-type.str`)
        loc = tuple(err["loc"][:-1])
    if err["type"] == "unknown_key":
        loc = (*loc, err["ctx"]["key"])
    elif err["type"] == "bool_for_number":  # found before the field's own validation: its key and the item's path
        loc = (*loc, err["ctx"]["key"], *err["ctx"]["path"])
    msg = err["msg"]
    if err["type"] == "unknown_key" and (other := _other_kinds_key(tuple(err["loc"]), err["ctx"]["key"])):
        msg = other
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif err["type"] == "union_tag_invalid":
        msg = f"unknown kind {err['ctx'].get('tag')!r}; valid: {err['ctx'].get('expected_tags')}"
    elif err["type"] == "union_tag_not_found":
        field = next((str(p) for p in reversed(loc) if isinstance(p, str)), "")
        msg = f"missing 'kind'; valid: {', '.join(_TAGGED_FIELDS.get(field, []))}"
    elif err["type"] == "string_pattern_mismatch" and err["ctx"].get("pattern") == NAME_RE:
        msg = "invalid name; use 1-63 lower-case letters, digits, '-' or '_', starting with a letter or digit"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    given = err.get("input")
    if err["type"] == "string_type" and isinstance(given, bool):
        # (`user: off`, `host: no`: YAML 1.1 reads these words unquoted as booleans; said 'a valid string (got False)')
        msg = (
            f"YAML reads this value as the boolean {given!r} (an unquoted yes/no, on/off or true/false), not a "
            "string: write it in quotes, as you mean it"
        )
    elif err["type"] == "string_type" and isinstance(given, int | float):
        # (`name: 123`, `partition: 0123`: a string of digits is valid there, and YAML made it a number, 0123 83)
        msg = f"YAML reads this value as the number {given!r}, not a string: write it in quotes, as you mean it"
    if err["type"] not in {"missing", "unknown_key"} and not isinstance(given, dict | list) and repr(given) not in msg:
        msg += f" (got {given!r})"
    return format_loc(loc) or "(top level)", msg


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(key, line, first_line)
        self.key, self.line, self.first_line = key, line, first_line


class _KeyNotText(Exception):
    def __init__(self, written: str, read_as: str, line: int) -> None:
        super().__init__(written, read_as, line)
        self.written, self.read_as, self.line = written, read_as, line


def _read_as(key: Any) -> str:
    """What YAML made of a key that is no string, in words."""
    if key is None:
        return "null (nothing)"
    if isinstance(key, bool):
        return f"the boolean {str(key).lower()}"
    if isinstance(key, int | float):
        return f"the number {key!r}"
    if isinstance(key, datetime.date):
        return f"the date {key.isoformat()}"
    return f"a {type(key).__name__}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping (YAML says keys are unique; PyYAML
    keeps the last), and a key that is no string (every key of rlctl's files is a name: an unquoted `yes:`, `1:`,
    `2024-01-01:` or `~:` became `sites[1]`, `sites.1`, `sites.datetime.date(2024, 1, 1)`, `sites.None` in the line
    that refused it). Keys merged in with `<<: *anchor` may be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            if not isinstance(key, str):
                written = key_node.value if isinstance(key_node, yaml.ScalarNode) else ""
                raise _KeyNotText(written, _read_as(key), line)
            try:
                again = key in first_line
            except TypeError:
                continue  # an unhashable key: the base constructor refuses it
            if again:
                raise _DuplicateKey(key, line, first_line[key])
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def _tilde_left(name: str) -> str | None:
    """Where a path named on the command line begins with `~`: the shell expands it only at a word's start, so
    `--cluster=~/h20.yaml` (or a quoted one) reached rlctl as written and was 'no such file' of a file that is there."""
    # (os.path's: `~nosuchuser/…` stays as written, where Path.expanduser raised RuntimeError, a traceback; a ~ the
    # shell would not expand either gets no hint)
    home = os.path.expanduser(name) if name.startswith("~") else name
    if home == name:
        return None
    there = f" ({home!r} is there)" if os.path.isfile(home) else ""
    # (no option named: `check` and `plan` take the file as an argument, `profile` and `plan --profile` after an option)
    return (
        "the shell left this ~ as written (it expands one only at the start of an unquoted word, not after '='): "
        f"give the path unquoted, after a space rather than '=', or in full{there}"
    )


def read_yaml(path: Path) -> dict[str, Any]:
    """Read one YAML mapping; every failure (no such file, no permission, bad YAML, a key twice) becomes a
    ConfigError naming the file."""
    name = str(path)
    try:
        raw = read_config_bytes(path)
    except ValueError as e:
        raise ConfigError(name, None, str(e)) from e
    except FileNotFoundError as e:
        raise ConfigError(name, None, "no such file", hint=_tilde_left(name)) from e
    except IsADirectoryError as e:
        raise ConfigError(name, None, "is a directory, expected a YAML file") from e
    except OSError as e:
        raise ConfigError(name, None, f"cannot read: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:  # (an editor's Latin-1 or UTF-16: the byte's offset alone was said)
        where = undecodable_at(raw, e.start)
        raise ConfigError(name, None, f"cannot read: not UTF-8 text ({where}); save it as UTF-8") from e
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: plain data only
    except _KeyNotText as e:
        if e.written:
            said = f"key {e.written!r} at line {e.line} is read by YAML as {e.read_as}, not a name; quote it"
        else:  # (a list or mapping as a key, or none written)
            said = f"the key at line {e.line} is {e.read_as}, not a name; every key is a name"
        raise ConfigError(name, None, said) from e
    except _DuplicateKey as e:
        raise ConfigError(
            name, None, f"duplicate key {e.key!r} at line {e.line} (first at line {e.first_line}); write each key once"
        ) from e
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(name, None, f"YAML syntax error at {where}{e.problem}") from e
    except yaml.reader.ReaderError as e:  # (it said '… not allowed\n  in "<unicode string>", position 298')
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise ConfigError(
            name,
            None,
            f"cannot read: character U+{e.character:04X} at line {line}, column {column}, which YAML does not take (a "
            "control character other than tab and line breaks, or a non-character); remove it",
        ) from e
    except yaml.YAMLError as e:
        raise ConfigError(name, None, f"YAML error: {e}") from e
    except RecursionError as e:  # the parser recurses once per level of nesting
        raise ConfigError(name, None, "nested too deeply to read (hundreds of levels); no config needs that") from e
    if data is None:
        raise ConfigError(name, None, "file is empty; expected a mapping with apiVersion and kind")
    if not isinstance(data, dict):
        raise ConfigError(name, None, f"top level must be a mapping, got {type(data).__name__}")
    return data


KINDS = ("Inventory", "Job", "Profile")  # the kinds of rlctl's files


def check_header(path: Path, data: dict[str, Any], kind: str, *, reads: tuple[str, ...] = ()) -> None:
    """The file is rlctl's and of kind `kind`; `reads`: the kinds the command reads, where more than that one (check
    reads Inventory and Job files), said to a file of another kind."""
    name = str(path)
    api = data.get("apiVersion")
    if api != API_VERSION:
        got = "missing" if api is None else repr(api)
        raise ConfigError(name, "apiVersion", f"must be '{API_VERSION}', got {got}")
    other = data.get("kind")
    if other != kind:
        wanted = " or ".join(f"'{k}'" for k in reads or (kind,))
        if other in KINDS:  # a file of another kind: the command takes the other
            raise ConfigError(name, "kind", f"must be {wanted} for this command, got {other!r}")
        said = "missing" if "kind" not in data else f"{other!r} is no kind"
        case = next((k for k in KINDS if isinstance(other, str) and k.lower() == other.lower()), None)
        mean = f" (did you mean {case!r}? kinds are capitalised)" if case is not None else ""
        raise ConfigError(name, "kind", f"{said}{mean}; valid: {', '.join(KINDS)} (this command reads kind {wanted})")


def validate(path: Path, data: dict[str, Any], model: type[M], *, context: dict[str, Any] | None = None) -> M:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as e:
        field, msg = first_error(e)
        raise ConfigError(str(path), field, msg) from e
