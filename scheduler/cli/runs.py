"""`fencepost submit / status / ls / events / dlq`: submit one run and look at runs and their history.

Each command is written once against the operator protocol (fencepost.core.views.Operator): the
stores through a Client, or the HTTP API with --api."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from fencepost.cli.common import (
    EXIT_UNSUCCESSFUL,
    Checked,
    async_command,
    fmt,
    json_arg,
    json_option,
    operator,
    print_json,
    table,
    to_json,
    warn_if_recorder_silent,
)
from fencepost.core import cursors
from fencepost.core.config import Settings
from fencepost.core.models import Submit
from fencepost.core.states import DEAD, Status
from fencepost.core.views import Attempt, Checkpoint, Run, RunProgress

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
@click.option("--priority", type=Checked("priority"))
@click.option("--delay", type=Checked("delay"), help="Seconds from now.")
@click.option("--timeout", type=Checked("timeout"))
@click.option("--max-retries", type=Checked("max_retries"))
@click.option("--idempotency-key", type=Checked("idempotency_key"))
@click.option("--tenant", type=Checked("tenant"), help="Who the run is for (a queue's tenants share dispatch by weight).")
@click.option("--concurrency-key", type=Checked("concurrency_key"),
              help="Limit runs sharing this key (default: the handler's declared key).")
@click.option("--concurrency-limit", type=Checked("concurrency_limit"), help="At most this many runs of the key leased at once.")
@click.option("--rate-key", type=Checked("rate_key"), help="Runs sharing this key share a rate limit (default: the handler's).")
@click.option("--rate-limit", help="At most this many starts of the key per interval, like 100/1s or 5/250ms.")
@click.option("--wait", "wait_s", type=float, help="Wait up to this many seconds for the outcome.")
@async_command
async def submit(settings: Settings, handler: str, args_json: str | None, kwargs_json: str | None, queue: str | None,
                 priority: int | None, delay: float | None, timeout: float | None, max_retries: int | None,
                 idempotency_key: str | None, tenant: str | None, concurrency_key: str | None,
                 concurrency_limit: int | None, rate_key: str | None, rate_limit: str | None,
                 wait_s: float | None) -> None:
    """Submit one run of HANDLER; prints its run id."""
    args = json_arg(args_json, "--args", list)
    kwargs = json_arg(kwargs_json, "--kwargs", dict)
    req = Submit(handler=handler, args=tuple(args), kwargs=kwargs, queue=queue, priority=priority, delay=delay,
                 timeout=timeout, max_retries=max_retries, idempotency_key=idempotency_key, tenant=tenant,
                 concurrency_key=concurrency_key, concurrency_limit=concurrency_limit, rate_key=rate_key,
                 rate_limit=rate_limit)
    async with operator(settings) as op:
        (run_id,) = await op.submit_many([req])
        click.echo(run_id)
        if wait_s is not None:
            out = await op.wait(run_id, timeout=wait_s)
            _print_outcome(out.status, out.result, out.error, out.error_class, out.reason)


_DEAD = frozenset(s.value for s in DEAD)  # the dead-letter states


def _print_outcome(status: str, result: Any, error: str | None, error_class: str | None, reason: str | None) -> None:
    """The outcome as one JSON line (with `error_class` and `reason` unless it SUCCEEDED); exit 3
    unless the run SUCCEEDED (scripts test `$?`)."""
    out: dict[str, Any] = {"status": status, "result": result, "error": error}
    if status != Status.SUCCEEDED:
        out.update(error_class=error_class, reason=reason)
    click.echo(json.dumps(out, default=str))
    if status != Status.SUCCEEDED:
        sys.exit(EXIT_UNSUCCESSFUL)


@click.command()
@click.argument("run_id", type=int)
@json_option
@async_command
async def status(settings: Settings, run_id: int, as_json: bool) -> None:
    """Show one run: its live state and version (for --version), arguments, tenant, concurrency
    key, progress (the latest checkpoint), last error and attempts."""
    async with operator(settings) as op:
        run = await op.run(run_id)  # the record with the live state Redis holds (core.views.overlay)
        ckpt, attempts = await op.checkpoint(run_id), await op.attempts(run_id)
        await warn_if_recorder_silent(op)
    shown = {k: v for k, v in to_json(run).items() if k not in ("result", "progress", "arguments_bytes",
                                                                  "arguments_truncated", "arguments_preview")}
    checkpoint = None if ckpt is None else {k: v for k, v in to_json(ckpt).items() if k != "state"}
    if as_json:
        print_json({**shown, "result": run.result, "progress": checkpoint, "reported_progress": run.progress,
                    "attempts": attempts})
        return
    _print_run(run, run.result, ckpt, attempts, run.progress)


def _progress_line(p: RunProgress) -> str:
    """`40/100 (40%) copying, attempt 2, at ...` from a ctx.progress() report."""
    done, total = p["done"], p.get("total")
    text = f"{done:g}" + (f"/{total:g}" if total is not None else "")
    if total:
        text += f" ({100 * done / total:.0f}%)"
    if p.get("message"):
        text += f" {p['message']}"
    return f"{text}, attempt {p['attempt']}, at {fmt(p['updated_at'])}"


def _print_run(run: Run, result: Any, ckpt: Checkpoint | None, attempts: list[Attempt],
               reported: RunProgress | None = None) -> None:
    for k in ("id", "handler", "queue", "status", "recorded_status", "version", "reason", "priority", "attempt",
              "max_retries", "token", "lease_owner", "run_at", "created_at", "started_at", "finished_at",
              "last_error_class", "idempotency_key", "tenant", "concurrency_key", "concurrency_limit"):
        if run.get(k) not in (None, ""):
            click.echo(f"{k:17} {fmt(run[k])}")
    if run.args is not None:
        click.echo(f"{'arguments':17} {_clip(json.dumps(run['args'], default=str))}"
                   + (f" {_clip(json.dumps(run['kwargs'], default=str))}" if run.get("kwargs") else ""))
    if result is not None:
        click.echo(f"{'result':17} {_clip(json.dumps(result, default=str))}")
    if run.get("last_error"):
        click.echo(f"{'last_error':17} {fmt(run['last_error'].splitlines()[0][:200])}")
    for flag in ("pause_requested", "stop_requested", "cancel_requested", "forced", "needs_compensation"):
        if run.get(flag):
            click.echo(f"{flag:17} yes")
    if reported is not None:
        click.echo(f"{'progress':17} {fmt(_progress_line(reported))}")
    if ckpt is not None:
        done = f"processed {ckpt['processed']}, " if ckpt.get("processed") is not None else ""
        label = "checkpoint" if reported is not None else "progress"
        click.echo(f"{label:17} {done}checkpoint version {ckpt['version']}, schema v{ckpt['schema_version']}, "
                   f"written {fmt(ckpt['updated_at'])} by attempt {ckpt['attempt']}")
    click.echo("")
    table(attempts, ["attempt", "worker_id", "token", "started_at", "finished_at", "outcome", "error_class"])


def _clip(text: str, width: int = 200) -> str:
    return fmt(text if len(text) <= width else text[:width - 1] + "…")


def cursor_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--cursor (start after the page that printed it) and --all (every page, --limit rows at a time)."""
    f = click.option("--all", "all_pages", is_flag=True, help="Every page, not only the first.")(f)
    return click.option("--cursor", help="Start after the page that printed this cursor (`next page: --cursor ...`).")(f)


