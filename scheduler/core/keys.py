"""Every Redis key Fencepost uses, in one place.

All keys of one queue share the hash tag `{prefix:queue}` so every script touches a
single slot and the system runs on Redis Cluster unchanged. Lua scripts receive the
queue's key prefix (`Keys.base`) and build run keys from it, never from strings of
their own.

Run hash fields (see lua/includes/common.lua): state, handler, payload, priority,
attempt, fails, crashes, max_retries, timeout_ms, token, worker, lease_until,
version, run_at, fire_time, trace, result, error_class, error, reason (terminal states), ctl.
"""

from __future__ import annotations

import re

__all__ = [
    "QUEUES_KEY", "QUEUE_NAME_PATTERN", "QUEUE_SUFFIXES", "RECONCILERS_KEY", "WORKERS_KEY", "Keys", "api_authfail_key",
    "api_rate_key",
    "breaker_keys", "lua_keys", "recorder_poison_key",
    "valid_queue_name", "worker_key", "worker_stop_key",
]

QUEUE_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
"""What a queue name may be (also the API schema's pattern): it is part of every key of the queue."""
_QUEUE_RE = re.compile(QUEUE_NAME_PATTERN)


def valid_queue_name(name: str) -> bool:
    return isinstance(name, str) and bool(_QUEUE_RE.fullmatch(name))


def QUEUES_KEY(prefix: str) -> str:
    """Set of known queue names (discovery only; not tagged, not on the hot path)."""
    return f"{prefix}:queues"


def WORKERS_KEY(prefix: str) -> str:
    """ZSET worker id -> last identity heartbeat (ms): who to list (not tagged, not on the hot path)."""
    return f"{prefix}:workers"


def RECONCILERS_KEY(prefix: str) -> str:
    """ZSET reconciler member -> alive until (ms, the Redis server's clock): who splits the queues'
    streams and drift ticks (lua/reconcilers_live.lua, fencepost/reconciler/shares.py)."""
    return f"{prefix}:reconcilers"


def worker_key(prefix: str, worker_id: str) -> str:
    """A worker's identity (JSON, fencepost.core.workers.WorkerInfo), rewritten each heartbeat with a TTL."""
    return f"{prefix}:worker:{worker_id}"


def worker_stop_key(prefix: str, worker_id: str) -> str:
    """Exists while an operator asks the worker to drain and stop (JSON: who, why, when)."""
    return f"{prefix}:worker:{worker_id}:stop"


def recorder_poison_key(prefix: str) -> str:
    """STREAM of transitions PostgreSQL refused even alone, kept by the recorder for an operator
    (docs/runbooks/FencepostRecorderPoison.md)."""
    return f"{prefix}:recorder:poison"


def api_rate_key(prefix: str, token_id: int, window: int) -> str:
    """Requests of one API token in one fixed window (a counter with a TTL; core/hotreads.rate_hit)."""
    return f"{prefix}:api:rate:{token_id}:{window}"


def api_authfail_key(prefix: str, addr: str, window: int) -> str:
    """Failed authentications from one client address in one fixed window (core/hotreads.authfail_hit)."""
    return f"{prefix}:api:authfail:{addr}:{window}"


def breaker_keys(prefix: str, service: str) -> list[str]:
    """KEYS of the breaker scripts: state hash, probe lock, bucket prefix (one hash tag per breaker)."""
    tag = f"{prefix}:{{breaker:{service}}}:"
    return [tag + "state", tag + "probe", tag]


QUEUE_SUFFIXES: dict[str, str] = {
    # the KEYS every queue script receives (Keys.script_keys), then the keys scripts build themselves
    "due": "due", "delayed": "delayed", "active": "active", "events": "events", "seq": "seq",
    "token": "token", "epoch": "epoch", "paused": "paused", "wake": "wake", "stats": "stats",
    "config": "config", "throttle": "throttle", "tenants": "tenants", "weights": "weights",
    "limits": "limits", "heldkeys": "heldkeys", "rates": "rates", "rwait": "rwait",
    "fair": "fair", "climits": "climits", "workers": "workers", "rw": "rw",
    # prefixes: the name follows (a run id, a tenant, a concurrency or rate key, a budget bucket)
    "run": "run:", "tenant_due": "due:t:", "held": "held:", "ck": "ck:", "rw_key": "rw:", "rheld": "rheld:",
    "budget": "budget:", "budget_a": "budget:a:", "budget_r": "budget:r:",
}
"""Every per-queue key after the queue's base (`{prefix:queue}:`), Lua's included: the scripts get
this table rendered into them (`-- @queue_keys`, `KEY.run` ...), so no script spells a key of its own
(tests/test_one_place.py)."""


_S = QUEUE_SUFFIXES


