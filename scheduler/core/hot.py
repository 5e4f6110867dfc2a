"""Load lua/ once, run scripts by SHA (EVALSHA; redis-py reloads once on NOSCRIPT).

Includes are inlined here (`-- @include name`), and the state table from
`states.py` is rendered into them (`-- @states`), so Lua cannot drift from Python.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from functools import cache
from typing import Any, Iterable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ClusterDownError, ClusterError, ResponseError, TryAgainError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fencepost.core.errors import NotStamped, RedisUnavailable, decode_lua_error
from fencepost.core.keys import Keys
from fencepost.core.resources import resource_dir
from fencepost.core.states import edges

__all__ = ["Scripts", "render", "SCRIPT_NAMES"]

# replies that mean "this node cannot serve now" (failover in progress), not a script error
_UNAVAILABLE = ("CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN", "READONLY", "NOREPLICAS")
_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.M)
SCRIPT_NAMES = tuple(sorted(p.stem for p in resource_dir("lua").glob("*.lua")))
"""Every lua/<verb>_<object>.lua is a script (includes live in lua/includes/)."""


def _states_lua() -> str:
    entries = ", ".join(f"['{f}>{t}>{e}'] = true" for f, t, e in sorted(edges()) if f)
    return f"local LEGAL = {{{entries}}}"


@cache
def render(name: str) -> str:
    """The full source of one script, includes inlined."""
    root = resource_dir("lua")
    src = (root / f"{name}.lua").read_text()

    def include(m: re.Match[str]) -> str:
        return (root / "includes" / f"{m.group(1)}.lua").read_text().replace("-- @states", _states_lua())

    return _INCLUDE.sub(include, src)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


class Scripts:
    """All scripts registered on one Redis client."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._scripts = {name: redis.register_script(render(name)) for name in SCRIPT_NAMES}

    async def run(self, name: str, keys: Keys | list[str], args: Sequence[Any]) -> Any:
        """Run a script on a queue's keys (or, for the few non-queue scripts, explicit keys)."""
        key_list = keys.script_keys() if isinstance(keys, Keys) else keys
        try:
            return await self._scripts[name](keys=key_list, args=args)
        except ResponseError as exc:
            msg = str(exc)
            if isinstance(exc, (ClusterDownError, TryAgainError)) or msg.startswith(_UNAVAILABLE):
                raise RedisUnavailable(f"redis unavailable: {msg}") from exc
            if msg.startswith("UNSTAMPED"):
                raise NotStamped(keys.queue if isinstance(keys, Keys) else "?") from None
            raise decode_lua_error(msg) from None
        except (RedisConnectionError, RedisTimeoutError, ClusterError, OSError) as exc:
            raise RedisUnavailable(f"redis unreachable: {exc}") from exc

    async def enqueue_rows(self, keys: Keys, rows: Iterable[Any]) -> int:
        """Make committed runs claimable: one Lua call for a batch (submit, outbox relay, repair).

        Each row needs id, handler, status, priority, payload, run_at, attempt, max_retries,
        timeout_s, fire_time, trace_id, version (and gen, tenant, concurrency_key, concurrency_limit,
        absent = none): the reconciler's `drift_runs`.
        """
        args: list[Any] = [int(time.time() * 1000)]
        for r in rows:
            ft = r["fire_time"]
            args += (r["id"], r["status"], _ms(r["run_at"]), r["priority"], r["handler"], r["payload"],
                     r["max_retries"], int(r["timeout_s"] * 1000), r["attempt"], r["version"],
                     _ms(ft) if ft is not None else "", r["trace_id"] or "", r.get("gen") or 0,
                     r.get("tenant") or "", r.get("concurrency_key") or "", r.get("concurrency_limit") or "")
        if len(args) == 1:
            return 0
        return await self.run("enqueue_runs", keys, args)
