"""State groups are declared once (fencepost.core.states.GROUPS): Lua gets them rendered, and the
SQL CHECK constraints, the named queries and the Lua scripts are checked against them here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import asyncpg

from fencepost.core.hot import render
from fencepost.core.states import ACTIVE, FINISHED, GROUPS, UNCLAIMED, Status, lua_source

ROOT = Path(__file__).resolve().parent.parent
_IN_LIST = re.compile(r"status\s+(?:NOT\s+)?IN\s*\(((?:\s*'[A-Z_]+'\s*,?)+)\)", re.I)
_NAMES = re.compile(r"'([A-Z_]+)'")
_STATUS_VALUES = {s.value for s in Status}


def _groups_by_members() -> dict[frozenset[str], str]:
    return {frozenset(s.value for s in g): name for name, g in GROUPS.items()}


def _in_lists(sql: str) -> list[frozenset[str]]:
    return [frozenset(_NAMES.findall(m.group(1))) for m in _IN_LIST.finditer(sql)]


async def test_check_constraints_are_the_declared_groups(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint "
                                "WHERE conrelid = 'runs'::regclass AND contype = 'c'")
    finally:
        await conn.close()
    defs = {r["conname"]: r["def"] for r in rows}

    def members(name: str) -> frozenset[str]:
        return frozenset(_NAMES.findall(defs[name])) & _STATUS_VALUES

    assert members("leased_iff_active") == {s.value for s in ACTIVE}
    assert members("finished_iff_terminal") == {s.value for s in FINISHED}
    assert members("claimed_has_attempt") == {s.value for s in UNCLAIMED}
    status_check = next(d for d in defs.values() if "BLOCKED" in d and "RETRY_WAIT" in d and "TIMED_OUT" in d)
    assert frozenset(_NAMES.findall(status_check)) == _STATUS_VALUES, "the status CHECK lists every state"


def test_every_status_list_in_named_queries_is_a_group() -> None:
    known = _groups_by_members()
    for path in sorted((ROOT / "sql").glob("queries*.sql")):
        for members in _in_lists(path.read_text()):
            if len(members) < 2:
                continue
            assert members in known, f"{path.name}: status IN {sorted(members)} is no group of fencepost.core.states"


def test_lua_names_groups_instead_of_listing_states() -> None:
    """`st == 'RUNNING' or st == 'STOPPING'` is how a group gets restated; scripts write ACTIVE[st]."""
    chain = re.compile(r"==\s*'([A-Z_]+)'\s+or\s+[\w\[\]\d]+\s*==\s*'([A-Z_]+)'")
    neg = re.compile(r"~=\s*'([A-Z_]+)'\s+and\s+[\w\[\]\d]+\s*~=\s*'([A-Z_]+)'")
    for path in sorted((ROOT / "lua").rglob("*.lua")):
        for pattern in (chain, neg):
            for m in pattern.finditer(path.read_text()):
                if {m.group(1), m.group(2)} <= _STATUS_VALUES:
                    raise AssertionError(f"{path.name}: {m.group(0)!r} lists states; use a group from GROUPS")


def test_groups_are_rendered_into_every_script() -> None:
    src = lua_source()
    for name, group in GROUPS.items():
        line = next(ln for ln in src.splitlines() if ln.startswith(f"local {name} = "))
        assert set(re.findall(r"(\w+) = true", line)) == {s.value for s in group}
    assert "local ACTIVE = {" in render("finish_runs")


def test_python_names_groups_instead_of_listing_states() -> None:
    """No set, tuple or list of two or more state names outside the state module."""
    for base in ("scheduler", "worker", "reconciler"):
        for path in sorted((ROOT / base).rglob("*.py")):
            if path.name == "states.py" or ("api" in path.parts and path.name in ("schemas.py", "openapi.py")):
                continue  # the API schema spells out the enum for clients
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
                    names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                    hits = [n for n in names if n in _STATUS_VALUES]
                    assert len(hits) < 2 or len(hits) != len(node.elts), \
                        f"{path.relative_to(ROOT)}:{node.lineno} restates a group of states {hits}"
