"""Bulk reads of one queue's Redis side for the reconciler's whole-queue comparison
(`fencepost.reconciler.drift.DriftRepair.suspects`, `fencepost reconcile --check`): every run hash
and sorted-set member as the line `id state version tenant`, read with SORT_RO ... GET pages (5,000
runs a call), pipelined HMGET where Redis refuses GET patterns, one SCAN. Here, not in the
reconciler, because services above the core read Redis only through the core (tests/test_layers.py).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from typing import Any, cast

import msgspec
from redis.exceptions import ResponseError

from fencepost.core.fairness import scan_queue
from fencepost.core.states import Status
from fencepost.core.stores import Stores

log = logging.getLogger("fencepost.reconciler")

__all__ = ["Seen", "read_queue"]

KNOWN = frozenset(s.value for s in Status)

_SORT_PAGE = 5_000
"""Members read per SORT_RO call (five or six hash fields each: ~20 ms inside Redis on a loaded 2-core VM)."""
_SCAN_COUNT = 10_000
"""Keys visited per SCAN step of the bulk comparison (~15 ms inside Redis)."""
_B = {s: s.encode() for s in KNOWN}
_IN_WAITING = frozenset({_B["PENDING"]})
_IN_DELAYED = frozenset({_B["PENDING"], _B["RETRY_WAIT"]})
_IN_ACTIVE = frozenset({_B["RUNNING"], _B["STOPPING"]})
_IN_NO_SET = frozenset(_B.values()) - _IN_DELAYED - _IN_ACTIVE


class Seen(msgspec.Struct):
    lines: set[bytes]
    """`id state version tenant` of each run hash that has its handler and sits in a set its state may sit
    in (the tenant: of the due set it waits in, else its hash's)."""
    odd: set[bytes]
    """Ids (as stored) of the others: members without a hash or in a set their state does not wait or
    run in, a held run of another key, hashes without a handler, hashes of waiting or leased runs in no set."""


class _Set(msgspec.Struct, frozen=True):
    """How `_page` files the members of one sorted set (or the hashes in none)."""

    ok: frozenset[bytes]
    """The states that may sit in it (empty: none may, e.g. an unregistered tenant's due set)."""
    tenant: bytes | None = None
    """A due set's tenant (the members' lines say it); None: read each run's `tenant` field."""
    own: str | None = None
    """The field naming the set a held run belongs in (`ckey`, `rkey`), and its value here."""
    key: bytes = b""

    def fields(self) -> tuple[str, ...]:
        """The hash fields read for each member, after its id."""
        return ("state", "version", "handler", *(() if self.tenant is not None else ("tenant",)),
                *((self.own,) if self.own else ()))


def _page(res: list[Any], how: _Set, seen: Seen) -> list[bytes]:
    """File one page of runs (SORT_RO's layout: the id, then `how.fields()`) into `seen`; returns the ids
    (a member that is not a run id gets a line no PostgreSQL row matches, left out by `suspects`)."""
    width = 1 + len(how.fields())
    ids, st, ver, hd = res[0::width], res[1::width], res[2::width], res[3::width]
    tn: Any = itertools.repeat(how.tenant) if how.tenant is not None else res[4::width]
    of = res[width - 1::width] if how.own else None
    if how.ok.issuperset(st) and None not in ver and all(hd) and (of is None or of.count(how.key) == len(of)):
        if how.tenant is None and None in tn:
            tn = [t or b"" for t in tn]
        seen.lines.update(map(b"\t".join, zip(ids, st, ver, tn)))  # the common case, at C speed
        return ids
    out = []
    for m, s, v, h, t, o in zip(ids, st, ver, hd, tn, of or itertools.repeat(how.key)):
        out.append(m)
        if s in how.ok and v is not None and h and o == how.key:
            seen.lines.add(b"\t".join((m, s, v, t or b"")))
        else:
            seen.odd.add(m)
    return out


class _QueueReading:
    """One queue's run hashes and sorted sets, read in bulk for `read_queue`. Each reply is
    filed while Redis computes the next one (the two run on two cores)."""

    def __init__(self, stores: Stores, queue: str) -> None:
        self.stores, self.keys, self.queue = stores, stores.keys(queue), queue
        # SORT ... GET substitutes the first '*' of the pattern; Redis Cluster before 8.0 refuses GET patterns
        self.sort = "*" not in self.keys.base and not stores.settings.redis_cluster
        self.seen = Seen(set(), set())

    async def read(self) -> Seen:
        k, r = self.keys, self.stores.redis
        tenants = set(cast("list[bytes]", await r.zrange(k.tenants, 0, -1)))
        rwait = set(cast("list[bytes]", await r.zrange(k.rwait, 0, -1)))
        scan = asyncio.ensure_future(self._scan())  # its steps interleave with the pages read meanwhile
        early: list[list[bytes]] = []
        for z in (k.delayed, k.active, k.due):
            async for ids in self._members(z, self._how(z, tenants, rwait)):
                early.append(ids)
        hashes, sets = await scan
        for ids in early:
            hashes.difference_update(ids)
        del early
        for z in sorted(sets - {k.due}):  # the tenants' due sets and the held sets the SCAN found
            async for ids in self._members(z, self._how(z, tenants, rwait)):
                hashes.difference_update(ids)
        rest = sorted(hashes)  # hashes in no set: paused, finished, or drift
        for i in range(0, len(rest), _SORT_PAGE):
            _page(await self._hmget(rest[i:i + _SORT_PAGE], _NO_SET), _NO_SET, self.seen)
        return self.seen

    def _how(self, z: str, tenants: set[bytes], rwait: set[bytes]) -> _Set:
        """How the members of the queue's sorted set `z` are filed (which states sit there, what names it)."""
        k = self.keys
        if z == k.delayed:
            return _Set(_IN_DELAYED)
        if z == k.active:
            return _Set(_IN_ACTIVE)
        tail = z[len(k.base):]
        if tail == "due" or tail.startswith("due:t:"):  # queued while its tenant is registered
            tenant = tail[6:].encode()
            return _Set(_IN_WAITING if tenant in tenants else frozenset(), tenant)
        if tail.startswith("held:"):  # held for a concurrency slot of its key
            return _Set(_IN_WAITING, None, "ckey", tail[5:].encode())
        rkey = tail[6:].encode()  # rheld:<rate key>: held for the key's window, queued while it waits in rwait
        return _Set(_IN_WAITING if rkey and rkey in rwait else frozenset(), None, "rkey", rkey)

    async def _scan(self) -> tuple[set[bytes], set[str]]:
        """One SCAN of the queue's keys: the run ids with a hash, and the names of its waiting sets."""
        base = self.keys.base.encode()
        run = self.keys.run("").encode()
        waiting = tuple(base + t for t in (b"due:t:", b"held:", b"rheld:"))
        hashes: set[bytes] = set()
        sets: set[str] = set()
        cur, names = await self._scan_step(0)
        while True:
            step = asyncio.ensure_future(self._scan_step(cur)) if cur else None
            if names:  # one join, replace and split for the page at C speed, not a slice per name
                parts = b"\n".join(names).replace(run, b"").split(b"\n")
                had = len(hashes)
                hashes.update(filter(bytes.isdigit, parts))
                if len(hashes) - had < len(parts):  # a key that is no run hash (or one SCAN returned twice)
                    sets.update(n.decode() for n in itertools.filterfalse(bytes.isdigit, parts)
                                if n.startswith(waiting))
            if step is None:
                return hashes, sets
            cur, names = await step

    async def _scan_step(self, cursor: int) -> tuple[int, list[bytes]]:
        if self.stores.settings.redis_cluster:  # on the primary owning the queue's slot
            cursor, found = await scan_queue(self.stores, self.queue, "*", cursor, _SCAN_COUNT)
            return cursor, [n.encode() for n in found]
        match = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in self.keys.base) + "*"
        cursor, raw = await self.stores.redis.scan(cursor, match=match, count=_SCAN_COUNT)
        return int(cursor), cast("list[bytes]", raw)  # bytes: Stores opens Redis with decode_responses=False

    async def _members(self, z: str, how: _Set) -> Any:
        """Pages of one sorted set's members with their hash fields, filed by `_page` (yields the ids).
        Two pages are asked for ahead, so Redis has the next one to compute while this one is filed."""
        ahead: collections.deque[asyncio.Future[tuple[list[Any], int]]] = collections.deque()
        off = 0
        for _ in range(2):
            ahead.append(asyncio.ensure_future(self._fetch(z, how, off)))
            off += _SORT_PAGE
        while ahead:
            res, n = await ahead.popleft()
            if n == _SORT_PAGE:
                ahead.append(asyncio.ensure_future(self._fetch(z, how, off)))
                off += _SORT_PAGE
            else:  # the end: a page asked for beyond it answers nothing
                for f in ahead:
                    await f
                ahead.clear()
            if n:
                yield _page(res, how, self.seen)

    async def _fetch(self, z: str, how: _Set, off: int) -> tuple[list[Any], int]:
        """One page of members from `off` in SORT_RO's layout (the id, then the fields), and how many."""
        fields = how.fields()
        if self.sort:
            gets: list[str] = ["GET", "#"]
            for f in fields:
                gets += ["GET", f"{self.keys.base}run:*->{f}"]
            try:
                res = await self.stores.redis.execute_command("SORT_RO", z, "BY", "nosort", "LIMIT", off,
                                                              _SORT_PAGE, *gets)
                return res, len(res) // (1 + len(fields))
            except ResponseError as exc:  # Redis Cluster before 8.0, or an older Redis without SORT_RO
                log.info("SORT_RO with GET patterns refused (%s): reading hashes with HMGET", exc)
                self.sort = False
        ids = cast("list[bytes]", await self.stores.redis.zrange(z, off, off + _SORT_PAGE - 1))
        return await self._hmget(ids, how), len(ids)

    async def _hmget(self, ids: list[bytes], how: _Set) -> list[Any]:
        """SORT_RO's layout for these runs, read with pipelined HMGETs."""
        pipe = self.stores.redis.pipeline(transaction=False)
        for m in ids:
            pipe.hmget(self.keys.run(m.decode()), how.fields())
        out: list[Any] = []
        for m, vals in zip(ids, await pipe.execute()):
            out.append(m)
            out += vals
        return out


_NO_SET = _Set(_IN_NO_SET)


async def read_queue(stores: Stores, queue: str, *, sort: bool = True) -> Seen:
    """Every run of `queue` as Redis holds it (`Seen`). `sort=False`: read as a Redis Cluster before 8.0
    makes it (ZRANGE and pipelined HMGET instead of SORT_RO ... GET)."""
    reading = _QueueReading(stores, queue)
    reading.sort = reading.sort and sort
    return await reading.read()
