"""`fencepost`: a thin click CLI that parses, delegates, and prints one clear line on error."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
from datetime import datetime
from typing import Any, Awaitable, Callable

import asyncpg
import click
from redis.exceptions import RedisError

from fencepost import __version__
from fencepost.core.config import Settings
from fencepost.core.errors import FencepostError
from fencepost.core.logs import setup_logging

__all__ = ["main"]


def _run(coro: Awaitable[Any]) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def command(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Run an async command; typed errors become one line on stderr and exit code 1."""

    @functools.wraps(fn)
    @click.pass_obj
    def wrapper(settings: Settings, *args: Any, **kwargs: Any) -> Any:
        try:
            return _run(fn(settings, *args, **kwargs))
        except FencepostError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except (asyncpg.PostgresError, RedisError) as exc:  # a store refused the request: say so, briefly
            kind = "postgresql" if isinstance(exc, asyncpg.PostgresError) else "redis"
            hint = "; run `fencepost db upgrade`" if isinstance(exc, (asyncpg.UndefinedColumnError,
                                                                       asyncpg.UndefinedTableError)) else ""
            click.echo(f"error: {kind}: {exc}{hint}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            sys.exit(130)

    return wrapper


@click.group()
@click.version_option(__version__, prog_name="fencepost", message="%(prog)s %(version)s")
@click.option("--redis-url", envvar="FENCEPOST_REDIS_URL", help="Redis URL (env FENCEPOST_REDIS_URL).")
@click.option("--database-url", envvar="FENCEPOST_DATABASE_URL", help="PostgreSQL URL (env FENCEPOST_DATABASE_URL).")
@click.option("--prefix", envvar="FENCEPOST_PREFIX", help="Redis key prefix (env FENCEPOST_PREFIX).")
@click.option("--log-format", type=click.Choice(["auto", "json", "text"]), default="auto", envvar="FENCEPOST_LOG_FORMAT")
@click.option("-v", "--verbose", is_flag=True)
@click.option("--api", "api_url", envvar="FENCEPOST_API_URL",
              help="Talk to this Fencepost API instead of Redis/PostgreSQL (env FENCEPOST_API_URL).")
@click.option("--token", "api_token", envvar="FENCEPOST_API_TOKEN", help="API token for --api (env FENCEPOST_API_TOKEN).")
@click.pass_context
def cli(ctx: click.Context, redis_url: str | None, database_url: str | None, prefix: str | None,
        log_format: str, verbose: bool, api_url: str | None, api_token: str | None) -> None:
    """Fencepost: jobs that are never lost and never run twice by our own accident."""
    setup_logging(log_format, logging.DEBUG if verbose else logging.INFO)
    ctx.obj = Settings.from_env(redis_url=redis_url, database_url=database_url, prefix=prefix)
    ctx.meta["fencepost.api"] = (api_url, api_token)  # read by scheduler.apiclient.from_context


# -- database ------------------------------------------------------------------------------------
@cli.group()
def db() -> None:
    """Schema migrations."""


@db.command("upgrade")
@command
async def db_upgrade(settings: Settings) -> None:
    """Apply pending migrations (idempotent; safe from many replicas at once)."""
    from fencepost.apiclient import require_store
    from fencepost.core.record import Database

    require_store("db upgrade")

    database = await Database(settings.database_url, max_size=1).connect()
    try:
        applied = await database.upgrade()
    finally:
        await database.close()
    click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")


# -- producer ------------------------------------------------------------------------------------
def serve_metrics(port: int) -> None:
    """/metrics for Prometheus; bound to FENCEPOST_METRICS_ADDR (default loopback)."""
    if port:
        import os

        from prometheus_client import start_http_server

        start_http_server(port, addr=os.environ.get("FENCEPOST_METRICS_ADDR", "127.0.0.1"))


def _json_arg(value: str | None, what: str, kind: type) -> Any:
    if value is None:
        return kind()
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"{what} must be a JSON {kind.__name__}")
    return parsed


