"""Proactive rate limits: at most N starts per interval per queue and per rate key, enforced by
claim_due.lua on the Redis server's clock (lua/includes/common.lua "Rate limits").

Declaration and validation; the Lua enforcement on real Redis (held runs, release, fair order,
the queue-wide cap); a property test in which concurrent claimers on separate connections never
start more than N runs in any window of the interval (start times read from the claimed events'
`rts`, the server's clock the windows slide on); the dispatch settings (PostgreSQL record, Redis
copy, audit), `queue show`, the API, and two real worker processes sharing one limit.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fencepost.api import ApiConfig, create_app
from fencepost.api.auth import create_token
from fencepost.cli.common import EXIT_REFUSED
from fencepost.client import Client
from fencepost.core import fairness, rates
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, UnknownQueue
from fencepost.core.hot import render
from fencepost.core.models import Submit
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.core.workers import list_workers
from fencepost.reconciler.drift import DriftRepair
from fencepost.reconciler.rebuild import rebuild_queue
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.conftest import REDIS_URL, log_tail, need_tool, spawn, wait_until
from tests.test_api import Api, _make_api, serve_in_thread
from tests.test_cli import fp
from tests.test_fencing import Queue

_names = itertools.count()
DAY = 86_400_000


async def _queue(stores: Stores, **config: Any) -> Queue:
    q = await Queue(stores, f"rate{next(_names)}", frozen=False).setup()  # rate windows: the real server clock
    if config:
        await q.r.hset(q.keys.config, mapping=config)
    return q


async def _server_ms(r: Any) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _ids(claimed: list[dict[str, str]]) -> list[str]:
    return [c["id"] for c in claimed]


# -- declaration and validation --------------------------------------------------------------------

@pytest.mark.parametrize(("text", "n", "ms"), [
    ("100/1s", 100, 1000), ("5/250ms", 5, 250), ("60/m", 60, 60_000), ("1/1d", 1, DAY), ("3 / 1.5s", 3, 1500),
    ("1000000/1h", 1_000_000, 3_600_000), ("1/1ms", 1, 1),
])
def test_rates_parse(text: str, n: int, ms: int) -> None:
    rate = rates.parse("rate", text)
    assert (rate.n, rate.ms) == (n, ms)
    assert rates.parse_stored(rate.stored) == rate
    assert rates.parse("rate", str(rate)) == rate, "the shown form parses back to the same rate"


@pytest.mark.parametrize("text", [
    "0/1s", "-1/1s", "1/0s", "1/0.5ms", "1/2d", "1/86400001ms", "inf/1s", "1/infs", "nan/1s", "1/nan", "100",
    "100/1", "100/1 fortnight", "", "1e3/1s", "10000000/1s", "1/1s\x1b[31m", None, 5, 1.5,
])
def test_bad_rates_are_refused_naming_the_field(text: Any) -> None:
    with pytest.raises(InvalidInput) as exc:
        rates.parse("rate_limit", text)
    assert exc.value.field == "rate_limit"


def test_declaration_errors_name_the_field() -> None:
    reg = Registry()
    with pytest.raises(InvalidInput) as exc:
        reg.job("x", rate_key="customer")
    assert exc.value.field == "rate_limit"
    with pytest.raises(InvalidInput) as exc:
        reg.job("x", rate_key="customer", rate_limit="0/1s")
    assert exc.value.field == "rate_limit"
    with pytest.raises(InvalidInput) as exc:
        reg.job("x", rate_key="customer", rate_limit="10/2d")
    assert exc.value.field == "rate_limit"

    with pytest.raises(InvalidInput) as exc:
        @reg.job("x", rate_key="customer", rate_limit="10/1s")
        async def x(ctx: Any, account: str) -> None: ...
    assert exc.value.field == "rate_key"

    @reg.job("y", rate_key="customer", rate_limit="10/1s")
    async def y(ctx: Any, customer: str, n: int = 1) -> None: ...

    assert (y.spec.rate_key, y.spec.rate_arg, y.spec.rate_limit) == ("customer", 0, "10/1000")

    @reg.job("z", rate_limit="2/1m")
    async def z(ctx: Any) -> None: ...

    assert (z.spec.rate_key, z.spec.rate_limit) == ("", "2/60000"), "a rate without a key is the handler's own"
    from fencepost.client import _rate
    assert _rate(z.spec, z.request()) == ("z", "2/60000")
    assert _rate(y.spec, y.request("acme")) == ("y:acme", "10/1000")
    assert _rate(y.spec, y.options(rate_key="mine", rate_limit="1/1h").request("acme")) == ("mine", "1/3600000")
    req = y.options(rate_limit="1/1h").request("acme")
    assert (req.rate_key, req.rate_limit) == (None, "1/1h"), "a handle's options carry a submit's own rate"
    with pytest.raises(InvalidInput) as exc:
        y.options(rate_limit=5)
    assert exc.value.field == "rate_limit"


# -- Lua enforcement --------------------------------------------------------------------------------

async def test_a_full_key_is_held_aside_not_rescanned(stores: Stores) -> None:
    q = await _queue(stores)
    now = await _server_ms(q.r)
    await q.enqueue(now, *[dict(id=f"a{i}", rkey="A", rlimit=f"3/{DAY}") for i in range(10)],
                    *[dict(id=f"b{i}", rkey="B", rlimit=f"1/{DAY}") for i in range(2)], dict(id="free"))
    got = _ids(await q.claim(now, 100))
    assert got == ["a0", "a1", "a2", "b0", "free"], "3 of A, 1 of B, and the run without a key, in order"
    assert await q.r.zcard(q.keys.rate_held("A")) == 7
    assert await q.r.zcard(q.keys.rate_held("B")) == 1
    waits = dict(await q.r.zrange(q.keys.rwait, 0, -1, withscores=True))
    assert set(waits) == {b"A", b"B"} and all(now + DAY - 5_000 < s <= now + DAY + 5_000 for s in waits.values()), \
        "each key waits until its oldest start leaves the window"
    assert await q.r.zcard(q.keys.due) == 0, "held runs are out of the due set: a claim does not look at them"
    for _ in range(3):
        assert await q.claim(now, 100) == []
    assert await q.r.zcard(q.keys.rate_held("A")) == 7, "nothing moved: no rescan"
    assert int(await q.r.hget(q.keys.stats, "rate_limited")) == 8
    # held runs are where drift inspection expects them, and a cancel takes one out of the held set
    inspected = await q.run("repair_inspect", "a5")
    assert inspected[13] == "1", "a run held for its rate key counts as queued (drift leaves it alone)"
    assert await q.run("cancel_run", now, "a5", "op", "test", "", "") in ("CANCELLED", "cancelled")
    assert await q.r.zscore(q.keys.rate_held("A"), "a5") is None


async def test_held_runs_come_back_in_their_order_when_the_window_frees(stores: Stores) -> None:
    q = await _queue(stores)
    now = await _server_ms(q.r)
    await q.enqueue(now, *[dict(id=f"r{i}", rkey="K", rlimit="2/150") for i in range(6)])
    order: list[str] = _ids(await q.claim(now, 100))
    assert order == ["r0", "r1"]

    async def more() -> bool:
        order.extend(_ids(await q.claim(now, 100)))
        return len(order) == 6

    await wait_until(more, timeout=30, what="every held run started")
    assert order == [f"r{i}" for i in range(6)], "released runs keep their place in the fair order"
    assert await q.r.exists(q.keys.rate_held("K")) == 0
    assert await q.r.zscore(q.keys.rwait, "K") is None


async def test_a_lost_held_run_does_not_lift_the_limit(stores: Stores) -> None:
    """A held member whose run hash is gone (a repair dropped it) is skipped at release; the
    key's limit still holds for the runs behind it."""
    q = await _queue(stores)
    now = await _server_ms(q.r)
    await q.enqueue(now, *[dict(id=f"h{i}", rkey="K", rlimit="1/200") for i in range(4)])
    assert _ids(await q.claim(now, 10)) == ["h0"]
    await q.r.delete(q.keys.run("h1"))
    got: list[list[str]] = []

    async def released() -> bool:
        ids = _ids(await q.claim(now, 10))
        if ids:
            got.append(ids)
        return len(got) == 2

    await wait_until(released, timeout=30, what="two more windows")
    assert got == [["h2"], ["h3"]], "one start per window, the lost run skipped"


