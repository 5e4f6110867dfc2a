"""Fair sharing between tenants, priority aging, and concurrency limits, at the Lua level
against real Redis (claim_due.lua, finish_runs.lua, reap_expired.lua). Time is passed
explicitly to every script: no test sleeps.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter

import pytest
import redis as sync_redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from redis.exceptions import ResponseError

from fencepost.core.hot import SCRIPT_NAMES, render
from fencepost.core.keys import Keys
from fencepost.core.stores import Stores
from tests.conftest import REDIS_URL
from tests.test_fencing import T0, Queue
from tests.test_state_machine import clock_key, enqueue_args, unclock

_names = itertools.count()


async def _queue(stores: Stores, **config: int) -> Queue:
    q = await Queue(stores, f"fair{next(_names)}").setup()
    if config:
        await q.r.hset(q.keys.config, mapping=config)
    return q


async def _dispatch(q: Queue, now: int, n: int, batch: int) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    while len(out) < n:
        got = await q.claim(now, min(batch, n - len(out)))
        if not got:
            break
        out += got
    return out


def _tenant_of(run_id: str) -> str:
    return run_id.split("0000")[0]


@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(weights=st.lists(st.sampled_from([1, 1, 2, 3, 5]), min_size=2, max_size=5),
       backlogs=st.lists(st.integers(150, 3000), min_size=5, max_size=5),
       batch=st.integers(1, 40))
async def test_backlogged_tenants_share_dispatch_by_weight(stores: Stores, weights: list[int], backlogs: list[int],
                                                           batch: int) -> None:
    """Over a long dispatch, each backlogged tenant's share stays within a small tolerance of
    weight / sum(weights), whatever the backlogs (one tenant's burst gets its share, no more)
    and whatever the claim batch size."""
    q = await _queue(stores)
    tenants = [f"{i + 1}" for i in range(len(weights))]
    for t, w in zip(tenants, weights):
        await q.r.hset(q.keys.base + "weights", t, w)
    runs = [dict(id=f"{t}0000{j}", tenant=t) for t, n in zip(tenants, backlogs) for j in range(n)]
    for i in range(0, len(runs), 2000):
        await q.enqueue(T0, *runs[i:i + 2000])
    total_w = sum(weights)
    # dispatch while every tenant is still backlogged
    m = int(min(n * total_w / w for n, w in zip(backlogs, weights)) * 0.9)
    got = Counter(_tenant_of(r["id"]) for r in await _dispatch(q, T0 + 1, m, batch))
    assert sum(got.values()) == m
    for t, w in zip(tenants, weights):
        expected = m * w / total_w
        assert abs(got[t] - expected) <= 2 + max(weights), (
            f"tenant {t} (weight {w} of {total_w}) got {got[t]} of {m} dispatches, expected ~{expected:.1f}")


async def test_a_tenant_arriving_behind_a_burst_gets_its_share_at_once(stores: Stores) -> None:
    """A million-run burst in miniature: B arrives after A's backlog is deep and after A has
    been served alone for a while. B is served from its first claim on, at its share, and has
    no credit to spend from the time it was idle."""
    q = await _queue(stores)
    await q.enqueue(T0, *[dict(id=f"10000{j}", tenant="1") for j in range(2000)])
    first = await _dispatch(q, T0 + 1, 500, 50)
    assert {_tenant_of(r["id"]) for r in first} == {"1"}
    await q.enqueue(T0 + 2, *[dict(id=f"20000{j}", tenant="2") for j in range(300)])
    nxt = await _dispatch(q, T0 + 3, 400, 50)
    got = Counter(_tenant_of(r["id"]) for r in nxt)
    assert abs(got["2"] - 200) <= 2, f"B got {got['2']} of the 400 dispatches after it arrived, not ~200"
    assert nxt[0]["id"].startswith("2") or nxt[1]["id"].startswith("2"), "B waited behind A's backlog"


async def test_runs_without_a_tenant_are_one_tenant_among_the_others(stores: Stores) -> None:
    q = await _queue(stores)
    await q.enqueue(T0, *[dict(id=f"90000{j}") for j in range(300)])
    await q.enqueue(T0, *[dict(id=f"30000{j}", tenant="3") for j in range(300)])
    await q.r.hset(q.keys.base + "weights", "", 3)
    got = Counter(_tenant_of(r["id"]) for r in await _dispatch(q, T0 + 1, 200, 20))
    assert abs(got["9"] - 150) <= 4 and abs(got["3"] - 50) <= 4, got


async def test_priority_orders_runs_within_a_tenant(stores: Stores) -> None:
    q = await _queue(stores)
    await q.enqueue(T0, dict(id="1", priority=0), dict(id="2", priority=9), dict(id="3", priority=9),
                    dict(id="4", priority=200))
    assert [r["id"] for r in await q.claim(T0 + 1, 4)] == ["4", "2", "3", "1"]


@hsettings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(low=st.integers(0, 200), gap=st.integers(1, 55), age_ms=st.integers(1, 20),
       per_step=st.integers(2, 4))
async def test_a_low_priority_run_is_not_starved_by_a_stream_of_higher_ones(
        stores: Stores, low: int, gap: int, age_ms: int, per_step: int) -> None:
    """Aging: runs of priority low+gap keep arriving faster than they are dispatched (strict
    priority would starve the low one forever). With an aging step of A ms per level, no run
    enqueued more than gap*A ms after the low one overtakes it, so its wait is bounded by
    gap*A ms of arrivals, here per_step*gap*A claims."""
    q = await _queue(stores, priority_age_ms=age_ms)
    ids = itertools.count(2)
    await q.enqueue(T0, *[dict(id=str(next(ids)), priority=low + gap) for _ in range(per_step)])
    await q.enqueue(T0, dict(id="1", priority=low))
    bound = per_step * gap * age_ms + 2 * per_step  # claims, one per ms
    for step in range(1, bound + 10):
        now = T0 + step
        await q.enqueue(now, *[dict(id=str(next(ids)), priority=low + gap) for _ in range(per_step)])
        [claimed] = await q.claim(now, 1)
        if claimed["id"] == "1":
            assert step <= bound, f"the low-priority run waited {step} claims, bound {bound}"
            return
    pytest.fail(f"the priority-{low} run was not claimed within {bound + 10} claims (aging step {age_ms} ms)")


async def test_per_key_limit_holds_runs_aside_and_frees_slots_on_finish_and_reap(stores: Stores) -> None:
    """At most the key's limit of runs leased at once; the others wait aside (not rescanned)
    and get a slot as leases end: finish, and the reaper after a worker died."""
    q = await _queue(stores)
    await q.enqueue(T0, *[dict(id=f"1{j:03}", ckey="export:A", climit=5, max_retries=3) for j in range(20)])
    await q.enqueue(T0, *[dict(id=f"2{j:03}", ckey="export:B", climit=5, max_retries=3) for j in range(5)])
    first = await q.claim(T0 + 1, 50, lease_ms=1000)
    per_key = Counter(r["id"][0] for r in first)
    assert per_key == {"1": 5, "2": 5}, per_key
    assert await q.r.zcard(q.keys.base + "held:export:A") == 15
    assert await q.claim(T0 + 2, 50) == [], "a full key yields nothing, without claiming over its limit"
    a = next(r for r in first if r["id"][0] == "1")
    assert await q.finish(T0 + 3, a["id"], a["token"]) == "SUCCEEDED"
    [nxt] = await q.claim(T0 + 4, 50)
    assert nxt["id"][0] == "1", "the freed slot goes to a held run of the same key"
    # the worker holding the other A leases dies: the reaper frees their slots
    assert await q.reap(T0 + 1002) == 9  # 4 first-wave A + 5 B leases expired (the new one runs to T0+1004)
    again = await q.claim(T0 + 1003, 50)
    assert Counter(r["id"][0] for r in again) == {"1": 4, "2": 5}, "expired A slots and B's runs came back"


async def test_operator_limit_overrides_the_declared_one_and_limits_the_queue(stores: Stores) -> None:
    q = await _queue(stores)
    await q.r.hset(q.keys.base + "limits", "k", 2)
    await q.enqueue(T0, *[dict(id=str(i), ckey="k", climit=5) for i in range(1, 7)])
    assert len(await q.claim(T0 + 1, 50)) == 2
    q2 = await _queue(stores, max_running=3)
    await q2.enqueue(T0, *[dict(id=str(i)) for i in range(1, 11)])
    assert len(await q2.claim(T0 + 1, 50)) == 3
    assert await q2.claim(T0 + 2, 50) == [], "max_running counts every leased run of the queue"


async def test_a_leaked_slot_repairs_itself_at_the_limit(stores: Stores) -> None:
    """The per-key lease set is derived state: a member whose run is no longer leased (a
    repair elsewhere, a lost write) is dropped when the key reaches its limit."""
    q = await _queue(stores)
    await q.r.sadd(q.keys.base + "ck:k", "999", "998")
    await q.enqueue(T0, *[dict(id=str(i), ckey="k", climit=2) for i in range(1, 4)])
    assert len(await q.claim(T0 + 1, 50)) == 2


async def test_cancel_of_a_held_run_takes_it_out_of_the_held_set(stores: Stores) -> None:
    q = await _queue(stores)
    await q.enqueue(T0, dict(id="1", ckey="k", climit=1), dict(id="2", ckey="k", climit=1))
    [first] = await q.claim(T0 + 1, 10)
    held = "2" if first["id"] == "1" else "1"
    assert await q.run("cancel_run", T0 + 2, held, "op", "r", "", "") == "CANCELLED"
    assert await q.r.zcard(q.keys.base + "held:k") == 0
    assert await q.finish(T0 + 3, first["id"], first["token"]) == "SUCCEEDED"
    assert await q.claim(T0 + 4, 10) == []


async def test_a_held_run_is_not_stranded_when_the_run_given_its_slot_is_cancelled(stores: Stores) -> None:
    q = await _queue(stores)
    await q.enqueue(T0, *[dict(id=str(i), ckey="k", climit=1) for i in (1, 2, 3)])
    [first] = await q.claim(T0 + 1, 10)
    assert first["id"] == "1"
    assert await q.finish(T0 + 2, "1", first["token"]) == "SUCCEEDED"  # 2 gets the slot, 3 stays held
    assert await q.run("cancel_run", T0 + 3, "2", "op", "r", "", "") == "CANCELLED"
    assert [r["id"] for r in await q.claim(T0 + 4, 10)] == ["3"], "the cancelled run's slot went nowhere"


async def test_a_raised_limit_releases_held_runs_at_once(stores: Stores) -> None:
    q = await _queue(stores)
    await q.enqueue(T0, *[dict(id=str(i), ckey="k", climit=1) for i in range(1, 6)])
    assert len(await q.claim(T0 + 1, 10)) == 1
    await q.r.hset(q.keys.base + "limits", "k", 5)
    assert await q.run("refill_held", "0", 100) == ["0", 4]
    assert len(await q.claim(T0 + 2, 10)) == 4


async def test_a_keys_limit_is_the_smallest_its_runs_declared(stores: Stores) -> None:
    q = await _queue(stores)
    await q.enqueue(T0, dict(id="1", ckey="k", climit=5), *[dict(id=str(i), ckey="k", climit=1) for i in range(2, 6)])
    assert len(await q.claim(T0 + 1, 10)) == 1


async def test_a_tenant_is_not_stranded_by_a_repair_that_empties_and_refills_its_set(stores: Stores) -> None:
    """One repair_sync call: A's lease end moves held H1 (tenant T) to due, H1 itself is synced
    (T's due set empties, T leaves the tenant set), B's lease end moves held H2 to T's set:
    T must be active again, or H2 is never claimed."""
    q = await _queue(stores)
    await q.enqueue(T0, dict(id="1", ckey="ka", climit=1), dict(id="2", ckey="kb", climit=1))
    assert {r["id"] for r in await q.claim(T0 + 1, 10)} == {"1", "2"}
    await q.enqueue(T0 + 2, dict(id="3", ckey="ka", climit=1, tenant="T"),
                    dict(id="4", ckey="kb", climit=1, tenant="T"))
    assert await q.claim(T0 + 3, 10) == []  # both held
    v = {i: (await q.hash(i))["version"] for i in ("1", "2", "3")}
    args = [60000]
    for rid, status in (("1", "SUCCEEDED"), ("3", "CANCELLED"), ("2", "SUCCEEDED")):
        args += [rid, v[rid], status, v[rid]]
    assert sorted(await q.run("repair_sync", *args)) == ["1", "2", "3"]
    assert [r["id"] for r in await q.claim(T0 + 4, 10)] == ["4"]


async def test_a_newcomer_starts_level_with_the_furthest_behind_tenant(stores: Stores) -> None:
    """A light tenant's large virtual step must not become everyone's start line."""
    q = await _queue(stores)
    await q.r.hset(q.keys.base + "weights", "c", 0.001)
    await q.enqueue(T0, *[dict(id=f"10000{j}", tenant="1") for j in range(50)])
    await q.enqueue(T0, *[dict(id=f"30000{j}", tenant="c") for j in range(5)])
    await q.claim(T0 + 1, 2)
    await q.enqueue(T0 + 2, *[dict(id=f"20000{j}", tenant="2") for j in range(5)])
    nxt = [r["id"] for r in await q.claim(T0 + 3, 4)]
    assert any(i.startswith("2") for i in nxt[:2]), f"B waited behind A: {nxt}"


async def test_changing_the_aging_step_rescores_runs_already_waiting(stores: Stores) -> None:
    q = await _queue(stores, priority_age_ms=2_592_000_000)  # 30 days per level
    await q.enqueue(T0, dict(id="1", priority=0))
    await q.r.hset(q.keys.config, "priority_age_ms", 60_000)
    assert await q.run("rescore_due", "due", "0", 100, 2_592_000_000) == ["0", 1]
    await q.enqueue(T0 + 86_400_000, dict(id="2", priority=0))  # a day later, same priority
    assert [r["id"] for r in await q.claim(T0 + 86_400_001, 1)] == ["1"], "the older run kept a 21-year penalty"
    with pytest.raises(Exception, match="BAD_SET"):
        await q.run("rescore_due", "active", "0", 100, 60_000)


async def test_a_producer_clock_far_ahead_does_not_push_the_queue_clock(stores: Stores) -> None:
    import time

    # The server's own clock runs (frozen=False: the test clock is not set). A producer whose clock is
    # 10 h ahead submits a run due at once: its time is not the scripts' (it is dropped), and the run
    # gets its place on the server's clock, not 10 h in the future.
    q = await Queue(stores, f"fair{next(_names)}", frozen=False).setup()
    ahead = int(time.time() * 1000) + 10 * 3_600_000
    await q.enqueue(ahead, dict(id="1", run_at=ahead, delay_ms=0))
    assert await q.r.zscore(q.keys.due, "1") is not None, "due at once, on the server's clock"
    assert int(await q.r.get(q.keys.seq)) <= (time.time() + 2) * 1_000_000


# -- a state machine over tenants and concurrency keys ------------------------------------------
DECLARED = {"k1": 1, "k2": 2}


class LimitsMachine(RuleBasedStateMachine):
    """Random submits (three tenants, two keys), claims, finishes, errors, cancels, pauses,
    resumes, releases, lease expiries and raised limits through the real scripts. After every
    step: each run sits exactly where its state says; a key never has more leases than its
    limit; a key with held runs has its free slots offered (leased + due of the key >= limit,
    so no held run is stranded); every tenant with due runs is served."""

    def __init__(self) -> None:
        super().__init__()
        self.r = sync_redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.s = {n: self.r.register_script(render(n)) for n in SCRIPT_NAMES}
        self.keys = Keys(f"fplm{uuid.uuid4().hex[:10]}", "q")
        self.base = self.keys.base
        self.now = T0
        self.ids: list[str] = []
        self.meta: dict[str, tuple[str, str | None]] = {}  # id -> (tenant, key)
        self.limit = dict(DECLARED)

    def call(self, name: str, *args: object) -> object:
        now, argv = unclock(name, list(args))
        if now is not None:
            self.r.set(clock_key(self.keys), now)
        return self.s[name](keys=self.keys.script_keys(), args=argv)

    def due_set(self, tenant: str) -> str:
        return self.keys.due if tenant == "" else f"{self.base}due:t:{tenant}"

    def h(self, rid: str) -> dict[str, str]:
        return self.r.hgetall(self.keys.run(rid))

    def pick(self, i: int, states: tuple[str, ...]) -> dict[str, str] | None:
        cands = [x for x in self.ids if self.h(x).get("state") in states]
        if not cands:
            return None
        rid = cands[i % len(cands)]
        return {"id": rid, **self.h(rid)}

    @initialize()
    def stamp(self) -> None:
        assert self.call("stamp_queue", 1, 1) == 1

    def teardown(self) -> None:
        found = list(self.r.scan_iter(match=f"{self.base}*", count=1000))
        if found:
            self.r.unlink(*found)
        self.r.close()

    @rule(batch=st.lists(st.tuples(st.sampled_from(["", "a", "b"]), st.sampled_from([None, "k1", "k2"]),
                                   st.sampled_from([0, 5])), min_size=1, max_size=4))
    def submit(self, batch: list[tuple[str, str | None, int]]) -> None:
        rows = []
        for tenant, key, prio in batch:
            rid = str(len(self.ids) + 1)
            self.ids.append(rid)
            self.meta[rid] = (tenant, key)
            rows.append(dict(id=rid, tenant=tenant, ckey=key or "", climit=DECLARED[key] if key else "",
                             priority=prio, max_retries=2))
        self.call("enqueue_runs", *enqueue_args(self.now, *rows))

    @rule(n=st.integers(1, 4))
    def claim(self, n: int) -> None:
        self.now += 1
        self.call("claim_due", self.now, n, "w", 1000, 100)

    @rule(i=st.integers(0, 50), outcome=st.sampled_from(["ok", "ok", "error"]))
    def finish(self, i: int, outcome: str) -> None:
        run = self.pick(i, ("RUNNING", "STOPPING"))
        if run:
            self.now += 1
            self.call("finish_runs", self.now, 3, run["id"], run["token"], outcome, "x", "E", 0)

    @rule(i=st.integers(0, 50), verb=st.sampled_from(["cancel", "pause", "resume", "stop"]))
    def command(self, i: int, verb: str) -> None:
        if not self.ids:
            return
        self.now += 1
        extra = [""] if verb == "cancel" else []
        try:
            self.call(f"{verb}_run", self.now, self.ids[i % len(self.ids)], "op", "r", "", *extra)
        except ResponseError as exc:
            assert str(exc).startswith("STATE"), exc

    @rule(i=st.integers(0, 50), verb=st.sampled_from(["cancel", "pause"]))
    def command_on_an_offered_run(self, i: int, verb: str) -> None:
        """Cancel or pause a keyed run that is due: it may hold the slot a lease end offered."""
        offered = [x for x in self.ids if self.meta[x][1] and self.h(x).get("state") == "PENDING"
                   and self.r.zscore(self.due_set(self.meta[x][0]), x)]
        if offered:
            self.now += 1
            extra = [""] if verb == "cancel" else []
            self.call(f"{verb}_run", self.now, offered[i % len(offered)], "op", "r", "", *extra)

    @rule(i=st.integers(0, 50), j=st.integers(0, 50), verb=st.sampled_from(["cancel", "pause"]))
    def finish_then_command_the_offered_run(self, i: int, j: int, verb: str) -> None:
        """A keyed lease ends and the run given its slot is cancelled or paused before any
        worker claims it: the slot must go on to the next held run."""
        run = self.pick(i, ("RUNNING",))
        if run and run.get("ckey"):
            self.now += 1
            self.call("finish_runs", self.now, 3, run["id"], run["token"], "ok", "x", "E", 0)
            self.command_on_an_offered_run(j, verb)

    @rule(picks=st.lists(st.integers(0, 50), min_size=1, max_size=4))
    def repair_sync_to_cancelled(self, picks: list[int]) -> None:
        """The reconciler makes several runs agree with a terminal record in one call (leased,
        held and due runs alike)."""
        args: list[object] = [60000]
        seen = set()
        for i in picks:
            if not self.ids:
                return
            rid = self.ids[i % len(self.ids)]
            v = self.h(rid).get("version")
            if rid in seen or self.h(rid).get("state") in ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED", "TIMED_OUT"):
                continue
            seen.add(rid)
            args += [rid, v, "CANCELLED", int(v) + 1]
        if len(args) > 1:
            self.call("repair_sync", *args)

    @rule(i=st.integers(0, 50))
    def release(self, i: int) -> None:
        run = self.pick(i, ("RUNNING",))
        if run:
            self.now += 1
            self.call("release_runs", self.now, run["id"], run["token"])

    # argument-free rules are drawn far more often than the others: gate the rare events
    @rule(go=st.integers(0, 7))
    def leases_expire(self, go: int) -> None:
        if go:
            return
        self.now += 1001
        self.call("reap_expired", self.now, 1000)

    @rule(key=st.sampled_from(["k1", "k2"]), go=st.integers(0, 7))
    def raise_limit(self, key: str, go: int) -> None:
        if go or self.limit[key] >= 3:
            return
        self.limit[key] += 1
        self.r.hset(self.base + "limits", key, self.limit[key])
        cursor = "0"
        while True:
            cursor, _ = self.call("refill_held", cursor, 100)
            if str(cursor) == "0":
                break

    @invariant()
    def structures_agree(self) -> None:
        tenants = set(self.r.zrange(self.base + "tenants", 0, -1))
        due = {t: set(self.r.zrange(self.due_set(t), 0, -1)) for t in ("", "a", "b")}
        for t, members in due.items():
            assert not members or t in tenants, f"tenant {t!r} has due runs but is not served"
        held = {k: set(self.r.zrange(f"{self.base}held:{k}", 0, -1)) for k in DECLARED}
        leased = {k: set(self.r.smembers(f"{self.base}ck:{k}")) for k in DECLARED}
        active = set(self.r.zrange(self.keys.active, 0, -1))
        delayed = set(self.r.zrange(self.keys.delayed, 0, -1))
        for rid in self.ids:
            st_ = self.h(rid)["state"]
            tenant, key = self.meta[rid]
            where = (rid in due[tenant], bool(key) and rid in held[key], rid in delayed, rid in active)
            if st_ == "PENDING":
                assert sum(where[:3]) == 1 and not where[3], (rid, st_, where)
            elif st_ == "RETRY_WAIT":
                assert where == (False, False, True, False), (rid, st_, where)
            elif st_ in ("RUNNING", "STOPPING"):
                assert where == (False, False, False, True), (rid, st_, where)
                assert not key or rid in leased[key], f"run {rid} leased but not counted for {key}"
            else:
                assert not any(where), (rid, st_, where)
        for k in DECLARED:
            live = {x for x in leased[k] if self.h(x).get("state") in ("RUNNING", "STOPPING")}
            assert len(live) <= self.limit[k], f"{k}: {len(live)} leased, limit {self.limit[k]}"
            if held[k]:
                offered = sum(1 for x in self.ids if self.meta[x][1] == k and x in due[self.meta[x][0]])
                assert len(live) + offered >= self.limit[k], (
                    f"{k}: {len(held[k])} held while only {len(live)} leased and {offered} offered "
                    f"(limit {self.limit[k]})")


def test_random_operations_keep_limits_and_tenants_consistent() -> None:
    run_state_machine_as_test(LimitsMachine, settings=hsettings(
        max_examples=120, stateful_step_count=40, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
