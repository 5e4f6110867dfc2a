"""Checkpoints: fenced writes to PostgreSQL and the read at the start of an attempt.

A write that meets a store failure (Redis or PostgreSQL unreachable, a failover, a replica still
read-only) is the store's failure, never the handler's: it is retried with backoff for as long as
the attempt may still hold its lease. Once the worker has fenced the attempt off (docs/worker.md,
"Self-fencing") the write is refused here without touching the stores (LeaseLost), so a cut-off
execution never commits a checkpoint after its lease could have passed to another worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from fencepost.core import hotworker, metrics
from fencepost.core.errors import DatabaseUnavailable, StoreUnavailable
from fencepost.core.models import decode_result, encode_result
from fencepost.core.registry import Registry
from fencepost.core.states import ACTIVE
from fencepost.core.stores import Stores
from fencepost.worker.context import Context, Interrupt, LeaseLost

__all__ = ["Checkpoints"]

log = logging.getLogger("fencepost.worker")

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


class Checkpoints:
    def __init__(self, stores: Stores, registry: Registry) -> None:
        self.stores, self.registry = stores, registry
        self.written = 0
        self.refused = 0

    def _schema_version(self, handler: str) -> int:
        h = self.registry.handlers.get(handler)
        return h.spec.version if h is not None else 1

    async def write(self, ctx: Context, state: Any, processed: int | None) -> int:
        """Durable in PostgreSQL before returning; refused for a fenced-off (stale) attempt."""
        return await self.write_encoded(ctx, encode_result(state), processed)

    async def write_encoded(self, ctx: Context, raw: bytes, processed: int | None) -> int:
        """`write` for a state already encoded (a process-model child sends it encoded). Retries
        store failures until it is written, refused, or the attempt is fenced off (LeaseLost)."""
        delay = RETRY_FIRST_S
        while True:
            if ctx.fenced_off():
                self.refused += 1
                raise LeaseLost(f"run {ctx.run_id}: token {ctx.token} was fenced off by its worker (lease not "
                                "renewed in time)")
            try:
                return await self._write_once(ctx, raw, processed)
            except (StoreUnavailable, RedisError, OSError) as exc:
                what = "database" if isinstance(exc, DatabaseUnavailable) else "redis"
                metrics.CHECKPOINT_RETRIES.labels(what).inc()
                log.warning("checkpoint of run %s not written (%s); retrying while the lease lasts", ctx.run_id, exc,
                            extra={"event": "checkpoint_retry", "run_id": ctx.run_id, "attempt": ctx.attempt,
                                   "worker_id": ctx.worker_id})
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _write_once(self, ctx: Context, raw: bytes, processed: int | None) -> int:
        holder = await hotworker.run_holder(self.stores.redis, self.stores.keys(ctx.queue), ctx.run_id)
        if holder.token is None or holder.token != ctx.token or holder.state is None or holder.state not in ACTIVE:
            self.refused += 1
            ctx._stop = True
            raise LeaseLost(f"run {ctx.run_id}: token {ctx.token} no longer owns the run")
        row = await self.stores.db.row("write_checkpoint", ctx.run_id, ctx.token, ctx.attempt, ctx.gen,
                                       self._schema_version(ctx.handler), raw, processed)
        if row is None:
            self.refused += 1
            metrics.STALE.labels(ctx.queue, "checkpoint").inc()
            ctx._stop = True
            raise LeaseLost(f"run {ctx.run_id}: checkpoint of token {ctx.token} fenced off by a newer attempt")
        self.written += 1
        metrics.CHECKPOINTS.labels(ctx.handler).inc()
        ctx.checkpoint_version, ctx.processed = row.version, processed
        ctx.checkpointed_at = time.time()
        ctx._ctl = holder.ctl
        if ctx._ctl in ("pause", "stop", "cancel"):
            raise Interrupt(ctx._ctl)
        version: int = row.version
        return version

    async def load(self, ctx: Context) -> None:
        """For a retried / resumed attempt: fence off older attempts and read the checkpoint.

        First attempts skip this (nothing can precede them), so the common case costs nothing.
        """
        if ctx.attempt <= 1:
            return
        row = await self.stores.db.row("fence_checkpoint", ctx.run_id, ctx.gen, ctx.token, ctx.attempt)
        if row is None or row.state is None or row.gen != ctx.gen:
            return
        state = decode_result(row.state)
        handler = self.registry.handlers.get(ctx.handler)
        if handler is not None and row.schema_version != handler.spec.version:
            if handler.migrate is None or row.schema_version > handler.spec.version:
                raise ValueError(f"checkpoint schema version {row.schema_version} is incompatible with "
                                 f"{ctx.handler} version {handler.spec.version}; restart the run")
            state = handler.migrate(row.schema_version, state)
        ctx.checkpoint_data = state
        ctx.checkpoint_version, ctx.processed = row.version, row.processed