async def test_the_queue_rate_caps_each_claim(stores: Stores) -> None:
    q = await _queue(stores, rate=f"5/{DAY}")
    now = await _server_ms(q.r)
    await q.enqueue(now, *[dict(id=f"q{i}") for i in range(8)])
    assert _ids(await q.claim(now, 3)) == ["q0", "q1", "q2"]
    assert _ids(await q.claim(now, 100)) == ["q3", "q4"]
    assert await q.claim(now, 100) == []
    assert await q.r.zcard(q.keys.due) == 3, "the rest stay due (nothing is held for the queue's window)"
    score = await q.r.zscore(q.keys.rwait, "")
    assert score is not None and score > now + DAY - 5_000, "idle workers are told when the window frees"
    await q.r.hdel(q.keys.config, "rate")
    await q.r.zadd(q.keys.rwait, {"": 0}, xx=True)  # what fairness.apply does after a change (_recheck_rates)
    assert _ids(await q.claim(now, 100)) == ["q5", "q6", "q7"]
    assert await q.r.zscore(q.keys.rwait, "") is None


async def test_retries_count_as_starts(stores: Stores) -> None:
    q = await _queue(stores)
    now = await _server_ms(q.r)
    await q.enqueue(now, dict(id="x", rkey="K", rlimit=f"2/{DAY}", max_retries=5))
    for attempt in (1, 2):
        [x] = await q.claim(now + attempt, 1)
        assert x["attempt"] == str(attempt)
        assert await q.finish(now + attempt, "x", x["token"], outcome="error", delay=0) == "RETRY_WAIT"
    assert await q.claim(now + 3, 10) == [], "two starts (a first attempt and a retry) fill the window"
    assert await q.r.zscore(q.keys.rate_held("K"), "x") is not None
    assert await q.r.zcard(q.keys.rate_window("K")) == 2


