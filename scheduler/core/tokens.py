"""API tokens in the record: create (the secret shown once, its sha256 stored), revoke, list; each
change audited in its own transaction. The API (api/auth.py: scope rules for a token that makes
another, authentication) and `fencepost.Client` (so `fencepost token` is written once against the
operator protocol) both store them through here."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from fencepost.core import audit, validate
from fencepost.core.errors import InvalidInput
from fencepost.core.keys import valid_queue_name
from fencepost.core.record import Database

__all__ = ["MAX_EXPIRES_S", "ROLES", "TOKEN_PREFIX", "check_new", "hash_secret", "insert", "list_all", "new_secret",
           "revoke"]

ROLES = ("producer", "operator", "admin")
TOKEN_PREFIX = "fp_"
MAX_EXPIRES_S = 10 * 365 * 86400


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def check_new(role: str, queues: Sequence[str], name: str | None, expires_in: float | None) -> None:
    """InvalidInput unless ROLE, QUEUES, NAME and EXPIRES_IN make a valid token."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}, not {role!r}", field="role")
    for q in queues:
        if not valid_queue_name(q):
            raise InvalidInput(f"queue name {q!r} is not valid", field="queues")
    if name is not None:
        validate.text("name", name)
    if expires_in is not None and not (isinstance(expires_in, (int, float)) and 60 <= expires_in <= MAX_EXPIRES_S):
        raise InvalidInput(f"expires_in must be between 60 s and {MAX_EXPIRES_S} s (10 years), not {expires_in!r}",
                           field="expires_in")


async def insert(db: Database, role: str, queues: Sequence[str], name: str | None, created_by: str | None, *,
                 expires_in: float | None = None, parent_id: int | None = None,
                 parent_expires_at: datetime | None = None) -> tuple[dict[str, Any], str]:
    """Store a new token (checked: `check_new`); returns (its row, the secret). Its creation is audited
    in the same transaction (actor: CREATED_BY). PARENT_ID / PARENT_EXPIRES_AT: the token making it."""
    check_new(role, queues, name, expires_in)
    secret = new_secret()
    async with db.transaction() as tx:
        row = await db.row("api_token_insert", name, role, sorted(set(queues)), hash_secret(secret), created_by,
                                None if expires_in is None else float(expires_in), parent_id, parent_expires_at,
                                conn=tx)
        assert row is not None
        await audit.write(db, tx, created_by or "unknown", "token_created", target=str(row.id),
                          data={"role": role, "queues": sorted(set(queues)), "name": name, "parent": parent_id,
                                "expires_at": None if row.expires_at is None else row.expires_at.isoformat()})
    return msgspec.structs.asdict(row), secret


async def revoke(db: Database, token_id: int, actor: str, *, reason: str = "") -> dict[str, Any] | None:
    """Revoke a token (idempotent), audited in the same transaction; None if there is no such token."""
    audit.reason(reason)
    async with db.transaction() as tx:
        row = await db.row("api_token_revoke", token_id, conn=tx)
        if row is None:
            return None
        await audit.write(db, tx, actor, "token_revoked", target=str(token_id), reason_=reason,
                          data={"role": row.role, "queues": list(row.queues or ()),
                                "descendants_revoked": row.descendants})
    return msgspec.structs.asdict(row)


async def list_all(db: Database) -> list[dict[str, Any]]:
    """Every token, newest first as api_token_list orders them (never a secret)."""
    return [msgspec.structs.asdict(r) for r in await db.rows("api_token_list")]
