"""SLURM hostlists: expand `sitea-[1-2],siteb-[01,03-04]` to host names, and compress them back.

Grammar (what `scontrol show hostnames` accepts, minus its rarely used `^`/step forms):

    hostlist := entry ("," entry)*          commas inside brackets do not split entries
    entry    := (text | "[" ranges "]")+    several bracket groups multiply: r[1-2]n[1-2] → 4 hosts
    ranges   := range ("," range)*
    range    := digits | digits "-" digits  zero padding of the low bound is kept: [08-10] → 08 09 10

Malformed input raises ValueError naming the list and the position of the problem.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

_DIGITS = re.compile(r"^\d+$")
MAX_HOSTS = 1_000_000  # a typo like [1-99999999] must fail, not exhaust memory


def _split_top(hostlist: str) -> list[str]:
    """Split on commas that are not inside brackets; check that brackets balance and do not nest."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(hostlist):
        if ch == "[":
            if depth:
                raise ValueError(f"bad hostlist {hostlist!r}: nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"bad hostlist {hostlist!r}: ']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(hostlist[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"bad hostlist {hostlist!r}: '[' is never closed")
    parts.append(hostlist[start:])
    return parts


def _expand_ranges(body: str, hostlist: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        lo, sep, hi = item.partition("-")
        if not _DIGITS.match(lo) or (sep and not _DIGITS.match(hi)):
            raise ValueError(f"bad hostlist {hostlist!r}: range {item!r} in [{body}] is not N or N-M with decimal N, M")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError(f"bad hostlist {hostlist!r}: range {item!r} runs backwards ({hi} < {lo})")
        if b - a + 1 > MAX_HOSTS:
            raise ValueError(f"bad hostlist {hostlist!r}: range {item!r} has more than {MAX_HOSTS} hosts")
        width = len(lo) if len(lo) > 1 and lo.startswith("0") else 0
        out.extend(f"{n:0{width}d}" for n in range(a, b + 1))
    return out


def _expand_entry(entry: str, hostlist: str) -> list[str]:
    if not entry:
        raise ValueError(f"bad hostlist {hostlist!r}: empty host name (stray comma?)")
    pieces: list[list[str]] = []
    pos = 0
    for m in re.finditer(r"\[([^\]]*)\]", entry):
        if m.start() > pos:
            pieces.append([entry[pos : m.start()]])
        if not m[1]:
            raise ValueError(f"bad hostlist {hostlist!r}: empty brackets '[]'")
        pieces.append(_expand_ranges(m[1], hostlist))
        pos = m.end()
    if pos < len(entry):
        pieces.append([entry[pos:]])
    total = 1
    for p in pieces:
        total *= len(p)
    if total > MAX_HOSTS:
        raise ValueError(f"bad hostlist {hostlist!r}: expands to more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand(hostlist: str) -> list[str]:
    """All host names of a SLURM hostlist, in order, duplicates kept (as `scontrol show hostnames`)."""
    hostlist = hostlist.strip()
    if not hostlist:
        raise ValueError("bad hostlist '': empty")
    if any(c.isspace() for c in hostlist):
        raise ValueError(f"bad hostlist {hostlist!r}: contains whitespace")
    hosts: list[str] = []
    for entry in _split_top(hostlist):
        hosts.extend(_expand_entry(entry, hostlist))
    return hosts


_TAIL = re.compile(r"^(.*?)(\d+)$")


def compress(hosts: Iterable[str]) -> str:
    """Shortest-effort inverse of `expand` for names with a numeric suffix: a-1,a-2,a-3,b-7 → a-[1-3],b-7.

    Order is kept: only neighbours with the same prefix and digit width are merged into one group.
    """
    groups: list[tuple[str, int, list[int]]] = []  # (prefix, width, numbers); width -1 = no number
    for host in hosts:
        m = _TAIL.match(host)
        if not m:
            groups.append((host, -1, []))
            continue
        prefix, digits = m[1], m[2]
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        last = groups[-1] if groups else None
        if last and last[0] == prefix and last[1] > 0 and len(digits) == last[1]:
            last[2].append(int(digits))  # 10 continues the padded group of 08, 09
        elif last and last[0] == prefix and last[1] == width:
            groups[-1][2].append(int(digits))
        else:
            groups.append((prefix, width, [int(digits)]))
    out: list[str] = []
    for prefix, width, numbers in groups:
        if width < 0:
            out.append(prefix)
            continue
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        spans: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            spans.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(out)
