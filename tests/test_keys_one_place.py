"""Every per-queue Redis key comes from `fencepost.core.keys` (issue 25): Python's `Keys` and the Lua
scripts read the same table (QUEUE_SUFFIXES, rendered into the scripts as `KEY`), and no script
spells a key suffix of its own."""

from __future__ import annotations

import re
from pathlib import Path

from fencepost.core.hot import SCRIPT_NAMES, render
from fencepost.core.keys import QUEUE_SUFFIXES, Keys, lua_keys

LUA = Path(__file__).resolve().parent.parent / "lua"


def _code(path: Path) -> str:
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


def test_no_script_builds_a_key_from_a_string_of_its_own() -> None:
    found = [f"{p.relative_to(LUA)}: {m.group(0)}" for p in sorted(LUA.rglob("*.lua"))
             for m in re.finditer(r"BASE\s*\.\.\s*['\"][^'\"]*['\"]", _code(p))]
    assert not found, found


def test_every_script_gets_the_key_table_and_keys_py_builds_the_same_keys() -> None:
    table = lua_keys()
    for name in SCRIPT_NAMES:
        src = render(name)
        if "@include common" in (LUA / f"{name}.lua").read_text() or "local BASE" in src:
            assert table in src and "-- @queue_keys" not in src, name
    k = Keys("fp", "q")
    assert k.base + QUEUE_SUFFIXES["due"] == k.due and k.run(7) == k.base + QUEUE_SUFFIXES["run"] + "7"
    assert k.tenant_due("t") == k.base + QUEUE_SUFFIXES["tenant_due"] + "t"
    assert k.rate_window("") == k.base + QUEUE_SUFFIXES["rw"] and k.rate_window("x") == k.base + "rw:x"
    used = {m for p in LUA.rglob("*.lua") for m in re.findall(r"KEY\.(\w+)", _code(p))}
    assert used <= set(QUEUE_SUFFIXES), used - set(QUEUE_SUFFIXES)