async def pages(fetch: Callable[[str | None], Awaitable[Sequence[Any]]], kind: str, limit: int, cursor: str | None,
                all_pages: bool) -> list[Any]:
    """One page after CURSOR (or every page): its rows; the cursor of the next page, if the last one was full,
    goes to stderr (a page's cursor is the key of its last row, fencepost.core.cursors)."""
    out: list[Any] = []
    while True:
        page = list(await fetch(cursor))
        out += page
        cursor = cursors.after(kind, page, limit)
        if cursor is None or not all_pages:
            break
    if cursor is not None:
        click.echo(f"next page: --cursor {cursor}", err=True)
    return out


@click.command("ls")
@click.option("--queue")
@click.option("--status", "status_")
@click.option("--handler")
@click.option("--limit", type=int, default=50, show_default=True)
@cursor_options
@json_option
@async_command
async def ls(settings: Settings, queue: str | None, status_: str | None, handler: str | None, limit: int,
             cursor: str | None, all_pages: bool, as_json: bool) -> None:
    """List runs, newest first: selected by their recorded state, shown with their live one."""
    async with operator(settings) as op:
        if queue is not None:
            await op.known_queue(queue)
        rows = await pages(lambda c: op.list_runs(queue=queue, status=status_, handler=handler, limit=limit, cursor=c),
                           "runs/id/desc", limit, cursor, all_pages)
        await warn_if_recorder_silent(op)
    print_json(rows) if as_json else table(rows, _RUN_COLS)


def _since(value: str) -> datetime:
    m = re.fullmatch(r"(\d+)([smhd])", value.strip())
    if not m:
        raise click.BadParameter(f"must look like 30s, 10m, 2h or 1d, not {value!r}", param_hint="--since")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
    return datetime.now(UTC) - timedelta(**{unit: int(m.group(1))})


@click.command()
@click.argument("run_id", type=int, required=False)
@click.option("--since", help="Fleet history since 30s / 10m / 2h / 1d ago (without RUN_ID).")
@click.option("--type", "type_", help="Only events of this type (lease_expired, stop_escalated, ...).")
@click.option("--queue")
@click.option("--limit", type=int, default=100, show_default=True,
              help="The fleet's events per page (a run's: all of them, unless --cursor).")
@cursor_options
@json_option
@async_command
async def events(settings: Settings, run_id: int | None, since: str | None, type_: str | None, queue: str | None,
                 limit: int, cursor: str | None, all_pages: bool, as_json: bool) -> None:
    """The append-only history of one run, or of the fleet (--since/--type)."""
    start = _since(since or "1h")  # a malformed --since is a usage error before anything connects
    async with operator(settings) as op:
        if run_id is not None and cursor is None:
            rows = await op.events(run_id)
        elif run_id is not None:
            rows = await pages(lambda c: op.events(run_id, limit=limit, cursor=c), "run_events", limit, cursor,
                               all_pages)
        else:
            if queue is not None:
                await op.known_queue(queue)
            rows = await pages(lambda c: op.fleet_events(start, type_, queue, limit, cursor=c), "events", limit,
                               cursor, all_pages)
    if as_json:
        print_json(rows)
    else:
        table(rows, _EVENT_COLS if run_id is not None else _FLEET_COLS)


@click.command()
@click.option("--queue")
@click.option("--limit", type=int, default=50, show_default=True)
@json_option
@async_command
async def dlq(settings: Settings, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead-letter view: runs that FAILED or TIMED_OUT for good."""
    async with operator(settings) as op:
        if queue is not None:
            await op.known_queue(queue)
        rows = await op.dead_letter(queue=queue, limit=limit)
    print_json(rows) if as_json else table(rows, _DLQ_COLS)
