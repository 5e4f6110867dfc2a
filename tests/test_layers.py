"""The import graph: layers import downward only, no cycles, no function-level imports hiding one.

    faces      fencepost.cli, fencepost.api, fencepost.dev (and the `fencepost` package itself)
    services   fencepost.client (+ control, workflows, schedules, apiclient) | fencepost.worker |
               fencepost.reconciler | fencepost.trigger        -- each on the core, not on each other
    core       fencepost.core                                   -- imports nothing above it
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

from fencepost.core.record import query_names
from fencepost.core.states import Status

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"scheduler": "fencepost", "worker": "fencepost.worker", "reconciler": "fencepost.reconciler"}
CLIENT = {"fencepost.client", "fencepost.control", "fencepost.workflows", "fencepost.schedules", "fencepost.apiclient"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def layer(module: str) -> str:
    """The layer a module belongs to."""
    if module.startswith("fencepost.core"):
        return "core"
    if module in CLIENT:
        return "client"
    for name in ("worker", "reconciler", "trigger", "cli", "api", "dev"):
        if module == f"fencepost.{name}" or module.startswith(f"fencepost.{name}."):
            return name
    return "root"  # fencepost/__init__ (lazy public names, __version__) and __main__: the public face


ALLOWED = {
    "core": {"core"},
    "client": {"core", "client"},
    "worker": {"core", "worker"},
    "reconciler": {"core", "reconciler"},
    "trigger": {"core", "trigger"},
    "api": {"core", "client", "api", "root"},
    "dev": {"core", "client", "worker", "reconciler", "trigger", "api", "dev", "root"},
    "cli": {"core", "client", "worker", "reconciler", "trigger", "api", "dev", "cli", "root"},
    "root": {"core", "client", "worker", "reconciler", "trigger", "api", "dev", "cli", "root"},
}


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str, path: Path, known: dict[str, Path]) -> tuple[set[str], list[tuple[int, str]]]:
    """(module-level fencepost imports, [(line, name)] of fencepost imports inside functions or classes)."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    inner: list[tuple[int, str]] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        assert node.level == 0, f"{path}:{node.lineno}: relative import (write fencepost.… absolutely)"
        base = node.module or ""
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]

    def visit(nodes: list[ast.stmt], nested: bool) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in targets(node):
                    if t == "fencepost" or t.startswith("fencepost."):
                        (inner.append((node.lineno, t)) if nested else top.add(t))
            elif isinstance(node, ast.If) and _is_type_checking(node):
                continue  # annotations only; never executed
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(node.body, True)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    child = getattr(node, field, None)
                    if isinstance(child, list):
                        visit([c for c in child if isinstance(c, ast.stmt)] +
                              [s for h in child if isinstance(h, ast.ExceptHandler) for s in h.body], nested)

    visit(tree.body, False)
    return top, inner


def _graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[int, str]]]]:
    known = _modules()
    graph, inner = {}, {}
    for module, path in known.items():
        top, nested = _imports(module, path, known)
        graph[module] = {t for t in top if t in known and t != module}
        if nested:
            inner[module] = nested
    return graph, inner


def test_no_function_level_imports() -> None:
    _, inner = _graph()
    assert not inner, "imports hidden inside functions (move them to the top; if that makes a cycle, " \
                      f"the layering is wrong): {inner}"


def test_layers_import_downward_only() -> None:
    graph, _ = _graph()
    bad = [f"{m} ({layer(m)}) imports {t} ({layer(t)})" for m, ts in sorted(graph.items()) for t in sorted(ts)
           if layer(t) not in ALLOWED[layer(m)]]
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    graph, _ = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                cycles.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    assert not cycles, f"import cycles: {cycles}"