def lua_keys() -> str:
    """QUEUE_SUFFIXES as a Lua table, rendered into lua/includes/common.lua."""
    body = ", ".join(f"{name} = '{suffix}'" for name, suffix in QUEUE_SUFFIXES.items())
    return f"local KEY = {{{body}}}"


class Keys:
    """The keys of one queue (names and suffixes: QUEUE_SUFFIXES)."""

    __slots__ = (
        "active",
        "base",
        "config",
        "delayed",
        "due",
        "epoch",
        "events",
        "heldkeys",
        "limits",
        "paused",
        "queue",
        "rates",
        "rwait",
        "seq",
        "stats",
        "tenants",
        "testclock",
        "throttle",
        "token",
        "wake",
        "weights",
    )

    def __init__(self, prefix: str, queue: str) -> None:
        self.queue = queue
        self.base = f"{prefix}:{{{queue}}}:"
        b = self.base
        self.due = b + _S["due"]          # ZSET run id -> clock + priority head start (default tenant)
        self.delayed = b + _S["delayed"]  # ZSET run id -> run_at (ms): delayed and RETRY_WAIT runs
        self.active = b + _S["active"]    # ZSET run id -> lease expiry (ms): RUNNING and STOPPING runs
        self.events = b + _S["events"]    # STREAM of transitions, read by the recorder group
        self.seq = b + _S["seq"]          # the queue clock: FIFO order and priority aging
        self.token = b + _S["token"]      # counter, low 40 bits of fencing tokens in this epoch
        self.epoch = b + _S["epoch"]      # epoch stamp written by the reconciler (or queue creator)
        self.paused = b + _S["paused"]    # exists while the whole queue is paused
        self.wake = b + _S["wake"]        # LIST nudged on enqueue so idle workers wake without polling
        self.stats = b + _S["stats"]      # HASH of counters (stale_finish, budget_exhausted, ...)
        self.config = b + _S["config"]    # HASH budget_ratio / budget_floor / budget_window_ms (retry budget)
        self.throttle = b + _S["throttle"]  # max claims per call while a dependency rate-limits (PX = retry_after)
        # tests only: with FENCEPOST_TEST_CLOCK=1 the scripts read their one clock (ms) here when it
        # exists (KEYS[1] .. ':testclock', fencepost.core.hot.TEST_CLOCK_ENV); services never write it
        self.testclock = self.due + ":testclock"
        # dispatch order and limits (lua/includes/common.lua "Dispatch order", docs/scale.md)
        self.tenants = b + _S["tenants"]    # ZSET tenant -> virtual time, tenants with due runs
        self.weights = b + _S["weights"]    # HASH tenant -> weight (absent = 1)
        self.limits = b + _S["limits"]      # HASH concurrency key -> operator's limit
        self.heldkeys = b + _S["heldkeys"]  # SET concurrency keys with held runs
        # rate limits (lua/includes/common.lua "Rate limits"); the queue-wide rate is config 'rate'
        self.rates = b + _S["rates"]        # HASH rate key -> operator's rate ('N/ms')
        self.rwait = b + _S["rwait"]        # ZSET rate key ('' = the queue) -> when its window frees (server ms)
        # also, built by Lua from `base`: budget:a:<bucket> / budget:r:<bucket> counters,
        # fair, climits, workers (ZSET worker id -> alive-until ms: the liveness pulse,
        # lua/includes/common.lua K_WORKERS), and the per-tenant / per-key sets below

    def run(self, run_id: int | str) -> str:
        return f"{self.base}{_S['run']}{run_id}"

    def tenant_due(self, tenant: str) -> str:
        """ZSET of one tenant's due runs (the default tenant '' uses `due`)."""
        return self.due if tenant == "" else f"{self.base}{_S['tenant_due']}{tenant}"

    def held(self, ckey: str) -> str:
        """ZSET of due runs waiting for a slot of a concurrency key."""
        return f"{self.base}{_S['held']}{ckey}"

    def leased(self, ckey: str) -> str:
        """SET of a concurrency key's runs holding a lease."""
        return f"{self.base}{_S['ck']}{ckey}"

    def rate_window(self, rkey: str) -> str:
        """ZSET of a rate window's starts ('<id>:<attempt>' -> server ms); '' is the queue-wide one."""
        return f"{self.base}{_S['rw']}" if rkey == "" else f"{self.base}{_S['rw_key']}{rkey}"

    def rate_held(self, rkey: str) -> str:
        """ZSET of due runs waiting for their rate key's window to free (same score as in due)."""
        return f"{self.base}{_S['rheld']}{rkey}"

    def script_keys(self) -> list[str]:
        """The KEYS every queue script receives, in this order (see each script's header)."""
        return [self.due, self.delayed, self.active, self.events, self.seq, self.token,
                self.epoch, self.paused, self.wake, self.stats]
