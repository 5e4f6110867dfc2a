"""Testing jobs without a cluster of your own: `run_job` runs one handler in-process with a context whose
checkpoints and interrupts behave as in a worker; the pytest plugin gives each test a client on real
stores (configured, or embedded servers started for the session) and `drain()`, which runs the due
jobs in-process to the end, with a clock that can be moved forward for delays and retries.

The plugin's fixtures live in fencepost.testing_plugin, which pytest loads by itself once fencepost is
installed (the `pytest11` entry point); give it your registry by overriding the `fencepost_registry`
fixture. Needs the `test` extra (pytest, pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any

import msgspec

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import FencepostError, InvalidInput
from fencepost.core.hotreads import first_delayed_ms, queue_busy, server_now_ms, shift_delayed
from fencepost.core.models import decode_payload, decode_result, encode_payload, encode_result
from fencepost.core.queues import declare_queues, require_queue, stamp_created
from fencepost.core.redisconn import register_scheme
from fencepost.core.registry import Handler, Registry, load_registry
from fencepost.core.stores import Stores
from fencepost.reconciler.outbox import OutboxRelay
from fencepost.reconciler.recorder import Recorder
from fencepost.worker.context import Context, Interrupt, Progress, RunResult, SyncContext
from fencepost.worker.runtime import Worker, WorkerOptions

try:  # the `test` extra: fakeredis with its Lua support (lupa)
    import fakeredis
    import fakeredis.aioredis
    from fakeredis._commands import SUPPORTED_COMMANDS as _FAKE_COMMANDS
    from fakeredis._commands import command as _fake_command
    from fakeredis._socket import FakeSocket as _FakeSocket
except ImportError:  # fencepost.testing (and the pytest plugin) still load; use_fakeredis() says what to install
    fakeredis = None  # type: ignore[assignment]

__all__ = ["FAKE_REDIS_URL", "Clock", "DrainTimeout", "Harness", "JobRun", "find_app", "run_job", "use_fakeredis"]

log = logging.getLogger("fencepost.testing")
_INTERRUPTS = {"pause": "PAUSED", "stop": "STOPPED", "cancel": "CANCELLED"}


class JobRun(msgspec.Struct, kw_only=True):
    """What one `run_job` did: the result as a worker records it (through msgpack), every checkpoint
    committed in order, and how it ended."""

    status: str
    """SUCCEEDED, or PAUSED / STOPPED / CANCELLED when an interrupt ended it."""
    result: Any = None
    checkpoints: list[Any] = []
    """Each committed checkpoint's state, as the next attempt would read it back."""
    processed: int | None = None
    progress: list[Progress] = []
    """Every ctx.progress() report, in order (a worker writes only the latest, about once a second)."""
    ctx: Any = None
    """The Context the handler saw (run_id, attempt, token, op_key(...))."""

    @property
    def checkpoint(self) -> Any:
        """The latest committed checkpoint (None: none), what a resumed attempt starts from."""
        return self.checkpoints[-1] if self.checkpoints else None


class _Services:
    """What a worker lends the context besides checkpoints: progress is recorded, upstream results given."""

    def __init__(self, upstream: dict[str, Any]) -> None:
        self.reports: list[Progress] = []
        self.upstream = {name: RunResult(run_id=i, status="SUCCEEDED", result=decode_result(encode_result(v)))
                         for i, (name, v) in enumerate(upstream.items(), start=1_000_000)}

    def progress_changed(self, ctx: Context) -> None:
        if ctx.last_progress is not None:
            self.reports.append(ctx.last_progress)

    async def upstream_results(self, ctx: Context) -> dict[str, RunResult]:
        return dict(self.upstream)

    async def batch_results(self, ctx: Context) -> list[RunResult]:
        return []


