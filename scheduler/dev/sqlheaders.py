"""Write or check the headers of the named queries in sql/queries*.sql.

Each query declares its calling convention right after its name (`fencepost.core.record.QuerySpec`):

    -- name: run_events
    -- params: run_id int8
    -- returns: id int8, run_id int8, type text, ...

The types and result columns are what PostgreSQL reports when it prepares the statement on a
migrated database, so `--write` can fill them in; parameter names are read off the SQL where it
says what a parameter is (`col = $1`, an INSERT's column list, `unnest(...) AS t(cols)`, LIMIT),
and a name written by hand survives a rewrite while the count and types still match.
tests/test_sql_contracts.py runs the check.

    python -m fencepost.dev.sqlheaders --database-url postgresql://postgres@127.0.0.1/fp_x --write
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys

from fencepost.core.record import Prepared, QuerySpec, describe_queries, query_specs
from fencepost.core.resources import resource_dir

__all__ = ["declared_mismatches", "infer_names", "main", "with_headers"]

_NAME = re.compile(r"^-- name: (\w+)\s*$")
_HEADER = re.compile(r"^-- (params|returns|unchecked):")
_WIDTH = 110


_CMP = re.compile(r"([A-Za-z_][\w.]*)\s*\)?\s*(=|<>|!=|>=|<=|>|<|\bLIKE\b|\bILIKE\b|\bIN\b)\s*(?:ANY\s*\(\s*)?\(?"
                  r"\$(\d+)\b", re.I)
_CMP_REV = re.compile(r"\$(\d+)(?:::[\w\[\] ]+?)?\s*(=|<>|>=|<=|>|<)\s*(?:ANY\s*\(\s*)?([A-Za-z_][\w.]*)", re.I)
_BOUND = {">": "min_", ">=": "min_", "<": "max_", "<=": "max_"}
_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">="}
_UNNEST = re.compile(r"unnest\s*\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\)\s*(?:WITH\s+ORDINALITY\s+)?AS\s+\w+\s*"
                     r"\((?P<cols>[^)]*)\)", re.I | re.S)
_INSERT = re.compile(r"INSERT\s+INTO\s+\w+\s*\((?P<cols>[^)]*)\)\s*VALUES\s*\((?P<vals>[^;]*?)\)\s*(?:ON|RETURNING|;|\)|,|$)",
                     re.I | re.S)
_INSERT_SELECT = re.compile(r"INSERT\s+INTO\s+\w+(?:\s+AS\s+\w+)?\s*\((?P<cols>[^)]*)\)\s*SELECT\s+(?P<list>.*?)\s+FROM\s+"
                            r"(?P<rest>unnest\s*\((?P<args>[^()]*(?:\([^()]*\)[^()]*)*)\))?", re.I | re.S)
_TUPLE_IN = re.compile(r"\((?P<cols>[\w., ]+)\)\s+IN\s*\(\s*SELECT\s+\*\s+FROM\s+unnest\s*\((?P<args>[^()]*)\)", re.I)
_ROW_CMP = re.compile(r"\((?P<cols>[^()]*(?:\([^()]*\)[^()]*)*)\)\s*(?:<=|>=|<|>)\s*\((?P<vals>\$\d+[^()]*)\)")
_COALESCE = re.compile(r"COALESCE\(\s*(?:\w+\.)?(\w+)\s*,\s*\$(\d+)\b", re.I)
_LIMIT = re.compile(r"\b(LIMIT|OFFSET)\s+\$(\d+)", re.I)
_KEYWORDS = {"and", "or", "not", "null", "is", "case", "when", "then", "else", "select", "where", "set"}


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def infer_names(sql: str, count: int) -> list[str]:
    """A name for each of COUNT parameters, read off SQL where it says (else `p<n>`)."""
    body = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())
    names: dict[int, str] = {}

    def put(n: int, name: str) -> None:
        name = name.rsplit(".", 1)[-1].lower()
        if 1 <= n <= count and n not in names and name not in _KEYWORDS and not name.isdigit():
            names[n] = name

    for m in _UNNEST.finditer(body):
        args, cols = _split_top(m.group("args")), _split_top(m.group("cols"))
        for a, c in zip(args, cols, strict=False):
            if (pm := re.fullmatch(r"\$(\d+)(?:::.*)?", a, re.S)):
                put(int(pm.group(1)), c)
    for m in _INSERT.finditer(body):
        cols, vals = _split_top(m.group("cols")), _split_top(m.group("vals"))
        for c, v in zip(cols, vals, strict=False):
            if (pm := re.fullmatch(r"\$(\d+)(?:::.*)?", v, re.S)):
                put(int(pm.group(1)), c)
    for m in _INSERT_SELECT.finditer(body):
        cols = _split_top(m.group("cols"))
        items = _split_top(m.group("args")) if m.group("list").strip().startswith("*") and m.group("args") \
            else _split_top(m.group("list"))
        for c, v in zip(cols, items, strict=False):
            if (pm := re.fullmatch(r"\$(\d+)(?:::.*)?", v, re.S)):
                put(int(pm.group(1)), c)
    for m in _TUPLE_IN.finditer(body):
        for c, a in zip(_split_top(m.group("cols")), _split_top(m.group("args")), strict=False):
            if (pm := re.fullmatch(r"\$(\d+)(?:::.*)?", a, re.S)):
                put(int(pm.group(1)), c)
    for m in _ROW_CMP.finditer(body):  # (a, b) < ($5, $6): a keyset cursor's row
        vals = _split_top(m.group("vals"))
        for c, v in zip(_split_top(m.group("cols")), vals, strict=False):
            if (pm := re.fullmatch(r"\$(\d+)(?:::.*)?", v, re.S)):
                col = re.sub(r"\W+", "_", c.split("(")[-1].split(",")[0].strip().rsplit(".", 1)[-1]).strip("_")
                put(int(pm.group(1)), f"cursor_{col or pm.group(1)}")
    for m in _COALESCE.finditer(body):  # COALESCE(t.col, $n): the value for every row that has none
        put(int(m.group(2)), f"every_{m.group(1)}")
    for m in _LIMIT.finditer(body):
        put(int(m.group(2)), m.group(1))
    for m in _CMP.finditer(body):  # col >= $n: the least col wanted, so min_col
        put(int(m.group(3)), _BOUND.get(m.group(2), "") + m.group(1).rsplit(".", 1)[-1])
    for m in _CMP_REV.finditer(body):
        put(int(m.group(1)), _BOUND.get(_FLIP.get(m.group(2), ""), "") + m.group(3).rsplit(".", 1)[-1])
    out, seen = [], set()
    for n in range(1, count + 1):
        name = names.get(n, f"p{n}")
        base, i = name, 2
        while name in seen:
            name, i = f"{base}_{i}", i + 1
        seen.add(name)
        out.append(name)
    return out


def declared_mismatches(spec: QuerySpec | None, found: Prepared) -> list[str]:
    """How the header SPEC differs from what PostgreSQL reported (empty: it matches)."""
    if spec is None:
        return [f"{found.name}: no header (-- params: / -- returns:)"]
    if not spec.checked:
        return []
    if found.error:
        return [f"{found.name}: PostgreSQL cannot prepare it ({found.error}); declare `-- unchecked: why`"]
    out = []
    if tuple(c.type for c in spec.params) != found.param_types:
        out.append(f"{found.name}: params declared {[c.type for c in spec.params]}, PostgreSQL has "
                   f"{list(found.param_types)}")
    if spec.returns != found.returns:
        out.append(f"{found.name}: returns declared {[f'{c.name} {c.type}' for c in spec.returns]}, PostgreSQL has "
                   f"{[f'{c.name} {c.type}' for c in found.returns]}")
    return out


def _wrap(key: str, items: list[str]) -> list[str]:
    if not items:
        return [f"-- {key}: nothing" if key == "returns" else f"-- {key}: none"]
    lines, cur = [], f"-- {key}: "
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if len(cur) + len(piece) > _WIDTH and cur != f"-- {key}: ":
            lines.append(cur.rstrip())
            cur = f"-- {key}: "
        cur += piece + " "
    lines.append(cur.rstrip())
    return lines


def _header(spec: QuerySpec | None, found: Prepared, sql: str) -> list[str]:
    if spec is not None and not spec.checked:
        return [f"-- unchecked: {spec.why}"]
    if found.error:
        return [f"-- unchecked: PostgreSQL cannot prepare it alone ({found.error[:80]})"]
    names = infer_names(sql, len(found.param_types))
    if spec is not None and len(spec.params) == len(found.param_types):
        names = [c.name if not re.fullmatch(r"p\d+", c.name) else n  # a name given by hand stays
                 for c, n in zip(spec.params, names, strict=True)]
    params = [f"{n} {t}" for n, t in zip(names, found.param_types, strict=True)]
    return _wrap("params", params) + _wrap("returns", [f"{c.name} {c.type}" for c in found.returns])


def with_headers(text: str, specs: dict[str, QuerySpec | None], found: dict[str, Prepared],
                 sources: dict[str, str]) -> str:
    """TEXT (one sql/queries*.sql file) with each known query's header right after its name line."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        m = _NAME.match(line)
        if m and m.group(1) in found:
            while i < len(lines) and _HEADER.match(lines[i]):
                i += 1  # the old header
            out.extend(_header(specs.get(m.group(1)), found[m.group(1)], sources[m.group(1)]))
    return "\n".join(out) + "\n"


async def _run(url: str, write: bool, files: set[str] | None) -> int:
    found = await describe_queries(url)
    sources = {name: p.source for name, p in found.items()}
    specs = query_specs()
    if write:
        changed = []
        for path in sorted(resource_dir("sql").glob("queries*.sql")):
            if (files is None or path.name in files) and (
                    text := with_headers(old := path.read_text(), specs, found, sources)) != old:
                path.write_text(text)
                changed.append(path.name)
        print(f"headers written: {', '.join(changed) or 'no change'}")
        return 0
    problems = [p for name in sources for p in declared_mismatches(specs.get(name), found[name])]
    print("\n".join(problems) or f"{len(sources)} query headers match the database")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fencepost.dev.sqlheaders", description=__doc__.splitlines()[0])
    ap.add_argument("--database-url", required=True, help="a database this command may migrate")
    ap.add_argument("--write", action="store_true", help="rewrite the headers from the database (else check)")
    ap.add_argument("files", nargs="*", help="with --write: only these files (e.g. queries_runs.sql)")
    args = ap.parse_args(argv)
    return asyncio.run(_run(args.database_url, args.write, set(args.files) or None))


if __name__ == "__main__":
    sys.exit(main())
