"""Typed constraints of every value a caller gives Fencepost, declared once.

The client (Submit), the CLI option types, the API schemas (msgspec `Meta` built from
`LIMITS` by `meta`) and schedule definitions all check against this table, so a value the
API refuses is refused by the client and the CLI too, with the same field name and range.
A value that passes here fits every store: finite doubles that PostgreSQL, Redis (Lua
doubles) and `datetime` arithmetic can hold, integers inside PostgreSQL's integer, text
PostgreSQL accepts (no NUL, valid UTF-8) and that is safe to print on a terminal (no
control characters, no escapes, no bidirectional overrides).
"""

from __future__ import annotations

import inspect
import math
import typing
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, Literal

import msgspec

from fencepost.core.errors import InvalidInput

__all__ = [
    "LABEL_PATTERN",
    "LIMITS",
    "PRINTABLE_PATTERN",
    "Limit",
    "check",
    "check_call",
    "describe_params",
    "describe_text",
    "integer",
    "label",
    "meta",
    "number",
    "text",
    "unsafe_at",
    "unsafe_char",
]

Kind = Literal["int", "float", "text", "label"]


class Limit(msgspec.Struct, frozen=True, kw_only=True):
    """One field's constraint. Numbers: `lo`..`hi` (`lo_open`: lo itself excluded).
    Text: `min_len`..`max_len` characters, printable; labels also refuse spaces and braces
    (they become parts of Redis keys and metric labels)."""

    kind: Kind
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    min_len: int = 1
    max_len: int = 0
    doc: str = ""


DAY = 86_400
LIMITS: dict[str, Limit] = {
    "priority": Limit(kind="int", lo=0, hi=255, doc="0 (first) to 255"),
    "max_retries": Limit(kind="int", lo=0, hi=10_000, doc="retries after the first attempt"),
    "concurrency_limit": Limit(kind="int", lo=1, hi=1_000_000, doc="runs of one key leased at once"),
    "timeout": Limit(kind="float", lo=0.001, hi=30 * DAY, doc="seconds, 1 ms to 30 days"),
    "delay": Limit(kind="float", lo=0, hi=3650 * DAY, doc="seconds from now, up to 10 years"),
    "interval_s": Limit(kind="float", lo=1, hi=3650 * DAY, doc="seconds between fires, 1 s to 10 years"),
    "spread_s": Limit(kind="float", lo=0, hi=DAY, doc="seconds, up to a day"),
    "catchup_window_s": Limit(kind="float", lo=0, lo_open=True, hi=366 * DAY, doc="seconds, up to a year"),
    "handler": Limit(kind="text", max_len=200, doc="a registered handler name"),
    "name": Limit(kind="text", max_len=200, doc="a schedule or workflow name"),
    "node": Limit(kind="text", max_len=200, doc="a workflow node's name"),
    "idempotency_key": Limit(kind="text", max_len=200, doc="deduplicates submits"),
    "reason": Limit(kind="text", min_len=0, max_len=1000, doc="recorded in the history"),
    "tenant": Limit(kind="label", max_len=128, doc="who the run is for"),
    "concurrency_key": Limit(kind="label", max_len=128, doc="runs sharing it are limited together"),
    "rate_key": Limit(kind="label", max_len=128, doc="runs sharing it share a rate limit"),
}
"""Field name -> constraint (the names the errors and the API use; docs/validation.md lists them)."""

# Characters refused in text: C0/C1 controls (NUL, ESC, DEL ...), lone surrogates (bytes that were
# not UTF-8), line and paragraph separators, and the invisible format characters that reorder or
# hide text on a terminal (bidi overrides and isolates, zero-width characters, BOM).
_BAD_CATEGORIES = frozenset({"Cc", "Cs", "Cf", "Zl", "Zp"})
_UNSAFE = "\\x00-\\x1f\\x7f-\\x9f\\u00ad\\u061c\\u180e\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u206f\\ufeff\\ufff9-\\ufffb"
PRINTABLE_PATTERN = f"^[^{_UNSAFE}]*$"
LABEL_PATTERN = f"^[^\\s{{}}{_UNSAFE}]*$"
"""The same rules as regular expressions for the API schemas (the client re-checks with the full
Unicode categories, so a character this pattern misses is still refused, with the same 422)."""


