"""Typed hot-store calls of the reconciler that are not scripts.

The recorder's consumer group on each queue's events stream (create, read, adopt, acknowledge
and trim, quarantine), and what drift repair and the rebuild read and write around their scripts
(the runs a stream still holds, a page of a sorted set, the results of finished runs, the epoch
stamps, the set of queues). Above the core nothing calls redis-py (tests/test_layers.py), so every
key these touch comes from `fencepost.core.keys`.

The recorder's read is its hot path (every transition passes through it once): entries are handed
over as redis-py parsed them, (stream, entry id, fields), with no object or parsing pass of our own.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import msgspec
from redis.exceptions import ResponseError

from fencepost.core.keys import QUEUES_KEY, Keys, recorder_poison_key
from fencepost.core.redisconn import read_twice
from fencepost.core.stores import Stores

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

__all__ = ["GROUP", "AdoptPage", "Entry", "EventStreams", "MemberPage", "QueueStamp", "StreamRead", "any_members",
           "list_queue", "member_page", "queue_names", "queue_stamps", "run_results", "stream_run_ids", "unstamp"]

GROUP = "recorder"
"""The consumer group every recorder replica reads the events streams in."""

Entry: TypeAlias = tuple[str, bytes, dict[bytes, bytes]]
"""One stream entry as the recorder folds it: (stream key, entry id, fields), bytes since Stores
opens Redis with decode_responses=False. A tuple, not a Struct: it is redis-py's own (id, fields)
pair with its stream in front, made once per transition on the recorder's hot path."""

_StreamReply: TypeAlias = list[tuple[bytes | str, list[tuple[bytes, dict[bytes, bytes]]]]]
"""XREADGROUP's reply: (stream, [(entry id, fields)])."""


class StreamRead(msgspec.Struct):
    """One read of the recorder's group: the entries to record, and (Redis Cluster) the streams that
    could not be read, each with its error (their shard down: the others' entries are here)."""

    entries: list[Entry]
    failed: dict[str, BaseException]


class AdoptPage(msgspec.Struct):
    """One XAUTOCLAIM page: the entries taken over from a dead recorder, and where the next starts."""

    entries: list[Entry]
    next: bytes
    done: bool
    """The whole pending list was walked."""


class MemberPage(msgspec.Struct):
    """One ZSCAN step over a sorted set: its run-id members (a member that is no id is skipped)."""

    cursor: int
    ids: list[int]


class QueueStamp(msgspec.Struct, frozen=True):
    """A queue's epoch stamp as its Redis server holds it."""

    epoch: int | None
    """The stamped epoch (None: no stamp)."""
    stamped_on: str | None
    """The run_id of the server process that wrote the stamp."""
    server: str
    """The run_id of the server process holding the queue's keys now."""


