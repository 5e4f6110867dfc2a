"""The API's common steps and helpers: a route's declaration (RouteSpec), its request context (Ctx),
the wrapper every endpoint runs in (`wrap`: authenticate, check the role, count the request against the
token's rate limit, read and decode the body, act with a Client whose actor names the token), and the
readers shared by the resource modules (routes_runs, routes_flows, routes_fleet, routes_ops)."""

from __future__ import annotations

import copy
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from fencepost.api import schemas as S
from fencepost.api.auth import Principal
from fencepost.api.metrics import LATENCY, REFUSED, REQUESTS
from fencepost.api.problems import (
    BadRequest,
    TooLarge,
    problem_response,
)
from fencepost.client import Client
from fencepost.core import cursors, validate
from fencepost.core.errors import InvalidInput, UnknownRun
from fencepost.core.keys import valid_queue_name
from fencepost.core.models import Submit, decode_result
from fencepost.core.states import Status
from fencepost.core.views import Run, overlay

log = logging.getLogger("fencepost.api")


_UTC = UTC


_enc = msgspec.json.Encoder()


_BIGINT = 2**63 - 1


READ = ("operator", "admin")


ANY = ("producer", "operator", "admin")


@dataclass
class RouteSpec:
    method: str
    path: str
    fn: Callable[[Ctx], Awaitable[Any]]
    summary: str
    roles: tuple[str, ...] = ANY
    body: type | None = None
    response: Any = None
    status: int = 200
    params: list[tuple[str, str, Any, str]] = field(default_factory=list)
    """Query parameters: (name, json type, default, description)."""
    tag: str = "runs"
    auth: bool = True


class Ctx:
    """One request: the caller, a Client acting as the caller, the decoded body."""

    def __init__(self, request: Request, principal: Principal | None, client: Client, body: Any) -> None:
        self.request, self.principal, self.client, self.body = request, principal, client, body

    @property
    def p(self) -> Principal:
        assert self.principal is not None
        return self.principal

    @property
    def api(self) -> Any:
        return self.request.app.state.api

    # -- path and query parameters ------------------------------------------------------------
    def run_id(self) -> int:
        raw = self.request.path_params["run_id"]
        if not _digits(raw) or not 0 < int(raw) <= _BIGINT:
            raise InvalidInput(f"run id must be a positive integer, not {raw!r}", field="run_id")
        return int(raw)

    def path(self, name: str) -> str:
        value: str = self.request.path_params[name]  # every route's path parameter is a plain {name}: text
        return value

    def q(self, name: str, default: str | None = None) -> str | None:
        v = self.request.query_params.get(name)
        return default if v in (None, "") else v

    def q_int(self, name: str, default: int, lo: int, hi: int) -> int:
        raw = self.request.query_params.get(name)
        if raw in (None, ""):
            return default
        digits = raw[1:] if raw[:1] == "-" else raw
        if not (digits.isascii() and digits.isdigit()):  # int() also takes "1_0", " 5 " and other scripts' digits
            raise InvalidInput(f"{name} must be an integer, not {raw!r}", field=name)
        v = int(raw)
        if not lo <= v <= hi:
            raise InvalidInput(f"{name} must be between {lo} and {hi}, not {v}", field=name)
        return v

    def q_time(self, name: str) -> datetime | None:
        raw = self.q(name)
        if raw is None:
            return None
        try:
            t = datetime.fromisoformat(raw)
        except ValueError:
            raise InvalidInput(f"{name} must be an ISO 8601 time, not {raw!r}", field=name) from None
        return t if t.tzinfo else t.replace(tzinfo=_UTC)

    def q_status(self) -> str | None:
        s = self.q("status")
        if s is None:
            return None
        s = s.upper()
        if s not in Status.__members__:
            raise InvalidInput(f"unknown status {s!r}; one of {', '.join(Status)}", field="status")
        return s

    def q_queue(self) -> str | None:
        """An optional queue filter; a scoped token may only name one of its queues."""
        q = self.q("queue")
        if q is not None:
            if not valid_queue_name(q):
                raise InvalidInput(f"queue must be a queue name (letters, digits, '_', '.', '-', 1-64), not {q[:70]!r}",
                                   field="queue")
            self.p.require_queue(q)
        return q


