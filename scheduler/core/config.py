"""Settings from the environment (FENCEPOST_*), with defaults that work on one machine."""

from __future__ import annotations

import os

import msgspec

__all__ = ["Settings"]


class Settings(msgspec.Struct, kw_only=True):
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Plain Redis; with Sentinel its password and db number are used, with Cluster its host:port is a seed."""
    redis_sentinels: str = ""
    """Sentinel addresses `host:port,host:port`; the primary is looked up by `redis_service`."""
    redis_service: str = "mymaster"
    redis_cluster: bool = False
    """Connect with the Redis Cluster client (every key of a queue shares one hash slot)."""
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    prefix: str = "fp"
    """Redis key prefix; separate prefixes never see each other's data."""
    max_payload_bytes: int = 512 * 1024
    lease_ms: int = 30_000
    worker_liveness_ms: int = 3_000
    """A worker that has not pulsed for this long is dead: its runs are reclaimed whatever their
    lease (lua/pulse_worker.lua). Workers pulse from a thread of their own, every sixth of it."""
    quarantine_after: int = 3
    """Crashes of the worker process (os._exit, segfault) before a run is quarantined."""
    backoff_base_ms: int = 1_000
    backoff_cap_ms: int = 300_000
    retry_budget_ratio: float = 0.2
    """Retries of a queue may not exceed floor + ratio x first attempts over the window (0: off)."""
    retry_budget_floor: int = 10
    retry_budget_window_ms: int = 60_000
    claim_replicas: int = 0
    """Durable claims: after each claim batch, wait until this many replicas acknowledged it
    (`WAIT`) before any handler starts; a batch they do not acknowledge within
    `claim_wait_ms` is released unrun. 0: off (a promoted replica may lack recent claims)."""
    claim_wait_ms: int = 1_000
    terminal_ttl_s: int = 3_600
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

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        env: dict[str, object] = {}
        for field in cls.__struct_fields__:
            raw = os.environ.get(f"FENCEPOST_{field.upper()}")
            if raw is not None:
                env[field] = raw
        env.update({k: v for k, v in overrides.items() if v is not None})
        return msgspec.convert(env, cls, strict=False)
