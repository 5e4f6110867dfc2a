"""The typed gateways are the only paths to the stores: every SQL statement is a named query run by
fencepost.core.record (the record store), and every Lua call goes through fencepost.core.hot (the hot
store) with the layout its script's header declares."""

from __future__ import annotations

import ast
import asyncio
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from fencepost.core.hot import CONTRACTS, SCRIPT_NAMES, Contract, ControlArgs, FinishArgs, Lease, Scripts
from fencepost.core.keys import Keys
from fencepost.core.record import query_names
from fencepost.core.resources import resource_dir

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
_QUERY_METHODS = {"fetch", "fetchrow", "fetchval", "execute", "executemany", "rows"}
"""Gateway methods whose first argument is a query name (asyncpg's take SQL there). `rows` is the typed
read (core/record.row_type); its single-row twin `row` is left out: local helpers above the core take
that name too."""
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


# -- the hot store: every Lua call's layout declared once, checked against the script headers -----

LUA = resource_dir("lua")
_TAG = re.compile(r"^-- @(keys|argv|each|returns)(?: (.*))?$")
_WIRE_TYPES = (int, str, bytes, float, int | str, bytes | str)
"""What an ARGV field may hold: what Redis takes as an argument ('' where a script reads none)."""


def _header_problems(name: str, source: str, contract: Contract) -> list[str]:
    """Where one script's header or code disagrees with its contract in the gateway."""
    lines = source.splitlines()
    header = list(itertools.takewhile(lambda ln: ln.startswith("--"), lines))
    problems: list[str] = []
    tags: dict[str, str] = {}
    for line in header:  # a tag repeated on the next line continues it
        m = _TAG.match(line)
        if m:
            tags[m.group(1)] = " ".join(f"{tags.get(m.group(1), '')} {m.group(2) or ''}".split())
    if tags != contract.layout():
        problems.append(f"{name}.lua header says {tags}, the gateway {contract.layout()}")
    code = "\n".join(ln.split("--")[0] for ln in lines[len(header):])
    head = len(contract.head.__struct_fields__) if contract.head is not None else 0
    each = len(contract.each.__struct_fields__) if contract.each is not None else 0
    loops = re.findall(r"for i = (\d+), #ARGV(?:, (\d+))? do", code)
    want = [(str(head + 1), str(each) if each > 1 else "")] if each else []
    if loops != want:
        problems.append(f"{name}.lua walks ARGV as {loops}, the gateway lays out {head} fields then {each} per item")
    beyond = sorted(i for i in {int(x) for x in re.findall(r"ARGV\[(\d+)\]", code)} if i > head)
    if beyond:
        problems.append(f"{name}.lua reads ARGV{beyond}, beyond the {head} fixed fields")
    used = {int(k) for k in re.findall(r"KEYS\[(\d+)\]", code)}
    if contract.keys == ("queue",):
        if "-- @include common" not in lines or used:
            problems.append(f"{name}.lua takes the queue's keys: it includes common and names no KEYS[n] itself")
    elif used != set(range(1, len(contract.keys) + 1)):
        problems.append(f"{name}.lua uses KEYS{sorted(used)}, the gateway passes {contract.keys}")
    for part in (contract.head, contract.each):
        for f in msgspec.structs.fields(part) if part is not None else ():
            if f.type not in _WIRE_TYPES:
                problems.append(f"{name}: ARGV field {f.name} is {f.type}, not a value Redis takes")
    return problems


def test_lua_headers_match_gateway() -> None:
    """Each lua/<script>.lua header states its calling convention in up to four tagged lines
    (a long one goes on in a second line with the same tag):
        -- @keys queue          the queue's keys (Keys.script_keys), or the explicit keys' names
        -- @argv now limit ...  the fixed ARGV fields, in order (absent: none)
        -- @each id token       the ARGV fields repeated per item after them (absent: no items)
        -- @returns X           int | str | bool | [int] | {a b} (one record) | [a b c] (a record per stride)
    fencepost.core.hot.CONTRACTS declares the same with Structs (field names and order), and the
    code agrees: its ARGV loop starts after the head with the item's stride, and it reads no
    fixed ARGV beyond the head."""
    assert sorted(CONTRACTS) == sorted(SCRIPT_NAMES), "every script in lua/ has a contract, and only those"
    problems = [p for name, c in CONTRACTS.items()
                for p in _header_problems(name, (LUA / f"{name}.lua").read_text(), c)]
    assert not problems, "\n".join(problems)


def test_lua_header_check_catches_drift() -> None:
    """The check itself: a renamed field, a changed stride or a missing line is reported."""
    contract = CONTRACTS["renew_leases"]
    good = (LUA / "renew_leases.lua").read_text()
    assert _header_problems("renew_leases", good, contract) == []
    for bad, needle in ((good.replace("-- @each id token", "-- @each id tok"), "header says"),
                        (good.replace("-- @argv lease_ms\n", ""), "header says"),
                        (good.replace("for i = 2, #ARGV, 2 do", "for i = 2, #ARGV, 3 do"), "walks ARGV"),
                        (good.replace("tonumber(ARGV[1])", "tonumber(ARGV[4])"), "beyond the 1 fixed"),
                        (good.replace("-- @returns [result]", "-- @returns [result ctl]"), "header says")):
        assert bad != good
        assert any(needle in p for p in _header_problems("renew_leases", bad, contract)), needle


def test_gateway_refuses_a_layout_it_does_not_declare() -> None:
    """A typed method checks the Structs it is given against the script's contract (one place)."""
    scripts = Scripts(aioredis.Redis())
    keys = Keys("t", "q")
    with pytest.raises(TypeError, match="cancel_run takes"):
        asyncio.run(scripts.control_run("cancel", keys, ControlArgs(2, "a", "", "")))
    with pytest.raises(TypeError, match="finish_runs takes"):
        asyncio.run(scripts.finish_runs(keys, FinishArgs(3), [Lease(1, 2)]))  # type: ignore[list-item]


_HOT = ROOT / "scheduler" / "core" / "hot.py"
_RAW_REDIS_SCRIPTING = {"register_script", "eval", "evalsha", "eval_ro", "evalsha_ro", "script_load", "fcall"}


def _lua_bypasses(path: Path, tree: ast.Module) -> Iterator[str]:
    where = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        fn = node.func
        if fn.attr in _RAW_REDIS_SCRIPTING:
            yield f"{where}:{node.lineno} calls .{fn.attr}(): Lua runs only through fencepost.core.hot"
        if fn.attr == "run" and isinstance(fn.value, ast.Attribute) and fn.value.attr == "scripts":
            yield f"{where}:{node.lineno} calls scripts.run(): use the gateway's typed method"
        if fn.attr == "run" and node.args and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in SCRIPT_NAMES:
            yield f"{where}:{node.lineno} runs {node.args[0].value!r} by name: use the gateway's typed method"


def test_lua_only_through_typed_methods() -> None:
    """Above the core nothing builds an ARGV list or reads a reply by index: no code outside
    fencepost/core/hot.py runs a script by name or registers one."""
    problems = [p for path, tree in _sources() if path != _HOT for p in _lua_bypasses(path, tree)]
    assert not problems, "\n".join(problems)
    caught = list(_lua_bypasses(ROOT / "worker" / "x.py", ast.parse(
        'await stores.scripts.run("claim_due", k, [1])\nawait s.run("finish_runs", k, [])\nr.register_script("")\n'
        'await stores.scripts.claim_due(k, args)\n')))
    assert len(caught) == 4 and not any(":4 " in c for c in caught), caught
