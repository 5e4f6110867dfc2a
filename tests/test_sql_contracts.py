"""Every named query declares its parameters and result columns in its header (issue 25), and the
header is what PostgreSQL reports when it prepares the statement on a migrated database: a layout
lives in the SQL file, not in docstrings, and cannot drift from the schema."""

from __future__ import annotations

import re

from fencepost.core.record import Column, Prepared, QuerySpec, describe_queries, query_specs
from fencepost.core.resources import resource_dir
from fencepost.dev.sqlheaders import declared_mismatches, infer_names, with_headers

LATER: frozenset[str] = frozenset()
"""Files allowed to lack headers while work in them lands (empty: every query file is checked)."""


def _later_names() -> set[str]:
    names: set[str] = set()
    for path in resource_dir("sql").glob("queries*.sql"):
        if path.name in LATER:
            names |= set(re.findall(r"^-- name: (\w+)\s*$", path.read_text(), re.M))
    return names


async def test_every_query_header_matches_what_postgresql_prepares(database_url: str) -> None:
    found = await describe_queries(database_url)
    specs = query_specs()
    later = _later_names()
    problems = [p for name in found for p in declared_mismatches(specs.get(name), found[name])
                if not (name in later and specs.get(name) is None)]
    assert not problems, ("\n".join(problems) + "\n(write them: python -m fencepost.dev.sqlheaders "
                          "--database-url <a scratch database> --write)")
    unchecked = {n: s.why for n, s in specs.items() if s is not None and not s.checked}
    assert all(unchecked.values()), f"an unchecked query says why: {unchecked}"


def test_the_check_fails_on_a_wrong_type_a_wrong_column_and_a_missing_header() -> None:
    found = Prepared(name="q", param_types=("int8",), returns=(Column(name="id", type="int8"),))
    good = QuerySpec(name="q", params=(Column(name="run_id", type="int8"),), returns=found.returns)
    assert declared_mismatches(good, found) == []
    wrong_type = QuerySpec(name="q", params=(Column(name="run_id", type="text"),), returns=found.returns)
    wrong_col = QuerySpec(name="q", params=good.params, returns=(Column(name="run_id", type="int8"),))
    assert declared_mismatches(wrong_type, found) and declared_mismatches(wrong_col, found)
    assert declared_mismatches(None, found) == ["q: no header (-- params: / -- returns:)"]
    broken = Prepared(name="q", error="UndefinedTableError: relation x does not exist")
    assert "cannot prepare" in declared_mismatches(good, broken)[0]


def test_headers_are_written_after_the_name_and_keep_names_given_by_hand() -> None:
    sql = "SELECT id FROM runs WHERE queue = $1 AND id > $2 LIMIT $3;"
    assert infer_names(sql, 3) == ["queue", "min_id", "limit"]
    found = {"q": Prepared(name="q", param_types=("text", "int8", "int8"), returns=(Column(name="id", type="int8"),))}
    text = f"-- name: q\n-- Why it exists.\n{sql}\n"
    out = with_headers(text, {"q": None}, found, {"q": sql})
    assert out.splitlines()[:3] == ["-- name: q", "-- params: queue text, min_id int8, limit int8",
                                    "-- returns: id int8"]
    renamed = out.replace("min_id int8", "after int8")
    spec = QuerySpec(name="q", params=(Column("queue", "text"), Column("after", "int8"), Column("limit", "int8")),
                     returns=found["q"].returns)
    assert "after int8" in with_headers(renamed, {"q": spec}, found, {"q": sql})