@cli.command()
@click.argument("handler")
@click.option("--args", "args_json", help='Positional arguments as a JSON list, e.g. \'[1, "a"]\'.')
@click.option("--kwargs", "kwargs_json", help="Keyword arguments as a JSON object.")
@click.option("--queue")
@click.option("--priority", type=int)
@click.option("--delay", type=float, help="Seconds from now.")
@click.option("--timeout", type=float)
@click.option("--max-retries", type=int)
@click.option("--idempotency-key")
@click.option("--tenant", help="Who the run is for (a queue's tenants share dispatch by weight).")
@click.option("--concurrency-key", help="Limit runs sharing this key (default: the handler's declared key).")
@click.option("--concurrency-limit", type=int, help="At most this many runs of the key leased at once.")
@click.option("--wait", "wait_s", type=float, help="Wait up to this many seconds for the outcome.")
@command
async def submit(settings: Settings, handler: str, args_json: str | None, kwargs_json: str | None, queue: str | None,
                 priority: int | None, delay: float | None, timeout: float | None, max_retries: int | None,
                 idempotency_key: str | None, tenant: str | None, concurrency_key: str | None,
                 concurrency_limit: int | None, wait_s: float | None) -> None:
    """Submit one run of HANDLER; prints its run id."""
    from fencepost.client import Client

    from fencepost.apiclient import from_context

    args = _json_arg(args_json, "--args", list)
    kwargs = _json_arg(kwargs_json, "--kwargs", dict)
    api = from_context()
    if api is not None:
        run_id = api.submit(handler, args, kwargs, queue=queue, priority=priority, delay=delay, timeout=timeout,
                            max_retries=max_retries, idempotency_key=idempotency_key, tenant=tenant,
                            concurrency_key=concurrency_key, concurrency_limit=concurrency_limit)
        click.echo(run_id)
        if wait_s is not None:
            run = api.wait(run_id, timeout=wait_s)
            _print_outcome(run["status"], run.get("result"), run.get("last_error"))
        return
    async with Client(settings=settings, actor="cli") as client:
        run_id = await client.submit(handler, *args, kwargs=kwargs, queue=queue, priority=priority, delay=delay,
                                     timeout=timeout, max_retries=max_retries, idempotency_key=idempotency_key,
                                     tenant=tenant, concurrency_key=concurrency_key,
                                     concurrency_limit=concurrency_limit)
        click.echo(run_id)
        if wait_s is not None:
            out = await client.wait(run_id, timeout=wait_s)
            _print_outcome(out.status, out.result, out.error)


def _print_outcome(status: str, result: Any, error: str | None) -> None:
    click.echo(json.dumps({"status": status, "result": result, "error": error}, default=str))


def _fmt(v: Any) -> str:
    if isinstance(v, datetime):
        return v.isoformat(timespec="milliseconds")
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    return "" if v is None else str(v).splitlines()[0][:80] if isinstance(v, str) else str(v)


def _table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    if not rows:
        click.echo("(none)")
        return
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths)))


@cli.command()
@click.argument("run_id", type=int)
@command
async def status(settings: Settings, run_id: int) -> None:
    """Show one run: state, attempts, last error."""
    from fencepost.apiclient import from_context
    from fencepost.client import Client
    from fencepost.core.models import decode_result

    api = from_context()
    if api is not None:
        run = api.get(run_id)
        result, ckpt, attempts = run.get("result"), api.checkpoint(run_id), api.attempts(run_id)
    else:
        async with Client(settings=settings) as client:
            run = await client.get(run_id)
            result = decode_result(run["result"]) if run.get("result") is not None else None
            row = await client.stores.db.fetchrow("get_checkpoint", run_id)
            ckpt = dict(row) if row is not None and row["state"] is not None else None
            attempts = await client.attempts(run_id)
    _print_run(run, result, ckpt, attempts)


