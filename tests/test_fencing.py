"""Fencing tokens, leases and claim order, at the Lua level against real Redis.

Time is in the test's hands: each call names `now` (ms), which the harness makes the scripts' one
clock (tests/test_state_machine.unclock: the test clock; scripts take no time from a caller). No
test sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest

from fencepost.core.errors import NotStamped
from fencepost.core.keys import Keys
from fencepost.core.stores import Stores
from tests.test_state_machine import claimed_runs, clock_key, enqueue_args, unclock

T0 = 1_700_000_000_000
SPAN = 2 ** 40


def _s(x: Any) -> Any:
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, list):
        return [_s(v) for v in x]
    if isinstance(x, dict):
        return {_s(k): _s(v) for k, v in x.items()}
    return x


class Queue:
    """One queue's scripts, with the clock in the test's hands."""

    def __init__(self, stores: Stores, name: str = "fq", *, stamp: int | None = 1, frozen: bool = True) -> None:
        self.stores, self.keys, self.r = stores, stores.keys(name), stores.redis
        self.stamp = stamp
        self.frozen = frozen
        """True: each call's `now` is the scripts' clock; False: the server's real clock runs (`now` dropped)."""
        self.last_event = "0-0"

    async def setup(self) -> Queue:
        if self.stamp is not None:
            await self.stamp_epoch(self.stamp)
        return self

    async def stamp_epoch(self, epoch: int) -> None:
        """Stamp the queue as the reconciler does after a rebuild (force)."""
        assert await self.run("stamp_queue", epoch, 1) == 1

    async def run(self, name: str, *args: Any) -> Any:
        now, argv = unclock(name, list(args))
        if now is not None and self.frozen:
            await self.r.set(clock_key(self.keys), now)
        return _s(await self.stores.scripts.run(name, self.keys, argv))

    async def enqueue(self, now: int, *runs: dict) -> int:
        return await self.run("enqueue_runs", *enqueue_args(now, *runs))

    async def claim(self, now: int, n: int = 10, worker: str = "w", lease_ms: int = 1000) -> list[dict[str, str]]:
        out = await self.run("claim_due", now, n, worker, lease_ms, 100)
        return claimed_runs(out)

    async def finish(self, now: int, run_id: str, token: str, outcome: str = "ok", data: str = "d",
                     delay: int = 100, quarantine: int = 3) -> str:
        [state] = await self.run("finish_runs", now, quarantine, run_id, token, outcome, data, "E", delay)
        return state

    async def renew(self, now: int, run_id: str, token: str, lease_ms: int = 1000) -> Any:
        [res] = await self.run("renew_leases", now, lease_ms, run_id, token)
        return res

    async def reap(self, now: int) -> int:
        return await self.run("reap_expired", now, 100)

    async def hash(self, run_id: str) -> dict[str, str]:
        return _s(await self.r.hgetall(self.keys.run(run_id)))

    async def events(self) -> list[dict[str, str]]:
        """Events appended since the last call."""
        entries = await self.r.xrange(self.keys.events, min=f"({self.last_event}")
        if entries:
            self.last_event = _s(entries[-1][0])
        return [_s(f) for _, f in entries]

    async def stats(self) -> dict[str, str]:
        return _s(await self.r.hgetall(self.keys.stats))


@pytest.fixture
async def q(stores: Stores) -> Queue:
    return await Queue(stores).setup()


# --------------------------------------------------------------------------------------------
# stale workers


