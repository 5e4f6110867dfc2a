"""The import graph: layers import downward only, no cycles, no function-level imports hiding one.

    faces      fencepost.cli, fencepost.api, fencepost.dev (and the `fencepost` package itself)
    services   fencepost.client (+ control, workflows, schedules, apiclient) | fencepost.worker |
               fencepost.reconciler | fencepost.trigger        -- each on the core, not on each other
    core       fencepost.core                                   -- imports nothing above it
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
