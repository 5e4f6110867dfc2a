"""What every CLI area module shares: running an async command with the Settings the root group
put in the click context, turning errors into one line and an exit code, the --api switch, and
printing tables. Area modules import these at the top; nothing here knows about any command.

Exit codes (the one table; the README and docs/cli.md repeat it):

    0    done (also a bulk command without --yes: it only counted, and said so)
    1    refused or failed, with one line on stderr (`error: ...`): a typed Fencepost error
         (a value out of range, an unknown run / queue / workflow, wrong state, timeout of
         --wait, ...), a store refusing the request, a store-only command given --api; also
         `reconcile --check` that found drift, a demo whose runs did not finish
    2    usage error: the command line itself is wrong (unknown command or option, missing
         argument, a value of the wrong type: `status abc`, `--args '[1'`, `--since 10x`),
         one line on stderr (`error: ...`)
    3    the run(s) waited for ended unsuccessfully: `submit --wait` whose run rests in any
         state but SUCCEEDED, `loadtest` that saw errors in its runs
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import getpass
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
import click
import msgspec
from prometheus_client import start_http_server
from redis.exceptions import RedisError

from fencepost.apiclient import AsyncApiClient
from fencepost.client import Client
from fencepost.core import validate
from fencepost.core.config import Settings
from fencepost.core.errors import FencepostError, InvalidInput
from fencepost.core.stores import resolve
from fencepost.core.views import Operator

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
    "EXIT_UNSUCCESSFUL",
    "EXIT_USAGE",
    "Checked",
    "Refused",
    "RootGroup",
    "actor",
    "async_command",
    "exit_on_error",
    "fmt",
    "json_arg",
    "json_option",
    "metrics_port_option",
    "operator",
    "print_json",
    "require_store",
    "run",
    "safe",
    "serve_metrics",
    "store_settings",
    "table",
    "to_json",
    "warn_if_recorder_silent",
]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNSUCCESSFUL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_LOADTEST_ERRORS = EXIT_UNSUCCESSFUL  # runs that did not succeed, as for submit --wait
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done (a bulk command without --yes only counted: also 0)",
    EXIT_REFUSED: "refused or failed (one `error: ...` line on stderr); reconcile --check found drift; "
                  "the demo's runs did not finish",
    EXIT_USAGE: "usage error: unknown command or option, missing argument, a value of the wrong type "
                "(one `error: ...` line on stderr)",
    EXIT_UNSUCCESSFUL: "the run waited for (submit --wait) or a loadtest's runs ended unsuccessfully",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
"""The exit codes of every `fencepost` command (see the module docstring)."""

T = TypeVar("T")


HELP_META = "fencepost.help"
"""ctx.meta key: the subcommand line holds --help (set by RootGroup before the root callback runs)."""


class RootGroup(click.Group):
    """The `fencepost` group: a usage error is one `error: ...` line on stderr and exit 2 (click's
    own report is a four-line usage block), everything else as click does it."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            click.echo(f"error: {exc.format_message()}{where}", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            sys.exit(EXIT_INTERRUPTED)
        except FencepostError as exc:  # e.g. a FENCEPOST_* variable out of range, found before any command ran
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_REFUSED)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)  # an int here is click's Exit code (--help: 0)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Also note in ctx.meta[HELP_META] whether the subcommand was asked for --help: its arguments
        are parsed only after the root callback, which must not start servers for a help page."""
        name, cmd, rest = super().resolve_command(ctx, args)
        ctx.meta[HELP_META] = "--help" in rest
        return name, cmd, rest


NO_STORE_COMMANDS = frozenset({"dev", "demo"})
"""Commands that do not take the stores from the root group (the demo picks its own, `dev` manages the pair)."""


def store_settings(ctx: click.Context, settings: Settings, *, api: bool) -> Settings:
    """SETTINGS with the stores found by fencepost.core.stores.resolve (explicit URLs, else the
    project directory's embedded pair, started if need be, said in one line on stderr), for a
    subcommand that needs them: not for --api, `dev`, `demo`, --help or shell completion. A store
    that cannot be resolved is one `error:` line and exit 1."""
    if (api or ctx.invoked_subcommand in NO_STORE_COMMANDS or ctx.invoked_subcommand is None
            or ctx.resilient_parsing or ctx.meta.get(HELP_META)):
        return settings
    try:
        resolved = resolve(settings)
    except FencepostError as exc:
        click.echo(f"error: {str(exc).splitlines()[0]}", err=True)
        sys.exit(EXIT_REFUSED)
    if resolved.note is not None:
        click.echo(resolved.note, err=True)
    return resolved.settings


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on uvloop when installed (workers and the demo run on it too).

    Once it has returned the command's work is done: a late SIGTERM (an orchestrator stopping a
    service that already stopped itself) is ignored so it cannot turn exit 0 into 143."""
    try:
        if uvloop is None:
            return asyncio.run(coro)
        return uvloop.run(coro)
    finally:
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


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


def async_command(fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
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


class Refused(click.ClickException):
    """Bad input met while click parses an option: the same one `error: ...` line and exit 1 as
    the typed error the client would raise for it (nothing has been done yet)."""

    exit_code = EXIT_REFUSED

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)


if TYPE_CHECKING:  # generic (value, input) in recent click; not subscriptable at run time in the oldest we allow
    _ParamType = click.ParamType[Any, Any]
else:
    _ParamType = click.ParamType


class Checked(_ParamType):
    """An option checked against fencepost.core.validate.LIMITS[field] (the table the client and
    the API use): `--timeout inf`, `--priority 1.5` or a tenant with an escape sequence are refused
    before anything connects. Text that is not a number is a click usage error (exit 2)."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.kind = validate.LIMITS[field].kind
        self.name = {"int": "integer", "float": "seconds"}.get(self.kind, "text")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and self.kind in ("int", "float"):
            try:
                value = int(value, 10) if self.kind == "int" else float(value)
            except ValueError:
                try:  # '1.5' for a whole number: a number, refused by the table like the client refuses it
                    value = float(value)
                except ValueError:
                    self.fail(f"{value!r} is not {'a whole number' if self.kind == 'int' else 'a number'}", param, ctx)
        try:
            return validate.check(self.field, value)
        except InvalidInput as exc:
            raise Refused(str(exc)) from None


def safe(text: str) -> str:
    """TEXT with control and invisible characters escaped (\\x1b, \\u202e), so a stored value
    can never drive the operator's terminal."""
    if validate.unsafe_char(text) is None:
        return text
    return "".join(c if validate.unsafe_char(c) is None else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def json_arg(value: str | None, what: str, kind: type) -> Any:
    """A JSON option (--args, --kwargs) decoded and checked to be a KIND; missing: an empty KIND."""
    if value is None:
        return kind()
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc.msg} at column {exc.colno}", param_hint=what) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"must be a JSON {kind.__name__}", param_hint=what)
    return parsed


def fmt(v: Any) -> str:
    """One table cell: times to the millisecond, bytes as their size, text cut to its first line."""
    if isinstance(v, datetime):
        return v.isoformat(timespec="milliseconds")
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    if isinstance(v, str):
        lines = v.splitlines()
        return safe(lines[0][:80]) if lines else ""
    return "" if v is None else str(v)


def table(rows: Sequence[Any], cols: list[str]) -> None:
    """Print ROWS (dicts or typed views: anything with `.get(column)`) as aligned columns COLS
    (upper-case headers), or `(none)`."""
    if not rows:
        click.echo("(none)")
        return
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths)))
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths)))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (one document) instead of a table.")
"""The --json flag of every read command."""


