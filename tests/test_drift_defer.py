"""Drift repair's incremental tick confirms an `unrecorded` run (finished in Redis, not in PostgreSQL)
only once it has stayed so for the grace period (issue 18): proving a stream entry gone reads the
whole stream, and on first sight such a run is nearly always one the recorder is about to record.
A run whose entry really is gone is still found and repaired, one grace period later."""

from __future__ import annotations

from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from tests.conftest import record_all, wait_until
from tests.test_drift import Q, claim, finish


async def test_an_unrecorded_run_is_confirmed_after_the_grace_not_on_first_sight(
        client: Client, stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(2)])
    tokens = dict(await claim(stores, 2))
    assert sorted(tokens) == sorted(ids)
    await record_all(stores)  # PostgreSQL: both RUNNING
    lost, lagging = ids
    assert await finish(stores, lost, tokens[lost]) == "SUCCEEDED"
    await stores.redis.xtrim(stores.keys(Q).events, maxlen=0)  # its entry is gone: really unrecorded
    assert await finish(stores, lagging, tokens[lagging]) == "SUCCEEDED"  # its entry waits for the recorder

    reads: list[Any] = []
    real = stores.redis.xrange

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return await real(*args, **kwargs)

    monkeypatch.setattr(stores.redis, "xrange", counted)
    drift = DriftRepair(stores, grace_s=0.5)
    first = await drift.tick(Q, repair=False)
    assert not [d for d in first if d.kind == "unrecorded"], first
    assert not reads, "first sight: the stream is not read"

    async def confirmed() -> list[int]:
        return [d.run_id for d in await drift.tick(Q, repair=False) if d.kind == "unrecorded"]

    assert await wait_until(confirmed, timeout=20, what="the unrecorded run confirmed after the grace") == [lost]
    assert reads, "confirming reads the stream"
    repaired = await wait_until(lambda: drift.tick(Q), timeout=20, what="the repair")
    assert [d.run_id for d in repaired if d.kind == "unrecorded"] == [lost]
    assert (await client.get(lost))["status"] == "SUCCEEDED"
    assert (await client.get(lagging))["status"] == "RUNNING", "the lagging run is left to the recorder"