def test_core_loads_nothing_above_it() -> None:
    """The core is importable alone: importing it loads nothing from the layers above."""
    code = ("import sys, fencepost.core.hot, fencepost.core.record, fencepost.core.stores, fencepost.core.states;"
            "print(sorted(m for m in sys.modules if m.startswith('fencepost.') and not m.startswith('fencepost.core')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out


FACE_LIBRARIES = {"click", "fastapi", "starlette", "uvicorn"}
"""Command-line and web libraries belong to the faces; a producer importing the client never loads them."""


def test_below_the_faces_nothing_imports_a_face_library() -> None:
    bad = []
    for module, path in _modules().items():
        if layer(module) in ("cli", "api", "dev", "root"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{module}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in FACE_LIBRARIES]
    assert not bad, bad


# -- no back doors above the gateways (STYLE habit 18) ------------------------------------------------

REDIS_COMMANDS = frozenset({
    "hget", "hmget", "hgetall", "hset", "hdel", "hincrby", "set", "get", "delete", "exists", "zadd", "zcard",
    "zrange", "zrangebyscore", "zrem", "zscore", "zcount", "xadd", "xrange", "xrevrange", "xreadgroup", "xack",
    "xgroup_create", "xautoclaim", "xtrim", "xlen", "xinfo_groups", "xinfo_stream", "xpending", "xpending_range",
    "xdel", "smembers", "sadd", "srem", "scard", "sismember", "rpush", "lpush", "blpop", "brpop", "lrange", "llen",
    "expire", "pexpire", "ttl", "pttl", "scan_iter", "scan", "unlink", "pipeline", "eval", "evalsha",
    "execute_command", "time", "config_get", "config_set", "info", "ping", "incr", "incrby", "mget", "keys",
    "flushdb", "publish", "wait", "script_load", "register_script",
})
"""redis-py methods: a call of one on a Redis client or pipeline above the core is a back door. Found by
the receiver (an expression ending in `redis`, or a name bound from one, `connect(...)`, `.pipeline()` or `.client()`):
a heuristic that misses a client kept under another attribute name, never a false alarm on a dict."""

RAW_REDIS_OFFENDERS: dict[str, int] = {}
"""Known offenders (issue 25) with their count of raw calls today: each count may only go down, and a
module not listed may have none. Remove an entry when its module reaches 0 (the test says so)."""


def _redis_receivers(tree: ast.AST) -> set[str]:
    """Names bound to a Redis client or pipeline in a module: assigned from an expression that
    mentions `redis`, `connect(`, `.pipeline(` or `.client(` (dev/faults.PrivateRedis.client())."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.withitem)):
            value = node.context_expr if isinstance(node, ast.withitem) else node.value
            targets = [node.optional_vars] if isinstance(node, ast.withitem) else \
                node.targets if isinstance(node, ast.Assign) else [node.target]
            text = ast.unparse(value) if value is not None else ""
            if "redis" in text.lower() or "connect(" in text or ".pipeline(" in text or ".client(" in text:
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def raw_redis_calls() -> dict[str, list[int]]:
    """Lines of redis-py calls above the core, per module."""
    out: dict[str, list[int]] = {}
    for module, path in sorted(_modules().items()):
        if layer(module) == "core":
            continue
        tree = ast.parse(path.read_text())
        receivers = _redis_receivers(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REDIS_COMMANDS:
                recv = ast.unparse(node.func.value)
                last = recv.rsplit(".", 1)[-1]
                if "redis" in last.lower() or (isinstance(node.func.value, ast.Name) and recv in receivers):
                    out.setdefault(module, []).append(node.lineno)
    return out


def test_no_raw_redis_calls_above_the_core() -> None:
    """Every Redis read and write above the core goes through core/hot.py's typed methods (Scripts,
    Scripts.peek) or another core function: no new raw redis-py call, and the known ones only shrink."""
    found = raw_redis_calls()
    new = {m: lines for m, lines in found.items() if len(lines) > RAW_REDIS_OFFENDERS.get(m, 0)}
    assert not new, f"raw redis-py calls above the core (use a typed method of core/hot.py): {new}"
    done = sorted(m for m in RAW_REDIS_OFFENDERS if m not in found)
    assert not done, f"no raw redis-py calls left in {done}: remove them from RAW_REDIS_OFFENDERS"


RECORD_ROW_OFFENDERS: dict[str, int] = {
    "fencepost.core.submit": 1,
}
"""Untyped record reads (issue 25) allowed outside core/record.py, per module: calls of `fetch` /
`fetchrow`, which hand an asyncpg Record over instead of the query's row Struct. The one left is the
bulk submit's `insert_runs_fresh`, unpacked by position (`ord, id, queue, epoch`: no string key) on
the path where each converted row would cost a tuple and a convert per submitted run. Every other read,
in the core and above it, is `Database.rows` / `row`; a count may only go down and an entry at 0 is
removed."""


def record_row_calls(tree: ast.AST) -> list[int]:
    """Lines of `.fetch(` / `.fetchrow(` calls on the record gateway in a module: on a receiver named
    `db` (`db`, `self.db`, `stores.db`...) or with a named query as the first argument (a Session,
    a chaos ledger's Database): the gateway's untyped reads."""
    names = query_names()
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("fetch", "fetchrow"):
            recv = node.func.value
            last = recv.attr if isinstance(recv, ast.Attribute) else recv.id if isinstance(recv, ast.Name) else ""
            first = node.args[0] if node.args else None
            if last == "db" or (isinstance(first, ast.Constant) and first.value in names):
                lines.append(node.lineno)
    return lines


def record_rows_above_the_core() -> dict[str, list[int]]:
    """Untyped record reads everywhere but the gateway itself (core/record.py), the core included."""
    out: dict[str, list[int]] = {}
    for module, path in sorted(_modules().items()):
        if module != "fencepost.core.record" and (lines := record_row_calls(ast.parse(path.read_text()))):
            out[module] = lines
    return out


def test_no_new_untyped_record_reads_above_the_core() -> None:
    """Rows outside the gateway are the query's Struct (`Database.rows` / `row`), read by attribute: no new
    `fetch` / `fetchrow` of a Record to read by string key, and the known ones only shrink."""
    found = record_rows_above_the_core()
    new = {m: lines for m, lines in found.items() if len(lines) > RECORD_ROW_OFFENDERS.get(m, 0)}
    assert not new, f"untyped record reads outside core/record.py (use Database.rows / row): {new}"
    done = sorted(m for m in RECORD_ROW_OFFENDERS if m not in found)
    assert not done, f"no untyped record reads left in {done}: remove them from RECORD_ROW_OFFENDERS"


def test_an_untyped_record_read_is_found() -> None:
    planted = ast.parse(
        "async def f(stores, db, s):\n"
        "    a = await stores.db.fetch('run_events', 1)\n"
        "    b = await db.fetchrow(name, 1)\n"
        "    c = await s.fetch('run_events', 1)\n"
        "    d = await stores.db.rows('run_events', 1)\n"
        "    e = await cache.fetch('key')\n")
    assert record_row_calls(planted) == [2, 3, 4]


RESTATED_GROUP_OFFENDERS: dict[str, int] = {}
"""Known restated state groups (issue 25), per module: the counts only go down. (The last two, the
API's Status Literal in api/schemas.py and api/openapi.py, became core/states.Status.)"""


def restated_groups() -> dict[str, list[int]]:
    """Lines of tuple / set / list literals of two or more state names (str, bytes or Status.X)
    outside core/states.py, per module: a state group written out again instead of imported."""
    names = {s.value for s in Status}
    out: dict[str, list[int]] = {}
    for module, path in sorted(_modules().items()):
        if module == "fencepost.core.states":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Tuple, ast.Set, ast.List)) or len(node.elts) < 2:
                continue
            values: list[str] = []
            for e in node.elts:
                if isinstance(e, ast.Constant) and isinstance(e.value, (str, bytes)):
                    values.append(e.value.decode() if isinstance(e.value, bytes) else e.value)
                elif isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in ("Status", "S"):
                    values.append(e.attr)
                else:
                    break
            else:
                if all(v in names for v in values):
                    out.setdefault(module, []).append(node.lineno)
    return out


