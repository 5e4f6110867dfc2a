"""The ASGI application: stateless (every replica talks to the same Redis and PostgreSQL),
one shared connection pool per process, the dashboard's static files under /ui/."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fencepost.api.auth import RateLimiter, Tokens
from fencepost.api.openapi import document
from fencepost.api.problems import ApiError, problem_response
from fencepost.api.routes import ROUTES, wrap
from fencepost.client import Client
from fencepost.core.config import Settings, from_env

__all__ = ["API_HEADERS", "SECURITY_HEADERS", "STATIC_DIR", "Api", "ApiConfig", "SecurityHeaders", "create_app"]

STATIC_DIR = Path(__file__).resolve().parent / "static"


class ApiConfig(msgspec.Struct, kw_only=True):
    """Limits of the API (environment: FENCEPOST_API_<FIELD>)."""

    max_body_bytes: Annotated[int, Meta(ge=1024, le=1024 ** 3)] = 1024 * 1024
    max_batch: Annotated[int, Meta(ge=1, le=100_000)] = 1000
    rate_limit: Annotated[int, Meta(ge=0, le=10_000_000)] = 1200
    """Requests per token per window (0: off)."""
    rate_window_s: Annotated[int, Meta(ge=1, le=86_400)] = 60
    bulk_cap: Annotated[int, Meta(ge=1, le=1_000_000)] = 1000
    """A bulk action refuses to act when more runs than this match."""
    bulk_handle_ttl_s: Annotated[int, Meta(ge=5, le=86_400)] = 300
    """How long the handle of a bulk count can be confirmed."""
    token_cache_s: Annotated[float, Meta(ge=0, le=3_600)] = 5.0
    """How long a token lookup is cached (a revoke reaches other replicas within this time)."""
    auth_fail_limit: Annotated[int, Meta(ge=0, le=1_000_000)] = 20
    """Failed authentications per client address per window before it gets 429 (0: off)."""
    auth_fail_window_s: Annotated[int, Meta(ge=1, le=86_400)] = 60
    metrics_token: bool = True
    """/metrics asks for a token (any role), as every /v1 route does; FENCEPOST_API_METRICS_TOKEN=0
    makes it public, for scrapers that reach it on a private network (route templates, methods and
    status classes are its only labels)."""

    @classmethod
    def from_env(cls, **overrides: Any) -> ApiConfig:
        return from_env(cls, "FENCEPOST_API_", overrides)


class Api:
    """What every request shares: one Client (connection pools), the token store, the limiter."""

    def __init__(self, settings: Settings, config: ApiConfig) -> None:
        self.settings, self.config = settings, config
        self.client = Client(settings=settings, actor="api")
        self.tokens = Tokens(self.client.stores.db, cache_s=config.token_cache_s, redis=self.client.stores.redis,
                             prefix=settings.prefix, fail_limit=config.auth_fail_limit,
                             fail_window_s=config.auth_fail_window_s)
        self.limiter = RateLimiter(self.client.stores.redis, settings.prefix, limit=config.rate_limit,
                                   window_s=config.rate_window_s)

    def openapi_document(self) -> bytes:
        """The OpenAPI document (built once, from the route table). /openapi.json reads it here: the
        document is made from the routes, so the routes cannot import it."""
        return document()

    async def start(self) -> None:
        await self.client.connect()

    async def close(self) -> None:
        await self.client.close()


class _NotFound(ApiError):
    status, slug, title = 404, "not-found", "No such endpoint"


class _MethodNotAllowed(ApiError):
    status, slug, title = 405, "method-not-allowed", "Method not allowed"


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    err: ApiError = (_MethodNotAllowed if exc.status_code == 405 else _NotFound if exc.status_code == 404
                     else ApiError)(str(exc.detail))
    if not isinstance(err, (_NotFound, _MethodNotAllowed)):
        err.status = exc.status_code
    return problem_response(err, request.url.path, headers=dict(exc.headers or {}))


def create_app(settings: Settings | None = None, config: ApiConfig | None = None) -> Starlette:
    """The API as an ASGI app. Its lifespan opens the stores; for tests without a server, use
    `async with app.router.lifespan_context(app): ...`."""
    api = Api(settings or Settings.from_env(), config or ApiConfig.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await api.start()
        try:
            yield
        finally:
            await api.close()

    async def home(request: Request) -> Response:
        return RedirectResponse("/ui/")

    routes: list[Any] = [Route(path, _by_method({r.method: wrap(r) for r in specs}), methods=[r.method for r in specs])
                         for path, specs in _by_path().items()]
    routes += [Route("/", home, methods=["GET"]),
               Mount("/ui", app=StaticFiles(directory=STATIC_DIR, html=True), name="ui")]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error},
                    middleware=[Middleware(SecurityHeaders)])
    app.state.api = api
    return app


def _by_path() -> dict[str, list[Any]]:
    """The route table grouped by path: one Starlette route per path, so a 405 lists in `Allow`
    every method the path has."""
    out: dict[str, list[Any]] = {}
    for r in ROUTES:
        out.setdefault(r.path, []).append(r)
    return out


def _by_method(endpoints: dict[str, Callable[[Request], Awaitable[Response]]]
               ) -> Callable[[Request], Awaitable[Response]]:
    if len(endpoints) == 1:
        return next(iter(endpoints.values()))

    async def endpoint(request: Request) -> Response:
        return await endpoints["GET" if request.method == "HEAD" else request.method](request)

    return endpoint


SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                                 b"frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
"""On every response (the dashboard's files, its redirects and errors, and the API): the dashboard
holds a token, so it must never run a foreign script or be framed."""

API_HEADERS = [*SECURITY_HEADERS, (b"cache-control", b"no-store")]
"""On every answer but the dashboard's static files: API answers (runs, arguments, errors, a new token's
secret) are never kept by a browser or a proxy cache."""


class SecurityHeaders:
    """Plain ASGI middleware adding SECURITY_HEADERS (cheaper than BaseHTTPMiddleware, no body buffering)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        extra = SECURITY_HEADERS if scope.get("path", "").startswith("/ui/") else API_HEADERS

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in extra if h[0] not in have)]
            await send(message)

        await self.app(scope, receive, with_headers)
