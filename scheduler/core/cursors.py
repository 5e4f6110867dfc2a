"""Opaque keyset cursors for the listings (issue 24): the sort key of the last row of a page, so the next
page starts strictly after it whatever rows share its time, and whatever is inserted meanwhile.

A cursor is URL-safe base64 (no padding) of the JSON list `[kind, k1, k2, ...]`: `kind` names the listing
and its order (`runs/created_at/desc`, `events`, `audit`...), the rest is the key. The API sends it in
X-Next-Cursor and takes it back as `cursor`; the CLI computes the same from the last row it printed
(`key_of`), so a page's cursor is a pure function of its last row. A cursor that does not decode, or was
made for another listing or order, is an InvalidInput naming the field `cursor` (a 422 over HTTP)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from fencepost.core.errors import InvalidInput

__all__ = ["KINDS", "after", "decode", "encode", "key_of", "run_sort_kind"]

_BIGINT = 2**63 - 1

KINDS: dict[str, tuple[str, ...]] = {
    # listing -> the types of its key: t time, t? time or null, i bigint, s text
    "dead": ("t", "i"), "review": ("t", "i"),
    "events": ("t", "i", "i", "i"),     # at, COALESCE(stream_id, -1), id, COALESCE(run_id, 0): the fleet history
                                        # newest first (an attempt's id is minus its stream id, which two
                                        # queues' streams share: the run id tells their rows apart)
    "run_events": ("t", "i", "i"),      # at, stream id, id: a run's timeline in the order recorded (one run)
    "audit": ("t", "i", "s"),           # at, id, source ('run' before 'config' on equal at and id)
    "schedules": ("s",),                # name
    "workflows": ("t", "s"),            # created_at, id
    "batches": ("t", "s"),              # created_at, id (a UUID): newest first
    **{f"runs/id/{o}": ("i",) for o in ("asc", "desc")},
    **{f"runs/created_at/{o}": ("t", "i") for o in ("asc", "desc")},
    **{f"runs/finished_at/{o}": ("t?", "i") for o in ("asc", "desc")},
    **{f"runs/attempt/{o}": ("i", "i") for o in ("asc", "desc")},
    **{f"runs/handler/{o}": ("s", "i") for o in ("asc", "desc")},
    **{f"runs/status/{o}": ("s", "i") for o in ("asc", "desc")},
}

_FIELDS: dict[str, tuple[str, ...]] = {
    "dead": ("finished_at", "id"), "review": ("finished_at", "id"),
    "events": ("at", "stream_id", "id", "run_id"), "run_events": ("at", "stream_id", "id"),
    "audit": ("at", "id", "source"), "schedules": ("name",), "workflows": ("created_at", "id"),
    "batches": ("created_at", "id"),
}
"""Which columns of a row make its key (a runs kind: its sort column, then id)."""


def run_sort_kind(sort: str, order: str) -> str:
    return f"runs/{sort}/{order}"


def _bad(raw: str, why: str) -> InvalidInput:
    return InvalidInput(f"cursor {raw[:60]!r} is not a cursor of this listing ({why}); send back the X-Next-Cursor "
                        "of the previous page unchanged", field="cursor")


def encode(kind: str, key: Sequence[Any]) -> str:
    types = KINDS[kind]
    if len(key) != len(types):
        raise ValueError(f"a {kind} key has {len(types)} parts, not {len(key)}")
    parts: list[Any] = [kind]
    for t, v in zip(types, key, strict=True):
        if isinstance(v, datetime):
            parts.append(v.isoformat())
        elif t == "s":
            parts.append(str(v))
        else:
            parts.append(v)
    return base64.urlsafe_b64encode(json.dumps(parts, separators=(",", ":")).encode()).decode().rstrip("=")


def decode(kind: str, raw: str | None) -> list[Any] | None:
    """The key a cursor of listing KIND holds (None for no cursor); InvalidInput(field='cursor') otherwise."""
    if raw is None:
        return None
    if len(raw) > 2048:
        raise _bad(raw, "too long")
    try:
        parts = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode())
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _bad(raw, "not base64 of JSON") from None
    types = KINDS[kind]
    if not isinstance(parts, list) or not parts or parts[0] != kind:
        made = parts[0] if isinstance(parts, list) and parts and isinstance(parts[0], str) else "?"
        raise _bad(raw, f"made for {made[:40]!r}, not {kind!r}")
    if kind == "events" and len(parts) == len(types):
        parts.append(-_BIGINT - 1)  # a cursor of the three-part key (before the run id): what it meant then
    if len(parts) != len(types) + 1:
        raise _bad(raw, "wrong length")
    out: list[Any] = []
    for t, v in zip(types, parts[1:], strict=True):
        if t == "t?" and v is None:
            out.append(None)
        elif t in ("t", "t?"):
            if not isinstance(v, str):
                raise _bad(raw, "not a time")
            try:
                at = datetime.fromisoformat(v)
            except ValueError:
                raise _bad(raw, "not a time") from None
            out.append(at if at.tzinfo else at.replace(tzinfo=UTC))
        elif t == "i":
            if type(v) is not int or not -_BIGINT - 1 <= v <= _BIGINT:
                raise _bad(raw, "not an integer")
            out.append(v)
        else:
            if not isinstance(v, str) or len(v) > 1000:
                raise _bad(raw, "not a name")
            out.append(v)
    return out


def _get(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) or hasattr(row, "keys") else getattr(row, name)


def key_of(kind: str, row: Any) -> list[Any]:
    """The key of ROW (a record, a dict or a view) in listing KIND; the cursor of the page it ends."""
    if kind.startswith("runs/"):
        sort = kind.split("/")[1]
        return [_get(row, "id")] if sort == "id" else [_get(row, sort), _get(row, "id")]
    key = [_get(row, f) for f in _FIELDS[kind]]
    if kind in ("events", "run_events") and key[1] is None:
        key[1] = -1  # stream ids are positive: no stream id sorts after every one, as NULLS LAST does
    if kind == "events" and key[3] is None:
        key[3] = 0  # a queue's own event (no run): its id alone is unique
    if kind in ("workflows", "batches"):
        key[1] = str(key[1])
    return key


def after(kind: str, rows: Sequence[Any], limit: int) -> str | None:
    """The cursor of the page after ROWS: only when the page is full (a shorter one is the last)."""
    if not rows or len(rows) < limit:
        return None
    key = key_of(kind, rows[-1])
    if any(v is None and t != "t?" for t, v in zip(KINDS[kind], key, strict=True)):
        return None  # a key part that cannot be compared (a dead run without finished_at): no next page
    return encode(kind, key)