async def test_an_operator_rate_replaces_the_declared_one(stores: Stores) -> None:
    q = await _queue(stores)
    now = await _server_ms(q.r)
    await q.r.hset(q.keys.rates, "K", f"4/{DAY}")
    await q.enqueue(now, *[dict(id=f"k{i}", rkey="K", rlimit=f"1/{DAY}") for i in range(6)])
    assert len(await q.claim(now, 100)) == 4


# -- property: no window ever holds more than N starts ----------------------------------------------

async def _starts(r: Any, keys: Any) -> dict[str, list[tuple[int, str]]]:
    """Claimed events of the queue's stream: run id -> [(rts, attempt)] (the server's clock)."""
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for _, f in await r.xrange(keys.events, "-", "+"):
        if f.get(b"type") == b"claimed":
            assert b"rts" in f, "a rate-limited start carries the server's clock"
            out[f[b"run"].decode()].append((int(f[b"rts"]), f[b"attempt"].decode()))
    return out


def _worst_window(times: list[int], ms: int) -> int:
    """The most starts in any half-open span [t, t + ms)."""
    times = sorted(times)
    worst, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - ms:
            j += 1
        worst = max(worst, i - j + 1)
    return worst


@hsettings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limits=st.lists(st.tuples(st.integers(1, 6), st.integers(20, 150)), min_size=1, max_size=3),
       queue_rate=st.one_of(st.none(), st.tuples(st.integers(1, 5), st.integers(20, 150)),
                            st.tuples(st.integers(1, 5), st.integers(20, 150))),
       runs=st.integers(4, 14), claimers=st.integers(2, 4), batch=st.integers(1, 5))
