"""`fencepost demo`: set everything up and run example jobs end to end, then print what happened."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click

from fencepost.core.config import Settings
from fencepost.core.models import Submit

APP = "fencepost.dev.examples:registry"


def _plan(jobs: int) -> list[Submit]:
    plan = [Submit(handler="flaky", args=(2,)), Submit(handler="flaky", args=(3,)),
            Submit(handler="always_fails", args=("invalid account id",)), Submit(handler="hang"),
            Submit(handler="crunch", args=(2_000_000,)), Submit(handler="digest", args=("fencepost", 5000))]
    plan += [Submit(handler="add", args=(i, i)) for i in range(max(jobs - len(plan), 0))]
    return plan


async def _demo(settings: Settings, jobs: int) -> int:
    from fencepost.reconciler.service import Reconciler
    from fencepost.worker.runtime import Worker, WorkerOptions

    from fencepost.client import Client
    from fencepost.core.record import Database
    from fencepost.dev.examples import registry

    database = await Database(settings.database_url, max_size=1).connect()
    applied = await database.upgrade()
    await database.close()
    click.echo(f"schema: {'applied ' + ', '.join(applied) if applied else 'up to date'}")

    reconciler = Reconciler(settings, tick_s=0.5)
    worker = Worker(registry, WorkerOptions(queues=["demo"], concurrency=20, processes=2, grace_s=5),
                    settings=settings, app=APP)
    services = [asyncio.create_task(reconciler.run()), asyncio.create_task(worker.run())]
    try:
        async with Client(settings=settings, actor="demo") as client:
            await client.register(registry)
            t0 = time.perf_counter()
            ids = await client.submit_many(_plan(jobs))
            click.echo(f"submitted {len(ids)} runs in {1000 * (time.perf_counter() - t0):.1f} ms; "
                       "waiting for them to finish and reach PostgreSQL ...")
            deadline = time.monotonic() + 90
            terminal = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"}
            while True:
                rows = await client.stores.db.fetch("run_status", ids)
                if all(r["status"] in terminal for r in rows):
                    break
                if time.monotonic() > deadline or any(t.done() for t in services):
                    for t in services:
                        if t.done() and t.exception():
                            raise t.exception()  # type: ignore[misc]
                    click.echo("demo: runs did not all finish within 90 s", err=True)
                    return 1
                await asyncio.sleep(0.2)
            runs = {r["id"]: r for r in rows}
            table: list[dict[str, Any]] = []
            for run_id in ids:
                row = await client.get(run_id)
                table.append(row)
    finally:
        worker.request_stop()
        reconciler.stop.set()
        await asyncio.gather(*services, return_exceptions=True)

    from fencepost.cli.main import _table
    from fencepost.core.models import decode_result

    shown = [r for r in table if r["handler"] != "add"] + [r for r in table if r["handler"] == "add"][:3]
    for r in shown:
        r["outcome"] = (str(decode_result(r["result"])) if r["status"] == "SUCCEEDED"
                        else (r["last_error"] or "").splitlines()[0][:60] if r["last_error"] else "")
    _table(shown, ["id", "handler", "status", "attempt", "outcome"])
    counts: dict[str, int] = {}
    for r in runs.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    click.echo(f"\n{len(ids)} runs: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
               + f" ({len(ids) - len(shown)} more 'add' runs not shown)")
    click.echo("every transition is in PostgreSQL: try `fencepost events <id>` and `fencepost dlq`")
    return 0


def run_demo(base_dir: str, jobs: int, settings: Settings | None) -> int:
    from fencepost.dev.embedded import resolve_urls

    import logging

    if logging.getLogger().level < logging.WARNING and not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger().setLevel(logging.WARNING)  # the demo prints its own story; -v shows service logs
    redis_url, database_url, servers = resolve_urls(base_dir)
    if servers is not None:
        click.echo(f"using embedded servers in {base_dir}/ (set FENCEPOST_REDIS_URL / FENCEPOST_DATABASE_URL to use yours)")
    base = settings or Settings.from_env()
    demo_settings = Settings.from_env(redis_url=redis_url, database_url=database_url, prefix=base.prefix,
                                      backoff_base_ms=200, lease_ms=10_000)
    from fencepost.cli.main import _run

    try:
        return _run(_demo(demo_settings, jobs))
    finally:
        if servers is not None:
            servers.stop()
