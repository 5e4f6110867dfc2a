"""API tokens: created once (the secret is shown then, only its sha256 is stored), looked up
by hash with a short cache, revoked; roles and queue scopes; a per-token rate limit."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from fencepost.api.problems import Forbidden, RateLimited, Unauthorized
from fencepost.core.errors import InvalidInput
from fencepost.core.keys import valid_queue_name
from fencepost.core.record import Database

__all__ = ["ROLES", "Principal", "RateLimiter", "Tokens", "create_token", "hash_secret", "new_secret"]

ROLES = ("producer", "operator", "admin")
_RANK = {"producer": 0, "operator": 1, "admin": 2}
TOKEN_PREFIX = "fp_"


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, role and queue scope (empty: every queue)."""

    id: int
    role: str
    queues: tuple[str, ...]
    name: str | None
    addr: str

    @property
    def actor(self) -> str:
        """What the event history records for this caller's actions."""
        return f"token:{self.id}@{self.addr}"

    @property
    def owner(self) -> str:
        return f"token:{self.id}"

    def require(self, *roles: str) -> None:
        if self.role not in roles:
            raise Forbidden(f"a {self.role} token may not do this (needs {' or '.join(roles)})",
                            role=self.role, required=list(roles))

    def in_scope(self, queue: str) -> bool:
        return not self.queues or queue in self.queues

    def require_queue(self, queue: str) -> None:
        if not self.in_scope(queue):
            raise Forbidden(f"this token is scoped to queues {', '.join(self.queues)}, not {queue!r}",
                            queue=queue, scope=list(self.queues))

    @property
    def scope(self) -> list[str] | None:
        return list(self.queues) if self.queues else None


async def create_token(db: Database, role: str, queues: list[str], name: str | None,
                       created_by: str | None) -> tuple[dict[str, Any], str]:
    """Store a new token; returns (its row, the secret), the secret being shown only now."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}, not {role!r}", field="role")
    for q in queues:
        if not valid_queue_name(q):
            raise InvalidInput(f"queue name {q!r} is not valid", field="queues")
    secret = new_secret()
    row = await db.fetchrow("api_token_insert", name, role, sorted(set(queues)), hash_secret(secret), created_by)
    assert row is not None
    return dict(row), secret


class Tokens:
    """Authenticates bearer tokens against PostgreSQL, caching answers for `cache_s` seconds
    (a revoke reaches other API replicas within that time; this one at once)."""

    def __init__(self, db: Database, *, cache_s: float = 5.0) -> None:
        self.db = db
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, dict[str, Any] | None]] = {}

    def forget(self) -> None:
        self._cache.clear()

    async def authenticate(self, header: str | None, addr: str) -> Principal:
        if not header:
            raise Unauthorized("send 'Authorization: Bearer <token>' (create one with `fencepost token create`)")
        scheme, _, secret = header.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        if len(secret) > 200:
            raise Unauthorized("unknown or revoked token")
        digest = hash_secret(secret)
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            row = hit[1]
        else:
            rec = await self.db.fetchrow("api_token_by_hash", digest)
            row = dict(rec) if rec is not None else None
            if row is not None and row["revoked_at"] is None:
                await self.db.execute("api_token_touch", row["id"])
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (now + self.cache_s, row)
        if row is None or row["revoked_at"] is not None:
            raise Unauthorized("unknown or revoked token")
        return Principal(id=row["id"], role=row["role"], queues=tuple(row["queues"] or ()), name=row["name"],
                         addr=addr)


class RateLimiter:
    """A fixed-window request counter per token in Redis (shared by every API replica)."""

    def __init__(self, redis: Any, prefix: str, *, limit: int, window_s: int) -> None:
        self.redis, self.prefix = redis, prefix
        self.limit, self.window_s = limit, max(1, window_s)

    async def hit(self, token_id: int) -> None:
        if self.limit <= 0:
            return
        now = time.time()
        window = int(now // self.window_s)
        key = f"{self.prefix}:api:rate:{token_id}:{window}"
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, self.window_s + 1)
        count, _ = await pipe.execute()
        if count > self.limit:
            retry = max(1, int((window + 1) * self.window_s - now) + 1)
            raise RateLimited(f"token {token_id} made more than {self.limit} requests in {self.window_s}s; "
                              f"retry in {retry}s", limit=self.limit, window_s=self.window_s, retry_after=retry)
