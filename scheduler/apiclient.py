"""A thin HTTP client of the Fencepost API for the CLI (`--api URL --token T`, or
FENCEPOST_API_URL / FENCEPOST_API_TOKEN): operators need no database or Redis credentials.

Standard library only. Problem+json answers become typed errors where the CLI acts on the
type (BulkNotConfirmed), and ApiProblem (a FencepostError: one line on stderr) otherwise.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from typing import Any

from fencepost.core.errors import (
    BulkNotConfirmed,
    FencepostError,
    StoreUnavailable,
    WaitTimeout,
)
from fencepost.core.states import RESTING

__all__ = ["ApiClient", "ApiProblem"]


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


class ApiClient:
    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, *, query: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> Any:
        url = self.url + path
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                url += "?" + urllib.parse.urlencode(q)
        data = None if body is None else json.dumps(body, default=str).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                problem = json.loads(raw)
            except ValueError:
                problem = {"detail": raw.decode(errors="replace")[:200] or exc.reason}
            if exc.code == 428 and "matched" in problem:
                refused = BulkNotConfirmed(int(problem["matched"]), int(problem.get("limit") or 0))
                refused.until_id = problem.get("until_id")  # type: ignore[attr-defined]  # the set as counted
                refused.acting = problem.get("acting", problem["matched"])  # type: ignore[attr-defined]
                raise refused from None
            raise ApiProblem(exc.code, problem) from None
        except (urllib.error.URLError, OSError) as exc:
            raise StoreUnavailable(f"the API at {self.url} is unreachable: {getattr(exc, 'reason', exc)}") from None
        return _parse_times(json.loads(raw)) if raw else None

    # -- producer ------------------------------------------------------------------------------
    def submit(self, handler: str, args: list[Any], kwargs: dict[str, Any], *, idempotency_key: str | None = None,
               **options: Any) -> int:
        body = {"handler": handler, "args": args, "kwargs": kwargs, **{k: v for k, v in options.items() if v is not None}}
        hdrs = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return int(self.request("POST", "/v1/runs", body, headers=hdrs)["id"])

    # -- read ----------------------------------------------------------------------------------
    def get(self, run_id: int) -> dict[str, Any]:
        return self.request("GET", f"/v1/runs/{run_id}")

    def attempts(self, run_id: int) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/runs/{run_id}/attempts")

    def checkpoint(self, run_id: int) -> dict[str, Any] | None:
        return self.request("GET", f"/v1/runs/{run_id}/checkpoint")

    def events(self, run_id: int) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/runs/{run_id}/events")

    def fleet_events(self, since: datetime, type_: str | None, queue: str | None, limit: int) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/events", query={"since": since.isoformat(), "type": type_, "queue": queue,
                                                       "limit": limit})

    def list_runs(self, *, queue: str | None = None, status: str | None = None, handler: str | None = None,
                  limit: int = 50) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/runs", query={"queue": queue, "status": status, "handler": handler,
                                                     "limit": limit})

    def dead_letter(self, *, queue: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/dead-letter", query={"queue": queue, "limit": limit})

    def review_queue(self, *, queue: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/review", query={"queue": queue, "limit": limit})

    def wait(self, run_id: int, timeout: float | None = None) -> dict[str, Any]:
        """Poll the run until it rests (terminal, PAUSED or STOPPED), as Client.wait does; the API's
        run carries the outcome from Redis before PostgreSQL records it. WaitTimeout past `timeout`."""
        import time


        resting = {s.value for s in RESTING}
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            run = self.get(run_id)
            if run["status"] in resting:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(run_id, run["status"])
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)

    # -- schedules -----------------------------------------------------------------------------
    @staticmethod
    def _name(name: str) -> str:
        return urllib.parse.quote(name, safe="")

    def add_schedule(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/v1/schedules", {k: v for k, v in spec.items() if v is not None})

    def schedules(self, *, limit: int = 100) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/schedules", query={"limit": limit})

    def schedule(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/schedules/{self._name(name)}")

    def schedule_runs(self, name: str, limit: int = 10) -> list[dict[str, Any]]:
        return self.request("GET", f"/v1/schedules/{self._name(name)}/runs", query={"limit": limit})

    def set_schedule_paused(self, name: str, paused: bool) -> dict[str, Any]:
        return self.request("POST", f"/v1/schedules/{self._name(name)}/{'pause' if paused else 'resume'}")

    def remove_schedule(self, name: str) -> None:
        self.request("DELETE", f"/v1/schedules/{self._name(name)}")

    def next_fires(self, name: str, n: int) -> tuple[list[datetime], str]:
        """The schedule's next n fire times and its timezone."""
        out = self.request("GET", f"/v1/schedules/{self._name(name)}/next", query={"n": n})
        return [datetime.fromisoformat(t) for t in out["fires"]], out.get("timezone") or "UTC"

    def queues(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/queues")

    # -- workflows -----------------------------------------------------------------------------
    def workflows(self, *, limit: int = 50) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/workflows", query={"limit": limit})

    def workflow(self, workflow_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/workflows/{self._name(workflow_id)}")

    def retry_workflow(self, workflow_id: str, *, recompute: list[str] | tuple[str, ...] = (),
                       reason: str = "") -> dict[str, list[str]]:
        return self.request("POST", f"/v1/workflows/{self._name(workflow_id)}/retry",
                            {"recompute": list(recompute), "reason": reason})["done"]

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/batches/{self._name(batch_id)}")

    # -- operator ------------------------------------------------------------------------------
    def command(self, verb: str, run_id: int, *, reason: str = "", expected_version: int | None = None) -> str:
        body: dict[str, Any] = {"reason": reason}
        if expected_version is not None:
            body["expected_version"] = expected_version
        return self.request("POST", f"/v1/runs/{run_id}/{verb}", body)["state"]

    def resolve(self, run_id: int, *, as_: str, reason: str = "") -> str:
        return self.request("POST", f"/v1/runs/{run_id}/resolve", {"as": as_, "reason": reason})["state"]

    def pause_queue(self, queue: str, *, reason: str = "") -> None:
        self.request("POST", f"/v1/queues/{urllib.parse.quote(queue, safe='')}/pause", {"reason": reason})

    def resume_queue(self, queue: str, *, reason: str = "") -> None:
        self.request("POST", f"/v1/queues/{urllib.parse.quote(queue, safe='')}/resume", {"reason": reason})

    def bulk(self, verb: str, *, queue: str, status: str | None, handler: str | None, confirm: int,
             reason: str = "", limit: int | None = None, until_id: int | None = None) -> dict[str, Any]:
        body = {"command": verb, "status": status, "handler": handler, "confirm": confirm, "reason": reason,
                "limit": limit, "until_id": until_id}
        return self.request("POST", f"/v1/queues/{urllib.parse.quote(queue, safe='')}/bulk",
                            {k: v for k, v in body.items() if v is not None})
