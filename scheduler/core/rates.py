"""Rate limits: at most N starts per interval, written `N/interval` ("100/1s", "5/250ms", "60/m").

One parser for the decorator (`rate_limit=`), the client, the CLI (`fencepost queue rate`) and the
API, so every face refuses the same values with the same field name. Stored everywhere (PostgreSQL,
Redis, the run hash) in the canonical form `N/ms` that lua/includes/common.lua (parse_rate) reads.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from fencepost.core.errors import InvalidInput

__all__ = ["MAX_COUNT", "MAX_MS", "PATTERN", "Rate", "parse", "parse_stored"]

MAX_COUNT = 1_000_000
"""At most this many starts per interval (a window holds one member per start)."""
MAX_MS = 86_400_000
"""Intervals from 1 ms to one day."""
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# ASCII digits and spaces only (\d and \s take other scripts' digits and control characters); \Z, as `$`
# also matches before a final newline
_RE = re.compile(r"^ *([0-9]{1,7}) */ *([0-9]{0,9}(?:\.[0-9]{1,6})?) *(ms|s|m|h|d) *\Z")
PATTERN = r"^ *[0-9]{1,7} */ *[0-9]{0,9}(\.[0-9]{1,6})? *(ms|s|m|h|d) *$"
"""The spelling as a regular expression, for API schemas (the parser re-checks the ranges)."""
_STORED = re.compile(r"^([1-9][0-9]{0,6})/([1-9][0-9]{0,7})\Z")


class Rate(msgspec.Struct, frozen=True):
    """N starts per `ms` milliseconds."""

    n: int
    ms: int

    @property
    def stored(self) -> str:
        """The canonical `N/ms` form the stores keep."""
        return f"{self.n}/{self.ms}"

    def __str__(self) -> str:
        for unit in ("d", "h", "m", "s"):
            if self.ms % _UNITS[unit] == 0:
                return f"{self.n}/{self.ms // _UNITS[unit]}{unit}"
        return f"{self.n}/{self.ms}ms"


def parse(field: str, value: Any) -> Rate:
    """`N/interval` (N from 1 to 1,000,000; the interval a number with a unit ms, s, m, h or d, the
    number 1 when left out, from 1 ms to 1 day) as a Rate, or InvalidInput naming `field`."""
    if isinstance(value, Rate):
        value = str(value)
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be text like '100/1s', not {value!r}", field=field)
    m = _RE.match(value)
    if m is None:
        raise InvalidInput(f"{field} must look like '100/1s' or '5/250ms' (N starts per interval; units ms, s, "
                           f"m, h, d), not {value[:60]!r}", field=field)
    n = int(m.group(1))
    amount = float(m.group(2)) if m.group(2) else 1.0
    ms_f = amount * _UNITS[m.group(3)]
    if not 1 <= n <= MAX_COUNT:
        raise InvalidInput(f"{field}: the count must be from 1 to {MAX_COUNT}, not {n}", field=field)
    if not math.isfinite(ms_f) or ms_f != int(ms_f) or not 1 <= ms_f <= MAX_MS:
        raise InvalidInput(f"{field}: the interval must be a whole number of ms from 1 ms to 1 day, "
                           f"not {value.strip()!r}", field=field)
    return Rate(n, int(ms_f))


def parse_stored(value: str | None) -> Rate | None:
    """A stored `N/ms` back as a Rate (None for none or a value no version wrote)."""
    m = _STORED.match(value or "")
    if m is None or int(m.group(2)) > MAX_MS:
        return None
    return Rate(int(m.group(1)), int(m.group(2)))
