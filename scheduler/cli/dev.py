"""`fencepost dev up|down|env`: the embedded Redis + PostgreSQL pair kept in a folder, and the default
every other command falls back to when no URLs are set, so the demo's data stays reachable.

With neither FENCEPOST_REDIS_URL nor FENCEPOST_DATABASE_URL (nor --redis-url / --database-url,
FENCEPOST_REDIS_SENTINELS, --api) set, a store command attaches to the pair in FENCEPOST_EMBEDDED_DIR
(default ./.fencepost), starting it if need be, and says so in one line on stderr."""

from __future__ import annotations

import os
import shlex
import sys

import click
import msgspec

from fencepost.cli.common import EXIT_REFUSED, HELP_META
from fencepost.core.config import Settings
from fencepost.dev.embedded import DEFAULT_DIR, DIR_ENV, EmbeddedPair, EmbeddedServerError, attach, down, up

__all__ = ["dev", "with_embedded_default"]

NO_STORE_COMMANDS = frozenset({"dev", "demo"})
"""Commands that do not take the embedded default from the root group (the demo picks its own stores)."""

dir_option = click.option("--dir", "base_dir", default=DEFAULT_DIR, show_default=True, envvar=DIR_ENV,
                          help=f"The embedded servers' folder (env {DIR_ENV}).")


def _up(base_dir: str) -> EmbeddedPair:
    """up(), with a failure as one `error:` line (the servers' log tails go to the logs in BASE_DIR)."""
    try:
        return up(base_dir)
    except EmbeddedServerError as exc:
        click.echo(f"error: {str(exc).splitlines()[0]} (logs in {base_dir}/)", err=True)
        sys.exit(EXIT_REFUSED)


def with_embedded_default(ctx: click.Context, settings: Settings, configured: bool) -> Settings:
    """SETTINGS, or (when nothing is CONFIGURED and the subcommand needs the stores) the same Settings
    pointed at the embedded pair, started on demand; one line on stderr says which."""
    if (configured or ctx.invoked_subcommand in NO_STORE_COMMANDS or ctx.invoked_subcommand is None
            or ctx.resilient_parsing or ctx.meta.get(HELP_META)
            or os.environ.get("FENCEPOST_REDIS_SENTINELS")):
        return settings
    base_dir = os.environ.get(DIR_ENV) or DEFAULT_DIR
    pair = _up(base_dir)
    click.echo(f"fencepost: no FENCEPOST_REDIS_URL / FENCEPOST_DATABASE_URL set: using the embedded servers in "
               f"{base_dir}/ ({'started now' if pair.started else 'running'}; `fencepost dev down` stops them)", err=True)
    return msgspec.structs.replace(settings, redis_url=pair.redis_url, database_url=pair.database_url)


@click.group()
def dev() -> None:
    """The embedded Redis + PostgreSQL pair for trying things out (not for production)."""


@dev.command("up")
@dir_option
def dev_up(base_dir: str) -> None:
    """Start the pair in its folder (or find it running) and print its URLs."""
    pair = _up(base_dir)
    click.echo(f"{'started' if pair.started else 'already running'}: redis {pair.redis_url}, "
               f"postgresql {pair.database_url} (data in {base_dir}/)")


@dev.command("down")
@dir_option
@click.option("--purge", is_flag=True, help="Also delete the data (the folder, and its copy under /var/tmp as root).")
def dev_down(base_dir: str, purge: bool) -> None:
    """Stop the pair (PostgreSQL's data stays in the folder for the next `up`, unless --purge)."""
    stopped = down(base_dir, purge=purge)
    click.echo(("stopped" if stopped else f"not running in {base_dir}/") + ("; data deleted" if purge else ""))


@dev.command("env")
@dir_option
def dev_env(base_dir: str) -> None:
    """Print `export` lines for the pair's URLs, starting it if need be: `eval "$(fencepost dev env)"`."""
    pair = attach(base_dir) or _up(base_dir)
    click.echo(f"export FENCEPOST_REDIS_URL={shlex.quote(pair.redis_url)}")
    click.echo(f"export FENCEPOST_DATABASE_URL={shlex.quote(pair.database_url)}")
