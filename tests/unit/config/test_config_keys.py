"""A YAML key that is no string (an unquoted yes, a date, ~, a number): one line naming it as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("yes", "key 'yes' at line 4 is read by YAML as the boolean true, not a name; quote it"),
        ("2024-01-01", "key '2024-01-01' at line 4 is read by YAML as the date 2024-01-01, not a name; quote it"),
        ("~", "key '~' at line 4 is read by YAML as null (nothing), not a name; quote it"),
        ("7", "key '7' at line 4 is read by YAML as the number 7, not a name; quote it"),
        ("[a, b]", "the key at line 4 is a list, not a name; every key is a name"),
    ],
)
def test_a_key_yaml_reads_as_no_string_is_named_as_written(tmp_path: Path, key: str, said: str) -> None:
    # the field's name said Python's repr of it: sites.datetime.date(2024, 1, 1), sites.None, sites[1]
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"apiVersion: rlctl/v1\nkind: Inventory\nsites:\n  {key}: {{}}\n")
    r = run_cli("check", str(inv))
    assert (r.exit_code, r.stderr) == (2, f"rlctl: error: {inv}: {said}\n")
    inv.write_text(f"apiVersion: rlctl/v1\nkind: Inventory\nsites:\n  '{key}': {{}}\n")  # quoted: a name
    assert "at line 4" not in run_cli("check", str(inv)).stderr
