"""Typed job handles (issue 16): arguments bound and validated against the handler's signature before
anything is written (InvalidInput naming the parameter), options kept apart from job parameters,
handles through submit_many, workflows and the SyncClient, arguments that no longer bind failing fast
at execution, and mypy seeing the parameters (tests/typing/handles.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio

from fencepost.client import Client, SyncClient
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.registry import Registry
from fencepost.testing import Harness
from fencepost.worker.context import Context
from fencepost.workflows import Node

ROOT = Path(__file__).resolve().parent.parent
registry = Registry()
SENT: list[tuple[str, str, Any]] = []


class Customer(msgspec.Struct):
    email: str
    vip: bool = False


@registry.job("emails.send", queue="hq", max_retries=5)
async def send(ctx: Context, to: str, template: str, *, customer: Customer | None = None) -> str:
    SENT.append((to, template, customer))
    return f"{template}->{to}"


@registry.job("jobs.delayish", queue="hq")
async def delayish(ctx: Context, delay: int, queue: str) -> int:
    """Parameters named like submit options: the handle's options() keeps them apart."""
    return delay * 2


@registry.job("jobs.count", queue="hq", model="thread")
def count(ctx: Any, *numbers: int, scale: int = 1, **labels: str) -> int:
    return sum(numbers) * scale


@pytest_asyncio.fixture
async def fp(settings: Settings) -> AsyncIterator[Harness]:
    SENT.clear()
    client = await Client(settings=settings).connect()
    await client.register(registry)
    yield Harness(settings, registry, client)
    await client.close()


async def _runs(client: Client) -> int:
    return len(await client.list_runs(queue="hq"))


async def test_the_issue_reproduction_is_refused_before_anything_is_written(fp: Harness) -> None:
    """`client.submit("emails.send", "only-one-arg")` was accepted, then retried 6 times as a transient
    failure; a client that registered the handler now refuses it, naming the missing parameter."""
    with pytest.raises(InvalidInput) as caught:
        await fp.client.submit("emails.send", "only-one-arg")
    assert caught.value.field == "template"
    with pytest.raises(InvalidInput) as caught:
        await send.submit(fp.client, "only-one-arg")  # type: ignore[call-arg]
    assert caught.value.field == "template"
    assert await _runs(fp.client) == 0


