"""`fencepost token create / revoke / ls`: API tokens (stored as sha256; the secret is shown once).

Talks to PostgreSQL directly (bootstrapping the first admin token needs no API), or to the
API with --api and an admin token."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click
from click.core import ParameterSource

from fencepost.api.auth import create_token, revoke_token
from fencepost.cli.common import actor, async_command, from_context, json_option, print_json, table
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.record import Database
from fencepost.reconciler.retention import parse_duration

__all__ = ["api_token_from", "token"]


def api_token_from(ctx: click.Context, token: str | None, token_file: str | None) -> str | None:
    """The API token: --token-file / FENCEPOST_API_TOKEN_FILE, else FENCEPOST_API_TOKEN, else --token
    (which other users of the machine can read in `ps`: it works, with a warning)."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                secret = f.read().strip()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {token_file}: {exc.strerror}", param_hint="--token-file") from None
        if not secret:
            raise click.BadParameter(f"{token_file} is empty", param_hint="--token-file")
        return secret
    if token and ctx.get_parameter_source("api_token") is ParameterSource.COMMANDLINE:
        click.echo("warning: --token on the command line is visible to other users (ps, shell history); "
                   "use FENCEPOST_API_TOKEN or --token-file", err=True)
    return token


@click.group()
def token() -> None:
    """API tokens for the HTTP API, the dashboard and `--api` CLI use."""


@token.command("create")
@click.option("--role", type=click.Choice(["producer", "operator", "admin"]), required=True)
@click.option("--queue", "queues", multiple=True, help="Scope the token to this queue (repeatable; default all).")
@click.option("--name", help="Who or what holds it (shown in `token ls`).")
@click.option("--expires-in", help="The token stops working after this long: 90m, 12h, 30d, 2w (default: never).")
@async_command
async def create(settings: Settings, role: str, queues: tuple[str, ...], name: str | None,
                 expires_in: str | None) -> None:
    """Create a token and print its secret (shown only now: only its sha256 is stored)."""
    ttl = None if expires_in is None else parse_duration(expires_in, what="--expires-in").total_seconds()
    api = from_context()
    if api is not None:
        row = api.request("POST", "/v1/tokens", {"role": role, "queues": list(queues), "name": name,
                                                 "expires_in": ttl})
        secret = row["secret"]
    else:
        db = await Database(settings.database_url, max_size=1).connect()
        try:
            row, secret = await create_token(db, role, list(queues), name, actor(), expires_in=ttl)
        finally:
            await db.close()
    scope = ", ".join(row["queues"]) or "all queues"
    until = f", expires {row['expires_at']}" if row.get("expires_at") else ""
    click.echo(f"token {row['id']} ({role}, {scope}{until}){' ' + repr(name) if name else ''}", err=True)
    click.echo("store this secret now; it cannot be shown again:", err=True)
    click.echo(secret)


@token.command("revoke")
@click.argument("token_id", type=int)
@click.option("--reason", default="", help="Recorded in the audit log with your name.")
@async_command
async def revoke(settings: Settings, token_id: int, reason: str) -> None:
    """Revoke a token (API replicas stop accepting it within their token cache time, 5 s)."""
    api = from_context()
    if api is not None:
        api.request("DELETE", f"/v1/tokens/{token_id}", query={"reason": reason or None})
    else:
        db = await Database(settings.database_url, max_size=1).connect()
        try:
            row = await revoke_token(db, token_id, actor(), reason=reason)
        finally:
            await db.close()
        if row is None:
            raise InvalidInput(f"no token with id {token_id}", field="token_id")
    click.echo(f"token {token_id}: revoked")


@token.command("ls")
@json_option
@async_command
async def ls(settings: Settings, as_json: bool) -> None:
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
    if as_json:
        print_json(rows)
        return
    for r in rows:
        r["queues"] = ",".join(r["queues"]) or "*"
        ends = r.get("expires_at")
        expired = isinstance(ends, datetime) and ends <= datetime.now(UTC)
        r["state"] = "revoked" if r.get("revoked_at") else "expired" if expired else "active"
    table(rows, ["id", "name", "role", "queues", "state", "created_at", "expires_at", "last_used_at", "created_by"])
