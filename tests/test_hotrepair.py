"""core/hotrepair.py on real Redis: the reconciler's typed reads and writes that are not scripts."""

from __future__ import annotations

from fencepost.core import hotrepair
from fencepost.core.hot import StampArgs
from fencepost.core.hotrepair import GROUP, EventStreams
from fencepost.core.stores import Stores


async def test_the_runs_a_stream_holds_are_read_in_pages_up_to_a_limit(stores: Stores) -> None:
    keys = stores.keys("hr")
    for run in (3, 1, 3, 2, 5):
        await stores.redis.xadd(keys.events, {"run": str(run), "type": "claimed"})
    await stores.redis.xadd(keys.events, {"other": "x"})  # an entry without a run names none
    assert await hotrepair.stream_run_ids(stores, keys, limit=10, page=2) == {1, 2, 3, 5}
    assert await hotrepair.stream_run_ids(stores, keys, limit=5) is None, "longer than the limit: not read"


async def test_a_member_page_holds_run_ids_only(stores: Stores) -> None:
    keys = stores.keys("hr")
    await stores.redis.zadd(keys.delayed, {"7": 1, "not-a-run": 2, "11": 3})
    cursor, ids = 0, []
    while True:
        step = await hotrepair.member_page(stores, keys.delayed, cursor, 1)
        ids += step.ids
        cursor = step.cursor
        if cursor == 0:
            break
    assert sorted(ids) == [7, 11]
    assert await hotrepair.any_members(stores, [keys.due, keys.delayed])
    assert not await hotrepair.any_members(stores, [keys.due, keys.active])


async def test_a_deleted_pending_entry_is_acknowledged_by_the_read(stores: Stores) -> None:
    """An entry deleted while pending reads back with no fields: nothing to record, so the read
    acknowledges it instead of handing it to the recorder every time."""
    streams = EventStreams(stores)
    keys = stores.keys("hr")
    await streams.create_group(keys.events)
    await streams.create_group(keys.events)  # an existing group is kept
    kept = await stores.redis.xadd(keys.events, {"run": "1"})
    gone = await stores.redis.xadd(keys.events, {"run": "2"})
    fresh = await streams.read([keys.events], "c", pending=False, count=10, block_ms=10)
    assert [(s, eid) for s, eid, _ in fresh.entries] == [(keys.events, kept), (keys.events, gone)]
    await stores.redis.xdel(keys.events, gone)
    again = await streams.read([keys.events], "c", pending=True, count=10, block_ms=10)
    assert [eid for _, eid, _ in again.entries] == [kept] and not again.failed
    assert (await stores.redis.xpending(keys.events, GROUP))["pending"] == 1


async def test_a_stamp_names_its_epoch_and_the_server_that_wrote_it(stores: Stores) -> None:
    keys = stores.keys("hr")
    (before,) = await hotrepair.queue_stamps(stores, ["hr"])
    assert (before.epoch, before.stamped_on) == (None, None) and before.server
    await stores.scripts.stamp_queue(keys, StampArgs(3, force=1))
    (after,) = await hotrepair.queue_stamps(stores, ["hr"])
    assert (after.epoch, after.stamped_on) == (3, after.server)
    await hotrepair.unstamp(stores, keys)
    assert (await hotrepair.queue_stamps(stores, ["hr"]))[0].epoch is None