def _print_run(run: dict[str, Any], result: Any, ckpt: dict[str, Any] | None, attempts: list[dict[str, Any]]) -> None:
    for k in ("id", "handler", "queue", "status", "priority", "attempt", "max_retries", "token", "lease_owner",
              "run_at", "created_at", "started_at", "finished_at", "last_error_class", "reason", "idempotency_key",
              "tenant", "concurrency_key", "concurrency_limit"):
        if run.get(k) not in (None, ""):
            click.echo(f"{k:17} {_fmt(run[k])}")
    if result is not None:
        click.echo(f"{'result':17} {json.dumps(result, default=str)}")
    if run.get("last_error"):
        click.echo(f"{'last_error':17} {run['last_error'].splitlines()[0][:200]}")
    for flag in ("pause_requested", "stop_requested", "cancel_requested", "forced", "needs_compensation"):
        if run.get(flag):
            click.echo(f"{flag:17} yes")
    if ckpt is not None:
        click.echo(f"{'checkpoint':17} version {ckpt['version']}, processed {ckpt['processed']}, "
                   f"schema v{ckpt['schema_version']}, written {_fmt(ckpt['updated_at'])} by attempt {ckpt['attempt']}")
    click.echo("")
    _table(attempts, ["attempt", "worker_id", "token", "started_at", "finished_at", "outcome", "error_class"])


@cli.command("ls")
@click.option("--queue")
@click.option("--status", "status_")
@click.option("--handler")
@click.option("--limit", type=int, default=50, show_default=True)
@command
async def ls(settings: Settings, queue: str | None, status_: str | None, handler: str | None, limit: int) -> None:
    """List runs, newest first."""
    from fencepost.apiclient import from_context
    from fencepost.client import Client

    api = from_context()
    if api is not None:
        _table(api.list_runs(queue=queue, status=status_.upper() if status_ else None, handler=handler, limit=limit),
               ["id", "handler", "queue", "status", "attempt", "created_at", "finished_at", "last_error_class"])
        return
    async with Client(settings=settings) as client:
        rows = await client.list_runs(queue=queue, status=status_.upper() if status_ else None, handler=handler,
                                      limit=limit)
        _table(rows, ["id", "handler", "queue", "status", "attempt", "created_at", "finished_at", "last_error_class"])


def _since(value: str) -> datetime:
    import re
    from datetime import timedelta, timezone

    m = re.fullmatch(r"(\d+)([smhd])", value.strip())
    if not m:
        raise click.BadParameter(f"--since must look like 30s, 10m, 2h or 1d, not {value!r}")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
    return datetime.now(timezone.utc) - timedelta(**{unit: int(m.group(1))})


@cli.command()
@click.argument("run_id", type=int, required=False)
@click.option("--since", help="Fleet history since 30s / 10m / 2h / 1d ago (without RUN_ID).")
@click.option("--type", "type_", help="Only events of this type (lease_expired, stop_escalated, ...).")
@click.option("--queue")
@click.option("--limit", type=int, default=100, show_default=True)
@command
async def events(settings: Settings, run_id: int | None, since: str | None, type_: str | None, queue: str | None,
                 limit: int) -> None:
    """The append-only history of one run, or of the fleet (--since/--type)."""
    from fencepost.apiclient import from_context
    from fencepost.client import Client

    api = from_context()
    if api is not None:
        if run_id is not None:
            _table(api.events(run_id), ["at", "type", "from_status", "to_status", "attempt", "worker_id", "actor",
                                        "reason", "error_class"])
        else:
            _table(api.fleet_events(_since(since or "1h"), type_, queue, limit),
                   ["at", "run_id", "handler", "type", "to_status", "attempt", "worker_id", "actor", "reason",
                    "error_class"])
        return
    async with Client(settings=settings) as client:
        if run_id is not None:
            _table(await client.events(run_id), ["at", "type", "from_status", "to_status", "attempt", "worker_id",
                                                 "actor", "reason", "error_class"])
            return
        start = _since(since or "1h")
        rows = await client.stores.db.fetch("events_since", start, type_, queue, limit)
        _table([dict(r) for r in rows], ["at", "run_id", "handler", "type", "to_status", "attempt", "worker_id",
                                         "actor", "reason", "error_class"])