def test_no_restated_state_groups() -> None:
    """A group of states is imported from core/states.py (TERMINAL, ACTIVE, DEAD, ...), never spelt
    again: a copy drifts when the table changes (issue 25 found (b"RUNNING", b"STOPPING") for ACTIVE)."""
    found = restated_groups()
    new = {m: lines for m, lines in found.items() if len(lines) > RESTATED_GROUP_OFFENDERS.get(m, 0)}
    assert not new, f"state groups spelt out instead of imported from fencepost.core.states: {new}"
    done = sorted(m for m in RESTATED_GROUP_OFFENDERS if m not in found)
    assert not done, f"no restated groups left in {done}: remove them from RESTATED_GROUP_OFFENDERS"


STATIC = ROOT / "scheduler" / "api" / "static"
"""The dashboard: its states and groups come from GET /v1/states (routes_ops.state_groups, rendered from
core/states.py) into STATES / COMMANDS / LISTS; none is typed into the page."""


def _script_strings(text: str) -> list[tuple[int, int, str]]:
    """(start, end, value) of a script's string literals, comments skipped (a lexer for what the
    dashboard's scripts hold: no regular-expression literal with a quote in it)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            i = text.find("*/", i + 2)
            i = n if i < 0 else i + 2
        elif c in "\"'`":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append((i, j + 1, text[i + 1:j]))
            i = j + 1
        else:
            i += 1
    return out


def restated_groups_in_script(text: str) -> list[str]:
    """Two or more state names as whole string literals in one expression of a script (an array, an
    `||` chain, an `includes` list): nothing but expression characters between them (no `;`, `{`, `}`).
    One name alone (`run.status === "PENDING"`) is a state, not a group."""
    names = {s.value for s in Status}
    found = [lit for lit in _script_strings(text) if lit[2] in names]
    out = []
    for (_, end, first), (start, _, second) in itertools.pairwise(found):
        if not set(text[end:start]) & set(";{}"):
            out.append(f"line {text.count(chr(10), 0, end) + 1}: {first!r} with {second!r}")
    return out


def test_the_dashboard_takes_every_state_group_from_the_rendered_states() -> None:
    bad = {f"{path.name} {hit}" for path in sorted(STATIC.iterdir()) if path.suffix in (".js", ".html")
           for hit in restated_groups_in_script(path.read_text())}
    assert not bad, f"state groups typed into the dashboard (use STATES / COMMANDS / LISTS from /v1/states): {bad}"


def test_a_group_typed_into_a_script_is_found_and_one_state_is_not() -> None:
    assert restated_groups_in_script('if (["FAILED", "TIMED_OUT"].includes(run.status)) x();')
    assert restated_groups_in_script("const busy = s === 'RUNNING' ||\n  s === 'STOPPING';")
    assert not restated_groups_in_script('const due = run.status === "PENDING"; const b = s === "RUNNING";')
    assert not restated_groups_in_script('el("span", {}, `${run.status}`); note("RETRY_WAIT runs")')


# -- one submit path (issue 25: prepare -> insert -> enqueue was written four times) ---------------------

SUBMIT_PATH = "fencepost.core.submit"
INSERT_STATEMENTS = frozenset({"insert_runs", "insert_runs_fresh", "insert_runs_keyed"})
REENQUEUERS = {"fencepost.reconciler.drift": 2}
"""Callers of Scripts.enqueue_runs besides the submit path, with their count: drift repair puts runs
PostgreSQL recorded back into a Redis that lost them (one batch, then one run at a time), not a submit."""


def submit_path_copies() -> dict[str, list[str]]:
    """Per module outside core/submit.py: the insert statements it names and its enqueue_runs calls."""
    out: dict[str, list[str]] = {}
    for module, path in sorted(_modules().items()):
        if module in (SUBMIT_PATH, "fencepost.core.hot"):  # the path itself; the gateway that defines the call
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in INSERT_STATEMENTS:
                out.setdefault(module, []).append(f"{node.lineno}: {node.value}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "enqueue_runs":
                out.setdefault(module, []).append(f"{node.lineno}: enqueue_runs")
    return out


def test_runs_are_inserted_and_enqueued_by_one_submit_path() -> None:
    """The client, workflows, batches, schedule run-now and the trigger's fires all insert through
    core/submit.py's SubmitPath (one set of checks) and reach Redis through its deliver(): a module
    naming an insert statement or calling enqueue_runs itself is a second copy of the submit path."""
    found = submit_path_copies()
    copies = {m: calls for m, calls in found.items()
              if any(not c.endswith("enqueue_runs") for c in calls)
              or sum(c.endswith("enqueue_runs") for c in calls) > REENQUEUERS.get(m, 0)}
    assert not copies, f"a second copy of the submit path (use fencepost.core.submit.SubmitPath): {copies}"


def test_the_clients_parts_hold_no_back_reference_to_the_client() -> None:
    """Client is composed of parts (Control, Workflows, Schedules on a shared SubmitPath), not mixins
    that declare under TYPE_CHECKING what Client provides: no client-layer module refers to
    fencepost.client, at run time or for the type checker."""
    bad = []
    for module, path in _modules().items():
        if layer(module) != "client" or module == "fencepost.client":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "fencepost.client":
                bad.append(f"{module}:{node.lineno}")
    assert not bad, bad


# -- rooms a newcomer can hold in their head (issue 25: no function over ~60 lines without a reason) -----

LONG_LINES = 60
LONG_MARKER = "Long because"
"""A function over LONG_LINES lines says why in its docstring, on a line starting with this."""

LONG_KNOWN: dict[str, int] = {}
"""Functions being split right now (issue 25), with their length then: each may only shrink, and an
entry goes once its function is LONG_LINES or fewer, or says why it is long (the test says so)."""


def unexplained_length(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int | None:
    """FN's length in lines when it is over LONG_LINES and its docstring has no line starting LONG_MARKER."""
    lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
    doc = ast.get_docstring(fn) or ""
    explained = any(ln.strip().startswith(LONG_MARKER) for ln in doc.splitlines())
    return lines if lines > LONG_LINES and not explained else None


