"""`fencepost loadtest spike | burst`: run before a peak; prints a report (or JSON for CI)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import msgspec

from fencepost.cli.common import EXIT_LOADTEST_ERRORS, async_command, require_store
from fencepost.core.config import Settings
from fencepost.dev.chaos import FAULTS, format_chaos, soak
from fencepost.dev.loadtest import burst, format_report, spike

__all__ = ["loadtest"]


def _progress(as_json: bool) -> Callable[[str, bool], None]:
    """Progress on stderr: one line rewritten in place on a terminal, else a line every 5 s."""
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(line: str, final: bool) -> None:
        if tty:
            click.echo("\r" + line.ljust(120), nl=final, err=True)
        elif final or time.monotonic() - last[0] > 5:
            last[0] = time.monotonic()
            click.echo(line, err=True)

    return show


@click.group()
def loadtest() -> None:
    """Load harness: real trigger, reconciler and worker processes against your stores."""


@loadtest.command("spike")
@click.option("--schedules", type=int, default=10_000, show_default=True, help="Schedules firing in one minute.")
@click.option("--workers", type=int, default=2, show_default=True, help="Worker processes.")
@click.option("--spread", "spread_s", type=float, default=0.0, show_default=True, help="Per-schedule spread (s).")
@click.option("--concurrency", type=int, default=200, show_default=True)
@click.option("--lookahead", "lookahead_s", type=float, default=0.5, show_default=True)
@click.option("--batch", type=int, default=2000, show_default=True, help="Trigger fires per transaction.")
@click.option("--timeout", "timeout_s", type=float, default=900, show_default=True)
@click.option("--log-dir", help="Keep the processes' logs here.")
@click.option("--keep", is_flag=True, help="Keep the test's runs and history (default: removed after the report).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@async_command
async def spike_cmd(settings: Settings, schedules: int, workers: int, spread_s: float, concurrency: int,
                    lookahead_s: float, batch: int, timeout_s: float, log_dir: str | None, keep: bool,
                    as_json: bool) -> None:
    """SCHEDULES schedules all firing in the same minute (cron spike), on a queue of its own."""
    require_store("loadtest spike")
    rep = await spike(settings, schedules=schedules, workers=workers, spread_s=spread_s, concurrency=concurrency,
                      lookahead_s=lookahead_s, batch=batch, timeout_s=timeout_s, progress=_progress(as_json),
                      log_dir=log_dir, keep=keep)
    click.echo(json.dumps(rep) if as_json else "\n".join(format_report(rep)))
    if rep["errors"]:
        sys.exit(EXIT_LOADTEST_ERRORS)


@loadtest.command("burst")
@click.option("--jobs", type=int, default=10_000, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--concurrency", type=int, default=200, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=900, show_default=True)
@click.option("--log-dir")
@click.option("--keep", is_flag=True, help="Keep the test's runs and history (default: removed after the report).")
@click.option("--json", "as_json", is_flag=True)
@async_command
async def burst_cmd(settings: Settings, jobs: int, workers: int, concurrency: int, timeout_s: float,
                    log_dir: str | None, keep: bool, as_json: bool) -> None:
    """JOBS one-shot runs submitted at once, on a queue of its own."""
    require_store("loadtest burst")
    rep = await burst(settings, jobs=jobs, workers=workers, concurrency=concurrency, timeout_s=timeout_s,
                      progress=_progress(as_json), log_dir=log_dir, keep=keep)
    click.echo(json.dumps(rep) if as_json else "\n".join(format_report(rep)))
    if rep["errors"]:
        sys.exit(EXIT_LOADTEST_ERRORS)


@loadtest.command("chaos")
@click.option("--duration", "duration_s", type=click.FloatRange(1, 86400), default=600, show_default=True,
              help="Seconds of faults.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seeds the fault schedule: kinds, targets and lengths, in order.")
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True, help="Worker processes.")
@click.option("--concurrency", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--rate", type=click.FloatRange(0.5, 10_000), default=10.0, show_default=True,
              help="Jobs submitted per second.")
@click.option("--lease-ms", type=click.IntRange(500, 600_000), default=4000, show_default=True,
              help="FENCEPOST_LEASE_MS of the soak's services (faults last 1.5-3 leases).")
@click.option("--overlap-window-ms", type=click.IntRange(0, 600_000), default=500, show_default=True,
              help="Overlap of two executions of one run tolerated (the self-fencing window's slack).")
@click.option("--cluster-url", help="A Redis Cluster seed URL: the soak runs there, with the shard-kill fault.")
@click.option("--faults", "kinds", default=",".join(FAULTS), show_default=True,
              help="Comma-separated fault kinds to draw from.")
@click.option("--log-dir", help="Keep the processes' logs here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--json-file", type=click.Path(dir_okay=False, writable=True),
              help="Also write the JSON report to this file.")
@async_command
async def chaos_cmd(settings: Settings, duration_s: float, seed: int, workers: int, concurrency: int, rate: float,
                    lease_ms: int, overlap_window_ms: int, cluster_url: str | None, kinds: str, log_dir: str | None,
                    as_json: bool, json_file: str | None) -> None:
    """Fault-injection soak on private stores: a verdict per check, recovery per fault; exit non-zero on a violation."""
    require_store("loadtest chaos")
    show = _progress(as_json)
    rep = await soak(settings, seed=seed, duration_s=duration_s, workers=workers, concurrency=concurrency, rate=rate,
                     lease_ms=lease_ms, overlap_window_ms=overlap_window_ms, cluster_url=cluster_url, log_dir=log_dir,
                     progress=lambda line: show(line, True),
                     kinds=tuple(k.strip() for k in kinds.split(",") if k.strip()))
    rep.command = " ".join(["fencepost", "loadtest", "chaos", *sys.argv[3:]])
    click.echo(msgspec.json.encode(rep).decode() if as_json else "\n".join(format_chaos(rep)))
    if json_file is not None:
        await asyncio.to_thread(Path(json_file).write_bytes, msgspec.json.encode(rep))
    if rep.failed:
        sys.exit(EXIT_LOADTEST_ERRORS)
