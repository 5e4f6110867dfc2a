"""The run state machine, checked three ways against real Redis:

a. every (from, to, event) triple through the Lua `transition()` guard itself;
b. a static read of lua/: every literal `transition(...)` call, who writes `state`, and
   every script header;
c. a Hypothesis state machine driving the real queue scripts with random operations and
   checking each event the scripts append to the queue's stream;
d. every script that takes a computed edge, run from every state.
"""

from __future__ import annotations

import itertools
import re
import uuid
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck
from hypothesis import event as note
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redis.exceptions import ResponseError

from fencepost.core.hot import SCRIPT_NAMES, guarded, render, render_text
from fencepost.core.keys import Keys
from fencepost.core.resources import resource_dir
from fencepost.core.states import ACTIVE, TERMINAL, TRANSITIONS, Status, edges, is_legal
from fencepost.core.stores import Stores
from tests.conftest import REDIS_URL

LUA = resource_dir("lua")
ALL_FROM: list[Status | None] = [None, *Status]
ALL_EVENTS = sorted({e for evs in TRANSITIONS.values() for e in evs})

# A test-only script: the shared include, rendered exactly as scripts.py renders it, then one
# bare call of transition() on a scratch run hash. ARGV: id, from, to, event, now.
_PROBE_BODY = """
local id = ARGV[1]
return transition(id, run_key(id), ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]))
"""


def _probe_source() -> str:
    common = (LUA / "includes" / "common.lua").read_text()
    assert "-- @states" in common, "common.lua lost its -- @states placeholder"
    return guarded(render_text("-- @include common\n" + _PROBE_BODY))  # as render() runs every script


# --------------------------------------------------------------------------------------------
# a. every triple through the Lua guard


def _lua_may_take(frm: Status | None, to: Status, event: str) -> bool:
    """Lua takes exactly the table's edges that leave an existing state. Creation (from None)
    is never a Lua transition: enqueue_runs writes the hash without an event, because the
    `submitted` event is committed to PostgreSQL together with the run (`_states_lua` skips
    those edges on purpose), so the guard must refuse them too."""
    return frm is not None and is_legal(frm, to, event)


async def test_every_triple_through_the_lua_guard(stores: Stores) -> None:
    r = stores.redis
    keys = stores.keys("sm")
    probe = r.register_script(_probe_source())
    run_id = "77"
    key = keys.run(run_id)
    legal_seen: set[tuple[str, str, str]] = set()
    refused = 0
    for frm, to, event in itertools.product(ALL_FROM, list(Status), ALL_EVENTS):
        f = frm.value if frm else ""
        await r.hset(key, mapping={"state": f or "NONE", "version": 7, "handler": "t.echo"})
        before_len = await r.xlen(keys.events)
        last = await r.xrevrange(keys.events, count=1)
        last_id = last[0][0] if last else b"0-0"
        if _lua_may_take(frm, to, event):
            v = await probe(keys=keys.script_keys(), args=[run_id, f, to.value, event, 1234])
            assert v == 8, (frm, to, event)
            after = await r.xrange(keys.events, min=b"(" + last_id)
            assert len(after) == 1, f"{frm}->{to} ({event}) wrote {len(after)} events"
            fields = after[0][1]
            assert fields == {b"run": b"77", b"type": event.encode(), b"from": f.encode(),
                              b"to": to.value.encode(), b"v": b"8", b"ts": b"1234"}
            assert await r.hget(key, "version") == b"8"
            assert await r.hget(key, "state") == to.value.encode()
            legal_seen.add((f, to.value, event))
        else:
            with pytest.raises(ResponseError) as info:
                await probe(keys=keys.script_keys(), args=[run_id, f, to.value, event, 1234])
            assert str(info.value).startswith("ILLEGAL_TRANSITION"), str(info.value)
            assert str(info.value).startswith(f"ILLEGAL_TRANSITION {run_id} {f} {to.value}"), str(info.value)
            assert await r.xlen(keys.events) == before_len, f"{frm}->{to} ({event}) wrote an event"
            assert await r.hget(key, "version") == b"7"
            assert await r.hget(key, "state") == (f or "NONE").encode()
            refused += 1
    # Every non-creation edge of the table was taken, nothing else was.
    assert legal_seen == {e for e in edges() if e[0]}
    assert refused == len(ALL_FROM) * len(Status) * len(ALL_EVENTS) - len(legal_seen)
    # Creation edges exist in the table, and the guard refuses all of them (see _lua_may_take).
    assert {e for e in edges() if not e[0]} == {("", "PENDING", "submitted"), ("", "BLOCKED", "submitted")}


