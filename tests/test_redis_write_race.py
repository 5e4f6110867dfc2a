"""A connection closed under a write is a lost connection, not a crash: redis-py's asyncio connection
raises AttributeError ('NoneType' object has no attribute 'writelines') when another task disconnects
it between its health check and its write (redis-py #3546, #4287). In CI a Redis Cluster failover did
exactly that to a worker's claim: the claimer raised it, the worker process died, and the test's runs
were left for the other worker (tests/test_cluster.py::test_failover_of_one_primary_under_load).
redis-py 8 checks the writer itself and raises ConnectionError ('closed by the server before write'),
which the gateway reads as RedisUnavailable too: the test holds for both, as pyproject admits both."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import AbstractConnection

from fencepost.core.errors import RedisUnavailable
from fencepost.core.hot import StampArgs, closed_under_write
from fencepost.core.stores import Stores


async def test_a_script_whose_connection_is_closed_under_its_write_raises_redis_unavailable(
        stores: Stores, monkeypatch: pytest.MonkeyPatch) -> None:
    await stores.redis.ping()  # a pooled connection, connected
    keys = stores.keys("race")

    async def disconnected_meanwhile(self: AbstractConnection, *args: object, **kwargs: object) -> None:
        self._writer = None  # what a concurrent disconnect leaves behind

    monkeypatch.setattr(AbstractConnection, "check_health", disconnected_meanwhile)
    with pytest.raises(RedisUnavailable, match=r"closed under a write|closed by the server before write"):
        await stores.scripts.stamp_queue(keys, StampArgs(1, force=0))
    monkeypatch.undo()
    assert await stores.scripts.stamp_queue(keys, StampArgs(1, force=0)) in (True, False)  # reconnects


def test_only_a_none_inside_the_transport_counts_as_a_closed_connection() -> None:
    def ours() -> None:
        None.writelines([])  # type: ignore[attr-defined]  # raised in this module: a bug, not a lost link

    with pytest.raises(AttributeError) as bug:
        ours()
    assert not closed_under_write(bug.value)
    assert not closed_under_write(ValueError("NoneType"))
    namespace = {"__name__": "redis.asyncio.connection"}
    exec("def send(w):\n    w.writelines([])\n", namespace)  # a frame of redis-py's module
    with pytest.raises(AttributeError) as lost:
        namespace["send"](None)  # type: ignore[operator]
    assert closed_under_write(lost.value)
