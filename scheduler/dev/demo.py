"""`fencepost demo`: set everything up, run the example jobs end to end and report what happened.

The demo tells its story as it goes (schema, submit) and returns a DemoReport; the CLI prints
the outcome table from it, so this module needs nothing from the CLI (which imports it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import click
import msgspec

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.models import Submit, decode_result
from fencepost.core.record import Database
from fencepost.core.states import TERMINAL
from fencepost.dev.embedded import DATABASE_URL_ENV, REDIS_URL_ENV, resolve_urls, up
from fencepost.dev.examples import registry
from fencepost.reconciler.service import Reconciler
from fencepost.worker.runtime import Worker, WorkerOptions

__all__ = ["APP", "FINISH_WITHIN_S", "DemoReport", "DemoRun", "DemoStores", "demo_settings", "run_demo"]

APP = "fencepost.dev.examples:registry"
FINISH_WITHIN_S = 90.0


class DemoRun(msgspec.Struct, kw_only=True):
    """One row of the outcome table."""

    id: int
    handler: str
    status: str
    attempt: int | None
    outcome: str
    """The result when it succeeded, else the first line of its last error."""


class DemoReport(msgspec.Struct, kw_only=True):
    """What the demo did: every run finished (or not, within FINISH_WITHIN_S), the runs worth
    showing (every example, the first three 'add' runs) and the count of runs per final state."""

    finished: bool
    total: int = 0
    shown: list[DemoRun] = []
    counts: dict[str, int] = {}


class DemoStores(msgspec.Struct, kw_only=True):
    """The stores the demo runs on; `kept` names the embedded pair's folder when it keeps running
    after the demo (so the closing hint's commands reach the same data), else None."""

    settings: Settings
    kept: str | None = None


def _plan(jobs: int) -> list[Submit]:
    plan = [Submit(handler="flaky", args=(2,)), Submit(handler="flaky", args=(3,)),
            Submit(handler="always_fails", args=("invalid account id",)), Submit(handler="hang"),
            Submit(handler="crunch", args=(2_000_000,)), Submit(handler="digest", args=("fencepost", 5000))]
    plan += [Submit(handler="add", args=(i, i)) for i in range(max(jobs - len(plan), 0))]
    return plan


@contextlib.contextmanager
def demo_settings(base_dir: str, settings: Settings | None) -> Iterator[DemoStores]:
    """Stores for the demo: the configured ones; with neither URL set, the embedded pair in BASE_DIR,
    started if need be and left running (every later `fencepost` command with no URLs set uses it,
    until `fencepost dev down`); with one URL set, an embedded server for the other, stopped on exit.
    Service logs are quietened unless -v asked for debug: the demo prints its own story."""
    if logging.getLogger().level < logging.WARNING and not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger().setLevel(logging.WARNING)
    base = settings or Settings.from_env()
    kept, servers = None, None
    if not os.environ.get(REDIS_URL_ENV) and not os.environ.get(DATABASE_URL_ENV):
        pair = up(base_dir)
        redis_url, database_url, kept = pair.redis_url, pair.database_url, base_dir
        click.echo(f"using the embedded servers in {base_dir}/ ({'started' if pair.started else 'already running'}; "
                   "set FENCEPOST_REDIS_URL / FENCEPOST_DATABASE_URL to use yours)")
    else:
        redis_url, database_url, servers = resolve_urls(base_dir)
        if servers is not None:
            click.echo(f"using an embedded server in {base_dir}/ for the URL not set (stopped after the demo)")
    try:
        yield DemoStores(settings=Settings.from_env(redis_url=redis_url, database_url=database_url, prefix=base.prefix,
                                                    backoff_base_ms=200, lease_ms=10_000), kept=kept)
    finally:
        if servers is not None:
            servers.stop()


async def run_demo(settings: Settings, jobs: int) -> DemoReport:
    """Migrate, start a reconciler and a worker in this process, submit JOBS example runs and wait
    until every one is final in PostgreSQL."""
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
            deadline = time.monotonic() + FINISH_WITHIN_S
            while True:
                rows = await client.stores.db.rows("run_status", ids)
                if all(r.status in TERMINAL for r in rows):
                    break
                if time.monotonic() > deadline or any(t.done() for t in services):
                    for t in services:
                        if t.done() and t.exception():
                            raise t.exception()  # type: ignore[misc]
                    return DemoReport(finished=False)
                await asyncio.sleep(0.2)
            counts: dict[str, int] = {}
            for r in rows:
                counts[r.status] = counts.get(r.status, 0) + 1
            table = [dict(await client.get(run_id)) for run_id in ids]
    finally:
        worker.request_stop()
        reconciler.stop.set()
        await asyncio.gather(*services, return_exceptions=True)

    shown = [r for r in table if r["handler"] != "add"] + [r for r in table if r["handler"] == "add"][:3]
    return DemoReport(finished=True, total=len(ids), shown=[_row(r) for r in shown], counts=counts)


def _row(r: dict[str, Any]) -> DemoRun:
    outcome = (str(decode_result(r["result"])) if r["status"] == "SUCCEEDED"
               else (r["last_error"] or "").splitlines()[0][:60] if r["last_error"] else "")
    return DemoRun(id=r["id"], handler=r["handler"], status=r["status"], attempt=r["attempt"], outcome=outcome)