async def test_concurrent_claimers_never_exceed_a_window(stores: Stores, limits: list[tuple[int, int]],
                                                         queue_rate: tuple[int, int] | None, runs: int,
                                                         claimers: int, batch: int) -> None:
    """Claimers on separate connections race for runs of several rate keys (and maybe a queue-wide
    rate): every run starts, and no span of a window's length holds more than its N starts, on the
    server's clock the limit promises."""
    q = await _queue(stores, **({"rate": f"{queue_rate[0]}/{queue_rate[1]}"} if queue_rate else {}))
    now = await _server_ms(q.r)
    rows = [dict(id=f"k{k}r{i}", rkey=f"K{k}", rlimit=f"{n}/{ms}") for k, (n, ms) in enumerate(limits)
            for i in range(runs)]
    await q.enqueue(now, *rows)
    conns = [aredis.Redis.from_url(REDIS_URL) for _ in range(claimers)]
    claim = conns[0].register_script(render("claim_due"))
    total = len(rows)
    claimed: set[str] = set()

    async def claimer(conn: aredis.Redis, name: str) -> None:
        while len(claimed) < total:
            got = await claim(keys=q.keys.script_keys(), args=[batch, name, 60_000, 100], client=conn)
            for i in range(0, len(got), 10):
                claimed.add(got[i].decode())
            if not got:
                await asyncio.sleep(0.005)  # a claimer that found nothing asks again shortly (a worker waits on rwait)

    try:
        await asyncio.wait_for(asyncio.gather(*(claimer(c, f"w{i}") for i, c in enumerate(conns))), 60)
    finally:
        for c in conns:
            await c.aclose()
    starts = await _starts(q.r, q.keys)
    assert set(starts) == {r["id"] for r in rows}, "every held run eventually started"
    for k, (n, ms) in enumerate(limits):
        times = [t for rid, s in starts.items() if rid.startswith(f"k{k}r") for t, _ in s]
        assert _worst_window(times, ms) <= n, f"key K{k} ({n}/{ms} ms): a window held more than {n} starts"
    if queue_rate:
        every = [t for s in starts.values() for t, _ in s]
        assert _worst_window(every, queue_rate[1]) <= queue_rate[0], "the queue's window held more than its N"


# -- submits, the record, and a rebuild ------------------------------------------------------------

async def test_submits_carry_the_rate_key_into_the_record(client: Client, stores: Stores) -> None:
    a = await client.submit("t.rated", "acme", 1)
    b = await client.submit("t.rated", kwargs={"account": "globex"})
    c = await client.submit_many([Submit(handler="t.echo", args=(1,), rate_key="acct-7", rate_limit="10/1m")])
    pool = stores.db.pool
    assert pool is not None
    rows = {r["id"]: (r["rate_key"], r["rate_limit"]) for r in await pool.fetch(
        "SELECT id, rate_key, rate_limit FROM runs WHERE id = ANY($1::bigint[])", [a, b, *c])}
    assert rows == {a: ("t.rated:acme", "3/400"), b: ("t.rated:globex", "3/400"), c[0]: ("acct-7", "10/60000")}
    h = await stores.redis.hmget(stores.keys("tq").run(a), "rkey", "rlimit")
    assert h == [b"t.rated:acme", b"3/400"]
    for bad, fld in ((Submit(handler="t.echo", args=(1,), rate_limit="10/1s"), "rate_limit"),
                     (Submit(handler="t.echo", args=(1,), rate_key="k", rate_limit="0/1s"), "rate_limit"),
                     (Submit(handler="t.echo", args=(1,), rate_key="k"), "rate_limit"),
                     (Submit(handler="t.echo", args=(1,), rate_key="k k", rate_limit="1/1s"), "rate_key"),
                     (Submit(handler="t.rated", kwargs={"n": 2}), "account")):
        with pytest.raises(InvalidInput) as exc:
            await client.submit_many([bad])
        assert exc.value.field == fld, (bad, exc.value)
    assert await pool.fetchval("SELECT count(*) FROM runs") == 3, "a refused submit wrote nothing"


