"""The worker as small rooms (issue 25, "One way in"): each room is a class of its own in the file
docs/worker.md names and Worker only wires them, and the worker's Redis reads and writes that are
not scripts go through core/hotworker.py (typed replies, keys from core/keys.py), run here against a
real Redis. (No function over 60 lines and no raw redis-py call: tests/test_layers.py.)"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from fencepost.core import hotworker
from fencepost.core.hotworker import DueAt, RetryBudget, RunHolder
from fencepost.core.stores import Stores

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "worker"


def _rooms() -> list[tuple[str, str]]:
    """(class, file) of each row of docs/worker.md's Rooms table."""
    text = (ROOT / "docs" / "worker.md").read_text()
    section = text.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].startswith("`worker/"):
            for cls in re.findall(r"`(\w+)`", cells[1]):
                rows.append((cls, cells[2].strip("`")))
    return rows


def test_every_room_docs_worker_md_names_is_a_class_in_its_file() -> None:
    rows = _rooms()
    assert len(rows) >= 12, rows
    for cls, path in rows:
        module = importlib.import_module("fencepost.worker." + Path(path).stem)
        assert isinstance(getattr(module, cls, None), type), f"docs/worker.md: no class {cls} in {path}"


def test_the_worker_is_a_composition_not_a_room() -> None:
    """Worker wires, starts and stops the rooms: the loops live in their own classes."""
    tree = ast.parse((WORKER / "runtime.py").read_text())
    worker = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Worker")
    loops = [n for n in ast.walk(worker) if isinstance(n, ast.While)]
    methods = {n.name for n in worker.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert not {"_claim_loop", "_keep_leases", "_watchdog", "_reap", "_observe", "_execute"} & methods
    assert len(loops) <= 1, "only the connect-with-backoff loop belongs to Worker itself"


# -- core/hotworker.py on a real Redis -------------------------------------------------------------------


async def test_the_earliest_due_run_is_found_across_queues_after_what_was_offered(stores: Stores) -> None:
    a, b = stores.keys("ra"), stores.keys("rb")
    await stores.redis.zadd(a.delayed, {"1": 5_000, "2": 9_000})
    await stores.redis.zadd(b.rwait, {"": 7_000})
    assert await hotworker.due_after(stores.redis, [a, b], [0, 0]) == DueAt(5_000, "ra")
    assert await hotworker.due_after(stores.redis, [a, b], [5_000, 0]) == DueAt(7_000, "rb")
    assert await hotworker.due_after(stores.redis, [a, b], [9_000, 7_000]) is None


async def test_a_wake_push_ends_the_wait_and_an_empty_queue_times_out(stores: Stores) -> None:
    a = stores.keys("ra")
    assert await hotworker.wait_wake(stores.redis, [a], 0.05) is False
    assert await hotworker.ring_wake(stores.redis, a) == 1
    assert await hotworker.wait_wake(stores.redis, [stores.keys("rb"), a], 1) is True


async def test_queues_are_empty_until_a_run_is_due_delayed_or_leased(stores: Stores) -> None:
    a, b = stores.keys("ra"), stores.keys("rb")
    assert await hotworker.queues_empty(stores.redis, [a, b])
    for z in (b.active, b.delayed, b.due):
        await stores.redis.zadd(z, {"1": 1})
        assert not await hotworker.queues_empty(stores.redis, [a, b])
        await stores.redis.delete(z)


async def test_the_retry_budget_a_queue_has_is_kept_and_reported(stores: Stores) -> None:
    k = stores.keys("ra")
    first = {"budget_ratio": "0.2", "budget_floor": "10", "budget_window_ms": "60000"}
    assert await hotworker.seed_retry_budget(stores.redis, k, first) == RetryBudget(0.2, 10, 60_000)
    later = {"budget_ratio": "0.9", "budget_floor": "99", "budget_window_ms": "5"}
    assert await hotworker.seed_retry_budget(stores.redis, k, later) == RetryBudget(0.2, 10, 60_000)
    assert await stores.redis.hget(k.config, "budget_floor") == b"10"


async def test_the_run_holder_says_state_token_and_control_verb(stores: Stores) -> None:
    k = stores.keys("ra")
    assert await hotworker.run_holder(stores.redis, k, 7) == RunHolder(None, None, None)
    await stores.redis.hset(k.run(7), mapping={"state": "RUNNING", "token": "42", "ctl": ""})
    assert await hotworker.run_holder(stores.redis, k, 7) == RunHolder("RUNNING", 42, None)
    await stores.redis.hset(k.run(7), "ctl", "stop")
    assert (await hotworker.run_holder(stores.redis, k, 7)).ctl == "stop"


async def test_a_throttle_caps_the_queue_for_its_time(stores: Stores) -> None:
    k = stores.keys("ra")
    await hotworker.throttle_queue(stores.redis, k, 3, 5_000)
    assert await stores.redis.get(k.throttle) == b"3"
    assert 0 < await stores.redis.pttl(k.throttle) <= 5_000
    assert await hotworker.probe_queue(stores.redis, k) is False
