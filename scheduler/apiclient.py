"""The HTTP client of the Fencepost API, on httpx: `AsyncApiClient` implements the operator protocol
(fencepost.core.views.Operator) as `fencepost.Client` does, returning the same typed views, so every
CLI command with an API mode is written once for both (`--api URL --token T`, or FENCEPOST_API_URL /
FENCEPOST_API_TOKEN: operators need no database or Redis credentials).

Problem+json answers become typed errors where the CLI acts on the type (BulkNotConfirmed,
UnknownRun for 404 on a run), and ApiProblem (a FencepostError: one line on stderr) otherwise; an
unreachable API is StoreUnavailable.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
import msgspec

from fencepost.core import cursors
from fencepost.core.errors import (
    BulkNotConfirmed,
    FencepostError,
    StoreUnavailable,
    UnknownQueue,
    WaitTimeout,
)
from fencepost.core.models import Outcome, Submit
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.states import DEAD, RESTING, Status
from fencepost.core.views import (
    Attempt,
    AuditEntry,
    Batch,
    BulkCount,
    BulkResult,
    Checkpoint,
    Event,
    QueueStats,
    RecorderSilence,
    Reply,
    Run,
    RunSummary,
    Schedule,
    ScheduleRun,
    TokenInfo,
    Workflow,
    WorkflowSummary,
    status_filter,
)
from fencepost.core.workers import WorkerInfo
from fencepost.workflows import WORKFLOW_ID_PREFIX, one_workflow

__all__ = ["ApiProblem", "AsyncApiClient"]

T = TypeVar("T")


class ApiProblem(FencepostError):
    """An error answer of the API, with its problem+json body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{body.get('detail') or body.get('title') or 'HTTP ' + str(status)} (HTTP {status})")
        self.status, self.body = status, body


def _parse_times(row: Any) -> Any:
    """ISO times back to datetimes so the CLI's tables print them as before."""
    if isinstance(row, dict):
        out = {}
        for k, v in row.items():
            if (isinstance(v, str) and k.endswith(("_at", "run_at", "_time"))) or k == "at":
                try:
                    v = datetime.fromisoformat(v) if isinstance(v, str) else v
                except ValueError:
                    pass
            out[k] = v
        return out
    if isinstance(row, list):
        return [_parse_times(r) for r in row]
    return row


def _request(method: str, path: str, body: Any, query: dict[str, Any] | None,
             headers: dict[str, str] | None) -> dict[str, Any]:
    """httpx arguments of one call: JSON body, query without None values, extra headers."""
    params = {k: v for k, v in (query or {}).items() if v is not None}
    hdrs = dict(headers or {})
    content = None
    if body is not None:
        content = json.dumps(body, default=str).encode()
        hdrs["Content-Type"] = "application/json"
    return {"method": method, "url": path, "params": params or None, "content": content, "headers": hdrs}


def _answer(resp: httpx.Response) -> Any:
    """The decoded answer, or the typed error an error answer stands for."""
    raw = resp.content
    if resp.status_code >= 400:
        try:
            problem = json.loads(raw)
        except ValueError:
            problem = {"detail": raw.decode(errors="replace")[:200] or resp.reason_phrase}
        if not isinstance(problem, dict):
            problem = {"detail": str(problem)[:200]}
        if resp.status_code == 428 and "matched" in problem:
            refused = BulkNotConfirmed(int(problem["matched"]), int(problem.get("limit") or 0))
            refused.until_id = problem.get("until_id")  # type: ignore[attr-defined]  # the set as counted
            refused.handle = problem.get("handle")  # type: ignore[attr-defined]  # names the counted set
            refused.acting = problem.get("acting", problem["matched"])  # type: ignore[attr-defined]
            raise refused from None
        raise ApiProblem(resp.status_code, problem) from None
    return _parse_times(json.loads(raw)) if raw else None


def _headers(token: str | None) -> dict[str, str]:
    out = {"Accept": "application/json"}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _outcome(run: Run) -> Outcome:
    """Client.wait's Outcome from the API's live run (its error only where the final attempt failed)."""
    failed = run.status in _DEAD or run.reason == "paused_after_error"
    return Outcome(run.id, run.status, run.result, run.last_error if failed else None,
                   run.last_error_class if failed else None,
                   None if run.status == Status.SUCCEEDED else run.reason)


