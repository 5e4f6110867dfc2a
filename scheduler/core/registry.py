"""Handlers are registered by name with a decorator that declares how they run."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from fencepost.core.classify import validate_mapping
from fencepost.core.errors import InvalidInput
from fencepost.core.models import JobSpec, Model

__all__ = ["Handler", "Registry", "load_registry"]


class Handler:
    __slots__ = ("errors", "fn", "migrate", "resume_check", "spec")

    def __init__(self, spec: JobSpec, fn: Callable[..., Any], migrate: Callable[[int, Any], Any] | None = None,
                 resume_check: Callable[..., str | None] | None = None,
                 errors: dict[type, str] | None = None) -> None:
        self.spec, self.fn = spec, fn
        self.errors = errors or {}
        """Exception type -> error kind (transient, rate_limited, invalid_input, side_effect, policy)."""
        self.migrate = migrate
        """migrate(old_schema_version, state) -> state in the current version."""
        self.resume_check = resume_check
        """resume_check(args, kwargs, checkpoint_state) -> None, or why resuming is unsafe
        (e.g. a declared input no longer exists); run by Client.resume when it has the registry."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def name(self) -> str:
        return self.spec.name


class Registry:
    """A named set of handlers; workers load it as `module:attribute`."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def job(self, name: str | None = None, *, model: Model = "async", queue: str = "default",
            priority: int = 0, timeout: float = 300.0, max_retries: int = 3, version: int = 1,
            resumable: bool = True, owner: str | None = None, stop_grace: float | None = None,
            side_effects: bool = False, compensate: str | None = None,
            migrate: Callable[[int, Any], Any] | None = None,
            resume_check: Callable[..., str | None] | None = None, errors: dict[type, str] | None = None,
            depends_on_service: str | None = None, concurrency_key: str | None = None,
            concurrency_limit: int | None = None) -> Callable[[Callable[..., Any]], Handler]:
        """Declare a handler. `depends_on_service` puts its runs behind that dependency's
        shared circuit breaker; `errors` maps the handler's own exception types to kinds;
        `concurrency_key="customer", concurrency_limit=5` lets at most 5 runs per value of the
        `customer` argument hold a lease at once (enforced by the claim script)."""

        mapping = validate_mapping(errors or {})
        if model not in ("async", "thread", "process"):
            raise InvalidInput(f"model must be async, thread or process, not {model!r}", field="model")

        if (concurrency_key is None) != (concurrency_limit is None):
            raise InvalidInput("give concurrency_key and concurrency_limit together", field="concurrency_limit")
        limit = concurrency_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000):
            raise InvalidInput(f"concurrency_limit must be a positive integer, not {concurrency_limit!r}",
                               field="concurrency_limit")

        def register(fn: Callable[..., Any]) -> Handler:
            arg = _argument_position(fn, concurrency_key) if concurrency_key else None
            spec = JobSpec(name=name or f"{fn.__module__}.{fn.__qualname__}", model=model, queue=queue,
                           priority=priority, timeout_s=float(timeout), max_retries=max_retries,
                           version=version, resumable=resumable, owner=owner, stop_grace_s=stop_grace,
                           side_effects=side_effects, compensate=compensate, migrates=migrate is not None,
                           service=depends_on_service, concurrency_key=concurrency_key,
                           concurrency_arg=arg, concurrency_limit=concurrency_limit)
            handler = Handler(spec, fn, migrate, resume_check, mapping)
            self.handlers[spec.name] = handler
            return handler

        return register

    def __getitem__(self, name: str) -> Handler:
        return self.handlers[name]

    def __contains__(self, name: object) -> bool:
        return name in self.handlers

    def specs(self) -> list[JobSpec]:
        return [h.spec for h in self.handlers.values()]


def _argument_position(fn: Callable[..., Any], name: str) -> int | None:
    """Where `name` sits among the positional arguments after ctx (None: keyword-only)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    for i, p in enumerate(params):
        if p.name == name:
            return i if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    raise InvalidInput(f"concurrency_key {name!r} is not an argument of {fn.__qualname__}", field="concurrency_key")


def load_registry(path: str) -> Registry:
    """Import `module:attribute` (the --app of a worker)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidInput(f"--app must look like module:registry, not {path!r}", field="app")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"cannot import {module_name!r}: {exc}", field="app") from exc
    registry = getattr(module, attr, None)
    if not isinstance(registry, Registry):
        raise InvalidInput(f"{path!r} is not a fencepost Registry", field="app")
    return registry
