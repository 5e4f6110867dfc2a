"""A claim that arrives late claims nothing (DESIGN invariant 11, docs/clock.md), and no re-sent
command takes effect twice. The link between the caller and Redis is cut by a proxy that stops
forwarding but keeps the sockets open (fencepost.dev.faults.TcpProxy), as a partition does; when it heals,
what the caller sent during the cut reaches Redis.

Issue 22 item 2: a claim sent during a 20 s cut ran on Redis when the link healed, with the
caller's old `now`, so its lease was already past; the same worker claimed the run again and two
executions of it ran side by side. redis-py's default retries re-sent more commands late."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest_asyncio
import redis.asyncio as aioredis

from fencepost.client import Client
from fencepost.core.errors import LateClaim, RedisUnavailable
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs, Scripts
from fencepost.core.redisconn import connect
from fencepost.core.stores import Stores
from fencepost.dev.faults import TcpProxy
from tests.conftest import REDIS_URL, wait_until

LEASE_MS = 2000


@pytest_asyncio.fixture
async def cut() -> AsyncIterator[tuple[TcpProxy, str]]:
    """A blackhole proxy in front of the test Redis, and the URL that goes through it."""
    u = urlparse(REDIS_URL)
    proxy = await TcpProxy(u.hostname or "127.0.0.1", u.port or 6379).start()
    yield proxy, proxy.url(REDIS_URL)
    await proxy.close()


async def _stat(stores: Stores, queue: str, name: str) -> int:
    return int(await stores.redis.hget(stores.keys(queue).stats, name) or 0)


async def test_a_claim_that_reaches_redis_after_its_deadline_claims_nothing(client: Client, stores: Stores,
                                                                          cut: tuple[TcpProxy, str]) -> None:
    proxy, url = cut
    run = await client.submit("t.noop")
    keys = stores.keys("tq")
    r = connect(url)
    cut_off = Scripts(r)
    try:
        await cut_off.sample_clock(5)
        proxy.pause()
        deadline = await cut_off.claim_deadline(1.0)  # the clock is fresh: no round trip needed
        t0 = time.monotonic()
        try:
            await cut_off.claim_due(keys, ClaimArgs(10, "w-cut", LEASE_MS, 100, deadline))
            raise AssertionError("a claim through a cut link returned")
        except RedisUnavailable as exc:
            assert not isinstance(exc, LateClaim)
        assert time.monotonic() - t0 < 3, "the caller stops waiting at its deadline"
        await asyncio.sleep(LEASE_MS / 1000 + 0.5)  # longer than the lease it asked for
        proxy.resume()  # the claim sent during the cut now reaches Redis
        await wait_until(lambda: _stat(stores, "tq", "late_claim"), timeout=10, what="the late claim to run")
    finally:
        await r.aclose()
    h = await stores.redis.hgetall(keys.run(run))
    assert h[b"state"] == b"PENDING" and b"token" not in h, f"the late claim took the run: {h}"
    assert await stores.redis.zcard(keys.active) == 0
    [job] = await stores.scripts.claim_due(keys, ClaimArgs(10, "w-ok", LEASE_MS, 100))
    assert (job.id, job.attempt) == (run, 1), "the run's first attempt is the next claim's"


async def test_a_claim_past_its_deadline_says_so_and_changes_nothing(client: Client, stores: Stores) -> None:
    run = await client.submit("t.noop")
    keys = stores.keys("tq")
    sec, usec = await stores.redis.time()
    past = int(sec) * 1000 + int(usec) // 1000 - 1
    try:
        await stores.scripts.claim_due(keys, ClaimArgs(10, "w", LEASE_MS, 100, past))
        raise AssertionError("a claim past its deadline was answered")
    except LateClaim as exc:
        assert exc.deadline_ms == past and exc.server_ms > past
    assert await _stat(stores, "tq", "late_claim") == 1
    assert (await stores.redis.hget(keys.run(run), "state")) == b"PENDING"
    assert [j.id for j in await stores.scripts.claim_due(keys, ClaimArgs(10, "w", LEASE_MS, 100,
                                                                           await stores.scripts.claim_deadline(5)))] \
        == [run]


async def test_a_finish_sent_again_after_a_lost_reply_takes_effect_once(client: Client, stores: Stores,
                                                                       cut: tuple[TcpProxy, str]) -> None:
    """The caller's finish goes out on a link that is then cut; it gives up, sends the same finish
    again on a good link (applied), and the first copy reaches Redis when the link heals: fenced by
    its token, it is STALE and changes nothing (one retry scheduled, one failure counted)."""
    proxy, url = cut
    run = await client.submit("t.fail")  # max_retries=3: an error outcome schedules a retry
    keys = stores.keys("tq")
    [job] = await stores.scripts.claim_due(keys, ClaimArgs(1, "w", 60_000, 100))
    finish = Finish(job.id, job.token, "error", "boom", "E", 50)
    r = connect(url)
    try:
        await r.ping()  # connected (the handshake is not what the cut holds back)
        proxy.pause()
        try:
            await asyncio.wait_for(Scripts(r).finish_runs(keys, FinishArgs(3), [finish]), 0.5)
            raise AssertionError("a finish through a cut link returned")
        except (TimeoutError, RedisUnavailable):
            pass
        [again] = await stores.scripts.finish_runs(keys, FinishArgs(3), [finish])
        assert again.state == "RETRY_WAIT"
        proxy.resume()
        await wait_until(lambda: _stat(stores, "tq", "stale_finish"), timeout=10, what="the first copy to run")
    finally:
        await r.aclose()
    h = await stores.redis.hgetall(keys.run(run))
    assert (h[b"state"], h[b"fails"]) == (b"RETRY_WAIT", b"1")
    events = [f for _, f in await stores.redis.xrange(keys.events)]
    assert [e[b"type"] for e in events if e[b"run"] == str(run).encode()] == [b"claimed", b"retry_scheduled"]


async def test_the_hot_path_client_never_sends_a_command_twice(cut: tuple[TcpProxy, str]) -> None:
    """A command whose reply times out is not re-sent by redis-py (its default retries would send
    it again on a new connection; every copy would run once the link heals)."""
    proxy, url = cut
    key = f"fpt-resend-{time.monotonic_ns()}"
    r = connect(url, socket_timeout=0.3)
    direct = aioredis.Redis.from_url(REDIS_URL)
    try:
        await r.ping()
        proxy.pause(existing_only=True)  # this connection stalls; a new one would get through
        sent = asyncio.ensure_future(r.incr(key))
        await asyncio.sleep(0.6)  # its reply timed out (0.3 s); a retrying client would be at it again
        proxy.resume()  # the held copy reaches Redis, and so would a copy sent again
        try:
            await sent
        except Exception as exc:  # redis-py's TimeoutError: given up, not re-sent
            assert "imeout" in type(exc).__name__ or "imeout" in str(exc), exc
        await asyncio.sleep(0.5)  # whatever was held is delivered now
        assert int(await direct.get(key) or 0) == 1, "the INCR ran more than once: the client re-sent it"
    finally:
        await direct.delete(key)
        await direct.aclose()
        await r.aclose()