_DEAD = frozenset(s.value for s in DEAD)
_RESTING = frozenset(s.value for s in RESTING)


def _as(cls: type[T], data: Any) -> T:
    """The API's JSON answer as the typed view CLS (times from their ISO text)."""
    return msgspec.convert(data, cls, strict=False)


def _submit_body(req: Submit) -> dict[str, Any]:
    body: dict[str, Any] = {"handler": req.handler, "args": list(req.args), "kwargs": dict(req.kwargs)}
    for f in ("queue", "priority", "run_at", "delay", "timeout", "max_retries", "idempotency_key", "trace", "tenant",
              "concurrency_key", "concurrency_limit", "rate_key", "rate_limit"):
        v = getattr(req, f)
        if v is not None:
            body[f] = v.isoformat() if isinstance(v, datetime) else v
    return body


class AsyncApiClient:
    """The API as an operator protocol (fencepost.core.views.Operator): `async with AsyncApiClient(url, token)`."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, headers=_headers(token), timeout=timeout,
                                       transport=transport)

    async def __aenter__(self) -> AsyncApiClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                      headers: dict[str, str] | None = None) -> Any:
        try:
            resp = await self._http.request(**_request(method, path, body, query, headers))
        except httpx.TransportError as exc:
            raise StoreUnavailable(f"the API at {self.url} is unreachable: {exc}") from None
        return _answer(resp)

    # -- producer ------------------------------------------------------------------------------
    async def submit_many(self, requests: Sequence[Submit]) -> list[int]:
        """Each request as POST /v1/runs (its idempotency key also as the Idempotency-Key header)."""
        ids = []
        for req in requests:
            hdrs = {"Idempotency-Key": req.idempotency_key} if req.idempotency_key else None
            ids.append(int((await self.request("POST", "/v1/runs", _submit_body(req), headers=hdrs))["id"]))
        return ids

    async def wait(self, run_id: int, timeout: float | None = None) -> Outcome:
        """Poll the run until it rests (terminal, PAUSED or STOPPED), as Client.wait does; the API's run
        carries the outcome from Redis before PostgreSQL records it. WaitTimeout past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            run = await self.run(run_id)
            if run.status in _RESTING:
                return _outcome(run)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(run_id, run.status)
            await asyncio.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)

    # -- read ----------------------------------------------------------------------------------
    async def run(self, run_id: int) -> Run:
        return _as(Run, await self.request("GET", f"/v1/runs/{run_id}"))

    async def attempts(self, run_id: int) -> list[Attempt]:
        return _as(list[Attempt], await self.request("GET", f"/v1/runs/{run_id}/attempts"))

    async def checkpoint(self, run_id: int) -> Checkpoint | None:
        got = await self.request("GET", f"/v1/runs/{run_id}/checkpoint")
        return None if got is None else _as(Checkpoint, got)

    async def events(self, run_id: int, *, limit: int | None = None, cursor: str | None = None) -> list[Event]:
        """All of the run's timeline (the API's pages followed), or LIMIT events after CURSOR."""
        path = f"/v1/runs/{run_id}/events"
        if limit is not None or cursor is not None:
            return _as(list[Event], await self.request("GET", path, query={"limit": limit, "cursor": cursor}))
        out: list[Event] = []
        while True:
            page = _as(list[Event], await self.request("GET", path, query={"limit": 1000, "cursor": cursor}))
            out += page
            cursor = cursors.after("run_events", page, 1000)
            if cursor is None:
                return out

    async def fleet_events(self, since: datetime, type_: str | None = None, queue: str | None = None,
                           limit: int = 100, *, cursor: str | None = None) -> list[Event]:
        return _as(list[Event], await self.request("GET", "/v1/events", query={
            "since": since.isoformat(), "type": type_, "queue": queue, "limit": limit, "cursor": cursor}))

    async def list_runs(self, *, queue: str | None = None, status: str | None = None, handler: str | None = None,
                        limit: int = 50, cursor: str | None = None) -> list[RunSummary]:
        return _as(list[RunSummary], await self.request("GET", "/v1/runs", query={
            "queue": queue, "status": status_filter(status), "handler": handler, "limit": limit, "cursor": cursor}))

    async def dead_letter(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]:
        return _as(list[RunSummary], await self.request("GET", "/v1/dead-letter", query={"queue": queue,
                                                                                          "limit": limit}))

    async def review_queue(self, *, queue: str | None = None, limit: int = 50) -> list[RunSummary]:
        return _as(list[RunSummary], await self.request("GET", "/v1/review", query={"queue": queue, "limit": limit}))

    async def queues(self, *, window_s: int = 300) -> list[QueueStats]:
        return _as(list[QueueStats], await self.request("GET", "/v1/queues", query={"window": window_s}))

    async def known_queue(self, queue: str) -> None:
        """UnknownQueue unless the API lists QUEUE (among the queues the token may see)."""
        if queue not in {q.queue for q in await self.queues()}:
            raise UnknownQueue(queue)

    async def recorder_silence(self) -> RecorderSilence | None:
        """Not exposed by the API yet: its own /readyz and alerts say so; None."""
        return None

    # -- workflows and batches -------------------------------------------------------------------
    async def workflows(self, *, limit: int = 50) -> list[WorkflowSummary]:
        return _as(list[WorkflowSummary], await self.request("GET", "/v1/workflows", query={"limit": limit}))

    async def workflow_id(self, prefix: str) -> str:
        """The full id of the one workflow (among the latest 1,000) whose id starts with PREFIX."""
        if len(prefix) == 36 or not WORKFLOW_ID_PREFIX.fullmatch(prefix):
            return prefix
        found = [str(w.id) for w in await self.workflows(limit=1000) if str(w.id).startswith(prefix.lower())]
        return one_workflow(prefix, found[:2])

    async def workflow(self, workflow_id: str) -> Workflow:
        return _as(Workflow, await self.request("GET", f"/v1/workflows/{_quote(workflow_id)}"))

    async def retry_workflow(self, workflow_id: str, *, recompute: Sequence[str] = (),
                             reason: str = "") -> dict[str, list[str]]:
        out = await self.request("POST", f"/v1/workflows/{_quote(workflow_id)}/retry",
                                 {"recompute": list(recompute), "reason": reason})
        return _as(dict[str, list[str]], out["done"])

    async def batch_view(self, batch_id: str) -> Batch:
        return _as(Batch, await self.request("GET", f"/v1/batches/{_quote(str(batch_id))}"))

    # -- schedules -----------------------------------------------------------------------------
    async def add_schedule(self, spec: ScheduleSpec) -> Schedule:
        body = {k: v for k, v in msgspec.to_builtins(spec).items() if v is not None}
        return _as(Schedule, await self.request("POST", "/v1/schedules", body))

    async def update_schedule(self, name: str, fields: dict[str, Any], *, reason: str = "") -> Schedule:
        return _as(Schedule, await self.request("PATCH", f"/v1/schedules/{_quote(name)}",
                                                {**fields, "reason": reason}))

    async def run_schedule_now(self, name: str, *, reason: str = "") -> int:
        return int((await self.request("POST", f"/v1/schedules/{_quote(name)}/run-now", {"reason": reason}))["id"])

    async def schedules(self, *, limit: int = 100) -> list[Schedule]:
        return _as(list[Schedule], await self.request("GET", "/v1/schedules", query={"limit": limit}))

    async def schedule(self, name: str) -> Schedule:
        return _as(Schedule, await self.request("GET", f"/v1/schedules/{_quote(name)}"))

    async def schedule_fires(self, name: str, n: int) -> tuple[list[datetime], str]:
        out = await self.request("GET", f"/v1/schedules/{_quote(name)}/next", query={"n": n})
        return [datetime.fromisoformat(t) for t in out["fires"]], out.get("timezone") or "UTC"

    async def schedule_runs(self, name: str, limit: int = 10) -> list[ScheduleRun]:
        return _as(list[ScheduleRun], await self.request("GET", f"/v1/schedules/{_quote(name)}/runs",
                                                         query={"limit": limit}))

    async def set_schedule_paused(self, name: str, paused: bool) -> None:
        await self.request("POST", f"/v1/schedules/{_quote(name)}/{'pause' if paused else 'resume'}")

    async def remove_schedule(self, name: str) -> None:
        await self.request("DELETE", f"/v1/schedules/{_quote(name)}")

    # -- workers -------------------------------------------------------------------------------
    async def workers(self, *, queue: str | None = None) -> list[WorkerInfo]:
        return _as(list[WorkerInfo], await self.request("GET", "/v1/workers", query={"queue": queue}))

    async def stop_worker(self, worker_id: str, *, reason: str = "") -> None:
        await self.request("POST", f"/v1/workers/{_quote(worker_id)}/stop", {"reason": reason})

    # -- operator ------------------------------------------------------------------------------
    async def command(self, verb: str, run_id: int, *, reason: str = "",
                      expected_version: int | None = None) -> Reply:
        body: dict[str, Any] = {"reason": reason}
        if expected_version is not None:
            body["expected_version"] = expected_version
        return Reply((await self.request("POST", f"/v1/runs/{run_id}/{verb}", body))["state"])

    async def pause_queue(self, queue: str, *, reason: str = "") -> None:
        await self.request("POST", f"/v1/queues/{_quote(queue)}/pause", {"reason": reason})

    async def resume_queue(self, queue: str, *, reason: str = "") -> None:
        await self.request("POST", f"/v1/queues/{_quote(queue)}/resume", {"reason": reason})

    async def resolve(self, run_id: int, *, as_: str, reason: str = "") -> Reply:
        return Reply((await self.request("POST", f"/v1/runs/{run_id}/resolve", {"as": as_, "reason": reason}))["state"])

    async def bulk_count(self, command: str, *, queue: str, status: str | None = None, handler: str | None = None,
                         limit: int = 100) -> BulkCount:
        """The API's count (confirm 0): its 428 answer names the counted set by a handle (and gives the
        server's cap as its limit: the count's is the lower of the two)."""
        body = {"command": command, "status": status_filter(status), "handler": handler, "confirm": 0, "limit": limit}
        try:
            await self.request("POST", f"/v1/queues/{_quote(queue)}/bulk", {k: v for k, v in body.items() if v is not None})
        except BulkNotConfirmed as exc:
            counted: Any = exc
            return BulkCount(command=command, queue=queue, status=status_filter(status), handler=handler,
                             matched=exc.matched, limit=min(limit, exc.limit or limit), acting=int(counted.acting),
                             until_id=counted.until_id, handle=counted.handle)
        raise ApiProblem(200, {"detail": "the API acted on a bulk count (confirm 0)"})

    async def bulk_confirm(self, count: BulkCount, *, reason: str = "") -> BulkResult:
        """The confirm of a count: acts on the counted runs that have not moved (the filters are the count's)."""
        body = {"command": count.command, "handle": count.handle, "confirm": count.acting, "reason": reason}
        return _as(BulkResult, await self.request("POST", f"/v1/queues/{_quote(count.queue)}/bulk", body))

    # -- audit and tokens ----------------------------------------------------------------------
    async def audit(self, *, actor: str | None = None, queue: str | None = None, since: datetime | None = None,
                    until: datetime | None = None, limit: int = 100, cursor: str | None = None) -> list[AuditEntry]:
        return _as(list[AuditEntry], await self.request("GET", "/v1/audit", query={
            "actor": actor, "queue": queue, "limit": limit, "since": since.isoformat() if since else None,
            "until": until.isoformat() if until else None, "cursor": cursor}))

    async def tokens(self) -> list[TokenInfo]:
        return _as(list[TokenInfo], await self.request("GET", "/v1/tokens"))

    async def create_token(self, role: str, queues: Sequence[str] = (), *, name: str | None = None,
                           expires_in: float | None = None) -> tuple[TokenInfo, str]:
        row = await self.request("POST", "/v1/tokens", {"role": role, "queues": list(queues), "name": name,
                                                        "expires_in": expires_in})
        return _as(TokenInfo, {k: v for k, v in row.items() if k != "secret"}), str(row["secret"])

    async def revoke_token(self, token_id: int, *, reason: str = "") -> None:
        await self.request("DELETE", f"/v1/tokens/{token_id}", query={"reason": reason or None})
