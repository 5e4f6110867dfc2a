"""Test doubles for the chaos checker: a clean seeded (ledger, history) pair of runs that ran once
each, and one function per kind of violation that plants it, so each check is seen to fail."""

from __future__ import annotations

import random

import msgspec

from fencepost.dev import chaos_check as cc

TOKEN0 = 1 << 40


def clean(seed: int = 5, runs: int = 40) -> tuple[cc.Ledger, cc.History]:
    """RUNS runs, each claimed once, checkpointed and SUCCEEDED, with consistent history."""
    rng = random.Random(seed)
    ledger, history = cc.Ledger(), cc.History()
    t = 1_700_000_000_000
    for i in range(1, runs + 1):
        token = TOKEN0 + i
        start = t + rng.randint(0, 50_000)
        end = start + rng.randint(50, 900)
        ledger.acked.append(i)
        ledger.executions.append(cc.Execution(run_id=i, attempt=1, token=token, worker_id="w1", pid=10,
                                              started_ms=start, last_ms=end, ended=True,
                                              checkpoints=(cc.CheckpointWrite(version=1, at_ms=end - 1),)))
        history.runs.append(cc.RunRow(id=i, status="SUCCEEDED", run_at_ms=start - 5))
        history.attempts.append(cc.AttemptRow(run_id=i, attempt=1, token=token, outcome="succeeded", worker_id="w1",
                                              started_ms=start, finished_ms=end + 5))
        history.events += [
            cc.EventRow(id=3 * i, run_id=i, type="submitted", version=1, to_status="PENDING"),
            cc.EventRow(id=3 * i + 1, run_id=i, type="claimed", version=2, attempt=1, token=token, to_status="RUNNING"),
            cc.EventRow(id=3 * i + 2, run_id=i, type="succeeded", version=3, attempt=1, token=token,
                        to_status="SUCCEEDED"),
        ]
    return ledger, history


def pick(ledger: cc.Ledger, seed: int) -> cc.Execution:
    return random.Random(seed).choice(ledger.executions)


def second_execution(ledger: cc.Ledger, history: cc.History, e: cc.Execution, *, start_after_ms: int,
                     resumed_from: int = 1) -> cc.Execution:
    """A legitimate re-execution of e's run (attempt 2, a newer token), recorded as such."""
    b = cc.Execution(run_id=e.run_id, attempt=2, token=e.token + 1000, worker_id="w2", pid=11,
                     started_ms=e.last_ms + start_after_ms, last_ms=e.last_ms + start_after_ms + 100, ended=True,
                     resumed_from=resumed_from,
                     checkpoints=(cc.CheckpointWrite(version=resumed_from + 1, at_ms=e.last_ms + start_after_ms + 90),))
    ledger.executions.append(b)
    history.attempts[:] = [msgspec.structs.replace(a, outcome="interrupted") if a.run_id == e.run_id else a
                           for a in history.attempts]
    history.attempts.append(cc.AttemptRow(run_id=e.run_id, attempt=2, token=b.token, outcome="succeeded",
                                          started_ms=b.started_ms, finished_ms=b.last_ms + 5))
    history.events[:] = [ev for ev in history.events if not (ev.run_id == e.run_id and ev.type == "succeeded")]
    history.events += [
        cc.EventRow(id=10_000, run_id=e.run_id, type="lease_expired", version=3, attempt=1, to_status="PENDING"),
        cc.EventRow(id=10_001, run_id=e.run_id, type="claimed", version=4, attempt=2, token=b.token, to_status="RUNNING"),
        cc.EventRow(id=10_002, run_id=e.run_id, type="succeeded", version=5, attempt=2, token=b.token,
                    to_status="SUCCEEDED"),
    ]
    return b
