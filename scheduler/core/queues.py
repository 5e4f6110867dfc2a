"""Queues exist once declared: a worker serving them or a registered handler naming them creates
them in PostgreSQL and, when it is their creator, stamps them in Redis (a queue with no history has
nothing Redis could have lost). So no claim waits on a queue nobody has submitted to yet, and
`fencepost queue pause q` works before the first job. A queue that exists but is unstamped (Redis
forgot it) is left to the reconciler's rebuild, as before."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from fencepost.core.errors import InvalidInput, UnknownQueue
from fencepost.core.hot import StampArgs
from fencepost.core.keys import valid_queue_name
from fencepost.core.stores import Stores

__all__ = ["check_queue_name", "declare_queues", "require_queue", "stamp_created"]


def check_queue_name(name: str) -> str:
    """NAME, or InvalidInput when it is not a queue name."""
    if not valid_queue_name(name):
        raise InvalidInput(f"queue name {name!r} must be 1-64 of letters, digits, '_', '-', '.'", field="queue")
    return name


async def declare_queues(stores: Stores, names: Iterable[str]) -> list[str]:
    """Create the queues NAMES that do not exist yet and stamp the ones this call created; returns
    those. Idempotent: declaring a known queue changes nothing."""
    wanted = sorted(set(names))
    for name in wanted:
        check_queue_name(name)
    if not wanted:
        return []
    rows = await stores.db.rows("declare_queues", wanted)
    created = {r.name: r.epoch for r in rows}
    await stamp_created(stores, created)
    return sorted(created)


async def stamp_created(stores: Stores, created: dict[str, int]) -> None:
    """Stamp queues their caller has just created (name -> epoch), only where no stamp exists yet,
    and list them in the prefix's set of queues."""
    if not created:
        return
    for queue, epoch in created.items():
        await stores.scripts.stamp_queue(stores.keys(queue), StampArgs(epoch, force=0))
    await stores.redis.sadd(stores.queues_key, *created)


async def require_queue(stores: Stores, name: str) -> dict[str, object]:
    """The queue's row (name, epoch, paused, created_at), or UnknownQueue: read and admin commands
    refuse a queue nobody declared or submitted to instead of answering about nothing."""
    row = await stores.db.row("queue_row", name)
    if row is None:
        raise UnknownQueue(name)
    return msgspec.structs.asdict(row)
