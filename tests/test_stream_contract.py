"""The stream entry's fields are declared once (fencepost.core.stream, issue 25): the scripts get the
set rendered into them and refuse a field it lacks, and every reader in Python asks only for
declared fields, so the Lua side and the recorder cannot drift apart unseen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.exceptions import ResponseError

from fencepost.client import Client
from fencepost.core.hot import render
from fencepost.core.stores import Stores
from fencepost.core.stream import field_names, lua_source

ROOT = Path(__file__).resolve().parent.parent
READERS = ["reconciler/recorder.py", "reconciler/drift.py", "reconciler/rebuild.py", "scheduler/core/views.py",
           "scheduler/dev/chaos_check.py"]
_ASKED = re.compile(r"""(?:\b(?:f|fields|entry|e)\s*(?:\[|\.get\(|\.pop\())\s*b["'](\w+)["']"""
                    r"""|b["'](\w+)["']\s+(?:not\s+)?in\s+(?:f|fields)\b""")


def test_every_field_a_reader_asks_for_is_declared() -> None:
    asked = {}
    for rel in READERS:
        path = ROOT / rel
        if path.exists():
            for m in _ASKED.finditer(path.read_text()):
                asked.setdefault(m.group(1) or m.group(2), rel)
    assert asked, "the pattern found no reader: it no longer matches how entries are read"
    undeclared = {k: v for k, v in asked.items() if k not in field_names()}
    assert not undeclared, f"read but not declared in fencepost/core/stream.py: {undeclared}"


async def test_a_script_that_writes_an_undeclared_field_is_refused_before_the_transition(stores: Stores) -> None:
    keys = stores.keys("tq")
    await stores.redis.hset(keys.run(1), mapping={"state": "PENDING", "version": 3, "priority": 0})
    await stores.redis.zadd(keys.due, {"1": 1})
    assert lua_source() in render("pause_run")
    bad = render("pause_run").replace("who[#who + 1] = 'ctl'", "who[#who + 1] = 'bogus'")
    assert bad != render("pause_run"), "pause_run no longer adds ctl to its event: pick another line to mutate"
    with pytest.raises(ResponseError, match="UNDECLARED_EVENT_FIELD bogus"):
        await stores.redis.eval(bad, len(keys.script_keys()), *keys.script_keys(), "1", "op", "why", "")
    # like ILLEGAL_TRANSITION, the guard is a programming error caught in tests: what the script did before
    # transition() stays (Redis does not roll a script back), the transition itself is not written
    assert await stores.redis.hmget(keys.run(1), ["state", "version"]) == [b"PENDING", b"3"]
    assert await stores.redis.xlen(keys.events) == 0


async def test_the_entries_of_a_run_s_life_carry_only_declared_fields(client: Client) -> None:
    from tests.test_drift import claim, finish

    stores = client.stores
    rid = await client.submit("t.echo", 1)
    (cid, token), = await claim(stores, 1)
    assert cid == rid and await finish(stores, rid, token) == "SUCCEEDED"
    await client.pause(await client.submit("t.echo", 2))
    entries = await stores.redis.xrange(stores.keys("tq").events)
    seen = {k.decode() for _, f in entries for k in f}
    assert {"run", "type", "v", "ts", "lease", "token", "actor"} <= seen
    assert seen <= field_names(), seen - field_names()
