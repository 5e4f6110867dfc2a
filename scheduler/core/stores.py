"""The two stores every process talks to, opened once and shared by its components, and the one
rule that says where they are (`resolve`), used by every entry point: the CLI's root group,
`Client` / `SyncClient` (through `Stores`), the services, the API and the pytest plugin.

    1. explicit URLs: FENCEPOST_REDIS_URL (or FENCEPOST_REDIS_SENTINELS) and FENCEPOST_DATABASE_URL,
       or the same given in code / on the command line; both, or
    2. neither: the embedded pair of the project directory, FENCEPOST_EMBEDDED_DIR (default
       ./.fencepost), found running or started (detached, migrated: `fencepost dev down` stops it);
    3. else a one-line error saying what to set: no URLs and the `embedded` extra not installed; or
       one URL without the other where both stores are needed (a command that needs only
       PostgreSQL, `fencepost db upgrade` or `token`, runs with FENCEPOST_DATABASE_URL alone)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff
from redis.exceptions import RedisError

from fencepost.core import embedded
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, RedisUnavailable, StoreUnavailable
from fencepost.core.hot import Scripts
from fencepost.core.keys import QUEUES_KEY, Keys
from fencepost.core.record import Database
from fencepost.core.redisconn import connect, no_resend

__all__ = ["Resolved", "Stores", "embedded_dir", "resolve", "resolve_settings"]

log = logging.getLogger("fencepost")


class Resolved(msgspec.Struct, kw_only=True, frozen=True):
    """Where the stores are, and how that was decided."""

    settings: Settings
    """The settings with both URLs filled in."""
    embedded_dir: str | None = None
    """The embedded pair's folder when rule 2 chose it, else None."""
    started: bool = False
    """Rule 2 started the pair now (it was not running)."""
    pending: bool = False
    """Rule 2 applies but the pair is not running and was not to be started yet (resolve(start=False))."""

    @property
    def note(self) -> str | None:
        """The one line an entry point prints when it fell back to the embedded pair."""
        if self.embedded_dir is None or self.pending:
            return None
        return (f"fencepost: no FENCEPOST_REDIS_URL / FENCEPOST_DATABASE_URL set: using the embedded servers in "
                f"{self.embedded_dir}/ ({'started now' if self.started else 'running'}; "
                "`fencepost dev down` stops them)")


def embedded_dir() -> str:
    """The project directory's embedded pair: FENCEPOST_EMBEDDED_DIR, else ./.fencepost."""
    return os.environ.get(embedded.DIR_ENV) or embedded.DEFAULT_DIR


def resolve(settings: Settings, *, start: bool = True) -> Resolved:
    """The stores SETTINGS point at, by the module's rule (explicit URLs, else the embedded pair of
    the project directory, started if need be, else an error naming what to set). With START false
    a pair that is not running is not started: the answer is `pending` (Stores starts it on connect,
    so building a client that never connects starts nothing)."""
    has_redis = bool(settings.redis_url or settings.redis_sentinels)
    has_db = bool(settings.database_url)
    if has_redis and has_db:
        return Resolved(settings=settings)
    where = embedded_dir()
    if has_redis or has_db:  # one store given: a command that needs only it runs (`db upgrade`, tokens)
        return Resolved(settings=settings)
    if not embedded.available():
        raise StoreUnavailable("no stores configured: set FENCEPOST_REDIS_URL and FENCEPOST_DATABASE_URL, or "
                               f"`pip install 'fencepost[embedded]'` to use embedded servers in {where}/")
    pair = embedded.up(where) if start else embedded.attach(where)
    if pair is None:
        return Resolved(settings=settings, embedded_dir=where, pending=True)
    return Resolved(settings=msgspec.structs.replace(settings, redis_url=pair.redis_url, database_url=pair.database_url),
                    embedded_dir=where, started=pair.started)


def resolve_settings(settings: Settings, *, start: bool = True) -> Resolved:
    """resolve(SETTINGS), saying on stderr in one line when it fell back to the embedded pair."""
    resolved = resolve(settings, start=start)
    if resolved.note is not None:
        print(resolved.note, file=sys.stderr)
    return resolved


def cluster_retry() -> Retry:
    """The cluster client's own retries (MOVED after a failover, a node's connection refused), bounded
    to ~0.3 s in all: redis-py 8's default (10 tries, backoff up to 1 s each) holds a command to a dead
    shard for seconds, and with it every loop that touches that shard once per pass: the recorder's
    read of a healthy queue's stream waited behind the dead one's (tests/test_cluster.py). Our callers
    back off on RedisUnavailable themselves, as they did under redis-py 5's 3 tries without backoff."""
    return Retry(EqualJitterBackoff(cap=0.1, base=0.01), 3)


def _redis_client(settings: Settings) -> aioredis.Redis:
    """Plain URL (scheduler.redisconn.connect), Sentinel (FENCEPOST_REDIS_SENTINELS +
    FENCEPOST_REDIS_SERVICE) or Cluster (FENCEPOST_REDIS_CLUSTER=1)."""
    opts: dict[str, Any] = dict(decode_responses=False, socket_connect_timeout=5, **no_resend())
    if settings.redis_sentinels:
        from urllib.parse import urlparse

        from redis.asyncio.sentinel import Sentinel

        url = urlparse(settings.redis_url)
        hosts = []
        for part in settings.redis_sentinels.split(","):
            host, _, port = part.strip().rpartition(":")
            hosts.append((host, int(port)))
        db = int(url.path.lstrip("/") or 0) if url.path.lstrip("/").isdigit() else 0
        sentinel = Sentinel(hosts, socket_connect_timeout=5)
        master: aioredis.Redis = sentinel.master_for(settings.redis_service, password=url.password, db=db, **opts)
        return master
    if settings.redis_cluster:
        from redis.asyncio.cluster import RedisCluster

        opts.pop("retry_on_timeout")  # the cluster client retries MOVED and refused nodes (claims carry a deadline),
        opts["retry"] = cluster_retry()  # a few times, briefly
        return RedisCluster.from_url(settings.redis_url, **opts)  # type: ignore[return-value]
    return connect(settings.redis_url, health_check_interval=30, **opts)


