"""The chaos soak's verdicts: a pure function over what the jobs wrote (the ledger) and what
Fencepost recorded (its history in PostgreSQL), both as Structs, so every check can be fed a
known violation in a test without running anything.

The ledger's times are one clock: the ledger database's `clock_timestamp()`, in ms. What counts
as accepted or superseded is judged from Fencepost's own history (attempt rows, events ordered by
the run's version, checkpoint versions Fencepost returned), never from the ledger's fence."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import msgspec

from fencepost.core.states import DEAD, TERMINAL

__all__ = ["CHECKS", "AttemptRow", "CheckpointWrite", "EventRow", "Execution", "FaultRecovery", "History",
           "Ledger", "RunRow", "ScheduleFire", "ScheduleSpan", "Verdict", "check", "executions_from_rows"]

FINISH_EVENTS = frozenset({"succeeded", "failed", "timed_out", "retry_scheduled"})
"""Event types that record an execution's own finish (its outcome accepted by Fencepost)."""
HANDLER_OUTCOMES = frozenset({"error", "fatal", "timeout"})
ACCEPTED_OUTCOMES = frozenset({"succeeded", "error", "fatal", "timeout"})
"""Attempt outcomes that are the execution's own finish, reported by its worker and applied by Fencepost."""
EXAMPLES = 5