async def test_stale_worker_is_fenced_off(q: Queue) -> None:
    assert await q.enqueue(T0, dict(id="1", max_retries=2)) == 1
    [a] = await q.claim(T0, worker="A", lease_ms=1000)
    assert a["id"] == "1" and a["attempt"] == "1"
    assert await q.reap(T0 + 999) == 0  # lease still held
    assert await q.reap(T0 + 1000) == 1  # expired: back to PENDING, counted as an interruption (not a failure)
    h = await q.hash("1")
    assert h["state"] == "PENDING" and h["interrupts"] == "1" and "fails" not in h

    [b] = await q.claim(T0 + 1001, worker="B", lease_ms=1000)
    assert b["id"] == "1" and b["attempt"] == "2"
    assert int(b["token"]) > int(a["token"])

    before = await q.hash("1")
    assert await q.renew(T0 + 1002, "1", a["token"]) == 0  # lost
    assert await q.finish(T0 + 1003, "1", a["token"], "ok", "from A") == "STALE"
    assert await q.hash("1") == before  # state, version, token, result all unchanged
    assert before["state"] == "RUNNING" and before["token"] == b["token"] and "result" not in before
    assert (await q.stats()).get("stale_finish") == "1"
    # A's late calls are not in the stream either
    assert [(e["type"], e.get("worker")) for e in await q.events()] == [
        ("claimed", "A"), ("lease_expired", "A"), ("claimed", "B")]

    assert await q.renew(T0 + 1500, "1", b["token"]) == 1
    assert await q.reap(T0 + 2001) == 0  # B renewed until T0 + 2500
    assert await q.finish(T0 + 2002, "1", b["token"], "ok", "from B") == "SUCCEEDED"
    h = await q.hash("1")
    assert h["state"] == "SUCCEEDED" and h["result"] == "from B" and h["token"] == b["token"]
    [ev] = await q.events()
    assert (ev["type"], ev["from"], ev["to"], ev["token"], ev["worker"]) == (
        "succeeded", "RUNNING", "SUCCEEDED", b["token"], "B")
    assert await q.r.zcard(q.keys.active) == 0
    # finishing twice is stale too
    assert await q.finish(T0 + 2003, "1", b["token"], "ok", "again") == "STALE"
    assert (await q.stats())["stale_finish"] == "2"