class _Unset:
    """Redis when only PostgreSQL is configured: any use raises the one-line error saying what to set."""

    def __init__(self, error: InvalidInput) -> None:
        self._error = error

    def __getattr__(self, name: str) -> Any:
        raise self._error


class Stores:
    redis: aioredis.Redis
    db: Database
    scripts: Scripts

    def __init__(self, settings: Settings | None = None, *, db_pool_size: int = 10) -> None:
        """SETTINGS (default: the environment's) with the stores found by `resolve`. When that is an
        embedded pair that is not running yet, it is started by connect(), not here."""
        resolved = resolve_settings(settings or Settings.from_env(), start=False)
        self.settings = resolved.settings
        self._db_pool_size = db_pool_size
        self._keys: dict[str, Keys] = {}
        self._opened = False
        if not resolved.pending:
            self._open()

    def _open(self) -> None:
        missing = [name for name, url in (("FENCEPOST_REDIS_URL", self.settings.redis_url or
                                           self.settings.redis_sentinels),
                                          ("FENCEPOST_DATABASE_URL", self.settings.database_url)) if not url]
        if missing:  # rule 3: one store given without the other, and both are needed here
            given = "FENCEPOST_DATABASE_URL" if missing[0] == "FENCEPOST_REDIS_URL" else "FENCEPOST_REDIS_URL"
            error = InvalidInput(f"{missing[0]} is not set but {given} is: set both, or neither to use the "
                                 f"embedded servers in {embedded_dir()}/",
                                 field=missing[0].removeprefix("FENCEPOST_").lower())
            if missing != ["FENCEPOST_REDIS_URL"]:
                raise error
            # PostgreSQL alone: enough for connect(redis=False) (`fencepost token`, `audit`); Redis says why on use
            self.redis = self.scripts = _Unset(error)  # type: ignore[assignment]
        else:
            self.redis = _redis_client(self.settings)
            self.scripts = Scripts(self.redis)
        self.db = Database(self.settings.database_url, max_size=self._db_pool_size)
        self._opened = True

    def spare_redis(self) -> aioredis.Redis:
        """A second Redis client with these settings that shares no connection (and on Cluster no
        slot map or refresh lock) with self.redis: the worker probes a failing cluster shard through
        it, so that shard's errors and slot-map refreshes never hold the other queues' calls. The
        caller closes it."""
        return _redis_client(self.settings)

    def __getattr__(self, name: str) -> Any:
        """A store used before connect() when the embedded pair had still to start (an API app built
        before its lifespan opens it): the pair starts now, blocking, as connect() would start it."""
        if name in ("redis", "db", "scripts") and self.__dict__.get("_opened") is False:
            self.settings = resolve_settings(self.settings).settings
            self._open()
            return self.__dict__[name]
        raise AttributeError(name)

    def keys(self, queue: str) -> Keys:
        k = self._keys.get(queue)
        if k is None:
            k = self._keys[queue] = Keys(self.settings.prefix, queue)
        return k

    @property
    def queues_key(self) -> str:
        return QUEUES_KEY(self.settings.prefix)

    async def connect(self, *, database: bool = True, redis: bool = True) -> Stores:
        """Open the stores; REDIS false: PostgreSQL only (a command that needs no Redis, which then may
        be unset: FENCEPOST_DATABASE_URL alone)."""
        if not self._opened:  # rule 2 with the pair not running: start it now (off the event loop)
            self.settings = (await asyncio.to_thread(resolve_settings, self.settings)).settings
            self._open()
        if redis:
            try:
                await self.redis.ping()
            except (RedisError, OSError) as exc:
                raise RedisUnavailable(f"redis unreachable at {self.settings.redis_url}: {exc}") from exc
        if database:
            await self.db.connect()
        return self

    async def check_redis(self) -> dict[str, str]:
        """Warn loudly when Redis may evict keys (an evicted run key is a lost job) and say what persistence it has."""
        try:
            conf = await self.redis.config_get("maxmemory-policy")
            raw = conf.get("maxmemory-policy", conf.get(b"maxmemory-policy", b"?"))  # type: ignore[call-overload]
            policy = raw.decode() if isinstance(raw, bytes) else str(raw)
            persistence = await self.redis.info("persistence")
        except RedisError:  # CONFIG may be disabled on managed Redis
            return {}
        if policy != "noeviction":
            log.warning("redis maxmemory-policy is %r, not 'noeviction': Redis may evict run keys; "
                        "the reconciler will re-enqueue them from PostgreSQL, but set noeviction", policy)
        aof = persistence.get("aof_enabled") in (1, "1", b"1")
        log.info("redis persistence: aof=%s; guarantees do not depend on it, recovery time does", aof)
        return {"maxmemory_policy": policy, "aof": str(aof)}

    async def close(self) -> None:
        if not self._opened:
            return
        if not isinstance(self.redis, _Unset):
            await self.redis.aclose()
        await self.db.close()