async def run_job(handle: Handler[..., Any], *args: Any, checkpoint: Any = None, interrupt_at: int | None = None,
                  interrupt: str = "pause", run_id: int = 1, attempt: int = 1, upstream: dict[str, Any] | None = None,
                  **kwargs: Any) -> JobRun:
    """Run `handle` in-process as a worker would: arguments bound and validated against its signature
    (InvalidInput naming the parameter), sent through msgpack, converted back; `checkpoint` is the state
    a resumed attempt starts from (ctx.checkpoint_data). `interrupt_at=n`: an operator's `interrupt`
    (pause, stop or cancel) is seen at the n-th checkpoint: it is committed, then Interrupt is raised in
    the handler and the run ends PAUSED / STOPPED / CANCELLED. `upstream={"node": result}` is what
    ctx.upstream_results() answers (a workflow node's inputs). The handler's own exceptions propagate."""
    if interrupt not in _INTERRUPTS:
        raise ValueError(f"interrupt must be pause, stop or cancel, not {interrupt!r}")
    bound_args, bound_kwargs = handle.bind(args, kwargs)
    raw_args, raw_kwargs = decode_payload(encode_payload(bound_args, bound_kwargs))
    call_args, call_kwargs = handle.bind(raw_args, raw_kwargs, strict=False)
    spec = handle.spec
    sync = not asyncio.iscoroutinefunction(handle.fn)
    loop = asyncio.get_running_loop()
    ctx = (SyncContext(run_id, attempt, attempt, spec.queue, spec.name, worker_id="fencepost.testing", loop=loop)
           if sync else Context(run_id, attempt, attempt, spec.queue, spec.name, worker_id="fencepost.testing"))
    if checkpoint is not None:
        ctx.checkpoint_data = decode_result(encode_result(checkpoint))
        ctx.checkpoint_version = 1
    committed: list[Any] = []

    async def write(c: Context, state: Any, processed: int | None) -> int:
        committed.append(decode_result(encode_result(state)))  # what the store keeps, not the live object
        c.checkpoint_version += 1
        c.processed = processed if processed is not None else c.processed
        c.checkpointed_at = time.time()
        if interrupt_at is not None and len(committed) == interrupt_at:
            c._ctl = interrupt
            raise Interrupt(interrupt)
        return c.checkpoint_version

    ctx._writer = write
    services = _Services(upstream or {})
    ctx._services = services
    try:
        if sync:
            value = await asyncio.to_thread(handle.fn, ctx, *call_args, **call_kwargs)
        else:
            value = await handle.fn(ctx, *call_args, **call_kwargs)
    except Interrupt as exc:
        return JobRun(status=_INTERRUPTS[exc.kind], checkpoints=committed, processed=ctx.processed,
                      progress=services.reports, ctx=ctx)
    return JobRun(status="SUCCEEDED", result=decode_result(encode_result(value)), checkpoints=committed,
                  processed=ctx.processed, progress=services.reports, ctx=ctx)


async def _stopped(task: asyncio.Task[None], grace: float = 10.0) -> None:
    """Wait for the drain's worker to stop; one that does not within `grace` (a helper that lost its
    cancellation) is cancelled again: the jobs it ran are recorded already."""
    done, _ = await asyncio.wait({task}, timeout=grace)
    if not done:
        log.warning("the drain's worker did not stop within %gs; cancelling it", grace,
                    extra={"event": "testing_worker_cancelled"})
        task.cancel()
        await asyncio.wait({task}, timeout=grace)
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


class DrainTimeout(FencepostError, TimeoutError):
    """drain() did not reach an idle state in time (a job that never ends, or one waiting on a delay)."""


class Clock:
    """The hot store's clock as the tests see it: `advance(s)` brings every delayed and retry-waiting run
    `s` seconds closer, as if that time had passed (the handlers' own time.time() does not move)."""

    def __init__(self, stores: Stores, queues: list[str]) -> None:
        self.stores, self.queues = stores, queues
        self.skipped = 0.0
        """Seconds advanced so far."""

    async def now_ms(self) -> int:
        return await server_now_ms(self.stores.redis)

    async def advance(self, seconds: float) -> None:
        for queue in self.queues:
            await shift_delayed(self.stores.redis, self.stores.keys(queue), int(seconds * 1000))
        self.skipped += seconds

    async def next_delayed_ms(self) -> int | None:
        """run_at (ms) of the earliest delayed or retry-waiting run, if any."""
        firsts = [await first_delayed_ms(self.stores.redis, self.stores.keys(q)) for q in self.queues]
        return min((f for f in firsts if f is not None), default=None)


_NO_APP = ("process handler, but fencepost.testing found no module holding the registry to spawn a child "
           "process from: pass app=\"pkg.mod:registry\" to Harness (with the pytest plugin: a `fencepost_app` "
           "fixture returning it)")
"""The outcome's message for a process handler under a drain without `app` (instead of the worker's --app)."""


def _has_process_handlers(registry: Registry) -> bool:
    return any(h.spec.model == "process" for h in registry.handlers.values())


