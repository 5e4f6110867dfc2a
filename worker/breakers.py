"""Circuit breakers per declared dependency, shared by every worker through Redis.

A worker asks before starting a run whose handler `depends_on_service`; while the
breaker is open the run waits in RETRY_WAIT (not counted as a failure) instead of
failing. Outcomes are batched: one Lua call per service every `flush_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from fencepost.core import metrics
from fencepost.core.hot import BreakerCheckArgs, BreakerRecordArgs
from fencepost.core.keys import breaker_keys
from fencepost.core.stores import Stores

log = logging.getLogger("fencepost.worker.breakers")

__all__ = ["BreakerPolicy", "Breakers"]

_CODE = {"closed": 0, "half_open": 1, "probe": 1, "open": 2}


@dataclass(frozen=True)
class BreakerPolicy:
    threshold: float = 0.5
    """Failure rate over the window that opens the breaker."""
    min_calls: int = 20
    window_ms: int = 30_000
    cooldown_ms: int = 30_000
    """How long it stays open before one half-open probe is let through."""
    probe_ms: int = 60_000


class Breakers:
    def __init__(self, stores: Stores, policy: BreakerPolicy | None = None, *, cache_s: float = 0.2,
                 flush_s: float = 0.1) -> None:
        self.stores = stores
        self.policy = policy or BreakerPolicy()
        self.cache_s, self.flush_s = cache_s, flush_s
        self._seen: dict[str, tuple[str, float, float]] = {}  # service -> (mode, opened_until ms, checked at)
        self._counts: dict[str, list[int]] = {}  # service -> [successes, failures]
        self._probes: dict[str, str] = {}

    def _keys(self, service: str) -> list[str]:
        return breaker_keys(self.stores.settings.prefix, service)

    def _server_s(self) -> float:
        """The Redis server's clock (s) as this process estimates it (a breaker's `until` is on it);
        this host's clock only before the first estimate."""
        ms = self.stores.scripts.clock.now_ms()
        return time.time() if ms is None else ms / 1000

    async def check(self, service: str) -> tuple[bool, float | None, bool]:
        """(may start, seconds to wait if not, is the half-open probe)."""
        seen = self._seen.get(service)
        if seen is not None and time.monotonic() - seen[2] < self.cache_s:
            mode, until, _ = seen
            if mode == "closed":
                return True, None, False
            now = self._server_s()
            if mode == "open" and now * 1000 < until:
                return False, until / 1000 - now, False
        state = await self.stores.scripts.breaker_check(self._keys(service), BreakerCheckArgs(self.policy.probe_ms))
        mode, until = state.mode, float(state.until)
        self._remember(service, mode, until)
        if mode == "open":
            return False, max(until / 1000 - self._server_s(), 0.05), False
        return True, None, mode == "probe"

    def record(self, service: str, ok: bool, probe: bool) -> None:
        if probe:
            self._probes[service] = "ok" if ok else "fail"
        c = self._counts.setdefault(service, [0, 0])
        c[0 if ok else 1] += 1

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_s)
            try:
                await self.flush()
            except Exception as exc:
                log.warning("breaker flush failed: %s", exc)

    async def flush(self) -> None:
        """Send the counts taken since the last flush, one call per service. A service whose call
        fails (Redis away) keeps its counts, merged with those recorded meanwhile, for the next flush."""
        counts, self._counts = self._counts, {}
        probes, self._probes = self._probes, {}
        p = self.policy
        try:
            for service in sorted(set(counts) | set(probes)):
                ok, bad = counts.get(service, [0, 0])
                state = await self.stores.scripts.breaker_record(
                    self._keys(service), BreakerRecordArgs(ok, bad, probes.get(service, ""),
                                                           p.threshold, p.min_calls, p.window_ms, p.cooldown_ms))
                counts.pop(service, None)
                probes.pop(service, None)
                self._flushed(service, state.mode, float(state.until))
        finally:
            for service, (ok, bad) in counts.items():  # not sent: back in, with what came meanwhile
                c = self._counts.setdefault(service, [0, 0])
                c[0] += ok
                c[1] += bad
            for service, verdict in probes.items():
                self._probes.setdefault(service, verdict)

    def _flushed(self, service: str, mode: str, until: float) -> None:
        previous = self._seen.get(service, ("closed", 0, 0))[0]
        self._remember(service, mode, until)
        if mode != previous:
            log.warning("breaker %s: %s -> %s", service, previous, mode, extra={"event": "breaker_" + mode})

    def _remember(self, service: str, mode: str, until: float) -> None:
        self._seen[service] = (mode, until, time.monotonic())
        metrics.BREAKER.labels(service).set(_CODE.get(mode, 0))
