"""`fencepost submit / status / ls / events / dlq`: submit one run and look at runs and their history."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from fencepost.cli.common import async_command, fmt, from_context, json_arg, table
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import decode_result

__all__ = ["dlq", "events", "ls", "status", "submit"]

_RUN_COLS = ["id", "handler", "queue", "status", "attempt", "created_at", "finished_at", "last_error_class"]
_DLQ_COLS = ["id", "handler", "queue", "status", "attempt", "finished_at", "reason", "last_error_class", "last_error"]
_EVENT_COLS = ["at", "type", "from_status", "to_status", "attempt", "worker_id", "actor", "reason", "error_class"]
_FLEET_COLS = ["at", "run_id", "handler", "type", "to_status", "attempt", "worker_id", "actor", "reason",
               "error_class"]


@click.command()
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
@async_command
async def submit(settings: Settings, handler: str, args_json: str | None, kwargs_json: str | None, queue: str | None,
                 priority: int | None, delay: float | None, timeout: float | None, max_retries: int | None,
                 idempotency_key: str | None, tenant: str | None, concurrency_key: str | None,
                 concurrency_limit: int | None, wait_s: float | None) -> None:
    """Submit one run of HANDLER; prints its run id."""
    args = json_arg(args_json, "--args", list)
    kwargs = json_arg(kwargs_json, "--kwargs", dict)
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


@click.command()
@click.argument("run_id", type=int)
@async_command
async def status(settings: Settings, run_id: int) -> None:
    """Show one run: state, attempts, last error."""
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
            click.echo(f"{k:17} {fmt(run[k])}")
    if result is not None:
        click.echo(f"{'result':17} {json.dumps(result, default=str)}")
    if run.get("last_error"):
        click.echo(f"{'last_error':17} {run['last_error'].splitlines()[0][:200]}")
    for flag in ("pause_requested", "stop_requested", "cancel_requested", "forced", "needs_compensation"):
        if run.get(flag):
            click.echo(f"{flag:17} yes")
    if ckpt is not None:
        click.echo(f"{'checkpoint':17} version {ckpt['version']}, processed {ckpt['processed']}, "
                   f"schema v{ckpt['schema_version']}, written {fmt(ckpt['updated_at'])} by attempt {ckpt['attempt']}")
    click.echo("")
    table(attempts, ["attempt", "worker_id", "token", "started_at", "finished_at", "outcome", "error_class"])


@click.command("ls")
@click.option("--queue")
@click.option("--status", "status_")
@click.option("--handler")
@click.option("--limit", type=int, default=50, show_default=True)
@async_command
async def ls(settings: Settings, queue: str | None, status_: str | None, handler: str | None, limit: int) -> None:
    """List runs, newest first."""
    api = from_context()
    if api is not None:
        table(api.list_runs(queue=queue, status=status_.upper() if status_ else None, handler=handler, limit=limit),
              _RUN_COLS)
        return
    async with Client(settings=settings) as client:
        rows = await client.list_runs(queue=queue, status=status_.upper() if status_ else None, handler=handler,
                                      limit=limit)
        table(rows, _RUN_COLS)


def _since(value: str) -> datetime:
    m = re.fullmatch(r"(\d+)([smhd])", value.strip())
    if not m:
        raise click.BadParameter(f"--since must look like 30s, 10m, 2h or 1d, not {value!r}")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
    return datetime.now(UTC) - timedelta(**{unit: int(m.group(1))})


@click.command()
@click.argument("run_id", type=int, required=False)
@click.option("--since", help="Fleet history since 30s / 10m / 2h / 1d ago (without RUN_ID).")
@click.option("--type", "type_", help="Only events of this type (lease_expired, stop_escalated, ...).")
@click.option("--queue")
@click.option("--limit", type=int, default=100, show_default=True)
@async_command
async def events(settings: Settings, run_id: int | None, since: str | None, type_: str | None, queue: str | None,
                 limit: int) -> None:
    """The append-only history of one run, or of the fleet (--since/--type)."""
    api = from_context()
    if api is not None:
        if run_id is not None:
            table(api.events(run_id), _EVENT_COLS)
        else:
            table(api.fleet_events(_since(since or "1h"), type_, queue, limit), _FLEET_COLS)
        return
    async with Client(settings=settings) as client:
        if run_id is not None:
            table(await client.events(run_id), _EVENT_COLS)
            return
        start = _since(since or "1h")
        rows = await client.stores.db.fetch("events_since", start, type_, queue, limit)
        table([dict(r) for r in rows], _FLEET_COLS)


@click.command()
@click.option("--queue")
@click.option("--limit", type=int, default=50, show_default=True)
@async_command
async def dlq(settings: Settings, queue: str | None, limit: int) -> None:
    """Dead-letter view: runs that FAILED or TIMED_OUT for good."""
    api = from_context()
    if api is not None:
        table(api.dead_letter(queue=queue, limit=limit), _DLQ_COLS)
        return
    async with Client(settings=settings) as client:
        table(await client.dead_letter(queue=queue, limit=limit), _DLQ_COLS)
