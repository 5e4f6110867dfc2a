"""Handlers are registered by name with a decorator that declares how they run."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .errors import InvalidInput
from .models import JobSpec, Model

__all__ = ["Registry", "Handler", "load_registry"]


class Handler:
    __slots__ = ("spec", "fn")

    def __init__(self, spec: JobSpec, fn: Callable[..., Any]) -> None:
        self.spec, self.fn = spec, fn

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
            resumable: bool = True, owner: str | None = None) -> Callable[[Callable[..., Any]], Handler]:
        if model not in ("async", "thread", "process"):
            raise InvalidInput(f"model must be async, thread or process, not {model!r}", field="model")

        def register(fn: Callable[..., Any]) -> Handler:
            spec = JobSpec(name=name or f"{fn.__module__}.{fn.__qualname__}", model=model, queue=queue,
                           priority=priority, timeout_s=float(timeout), max_retries=max_retries,
                           version=version, resumable=resumable, owner=owner)
            handler = Handler(spec, fn)
            self.handlers[spec.name] = handler
            return handler

        return register

    def __getitem__(self, name: str) -> Handler:
        return self.handlers[name]

    def __contains__(self, name: object) -> bool:
        return name in self.handlers

    def specs(self) -> list[JobSpec]:
        return [h.spec for h in self.handlers.values()]


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
