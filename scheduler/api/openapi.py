"""The OpenAPI 3.1 document, generated from the msgspec Structs of scheduler/api/schemas.py
(msgspec.json.schema_components) and the route table of scheduler/api/routes.py."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec

from fencepost import __version__
from fencepost.api import schemas as S
from fencepost.api.routes import OPTIONAL_BODY, ROUTES
from fencepost.api.routing import RouteSpec
from fencepost.core.keys import QUEUE_NAME_PATTERN
from fencepost.core.states import Status

__all__ = ["document", "spec"]

_REF = "#/components/schemas/{name}"

_ERRORS = {
    "400": "Malformed body (not JSON)",
    "401": "Missing, unknown or revoked token",
    "403": "The token's role or queue scope does not allow this",
    "404": "No such run / queue / schedule / workflow / batch / token, or not in the token's scope (the same answer)",
    "409": "Illegal transition, concurrent modification, resume refused (offer: restart), idempotency key used "
           "for a different request",
    "413": "Body, batch or payload too large",
    "422": "Invalid input (field names the culprit)",
    "428": "Bulk action not confirmed with the number of matching runs",
    "429": "Rate limit of the token, of its open event streams, or of failed authentications from the address, "
           "exceeded (Retry-After)",
    "503": "A store is unreachable",
}


def _path_parameters(path: str) -> list[dict[str, Any]]:
    out = []
    for name in re.findall(r"{(\w+)}", path):
        schema: dict[str, Any] = {"type": "string", "minLength": 1}
        if name in ("run_id", "token_id"):
            schema = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
        elif name in ("workflow_id", "batch_id"):
            schema = {"type": "string", "format": "uuid"}
        elif name == "queue":
            schema = {"type": "string", "pattern": QUEUE_NAME_PATTERN}
        out.append({"name": name, "in": "path", "required": True, "schema": schema})
    return out


def _query_parameters(r: RouteSpec) -> list[dict[str, Any]]:
    out = []
    for name, typ, default, desc in r.params:
        schema: dict[str, Any] = {"type": typ}
        if default is not None:
            schema["default"] = default
        if name in ("limit", "n", "window"):
            schema.update({"minimum": 1 if name != "window" else 10,
                           "maximum": {"limit": 1000, "n": 100, "window": 86400}[name]})
        if name == "before" and typ == "integer":
            schema.update({"minimum": 1, "maximum": 2**63 - 1})
        if name == "reason":
            schema.update({"maxLength": 1000})
        if name == "status":
            schema["enum"] = [s.value for s in Status]  # the one table's states, in its order
        if name in ("since", "until") or (name == "before" and typ == "string"):
            schema["format"] = "date-time"
        out.append({"name": name, "in": "query", "required": False, "schema": schema, "description": desc})
    if r.path in ("/v1/runs", "/v1/runs/batch") and r.method == "POST":
        out.append({"name": "Idempotency-Key", "in": "header", "required": False,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
                    "description": "Submitting again with the same key returns the same run"})
    return out


def _responses(r: RouteSpec, by_type: dict[Any, Any]) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK"}
    if r.response == "text":
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif r.response == "object":
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    elif r.response == "event-stream":  # Server-Sent Events: each message's data is an Event (fencepost.api.stream)
        ok["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    elif r.response is not None:
        ok["content"] = {"application/json": {"schema": by_type[r.response]}}
    responses: dict[str, Any] = {str(r.status): ok}
    problem = {"application/problem+json": {"schema": {"$ref": _REF.format(name="Problem")}}}
    if r.auth:
        for code, desc in _ERRORS.items():
            responses.setdefault(code, {"description": desc, "content": problem})
    elif r.path == "/readyz":
        responses["503"] = {"description": "Not ready", "content": {
            "application/json": {"schema": by_type[S.Readiness]}}}
    return responses


def _operation(r: RouteSpec, by_type: dict[Any, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": r.summary, "operationId": re.sub(r"\W+", "_", f"{r.method}_{r.path}").strip("_"),
                          "tags": [r.tag]}
    params = _path_parameters(r.path) + _query_parameters(r)
    if params:
        op["parameters"] = params
    if r.body is not None:
        op["requestBody"] = {"required": r.body not in OPTIONAL_BODY,
                             "content": {"application/json": {"schema": by_type[r.body]}}}
    if r.auth:
        op["security"] = [{"bearer": []}]
    op["responses"] = _responses(r, by_type)
    return op


@cache
def spec() -> dict[str, Any]:
    types: list[Any] = [S.Problem]
    for r in ROUTES:
        if r.body is not None:
            types.append(r.body)
        if r.response not in (None, "text", "object", "event-stream"):
            types.append(r.response)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    by_type = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, by_type)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Fencepost API", "version": __version__,
                 "description": "Submit, inspect and control runs. Errors are RFC 9457 application/problem+json "
                                "with the typed error's fields. Authenticate with `Authorization: Bearer <token>`."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


@cache
def document() -> bytes:
    return msgspec.json.encode(spec())