async def test_held_runs_come_back_after_redis_lost_the_queue(client: Client, stores: Stores) -> None:
    ids = await client.submit_many([Submit(handler="t.rated", args=("acme", i), rate_limit="2/1d") for i in range(6)])
    await fairness.set_rate(stores, "tq", "1000/1s", actor="t", reason="r")
    await fairness.set_key_rate(stores, "tq", "other", "5/1s", actor="t", reason="r")
    k, r = stores.keys("tq"), stores.redis
    first = await stores.scripts.run("claim_due", k, [10, "w", 60_000, 0])
    assert len(first) == 2 * 10
    assert await r.zcard(k.rate_held("t.rated:acme")) == 4
    # drift leaves held runs alone: the full pass finds nothing to requeue
    found = await DriftRepair(stores, page=100, grace_s=0.0).full_pass("tq", repair=False)
    assert not [d for d in found if int(d.run_id) in ids], found
    # Redis loses every key of the queue; the rebuild restores the held runs from PostgreSQL
    names = [n async for n in r.scan_iter(match=k.base.replace("{", "\\{").replace("}", "\\}") + "*")]
    await r.delete(*names)
    stats = await rebuild_queue(stores, "tq")
    assert stats["restored"] == 6, "the held runs and the two whose attempts the lost dataset knew"
    assert await r.hmget(k.run(ids[5]), "rkey", "rlimit") == [b"t.rated:acme", b"2/86400000"]
    assert await r.hget(k.config, "rate") == b"1000/1000" and await r.hgetall(k.rates) == {b"other": b"5/1000"}, \
        "the operator's rates are copied back from PostgreSQL"
    again = await stores.scripts.run("claim_due", k, [10, "w", 60_000, 0])
    assert len(again) == 2 * 10, "the windows were lost with the dataset: up to N start at once (docs)"
    assert await r.zcard(k.rate_held("t.rated:acme")) == 4, "the rest are held again, not lost"


# -- dispatch settings: record, copy, audit; CLI and API --------------------------------------------

async def test_rate_settings_are_validated_recorded_copied_and_audited(client: Client, stores: Stores) -> None:
    await client.submit("t.noop")
    pool = stores.db.pool
    assert pool is not None
    for bad in ("0/1s", "1/0s", "inf/1s", "nan/1s", "1/2d", "1/0.1ms", "lots", "-1/1s", "5"):
        with pytest.raises(InvalidInput) as exc:
            await fairness.set_rate(stores, "tq", bad, actor="t", reason="r")
        assert exc.value.field == "rate"
        with pytest.raises(InvalidInput):
            await fairness.set_key_rate(stores, "tq", "k", bad, actor="t", reason="r")
    with pytest.raises(InvalidInput) as exc:
        await fairness.set_key_rate(stores, "tq", "bad key", "1/1s", actor="t", reason="r")
    assert exc.value.field == "rate_key"
    assert await pool.fetchval("SELECT count(*) FROM audit_log WHERE action LIKE 'dispatch_%'") == 0
    with pytest.raises(UnknownQueue):
        await fairness.set_rate(stores, "nosuch", "1/1s", actor="t", reason="r")

    s = await fairness.set_rate(stores, "tq", "100/1s", actor="alice", reason="api quota")
    assert s.rate == "100/1000"
    s = await fairness.set_key_rate(stores, "tq", "t.rated:acme", "1/1m", actor="alice", reason="one")
    assert s.rates == {"t.rated:acme": "1/60000"}
    k = stores.keys("tq")
    assert await stores.redis.hget(k.config, "rate") == b"100/1000"
    assert await stores.redis.hgetall(k.rates) == {b"t.rated:acme": b"1/60000"}
    actions = [tuple(r) for r in await pool.fetch(
        "SELECT action, actor, reason FROM audit_log WHERE action LIKE 'dispatch_%' ORDER BY id")]
    assert actions == [("dispatch_rate", "alice", "api quota"), ("dispatch_key_rate", "alice", "one")]
    d = await fairness.describe(stores, "tq")
    assert [(x["key"], x["rate"], x["override"]) for x in d["rates"]] == [("", "100/1s", True),
                                                                          ("t.rated:acme", "1/1m", True)]
    await fairness.set_rate(stores, "tq", None, actor="alice", reason="off")
    await fairness.set_key_rate(stores, "tq", "t.rated:acme", None, actor="alice", reason="off")
    assert await stores.redis.hget(k.config, "rate") is None and not await stores.redis.exists(k.rates)