@cli.command()
@click.option("--queue")
@click.option("--limit", type=int, default=50, show_default=True)
@command
async def dlq(settings: Settings, queue: str | None, limit: int) -> None:
    """Dead-letter view: runs that FAILED or TIMED_OUT for good."""
    from fencepost.apiclient import from_context
    from fencepost.client import Client

    api = from_context()
    if api is not None:
        _table(api.dead_letter(queue=queue, limit=limit),
               ["id", "handler", "queue", "status", "attempt", "finished_at", "reason", "last_error_class", "last_error"])
        return
    async with Client(settings=settings) as client:
        _table(await client.dead_letter(queue=queue, limit=limit),
               ["id", "handler", "queue", "status", "attempt", "finished_at", "reason", "last_error_class", "last_error"])


# -- services ------------------------------------------------------------------------------------
@cli.command()
@click.option("--app", required=True, help="module:registry holding the handlers.")
@click.option("--queue", "queues", multiple=True, default=["default"], show_default=True)
@click.option("--concurrency", type=int, default=100, show_default=True)
@click.option("--processes", type=int, default=None, help="Size of the process pool (default: CPU count).")
@click.option("--grace", type=float, default=30.0, show_default=True, help="Seconds to finish running jobs on SIGTERM.")
@click.option("--burst", is_flag=True, help="Exit once the queues are empty.")
@click.option("--metrics-port", type=int, default=0, envvar="FENCEPOST_METRICS_PORT",
              help="Serve Prometheus /metrics on this port (0: off).")
@command
async def worker(settings: Settings, app: str, queues: tuple[str, ...], concurrency: int, processes: int | None,
                 grace: float, burst: bool, metrics_port: int) -> None:
    """Run a worker."""
    import os

    from fencepost.apiclient import require_store

    require_store("worker")
    serve_metrics(metrics_port)
    from fencepost.worker.runtime import Worker, WorkerOptions

    from fencepost.core.registry import load_registry

    sys.path.insert(0, os.getcwd())
    registry = load_registry(app)
    opts = WorkerOptions(queues=list(queues), concurrency=concurrency, grace_s=grace, burst=burst,
                         processes=processes or os.cpu_count() or 1)
    await Worker(registry, opts, settings=settings, app=app).run()


@cli.command()
@click.option("--metrics-port", type=int, default=0, envvar="FENCEPOST_METRICS_PORT",
              help="Serve Prometheus /metrics on this port (0: off).")
@command
async def reconciler(settings: Settings, metrics_port: int) -> None:
    """Run the recorder (Redis Streams -> PostgreSQL), stamps/rebuilds, reaper and outbox relay."""
    from fencepost.apiclient import require_store

    require_store("reconciler")
    serve_metrics(metrics_port)
    from fencepost.reconciler.service import Reconciler

    await Reconciler(settings).run()


@cli.command()
@click.option("--dir", "base_dir", default=".fencepost", show_default=True,
              help="Where embedded servers keep their data when no URLs are configured.")
@click.option("--jobs", type=int, default=40, show_default=True)
@click.pass_context
def demo(ctx: click.Context, base_dir: str, jobs: int) -> None:
    """Set up and run the example jobs end to end (embedded servers if none configured)."""
    from fencepost.apiclient import require_store
    from fencepost.dev.demo import run_demo

    require_store("demo")

    try:
        sys.exit(run_demo(base_dir, jobs, ctx.obj))
    except FencepostError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def _add_area_commands() -> None:
    """Commands of other areas live in their own modules (cli_<area>.py) and register here."""
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(sys.modules["fencepost.cli"].__path__):
        if mod.name not in ("main", "__main__"):
            importlib.import_module(f"fencepost.cli.{mod.name}").register(cli)


_add_area_commands()


def main() -> None:
    cli(prog_name="fencepost")


if __name__ == "__main__":
    main()
