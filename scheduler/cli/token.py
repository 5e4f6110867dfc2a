"""`fencepost token create / revoke / ls`: API tokens (stored as sha256; the secret is shown once).

Talks to PostgreSQL directly (bootstrapping the first admin token needs no API), or to the
API with --api and an admin token."""

from __future__ import annotations

from typing import Any

import click

from fencepost.api.auth import create_token
from fencepost.cli.common import actor, async_command, from_context, table
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.record import Database

__all__ = ["token"]


@click.group()
def token() -> None:
    """API tokens for the HTTP API, the dashboard and `--api` CLI use."""


@token.command("create")
@click.option("--role", type=click.Choice(["producer", "operator", "admin"]), required=True)
@click.option("--queue", "queues", multiple=True, help="Scope the token to this queue (repeatable; default all).")
@click.option("--name", help="Who or what holds it (shown in `token ls`).")
@async_command
async def create(settings: Settings, role: str, queues: tuple[str, ...], name: str | None) -> None:
    """Create a token and print its secret (shown only now: only its sha256 is stored)."""
    api = from_context()
    if api is not None:
        row = api.request("POST", "/v1/tokens", {"role": role, "queues": list(queues), "name": name})
        secret = row["secret"]
    else:
        db = await Database(settings.database_url, max_size=1).connect()
        try:
            row, secret = await create_token(db, role, list(queues), name, actor())
        finally:
            await db.close()
    scope = ", ".join(row["queues"]) or "all queues"
    click.echo(f"token {row['id']} ({role}, {scope}){' ' + repr(name) if name else ''}", err=True)
    click.echo("store this secret now; it cannot be shown again:", err=True)
    click.echo(secret)


@token.command("revoke")
@click.argument("token_id", type=int)
@async_command
async def revoke(settings: Settings, token_id: int) -> None:
    """Revoke a token (API replicas stop accepting it within their token cache time, 5 s)."""
    api = from_context()
    if api is not None:
        api.request("DELETE", f"/v1/tokens/{token_id}")
    else:
        db = await Database(settings.database_url, max_size=1).connect()
        try:
            row = await db.fetchrow("api_token_revoke", token_id)
        finally:
            await db.close()
        if row is None:
            raise InvalidInput(f"no token with id {token_id}", field="token_id")
    click.echo(f"token {token_id}: revoked")


@token.command("ls")
@async_command
async def ls(settings: Settings) -> None:
    """List tokens (never their secrets)."""
    api = from_context()
    rows: list[dict[str, Any]]
    if api is not None:
        rows = api.request("GET", "/v1/tokens")
    else:
        db = await Database(settings.database_url, max_size=1).connect()
        try:
            rows = [dict(r) for r in await db.fetch("api_token_list")]
        finally:
            await db.close()
    for r in rows:
        r["queues"] = ",".join(r["queues"]) or "*"
        r["state"] = "revoked" if r.get("revoked_at") else "active"
    table(rows, ["id", "name", "role", "queues", "state", "created_at", "last_used_at", "created_by"])