# -- helpers -----------------------------------------------------------------------------------
def _digits(raw: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '١' and '²', which int() reads or refuses."""
    return raw.isascii() and raw.isdigit()


def _valid_queue(name: str, field: str = "queue") -> str:
    """A queue named in a path: a valid name (a%20b is refused, not looked up)."""
    if not valid_queue_name(name):
        raise InvalidInput(f"queue must be a queue name (letters, digits, '_', '.', '-', 1-64), not {name[:70]!r}",
                           field=field)
    return name


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_enc.encode(obj), status_code=status, media_type="application/json")


def _row(row: Any, typ: type) -> Any:
    """A row (a record gateway row Struct, a Record or a dict) as an API schema; uuids as text."""
    items = msgspec.structs.asdict(row) if isinstance(row, msgspec.Struct) else dict(row)
    d = {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in items.items()}
    return msgspec.convert(d, typ)


async def _run_for(ctx: Ctx, run_id: int, *, act: bool = False) -> dict[str, Any]:
    """The run, if the caller may see it (and, with act, command it)."""
    p = ctx.p
    if act and p.role == "producer":
        p.require(*READ)
    run = dict(await ctx.client.get(run_id))  # the record as a dict: _live overlays it
    if p.role == "producer":
        row = await ctx.client.stores.db.row("api_submitted_by", run_id)
        actor = (row.actor if row else None) or ""
        if actor != p.owner and not actor.startswith(p.owner + "@"):
            raise UnknownRun(run_id)  # a producer sees only its own runs; another's is as good as missing
    if not p.in_scope(run["queue"]):
        raise UnknownRun(run_id)  # the same answer as a missing run: a scope does not reveal what exists
    return run


async def _live(ctx: Ctx, run: dict[str, Any]) -> dict[str, Any]:
    """The run (a record as a dict, `_run_for`) with its result decoded and the hot state Redis holds
    when it is newer than what PostgreSQL recorded, by the one overlay rule (fencepost.core.views.overlay);
    `recorded_status` keeps what PostgreSQL says."""
    stores = ctx.client.stores
    hot = (await stores.scripts.peek(stores.keys(run["queue"]), [run["id"]]))[0]
    record = Run(**{k: v for k, v in run.items() if k in _RUN_FIELDS}, result=decode_result(run.get("result")))
    return {**run, **msgspec.structs.asdict(overlay(record, hot))}


_RUN_FIELDS = frozenset(Run.__struct_fields__) - {"result"}
"""The record's columns a Run (the overlay's input) takes; result is decoded on the way."""


async def _queue_of(client: Client, handler: str, queue: str | None) -> str:
    if queue is not None:
        return queue
    await client._load_definitions({handler})
    return client._defs[handler].queue


def _canonical(value: Any) -> Any:
    """JSON as a canonical form: object keys sorted at every level, so the same arguments in another key
    order are the same request (the idempotency fingerprint hashes the encoded arguments)."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _idem_key(body_key: str | None, header_key: str | None) -> str | None:
    """The request's idempotency key: the body's or the header's; both given and different is a mistake."""
    if body_key is not None and header_key is not None and body_key != header_key:
        exc = InvalidInput(f"the body's idempotency_key {body_key[:60]!r} and the Idempotency-Key header "
                           f"{header_key[:60]!r} disagree; send one, or the same in both", field="idempotency_key")
        exc.fields = ["idempotency_key", "Idempotency-Key"]  # type: ignore[attr-defined]
        raise exc
    return body_key if body_key is not None else header_key


def _submit(req: S.SubmitRequest, key: str | None) -> Submit:
    return Submit(handler=req.handler, args=tuple(_canonical(list(req.args))), kwargs=_canonical(dict(req.kwargs)),
                  queue=req.queue, priority=req.priority, run_at=req.run_at, delay=req.delay, timeout=req.timeout,
                  max_retries=req.max_retries, idempotency_key=_idem_key(req.idempotency_key, key), trace=req.trace,
                  tenant=req.tenant, concurrency_key=req.concurrency_key, concurrency_limit=req.concurrency_limit,
                  rate_key=req.rate_key, rate_limit=req.rate_limit)


def _within_batch_limit(ctx: Ctx, size: int) -> None:
    """FENCEPOST_API_MAX_BATCH runs per request, for a submit batch and a batch with callbacks alike."""
    limit = ctx.api.config.max_batch
    if size > limit:
        raise TooLarge(f"a batch may hold at most {limit} runs, not {size}", limit=limit, size=size, field="runs")


def _q_text(ctx: Ctx, name: str) -> str | None:
    """A text filter: printable, at most 200 characters; the error names the parameter."""
    v = ctx.q(name)
    if v is None:
        return None
    try:
        return validate.text("name", v)
    except InvalidInput as exc:
        raise InvalidInput(str(exc).replace("name", name, 1), field=name) from None


def _legacy_cursor(raw: str | None) -> list[Any] | None:
    """The dead letter's first cursors were `<time>,<id>` in clear: still taken (None: not one of those)."""
    if raw is None or "," not in raw:
        return None
    at, _, rid = raw.rpartition(",")
    try:
        t = datetime.fromisoformat(at)
    except ValueError:
        return None
    if not _digits(rid) or not 0 < int(rid) <= _BIGINT:
        return None
    return [t if t.tzinfo else t.replace(tzinfo=_UTC), int(rid)]