def test_is_legal_matches_edges() -> None:
    for frm, to, event in itertools.product(ALL_FROM, list(Status), ALL_EVENTS):
        assert is_legal(frm, to, event) == ((frm.value if frm else "", to.value, event) in edges())
    # Terminal states leave only by an operator: retry/restart to PENDING, a workflow retry
    # of an upstream_failed node back to BLOCKED, or resolving a review-queue run.
    for (frm, to), evs in TRANSITIONS.items():
        if frm in TERMINAL:
            assert (to is Status.PENDING and evs <= {"retried", "restarted"}) \
                or (frm is Status.CANCELLED and to is Status.BLOCKED and evs == {"retried"}) \
                or (frm is Status.FAILED and evs == {"resolved"}), (frm, to, evs)
    # Only claims create a lease, and only leased states end by lease expiry.
    assert {(f, t) for (f, t) in TRANSITIONS if t in ACTIVE and f not in ACTIVE} == {(Status.PENDING, Status.RUNNING)}
    assert TRANSITIONS[(Status.PENDING, Status.RUNNING)] == {"claimed"}
    assert all(f in ACTIVE for (f, t), evs in TRANSITIONS.items() if "lease_expired" in evs)


# --------------------------------------------------------------------------------------------
# b. static checks of lua/

_CALL = re.compile(r"\btransition\(([^()]*(?:\{[^{}]*\}[^()]*)?)\)")
_LITERAL = re.compile(r"^'([A-Za-z_]+)'$")


def _lua_scripts() -> list[str]:
    return sorted(p.stem for p in LUA.glob("*.lua"))


def test_literal_transition_calls_are_edges_of_the_table() -> None:
    checked, dynamic, sites = [], [], 0
    for name in _lua_scripts():
        src = (LUA / f"{name}.lua").read_text()
        sites += len(re.findall(r"\btransition\(", src))
        for m in _CALL.finditer(src):
            args = [a.strip() for a in re.split(r",(?![^{]*\})", m.group(1))]
            frm, to, event = (_LITERAL.match(a) for a in args[2:5])
            if frm and to and event:
                triple = (frm.group(1), to.group(1), event.group(1))
                assert triple in edges(), f"{name}.lua takes {triple}, which states.py does not list"
                checked.append((name, triple))
            else:
                dynamic.append((name, args[2:5]))
    # Sanity: the parser found the calls the scripts are known to make.
    assert len(checked) + len(dynamic) == sites, "a transition() call the parser could not read"
    assert len(checked) >= 7, checked
    assert {n for n, _ in checked} >= {"claim_due", "finish_runs", "reap_expired", "release_runs"}
    # Calls with a variable from/to/event (`st`, the state just read) are exercised from
    # every state by the tests in section d below; a new script doing that must be added there.
    uncovered = {n for n, _ in dynamic} - FROM_EVERY_STATE
    assert not uncovered, f"scripts with non-literal transition() calls not run from every state: {uncovered}"


# Scripts that may write a run's `state` field without transition(), and why.
STATE_WRITERS_WITHOUT_EDGE = {
    "enqueue_runs": "creation: the submitted event is committed to PostgreSQL with the run",
    "repair_sync": "drift repair: the hot copy is rewritten to the state PostgreSQL recorded",
}


def test_state_is_written_only_by_transition() -> None:
    writes = re.compile(r"redis\.call\(\s*'(?:HSET|HMSET|HSETNX)'\s*,[^)]*'state'", re.S)
    common = (LUA / "includes" / "common.lua").read_text()
    assert len(writes.findall(common)) == 1, "common.lua writes state outside transition()"
    for name in _lua_scripts():
        n = len(writes.findall((LUA / f"{name}.lua").read_text()))
        if name in STATE_WRITERS_WITHOUT_EDGE:
            assert n >= 1, f"{name}.lua no longer writes state: drop it from STATE_WRITERS_WITHOUT_EDGE"
        else:
            assert n == 0, f"{name}.lua writes a run's state without transition(): the state table cannot guard it"


def test_common_lua_has_the_guard_and_the_states_placeholder() -> None:
    common = (LUA / "includes" / "common.lua").read_text()
    assert "-- @states" in common
    assert re.search(r"if not LEGAL\[from \.\. '>' \.\. to \.\. '>' \.\. event\]", common)
    rendered = render("claim_due")
    assert "-- @states" not in rendered and "-- @include" not in rendered
    for f, t, e in edges():
        if f:
            assert f"['{f}>{t}>{e}'] = true" in rendered


