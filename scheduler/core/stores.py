"""The two stores every process talks to, opened once and shared by its components."""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from fencepost.core.config import Settings
from fencepost.core.errors import RedisUnavailable
from fencepost.core.hot import Scripts
from fencepost.core.keys import QUEUES_KEY, Keys
from fencepost.core.record import Database
from fencepost.core.redisconn import connect, no_resend

__all__ = ["Stores"]

log = logging.getLogger("fencepost")


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

        opts.pop("retry_on_timeout")  # the cluster client retries on its own (claims carry a deadline)
        opts.pop("retry")
        return RedisCluster.from_url(settings.redis_url, **opts)  # type: ignore[return-value]
    return connect(settings.redis_url, health_check_interval=30, **opts)


class Stores:
    def __init__(self, settings: Settings | None = None, *, db_pool_size: int = 10) -> None:
        self.settings = settings or Settings.from_env()
        self.redis: aioredis.Redis = _redis_client(self.settings)
        self.db = Database(self.settings.database_url, max_size=db_pool_size)
        self.scripts = Scripts(self.redis)
        self._keys: dict[str, Keys] = {}

    def keys(self, queue: str) -> Keys:
        k = self._keys.get(queue)
        if k is None:
            k = self._keys[queue] = Keys(self.settings.prefix, queue)
        return k

    @property
    def queues_key(self) -> str:
        return QUEUES_KEY(self.settings.prefix)

    async def connect(self, *, database: bool = True) -> Stores:
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
        await self.redis.aclose()
        await self.db.close()
