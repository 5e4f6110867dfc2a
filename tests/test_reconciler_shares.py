"""Reconcilers as replicas split the queues (issue 23 item 5: "a second reconciler costs nothing").

Before, two reconcilers both read every queue's stream through the consumer group, each getting half of
every batch (a job's claim to one, its finish to the other), and both ticked every queue's drift: with a
reconciler beside each of two workers the drain fell to x0.55-0.88 of one reconciler's. Now each queue's
stream is read by one live reconciler (reconciler/shares.py), the others stand by, and a reconciler that
dies or leaves hands its share to the survivors."""

from __future__ import annotations

import time

import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import RedisUnavailable
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.keys import RECONCILERS_KEY
from fencepost.core.models import Submit
from fencepost.core.stores import Stores
from fencepost.reconciler.recorder import Recorder
from fencepost.reconciler.shares import Shares, owner
from tests.conftest import spawn, stop, wait_until


def test_every_queue_has_one_owner_and_a_leaver_moves_only_its_own_share() -> None:
    queues = [f"q{i}" for i in range(300)]
    three = ("a", "b", "c")
    before = {q: owner(q, three) for q in queues}
    assert before == {q: owner(q, tuple(reversed(three))) for q in queues}, "the split does not depend on order"
    counts = {m: sum(1 for o in before.values() if o == m) for m in three}
    assert all(60 <= n <= 140 for n in counts.values()), counts
    after = {q: owner(q, ("a", "b")) for q in queues}
    assert all(after[q] == before[q] for q in queues if before[q] != "c"), "only c's queues moved"


async def _work(client: Client, stores: Stores, n: int) -> list[int]:
    """n runs submitted, claimed and finished: 2 n entries in tq's stream."""
    keys = stores.keys("tq")
    ids = await client.submit_many([Submit(handler="t.noop") for _ in range(n)])
    jobs = await stores.scripts.claim_due(keys, ClaimArgs(n, "w", 30_000, 100))
    assert len(jobs) == n
    await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(j.id, j.token, "ok", b"\xc0", "", 0) for j in jobs])
    return ids