def _page(rows: list[Any], limit: int, kind: str, typ: type, extra: dict[str, Any] | None = None,
          convert: Callable[[dict[str, Any]], Any] | None = None) -> Response:
    """A page of a listing; when it is full, X-Next-Cursor is the key of its last row (fencepost.core.cursors):
    sent back as `cursor`, the next page starts right after it."""
    dicts = (msgspec.structs.asdict(r) if isinstance(r, msgspec.Struct) else dict(r) for r in rows)
    items = [convert(d) if convert else _row({**d, **(extra or {})}, typ) for d in dicts]
    headers = {}
    nxt = cursors.after(kind, rows, limit)
    if nxt is not None:
        headers["X-Next-Cursor"] = nxt
    return Response(_enc.encode(items), media_type="application/json", headers=headers)


def _reason_q(ctx: Ctx) -> str:
    """The `reason` query parameter of a DELETE (which has no body)."""
    return validate.text("reason", ctx.q("reason") or "")


OPTIONAL_BODY = {S.CommandRequest, S.WorkflowRetry, S.ConfigCommand}
"""Bodies that may be left out entirely (all their fields have defaults)."""


# -- the common steps --------------------------------------------------------------------------
async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the request body is {declared} bytes, the limit is {limit}", size=int(declared),
                       limit=limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the request body exceeds the limit of {limit} bytes", limit=limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(raw: bytes, typ: type) -> Any:
    if not raw.strip():
        if typ in OPTIONAL_BODY:
            return None
        raise BadRequest("a JSON body is required")
    try:
        return msgspec.json.decode(raw, type=typ)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        path = msg.rpartition(" - at `")[2].rstrip("`") if " - at `" in msg else None
        fld = path.removeprefix("$.").split(".")[0].split("[")[0] if path and path.startswith("$.") else None
        unknown = re.search(r"unknown field `([^`]*)`", msg)
        if unknown and (fld is None or path == "$"):
            fld = unknown.group(1)
        if "matching regex" in msg and path is not None:  # name the character, not the pattern
            why = _pattern_refusal(raw, path)
            if why is not None:
                raise InvalidInput(f"invalid body: {why} - at `{path}`", field=fld) from None
        raise InvalidInput(f"invalid body: {msg}", field=fld) from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body nests too deeply") from None


def _pattern_refusal(raw: bytes, path: str) -> str | None:
    """What is wrong with the text at `path` ($.a.b[0]) of a body a schema pattern refused: the offending
    character and its position (validate.describe_text), instead of the pattern itself."""
    try:
        value: Any = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    steps = re.findall(r"\.([^.\[]+)|\[(\d+)\]", path.removeprefix("$"))
    name = "value"
    for key, index in steps:
        if key and isinstance(value, dict):
            value, name = value.get(key), key
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return None
    if not isinstance(value, str):
        return None
    return validate.describe_text(name, value, label=True)


def _addr(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def wrap(spec: RouteSpec) -> Callable[[Request], Awaitable[Response]]:
    label = re.sub(r"{(\w+)_id}", r"{\1}", spec.path)  # the route template: bounded, never an id itself

    async def endpoint(request: Request) -> Response:
        api = request.app.state.api
        started = time.perf_counter()
        principal: Principal | None = None
        try:
            if spec.auth and not (spec.path == "/metrics" and not api.config.metrics_token):
                principal = await api.tokens.authenticate(request.headers.get("authorization"), _addr(request))
                await api.limiter.hit(principal.id)
                principal.require(*spec.roles)
            body = None
            if spec.body is not None:
                body = _decode(await _read_body(request, api.config.max_body_bytes), spec.body)
            client = copy.copy(api.client)
            client.actor = principal.actor if principal else "api"
            client.idempotency_namespace = principal.owner if principal else None  # keys are per token
            out = await spec.fn(Ctx(request, principal, client, body))
            if client._defs is not api.client._defs:
                api.client._defs = client._defs
            resp = out if isinstance(out, Response) else _json(out, spec.status)
        except (asyncpg.DataError, OverflowError) as exc:  # NUL bytes, values PostgreSQL cannot hold
            resp = problem_response(InvalidInput(f"a value cannot be stored: {exc}"), request.url.path)
        except Exception as exc:
            resp = problem_response(exc, request.url.path)
            if resp.status_code >= 500 and resp.status_code not in (503, 504):
                log.exception("unhandled error on %s %s", spec.method, spec.path, extra={"event": "api_error"})
            elif resp.status_code in (401, 403, 413, 429):
                REFUSED.labels(str(resp.status_code)).inc()
        REQUESTS.labels(label, spec.method, f"{resp.status_code // 100}xx").inc()
        LATENCY.labels(label).observe(time.perf_counter() - started)
        return resp

    endpoint.__name__ = spec.fn.__name__
    return endpoint
