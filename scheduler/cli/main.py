"""`fencepost`: a thin click CLI that parses, delegates, and prints one clear line on error.

The root group is here; every command lives at module level in its area module and is added
below, from one explicit list. Shared helpers and the exit-code table: fencepost.cli.common."""

from __future__ import annotations

import logging

import click

from fencepost import __version__
from fencepost.cli.api import api
from fencepost.cli.audit import audit
from fencepost.cli.batch import batch
from fencepost.cli.common import RootGroup, store_settings
from fencepost.cli.control import RUN_COMMANDS
from fencepost.cli.dev import dev
from fencepost.cli.loadtest import loadtest
from fencepost.cli.queue import queue
from fencepost.cli.reconcile import reconcile
from fencepost.cli.retention import retention
from fencepost.cli.review import review
from fencepost.cli.runs import dlq, events, ls, status, submit
from fencepost.cli.scale import scale_hint
from fencepost.cli.schedule import schedule, trigger
from fencepost.cli.services import db, demo, reconciler, worker
from fencepost.cli.token import api_token_from, token
from fencepost.cli.workers import workers
from fencepost.cli.workflow import workflow
from fencepost.core.config import Settings
from fencepost.core.logs import setup_logging

__all__ = ["cli", "main"]


@click.group(cls=RootGroup)
@click.version_option(__version__, prog_name="fencepost", message="%(prog)s %(version)s")
@click.option("--redis-url", envvar="FENCEPOST_REDIS_URL", help="Redis URL (env FENCEPOST_REDIS_URL).")
@click.option("--database-url", envvar="FENCEPOST_DATABASE_URL", help="PostgreSQL URL (env FENCEPOST_DATABASE_URL).")
@click.option("--prefix", envvar="FENCEPOST_PREFIX", help="Redis key prefix (env FENCEPOST_PREFIX).")
@click.option("--log-format", type=click.Choice(["auto", "json", "text"]), default="auto",
              envvar="FENCEPOST_LOG_FORMAT")
@click.option("-v", "--verbose", is_flag=True)
@click.option("--api", "api_url", envvar="FENCEPOST_API_URL",
              help="Talk to this Fencepost API instead of Redis/PostgreSQL (env FENCEPOST_API_URL).")
@click.option("--token", "api_token", envvar="FENCEPOST_API_TOKEN",
              help="API token for --api (env FENCEPOST_API_TOKEN; on the command line it shows in `ps`: a warning).")
@click.option("--token-file", "api_token_file", envvar="FENCEPOST_API_TOKEN_FILE", type=click.Path(dir_okay=False),
              help="Read the API token from this file (env FENCEPOST_API_TOKEN_FILE).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, database_url: str | None, prefix: str | None,
        log_format: str, verbose: bool, api_url: str | None, api_token: str | None, api_token_file: str | None) -> None:
    """Fencepost: jobs that are never lost and never run twice by our own accident."""
    setup_logging(log_format, logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("httpx").setLevel(logging.DEBUG if verbose else logging.WARNING)  # --api: no line per request
    ctx.obj = Settings.from_env(redis_url=redis_url, database_url=database_url, prefix=prefix)
    ctx.obj = store_settings(ctx, ctx.obj, api=bool(api_url))  # the one rule of fencepost.core.stores
    api_token = api_token_from(ctx, api_token, api_token_file)
    ctx.meta["fencepost.api"] = (api_url, api_token)  # read by fencepost.cli.common.operator


COMMANDS: list[click.Command] = [
    submit, status, ls, events, dlq, *RUN_COMMANDS, queue, review,  # runs and the operator's commands
    schedule, trigger, workflow, batch,
    worker, reconciler, db, demo, api, dev,  # services
    reconcile, retention, scale_hint, token, audit, loadtest, workers,  # operations
]
"""Every top-level command, by area (`fencepost --help` lists them sorted by name)."""

for _command in COMMANDS:
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="fencepost")


if __name__ == "__main__":
    main()
