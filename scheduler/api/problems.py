"""RFC 9457 problem details: every typed error becomes application/problem+json with its
fields as extension members; one table says which status each error class gets."""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any

import msgspec
from starlette.responses import Response

from fencepost.core import errors as E
from fencepost.core.schedules import ScheduleExists, UnknownSchedule
from fencepost.core.workers import UnknownWorker
from fencepost.workflows import UnknownWorkflow

__all__ = [
    "PROBLEM_TYPE",
    "ApiError",
    "BadRequest",
    "BulkTooLarge",
    "Forbidden",
    "RateLimited",
    "TooLarge",
    "Unauthorized",
    "UnsupportedMediaType",
    "problem_for",
    "problem_response",
]

PROBLEM_TYPE = "application/problem+json"
_BASE = "urn:fencepost:problem:"


class ApiError(E.FencepostError):
    """An error only the HTTP layer raises (authentication, limits, malformed bodies)."""

    status = 400
    slug = "bad-request"
    title = "Bad request"

    def __init__(self, detail: str, **fields: Any) -> None:
        super().__init__(detail)
        for k, v in fields.items():
            setattr(self, k, v)


class BadRequest(ApiError):
    status, slug, title = 400, "malformed-body", "The request body is not valid JSON"


class Unauthorized(ApiError):
    status, slug, title = 401, "unauthorized", "A valid API token is required"


class Forbidden(ApiError):
    status, slug, title = 403, "forbidden", "The token may not do this"


class NotFound(ApiError):
    status, slug, title = 404, "not-found", "No such resource"


class TooLarge(ApiError):
    status, slug, title = 413, "too-large", "The request is too large"


class UnsupportedMediaType(ApiError):
    status, slug, title = 415, "unsupported-media-type", "Send application/json"


class RateLimited(ApiError):
    status, slug, title = 429, "rate-limited", "Too many requests for this token"


class BulkTooLarge(ApiError):
    status, slug, title = 422, "bulk-over-cap", "The bulk action matches more runs than the server allows"


# (class, status, slug, title); the first class the error is an instance of wins.
_TABLE: list[tuple[type[BaseException], int, str, str]] = [
    (E.ResumeRefused, 409, "resume-refused", "The run cannot be resumed safely"),
    (E.IdempotencyConflict, 409, "idempotency-conflict", "The idempotency key was used for a different request"),
    (E.ConcurrentModification, 409, "concurrent-modification", "The run changed since you read it"),
    (E.IllegalTransition, 409, "illegal-transition", "The run is not in a state that allows this"),
    (E.UnknownRun, 404, "unknown-run", "No such run"),
    (UnknownWorkflow, 404, "unknown-workflow", "No such workflow"),
    (UnknownSchedule, 404, "unknown-schedule", "No such schedule"),
    (E.UnknownQueue, 404, "unknown-queue", "No such queue"),
    (UnknownWorker, 404, "unknown-worker", "No such live worker"),
    (ScheduleExists, 409, "schedule-exists", "A schedule with this name exists"),
    (E.BulkNotConfirmed, 428, "bulk-not-confirmed", "Confirm the number of runs the bulk action affects"),
    (E.PayloadTooLarge, 413, "payload-too-large", "The payload is too large"),
    (E.UnknownHandler, 422, "unknown-handler", "Unknown handler"),
    (E.InvalidInput, 422, "invalid-input", "Invalid input"),
    (E.StaleToken, 409, "stale-token", "Stale fencing token"),
    (E.NotStamped, 503, "not-stamped", "The queue is waiting for the reconciler"),
    (E.StoreUnavailable, 503, "store-unavailable", "A store is unreachable; retry"),
    (E.WaitTimeout, 504, "wait-timeout", "Timed out waiting"),
]

_SKIP = {"args", "status", "slug", "title", "with_traceback", "add_note", "__traceback__"}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (uuid.UUID, datetime)):
        return str(v)
    return str(v)


def _slug(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def problem_for(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(status, body) for an exception: typed errors keep their fields; anything else is a 500."""
    if isinstance(exc, ApiError):
        status, slug, title = exc.status, exc.slug, exc.title
    else:
        for cls, status, slug, title in _TABLE:  # noqa: B007 - the matching row is used after the loop
            if isinstance(exc, cls):
                break
        else:
            if isinstance(exc, E.FencepostError):
                status, slug, title = 400, _slug(type(exc).__name__), "Request refused"
            else:
                status, slug, title = 500, "internal", "Internal server error"
    body: dict[str, Any] = {"type": _BASE + slug, "title": title, "status": status,
                            "detail": str(exc) if status != 500 else "internal error; see the server log",
                            "error": type(exc).__name__ if status != 500 else "InternalError"}
    if status != 500:
        for k, v in vars(exc).items():
            if not k.startswith("_") and k not in _SKIP and k not in body:
                body[k] = _jsonable(v)
    return status, body


_enc = msgspec.json.Encoder()


def problem_response(exc: BaseException, instance: str | None = None,
                     headers: dict[str, str] | None = None) -> Response:
    status, body = problem_for(exc)
    if instance is not None:
        body["instance"] = instance
    hdrs = dict(headers or {})
    if status == 401:
        hdrs.setdefault("WWW-Authenticate", 'Bearer realm="fencepost"')
    if status == 429 and "retry_after" in body:
        hdrs.setdefault("Retry-After", str(int(body["retry_after"])))
    return Response(_enc.encode(body), status_code=status, media_type=PROBLEM_TYPE, headers=hdrs)
