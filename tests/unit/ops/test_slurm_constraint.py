"""`rlctl.ops.preflight.slurmconstraint`: a SLURM `--constraint` expression evaluated on one node's features, and the
forms it does not evaluate (None: the caller says nothing rather than refuse one SLURM takes)."""

from __future__ import annotations

import pytest

from rlctl.ops.preflight.slurmconstraint import Op, parse_constraint, satisfies


@pytest.mark.parametrize(
    ("expression", "features", "held"),
    [
        ("a", {"a"}, True),
        ("a", {"b"}, False),
        ("a", set(), False),
        ("a&b", {"a", "b"}, True),
        ("a&b", {"a"}, False),
        ("a,b", {"a", "b", "c"}, True),  # a comma is an AND
        ("a,b", {"b"}, False),
        ("a|b", {"b"}, True),
        ("a|b", {"c"}, False),
        ("a&b&c", {"a", "b"}, False),
        ("a,b&c", {"a", "b", "c"}, True),  # `,` and `&` alike: one kind
        ("(a|b)&c", {"b", "c"}, True),
        ("(a|b)&c", {"a", "b"}, False),
        ("a&(b|c)", {"a", "c"}, True),
        ("(a&b)|c", {"c"}, True),
        ("(a&b)|c", {"a"}, False),
        ("(a&b)|(c&d)", {"b", "c", "d"}, True),
        ("(a&b)|(c&d)", {"a", "c"}, False),
        ("((a))", {"a"}, True),
        (" h800 & ib ", {"h800", "ib"}, True),
        ("gpu.h100-80g_x", {"gpu.h100-80g_x"}, True),
    ],
)
def test_an_expression_is_evaluated_on_a_node_s_features(expression: str, features: set[str], held: bool) -> None:
    expr = parse_constraint(expression)
    assert expr is not None
    assert satisfies(expr, features) is held


def test_parentheses_group_and_one_kind_joins_each_level() -> None:
    assert parse_constraint("a") == "a"
    assert parse_constraint("a,b&c") == Op("and", ("a", "b", "c"))
    assert parse_constraint("(a|b)&c") == Op("and", (Op("or", ("a", "b")), "c"))


@pytest.mark.parametrize(
    "expression",
    [
        "[a|b]",  # matching OR: one of them for all the job's nodes
        "[a*2&b*1]",  # multiple counts
        "a*2",  # a node count
        "!a",  # newer SLURM's NOT
        "a&!b",
        "a|b&c",  # AND and OR at one level: how SLURM binds them is not said
        "a&b|c",
        "",
        "a&",
        "&a",
        "a&&b",
        "(a",
        "a)",
        "()",
        "a b",
        "gpu:a100",
    ],
)
def test_a_form_not_evaluated_is_none(expression: str) -> None:
    assert parse_constraint(expression) is None
