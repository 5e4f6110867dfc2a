"""The typed gateways are the only paths to the stores: every SQL statement is a named query run by
fencepost.core.record (the record store)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from fencepost.core.record import query_names

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "scheduler" / "core" / "record.py"

_SQL = re.compile(
    r"\bSELECT\s+(?:\S[\s\S]*?\s)?FROM\b|\bSELECT\s+(?:\d|\*|pg_|set_config|count\()|\bINSERT\s+INTO\b"
    r"|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b|\bMERGE\s+INTO\b|\bCOPY\s+\w+\s+(?:FROM|TO)\b"
    r"|\b(?:CREATE|ALTER|DROP|TRUNCATE)\s+(?:TABLE|INDEX|DATABASE|SCHEMA|FUNCTION|VIEW|SEQUENCE|TRIGGER)\b"
    r"|\b(?:LISTEN|UNLISTEN|NOTIFY)\s+\w+\s*;?\s*$|\bWITH\s+\w+\s+AS\s+(?:MATERIALIZED\s+)?\("
    r"|\bON\s+CONFLICT\b|\bpg_(?:advisory|notify|try_advisory)\w*\s*\(",
    re.MULTILINE,
)
"""SQL as this code base writes it (upper-case keywords), or as someone might sneak it in lower case
(the structural phrases only: `select ... from`, `insert into`, ...)."""
_SQL_LOWER = re.compile(
    r"^\s*(?:select\s+[\s\S]+?\s+from\s+\w+|select\s+\d|insert\s+into\s+\w+|update\s+\w+\s+set\s"
    r"|delete\s+from\s+\w+|(?:create|alter|drop)\s+(?:table|database|index|function)\s+\w+)",
)
_QUERY_METHODS = {"fetch", "fetchrow", "fetchval", "execute", "executemany"}
"""Gateway methods whose first argument is a query name (asyncpg's take SQL there)."""
_RAW_METHODS = {"copy_from_table", "copy_to_table", "copy_records_to_table", "copy_from_query", "add_listener",
                "remove_listener", "set_type_codec", "executemany"}
"""asyncpg connection methods the gateway wraps (COPY, LISTEN...): callers use Session / Database."""
_PRIVATE_RECORD_NAMES = {"query", "_queries", "_fetch", "_execute", "_MAPPED", "_UNAVAILABLE"}


def _sources(*, record: bool = False) -> Iterator[tuple[Path, ast.Module]]:
    for base in ("scheduler", "worker", "reconciler"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if path != RECORD or record:
                yield path, ast.parse(path.read_text(), str(path))


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
        if isinstance(node, (ast.Module, ast.ClassDef)):  # attribute docstrings: a string after an assignment
            for prev, stmt in zip(node.body, node.body[1:]):
                if isinstance(prev, (ast.Assign, ast.AnnAssign)) and isinstance(stmt, ast.Expr) \
                        and isinstance(stmt.value, ast.Constant):
                    ids.add(id(stmt.value))
    return ids


def _string_pieces(node: ast.AST) -> str | None:
    """The text of a literal string, an f-string's literal parts joined (placeholders as `x`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "x"
                       for v in node.values)
    return None


def _violations(path: Path, tree: ast.Module, names: frozenset[str]) -> Iterator[str]:
    where = path.relative_to(ROOT)
    docs = _docstrings(tree)
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        text = None if id(node) in docs or id(node) in in_fstring else _string_pieces(node)
        if text is not None and (_SQL.search(text) or _SQL_LOWER.search(text)):
            yield f"{where}:{node.lineno} holds SQL in a string: {text.strip()[:60]!r}"
        if isinstance(node, ast.ImportFrom) and node.module == "fencepost.core.record":
            for alias in node.names:
                if alias.name in _PRIVATE_RECORD_NAMES:
                    yield f"{where}:{node.lineno} imports {alias.name} from the record store (use query names)"
        if isinstance(node, (ast.Import, ast.ImportFrom)) and path.parts[-2:] != ("core", "record.py"):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m == "asyncpg.connection" or m.startswith("asyncpg.pool") for m in mods):
                yield f"{where}:{node.lineno} imports asyncpg's connection machinery"
        if isinstance(node, ast.Attribute) and node.attr == "pool" and isinstance(node.ctx, ast.Load):
            yield f"{where}:{node.lineno} reaches for the raw pool (.pool): use db.session() / db.transaction()"
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "asyncpg":
            yield f"{where}:{node.lineno} calls asyncpg.{fn.attr} directly"
        if isinstance(fn, ast.Name) and fn.id == "query":
            yield f"{where}:{node.lineno} calls query(): pass the query name to the gateway instead"
        if isinstance(fn, ast.Attribute) and fn.attr in _RAW_METHODS:
            yield f"{where}:{node.lineno} calls .{fn.attr}() (asyncpg): use the gateway's method"
        if isinstance(fn, ast.Attribute) and fn.attr in _QUERY_METHODS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if first.value not in names:
                    yield f"{where}:{node.lineno} runs {first.value!r}, which is no named query"
            elif not isinstance(first, (ast.Name, ast.Starred)):
                yield f"{where}:{node.lineno} .{fn.attr}() takes a query name, not {ast.unparse(first)[:40]}"


def test_sql_only_in_record_store() -> None:
    """No SQL string and no direct asyncpg call outside fencepost/core/record.py: callers name a
    query of sql/queries*.sql and the gateway runs it (one error mapping for every call)."""
    names = query_names()
    problems = [v for path, tree in _sources() for v in _violations(path, tree, names)]
    assert not problems, "\n".join(problems)


def test_the_checks_catch_what_they_are_for() -> None:
    """The walker itself: each kind of bypass is reported (so a passing test means something)."""
    src = '''
import asyncpg
from fencepost.core.record import query

async def bad(db, conn, pool):
    await conn.fetch(query("get_run"), 1)
    await db.pool.fetchval("SELECT 1")
    await asyncpg.connect("postgresql://")
    await conn.copy_records_to_table("runs", records=[])
    await db.fetch("no_such_query")
    await db.execute(f"DELETE FROM runs WHERE id = {1}")
    sql = "select id from runs"
    fine = "could not create database x; select a queue from the list"
    ok = await db.fetchrow("get_run", 1)
    await pipe.execute()
'''
    found = list(_violations(ROOT / "scheduler" / "x.py", ast.parse(src), query_names()))
    for needle in ("imports query", "calls query()", ".pool", "asyncpg.connect", ".copy_records_to_table()",
                   "'no_such_query'", "DELETE FROM", "select id from runs"):
        assert any(needle in f for f in found), (needle, found)
    assert not any(f".py:{n} " in f for n in (13, 14, 15) for f in found), found


def test_every_named_query_is_used_and_every_used_name_exists() -> None:
    """A name passed to the gateway exists (else the call fails only when it runs), and every
    query in sql/queries*.sql is passed somewhere (else it is dead SQL nobody maintains)."""
    names = query_names()
    used: set[str] = set()
    for _, tree in _sources(record=True):  # the record store runs a few itself (store_definitions)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):  # a name given to the gateway, or to a helper that forwards it
                used.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                            and a.value in names)
    unknown = [v for path, tree in _sources() for v in _violations(path, tree, names) if "no named query" in v]
    assert not unknown, "\n".join(unknown)
    assert names - used == set(), f"named queries nobody runs: {sorted(names - used)}"
