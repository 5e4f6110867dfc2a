"""Operator commands on the CLI: one run, a bounded bulk selection, or a whole queue."""

from __future__ import annotations

import getpass
import sys

import click

from fencepost.core.config import Settings
from fencepost.control import BULK_DEFAULT_LIMIT, COMMANDS
from fencepost.core.errors import BulkNotConfirmed

_HELP = {
    "pause": "Pause a run (PENDING/RETRY_WAIT now; RUNNING at its next safe boundary).",
    "stop": "Stop a running run gracefully (checkpoint, then STOPPED; forced after the grace period).",
    "cancel": "Cancel a run (running runs are stopped first, then CANCELLED).",
    "resume": "Resume a PAUSED or STOPPED run from its latest checkpoint (same run id, new attempt).",
    "restart": "Run again from the beginning, discarding the checkpoint.",
    "retry": "Retry a dead-lettered run (FAILED / TIMED_OUT / CANCELLED).",
}


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return "cli"


def _make(verb: str) -> click.Command:
    from fencepost.cli.main import command

    @click.argument("run_id", type=int, required=False)
    @click.option("--reason", default="", help="Recorded in the run's history with your name.")
    @click.option("--queue", help="Bulk: act on the runs of this queue that match.")
    @click.option("--status", "status_", help="Bulk: only runs in this state.")
    @click.option("--handler", help="Bulk: only runs of this handler.")
    @click.option("--limit", type=int, default=BULK_DEFAULT_LIMIT, show_default=True, help="Bulk: at most this many runs.")
    @click.option("--yes", is_flag=True, help="Bulk: really do it (without it, only count the matches).")
    @click.option("--version", "expected_version", type=int, help="Act only if the run is still at this version.")
    @command
    async def run_command(settings: Settings, run_id: int | None, reason: str, queue: str | None, status_: str | None,
                          handler: str | None, limit: int, yes: bool, expected_version: int | None) -> None:
        from fencepost.client import Client

        if (run_id is None) == (queue is None):
            raise click.UsageError(f"give a RUN_ID, or --queue (with --status/--handler) for a bulk {verb}")
        if await _via_api(verb, run_id, reason, queue, status_, handler, yes, expected_version):
            return
        async with Client(settings=settings, actor=_actor()) as client:
            if run_id is not None:
                state = await getattr(client, verb)(run_id, reason=reason, expected_version=expected_version)
                click.echo(f"run {run_id}: {state}")
                return
            try:
                out = await client.bulk(verb, queue=queue, status=status_.upper() if status_ else None,
                                        handler=handler, limit=limit, confirm=yes, reason=reason)
            except BulkNotConfirmed as exc:
                click.echo(f"{exc.matched} runs in queue {queue!r} match; nothing changed.")
                click.echo(f"Re-run with --yes to {verb} up to {min(exc.matched, exc.limit)} of them (--limit {limit}).")
                sys.exit(1)
            summary = ", ".join(f"{n} {s}" for s, n in sorted(out["results"].items())) or "none changed"
            click.echo(f"{out['matched']} matched, {out['acted']} acted on: {summary}")
            for rid, why in list(out["refused"].items())[:20]:
                click.echo(f"  run {rid}: {why}")

    return click.command(verb, help=_HELP[verb])(run_command)


async def _via_api(verb: str, run_id: int | None, reason: str, queue: str | None, status_: str | None,
                   handler: str | None, yes: bool, expected_version: int | None) -> bool:
    """With --api: the same command through the HTTP API (the bulk confirm is the match count)."""
    from fencepost.apiclient import from_context

    api = from_context()
    if api is None:
        return False
    if run_id is not None:
        click.echo(f"run {run_id}: {api.command(verb, run_id, reason=reason, expected_version=expected_version)}")
        return True
    assert queue is not None
    status = status_.upper() if status_ else None
    try:
        out = api.bulk(verb, queue=queue, status=status, handler=handler, confirm=0, reason=reason)
    except BulkNotConfirmed as exc:
        if not yes:
            click.echo(f"{exc.matched} runs in queue {queue!r} match; nothing changed.")
            click.echo(f"Re-run with --yes to {verb} them (the API acts on at most {exc.limit}).")
            sys.exit(1)
        out = api.bulk(verb, queue=queue, status=status, handler=handler, confirm=exc.matched, reason=reason)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(out["results"].items())) or "none changed"
    click.echo(f"{out['matched']} matched, {out['acted']} acted on: {summary}")
    for rid, why in list(out["refused"].items())[:20]:
        click.echo(f"  run {rid}: {why}")
    return True


def register(cli: click.Group) -> None:
    from fencepost.cli.main import command

    for verb in COMMANDS:
        cli.add_command(_make(verb))

    @cli.group()
    def queue() -> None:
        """A whole queue: pause / resume (nothing new is dispatched while paused); dispatch
        settings: tenant weights, concurrency limits, priority aging."""

    @queue.command("pause")
    @click.argument("name")
    @click.option("--reason", default="")
    @command
    async def queue_pause(settings: Settings, name: str, reason: str) -> None:
        from fencepost.apiclient import from_context
        from fencepost.client import Client

        if (api := from_context()) is not None:
            api.pause_queue(name, reason=reason)
            click.echo(f"queue {name}: paused")
            return
        async with Client(settings=settings, actor=_actor()) as client:
            await client.pause_queue(name, reason=reason)
        click.echo(f"queue {name}: paused")

    @queue.command("resume")
    @click.argument("name")
    @click.option("--reason", default="")
    @command
    async def queue_resume(settings: Settings, name: str, reason: str) -> None:
        from fencepost.apiclient import from_context
        from fencepost.client import Client

        if (api := from_context()) is not None:
            api.resume_queue(name, reason=reason)
            click.echo(f"queue {name}: resumed")
            return
        async with Client(settings=settings, actor=_actor()) as client:
            await client.resume_queue(name, reason=reason)
        click.echo(f"queue {name}: resumed")


__all__ = ["register"]