def find_app(registry: Registry) -> str | None:
    """`module:attribute` of a loaded module holding `registry` as a global, for a child process to import
    (None: none; __main__ is skipped, a child cannot import it). The modules defining its handlers are tried
    first, then the others, conftest and test modules (which import it too) last. Only searched when the
    registry has a process handler: nothing else needs it."""
    if not _has_process_handlers(registry):
        return None
    loaded = dict(sys.modules)  # a snapshot: imports in other threads change it
    defining = dict.fromkeys(str(getattr(h.fn, "__module__", "")) for h in registry.handlers.values())
    late = ("conftest", "test_")
    others = sorted((n for n in loaded if n not in defining),
                    key=lambda n: (n.rpartition(".")[2].startswith(late), n.count("."), n))
    for name in [*defining, *others]:
        module = loaded.get(name)
        if name in ("__main__", "__mp_main__") or not isinstance(module, types.ModuleType):
            continue
        spec = getattr(module, "__spec__", None)
        if spec is None or spec.name != name:  # made by hand, or an alias: not what importing the name gives
            continue
        attrs = sorted((a for a, v in list(vars(module).items()) if v is registry), key=lambda a: (a[0] == "_", a))
        if attrs:
            return f"{name}:{attrs[0]}"
    return None


def _importable(top: str) -> bool:
    """Whether a fresh process with this sys.path can import the top-level name (sys.modules aside)."""
    for finder in list(sys.meta_path):
        try:
            if getattr(finder, "find_spec", None) is not None and finder.find_spec(top, None) is not None:
                return True
        except Exception:  # a third-party finder's own trouble: ask the next one
            continue
    return False


def _child_root(app: str) -> str | None:
    """The folder a child process needs on sys.path to import app's module, when the test process's sys.path
    does not reach it (pytest's --import-mode=importlib imports test modules without adding their folder):
    the folder holding the module's top-level package. None: reachable already (the usual case)."""
    name = app.partition(":")[0]
    top = name.partition(".")[0]
    file = getattr(sys.modules.get(name), "__file__", None)
    if file is None or _importable(top):
        return None
    where = Path(file).resolve()
    depth = name.count(".") + (where.name == "__init__.py")
    return str(where.parents[depth]) if depth < len(where.parents) else None


def _check_app(app: str, registry: Registry) -> str:
    """An `app` given to Harness: it must import as a Registry serving the registry's process handlers."""
    loaded = load_registry(app)  # InvalidInput (field app) when it does not import or is no Registry
    missing = sorted(n for n, h in registry.handlers.items() if h.spec.model == "process" and n not in loaded)
    if missing:
        raise InvalidInput(f"app {app!r} has no handler {missing[0]!r} of this registry", field="app")
    return app


