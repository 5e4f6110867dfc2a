"""`fencepost worker / reconciler / db upgrade / demo`: the services and the schema. Each needs
the stores themselves, so none has an --api mode (`require_store` says so and exits 1)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

import click
import msgspec
from redis.exceptions import RedisError

from fencepost.cli.common import (
    EXIT_REFUSED,
    async_command,
    exit_on_error,
    metrics_port_option,
    require_store,
    run,
    serve_metrics,
    table,
)
from fencepost.core.config import Settings
from fencepost.core.embedded import DEFAULT_DIR, DIR_ENV
from fencepost.core.errors import FencepostError
from fencepost.core.record import Database
from fencepost.core.registry import load_registry
from fencepost.core.stores import Stores
from fencepost.core.views import recorder_silence
from fencepost.dev.demo import FINISH_WITHIN_S, demo_settings, run_demo
from fencepost.reconciler.service import Reconciler
from fencepost.worker.runtime import Worker, WorkerOptions

__all__ = ["db", "demo", "reconciler", "watch_recorder", "worker"]

log = logging.getLogger("fencepost.cli")

@click.group()
def db() -> None:
    """Schema migrations."""


@db.command("upgrade")
@async_command
async def db_upgrade(settings: Settings) -> None:
    """Apply pending migrations (idempotent; safe from many replicas at once)."""
    require_store("db upgrade")
    database = await Database(settings.database_url, max_size=1).connect()
    try:
        applied = await database.upgrade()
    finally:
        await database.close()
    click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")


@click.command()
@click.option("--app", required=True, help="module:registry holding the handlers.")
@click.option("--queue", "queues", multiple=True, default=["default"], show_default=True)
@click.option("--concurrency", type=int, default=100, show_default=True)
@click.option("--processes", type=int, default=None, help="Size of the process pool (default: CPU count).")
@click.option("--grace", type=float, default=30.0, show_default=True, help="Seconds to finish running jobs on SIGTERM.")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@metrics_port_option
@async_command
async def worker(settings: Settings, app: str, queues: tuple[str, ...], concurrency: int, processes: int | None,
                 grace: float, burst: bool, metrics_port: int) -> None:
    """Run a worker."""
    require_store("worker")
    serve_metrics(metrics_port)
    sys.path.insert(0, os.getcwd())  # --app names a module of the application in the working directory
    registry = load_registry(app)
    opts = WorkerOptions(queues=list(queues), concurrency=concurrency, grace_s=grace, burst=burst,
                         processes=processes or os.cpu_count() or 1)
    watch = asyncio.ensure_future(watch_recorder(settings))
    try:
        await Worker(registry, opts, settings=settings, app=app).run()
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


async def watch_recorder(settings: Settings) -> None:
    """While a worker runs: one warning line each time a transition has waited in Redis for a
    recorder longer than Settings.recorder_silence_s (the lag alert's threshold; checked that often),
    so a worker started without `fencepost reconciler` says that nothing records what it does."""
    stores = await Stores(settings, db_pool_size=1).connect(database=False)
    try:
        while True:
            await asyncio.sleep(settings.recorder_silence_s)
            try:
                silence = await recorder_silence(stores)
            except (FencepostError, RedisError, OSError):  # the worker itself reports a store that is down
                continue
            if silence is not None:
                log.warning(silence.message.removeprefix("warning: "), extra={"event": "recorder_silent"})
    finally:
        await stores.close()


@click.command()
@metrics_port_option
@async_command
async def reconciler(settings: Settings, metrics_port: int) -> None:
    """Run the recorder (Redis Streams -> PostgreSQL), stamps/rebuilds, reaper and outbox relay."""
    require_store("reconciler")
    serve_metrics(metrics_port)
    await Reconciler(settings).run()


@click.command()
@click.option("--dir", "base_dir", default=DEFAULT_DIR, show_default=True, envvar=DIR_ENV,
              help=f"Where embedded servers keep their data when no URLs are configured (env {DIR_ENV}).")
@click.option("--jobs", type=int, default=40, show_default=True)
@click.pass_obj
def demo(settings: Settings, base_dir: str, jobs: int) -> None:
    """Set up and run the example jobs end to end (embedded servers if none configured)."""
    require_store("demo")
    with exit_on_error(), demo_settings(base_dir, settings) as stores:
        report = run(run_demo(stores.settings, jobs))
        if not report.finished:
            click.echo(f"demo: runs did not all finish within {FINISH_WITHIN_S:g} s", err=True)
            sys.exit(EXIT_REFUSED)
        table([msgspec.structs.asdict(r) for r in report.shown], ["id", "handler", "status", "attempt", "outcome"])
        click.echo(f"\n{report.total} runs: " + ", ".join(f"{v} {k}" for k, v in sorted(report.counts.items()))
                   + f" ({report.total - len(report.shown)} more 'add' runs not shown)")
        failed = next((r.id for r in report.shown if r.status != "SUCCEEDED"), report.shown[0].id if report.shown else 1)
        click.echo(f"every transition is in PostgreSQL: try `fencepost events {failed}`, `fencepost status {failed}` "
                   "and `fencepost dlq`")
        if stores.kept is not None:
            custom = stores.kept != DEFAULT_DIR and not os.environ.get(DIR_ENV)
            where = f" (after `export {DIR_ENV}={stores.kept}`)" if custom else ""
            click.echo(f"the embedded servers keep running for them: any `fencepost` command here with no URLs set uses "
                       f"them{where}; `fencepost dev down` stops them")
