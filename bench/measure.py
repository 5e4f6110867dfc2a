"""Kernel CPU accounting and small statistics shared by bench/throughput.py and bench/peers/run_peer.py.

Standard library only: the peers' harness runs in its own virtualenv (.venv-bench).

CPU is read from /proc/<pid>/stat (utime + stime), which is what the machine actually spent,
unlike wall-clock rates on two shared, noisy cores. A `CpuMeter` groups processes by role
(worker, recorder, redis, postgres) and polls them from a thread, so a process that exits
inside the window still counts up to its last sample.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

__all__ = [
    "CpuMeter",
    "commandstats_delta",
    "cpu_seconds",
    "descendants",
    "machine_busy_seconds",
    "median",
    "parent_pid",
    "percentile",
    "pg_aux_pids",
    "pg_backend_pids",
    "settle",
    "tree",
]

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return raw[raw.rfind(")") + 2:].split()


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float | None:
    """User + system CPU seconds of `pid` (None once it is gone); with `reaped_children`, plus the
    CPU of children it has already waited for (cutime + cstime)."""
    f = _stat(pid)
    if f is None:
        return None
    ticks = int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
    if reaped_children:
        ticks += int(f[13]) + int(f[14])
    return ticks / _TICK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores, every process: /proc/stat less idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _TICK  # user..steal, less idle and iowait


def parent_pid(pid: int) -> int | None:
    f = _stat(pid)
    return int(f[1]) if f else None


_kids_cache: tuple[float, dict[int, list[int]]] = (0.0, {})


def _children_map() -> dict[int, list[int]]:
    """ppid -> child pids, from one scan of /proc (reused for 50 ms: one meter poll asks several times)."""
    global _kids_cache
    now = time.monotonic()
    if now - _kids_cache[0] < 0.05:
        return _kids_cache[1]
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = parent_pid(int(name))
            if ppid is not None:
                kids.setdefault(ppid, []).append(int(name))
    _kids_cache = (now, kids)
    return kids


def descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    kids = _children_map() if kids is None else kids
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def tree(pid: int) -> Callable[[], list[int]]:
    """A pid source: `pid` and every process below it (e.g. a worker's process pool)."""
    return lambda: [pid, *descendants(pid)]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pg_backend_pids(postmaster: int, database: str, exclude: Iterable[int] = ()) -> Callable[[], list[int]]:
    """A pid source: the PostgreSQL backends (and autovacuum workers) of one database, found by the
    process title `postgres: <cluster>: <user> <database> <client> <state>`; `exclude` drops the
    harness's own connections (its completion polls are not the system's work)."""
    skip = set(exclude)

    def pids() -> list[int]:
        out = []
        for p in _children_map().get(postmaster, []):
            if p in skip:
                continue
            words = _cmdline(p).split()
            if database in words[3:]:
                out.append(p)
        return out

    return pids


_AUX = ("checkpointer", "background writer", "walwriter", "autovacuum launcher", "stats collector")


def pg_aux_pids(postmaster: int) -> Callable[[], list[int]]:
    """A pid source: the postmaster and its shared helpers (WAL writer, checkpointer, background
    writer, autovacuum launcher). Shared with every database on the server, so meter them with a
    baseline."""

    def pids() -> list[int]:
        out = [postmaster]
        for p in _children_map().get(postmaster, []):
            title = _cmdline(p)
            if any(a in title for a in _AUX):
                out.append(p)
        return out

    return pids


class CpuMeter:
    """CPU seconds spent per role between `start()` and `stop()`.

    A pid first seen after `start()` counts from zero (it was born inside the window); a pid that
    disappears keeps its last sample. `baseline(seconds)` first measures the idle rate of the roles
    named in `shared` (processes other people use too: Redis, the PostgreSQL helpers) so `stop()`
    can subtract rate x window from them (the lower of the rates before and after the window).
    """

    def __init__(self, roles: dict[str, Callable[[], Sequence[int]]], *, shared: Iterable[str] = (),
                 interval: float = 0.25) -> None:
        self.roles, self.shared, self.interval = roles, set(shared), interval
        self.base: dict[str, dict[int, float]] = {}
        self.last: dict[str, dict[int, float]] = {}
        self.idle_before: dict[str, float] = {}
        self.idle_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = self.t1 = 0.0

    def _sample(self, role: str, first: bool) -> None:
        base, last = self.base[role], self.last[role]
        for pid in self.roles[role]():
            cpu = cpu_seconds(pid)
            if cpu is None:
                continue
            if pid not in base:
                base[pid] = cpu if first else 0.0
            last[pid] = cpu

    def _total(self, role: str) -> float:
        return sum(self.last[role][p] - self.base[role][p] for p in self.last[role])

    def baseline(self, seconds: float) -> None:
        """Idle CPU rate of the shared roles, measured now over `seconds` (call before `start()`)."""
        self.idle_before = self._idle_rates(seconds)
        self.idle_s = seconds

    def _idle_rates(self, seconds: float) -> dict[str, float]:
        if not self.shared:
            return {}
        before = {r: {p: cpu_seconds(p) or 0.0 for p in self.roles[r]()} for r in self.shared}
        time.sleep(seconds)
        rates = {}
        for r in self.shared:
            after = {p: cpu_seconds(p) for p in self.roles[r]()}
            rates[r] = sum(max(0.0, (c or 0.0) - before[r].get(p, c or 0.0)) for p, c in after.items()) / seconds
        return rates

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.machine0 = machine_busy_seconds()
        for role in self.roles:
            self.base[role], self.last[role] = {}, {}
            self._sample(role, first=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for role in self.roles:
                self._sample(role, first=False)

    def stop(self) -> dict[str, float]:
        """CPU seconds per role over the window, 'wall', and 'machine' (the whole machine's busy CPU
        seconds over the window, other people's work included: a cross-check and an upper bound).

        The shared roles are then measured idle again for as long as `baseline()` did, and the lower
        of the two idle rates is subtracted: a burst of someone else's load during one of them must
        not make the system under test look cheaper than it is."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        for role in self.roles:
            self._sample(role, first=False)
        self.t1 = time.perf_counter()
        machine = machine_busy_seconds() - self.machine0
        wall = self.t1 - self.t0
        after = self._idle_rates(self.idle_s) if self.idle_before else {}
        out = {}
        for role in self.roles:
            raw = self._total(role)
            idle = min(self.idle_before[role], after[role]) if role in self.idle_before else 0.0
            out[role] = max(0.0, raw - idle * wall)
            if role in self.idle_before:
                out[role + "_raw"] = raw
                out[role + "_idle_per_s"] = idle
                out[role + "_idle_before_after"] = [self.idle_before[role], after[role]]  # type: ignore[assignment]
        out["wall"] = wall
        out["machine"] = machine
        return out


@contextlib.contextmanager
def one_bench_at_a_time(path: str = "/tmp/fencepost-bench.lock") -> Iterator[None]:
    """Hold a machine-wide lock for a whole benchmark run. Two runs at once would drop each other's
    databases and flush each other's Redis DB, and each would count the other's load."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            print(f"waiting for another benchmark run to finish ({path}: {f.read().strip() or '?'})",
                  file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def settle(pids: Callable[[], Sequence[int]], *, quiet_cpu_s: float = 0.02, every: float = 0.5,
           timeout: float = 30.0) -> float:
    """Wait until freshly started processes have finished importing and connecting: their CPU
    grows by less than `quiet_cpu_s` over `every` seconds. Returns the seconds waited."""
    t0 = time.perf_counter()
    prev = sum(cpu_seconds(p) or 0.0 for p in pids())
    while time.perf_counter() - t0 < timeout:
        time.sleep(every)
        now = sum(cpu_seconds(p) or 0.0 for p in pids())
        if now - prev < quiet_cpu_s:
            break
        prev = now
    return time.perf_counter() - t0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def median(values: Iterable[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else float("nan")


def commandstats_delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per-command calls and usec between two `INFO commandstats` replies (as redis-py parses them)."""
    out = {}
    for key, stats in after.items():
        name = key.removeprefix("cmdstat_")
        prev = before.get(key, {"calls": 0, "usec": 0})
        calls, usec = stats["calls"] - prev["calls"], stats["usec"] - prev["usec"]
        if calls > 0:
            out[name] = {"calls": calls, "usec": usec}
    return out
