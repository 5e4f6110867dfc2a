"""What every CLI area module shares: running an async command with the Settings the root group
put in the click context, turning errors into one line and an exit code, the --api switch, and
printing tables. Area modules import these at the top; nothing here knows about any command.

Exit codes (the one table; the README repeats it):

    0    done
    1    refused or failed, with one line on stderr (`error: ...`): a typed Fencepost error
         (bad input, wrong state, unknown run, timeout of --wait, ...), a store refusing the
         request, a store-only command given --api; also `reconcile --check` that found drift,
         a bulk command without --yes (it only counted), a demo whose runs did not finish
    2    usage error reported by click (unknown option, missing argument, bad value);
         `loadtest` that saw errors in the runs
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import click
from prometheus_client import start_http_server
from redis.exceptions import RedisError

from fencepost.apiclient import from_context, require_store
from fencepost.core.config import Settings
from fencepost.core.errors import FencepostError

try:
    import uvloop
except ImportError:  # no uvloop on this platform: the default loop
    uvloop = None  # type: ignore[assignment]

__all__ = [
    "EXIT_CODES",
    "EXIT_INTERRUPTED",
    "EXIT_LOADTEST_ERRORS",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_USAGE",
    "actor",
    "async_command",
    "exit_on_error",
    "fmt",
    "from_context",
    "json_arg",
    "metrics_port_option",
    "require_store",
    "run",
    "serve_metrics",
    "table",
]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_LOADTEST_ERRORS = EXIT_USAGE  # shares 2 with click's usage errors, as it always has (CI scripts test for it)
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done",
    EXIT_REFUSED: "refused or failed (one `error: ...` line on stderr); reconcile --check found drift; "
                  "a bulk command without --yes; the demo's runs did not finish",
    EXIT_USAGE: "usage error (click: unknown option, missing argument, bad value); loadtest saw errors",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
"""The exit codes of every `fencepost` command (see the module docstring)."""

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    """Run a coroutine to completion on uvloop when installed (workers and the demo run on it too)."""
    if uvloop is None:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type, no-any-return]


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    """Typed errors and store refusals become one line on stderr and exit code 1; Ctrl-C is 130."""
    try:
        yield
    except FencepostError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    except (asyncpg.PostgresError, RedisError) as exc:  # a store refused the request: say so, briefly
        kind = "postgresql" if isinstance(exc, asyncpg.PostgresError) else "redis"
        hint = "; run `fencepost db upgrade`" if isinstance(exc, (asyncpg.UndefinedColumnError,
                                                                   asyncpg.UndefinedTableError)) else ""
        click.echo(f"error: {kind}: {exc}{hint}", err=True)
        sys.exit(EXIT_REFUSED)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


def async_command(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """Make an async function a click callback: it gets the Settings the root group built (the click
    context's obj) as its first argument and runs under `exit_on_error`."""

    @functools.wraps(fn)
    @click.pass_obj
    def wrapper(settings: Settings, *args: Any, **kwargs: Any) -> Any:
        with exit_on_error():
            return run(fn(settings, *args, **kwargs))

    return wrapper


def actor() -> str:
    """Who a control command is recorded as acting for: `cli:<login>`."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


metrics_port_option = click.option("--metrics-port", type=int, default=0, envvar="FENCEPOST_METRICS_PORT",
                                   help="Serve Prometheus /metrics on this port (0: off).")
"""The --metrics-port option of every long-running service (worker, reconciler, trigger)."""


def serve_metrics(port: int) -> None:
    """/metrics for Prometheus on PORT (0: off); bound to FENCEPOST_METRICS_ADDR (default loopback)."""
    if port:
        start_http_server(port, addr=os.environ.get("FENCEPOST_METRICS_ADDR", "127.0.0.1"))


def json_arg(value: str | None, what: str, kind: type) -> Any:
    """A JSON option (--args, --kwargs) decoded and checked to be a KIND; missing: an empty KIND."""
    if value is None:
        return kind()
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"{what} must be a JSON {kind.__name__}")
    return parsed


def fmt(v: Any) -> str:
    """One table cell: times to the millisecond, bytes as their size, text cut to its first line."""
    if isinstance(v, datetime):
        return v.isoformat(timespec="milliseconds")
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    return "" if v is None else str(v).splitlines()[0][:80] if isinstance(v, str) else str(v)


def table(rows: list[dict[str, Any]], cols: list[str]) -> None:
    """Print ROWS as aligned columns COLS (upper-case headers), or `(none)`."""
    if not rows:
        click.echo("(none)")
        return
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths)))