class EventStreams:
    """The recorder's consumer group on the queues' events streams (lua/includes/common.lua
    transition() appends, the recorder reads, records, acknowledges and trims)."""

    def __init__(self, stores: Stores) -> None:
        self._stores = stores
        self.poison_key = recorder_poison_key(stores.settings.prefix)
        """Entries PostgreSQL refused even alone (a bug or corrupt data): kept for an operator."""

    async def create_group(self, stream: str) -> None:
        """The group on `stream` (and the stream), reading from its start; one that exists is kept."""
        try:
            await self._stores.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self, streams: Sequence[str], consumer: str, *, pending: bool, count: int,
                   block_ms: int) -> StreamRead:
        """Up to `count` entries of each stream for `consumer`: its own pending ones (`pending`) or new
        ones, waiting up to block_ms for new ones. A deleted entry still pending (no fields) is
        acknowledged here: there is nothing to record.

        Redis Cluster: each queue's stream is in its own hash slot, so one XREADGROUP over several
        streams fails with CROSSSLOT. Each stream is read on its own, concurrently and without BLOCK
        (a blocked read of one idle stream would delay the busy ones), and an empty read sleeps up to
        50 ms. A stream on a dead or failing-over shard fails alone (`failed`); only every stream
        failing raises."""
        redis = self._stores.redis
        start = "0" if pending else ">"
        failed: dict[str, BaseException] = {}
        if self._stores.settings.redis_cluster:
            replies = await asyncio.gather(*(redis.xreadgroup(GROUP, consumer, {s: start}, count=count)
                                             for s in streams), return_exceptions=True)
            for s, r in zip(streams, replies, strict=True):
                if isinstance(r, BaseException):
                    failed[s] = r
            if failed and len(failed) == len(streams):
                raise next(iter(failed.values()))
            reply: _StreamReply = [item for r in replies if not isinstance(r, BaseException)
                                   for item in cast("_StreamReply | None", r) or []]
            if not pending and not any(items for _, items in reply):
                await asyncio.sleep(min(block_ms, 50) / 1000)
        else:
            reply = cast("_StreamReply", await redis.xreadgroup(
                GROUP, consumer, {s: start for s in streams}, count=count, block=None if pending else block_ms) or [])
        entries: list[Entry] = []
        for stream, items in reply:
            s = stream.decode() if isinstance(stream, bytes) else stream
            for entry_id, fields in items:
                if fields:
                    entries.append((s, entry_id, fields))
                else:
                    await redis.xack(s, GROUP, entry_id)
        return StreamRead(entries, failed)

    async def adopt(self, stream: str, consumer: str, *, min_idle_ms: int, start: bytes | str,
                    count: int) -> AdoptPage:
        """Take over up to `count` entries another consumer read `min_idle_ms` ago or more and never
        acknowledged (XAUTOCLAIM from `start`)."""
        nxt, items, *_ = await self._stores.redis.xautoclaim(stream, GROUP, consumer, min_idle_ms, start_id=start,
                                                             count=count)
        nxt = nxt if isinstance(nxt, bytes) else nxt.encode()
        return AdoptPage([(stream, eid, f) for eid, f in items if f], nxt, nxt == b"0-0")

    async def quarantine(self, entry: Entry, error: str) -> None:
        """Keep an entry that cannot be recorded in the poison stream (its fields, its stream, its id
        and the error), then acknowledge and delete it so its stream moves on."""
        stream, entry_id, fields = entry
        redis = self._stores.redis
        poison = {**fields, b"stream": stream, b"entry": entry_id, b"error": error}
        await redis.xadd(self.poison_key, cast("dict[FieldT, EncodableT]", poison))  # dict is invariant
        pipe = redis.pipeline(transaction=False)
        pipe.xack(stream, GROUP, entry_id)
        pipe.xdel(stream, entry_id)
        await pipe.execute()

    async def acknowledge(self, by_stream: dict[str, list[bytes]]) -> None:
        """Acknowledge the recorded entries, then drop what is recorded: each stream is trimmed below
        the oldest entry still pending for any recorder (or, when none is, past the last entry delivered
        to the group), not deleted entry by entry (XDEL cost Redis ~6 us per job, the trim under 1).
        Every entry below that point was delivered (the group reads in order) and acknowledged, i.e.
        committed: the stream keeps only unrecorded history. A stream (or its group) gone since the
        read (FLUSHALL, a rebuild) has nothing to trim."""
        redis = self._stores.redis
        pipe = redis.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xack(stream, GROUP, *ids)
            pipe.xpending(stream, GROUP)
            pipe.xinfo_groups(stream)
        replies = await pipe.execute(raise_on_error=False)
        pipe = redis.pipeline(transaction=False)
        for i, stream in enumerate(by_stream):
            pending, groups = replies[3 * i + 1], replies[3 * i + 2]
            if isinstance(pending, Exception) or isinstance(groups, Exception):
                continue
            if pending["pending"]:
                minid = pending["min"]
            else:
                last = next((g["last-delivered-id"] for g in groups if g["name"] in (GROUP, GROUP.encode())), None)
                if not last:
                    continue
                ms, _, seq = last.partition(b"-")
                minid = b"%s-%d" % (ms, int(seq) + 1)
            pipe.xtrim(stream, minid=minid, approximate=False)
        await pipe.execute()