def test_every_script_is_registered_and_documented() -> None:
    on_disk = _lua_scripts()
    assert sorted(SCRIPT_NAMES) == on_disk, "lua/*.lua and SCRIPT_NAMES differ"
    for name in on_disk:
        lines = (LUA / f"{name}.lua").read_text().splitlines()
        header = list(itertools.takewhile(lambda ln: ln.startswith("--"), lines))
        text = "\n".join(header)
        assert header and header[0].startswith(f"-- {name}.lua:"), f"{name}.lua header does not name the script"
        for word in ("KEYS", "ARGV", "Returns"):
            assert re.search(rf"\b{word}\b", text), f"{name}.lua header does not document {word}"
        if "Not a queue script" in text:  # e.g. circuit breakers: one shared key, no run state
            assert "transition(" not in "\n".join(lines), f"{name}.lua moves runs but is not a queue script"
            continue
        assert "-- @include common" in lines, f"{name}.lua does not include common"


# --------------------------------------------------------------------------------------------
# c. random operations against the real scripts

QUARANTINE = 2
START = 1_700_000_000_000


@dataclass
class RunM:
    id: str
    state: str
    version: int
    priority: int
    ready_at: int          # claimable from (PENDING in delayed / RETRY_WAIT); 0 once in `due`
    max_retries: int
    fails: int = 0
    interrupts: int = 0
    crashes: int = 0
    attempt: int = 0
    token: str | None = None
    old_tokens: list[str] = field(default_factory=list)
    lease_until: int | None = None
    held: bool = False     # claimed, not yet back to PENDING
    tenant: str = ""       # its due set: keys.due for '', else due:t:<tenant>


def _header_list(script: str, lead: str) -> tuple[int, list[str]]:
    """A field list documented in a script's header: '<lead>' then 'N <words>:' then names, with
    (notes) dropped. The tests build arguments and read results from the header, so a script
    whose layout changes without its header changing fails here, loudly."""
    header = "\n".join(itertools.takewhile(lambda ln: ln.startswith("--"),
                                           (LUA / f"{script}.lua").read_text().splitlines()))
    m = re.search(re.escape(lead) + r"\s*(\d+)[^:]*:(.*?)(?=\n-- \S|\Z)", header, re.S)
    assert m, f"{script}.lua header does not say '{lead} N ...:'"
    text = re.sub(r"\n--\s*", " ", m.group(2))
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    names = [n.strip() for n in text.split(",")]
    assert all(re.fullmatch(r"\w+", n) for n in names), f"cannot read the {script}.lua field list: {names}"
    assert len(names) == int(m.group(1)), f"{script}.lua header says {m.group(1)} fields but lists {names}"
    return int(m.group(1)), names


CLAIM_FIELDS = tuple(_header_list("claim_due", "else")[1])
"""What claim_due returns per claimed run (read from its header)."""
ENQUEUE_FIELDS = tuple(_header_list("enqueue_runs", "then")[1])
"""What enqueue_runs takes per run after ARGV[1] (read from its header)."""


def test_documented_field_lists() -> None:
    assert CLAIM_FIELDS[:3] == ("id", "token", "attempt")
    assert ENQUEUE_FIELDS[:4] == ("id", "state", "run_at", "priority")


def claimed_runs(out: list) -> list[dict[str, str]]:
    n = len(CLAIM_FIELDS)
    assert len(out) % n == 0, f"claim_due returned {len(out)} fields, not a multiple of {n}"
    return [dict(zip(CLAIM_FIELDS, map(str, out[i:i + n]))) for i in range(0, len(out), n)]


MAX_INTERRUPTIONS = 2
"""reap_expired's limit in the random walk (small, so runs reach interrupted_too_often)."""
CLOCKED = frozenset({"claim_due", "finish_runs", "renew_leases", "release_runs", "reap_expired", "escalate_stop",
                     "enqueue_runs", "repair_requeue", "repair_interrupt", "pause_run", "stop_run", "cancel_run",
                     "resume_run", "restart_run", "retry_run", "resolve_run", "run_now"})
"""Scripts that read the one clock (includes/clock.lua). The tests here call them as `name, now, ARGV...`:
`unclock` takes `now` off and the harness sets the scripts' test clock to it (FENCEPOST_TEST_CLOCK,
tests/conftest.py), so a test still holds time in its hands while the scripts take none from a caller."""


def unclock(name: str, args: list) -> tuple[int | None, list]:
    """(the test's now, the script's real ARGV) for a script call written as `now, ARGV...`."""
    if name not in CLOCKED:
        return None, list(args)
    now, rest = args[0], list(args[1:])
    if name == "reap_expired" and len(rest) == 1:
        rest.append(10)  # max_interruptions
    return int(now), rest


