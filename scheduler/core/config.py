"""Settings from the environment (FENCEPOST_*), with defaults that work on one machine.

The environment is a boundary like the API: every number has its range here, and a value out
of it (or not a number) is an InvalidInput naming the variable when the process starts, not a
lease of -1 ms or a worker that never claims found out later."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from fencepost.core.errors import InvalidInput

__all__ = ["Settings", "from_env"]

T = TypeVar("T", bound=msgspec.Struct)

Ms = Annotated[int, Meta(ge=1, le=30 * 86_400_000)]
"""Milliseconds, 1 ms to 30 days."""
Count = Annotated[int, Meta(ge=0, le=1_000_000_000)]
Seconds = Annotated[int, Meta(ge=1, le=366 * 86_400)]


def from_env(cls: type[T], env_prefix: str, overrides: dict[str, Any]) -> T:
    """A settings Struct from `<env_prefix><FIELD>` variables, then explicit overrides (None: unset).
    A bad value is an InvalidInput naming the variable (or the override) and what it must be."""
    env: dict[str, Any] = {}
    for name in cls.__struct_fields__:
        raw = os.environ.get(f"{env_prefix}{name.upper()}")
        if raw is not None:
            env[name] = raw
    given = {k: v for k, v in overrides.items() if v is not None}
    env.update(given)
    try:
        return msgspec.convert(env, cls, strict=False)
    except msgspec.ValidationError as exc:
        m = re.search(r"\$\.(\w+)", str(exc))
        name = m.group(1) if m else ""
        where = name if name in given else f"{env_prefix}{name.upper()}"
        want = str(exc).split(" - at ")[0].replace(", got `str`", "")
        want = want.replace("Expected `int`", "must be a whole number").replace("Expected `float`", "must be a number")
        want = want.replace("Expected `bool`", "must be true or false").replace("Expected", "must be")
        raise InvalidInput(f"{where} {want}, not {env.get(name)!r}", field=where) from None


class Settings(msgspec.Struct, kw_only=True):
    redis_url: str = ""
    """Plain Redis; with Sentinel its password and db number are used, with Cluster its host:port is a seed.
    Empty (and database_url empty): the embedded pair of the project directory (fencepost.core.stores.resolve)."""
    redis_sentinels: str = ""
    """Sentinel addresses `host:port,host:port`; the primary is looked up by `redis_service`."""
    redis_service: str = "mymaster"
    redis_cluster: bool = False
    """Connect with the Redis Cluster client (every key of a queue shares one hash slot)."""
    database_url: str = ""
    """PostgreSQL; empty (and redis_url empty): the embedded pair (fencepost.core.stores.resolve)."""
    prefix: str = "fp"
    """Redis key prefix; separate prefixes never see each other's data."""
    max_payload_bytes: Annotated[int, Meta(ge=1024, le=512 * 1024 * 1024)] = 512 * 1024
    lease_ms: Annotated[int, Meta(ge=10, le=30 * 86_400_000)] = 30_000
    worker_liveness_ms: Annotated[int, Meta(ge=10, le=3_600_000)] = 3_000
    """A worker that has not pulsed for this long is dead: its runs are reclaimed whatever their
    lease (lua/pulse_worker.lua). Workers pulse from a thread of their own, every sixth of it."""
    max_interruptions: Annotated[int, Meta(ge=0, le=10_000)] = 10
    """Attempts of one run that may end interrupted (its lease expired or its worker died: no
    handler error) before the run is FAILED with reason interrupted_too_often. Interruptions never
    use up max_retries (docs/clock.md)."""
    quarantine_after: Annotated[int, Meta(ge=1, le=1_000)] = 3
    """Crashes of the worker process (os._exit, segfault) before a run is quarantined."""
    backoff_base_ms: Ms = 1_000
    backoff_cap_ms: Ms = 300_000
    retry_budget_ratio: Annotated[float, Meta(ge=0, le=1_000)] = 0.2
    """Retries of a queue may not exceed floor + ratio x first attempts over the window (0: off)."""
    retry_budget_floor: Count = 10
    retry_budget_window_ms: Ms = 60_000
    claim_replicas: Annotated[int, Meta(ge=0, le=64)] = 0
    """Durable claims: after each claim batch, wait until this many replicas acknowledged it
    (`WAIT`) before any handler starts; a batch they do not acknowledge within
    `claim_wait_ms` is released unrun. 0: off (a promoted replica may lack recent claims)."""
    claim_wait_ms: Ms = 1_000
    terminal_ttl_s: Seconds = 3_600
    """How long a finished run's hash stays in Redis after the recorder committed it."""
    archive_after: str = "7d"
    """Finished runs older than this leave the hot `runs` table for `runs_archive` (the
    reconciler moves them; `30d`, `12h`, `90m`, `2w`; `0` or empty: never)."""
    idempotency_window: str = "7d"
    """How long an idempotency key is honoured after its submit, archived run or not (the
    reconciler prunes older keys; same format as archive_after)."""
    chart_retention: str = "8d"
    """How long the dashboard's per-minute chart rollup (`queue_minutes`) is kept: the reconciler
    prunes older minutes. At least `7d`, the longest chart window (same format as archive_after)."""

    recorder_silence_s: Annotated[int, Meta(ge=1, le=86_400)] = 60
    """`fencepost ls`, `queue ls`, `status` and the services say so in one line when a transition has
    waited this long in Redis for the recorder: the FencepostRecorderLagHigh alert's threshold
    (docs/alerts/fencepost.rules.yml, `fencepost_recorder_lag_seconds > 60`)."""

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        return from_env(cls, "FENCEPOST_", overrides)