@pytest.mark.parametrize(("args", "kwargs", "field"), [
    ((1, "welcome"), {}, "to"),                                   # annotated str, got int
    (("a@example.com", "welcome", "extra"), {}, "args"),           # too many positionals
    (("a@example.com", "welcome"), {"bogus": 1}, "bogus"),         # unknown keyword
    (("a@example.com", "welcome"), {"customer": {"vip": True}}, "customer"),  # Struct missing `email`
    (("a@example.com",), {"template": None}, "template"),
])
async def test_bad_arguments_name_the_parameter_and_write_nothing(fp: Harness, args: tuple[Any, ...],
                                                                  kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        await send.submit(fp.client, *args, **kwargs)
    assert caught.value.field == field, caught.value
    with pytest.raises(InvalidInput):
        await fp.client.submit_many([send.request("ok@example.com", "welcome"),
                                     msgspec.structs.replace(send.request("ok@example.com", "x"), args=args,
                                                             kwargs=kwargs)])
    assert await _runs(fp.client) == 0  # a bad request fails its whole batch: nothing written


async def test_a_handle_submits_converts_and_runs(fp: Harness) -> None:
    run_id = await send.submit(fp.client, "a@example.com", "welcome", customer={"email": "a@example.com"})
    same_by_name = await fp.client.submit(send, "b@example.com", "welcome")
    await fp.drain()
    assert await fp.status(run_id) == "SUCCEEDED"
    assert (await fp.client.wait(run_id, timeout=10)).result == "welcome->a@example.com"
    assert await fp.status(same_by_name) == "SUCCEEDED"
    # the handler received the annotated Struct, not the dict it travelled as
    assert ("a@example.com", "welcome", Customer(email="a@example.com")) in SENT


async def test_options_do_not_collide_with_job_parameters(fp: Harness) -> None:
    run_id = await delayish.options(queue="hq", priority=3, idempotency_key="k1").submit(fp.client, 21, "not-a-queue")
    again = await delayish.options(queue="hq", priority=3, idempotency_key="k1").submit(fp.client, 21, "not-a-queue")
    assert again == run_id
    later = await send.options(delay=3600).submit(fp.client, "c@example.com", "later")
    row = await fp.client.get(later)
    assert row["run_at"] > (await fp.client.get(run_id))["run_at"]
    with pytest.raises(InvalidInput) as caught:
        send.options(dealy=60)
    assert caught.value.field == "options"
    with pytest.raises(InvalidInput) as caught:
        send.options(delay="soon")
    assert caught.value.field == "delay"
    await fp.drain()
    assert (await fp.client.wait(run_id, timeout=10)).result == 42
    assert await fp.status(later) == "PENDING"  # an hour away: drain() leaves it
    await fp.drain(skip_delays=True)
    assert await fp.status(later) == "SUCCEEDED"


async def test_handles_with_submit_many_workflows_and_varargs(fp: Harness) -> None:
    ids = await fp.client.submit_many([send.request("d@example.com", "a"), count.request(1, 2, 3, scale=2, tag="x"),
                                       count.options(priority=1).request()])
    with pytest.raises(InvalidInput) as caught:
        count.request(1, "two")  # type: ignore[arg-type]
    assert caught.value.field == "numbers"
    with pytest.raises(InvalidInput) as caught:
        count.request(1, tag=2)  # type: ignore[arg-type]
    assert caught.value.field == "labels"
    wf = await fp.client.submit_workflow([
        Node.of("first", send.request("e@example.com", "first")),
        Node.of("second", count.request(4, 5), depends_on=["first"]),
    ])
    await fp.drain()
    results = [(await fp.client.wait(i, timeout=10)).result for i in ids]
    assert results == ["a->d@example.com", 12, 0]
    nodes = (await fp.client.workflow(wf))["nodes"]
    assert {n["name"]: n["status"] for n in nodes} == {"first": "SUCCEEDED", "second": "SUCCEEDED"}


async def test_sync_client_submits_a_handle(fp: Harness, settings: Settings) -> None:
    def produce() -> int:
        with SyncClient(settings=settings) as sync:
            with pytest.raises(InvalidInput):
                send.submit_sync(sync, 1, "x")  # type: ignore[arg-type]
            return send.submit_sync(sync, "f@example.com", "sync")

    run_id = await asyncio.to_thread(produce)
    await fp.drain()
    assert (await fp.client.wait(run_id, timeout=10)).result == "sync->f@example.com"


async def test_arguments_that_no_longer_bind_fail_fast_at_execution(fp: Harness, settings: Settings) -> None:
    """A producer that does not know the handler (an older version, another service) submits by name;
    the worker finds the arguments do not bind: one attempt, FAILED as invalid input, no retries."""
    async with Client(settings=settings) as blind:  # never registered the registry
        with pytest.raises(InvalidInput, match="template"):  # the stored signature refuses it at submit (issue 24)
            await blind.submit("emails.send", "only-one-arg")
        await blind._load_definitions({"emails.send"})  # a producer that does not know the signature (older)
        blind._defs["emails.send"] = msgspec.structs.replace(blind._defs["emails.send"], params=None)
        run_id = await blind.submit("emails.send", "only-one-arg")
        typed = await blind.submit("emails.send", "a@example.com", "t", kwargs={"customer": {"vip": "yes"}})
    await fp.drain()  # no skip_delays: a retried run would still be waiting
    for rid in (run_id, typed):
        row = await fp.client.get(rid)
        assert row["status"] == "FAILED", row
        assert row["last_error_class"] == "InvalidInput"
        assert len(await fp.client.attempts(rid)) == 1
    assert "template" in (await fp.client.get(run_id))["last_error"]


def test_mypy_sees_the_handle_parameters(tmp_path: Path) -> None:
    """tests/typing/handles.py is checked with the project's strict mypy configuration: its correct calls
    pass and each wrong call carries a `type: ignore[code]` that would be reported unused (an error) if
    mypy did not see the parameters through the handle."""
    tree = tmp_path / "tree" / "fencepost"
    tree.mkdir(parents=True)
    for entry in (ROOT / "scheduler").iterdir():
        if entry.name not in ("__pycache__",):
            (tree / entry.name).symlink_to(entry)
    (tree / "worker").symlink_to(ROOT / "worker")
    (tree / "reconciler").symlink_to(ROOT / "reconciler")
    env = dict(os.environ, MYPYPATH=str(tree.parent))
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent",
                           str(ROOT / "tests" / "typing" / "handles.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
