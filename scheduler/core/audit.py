"""The audit log of configuration changes and queue commands: one row per change, written
with the change's own statement in one PostgreSQL transaction, so a change without its
record (actor, address, reason) cannot happen. Run commands are audited as run events (their
Lua script writes the stream entry the recorder turns into the event)."""

from __future__ import annotations

from typing import Any

import msgspec

from fencepost.core import validate
from fencepost.core.record import Conn, Database

__all__ = ["address_of", "reason", "write"]


def reason(value: Any) -> str:
    """A command's reason, checked before anything takes effect (printable, at most 1000 characters)."""
    return validate.text("reason", "" if value is None else value)


def address_of(actor: str) -> str | None:
    """The client address an API actor carries (`token:<id>@<address>`), else None."""
    return actor.rpartition("@")[2] or None if "@" in actor else None


async def write(db: Database, conn: Conn, actor: str, action: str, *, queue: str | None = None,
                target: str | None = None, reason_: str = "", data: dict[str, Any] | None = None) -> None:
    """One audit row, on `conn` (the change's transaction)."""
    await db.execute("audit_insert", actor, address_of(actor), action, queue, target, reason(reason_),
                     None if data is None else msgspec.json.encode(data).decode(), conn=conn)