def to_json(v: Any) -> Any:
    """V as plain JSON values: times in ISO 8601, UUIDs as text, bytes as their size, a typed view
    (fencepost.core.views) as the object of its fields."""
    if isinstance(v, msgspec.Struct):
        return {f: to_json(getattr(v, f)) for f in v.__struct_fields__}
    if isinstance(v, dict):
        return {str(k): to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [to_json(x) for x in v]
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, bytes):
        return {"bytes": len(v)}
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return str(v)


def print_json(v: Any) -> None:
    """One JSON document on stdout (for scripts: `fencepost ls --json | jq ...`)."""
    click.echo(json.dumps(to_json(v), ensure_ascii=False))


def require_store(command: str) -> None:
    """Store-side admin tools have no API mode: with --api (or FENCEPOST_API_URL) they stop with
    one line on stderr and exit code 1 instead of silently using the store settings."""
    if _api_target() is not None:
        click.echo(f"error: `fencepost {command}` needs direct Redis/PostgreSQL access and has no --api mode; "
                   "run it without --api / FENCEPOST_API_URL where the stores are reachable", err=True)
        sys.exit(EXIT_REFUSED)


def _api_target() -> tuple[str, str | None] | None:
    """(url, token) when the CLI was given --api (or FENCEPOST_API_URL), else None."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        found = ctx.meta.get("fencepost.api")
        if found is not None:
            url, token = found
            return (url, token) if url else None
        ctx = ctx.parent
    return None


@contextlib.asynccontextmanager
async def operator(settings: Settings, *, actor: str = "cli", redis: bool = True) -> AsyncIterator[Operator]:
    """What a command acts through, written once for both: the HTTP API with --api (an
    AsyncApiClient), else the stores (a Client acting as ACTOR; REDIS false: PostgreSQL only, so
    FENCEPOST_DATABASE_URL alone is enough). Both implement fencepost.core.views.Operator."""
    target = _api_target()
    if target is not None:
        async with AsyncApiClient(*target) as api:
            yield api
        return
    client = await Client(settings=settings, actor=actor).connect(redis=redis)
    try:
        yield client
    finally:
        await client.close()


async def warn_if_recorder_silent(op: Operator) -> None:
    """One line on stderr when a transition has waited in Redis for a recorder longer than the lag
    alert's threshold (Settings.recorder_silence_s): the history PostgreSQL shows is behind."""
    silence = await op.recorder_silence()
    if silence is not None:
        click.echo(silence.message, err=True)
