"""Every named query declares its parameters and result columns in its header (issue 25), and the
header is what PostgreSQL reports when it prepares the statement on a migrated database: a layout
lives in the SQL file, not in docstrings, and cannot drift from the schema."""

from __future__ import annotations

import re
from datetime import datetime

import msgspec
import pytest

from fencepost.core.record import Column, Database, Prepared, QuerySpec, describe_queries, query_specs, row_type
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


NOT_A_ROW_TYPE = frozenset({"ping"})
"""Queries with result columns that cannot be Struct fields (`?column?`): read with fetchval."""


def test_each_row_struct_has_the_headers_columns() -> None:
    """Database.rows / row return a Struct per query whose fields are its `-- returns:` columns, in
    order (the decode is positional), each typed from the PostgreSQL type and optional."""
    checked = {n: s for n, s in query_specs().items() if s is not None and s.returns and s.checked}
    assert len(checked) > 100
    for name, spec in checked.items():
        if name in NOT_A_ROW_TYPE:
            with pytest.raises(KeyError):
                row_type(name)
            continue
        cls = row_type(name)
        assert cls.__struct_fields__ == tuple(c.name for c in spec.returns), name
        assert cls.__struct_config__.frozen and cls.__struct_config__.array_like, name
        with pytest.raises(TypeError):
            cls(*[None] * len(spec.returns))  # kw_only: built by name, or decoded from a row
        assert row_type(name) is cls  # made once
    types = msgspec.inspect.type_info(row_type("run_events"))
    assert isinstance(types, msgspec.inspect.StructType)
    by_name = {f.name: f.type for f in types.fields}
    assert by_name["id"] == msgspec.inspect.UnionType(types=(msgspec.inspect.IntType(), msgspec.inspect.NoneType()))
    with pytest.raises(KeyError):
        row_type("no_such_query")


async def test_a_row_decodes_into_its_struct(database_url: str) -> None:
    db = await Database(database_url).connect()
    try:
        rows = await db.rows("history_partitions")
        assert rows, "a migrated database has monthly partitions"
        first = rows[0]
        assert isinstance(first, row_type("history_partitions"))
        assert isinstance(first.parent, str) and isinstance(first.upper_bound, datetime)
        assert first.lower_bound < first.upper_bound
        records = await db.fetch("history_partitions")
        assert [tuple(r.values()) for r in records] == [tuple(msgspec.structs.astuple(r)) for r in rows]
        one = await db.row("history_partitions")
        assert one == first
        async with db.session() as s:
            assert await s.rows("history_partitions") == rows
        assert await db.row("run_events", -1) is None
    finally:
        await db.close()