class CheckpointWrite(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    """The checkpoint version Fencepost returned (accepted); refused writes are not listed."""
    at_ms: int


class Execution(msgspec.Struct, frozen=True, kw_only=True):
    """One execution of a run as its handler reported it to the ledger."""

    run_id: int
    attempt: int
    token: int
    worker_id: str = ""
    pid: int = 0
    model: str = "async"
    started_ms: int
    last_ms: int
    """The last effect of this execution on the ledger (its start, an effect, an accepted checkpoint or its
    end; a refusal or a stop is not work done)."""
    ended: bool = False
    raised: bool = False
    """The handler raised on purpose (a handler error Fencepost should count as one)."""
    resumed_from: int = 0
    """The checkpoint version this execution started from (ctx.checkpoint_version)."""
    checkpoints: tuple[CheckpointWrite, ...] = ()


class FaultRecovery(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    at_s: float
    """Seconds into the soak when the fault was injected."""
    seconds: float | None
    """Recovery time of the faulted component (what it measures: `measures`); None: not within the limit."""
    measures: str = ""
    detail: str = ""
    skipped: str = ""
    """Why the fault was not injected (not a violation; the kind is then reported as skipped)."""
    error: str = ""
    """Injection failed (a harness error: a violation, the soak did not test what it says)."""


class ScheduleSpan(msgspec.Struct, frozen=True, kw_only=True):
    """A schedule of the soak: every fire time from `first_ms` up to `until_ms`, `interval_ms` apart, must be a run."""

    schedule_id: int
    interval_ms: int
    first_ms: int
    until_ms: int


class Ledger(msgspec.Struct, kw_only=True):
    acked: list[int] = []
    """Run ids whose submit Fencepost acknowledged."""
    t0_ms: int = 0
    """The soak's start on the ledger's clock (examples say when, in seconds into the soak)."""
    due: dict[int, int] = {}
    """Delayed runs: the earliest their first execution may start (ms, the host's clock before the submit + delay)."""
    executions: list[Execution] = []
    recoveries: list[FaultRecovery] = []
    schedules: list[ScheduleSpan] = []
    orphans: list[str] = []
    """Process-model children the harness found alive a second after their worker's SIGKILL."""
    harness_errors: list[str] = []


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    status: str
    run_at_ms: int = 0
    schedule_id: int | None = None
    fire_ms: int | None = None


class AttemptRow(msgspec.Struct, frozen=True, kw_only=True):
    run_id: int
    attempt: int
    token: int
    outcome: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    worker_id: str = ""
    started_ms: int | None = None
    """When Fencepost recorded the claim (the Redis server's clock), ms."""
    finished_ms: int | None = None


class EventRow(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    run_id: int
    type: str
    version: int | None = None
    attempt: int | None = None
    token: int | None = None
    to_status: str | None = None
    stream_id: int | None = None


class ScheduleFire(msgspec.Struct, frozen=True, kw_only=True):
    schedule_id: int
    fire_ms: int


class History(msgspec.Struct, kw_only=True):
    """What Fencepost recorded in PostgreSQL for the soak's queue."""

    runs: list[RunRow] = []
    attempts: list[AttemptRow] = []
    events: list[EventRow] = []


class Verdict(msgspec.Struct, kw_only=True):
    check: str
    violations: int
    examples: list[str] = []
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.violations == 0


CHECKS = (
    "acknowledged_submits_lost", "acknowledged_runs_unfinished", "overlapping_executions",
    "stale_finishes_accepted", "stale_checkpoints_accepted", "failed_without_handler_error", "duplicate_events",
    "untraced_executions", "attempt_numbers_reused", "started_before_due", "schedule_fires_missing",
    "children_outlived_worker", "faults_not_recovered", "harness_errors",
)
"""Every check, in the order of the verdict table."""


def _attempts(rows: list[AttemptRow]) -> str:
    """`1:interrupted, 2:error/OSError (its message's last line)`, for an example line."""
    out = []
    for a in sorted(rows, key=lambda a: a.attempt):
        text = f"{a.attempt}:{a.outcome}" + (f"/{a.error_class}" if a.error_class else "")
        if a.error_message and a.outcome in HANDLER_OUTCOMES:
            text += f" ({a.error_message.strip().splitlines()[-1][:120]})"
        out.append(text)
    return ", ".join(out) or "none"


def _verdict(name: str, found: list[str], note: str = "") -> Verdict:
    return Verdict(check=name, violations=len(found), examples=found[:EXAMPLES], note=note)


class _Facts:
    """The ledger and the history indexed once, by run, for the checks below."""

    def __init__(self, ledger: Ledger, history: History) -> None:
        self.ledger, self.history = ledger, history
        self.runs = {r.id: r for r in history.runs}
        self.attempts: dict[int, list[AttemptRow]] = defaultdict(list)
        for a in history.attempts:
            self.attempts[a.run_id].append(a)
        self.execs: dict[int, list[Execution]] = defaultdict(list)
        for e in ledger.executions:
            self.execs[e.run_id].append(e)


def check(ledger: Ledger, history: History, *, overlap_window_ms: int = 0, due_slack_ms: int = 1000) -> list[Verdict]:
    """Every verdict (CHECKS order). `overlap_window_ms` is the documented self-fencing window:
    two executions of one run may overlap by at most that much (measurement slack included)."""
    f = _Facts(ledger, history)
    return [*_acknowledged(f), _overlapping(f, overlap_window_ms),
            _verdict("stale_finishes_accepted", sorted(set(_stale_finish_events(history) + _stale_attempt_rows(f)))),
            _stale_checkpoints(f), _failed_without_handler_error(f), _duplicates(history), _untraced(f),
            _attempt_numbers_reused(f), _started_before_due(f, due_slack_ms), _schedule_fires_missing(f),
            *_harness(ledger)]


def _acknowledged(f: _Facts) -> list[Verdict]:
    """Acknowledged submits: in PostgreSQL, and finished."""
    acked = sorted(set(f.ledger.acked))
    runs, attempts = f.runs, f.attempts
    return [_verdict("acknowledged_submits_lost", [f"run {i}: acknowledged, no row" for i in acked if i not in runs]),
            _verdict("acknowledged_runs_unfinished",
                     [f"run {i}: {runs[i].status} at the end, attempts {_attempts(attempts[i])}" for i in acked
                      if i in runs and runs[i].status not in TERMINAL])]


def _overlapping(f: _Facts, overlap_window_ms: int) -> Verdict:
    """Overlapping executions of one run (distinct tokens), beyond the window."""
    over: list[str] = []
    inside = 0
    for rid, es in sorted(f.execs.items()):
        es = sorted(es, key=lambda e: (e.started_ms, e.token))
        for i, x in enumerate(es):
            for y in es[i + 1:]:
                if y.token == x.token and y.attempt == x.attempt:
                    continue
                ov = min(x.last_ms, y.last_ms) - max(x.started_ms, y.started_ms)
                if ov <= 0:
                    continue
                if ov > overlap_window_ms:
                    t0 = f.ledger.t0_ms
                    when = f" from +{(max(x.started_ms, y.started_ms) - t0) / 1000:.1f}s" if t0 else ""
                    over.append(f"run {rid}: attempt {x.attempt} (token {x.token}, {x.worker_id or x.pid}) and attempt "
                                f"{y.attempt} (token {y.token}, {y.worker_id or y.pid}) overlap {ov} ms{when}")
                else:
                    inside += 1
    return _verdict("overlapping_executions", over,
                    f"{inside} overlaps within the {overlap_window_ms} ms window" if inside else "")


def _stale_finish_events(history: History) -> list[str]:
    """Finishes Fencepost accepted from an execution a newer claim had superseded (its events)."""
    stale: list[str] = []
    by_run_events: dict[int, list[EventRow]] = defaultdict(list)
    for ev in history.events:
        by_run_events[ev.run_id].append(ev)
    for rid, evs in sorted(by_run_events.items()):
        claimed = 0
        for ev in sorted(evs, key=lambda e: (e.version if e.version is not None else -1, e.id)):
            if ev.type == "claimed" and ev.attempt is not None:
                claimed = max(claimed, ev.attempt)
            elif ev.type in FINISH_EVENTS and ev.attempt is not None and ev.attempt < claimed:
                stale.append(f"run {rid}: {ev.type} of attempt {ev.attempt} applied at version {ev.version}, "
                             f"after attempt {claimed} was claimed")
    return stale


def _stale_attempt_rows(f: _Facts) -> list[str]:
    """The same from the attempt columns: an outcome applied after a newer attempt of the run was
    claimed, two successes, a success with a later claim."""
    stale: list[str] = []
    for rid, rows in sorted(f.attempts.items()):
        for a in rows:
            if a.outcome in ACCEPTED_OUTCOMES and a.finished_ms is not None:
                stale += [f"run {rid}: attempt {a.attempt} closed {a.outcome} {a.finished_ms - b.started_ms} ms after "
                          f"attempt {b.attempt} was claimed" for b in rows
                          if b.attempt > a.attempt and b.token > a.token and b.outcome != "unknown"
                          and b.started_ms is not None and b.started_ms < a.finished_ms]
        wins = [a for a in rows if a.outcome == "succeeded"]
        if len(wins) > 1:
            stale.append(f"run {rid}: {len(wins)} attempts succeeded ({', '.join(str(a.attempt) for a in wins)})")
        for a in rows:
            later = [b for b in rows if b.attempt > a.attempt and b.token > 0 and b.outcome != "unknown"]
            if a.outcome == "succeeded" and later:
                stale.append(f"run {rid}: attempt {a.attempt} succeeded though attempt {later[0].attempt} was "
                             "claimed after it")
    return stale


def _stale_checkpoints(f: _Facts) -> Verdict:
    """Checkpoints Fencepost accepted from a superseded execution: judged on the versions and
    tokens Fencepost itself returned and issued."""
    cps: list[str] = []
    for rid, es in sorted(f.execs.items()):
        writes = sorted((c.version, e.token, e.attempt) for e in es for c in e.checkpoints)
        for (v1, t1, a1), (v2, t2, a2) in pairwise(writes):
            if t2 < t1:
                cps.append(f"run {rid}: checkpoint v{v2} of attempt {a2} (token {t2}) accepted after v{v1} of "
                           f"attempt {a1} (token {t1})")
        for newer in es:
            if newer.attempt <= 1:
                continue
            for older in es:
                if older.token < newer.token:
                    cps += [f"run {rid}: checkpoint v{c.version} of attempt {older.attempt} (token {older.token}) "
                            f"accepted after attempt {newer.attempt} (token {newer.token}) started from "
                            f"v{newer.resumed_from}" for c in older.checkpoints if c.version > newer.resumed_from]
    return _verdict("stale_checkpoints_accepted", sorted(set(cps)))


def _failed_without_handler_error(f: _Facts) -> Verdict:
    """Runs FAILED (or TIMED_OUT) although no handler of theirs failed."""
    raised = {(e.run_id, e.attempt) for e in f.ledger.executions if e.raised}
    nf: list[str] = []
    for r in f.history.runs:
        if r.status not in DEAD:
            continue
        handler_failed = any(a.outcome in HANDLER_OUTCOMES and (r.id, a.attempt) in raised for a in f.attempts[r.id])
        if not handler_failed:
            nf.append(f"run {r.id}: {r.status}, attempts {_attempts(f.attempts[r.id])}")
    return _verdict("failed_without_handler_error", nf)


def _duplicates(history: History) -> Verdict:
    """Duplicate history: one transition recorded twice, one attempt with two rows."""
    dup: list[str] = []
    seen: dict[tuple[int, str, int, int | None], list[EventRow]] = defaultdict(list)
    for ev in history.events:
        if ev.version is not None:
            seen[(ev.run_id, ev.type, ev.version, ev.attempt)].append(ev)
    for k, evs in sorted(seen.items()):
        if len(evs) > 1:
            streamed = sum(1 for ev in evs if ev.stream_id is not None)
            dup.append(f"run {k[0]}: {k[1]} of attempt {k[3]} at version {k[2]} recorded {len(evs)} times "
                       f"({streamed} from the stream, {len(evs) - streamed} written directly)")
    rows_seen: dict[tuple[int, int], int] = defaultdict(int)
    for a in history.attempts:
        rows_seen[(a.run_id, a.attempt)] += 1
    dup += [f"run {k[0]}: attempt {k[1]} has {n} rows" for k, n in sorted(rows_seen.items()) if n > 1]
    return _verdict("duplicate_events", dup)


def _untraced(f: _Facts) -> Verdict:
    """Every execution has its attempt row (its number and token, or an 'unknown' row of its number)."""
    untraced: list[str] = []
    rows_by = {(a.run_id, a.attempt): a for a in f.history.attempts}
    for e in sorted(f.ledger.executions, key=lambda e: (e.run_id, e.attempt)):
        row = rows_by.get((e.run_id, e.attempt))
        if row is None:
            untraced.append(f"run {e.run_id}: attempt {e.attempt} (token {e.token}) has no attempt row")
        elif row.outcome != "unknown" and row.token != e.token:
            untraced.append(f"run {e.run_id}: attempt {e.attempt} ran with token {e.token}, its row has {row.token}")
    return _verdict("untraced_executions", untraced)


def _attempt_numbers_reused(f: _Facts) -> Verdict:
    reused: list[str] = []
    for rid, es in sorted(f.execs.items()):
        tokens: dict[int, set[int]] = defaultdict(set)
        for e in es:
            tokens[e.attempt].add(e.token)
        reused += [f"run {rid}: attempt {n} ran with tokens {sorted(t)}" for n, t in sorted(tokens.items()) if len(t) > 1]
    return _verdict("attempt_numbers_reused", reused)


def _started_before_due(f: _Facts, due_slack_ms: int) -> Verdict:
    early = []
    for rid, due in sorted(f.ledger.due.items()):
        first = min(f.execs.get(rid, []), key=lambda e: e.started_ms, default=None)
        if first is not None and first.started_ms < due - due_slack_ms:
            early.append(f"run {rid}: attempt {first.attempt} started {due - first.started_ms} ms before due on "
                         f"{first.worker_id or first.pid}")
    return _verdict("started_before_due", early, f"slack {due_slack_ms} ms")


def _schedule_fires_missing(f: _Facts) -> Verdict:
    fires: dict[int, set[int]] = defaultdict(set)
    for r in f.history.runs:
        if r.schedule_id is not None and r.fire_ms is not None:
            fires[r.schedule_id].add(r.fire_ms)
    missing: list[str] = []
    for sp in f.ledger.schedules:
        got = {round((fire - sp.first_ms) / sp.interval_ms) for fire in fires.get(sp.schedule_id, set())}
        n = max(0, (sp.until_ms - sp.first_ms) // sp.interval_ms + 1)
        missing += [f"schedule {sp.schedule_id}: fire at +{i * sp.interval_ms} ms has no run" for i in range(n)
                    if i not in got]
    return _verdict("schedule_fires_missing", missing)


def _harness(ledger: Ledger) -> list[Verdict]:
    """What the harness itself saw: children alive after their worker, faults not recovered, its errors."""
    return [_verdict("children_outlived_worker", list(ledger.orphans)),
            _verdict("faults_not_recovered", [f"{r.kind} at {r.at_s:.1f}s: {r.measures} not within the limit"
                                              for r in ledger.recoveries
                                              if r.seconds is None and not r.skipped and not r.error]),
            _verdict("harness_errors", [*ledger.harness_errors,
                                        *(f"{r.kind} at {r.at_s:.1f}s: {r.error}" for r in ledger.recoveries
                                          if r.error)])]


class LedgerRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row the jobs wrote (see sql/queries_dev.sql chaos_ledger_write)."""

    run_id: int
    attempt: int
    token: int
    worker_id: str
    pid: int
    model: str
    kind: str
    """start, effect (before its checkpoint), step (the checkpoint accepted), end, raised, refused, stopped."""
    cp_version: int | None
    at_ms: int


def executions_from_rows(rows: list[LedgerRow]) -> list[Execution]:
    """Fold the jobs' ledger rows into one Execution per (run, attempt, token)."""
    acc: dict[tuple[int, int, int], dict[str, object]] = {}
    for r in sorted(rows, key=lambda r: r.at_ms):
        k = (r.run_id, r.attempt, r.token)
        e = acc.get(k)
        if e is None:
            e = acc[k] = {"run_id": r.run_id, "attempt": r.attempt, "token": r.token, "worker_id": r.worker_id,
                          "pid": r.pid, "model": r.model, "started_ms": r.at_ms, "last_ms": r.at_ms, "ended": False,
                          "raised": False, "resumed_from": 0, "checkpoints": []}
        if r.kind in ("start", "effect", "step", "end"):
            e["last_ms"] = r.at_ms
        if r.kind == "start":
            e["started_ms"] = r.at_ms
            e["resumed_from"] = r.cp_version or 0
        elif r.kind == "step" and r.cp_version is not None:
            cp = e["checkpoints"]
            assert isinstance(cp, list)
            cp.append(CheckpointWrite(version=r.cp_version, at_ms=r.at_ms))
        elif r.kind in ("end", "stopped", "refused"):
            e["ended"] = True
        elif r.kind == "raised":
            e["raised"] = e["ended"] = True
    out = []
    for e in acc.values():
        e["checkpoints"] = tuple(e["checkpoints"])  # type: ignore[arg-type]
        out.append(msgspec.convert(e, Execution))
    return out
