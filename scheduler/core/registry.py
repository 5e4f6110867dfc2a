"""Handlers are registered by name with a decorator that declares how they run."""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

import msgspec

from fencepost.core import rates, validate
from fencepost.core.classify import validate_mapping
from fencepost.core.errors import InvalidInput
from fencepost.core.models import JobSpec, Model, Submit

__all__ = ["AsyncSubmitter", "Handler", "Options", "Registry", "SyncSubmitter", "load_registry"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncSubmitter(Protocol):
    """What a handle submits through: fencepost.client.Client (or anything with its submit_many)."""

    def submit_many(self, requests: Sequence[Submit]) -> Awaitable[list[int]]: ...


class SyncSubmitter(Protocol):
    """fencepost.client.SyncClient, for handles used from plain scripts."""

    def submit_many(self, requests: Sequence[Submit]) -> list[int]: ...


class Options(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Per-submit options of a typed handle, kept apart from the job's own parameters (a job may
    well have a parameter called `delay` or `queue`): `send.options(delay=60).submit(client, ...)`."""

    queue: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: float | None = None
    timeout: float | None = None
    max_retries: int | None = None
    idempotency_key: str | None = None
    trace: str | None = None
    tenant: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_key: str | None = None
    rate_limit: str | None = None


_NO_OPTIONS = Options()
_ARG_NAME = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")


class _Signature:
    """A handler's parameters after ctx, with the types msgspec converts annotated arguments to."""

    __slots__ = ("fast", "pos_types", "required", "sig", "types", "var_kw", "var_pos")

    def __init__(self, fn: Callable[..., Any]) -> None:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())[1:]  # ctx is the worker's, never the producer's
        self.sig = sig.replace(parameters=params)
        hints = _hints(fn, params)
        self.types = {p.name: hints[p.name] for p in params if p.name in hints and hints[p.name] is not Any}
        self.var_pos = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), None)
        self.var_kw = next((p.name for p in params if p.kind == p.VAR_KEYWORD), None)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.pos_types = [self.types.get(p.name) for p in positional]
        self.required = sum(1 for p in positional if p.default is p.empty)
        self.fast = self.var_pos is None and not any(p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in params)
        """Positional-only calls (what a worker mostly sees) are checked without inspect's bind."""

    def bind(self, handler: str, args: Sequence[Any], kwargs: dict[str, Any], *, strict: bool
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """(args, kwargs) as the handler will receive them, annotated ones converted; the shape the
        caller chose (positional or keyword) is kept. Raises InvalidInput naming the parameter."""
        if self.fast and not kwargs and self.required <= len(args) <= len(self.pos_types):
            out = list(args)
            for i, (tp, value) in enumerate(zip(self.pos_types, args)):
                if tp is not None and type(value) is not tp:  # an exact builtin match needs no conversion
                    try:
                        out[i] = msgspec.convert(value, tp, strict=strict)
                    except msgspec.ValidationError as exc:
                        name = list(self.sig.parameters)[i]
                        raise InvalidInput(f"{handler}: argument {name!r}: {exc}", field=name) from None
            return tuple(out), {}
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError as exc:
            found = _ARG_NAME.search(str(exc))
            field = found.group(1) if found else "args"
            raise InvalidInput(f"{handler}: {exc}", field=field) from None
        if not self.types:
            return tuple(args), dict(kwargs)
        converted = dict(bound.arguments)
        for name, value in bound.arguments.items():
            tp = self.types.get(name)
            if tp is None:
                continue
            try:
                if name == self.var_pos:
                    converted[name] = tuple(msgspec.convert(v, tp, strict=strict) for v in value)
                elif name == self.var_kw:
                    converted[name] = {k: msgspec.convert(v, tp, strict=strict) for k, v in value.items()}
                else:
                    converted[name] = msgspec.convert(value, tp, strict=strict)
            except msgspec.ValidationError as exc:
                raise InvalidInput(f"{handler}: argument {name!r}: {exc}", field=name) from None
        names = list(self.sig.parameters)
        out_args: list[Any] = []
        for i in range(len(args)):
            if i < len(names) and names[i] != self.var_pos:
                out_args.append(converted[names[i]])
            else:
                out_args.extend(converted[self.var_pos or ""][i - names.index(self.var_pos or ""):])
                break
        out_kwargs = {k: (converted[k] if k in converted else converted[self.var_kw or ""][k]) for k in kwargs}
        return tuple(out_args), out_kwargs


def _hints(fn: Callable[..., Any], params: list[inspect.Parameter]) -> dict[str, Any]:
    """The parameters' resolved annotations; one that does not resolve at run time (a name imported
    under TYPE_CHECKING) is left unchecked: the call still binds."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        pass
    hints: dict[str, Any] = {}
    namespace = getattr(fn, "__globals__", {})
    for p in params:
        if p.annotation is inspect.Parameter.empty:
            continue
        try:
            hints[p.name] = typing.get_type_hints(_Probe(p.annotation), namespace)["x"]
        except Exception:
            continue
    return hints


class _Probe:
    """One annotation in an object get_type_hints can resolve on its own."""

    def __init__(self, annotation: Any) -> None:
        self.__annotations__ = {"x": annotation}


class Handler(Generic[P, R]):
    """A registered job, and its typed handle: `send.submit(client, *args)` binds the arguments to
    the function's signature (ctx excepted) before anything is written, so a type checker sees the
    parameters and a producer's mistake is an InvalidInput naming the parameter, not a retried failure."""

    __slots__ = ("_opts", "_sig", "errors", "fn", "migrate", "resume_check", "spec")

    def __init__(self, spec: JobSpec, fn: Callable[Concatenate[Any, P], R],
                 migrate: Callable[[int, Any], Any] | None = None,
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
        self._sig: _Signature | None = None
        self._opts = _NO_OPTIONS

    def __call__(self, ctx: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(ctx, *args, **kwargs)

    @property
    def name(self) -> str:
        return self.spec.name

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any], *, strict: bool = True
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Check (args, kwargs) against the signature and convert annotated arguments with msgspec
        (strict on submit; lax at execution, where they come back from msgpack). Raises InvalidInput."""
        return self.prepare().bind(self.spec.name, args, kwargs, strict=strict)

    def prepare(self) -> _Signature:
        """The signature and resolved annotations, read once (a worker does it at start-up, not on a job's
        time; lazily, so a type defined after the handler in its module still resolves)."""
        if self._sig is None:
            self._sig = _Signature(self.fn)
        return self._sig

    def options(self, **options: Any) -> Handler[P, R]:
        """The same handle with submit options (queue, priority, run_at, delay, timeout, max_retries,
        idempotency_key, trace, tenant, concurrency_key, concurrency_limit, rate_key, rate_limit) set for
        its submits."""
        try:
            opts = msgspec.convert({**msgspec.structs.asdict(self._opts), **options}, Options)
        except msgspec.ValidationError as exc:
            raise InvalidInput(f"{self.spec.name}: options: {exc}", field=_field_of(exc, "options")) from None
        copy: Handler[P, R] = Handler(self.spec, self.fn, self.migrate, self.resume_check, self.errors)
        copy._sig, copy._opts = self._sig, opts
        return copy

    def request(self, *args: P.args, **kwargs: P.kwargs) -> Submit:
        """A validated Submit (for Client.submit_many, or a workflow Node.from_request)."""
        bound_args, bound_kwargs = self.bind(args, kwargs)
        return Submit(handler=self.spec.name, args=bound_args, kwargs=bound_kwargs,
                      **msgspec.structs.asdict(self._opts))

    async def submit(self, client: AsyncSubmitter, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """Submit one run through an async Client; returns its id once PostgreSQL committed it."""
        return (await client.submit_many([self.request(*args, **kwargs)]))[0]

    def submit_sync(self, client: SyncSubmitter, /, *args: P.args, **kwargs: P.kwargs) -> int:
        """The same through a SyncClient."""
        return client.submit_many([self.request(*args, **kwargs)])[0]


def _field_of(exc: msgspec.ValidationError, default: str) -> str:
    found = re.search(r"at `\$\.(\w+)`", str(exc))
    return found.group(1) if found else default


class Registry:
    """A named set of handlers; workers load it as `module:attribute`."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler[..., Any]] = {}

    def job(self, name: str | None = None, *, model: Model = "async", queue: str = "default",
            priority: int = 0, timeout: float = 300.0, max_retries: int = 3, version: int = 1,
            resumable: bool = True, owner: str | None = None, stop_grace: float | None = None,
            side_effects: bool = False, compensate: str | None = None,
            migrate: Callable[[int, Any], Any] | None = None,
            resume_check: Callable[..., str | None] | None = None, errors: dict[type, str] | None = None,
            depends_on_service: str | None = None, concurrency_key: str | None = None,
            concurrency_limit: int | None = None, rate_key: str | None = None, rate_limit: str | None = None
            ) -> Callable[[Callable[Concatenate[Any, P], R]], Handler[P, R]]:
        """Declare a handler. `depends_on_service` puts its runs behind that dependency's
        shared circuit breaker; `errors` maps the handler's own exception types to kinds;
        `concurrency_key="customer", concurrency_limit=5` lets at most 5 runs per value of the
        `customer` argument hold a lease at once (enforced by the claim script); `rate_key="customer",
        rate_limit="10/1s"` lets at most 10 runs per value of `customer` start in any second, over
        all workers (`rate_limit` alone: per handler, whatever the arguments). Returns the typed
        handle (Handler): `await send.submit(client, ...)`, `send.options(delay=60).submit(...)`."""

        mapping = validate_mapping(errors or {})
        if model not in ("async", "thread", "process"):
            raise InvalidInput(f"model must be async, thread or process, not {model!r}", field="model")

        if (concurrency_key is None) != (concurrency_limit is None):
            raise InvalidInput("give concurrency_key and concurrency_limit together", field="concurrency_limit")
        limit = concurrency_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000):
            raise InvalidInput(f"concurrency_limit must be a positive integer, not {concurrency_limit!r}",
                               field="concurrency_limit")

        rate = None if rate_limit is None else rates.parse("rate_limit", rate_limit).stored
        if rate_key is not None:
            if rate is None:
                raise InvalidInput("rate_key needs a rate_limit", field="rate_limit")
            if not isinstance(rate_key, str) or not rate_key.isidentifier():
                raise InvalidInput(f"rate_key must name an argument, not {rate_key!r}", field="rate_key")

        def register(fn: Callable[Concatenate[Any, P], R]) -> Handler[P, R]:
            arg = _argument_position(fn, concurrency_key) if concurrency_key else None
            rarg = _argument_position(fn, rate_key, "rate_key") if rate_key else None
            job_name = name or f"{fn.__module__}.{fn.__qualname__}"
            # a rate without a key argument is the handler's own: every run shares the key `<handler>`
            rkey = rate_key if rate_key is not None or rate is None else ""
            spec = JobSpec(name=job_name, model=model, queue=queue,
                           priority=priority, timeout_s=float(timeout), max_retries=max_retries,
                           version=version, resumable=resumable, owner=owner, stop_grace_s=stop_grace,
                           side_effects=side_effects, compensate=compensate, migrates=migrate is not None,
                           service=depends_on_service, concurrency_key=concurrency_key,
                           concurrency_arg=arg, concurrency_limit=concurrency_limit, rate_key=rkey,
                           rate_arg=rarg, rate_limit=rate, params=validate.describe_params(fn))
            handler = Handler(spec, fn, migrate, resume_check, mapping)
            self.handlers[spec.name] = handler
            return handler

        return register

    def __getitem__(self, name: str) -> Handler[..., Any]:
        return self.handlers[name]

    def __contains__(self, name: object) -> bool:
        return name in self.handlers

    def specs(self) -> list[JobSpec]:
        return [h.spec for h in self.handlers.values()]


def _argument_position(fn: Callable[..., Any], name: str, field: str = "concurrency_key") -> int | None:
    """Where `name` sits among the positional arguments after ctx (None: keyword-only)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    for i, p in enumerate(params):
        if p.name == name:
            return i if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    raise InvalidInput(f"{field} {name!r} is not an argument of {fn.__qualname__}", field=field)


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
