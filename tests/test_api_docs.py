"""docs/api.md lists every route the API serves, and no route it does not serve (issue 17: routes
were added for the dashboard without a line in the reference).

The routes come from the application's own router (fencepost.api.create_app), so a route added
anywhere is seen. The document's "Endpoints" table names them in its first column: each
backquoted `METHOD /path` is one route; a following backquoted `x` or `/x` (after `·`) is the same
method with the last path segment replaced (`POST /v1/queues/{q}/pause` · `resume`). Query strings
are ignored and path parameters compare by position only (`{run_id}` in the code is `{id}` there).
"""

from __future__ import annotations

import re

from starlette.routing import Route

from fencepost.api import create_app
from fencepost.core.config import Settings
from tests.conftest import ROOT

DOC = ROOT / "docs" / "api.md"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PENDING_PREFIXES = ("/v1/batches",)
"""Routes another change is adding together with their own section of docs/api.md (the batch routes):
checked only once the document names one of them (then all of them must be there)."""


def _shape(path: str) -> str:
    return re.sub(r"{[^}]*}", "{}", path.split("?", 1)[0])


NO_STORES = Settings(redis_url="redis://127.0.0.1:1/0", database_url="postgresql://x@127.0.0.1:1/x")
"""Never connected: the routes are read without stores (no URLs set would start the embedded pair)."""


def served() -> set[tuple[str, str]]:
    out = set()
    for route in create_app(NO_STORES).routes:
        if isinstance(route, Route) and route.path != "/":  # "/" redirects to the dashboard (/ui/, a mount)
            out |= {(m, _shape(route.path)) for m in route.methods or () if m != "HEAD"}
    return out


def documented(text: str) -> set[tuple[str, str]]:
    section = text.split("\n## Endpoints", 1)[1].split("\n## ", 1)[0]
    out: set[tuple[str, str]] = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split(" | ", 1)[0]
        method, path = "", ""
        for item in re.findall(r"`([^`]+)`", first):
            head, _, rest = item.partition(" ")
            if head in METHODS:
                method, path = head, rest.strip()
            else:
                assert method, f"{item!r} continues no route in: {first}"
                path = path.split("?", 1)[0].rsplit("/", 1)[0] + "/" + item.lstrip("/")
            out.add((method, _shape(path)))
    return out


def test_every_route_is_in_docs_api_md_and_every_documented_route_exists() -> None:
    have, doc = served(), documented(DOC.read_text())
    pending = {r for r in have if r[1].startswith(PENDING_PREFIXES)}
    if not {r for r in doc if r[1].startswith(PENDING_PREFIXES)}:
        have -= pending  # not yet documented by the change that adds them; see PENDING_PREFIXES
    missing = sorted(have - doc, key=lambda r: (r[1], r[0]))
    assert not missing, "routes without a line in docs/api.md (Endpoints): " + ", ".join(f"{m} {p}" for m, p in missing)
    stale = sorted(doc - served(), key=lambda r: (r[1], r[0]))
    assert not stale, "docs/api.md names routes the API does not serve: " + ", ".join(f"{m} {p}" for m, p in stale)


def test_the_parser_reads_the_table_shorthand() -> None:
    text = ("# x\n\n## Endpoints\n\n| Method and path | Roles | What |\n| --- | --- | --- |\n"
            "| `GET /v1/runs/{id}/attempts` · `/events`, `POST /v1/queues/{q}/pause` · `resume` | any | x |\n"
            "| `DELETE /v1/schedules/{name}?reason=` | admin | y |\n\n## Next\n| `GET /not/here` | | |\n")
    assert documented(text) == {("GET", "/v1/runs/{}/attempts"), ("GET", "/v1/runs/{}/events"),
                                ("POST", "/v1/queues/{}/pause"), ("POST", "/v1/queues/{}/resume"),
                                ("DELETE", "/v1/schedules/{}")}