async def queue_names(stores: Stores) -> set[str]:
    """The prefix's set of known queues (discovery: Redis's half of the recorder's queue list)."""
    names = cast("set[bytes]", await stores.redis.smembers(QUEUES_KEY(stores.settings.prefix)))
    return {n.decode() for n in names}


async def list_queue(stores: Stores, queue: str) -> None:
    """Add a queue to the prefix's set of known queues (a rebuild puts back what Redis forgot)."""
    await stores.redis.sadd(QUEUES_KEY(stores.settings.prefix), queue)


async def stream_run_ids(stores: Stores, keys: Keys, *, limit: int, page: int = 10_000) -> set[int] | None:
    """The runs with an entry left in the queue's events stream (those the recorder has still to
    record), read in pages of `page`; None when the stream holds more than `limit` entries."""
    redis = stores.redis
    if await redis.xlen(keys.events) > limit:
        return None
    runs: set[int] = set()
    start = "-"
    while True:
        entries = cast("list[tuple[bytes, dict[bytes, bytes]]]",
                       await redis.xrange(keys.events, min=start, max="+", count=page))
        for _eid, f in entries:
            if b"run" in f:
                runs.add(int(f[b"run"]))
        if len(entries) < page:
            return runs
        start = "(" + entries[-1][0].decode()


async def run_results(stores: Stores, keys: Keys, ids: Sequence[int]) -> list[bytes | None]:
    """The encoded result each run's hash holds (None: none), in order: what drift repair records of
    a finish only Redis saw."""
    pipe = stores.redis.pipeline(transaction=False)
    for run_id in ids:
        pipe.hget(keys.run(run_id), "result")
    return cast("list[bytes | None]", await pipe.execute())


async def member_page(stores: Stores, key: str, cursor: int, count: int) -> MemberPage:
    """One ZSCAN step over a queue's sorted set (due, held, delayed, active): its run ids."""
    cursor, members = cast("tuple[int, list[tuple[bytes, float]]]",
                           await stores.redis.zscan(key, cursor, count=count))
    return MemberPage(int(cursor), [int(m) for m, _ in members if m.isdigit()])


async def any_members(stores: Stores, keys: Sequence[str]) -> bool:
    """Whether any of these sorted sets holds a member (one pipeline of ZCARDs)."""
    pipe = stores.redis.pipeline(transaction=False)
    for k in keys:
        pipe.zcard(k)
    return any(await pipe.execute())


async def unstamp(stores: Stores, keys: Keys) -> None:
    """Remove a queue's stamp and token counter: claims refuse the queue until it is stamped again."""
    await stores.redis.delete(keys.token, keys.epoch)


async def queue_stamps(stores: Stores, queues: Sequence[str]) -> list[QueueStamp]:
    """Each queue's stamp and the run_id of the server holding its keys now, in order (each read twice
    if the first read fails: a failover in progress).

    Redis Cluster: stamp_queue.lua recorded the run_id of the primary owning the queue's slot, so each
    queue is compared with that node's run_id (a plain INFO reaches one arbitrary node); a promoted
    replica has its own run_id."""
    servers: list[str] = []
    if stores.settings.redis_cluster:
        by_node: dict[str, str] = {}
        cluster: Any = stores.redis  # a RedisCluster here (Stores types it as Redis)
        for q in queues:
            node = cluster.get_node_from_key(stores.keys(q).epoch)
            if node.name not in by_node:
                info = await read_twice(functools.partial(cluster.info, "server", target_nodes=node))
                by_node[node.name] = info["run_id"]
            servers.append(by_node[node.name])
    else:
        server = (await read_twice(lambda: stores.redis.info("server")))["run_id"]
        servers = [server] * len(queues)

    async def read() -> list[Any]:
        pipe = stores.redis.pipeline(transaction=False)
        for q in queues:
            pipe.hmget(stores.keys(q).epoch, "epoch", "server")
        return await pipe.execute()

    stamps = await read_twice(read)
    return [QueueStamp(None if epoch is None else int(epoch), None if on is None else on.decode(), server)
            for (epoch, on), server in zip(stamps, servers, strict=True)]