def long_functions() -> dict[str, int]:
    """`module:Class.function` -> lines, of every function (methods and nested ones too) in scheduler/,
    worker/ and reconciler/ over LONG_LINES lines with no reason in its docstring."""
    out: dict[str, int] = {}

    def visit(module: str, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (lines := unexplained_length(child)) is not None:
                    out[f"{module}:{prefix}{child.name}"] = lines
                visit(module, child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(module, child, f"{prefix}{child.name}.")

    for module, path in sorted(_modules().items()):
        visit(module, ast.parse(path.read_text()), "")
    return out


def test_no_function_over_60_lines_without_a_reason() -> None:
    """Split a long function into named steps, or say on a docstring line starting "Long because" why
    it reads best whole (docs/testing.md); the known ones only shrink."""
    found = long_functions()
    new = {f: n for f, n in found.items() if n > LONG_KNOWN.get(f, LONG_LINES)}
    assert not new, f"functions over {LONG_LINES} lines with no '{LONG_MARKER} ...' line in their docstring: {new}"
    done = sorted(f for f in LONG_KNOWN if f not in found)
    assert not done, f"{done} are {LONG_LINES} lines or fewer now (or say why they are long): remove them from LONG_KNOWN"


def test_a_long_function_is_found_unless_its_docstring_says_why() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LONG_LINES - 1))
    tree = ast.parse(f"def short():\n{body}\n"
                     f'def long():\n    """Do it."""\n{body}\n'
                     f'async def why():\n    """Do it.\n\n    Long because one story."""\n{body}')
    found = {n.name: unexplained_length(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert found == {"short": None, "long": LONG_LINES + 1, "why": None}
