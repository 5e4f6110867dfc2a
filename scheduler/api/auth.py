"""API tokens: created once (the secret is shown then, only its sha256 is stored), looked up
by hash with a short cache, revoked; roles and queue scopes; a per-token rate limit."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fencepost.api.problems import Forbidden, RateLimited, Unauthorized
from fencepost.core import tokens
from fencepost.core.errors import InvalidInput
from fencepost.core.hotreads import authfail_count, authfail_hit, rate_hit
from fencepost.core.record import Database
from fencepost.core.tokens import MAX_EXPIRES_S, ROLES, hash_secret, new_secret

__all__ = ["MAX_EXPIRES_S", "ROLES", "Principal", "RateLimiter", "Tokens", "create_token", "hash_secret", "new_secret",
           "revoke_token"]

_RANK = {"producer": 0, "operator": 1, "admin": 2}


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, role and queue scope (empty: every queue)."""

    id: int
    role: str
    queues: tuple[str, ...]
    name: str | None
    addr: str
    expires_at: datetime | None = None

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
                       created_by: str | None, *, expires_in: float | None = None,
                       parent: Principal | None = None) -> tuple[dict[str, Any], str]:
    """Store a new token (fencepost.core.tokens.insert); returns (its row, the secret), the secret being
    shown only now. The token's creation is audited in the same transaction (actor: `created_by`).

    With `parent` (the token making it, through the API) the new token never exceeds it: its role
    ranks at most the parent's, its queues are within the parent's scope, and it expires no later
    than the parent (with no `expires_in`, at the parent's expiry). Revoking or expiring the parent
    ends it too (checked at every authentication)."""
    tokens.check_new(role, queues, name, expires_in)
    if parent is not None:
        if _RANK[role] > _RANK[parent.role]:
            raise Forbidden(f"a {parent.role} token cannot make a {role} token", role=parent.role, field="role")
        if parent.queues and (not queues or not set(queues) <= set(parent.queues)):
            raise Forbidden(f"this token is scoped to queues {', '.join(parent.queues)}; a token it makes must be too",
                            scope=list(parent.queues), field="queues")
        if parent.expires_at is not None:
            left = (parent.expires_at - datetime.now(UTC)).total_seconds()  # the message's; SQL caps it exactly
            if expires_in is not None and expires_in > left + 1:
                raise InvalidInput(f"expires_in {expires_in:g} s outlives this token, which expires in {left:.0f} s",
                                   field="expires_in")
    return await tokens.insert(db, role, queues, name, created_by, expires_in=expires_in,
                               parent_id=None if parent is None else parent.id,
                               parent_expires_at=None if parent is None else parent.expires_at)


revoke_token = tokens.revoke
"""Revoke a token (idempotent), audited in the same transaction; None if there is no such token."""


class Tokens:
    """Authenticates bearer tokens against PostgreSQL, caching answers for `cache_s` seconds
    (a revoke reaches other API replicas within that time; this one at once). Only known tokens
    are cached (a flood of bogus ones cannot evict them), and failed attempts are counted per
    client address: past `fail_limit` in `fail_window_s`, the address's invalid tokens get 429 (its
    valid tokens keep working: the throttle is for guessing, not for the address)."""

    def __init__(self, db: Database, *, cache_s: float = 5.0, redis: Any = None, prefix: str = "fp",
                 fail_limit: int = 20, fail_window_s: int = 60) -> None:
        self.db = db
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, Any]] = {}
        self.redis, self.prefix = redis, prefix
        self.fail_limit, self.fail_window_s = fail_limit, max(1, fail_window_s)

    def forget(self) -> None:
        self._cache.clear()

    async def _throttled(self, addr: str) -> None:
        if self.redis is None or self.fail_limit <= 0:
            return
        w = await authfail_count(self.redis, self.prefix, addr, self.fail_window_s)
        if w.count >= self.fail_limit:
            raise RateLimited(f"too many failed authentications from {addr}; retry in {w.retry_after}s",
                              limit=self.fail_limit, window_s=self.fail_window_s, retry_after=w.retry_after)

    async def _failed(self, addr: str, message: str) -> Unauthorized:
        if self.redis is not None and self.fail_limit > 0:
            await authfail_hit(self.redis, self.prefix, addr, self.fail_window_s)
        return Unauthorized(message)

    async def authenticate(self, header: str | None, addr: str) -> Principal:
        if not header:
            raise Unauthorized("send 'Authorization: Bearer <token>' (create one with `fencepost token create`)")
        # Failed attempts are counted per address, but only invalid tokens are throttled: a valid token
        # from an address that also sent bad ones (a shared NAT, a misconfigured neighbour) keeps working.
        scheme, _, secret = header.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            await self._throttled(addr)
            raise await self._failed(addr, "the Authorization header must be 'Bearer <token>'")
        if len(secret) > 200:
            await self._throttled(addr)
            raise await self._failed(addr, "unknown, expired or revoked token")
        digest = hash_secret(secret)
        now = time.monotonic()
        hit = self._cache.get(digest)
        row: Any  # the api_token_by_hash row Struct
        if hit is not None and hit[0] > now:
            row = hit[1]
        else:
            row = await self.db.row("api_token_by_hash", digest)
            if row is not None and row.revoked_at is None and not row.expired and not row.maker_ended:
                await self.db.execute("api_token_touch", row.id)
                if len(self._cache) >= 10_000:
                    self._cache.pop(next(iter(self._cache)))  # the oldest entry, not every entry
                self._cache[digest] = (now + self.cache_s, row)
        if row is None or row.revoked_at is not None or row.expired or row.maker_ended:
            await self._throttled(addr)
            raise await self._failed(addr, "unknown, expired or revoked token (or the token that made it is)")
        return Principal(id=row.id, role=row.role, queues=tuple(row.queues or ()), name=row.name,
                         addr=addr, expires_at=row.expires_at)


class RateLimiter:
    """A fixed-window request counter per token in Redis (shared by every API replica)."""

    def __init__(self, redis: Any, prefix: str, *, limit: int, window_s: int) -> None:
        self.redis, self.prefix = redis, prefix
        self.limit, self.window_s = limit, max(1, window_s)

    async def hit(self, token_id: int) -> None:
        if self.limit <= 0:
            return
        w = await rate_hit(self.redis, self.prefix, token_id, self.window_s)
        if w.count > self.limit:
            raise RateLimited(f"token {token_id} made more than {self.limit} requests in {self.window_s}s; "
                              f"retry in {w.retry_after}s", limit=self.limit, window_s=self.window_s,
                              retry_after=w.retry_after)