class Harness:
    """A client on the test's stores plus `drain()`: a worker runs in this process until nothing is due
    (optionally skipping delays); each time it goes idle the recorder brings PostgreSQL up to date (so
    client.get(), events() and wait() see the outcome) and the outbox relay moves what that released
    (workflow nodes, outbox submits) to Redis, until nothing more comes."""

    def __init__(self, settings: Settings, registry: Registry, client: Client, *, app: str | None = None) -> None:
        self.settings, self.registry, self.client = settings, registry, client
        self.app = _check_app(app, registry) if app is not None else find_app(registry)
        """`module:attribute` of the registry, which the drain's worker spawns its child process from to run
        `model="process"` handlers (as `fencepost worker --app`): given, or found among the loaded modules."""
        self.queues = sorted({h.spec.queue for h in registry.handlers.values()} | {"default"})
        self.clock = Clock(client.stores, self.queues)
        self.relay = OutboxRelay(client.stores)
        """Moves released workflow nodes and committed outbox submits to Redis, as the reconciler does."""

    async def drain(self, *, skip_delays: bool = False, timeout: float = 60.0, concurrency: int = 10) -> None:
        """Run every due job to the end in-process. With skip_delays, delayed runs and retries are made
        due by advancing the clock to each in turn (time skipping), so retries run to their end too.
        `model="process"` handlers run in one child process spawned from `app` for this drain, as a worker's."""
        worker = Worker(self.registry, WorkerOptions(queues=self.queues, concurrency=concurrency, processes=1,
                                                     idle_wait_s=0.05, heartbeat_s=0.2, reap_every_s=0.5),
                        settings=self.settings, app=self.app, worker_id=f"fencepost.testing:{uuid.uuid4().hex[:6]}")
        if self.app is None:
            worker.executors.no_pool = _NO_APP
        # A spawned child starts with this process's sys.path (multiprocessing passes it): when that does not
        # reach the app's module, its folder is appended (last, shadowing nothing) while this drain's worker
        # spawns children, and taken out after.
        added = _child_root(self.app) if self.app is not None and _has_process_handlers(self.registry) else None
        if added is not None and added not in sys.path:
            sys.path.append(added)
        else:
            added = None
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + timeout
        try:
            while True:
                if task.done():
                    await task  # a worker that could not start says why
                    raise DrainTimeout("the drain's worker stopped before the queues were empty")
                if not worker.running and await self._idle(skip_delays):
                    await worker.acks.drain()
                    await self.record(timeout=max(deadline - time.monotonic(), 5.0))
                    # workflow nodes released by what just ended; and a retry the acknowledger scheduled
                    # after the idle check above is in the delayed set only now: look again before stopping
                    if not await self.relay.relay() and not worker.running and await self._idle(skip_delays):
                        break
                    continue
                if time.monotonic() > deadline:
                    raise DrainTimeout(f"jobs still due or running after {timeout:g}s")
                await asyncio.sleep(0.02)
        finally:
            worker.request_stop()
            await _stopped(task)
            if added is not None and added in sys.path:
                sys.path.remove(added)
        await self.record(timeout=max(deadline - time.monotonic(), 5.0))
        await self.relay.close()

    async def stamp(self) -> None:
        """Stamp the registry's queues in this (fresh) key prefix with PostgreSQL's epochs: a database shared
        by several tests knows the queues already, and an unstamped queue is left to a reconciler's rebuild.
        Only for a prefix nothing else uses: Redis there has nothing to lose."""
        stores = self.client.stores
        await declare_queues(stores, self.queues)
        await stamp_created(stores, {q: int(str((await require_queue(stores, q))["epoch"])) for q in self.queues})

    async def _idle(self, skip_delays: bool) -> bool:
        stores = self.client.stores
        now = await self.clock.now_ms()
        for queue in self.queues:
            if await queue_busy(stores.redis, stores.keys(queue), now):
                return False
        if skip_delays:
            first = await self.clock.next_delayed_ms()
            if first is not None:
                await self.clock.advance((first - now) / 1000)
                return False
        return True

    async def record(self, timeout: float = 30.0) -> None:
        """Write the queue streams' events to PostgreSQL (what the reconciler's recorder does)."""
        rec = Recorder(self.client.stores, consumer="fencepost.testing")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await rec.run_once(block_ms=20) == 0 and await rec.run_once(block_ms=20) == 0:
                return
        raise DrainTimeout("the recorder did not catch up in time")

    async def status(self, run_id: int) -> str:
        """The run's state (PostgreSQL's projection, up to date after drain())."""
        return str((await self.client.get(run_id))["status"])


# -- a hot store without a Redis server --------------------------------------------------------------

FAKE_REDIS_URL = "fakeredis://fencepost"
"""A Redis URL served in this process by fakeredis once use_fakeredis() ran (the pytest plugin calls it when
FENCEPOST_REDIS_URL starts with fakeredis://): every client of one URL shares one in-memory server."""
_FAKE_SERVERS: dict[str, Any] = {}


def _fencepost_info(self: Any, *sections: bytes) -> bytes:
    """INFO, which fakeredis lacks and the scripts read (`run_id` tells a restarted server from the one a
    queue was stamped on): one run_id per in-memory server, no AOF, no memory used."""
    run_id = hashlib.sha1(f"fakeredis:{id(self._server)}".encode()).hexdigest()
    return (f"# Server\r\nredis_version:7.2.0\r\nrun_id:{run_id}\r\n# Persistence\r\naof_enabled:0\r\n"
            "# Memory\r\nused_memory:0\r\n").encode()


def _fake_client(url: str, **kwargs: Any) -> fakeredis.aioredis.FakeRedis:
    server = _FAKE_SERVERS.setdefault(url, fakeredis.FakeServer())
    return fakeredis.aioredis.FakeRedis(server=server, decode_responses=bool(kwargs.get("decode_responses", False)))


def use_fakeredis() -> None:
    """Serve fakeredis:// Redis URLs from fakeredis in this process (its Lua runs the real scripts; the
    state-machine tests pass on it: tests/test_fakeredis.py): tests then need PostgreSQL but no Redis
    server. One server per URL, for the life of the process. A worker in another process cannot reach it."""
    if fakeredis is None:
        raise RuntimeError("fakeredis:// needs fakeredis with Lua: pip install 'fencepost[test]' (fakeredis[lua])")
    if "info" not in _FAKE_COMMANDS:  # a command of fakeredis: a method of its socket, its signature declared
        _FakeSocket._fencepost_info = _fake_command((), (bytes,), name="info")(_fencepost_info)  # type: ignore[attr-defined]
    if importlib.util.find_spec("lupa") is None:  # what fakeredis runs Lua with
        raise RuntimeError("fakeredis cannot run the Lua scripts without lupa: pip install 'fakeredis[lua]'")
    register_scheme("fakeredis", _fake_client)