async def _record_until(recorders: list[Recorder], total: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(r.recorded for r in recorders) < total:
        assert time.monotonic() < deadline, [r.recorded for r in recorders]
        for r in recorders:
            await r.run_once(block_ms=50)


def _members_owning(queue: str) -> tuple[str, str]:
    """Two member names of which the first owns `queue` while both are alive."""
    first, second = "rec-1", "rec-2"
    return (first, second) if owner(queue, (first, second)) == first else (second, first)


async def test_two_reconcilers_on_one_queue_one_reads_its_stream_and_the_other_stands_by(
        client: Client, stores: Stores) -> None:
    mine, other = _members_owning("tq")
    sa, sb = Shares(stores, member=mine, refresh_s=3600), Shares(stores, member=other, refresh_s=3600)
    for s in (sa, sb, sa):  # both in the set, and each has seen the other
        await s.refresh(force=True)
    assert sa.live == sb.live == tuple(sorted((mine, other)))
    a, b = Recorder(stores, consumer="a", shares=sa), Recorder(stores, consumer="b", shares=sb)
    ids: list[int] = []
    for _ in range(3):
        ids += await _work(client, stores, 200)
        await _record_until([b, a], 2 * len(ids))  # b asks first each round: it must not take any
    assert (a.recorded, b.recorded) == (2 * len(ids), 0), "one reader per stream: whole batches, one attempt write"
    statuses = {r.status for r in await stores.db.rows("run_status", ids)}
    assert statuses == {"SUCCEEDED"}


async def test_a_dead_reconcilers_queues_go_to_the_survivor_after_its_liveness(
        client: Client, stores: Stores) -> None:
    mine, other = _members_owning("tq")
    sa = Shares(stores, member=mine, liveness_s=1.0, refresh_s=3600)
    sb = Shares(stores, member=other, liveness_s=1.0, refresh_s=0.0)
    for s in (sa, sb, sa):
        await s.refresh(force=True)
    a, b = Recorder(stores, consumer="a", shares=sa), Recorder(stores, consumer="b", shares=sb)
    first = await _work(client, stores, 50)
    await _record_until([b, a], 2 * len(first))
    assert b.recorded == 0
    # a dies (SIGKILL: it neither records nor says it is alive again); b takes tq once a's liveness is over
    second = await _work(client, stores, 50)
    deadline = time.monotonic() + 20
    while b.recorded < 2 * len(second):
        assert time.monotonic() < deadline, f"b recorded {b.recorded}; the set: {sb.live}"
        await b.run_once(block_ms=50)
    assert sb.live == (other,)
    assert a.recorded == 2 * len(first)
    statuses = {r.status for r in await stores.db.rows("run_status", first + second)}
    assert statuses == {"SUCCEEDED"}


async def test_a_reconciler_leaving_hands_its_share_over_at_once(stores: Stores) -> None:
    mine, other = _members_owning("tq")
    sa, sb = Shares(stores, member=mine, liveness_s=60), Shares(stores, member=other, liveness_s=60)
    for s in (sa, sb, sa):
        await s.refresh(force=True)
    assert sb.mine(["tq"]) == [] and sa.mine(["tq"]) == ["tq"]
    await sa.leave()
    await sb.refresh(force=True)
    assert sb.live == (other,) and sb.mine(["tq"]) == ["tq"]
    members = await stores.redis.zrange(RECONCILERS_KEY(stores.settings.prefix), 0, -1)
    assert members == [other.encode()]


async def test_with_redis_unreachable_a_reconciler_takes_every_queue(stores: Stores, monkeypatch) -> None:
    s = Shares(stores, member="rec-1")
    await Shares(stores, member="rec-2").refresh(force=True)
    await s.refresh(force=True)
    queues = [f"q{i}" for i in range(40)]
    assert len(s.mine(queues)) < len(queues)

    async def unreachable(*_: object) -> list[str]:
        raise RedisUnavailable("redis unreachable: test")

    monkeypatch.setattr(stores.scripts, "reconcilers_live", unreachable)
    await s.refresh(force=True)
    assert s.live is None and s.mine(queues) == queues, "unknown split: read everything, as one reconciler would"


async def test_the_live_set_is_kept_on_the_redis_servers_clock(stores: Stores) -> None:
    """A member's expiry is the server's time plus its liveness, whatever this host's clock says."""
    s = Shares(stores, member="rec-1", liveness_s=30)
    await s.refresh(force=True)
    (member, score), = await stores.redis.zrange(RECONCILERS_KEY(stores.settings.prefix), 0, -1, withscores=True)
    sec, usec = await stores.redis.time()
    assert member == b"rec-1" and abs(score - (sec * 1000 + usec // 1000 + 30_000)) < 2_000


def test_one_shot_use_does_every_queue(stores: Stores) -> None:
    """`Reconciler.maintain_once` and tests use a reconciler that is not running as a service: it must
    tick every queue whoever else is alive (the service enables the split when it starts)."""
    from fencepost.reconciler.service import Reconciler

    rec = Reconciler(stores.settings)
    rec.shares.live = ("someone-else", rec.shares.member)
    assert rec.shares.mine(["a", "b", "c"]) == ["a", "b", "c"]


@pytest.mark.slow
async def test_two_reconciler_processes_one_killed_the_other_records_its_queue_and_a_restart_takes_its_place(
        client: Client, stores: Stores, settings: Settings) -> None:
    """Two `fencepost reconciler` processes; the one owning tq is SIGKILLed; the survivor records tq's
    later transitions once the dead one's liveness is over. Restarted under its name, the dead one takes
    its place back (one member per name, never a ghost beside it)."""
    key = RECONCILERS_KEY(settings.prefix)
    names = ("rec-a", "rec-b")
    procs = {name: spawn(settings, "reconciler", FENCEPOST_RECORDER_ID=name) for name in names}

    async def members() -> set[str]:
        return {m.decode() for m in await stores.redis.zrange(key, 0, -1)}

    async def recorded(ids: list[int]) -> bool:
        return {r.status for r in await stores.db.rows("run_status", ids)} == {"SUCCEEDED"}

    async def each_saw_the_other() -> bool:  # both refreshed since both were in the set
        return all(score > since for _, score in await stores.redis.zrange(key, 0, -1, withscores=True))

    try:
        async def both_live() -> bool:
            return await members() == set(names)

        await wait_until(both_live, timeout=30, what="both reconcilers in the live set")
        sec, usec = await stores.redis.time()
        since = sec * 1000 + usec // 1000 + 3_000  # a member's score: its last refresh + its liveness (3 s)
        await wait_until(each_saw_the_other, timeout=30, what="each reconciler refreshed with the other in the set")
        dead = owner("tq", names)
        first = await _work(client, stores, 100)
        await wait_until(lambda: recorded(first), timeout=30, what="tq recorded by its owner")
        procs[dead].kill()
        procs[dead].wait(10)
        second = await _work(client, stores, 100)
        await wait_until(lambda: recorded(second), timeout=30, what="tq recorded by the survivor")
        assert await members() == set(names) - {dead}, "the dead one left the set (its liveness ran out)"
        procs[dead] = spawn(settings, "reconciler", FENCEPOST_RECORDER_ID=dead)
        await wait_until(both_live, timeout=30, what="the restarted reconciler back in the set")
        third = await _work(client, stores, 100)
        await wait_until(lambda: recorded(third), timeout=30, what="tq recorded after the restart")
        assert await members() == set(names)
    finally:
        stop(procs.values())