async def test_release_is_fenced_and_not_a_failure(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1", max_retries=0))
    [a] = await q.claim(T0, worker="A")
    assert await q.run("release_runs", T0 + 1, "1", "1") == 0  # wrong token
    assert await q.run("release_runs", T0 + 1, "1", a["token"]) == 1
    h = await q.hash("1")
    assert h["state"] == "PENDING" and "fails" not in h
    [b] = await q.claim(T0 + 2, worker="B")
    assert int(b["token"]) > int(a["token"])
    assert await q.run("release_runs", T0 + 3, "1", a["token"]) == 0  # A's token is gone
    assert await q.finish(T0 + 4, "1", b["token"]) == "SUCCEEDED"


async def test_tokens_grow_across_an_epoch_bump(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1"), dict(id="2"), dict(id="3"))
    old = await q.claim(T0, n=3)
    old_tokens = [int(c["token"]) for c in old]
    assert old_tokens == sorted(old_tokens) and all(t // SPAN == 1 for t in old_tokens)

    # Redis loses the queue (failover to an empty replica): every key of the queue is gone.
    lost = [k async for k in q.r.scan_iter(match=q.keys.base.replace("[", "\\[") + "*")]
    assert len(lost) >= 5
    await q.r.delete(*lost)
    assert await q.r.exists(q.keys.token, q.keys.epoch, q.keys.run("1")) == 0

    # The reconciler stamps a new epoch and rebuilds the run from PostgreSQL.
    await q.stamp_epoch(2)
    await q.enqueue(T0 + 10, dict(id="1", attempt=1, version=2))
    [new] = await q.claim(T0 + 10)
    assert new["id"] == "1" and new["attempt"] == "2"
    assert await q.r.get(q.keys.token) == b"1"  # the counter restarted...
    assert int(new["token"]) > max(old_tokens)  # ...and the token still grew
    assert int(new["token"]) == 2 * SPAN + 1
    # the old owner of run 1 is fenced off
    assert await q.finish(T0 + 11, "1", old[0]["token"]) == "STALE"
    assert await q.renew(T0 + 11, "1", old[0]["token"]) == 0


# --------------------------------------------------------------------------------------------
# claim order


async def test_claim_order_priority_then_fifo(q: Queue) -> None:
    # ids deliberately out of order: FIFO is by enqueue order, not by id
    order = [("9", 0), ("3", 255), ("7", 10), ("1", 255), ("5", 0), ("2", 10), ("8", 255)]
    await q.enqueue(T0, *(dict(id=i, priority=p) for i, p in order[:4]))
    await q.enqueue(T0, *(dict(id=i, priority=p) for i, p in order[4:]))
    got = [c["id"] for c in await q.claim(T0, n=2)] + [c["id"] for c in await q.claim(T0, n=10)]
    assert got == ["3", "1", "8", "7", "2", "9", "5"]
    assert await q.claim(T0) == []


async def test_delayed_runs_are_claimable_only_at_run_at(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1", priority=0), dict(id="2", priority=200, run_at=T0 + 500))
    assert await q.r.zscore(q.keys.delayed, "2") == T0 + 500
    [c] = await q.claim(T0 + 1, n=1)
    assert c["id"] == "1"
    assert await q.claim(T0 + 499) == []
    assert (await q.hash("2"))["state"] == "PENDING"
    [c] = await q.claim(T0 + 500)
    assert c["id"] == "2"
    # a delayed run that comes due outranks an older due run of lower priority
    await q.enqueue(T0 + 600, dict(id="3", priority=1), dict(id="4", priority=9, run_at=T0 + 700))
    assert [c["id"] for c in await q.claim(T0 + 700, n=1)] == ["4"]
    assert [c["id"] for c in await q.claim(T0 + 700, n=1)] == ["3"]


async def test_paused_queue_claims_nothing(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1"), dict(id="2", run_at=T0 + 10))
    await q.r.set(q.keys.paused, 1)
    assert await q.claim(T0 + 100) == []
    assert await q.events() == []
    assert await q.r.zcard(q.keys.due) == 1 and await q.r.zcard(q.keys.delayed) == 1
    assert await q.r.get(q.keys.token) is None  # no token spent
    await q.r.delete(q.keys.paused)
    assert sorted(c["id"] for c in await q.claim(T0 + 100)) == ["1", "2"]


async def test_claim_refuses_an_unstamped_queue(stores: Stores) -> None:
    q = await Queue(stores, "unstamped", stamp=None).setup()
    await q.enqueue(T0, dict(id="1"))
    with pytest.raises(NotStamped) as info:
        await q.claim(T0)
    assert info.value.queue == "unstamped"
    assert (await q.hash("1"))["state"] == "PENDING"
    assert await q.r.zcard(q.keys.due) == 1 and await q.r.get(q.keys.token) is None
    assert await q.events() == []
    await q.stamp_epoch(1)
    [c] = await q.claim(T0)
    assert c["id"] == "1"


async def test_claim_refuses_a_stamp_written_on_another_server(q: Queue) -> None:
    """A stamp that came over replication or from a persisted file does not vouch for this server."""
    await q.enqueue(T0, dict(id="1"))
    await q.r.hset(q.keys.epoch, "server", "0" * 40)
    with pytest.raises(NotStamped):
        await q.claim(T0)
    assert (await q.hash("1"))["state"] == "PENDING" and await q.r.get(q.keys.token) is None
    # without force, an existing stamp is kept; the reconciler forces a fresh one
    assert await q.run("stamp_queue", 1, 0) == 0
    await q.stamp_epoch(1)
    assert [c["id"] for c in await q.claim(T0)] == ["1"]


async def test_claim_returns_the_run_fields(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1", handler="t.echo", payload="xyz", max_retries=4, timeout_ms=2500,
                             fire_time=T0 - 5, trace="tr-1"), dict(id="2"))
    c1, c2 = await q.claim(T0, worker="wk", lease_ms=700)
    assert c1 == dict(id="1", token=str(SPAN + 1), attempt="1", handler="t.echo", payload="xyz", timeout_ms="2500",
                      max_retries="4", fire_time=str(T0 - 5), trace="tr-1", gen="0")
    assert (c2["token"], c2["fire_time"], c2["trace"]) == (str(SPAN + 2), "", "")
    h = await q.hash("1")
    assert (h["state"], h["worker"], h["lease_until"], h["token"]) == ("RUNNING", "wk", str(T0 + 700), c1["token"])
    assert await q.r.zscore(q.keys.active, "1") == T0 + 700


# --------------------------------------------------------------------------------------------
# outcomes


async def test_retry_wait_comes_due_then_retries_run_out(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1", priority=0, max_retries=1))
    [c] = await q.claim(T0)
    assert await q.finish(T0 + 10, "1", c["token"], "error", "boom", delay=300) == "RETRY_WAIT"
    h = await q.hash("1")
    assert (h["state"], h["fails"], h["error"], h["run_at"]) == ("RETRY_WAIT", "1", "boom", str(T0 + 310))
    assert await q.r.zscore(q.keys.delayed, "1") == T0 + 310
    assert await q.r.zscore(q.keys.active, "1") is None
    assert await q.claim(T0 + 309) == []
    assert (await q.hash("1"))["state"] == "RETRY_WAIT"

    # At run_at it is due: PENDING again (a higher-priority run takes the only slot here).
    await q.enqueue(T0 + 310, dict(id="2", priority=255))
    [other] = await q.claim(T0 + 310, n=1)
    assert other["id"] == "2"
    assert (await q.hash("1"))["state"] == "PENDING"
    assert await q.r.zscore(q.keys.due, "1") is not None
    [c2] = await q.claim(T0 + 311)
    assert c2["id"] == "1" and c2["attempt"] == "2"
    assert await q.finish(T0 + 320, "1", c2["token"], "error", "boom again") == "FAILED"
    h = await q.hash("1")
    assert (h["state"], h["fails"]) == ("FAILED", "2")
    assert await q.r.zcard(q.keys.delayed) == 0
    evs = [(e["run"], e["type"], e["from"], e["to"]) for e in await q.events()]
    assert evs == [("1", "claimed", "PENDING", "RUNNING"), ("1", "retry_scheduled", "RUNNING", "RETRY_WAIT"),
                   ("1", "due", "RETRY_WAIT", "PENDING"), ("2", "claimed", "PENDING", "RUNNING"),
                   ("1", "claimed", "PENDING", "RUNNING"), ("1", "failed", "RUNNING", "FAILED")]
    last = (await q.r.xrevrange(q.keys.events, count=1))[0][1]
    assert _s(last)["reason"] == "retries_exhausted"


async def test_timeout_retries_then_times_out_on_the_last_attempt(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1", max_retries=1), dict(id="2", max_retries=0))
    c1, c2 = await q.claim(T0)
    assert await q.finish(T0 + 1, "2", c2["token"], "timeout", "too slow") == "TIMED_OUT"
    assert await q.finish(T0 + 1, "1", c1["token"], "timeout", "too slow", delay=0) == "RETRY_WAIT"
    [c1b] = await q.claim(T0 + 2)
    assert c1b["id"] == "1" and c1b["attempt"] == "2"
    assert await q.finish(T0 + 3, "1", c1b["token"], "timeout", "too slow") == "TIMED_OUT"
    evs = [e for e in await q.events() if e["type"] == "timed_out"]
    assert [(e["run"], e["reason"], e["outcome"]) for e in evs] == [("2", "timeout", "timeout"),
                                                                     ("1", "timeout", "timeout")]
    assert (await q.hash("1"))["state"] == (await q.hash("2"))["state"] == "TIMED_OUT"


async def test_fatal_fails_without_retry(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1", max_retries=5))
    [c] = await q.claim(T0)
    assert await q.finish(T0 + 1, "1", c["token"], "fatal", "bad input") == "FAILED"
    h = await q.hash("1")
    assert (h["state"], h["fails"], h["error"], h["error_class"]) == ("FAILED", "1", "bad input", "E")
    ev = (await q.events())[-1]
    assert (ev["type"], ev["reason"], ev["outcome"]) == ("failed", "fatal", "fatal")
    assert await q.r.zcard(q.keys.delayed) == 0 and await q.claim(T0 + 10_000) == []


async def test_crashes_are_counted_and_quarantined_at_the_threshold(q: Queue) -> None:
    await q.enqueue(T0, dict(id="1", max_retries=10))
    now, results = T0, []
    for outcome in ("crash", "error", "crash", "crash"):
        [c] = await q.claim(now)
        results.append(await q.finish(now + 1, "1", c["token"], outcome, "died", delay=0, quarantine=3))
        now += 10
    assert results == ["RETRY_WAIT", "RETRY_WAIT", "RETRY_WAIT", "FAILED"]
    h = await q.hash("1")
    assert (h["state"], h["crashes"], h["fails"]) == ("FAILED", "3", "4")
    ev = (await q.events())[-1]
    assert (ev["type"], ev["reason"], ev["outcome"]) == ("failed", "quarantined", "crash")


async def test_lease_expiry_uses_no_retry_and_fails_the_run_only_past_max_interruptions(q: Queue) -> None:
    """max_retries=0 and ten interruptions (the reap's limit here): each goes back to PENDING; the
    eleventh is FAILED interrupted_too_often, never retries_exhausted (no handler failed)."""
    await q.enqueue(T0, dict(id="1", max_retries=0))
    t = T0
    for n in range(1, 12):
        [c] = await q.claim(t, lease_ms=100)
        t += 100
        assert await q.run("reap_expired", t, 100, 10) == 1
        h = await q.hash("1")
        assert (h["interrupts"], "fails" in h) == (str(n), False)
        assert h["state"] == ("PENDING" if n <= 10 else "FAILED"), n
    ev = (await q.events())[-1]
    assert (ev["type"], ev["to"], ev["reason"], ev["outcome"]) == ("lease_expired", "FAILED", "interrupted_too_often",
                                                                   "interrupted")
    assert await q.finish(t + 1, "1", c["token"]) == "STALE"


async def test_keys_share_one_hash_slot() -> None:
    k = Keys("p", "q1")
    assert all(key.startswith("p:{q1}:") for key in k.script_keys()) and k.run(5) == "p:{q1}:run:5"


async def test_two_reapers_at_once_reap_each_expired_lease_once(stores: Stores) -> None:
    import asyncio

    q = await Queue(stores, "reapq").setup()
    await q.enqueue(T0, *(dict(id=str(i), max_retries=3) for i in range(1, 201)))
    assert len(await q.claim(T0, n=200, lease_ms=1000)) == 200
    await q.events()
    later = T0 + 5_000
    counts = await asyncio.gather(*(q.run("reap_expired", later, 60) for _ in range(8)))
    counts += [await q.reap(later), await q.reap(later)]
    assert sum(counts) == 200, counts
    expired = [e for e in await q.events() if e["type"] == "lease_expired"]
    assert sorted(int(e["run"]) for e in expired) == list(range(1, 201)), "each run reaped exactly once"
    assert await stores.redis.zcard(q.keys.active) == 0 and await stores.redis.zcard(q.keys.due) == 200


async def test_claim_heartbeat_and_finish_move_the_version_by_one_and_the_event_carries_it(q: Queue) -> None:
    """claim_due and finish_runs pass transition() the version they read with the state (no
    HINCRBY): a field added to their HMGET lists must not shift what is taken for it. The stored
    version, the event's `v` and the active set after a claim, a heartbeat and a finish."""
    await q.enqueue(T0, dict(id="1", version=4), dict(id="2", version=9))
    await q.events()
    claims = {c["id"]: c for c in await q.claim(T0)}
    assert set(claims) == {"1", "2"}
    got = await q.events()
    assert {e["run"]: e["v"] for e in got} == {"1": "5", "2": "10"}
    assert _s(await q.r.hget(q.keys.run("1"), "version")) == "5"
    assert _s(await q.r.hget(q.keys.run("2"), "version")) == "10"
    assert await q.run("renew_leases", T0 + 10, 5000, "1", claims["1"]["token"], "2", claims["2"]["token"]) == [1, 1]
    assert {_s(m): s for m, s in await q.r.zrange(q.keys.active, 0, -1, withscores=True)} == \
        {"1": T0 + 5010, "2": T0 + 5010}
    assert await q.finish(T0 + 20, "1", claims["1"]["token"]) == "SUCCEEDED"
    [ev] = await q.events()
    assert ev["v"] == "6" and _s(await q.r.hget(q.keys.run("1"), "version")) == "6"
    assert [_s(m) for m in await q.r.zrange(q.keys.active, 0, -1)] == ["2"]
