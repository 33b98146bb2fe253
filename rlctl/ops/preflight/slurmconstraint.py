"""A SLURM `--constraint` expression evaluated against one node's features: whether that node may run a job asking it.

    "a&(b|c)" ─▶ parse_constraint() ─▶ Expr (None: a form not evaluated) ─▶ satisfies(expr, node's features)

The forms evaluated (sbatch's man page, `--constraint`): a feature name; `a&b` and `a,b` AND; `a|b` OR; parentheses
grouping. One level's operators are all AND or all OR (`a|b&c` is not evaluated: how SLURM binds it is not said
there). Not evaluated (None): brackets (matching OR `[a|b]`, multiple counts `[a*2&b*1]`), node counts `a*2`, newer
SLURM's NOT `!a`, and anything else (a word of other characters, a misplaced operator). Each asks of the nodes
together, not of one node alone, or is not read here; a caller says nothing of an expression it cannot evaluate
rather than refuse one SLURM takes.
"""

from __future__ import annotations

import re
from collections.abc import Set
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:([A-Za-z0-9_.-]+)|([&,|()]))")


@dataclass(frozen=True)
class Op:
    """Features joined by one operator: `and` (every part) or `or` (one part at least)."""

    kind: str
    parts: tuple[Expr, ...]


Expr = str | Op  # a feature name, or parts joined


class _NotEvaluated(Exception):
    pass


def parse_constraint(expression: str) -> Expr | None:
    """`expression` as an Expr; None where it uses a form not evaluated here (see the module's docstring)."""
    tokens: list[str] = []
    at = 0
    while at < len(expression.rstrip()):
        m = _TOKEN.match(expression, at)
        if m is None:
            return None
        tokens.append(m.group(1) or m.group(2))
        at = m.end()
    try:
        expr, at = _group(tokens, 0)
    except _NotEvaluated:
        return None
    return expr if at == len(tokens) else None


def _group(tokens: list[str], at: int) -> tuple[Expr, int]:
    """Parts joined by one operator kind from `tokens[at]`, to a `)` or the end; the Expr and where it stopped."""
    parts = [(term := _term(tokens, at))[0]]
    at, kinds = term[1], set()
    while at < len(tokens) and tokens[at] != ")":
        if tokens[at] not in ("&", ",", "|"):
            raise _NotEvaluated
        kinds.add("or" if tokens[at] == "|" else "and")
        term = _term(tokens, at + 1)
        parts.append(term[0])
        at = term[1]
    if len(kinds) > 1:
        raise _NotEvaluated
    return (Op(kinds.pop(), tuple(parts)) if kinds else parts[0]), at


def _term(tokens: list[str], at: int) -> tuple[Expr, int]:
    if at >= len(tokens):
        raise _NotEvaluated
    if tokens[at] == "(":
        expr, at = _group(tokens, at + 1)
        if at >= len(tokens) or tokens[at] != ")":
            raise _NotEvaluated
        return expr, at + 1
    if tokens[at] in ("&", ",", "|", ")"):
        raise _NotEvaluated
    return tokens[at], at + 1


def satisfies(expr: Expr, features: Set[str]) -> bool:
    """Whether a node of `features` has what `expr` asks."""
    if isinstance(expr, str):
        return expr in features
    held = (satisfies(p, features) for p in expr.parts)
    return all(held) if expr.kind == "and" else any(held)
