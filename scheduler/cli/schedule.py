"""`fencepost schedule ...` and `fencepost trigger`: parse, delegate, print."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from fencepost.cli.common import (
    Checked,
    async_command,
    exit_on_error,
    json_arg,
    json_option,
    metrics_port_option,
    operator,
    print_json,
    require_store,
    run,
    safe,
    serve_metrics,
    table,
)
from fencepost.core.config import Settings
from fencepost.core.errors import FencepostError
from fencepost.core.schedules import ScheduleSpec, next_fires, zone
from fencepost.core.views import Schedule, ScheduleRun
from fencepost.trigger import serve

__all__ = ["schedule", "trigger"]

_UTC = UTC


def _fmt_t(t: datetime | None, tz: str | None = None) -> str:
    if t is None:
        return ""
    if tz:
        return t.astimezone(zone(tz)).isoformat(timespec="seconds")
    return t.isoformat(timespec="seconds")


def _print_added(s: Schedule) -> None:
    click.echo(f"schedule {s['name']} (id {s['id']}): next fire {_fmt_t(s['next_fire_time'], s['timezone'])}"
               + (f", offset {s['offset_ms'] / 1000:.3f}s" if s["offset_ms"] else ""))


def _print_list(rows: list[Schedule]) -> None:
    shown = [{**dict(r), "every": r.cron or f"{r.interval_s:g}s", "state": "paused" if r.paused else "active"}
             for r in rows]
    table(shown, ["id", "name", "handler", "every", "timezone", "next_fire_time", "state", "fires", "skipped"])


def _print_show(s: Schedule, upcoming: Any, runs: list[ScheduleRun]) -> None:
    for k in ("id", "name", "handler", "args_json", "queue", "priority", "cron", "interval_s", "timezone",
              "spread_s", "offset_ms", "catchup", "catchup_window_s", "allow_overlap", "paused",
              "last_fire_time", "last_run_id", "last_status", "fires", "skipped", "created_at", "quarantined"):
        v = s.get(k)
        if k == "args_json" and v is not None and not isinstance(v, str):  # decoded over the API
            v = json.dumps(v, ensure_ascii=False)
        if v is not None:
            click.echo(f"{k:17} {safe(str(v))}")
    click.echo("next fires:" if upcoming or not s.get("quarantined") else "next fires: none (quarantined)")
    for t in upcoming:
        click.echo(f"  {_fmt_t(t, s['timezone'])}   ({_fmt_t(t.astimezone(_UTC))})")
    click.echo("")
    table(runs, ["id", "status", "fire_time", "run_at", "started_at", "finished_at", "attempt"])


@click.group()
def schedule() -> None:
    """Recurring schedules (cron in a timezone, or an interval)."""


@schedule.command("add")
@click.argument("name")
@click.option("--cron", help='Cron line, e.g. "0 * * * *" (read in --tz local time).')
@click.option("--interval", "interval_s", type=Checked("interval_s"), help="Fire every S seconds instead of a cron line.")
@click.option("--tz", "tz", default="UTC", show_default=True, help="IANA timezone, e.g. Europe/Paris.")
@click.option("--handler", required=True)
@click.option("--args", "args_json", help="Positional arguments as a JSON list.")
@click.option("--kwargs", "kwargs_json", help="Keyword arguments as a JSON object.")
@click.option("--queue")
@click.option("--priority", type=Checked("priority"))
@click.option("--spread", "spread_s", type=Checked("spread_s"), default=0.0, show_default=True,
              help="Fire at fire_time + a stable per-schedule offset in [0, S).")
@click.option("--exact", is_flag=True, help="No spread: fire exactly at the fire time.")
@click.option("--catchup", is_flag=True, help="After downtime, backfill every missed fire (default: coalesce).")
@click.option("--catchup-window", "catchup_window_s", type=Checked("catchup_window_s"),
              help="Backfill at most this far back (s).")
@click.option("--allow-overlap", is_flag=True, help="Fire even while the previous run is still active.")
@async_command
async def add(settings: Settings, name: str, cron: str | None, interval_s: float | None, tz: str, handler: str,
              args_json: str | None, kwargs_json: str | None, queue: str | None, priority: int | None,
              spread_s: float, exact: bool, catchup: bool, catchup_window_s: float | None,
              allow_overlap: bool) -> None:
    """Add a schedule (validated first: a bad cron line or timezone stores nothing)."""
    spec = ScheduleSpec(name=name, handler=handler, args=tuple(json_arg(args_json, "--args", list)),
                        kwargs=json_arg(kwargs_json, "--kwargs", dict), cron=cron, interval_s=interval_s,
                        timezone=tz, queue=queue, priority=priority, spread_s=spread_s, exact=exact,
                        catchup=catchup, catchup_window_s=catchup_window_s, allow_overlap=allow_overlap)
    async with operator(settings) as op:
        s = await op.add_schedule(spec)
    _print_added(s)


@schedule.command("update")
@click.argument("name")
@click.option("--cron", help="A new cron line (replaces the interval).")
@click.option("--interval", "interval_s", type=Checked("interval_s"), help="A new interval in seconds (replaces cron).")
@click.option("--tz", "tz", help="A new IANA timezone.")
@click.option("--handler")
@click.option("--args", "args_json", help="New positional arguments as a JSON list.")
@click.option("--kwargs", "kwargs_json", help="New keyword arguments as a JSON object.")
@click.option("--queue")
@click.option("--priority", type=Checked("priority"))
@click.option("--spread", "spread_s", type=Checked("spread_s"))
@click.option("--catchup/--no-catchup", default=None)
@click.option("--catchup-window", "catchup_window_s", type=Checked("catchup_window_s"))
@click.option("--allow-overlap/--no-allow-overlap", default=None)
@click.option("--reason", default="", help="Recorded in the audit log.")
@async_command
async def update(settings: Settings, name: str, cron: str | None, interval_s: float | None, tz: str | None,
                 handler: str | None, args_json: str | None, kwargs_json: str | None, queue: str | None,
                 priority: int | None, spread_s: float | None, catchup: bool | None, catchup_window_s: float | None,
                 allow_overlap: bool | None, reason: str) -> None:
    """Edit a schedule in place (same id and history; validated first, audited). A new cron line,
    interval or timezone recomputes the next fire from now; other changes keep it."""
    given: dict[str, Any] = {"cron": cron, "interval_s": interval_s, "timezone": tz, "handler": handler,
                             "queue": queue, "priority": priority, "spread_s": spread_s, "catchup": catchup,
                             "catchup_window_s": catchup_window_s, "allow_overlap": allow_overlap}
    if args_json is not None:
        given["args"] = json_arg(args_json, "--args", list)
    if kwargs_json is not None:
        given["kwargs"] = json_arg(kwargs_json, "--kwargs", dict)
    fields = {k: v for k, v in given.items() if v is not None}
    async with operator(settings) as op:
        s = await op.update_schedule(name, fields, reason=reason)
    click.echo(f"schedule {s['name']} (id {s['id']}): updated; next fire {_fmt_t(_t(s['next_fire_time']), s['timezone'])}")


def _t(v: Any) -> datetime:
    return datetime.fromisoformat(v) if isinstance(v, str) else v


@schedule.command("run-now")
@click.argument("name")
@click.option("--reason", default="", help="Recorded in the audit log.")
@async_command
async def run_now(settings: Settings, name: str, reason: str) -> None:
    """Fire the schedule once now, as its own run (the next scheduled fire does not move)."""
    async with operator(settings) as op:
        run_id = await op.run_schedule_now(name, reason=reason)
    click.echo(f"schedule {name}: fired now as run {run_id}")


@schedule.command("ls")
@click.option("--limit", type=int, default=100, show_default=True)
@json_option
@async_command
async def ls(settings: Settings, limit: int, as_json: bool) -> None:
    """List schedules."""
    async with operator(settings) as op:
        rows = await op.schedules(limit=limit)
    print_json(rows) if as_json else _print_list(rows)


@schedule.command("show")
@click.argument("name")
@json_option
@async_command
async def show(settings: Settings, name: str, as_json: bool) -> None:
    """One schedule, its next fires and its latest runs."""
    async with operator(settings) as op:
        s = await op.schedule(name)
        try:
            upcoming = (await op.schedule_fires(name, 5))[0]
        except FencepostError:  # a schedule an older version stored may have no computable fires
            upcoming = []
        runs = await op.schedule_runs(name, 10)
    if as_json:
        print_json({**s, "next_fires": upcoming, "runs": runs})
        return
    _print_show(s, upcoming, runs)


@schedule.command("pause")
@click.argument("name")
@async_command
async def pause(settings: Settings, name: str) -> None:
    """Stop firing (next_fire_time is kept; resume coalesces or backfills what was missed)."""
    await _set_paused(settings, name, True)


@schedule.command("resume")
@click.argument("name")
@async_command
async def resume(settings: Settings, name: str) -> None:
    """Fire again."""
    await _set_paused(settings, name, False)


async def _set_paused(settings: Settings, name: str, paused: bool) -> None:
    async with operator(settings) as op:
        await op.set_schedule_paused(name, paused)
    click.echo(f"schedule {name}: {'paused' if paused else 'resumed'}")


@schedule.command("rm")
@click.argument("name")
@async_command
async def rm(settings: Settings, name: str) -> None:
    """Remove a schedule (its runs stay)."""
    async with operator(settings) as op:
        await op.remove_schedule(name)
    click.echo(f"schedule {name}: removed")


@schedule.command("next")
@click.argument("name_or_cron")
@click.argument("n", type=int, default=5)
@click.option("--tz", "tz", default="UTC", show_default=True, help="Timezone for a cron line.")
@click.option("--interval", "interval_s", type=Checked("interval_s"), help="Show an interval instead.")
@click.pass_obj
def next_(settings: Settings, name_or_cron: str, n: int, tz: str, interval_s: float | None) -> None:
    """Upcoming fire times of a saved schedule, or of a cron line before saving it."""
    with exit_on_error():
        if len(name_or_cron.split()) == 5 or interval_s is not None:  # a cron line: no database needed
            times = next_fires(datetime.now(_UTC), n, cron=None if interval_s else name_or_cron,
                               interval_s=interval_s, tz=tz)
            zone_name = tz
        else:
            times, zone_name = run(_upcoming(settings, name_or_cron, n))
    for t in times:
        click.echo(f"{_fmt_t(t, zone_name)}   ({_fmt_t(t.astimezone(_UTC))})")


async def _upcoming(settings: Settings, name: str, n: int) -> tuple[list[datetime], str]:
    async with operator(settings) as op:
        return await op.schedule_fires(name, n)


@click.command()
@click.option("--tick", "tick_s", type=float, default=0.25, show_default=True, help="Seconds between passes.")
@click.option("--batch", type=int, default=1000, show_default=True, help="Fires per transaction.")
@click.option("--lease", "lease_s", type=float, default=10.0, show_default=True,
              help="Leader lease; a standby takes over this long after the leader dies.")
@click.option("--lookahead", "lookahead_s", type=float, default=0.5, show_default=True,
              help="Create runs this early (they wait in Redis until due).")
@metrics_port_option
@async_command
async def trigger(settings: Settings, tick_s: float, batch: int, lease_s: float, lookahead_s: float,
                  metrics_port: int) -> None:
    """Run the trigger service: schedules -> runs (one leader; duplicates impossible)."""
    require_store("trigger")
    serve_metrics(metrics_port)
    await serve(settings, tick_s=tick_s, batch=batch, lease_s=lease_s, lookahead_s=lookahead_s)