async def test_cli_sets_and_shows_rates(settings: Settings, client: Client, stores: Stores) -> None:
    await client.submit("t.rated", "acme")
    out = await fp(settings, "queue", "rate", "tq", "5/1s")
    assert out.code == 0 and "(queue)" in out.stdout and "5/1s" in out.stdout, out
    out = await fp(settings, "queue", "rate", "tq", "2/1m", "--key", "t.rated:acme")
    assert out.code == 0 and "t.rated:acme" in out.stdout and "2/1m" in out.stdout, out
    shown = json.loads((await fp(settings, "queue", "show", "tq", "--json")).stdout)
    assert {r["key"]: r["rate"] for r in shown["rates"]} == {"": "5/1s", "t.rated:acme": "2/1m"}
    for args in (("queue", "rate", "tq", "0/1s"), ("queue", "rate", "tq", "1/inf"), ("queue", "rate", "tq")):
        bad = await fp(settings, *args)
        assert bad.code == EXIT_REFUSED and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad
    out = await fp(settings, "submit", "t.echo", "--args", "[1]", "--rate-key", "acct-3", "--rate-limit", "9/1s")
    assert out.code == 0, out
    assert await stores.redis.hmget(stores.keys("tq").run(int(out.stdout)), "rkey", "rlimit") == [b"acct-3", b"9/1000"]
    bad = await fp(settings, "submit", "t.echo", "--args", "[1]", "--rate-key", "acct-3", "--rate-limit", "9/1y")
    assert bad.code == EXIT_REFUSED and bad.stderr.startswith("error: rate_limit") and bad.stderr.count("\n") == 1, bad
    assert (await fp(settings, "queue", "rate", "tq", "--reset")).code == 0
    assert (await fp(settings, "queue", "rate", "tq", "--reset", "--key", "t.rated:acme")).code == 0
    assert (await fairness.load(stores, "tq")).rate is None


@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        yield a


