"""`fencepost workers`: who is alive (host, pid, version, queues, concurrency, the runs each holds,
last claim) from the identities workers heartbeat to Redis; `fencepost workers stop ID` asks one to
stop claiming, drain and exit (audited). Directly on the stores, or through the API with --api."""

from __future__ import annotations

import time

import click
import msgspec

from fencepost.cli.common import actor, async_command, json_option, operator, print_json, table
from fencepost.core.config import Settings

__all__ = ["workers"]


def _ago(t: float | None) -> str:
    if t is None:
        return "never"
    s = max(0.0, time.time() - t)
    return f"{s:.0f}s ago" if s < 90 else f"{s / 60:.0f}m ago" if s < 5400 else f"{s / 3600:.1f}h ago"


@click.group("workers", invoke_without_command=True)
@click.option("--queue", help="Only workers serving this queue.")
@json_option
@click.pass_context
def workers(ctx: click.Context, queue: str | None, as_json: bool) -> None:
    """Live workers: identity, queues, concurrency, the runs each holds."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(_list, queue=queue, as_json=as_json)


@async_command
async def _list(settings: Settings, queue: str | None, as_json: bool) -> None:
    async with operator(settings) as op:
        rows = [msgspec.to_builtins(w) for w in await op.workers(queue=queue)]
    if as_json:
        print_json(rows)
        return
    for r in rows:
        r["queues"] = ",".join(r["queues"])
        r["busy"] = f"{len(r['running'])}/{r['concurrency']}"
        r["runs"] = " ".join(str(h["id"]) for h in r["running"][:10]) + (" ..." if len(r["running"]) > 10 else "")
        r["started"], r["last_claim"] = _ago(r["started_at"]), _ago(r["last_claim_at"])
        r["state"] = "stopping" if r.get("stop_requested") else "running"
    table(rows, ["id", "host", "pid", "version", "queues", "busy", "state", "started", "last_claim", "runs"])


@workers.command("stop")
@click.argument("worker_id")
@click.option("--reason", default="", help="Recorded in the audit log with your name.")
@async_command
async def stop(settings: Settings, worker_id: str, reason: str) -> None:
    """Ask WORKER_ID to stop claiming, finish or release what it holds (its grace period), and exit."""
    async with operator(settings, actor=actor()) as op:
        await op.stop_worker(worker_id, reason=reason)
    click.echo(f"asked worker {worker_id} to stop: it drains at its next heartbeat")