def clock_key(keys: Keys) -> str:
    """Where the scripts read the test clock (hot.TEST_CLOCK_ENV)."""
    return keys.testclock


def enqueue_args(now: int, *runs: dict) -> list:
    """ARGV of enqueue_runs as the tests call it: now (the test clock, see `unclock`), then the
    documented fields of each run."""
    args: list = [now]
    for r in runs:
        row = dict(state="PENDING", run_at=now, priority=0, handler="t.echo", payload=f"p{r['id']}", max_retries=0,
                   timeout_ms=1000, attempt=0, version=1, fire_time="", trace="", gen=0, tenant="", ckey="",
                   climit="", rkey="", rlimit="", delay_ms="")
        row.update(r)
        missing = [f for f in ENQUEUE_FIELDS if f not in row]
        assert not missing, f"enqueue_runs wants {missing}: teach enqueue_args a default"
        unknown = set(r) - set(ENQUEUE_FIELDS)
        assert not unknown, f"enqueue_runs no longer takes {unknown}"
        args += [row[f] for f in ENQUEUE_FIELDS]
    return args


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.s = {name: self.r.register_script(render(name)) for name in SCRIPT_NAMES}
        self.prefix = f"fpsm{uuid.uuid4().hex[:10]}"
        self.keys = Keys(self.prefix, "q")
        self.now = START
        self.runs: dict[str, RunM] = {}
        self.order: list[str] = []
        self.next_id = 1
        self.last_event = "0-0"
        self.max_token = 0
        self.paused = False
        self.stale_finish = 0

    # ---- helpers

    def call(self, name: str, *args):
        now, argv = unclock(name, list(args))
        if now is not None:
            self.r.set(clock_key(self.keys), now)
        return self.s[name](keys=self.keys.script_keys(), args=argv)

    def pick(self, i: int) -> RunM:
        return self.runs[self.order[i % len(self.order)]]

    def pick_claimed(self, i: int) -> RunM:
        """A run that was claimed at least once (the ones a token can refer to), leased ones first."""
        claimed = sorted((self.runs[r] for r in self.order if self.runs[r].token), key=lambda m: not m.held)
        return claimed[i % len(claimed)]

    def any_claimed(self) -> bool:
        return any(m.token for m in self.runs.values())

    def any_claimable(self) -> bool:
        return any(m.state in ("PENDING", "RETRY_WAIT") for m in self.runs.values())

    def stale_token(self, m: RunM) -> str:
        return m.old_tokens[-1] if m.old_tokens else "1"

    def new_events(self) -> list[dict[str, str]]:
        """Read and check every event appended since the last call."""
        out = []
        for eid, f in self.r.xrange(self.keys.events, min=f"({self.last_event}"):
            self.last_event = eid
            m = self.runs[f["run"]]
            frm, to, typ = f["from"], f["to"], f["type"]
            assert is_legal(Status(frm), Status(to), typ), f"illegal edge in stream: {f}"
            assert frm == m.state, f"run {m.id}: event from {frm}, model says {m.state}: {f}"
            assert int(f["v"]) == m.version + 1, f"run {m.id}: version {f['v']} after {m.version}"
            assert int(f["ts"]) == self.now
            if typ == "claimed":
                assert not m.held, f"run {m.id} claimed twice without returning to PENDING"
                tok = int(f["token"])
                assert tok > self.max_token, f"token {tok} not above {self.max_token}"
                self.max_token = tok
                m.held = True
                if m.token:
                    m.old_tokens.append(m.token)
                m.token, m.attempt, m.lease_until = f["token"], int(f["attempt"]), int(f["lease"])
            if to == "PENDING":
                m.held = False
            m.state, m.version = to, int(f["v"])
            out.append(f)
        return out

    def snapshot(self, m: RunM) -> dict[str, str]:
        return self.r.hgetall(self.keys.run(m.id))

    # ---- setup / teardown

    @initialize()
    def stamp(self) -> None:
        assert self.call("stamp_queue", 1, 1) == 1

    def teardown(self) -> None:
        keys = list(self.r.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            self.r.unlink(*keys)
        self.r.close()

    # ---- rules

    @rule(batch=st.lists(st.tuples(st.sampled_from([0, 1, 128, 255]), st.sampled_from([0, 0, 0, 500, 4000]),
                                   st.integers(0, 2), st.sampled_from(["", "", "a", "b"])), min_size=1, max_size=3))
    def submit(self, batch: list[tuple[int, int, int, str]]) -> None:
        rows = []
        for priority, delay, max_retries, tenant in batch:
            rid = str(self.next_id)
            self.next_id += 1
            run_at = self.now + delay
            rows.append(dict(id=rid, run_at=run_at, priority=priority, max_retries=max_retries, tenant=tenant))
            self.runs[rid] = RunM(rid, "PENDING", 1, priority, run_at if delay else 0, max_retries, tenant=tenant)
            self.order.append(rid)
        assert self.call("enqueue_runs", *enqueue_args(self.now, *rows)) == len(rows)
        assert self.new_events() == []

    @precondition(lambda self: self.runs)
    @rule(i=st.integers(0, 100))
    def enqueue_again_changes_nothing(self, i: int) -> None:
        m = self.pick(i)
        before = self.snapshot(m)
        n = self.call("enqueue_runs", *enqueue_args(self.now, dict(id=m.id, priority=9, payload="other")))
        assert n == 0
        assert self.snapshot(m) == before
        assert self.new_events() == []

    @precondition(lambda self: self.any_claimable())
    @rule(n=st.integers(1, 4), worker=st.sampled_from(["w1", "w2", "w3"]), lease_ms=st.sampled_from([100, 1000, 5000]))
    def claim(self, n: int, worker: str, lease_ms: int) -> None:
        eligible = [m for m in self.runs.values()
                    if m.state in ("PENDING", "RETRY_WAIT") and m.ready_at <= self.now]
        due_promotions = {m.id for m in eligible if m.state == "RETRY_WAIT"}
        prev_attempt = {m.id: m.attempt for m in eligible}
        out = self.call("claim_due", self.now, n, worker, lease_ms, 1000)
        events = self.new_events()
        if self.paused:
            assert out == [] and events == []
            return
        claimed = claimed_runs(out)
        assert len(claimed) == min(n, len(eligible))
        note(f"claimed {min(len(claimed), 2)}+")
        assert {e["run"] for e in events if e["type"] == "due"} == due_promotions
        claim_events = [e for e in events if e["type"] == "claimed"]
        assert [e["run"] for e in claim_events] == [c["id"] for c in claimed]
        assert len(events) == len(due_promotions) + len(claimed)
        ids = {c["id"] for c in claimed}
        # within a tenant, highest priority first (the aging step, 60 s, is far longer than
        # this machine's clock runs)
        for t in {m.tenant for m in eligible}:
            taken = [self.runs[i].priority for i in ids if self.runs[i].tenant == t]
            left = [m.priority for m in eligible if m.id not in ids and m.tenant == t]
            if taken and left:
                assert min(taken) >= max(left), f"tenant {t!r}: priority {max(left)} left behind {min(taken)}"
        tokens = [int(c["token"]) for c in claimed]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
        for c, ev in zip(claimed, claim_events):
            m = self.runs[c["id"]]
            assert ev["token"] == c["token"] and ev["worker"] == worker and int(ev["lease"]) == self.now + lease_ms
            assert (c["handler"], c["payload"], c["timeout_ms"], c["max_retries"]) == (
                "t.echo", f"p{m.id}", "1000", str(m.max_retries))
            assert int(c["attempt"]) == m.attempt == prev_attempt[m.id] + 1
            m.ready_at = 0
        for m in eligible:
            if m.id not in ids:
                m.ready_at = 0  # promoted into `due`

    @precondition(lambda self: self.any_claimed())
    @rule(i=st.integers(0, 100), current=st.sampled_from([True, True, True, False]), lease_ms=st.sampled_from([100, 3000]))
    def renew(self, i: int, current: bool, lease_ms: int) -> None:
        m = self.pick_claimed(i)
        token = m.token if current and m.token else self.stale_token(m)
        valid = m.state in ("RUNNING", "STOPPING") and token == m.token
        before = self.snapshot(m)
        out = self.call("renew_leases", self.now, lease_ms, m.id, token)
        assert self.new_events() == []
        note(f"renew valid={valid}")
        if valid:
            assert out == [1]
            m.lease_until = self.now + lease_ms
            assert self.snapshot(m)["lease_until"] == str(m.lease_until)
        else:
            assert out == [0]
            assert self.snapshot(m) == before

    @precondition(lambda self: self.any_claimed())
    @rule(i=st.integers(0, 100), outcome=st.sampled_from(["ok", "error", "fatal", "timeout", "crash", "interrupted"]),
          current=st.sampled_from([True, True, True, False]), delay=st.sampled_from([0, 200, 3000]))
    def finish(self, i: int, outcome: str, current: bool, delay: int) -> None:
        m = self.pick_claimed(i)
        token = m.token if current and m.token else self.stale_token(m)
        valid = m.state in ("RUNNING", "STOPPING") and token == m.token
        before = self.snapshot(m)
        out = self.call("finish_runs", self.now, QUARANTINE, m.id, token, outcome, "data", "E", delay)
        events = self.new_events()
        if not valid:
            assert out == ["STALE"] and events == []
            note("finish -> STALE")
            assert self.snapshot(m) == before
            self.stale_finish += 1
            assert self.r.hget(self.keys.stats, "stale_finish") == str(self.stale_finish)
            return
        if outcome == "ok":
            expect, typ = "SUCCEEDED", "succeeded"
        elif outcome == "interrupted":  # no operator request: handed back, not a failure
            expect, typ = "PENDING", "released"
            m.ready_at = 0
        else:
            m.fails += 1
            quarantined = False
            if outcome == "crash":
                m.crashes += 1
                quarantined = m.crashes >= QUARANTINE
            if outcome != "fatal" and not quarantined and m.fails <= m.max_retries:
                expect, typ = "RETRY_WAIT", "retry_scheduled"
                m.ready_at = self.now + delay
            elif outcome == "timeout":
                expect, typ = "TIMED_OUT", "timed_out"
            else:
                expect, typ = "FAILED", "failed"
            snap = self.snapshot(m)
            assert int(snap["fails"]) == m.fails and int(snap.get("crashes", 0)) == m.crashes
        assert out == [expect]
        note(f"finish -> {expect}")
        assert [(e["run"], e["type"], e["to"]) for e in events] == [(m.id, typ, expect)]
        assert events[0]["token"] == token
        m.lease_until = None

    @precondition(lambda self: self.any_claimed())
    @rule(advance=st.integers(0, 6000))
    def reap(self, advance: int) -> None:
        self.now += advance
        expired = [m for m in self.runs.values() if m.state == "RUNNING" and m.lease_until <= self.now]
        n = self.call("reap_expired", self.now, 1000, MAX_INTERRUPTIONS)
        events = self.new_events()
        assert n == len(expired)
        note(f"reaped {min(n, 2)}+")
        assert sorted(e["run"] for e in events) == sorted(m.id for m in expired)
        for m in expired:  # an interruption is not a failure: max_retries is not used up
            m.interrupts += 1
            assert m.state == ("PENDING" if m.interrupts <= MAX_INTERRUPTIONS else "FAILED")
            assert int(self.snapshot(m).get("fails", 0)) == m.fails
            m.ready_at, m.lease_until = 0, None
        assert all(e["type"] == "lease_expired" for e in events)

    @precondition(lambda self: self.any_claimed())
    @rule(i=st.integers(0, 100), current=st.sampled_from([True, True, True, False]))
    def release(self, i: int, current: bool) -> None:
        m = self.pick_claimed(i)
        token = m.token if current and m.token else self.stale_token(m)
        valid = m.state == "RUNNING" and token == m.token
        before = self.snapshot(m)
        n = self.call("release_runs", self.now, m.id, token)
        events = self.new_events()
        note(f"release valid={valid}")
        if valid:
            assert n == 1
            assert [(e["run"], e["type"], e["to"]) for e in events] == [(m.id, "released", "PENDING")]
            assert int(self.snapshot(m).get("fails", 0)) == m.fails  # a release is not a failure
            m.ready_at, m.lease_until = 0, None
        else:
            assert n == 0 and events == []
            assert self.snapshot(m) == before

    @rule(ms=st.integers(1, 3000))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(on=st.sampled_from([False, False, True]))
    def pause(self, on: bool) -> None:
        self.paused = on
        if self.paused:
            self.r.set(self.keys.paused, 1)
        else:
            self.r.delete(self.keys.paused)

    # ---- invariants

    @invariant()
    def stream_drained_and_hashes_match(self) -> None:
        assert self.new_events() == [], "an event appeared outside any operation"
        by_tenant = {t: set(self.r.zrange(self.keys.due if t == "" else f"{self.keys.base}due:t:{t}", 0, -1))
                     for t in ("", "a", "b")}
        due = set().union(*by_tenant.values())
        active_tenants = set(self.r.zrange(self.keys.base + "tenants", 0, -1))
        assert {t for t, ids in by_tenant.items() if ids} <= active_tenants, "a tenant with due runs is not served"
        delayed = dict(self.r.zrange(self.keys.delayed, 0, -1, withscores=True))
        active = dict(self.r.zrange(self.keys.active, 0, -1, withscores=True))
        for m in self.runs.values():
            h = self.snapshot(m)
            assert h["state"] == m.state and int(h["version"]) == m.version, (m, h)
            where = (m.id in due, m.id in delayed, m.id in active)
            if m.state == "PENDING":
                assert where in ((True, False, False), (False, True, False)), (m, where)
                assert m.id not in due or m.id in by_tenant[m.tenant], f"run {m.id} is in another tenant's due set"
                assert (m.id in delayed) == (m.ready_at > 0)
            elif m.state == "RETRY_WAIT":
                assert where == (False, True, False) and delayed[m.id] == m.ready_at, (m, where)
            elif m.state == "RUNNING":
                assert where == (False, False, True) and active[m.id] == m.lease_until, (m, where)
                assert h["token"] == m.token and int(h["lease_until"]) == m.lease_until
            else:
                assert m.state in {s.value for s in TERMINAL} and where == (False, False, False), (m, where)


def test_random_operations_keep_the_state_machine() -> None:
    run_state_machine_as_test(QueueMachine, settings=hsettings(
        max_examples=150, stateful_step_count=30, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


# --------------------------------------------------------------------------------------------
# d. every script that takes a computed edge, run from every state: it either refuses with a
#    typed error and changes nothing, or writes exactly one legal event, and the run ends up
#    in the index (due / delayed / active) its new state calls for. ILLEGAL_TRANSITION from
#    a real script is always a bug: the script's own state check let through an edge the
#    table does not have.

CONTROL_SCRIPTS = frozenset(n for n in SCRIPT_NAMES if "control_args(" in (LUA / f"{n}.lua").read_text())
FROM_EVERY_STATE = CONTROL_SCRIPTS | {"finish_runs", "reap_expired", "release_runs", "escalate_stop"}
NOW = 5_000_000
TOKEN = "1099511627999"
CTL_VARIANTS = {Status.RUNNING: [None, "pause"], Status.STOPPING: ["stop", "cancel"]}


class Scratch:
    """Run hashes placed directly in any state (the scripts only read the hash and indexes)."""

    def __init__(self, stores: Stores) -> None:
        self.r = stores.redis
        self.keys = stores.keys("every")
        self.scripts = {n: self.r.register_script(render(n)) for n in SCRIPT_NAMES}
        self.n = 0

    async def place(self, state: Status, ctl: str | None = None, fails: int = 0, attempt: int = 1) -> str:
        self.n += 1
        rid = str(self.n)
        fields = dict(state=state.value, version=5, priority=3, attempt=attempt, max_retries=2, fails=fails, crashes=0,
                      token=TOKEN, worker="w", lease_until=NOW + 1000, handler="t.echo", payload="p", run_at=NOW,
                      timeout_ms=1000)
        if ctl:
            fields["ctl"] = ctl
        await self.r.hset(self.keys.run(rid), mapping=fields)
        if state is Status.PENDING:
            await self.r.zadd(self.keys.due, {rid: 10})
        elif state is Status.RETRY_WAIT:
            await self.r.zadd(self.keys.delayed, {rid: NOW})
        elif state in ACTIVE:
            await self.r.zadd(self.keys.active, {rid: NOW + 1000})
        return rid

    async def discard(self, rid: str) -> None:
        k = self.keys
        await self.r.delete(k.run(rid))
        for z in (k.due, k.delayed, k.active):
            await self.r.zrem(z, rid)

    async def snapshot(self, rid: str) -> tuple:
        k = self.keys
        return (await self.r.hgetall(k.run(rid)), await self.r.zscore(k.due, rid), await self.r.zscore(k.delayed, rid),
                await self.r.zscore(k.active, rid), await self.r.xlen(k.events))

    async def call(self, name: str, args: list) -> tuple[object, str | None]:
        now, argv = unclock(name, args)
        if now is not None:
            await self.r.set(clock_key(self.keys), now)
        try:
            return _decoded(await self.scripts[name](keys=self.keys.script_keys(), args=argv)), None
        except ResponseError as exc:
            return None, str(exc)

    async def check(self, name: str, rid: str, frm: Status, args: list) -> tuple[object, dict | None]:
        """Run one script on one placed run; returns (result, the event it wrote or None)."""
        before = await self.snapshot(rid)
        last = await self.r.xrevrange(self.keys.events, count=1)
        out, err = await self.call(name, args)
        where = f"{name} from {frm.value} ({before[0].get(b'ctl')}): "
        if err is not None:
            assert not err.startswith("ILLEGAL_TRANSITION"), where + err
            assert await self.snapshot(rid) == before, where + f"refused ({err}) but changed the run"
            return err, None
        new = await self.r.xrange(self.keys.events, min=b"(" + last[0][0] if last else b"-")
        if not new:
            assert await self.snapshot(rid) == before, where + f"returned {out!r} with no event but changed the run"
            return out, None
        assert len(new) == 1, where + f"wrote {len(new)} events"
        ev = {k.decode(): v.decode() for k, v in new[0][1].items()}
        assert ev["run"] == rid and ev["from"] == frm.value, where + str(ev)
        assert is_legal(frm, Status(ev["to"]), ev["type"]), where + f"took an edge not in the table: {ev}"
        h, due, delayed, active, _ = await self.snapshot(rid)
        assert h[b"state"].decode() == ev["to"] and h[b"version"] == b"6" and ev["v"] == "6", where + str(ev)
        to = Status(ev["to"])
        expect = {Status.PENDING: (True, False, False), Status.RETRY_WAIT: (False, True, False)}.get(
            to, (False, False, to in ACTIVE))
        assert (due is not None, delayed is not None, active is not None) == expect, where + f"indexes wrong for {to}"
        return out, ev


def _decoded(x):
    return [_decoded(v) for v in x] if isinstance(x, list) else x.decode() if isinstance(x, bytes) else x


def _variants(state: Status) -> list[str | None]:
    return CTL_VARIANTS.get(state, [None])


@pytest.mark.parametrize("name", sorted(CONTROL_SCRIPTS))
async def test_control_script_from_every_state(stores: Stores, name: str) -> None:
    sc = Scratch(stores)
    took = set()
    for state in Status:
        for ctl in _variants(state):
            for attempt in (0, 1):
                rid = await sc.place(state, ctl, attempt=attempt)
                # a version the run has moved past: refused, nothing written
                err, _ = await sc.check(name, rid, state, [NOW, rid, "op", "why", "4", "comp.undo"])
                assert isinstance(err, str) and err.startswith("STALE_VERSION"), (name, state, err)
                _out, ev = await sc.check(name, rid, state, [NOW, rid, "op", "why", "5", "comp.undo"])
                if ev is None:
                    continue
                took.add((state.value, ev["to"], ev["type"]))
                assert (ev["actor"], ev["reason"]) == ("op", "why")
                assert ("compensate" in ev) == (ev["type"] == "cancelled" and attempt > 0 and name == "cancel_run")
    assert took, f"{name} took no edge from any state"
    _, err = await sc.call(name, [NOW, "404", "op", "why", "", ""])
    assert err and err.startswith("NO_RUN"), err


@pytest.mark.parametrize("state", sorted(ACTIVE))
async def test_finish_from_active_states(stores: Stores, state: Status) -> None:
    sc = Scratch(stores)
    for ctl in [*_variants(state), None]:
        for outcome in ("ok", "error", "fatal", "timeout", "crash", "interrupted"):
            for data in (["x", "forced"] if outcome == "interrupted" else ["x"]):
                for fails in (0, 2):
                    rid = await sc.place(state, ctl, fails=fails)
                    out, ev = await sc.check("finish_runs", rid, state, [NOW, 3, rid, TOKEN, outcome, data, "E", 100])
                    assert ev is not None and out == [ev["to"]], (state, ctl, outcome, out, ev)
                    if outcome == "ok":
                        assert ev["to"] == "SUCCEEDED"
                    if ev["to"] == "RETRY_WAIT":
                        assert state is Status.RUNNING and fails == 0 and outcome in ("error", "timeout", "crash")
    # a stale token from any state: nothing changes
    for st_ in Status:
        rid = await sc.place(st_)
        out, ev = await sc.check("finish_runs", rid, st_, [NOW, 3, rid, "1", "ok", "x", "E", 100])
        assert out == ["STALE"] and ev is None


@pytest.mark.parametrize("state", sorted(ACTIVE))
async def test_reap_and_escalate_from_active_states(stores: Stores, state: Status) -> None:
    sc = Scratch(stores)
    for ctl in _variants(state):
        for fails in (0, 2):
            rid = await sc.place(state, ctl, fails=fails)
            out, ev = await sc.check("reap_expired", rid, state, [NOW + 1000, 100])
            assert out == 1 and ev is not None and ev["type"] == "lease_expired"
            await sc.discard(rid)
        rid = await sc.place(state, ctl)
        out, ev = await sc.check("escalate_stop", rid, state, [NOW, rid, TOKEN, "w", 30])
        assert out == (1 if state is Status.STOPPING else 0)
        await sc.discard(rid)


async def test_release_from_every_state(stores: Stores) -> None:
    sc = Scratch(stores)
    for state in Status:
        for ctl in _variants(state):
            rid = await sc.place(state, ctl)
            out, ev = await sc.check("release_runs", rid, state, [NOW, rid, TOKEN])
            assert out == (1 if ev else 0)
            assert (ev is not None) == (state is Status.RUNNING), (state, ev)