async def test_api_reads_and_changes_rates(api: Api, client: Client) -> None:
    await client.submit("t.noop")
    pool = client.stores.db.pool
    assert pool is not None
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "rate": "0/1s", "reason": "x"})
    assert r.status_code == 422 and r.json()["field"] == "rate", r.text
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "rate": "1/1s\u001b",
                                                                      "reason": "x"})
    assert r.status_code == 422, r.text
    r = await api.req("POST", "/v1/queues/tq/dispatch", "op_tq", json={"setting": "rate", "rate": "5/1s"})
    assert r.status_code == 403, "only admins change dispatch settings"
    assert await pool.fetchval("SELECT count(*) FROM audit_log WHERE action LIKE 'dispatch_%'") == 0
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "rate": "5/1s",
                                                                      "reason": "quota"})
    assert r.status_code == 200 and r.json()["rate"] == "5/1s", r.text
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "key": "k1",
                                                                      "rate": "7/250ms"})
    assert r.status_code == 200 and r.json()["rates"] == {"k1": "7/250ms"}, r.text
    got = (await api.req("GET", "/v1/queues/tq/dispatch", "op_tq")).json()
    assert [(u["key"], u["rate"], u["used"]) for u in got["rate_use"]] == [("", "5/1s", 0), ("k1", "7/250ms", 0)]
    assert (await api.req("GET", "/v1/queues/tq/dispatch", "op_other")).status_code == 403
    r = await api.req("POST", "/v1/queues/tq/dispatch", "admin", json={"setting": "rate", "rate": None})
    assert r.status_code == 200 and r.json()["rate"] is None
    # a submit through the API names its own rate key, checked like the client's
    r = await api.req("POST", "/v1/runs", "producer", json={"handler": "t.echo", "args": [1], "rate_key": "acct-9",
                                                             "rate_limit": "4/1s"})
    assert r.status_code in (200, 201), r.text
    row = await pool.fetchrow("SELECT rate_key, rate_limit FROM runs WHERE id = $1", r.json()["id"])
    assert tuple(row) == ("acct-9", "4/1000")
    for body, fld in (({"rate_limit": "4/1s"}, "rate_limit"), ({"rate_key": "k", "rate_limit": "0/1s"}, "rate_limit"),
                      ({"rate_key": "k", "rate_limit": "4/1y"}, "rate_limit")):
        r = await api.req("POST", "/v1/runs", "producer", json={"handler": "t.echo", "args": [1], **body})
        assert r.status_code == 422 and r.json()["field"] == fld, (body, r.text)


# -- two real worker processes share one limit ------------------------------------------------------

@pytest.mark.slow
async def test_two_worker_processes_share_one_limit(client: Client, settings: Settings, stores: Stores,
                                                    tmp_path: Path) -> None:
    """30 runs of one account (3 per 400 ms) and 6 of another, two worker processes: every run
    succeeds, and no 400 ms span of the server's clock holds more than 3 starts of one account.
    Both workers are listed before the first submit: one that is still importing when the other
    has claimed everything proves nothing about sharing (CI once saw exactly that)."""
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    workers = [spawn(settings, "worker", "--app", "tests.apps:registry", "--queue", "tq", "--concurrency", "20",
                     log=log) for log in logs]
    try:
        async def both_listed() -> bool:
            return len(await list_workers(stores)) == 2
        await wait_until(both_listed, timeout=60, what="both workers to list themselves")
        a = await client.submit_many([Submit(handler="t.rated", args=("A", i)) for i in range(30)])
        b = await client.submit_many([Submit(handler="t.rated", args=("B", i)) for i in range(6)])
        for rid in a + b:
            try:
                out = await client.wait(rid, timeout=120)
            except Exception as exc:
                raise AssertionError(f"run {rid}: {exc}\n{log_tail(logs[0])}\n{log_tail(logs[1])}") from None
            assert out.status == "SUCCEEDED", out
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    starts = await _starts(stores.redis, stores.keys("tq"))
    workers_seen = set()
    for _, f in await stores.redis.xrange(stores.keys("tq").events, "-", "+"):
        if f.get(b"type") == b"claimed":
            workers_seen.add(f[b"worker"])
    for ids in (a, b):
        times = [t for rid in ids for t, _ in starts[str(rid)]]
        assert len(times) == len(ids)
        assert _worst_window(times, 400) <= 3
    assert len(workers_seen) == 2, "both workers claimed (the limit is shared, not per worker)"


# -- the dashboard: an admin edits the rates ---------------------------------------------------------

