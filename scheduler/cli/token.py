"""`fencepost token create / revoke / ls`: API tokens (stored as sha256; the secret is shown once).

Through the stores (bootstrapping the first admin token needs no API), or the API with --api and an
admin token: each command is written once against fencepost.core.views.Operator."""

from __future__ import annotations

from datetime import UTC, datetime

import click
from click.core import ParameterSource

from fencepost.cli.common import actor, async_command, json_option, operator, print_json, table
from fencepost.core.config import Settings
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
    async with operator(settings, actor=actor(), redis=False) as op:
        made, secret = await op.create_token(role, queues, name=name, expires_in=ttl)
    scope = ", ".join(made.queues) or "all queues"
    until = f", expires {made.expires_at}" if made.expires_at else ""
    click.echo(f"token {made.id} ({role}, {scope}{until}){' ' + repr(name) if name else ''}", err=True)
    click.echo("store this secret now; it cannot be shown again:", err=True)
    click.echo(secret)


@token.command("revoke")
@click.argument("token_id", type=int)
@click.option("--reason", default="", help="Recorded in the audit log with your name.")
@async_command
async def revoke(settings: Settings, token_id: int, reason: str) -> None:
    """Revoke a token (API replicas stop accepting it within their token cache time, 5 s)."""
    async with operator(settings, actor=actor(), redis=False) as op:
        await op.revoke_token(token_id, reason=reason)
    click.echo(f"token {token_id}: revoked")


@token.command("ls")
@json_option
@async_command
async def ls(settings: Settings, as_json: bool) -> None:
    """List tokens (never their secrets)."""
    async with operator(settings, redis=False) as op:
        rows = await op.tokens()
    if as_json:
        print_json(rows)
        return
    now = datetime.now(UTC)
    shown = [{**{f: r[f] for f in r}, "queues": ",".join(r.queues) or "*",
              "state": "revoked" if r.revoked_at else "expired" if r.expires_at and r.expires_at <= now else "active"}
             for r in rows]
    table(shown, ["id", "name", "role", "queues", "state", "created_at", "expires_at", "last_used_at", "created_by"])