def unsafe_char(value: str) -> str | None:
    """The first character of `value` that may not be stored or printed, or None."""
    at = unsafe_at(value)
    return None if at is None else value[at]


def unsafe_at(value: str) -> int | None:
    """The index of the first character of `value` that may not be stored or printed, or None."""
    for i, ch in enumerate(value):
        if ch.isprintable() or ch == " ":
            continue
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            return i
    return None


def describe_text(field: str, value: str, *, label: bool = False) -> str | None:
    """Why `value` is refused as the field's text, naming the character and its position (counted from
    1), e.g. "name must not contain control or invisible characters (found U+202E at position 3)"; None
    when its characters are fine (the length is the caller's)."""
    at = unsafe_at(value)
    if at is not None:
        return (f"{field} must not contain control or invisible characters "
                f"(found U+{ord(value[at]):04X} at position {at + 1})")
    if label:
        for i, c in enumerate(value):
            if c.isspace() or c in "{}":
                return f"{field} must not contain spaces or braces (found {c!r} at position {i + 1})"
    return None


def _fail(field: str, value: Any, why: str) -> InvalidInput:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return InvalidInput(f"{field} {why}, not {shown}", field=field)


def number(field: str, value: Any) -> float:
    """A finite real number inside the field's range (ints are accepted, bools and strings are not)."""
    lim = LIMITS[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(field, value, "must be a number")
    try:
        f = float(value)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise _fail(field, value, "must be a finite number")
    _range(field, lim, f, value)
    return f


def integer(field: str, value: Any) -> int:
    """A whole number inside the field's range: 1.5, "5" and True are refused, 5.0 is not an int either."""
    lim = LIMITS[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(field, value, "must be a whole number")
    _range(field, lim, value, value)
    return int(value)


def _range(field: str, lim: Limit, v: float, raw: Any) -> None:
    lo, hi = lim.lo, lim.hi
    below = lo is not None and (v <= lo if lim.lo_open else v < lo)
    above = hi is not None and v > hi
    if below or above:
        low = "" if lo is None else (f"above {_n(lo)}" if lim.lo_open else f"at least {_n(lo)}")
        high = "" if hi is None else f"at most {_n(hi)}"
        raise _fail(field, raw, f"must be {' and '.join(p for p in (low, high) if p)}")


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def text(field: str, value: Any) -> str:
    """Printable text of the field's length (no control characters, valid UTF-8)."""
    lim = LIMITS[field]
    if not isinstance(value, str):
        raise _fail(field, value, "must be text")
    if not lim.min_len <= len(value) <= lim.max_len:
        raise _fail(field, value, f"must be {lim.min_len}-{lim.max_len} characters")
    why = describe_text(field, value, label=lim.kind == "label")
    if why is not None:
        raise _fail(field, value, why.removeprefix(f"{field} "))
    return value


def label(field: str, value: Any) -> str:
    """A label (tenant, concurrency key): text without spaces or braces."""
    return text(field, value)


def check(field: str, value: Any) -> Any:
    """Check `value` against the field's constraint, whatever its kind; returns it normalised."""
    kind = LIMITS[field].kind
    if kind == "int":
        return integer(field, value)
    if kind == "float":
        return number(field, value)
    return text(field, value)


def meta(field: str, **extra: Any) -> msgspec.Meta:
    """The msgspec constraint of a field, for API schemas (generated from `LIMITS`, never retyped)."""
    lim = LIMITS[field]
    kw: dict[str, Any] = {"description": lim.doc}
    if lim.kind in ("int", "float"):
        conv = int if lim.kind == "int" else float
        if lim.lo is not None:
            kw["gt" if lim.lo_open else "ge"] = conv(lim.lo)
        if lim.hi is not None:
            kw["le"] = conv(lim.hi)
    else:
        kw["min_length"], kw["max_length"] = lim.min_len, lim.max_len
        kw["pattern"] = LABEL_PATTERN if lim.kind == "label" else PRINTABLE_PATTERN
    kw.update(extra)
    return msgspec.Meta(**kw)


# -- handler signatures, for producers that do not import the handler (the API, `fencepost submit`) ---
_VAR = ("VAR_POSITIONAL", "VAR_KEYWORD")


def describe_params(fn: Callable[..., Any]) -> list[dict[str, Any]] | None:
    """A handler's parameters after ctx as JSON (stored with its declaration in job_definitions): name,
    kind (inspect's), whether required, and the JSON Schema of its annotation (None: unchecked). None
    when the signature cannot be read."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    out = []
    for p in params:
        schema = None
        tp = hints.get(p.name)
        if tp is not None and tp is not Any:
            try:
                schema = msgspec.json.schema(tp)
            except Exception:
                schema = None
        out.append({"name": p.name, "kind": p.kind.name,
                    "required": p.default is inspect.Parameter.empty and p.kind.name not in _VAR, "schema": schema})
    return out


def _fits(value: Any, schema: dict[str, Any] | None) -> bool:
    """Whether a JSON value fits the simple part of a JSON Schema: `type` and `anyOf` (anything else,
    e.g. a `$ref` to a Struct, is left to the worker's conversion)."""
    if not schema:
        return True
    if "anyOf" in schema:
        return any(_fits(value, s) for s in schema["anyOf"])
    t = schema.get("type")
    if t is None or "$ref" in schema:
        return True
    ok = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
          "array": lambda v: isinstance(v, (list, tuple)), "object": lambda v: isinstance(v, dict),
          "null": lambda v: v is None}.get(t)
    return True if ok is None else bool(ok(value))


def check_call(handler: str, params: list[dict[str, Any]], args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Check (args, kwargs) against a stored signature (describe_params) as binding them would: too many
    or missing arguments, an unknown keyword, a value of the wrong JSON type. InvalidInput names the
    parameter (or `args`), before anything is written."""
    positional = [p for p in params if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    var_pos = any(p["kind"] == "VAR_POSITIONAL" for p in params)
    var_kw = any(p["kind"] == "VAR_KEYWORD" for p in params)
    by_name = {p["name"]: p for p in params if p["kind"] not in _VAR}
    if len(args) > len(positional) and not var_pos:
        raise InvalidInput(f"{handler}: takes {len(positional)} positional argument"
                           f"{'' if len(positional) == 1 else 's'} but {len(args)} were given", field="args")
    bound: dict[str, Any] = {p["name"]: v for p, v in zip(positional, args, strict=False)}
    for name, value in kwargs.items():
        p = by_name.get(name)
        if p is None or p["kind"] == "POSITIONAL_ONLY":
            if var_kw:
                continue
            raise InvalidInput(f"{handler}: got an unexpected keyword argument {name!r}", field=name)
        if name in bound:
            raise InvalidInput(f"{handler}: got multiple values for argument {name!r}", field=name)
        bound[name] = value
    for p in params:
        if p["required"] and p["name"] not in bound:
            raise InvalidInput(f"{handler}: missing a required argument: {p['name']!r}", field=p["name"])
    for name, value in bound.items():
        schema = by_name[name].get("schema")
        if schema is not None and not _fits(value, schema):
            want = schema.get("type") or " or ".join(s.get("type", "?") for s in schema.get("anyOf", []))
            raise InvalidInput(f"{handler}: argument {name!r} must be {want}, not {type(value).__name__}",
                               field=name)