@pytest.mark.slow
async def test_dashboard_admin_edits_rate_limits(settings: Settings, client: Client, stores: Stores) -> None:
    from tests.test_dashboard import ARTIFACTS, CHROMIUM, dashboard_page, log_in

    chromium = need_tool(CHROMIUM)
    from playwright.async_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    _, secret = await create_token(client.stores.db, "admin", [], "rate-admin", "test")
    app = create_app(settings, ApiConfig(token_cache_s=1, rate_limit=0))
    await client.submit("t.rated", "acme")
    page_errors: list[str] = []

    async def change(page: Any, key: str, rate: str, reason: str) -> None:
        await page.select_option("#dispatch-form select[name=setting]", "rate")
        await page.fill("#dispatch-form input[name=key]", key)
        await page.fill("#dispatch-form input[name=rate]", rate)
        await page.click("#dispatch-form button[type=submit]")
        await page.fill("#confirm-reason", reason)
        await page.click("#confirm-ok")

    with serve_in_thread(app) as base:
        async with dashboard_page(chromium, viewport={"width": 1280, "height": 900}) as page:
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            await log_in(page, base, secret, "rate-admin")
            await page.goto(f"{base}/ui/#/dispatch/tq")
            await expect(page.locator("#rate-summary")).to_contain_text("No queue-wide rate limit")
            await change(page, "", "50/1s", "partner quota")
            await expect(page.locator("#dispatch-result")).to_contain_text("rate changed")
            await expect(page.locator("#rate-summary")).to_contain_text("at most 50/1s")
            await change(page, "t.rated:acme", "1/1m", "acme asked")
            await expect(page.locator("#rates-table")).to_contain_text("t.rated:acme")
            await expect(page.locator("#rates-table")).to_contain_text("1/1m")
            await change(page, "", "0/1s", "typo")
            await expect(page.locator("#dispatch-result")).to_contain_text("refused")
            await page.screenshot(path=str(ARTIFACTS / "dashboard-rate-limits.png"), full_page=True)
    assert not page_errors, page_errors
    s = await fairness.load(stores, "tq")
    assert (s.rate, s.rates) == ("50/1000", {"t.rated:acme": "1/60000"}), "the refused change changed nothing"
    pool = stores.db.pool
    assert pool is not None
    rows = await pool.fetch("SELECT action, reason FROM audit_log WHERE action LIKE 'dispatch_%' ORDER BY id")
    assert [(r["action"], r["reason"]) for r in rows] == [("dispatch_rate", "partner quota"),
                                                          ("dispatch_key_rate", "acme asked")]


# -- an idle worker wakes when a window frees -------------------------------------------------------

wake_registry = Registry()


@wake_registry.job("rate.wake", queue="rq", rate_key="who", rate_limit="1/400ms")
async def rate_wake(ctx: Any, who: str, i: int) -> int:
    return i


@wake_registry.job("rate.plain", queue="rq")
async def rate_plain(ctx: Any, i: int) -> int:
    return i


async def test_an_idle_worker_wakes_when_a_window_frees(settings: Settings, stores: Stores) -> None:
    """The worker idles 10 minutes at a time; held runs (a key's window) and due runs behind a full
    queue-wide window all finish well inside that, so it woke at the windows' release times
    (rwait), not at the end of its idle wait. (The bound is generous, a tenth of the idle wait:
    a loaded machine does not make it fail, a worker that does not wake does.)"""
    idle_s, bound_s = 600.0, 60.0
    async with Client(settings=settings) as c:
        await c.register(wake_registry)
        worker = Worker(wake_registry, WorkerOptions(queues=["rq"], concurrency=20, idle_wait_s=idle_s),
                        settings=settings)
        task = asyncio.ensure_future(worker.run())
        try:
            first = await rate_plain.submit(c, 0)
            assert (await c.wait(first, timeout=bound_s)).status == "SUCCEEDED"  # started, and idle now
            ids = [await rate_wake.submit(c, "acme", i) for i in range(4)]
            for rid in ids:
                assert (await c.wait(rid, timeout=bound_s)).status == "SUCCEEDED"
            await fairness.set_rate(stores, "rq", "2/500ms", actor="t", reason="wake test")
            ids = await c.submit_many([rate_plain.request(i) for i in range(6)])
            for rid in ids:
                assert (await c.wait(rid, timeout=bound_s)).status == "SUCCEEDED"
        finally:
            worker.request_stop()
            await asyncio.wait_for(task, bound_s)
