"""Checked by mypy (tests/test_handles.py::test_mypy_sees_the_handle_parameters), never imported by pytest:
correct uses of a typed handle pass; each wrong one carries the ignore mypy must need (strict mode reports
an unused ignore, so a handle that lost its parameters fails the check)."""

from __future__ import annotations

from typing import Any

from fencepost.client import Client, SyncClient
from fencepost.core.models import Submit
from fencepost.core.registry import Handler, Registry
from fencepost.worker.context import Context

registry = Registry()


@registry.job("emails.send")
async def send(ctx: Context, to: str, template: str, *, retries: int = 0) -> str:
    return to


async def produce(client: Client, sync: SyncClient) -> None:
    handle: Handler[..., Any] = send  # the handle is a Handler, its parameters kept
    print(handle.name)
    run_id: int = await send.submit(client, "a@example.com", "welcome")
    run_id = await send.options(delay=60).submit(client, "a@example.com", "welcome", retries=2)
    run_id = send.submit_sync(sync, "a@example.com", "welcome")
    req: Submit = send.request("a@example.com", "welcome")
    print(run_id, req)

    await send.submit(client, "a@example.com")  # type: ignore[call-arg]
    await send.submit(client, 1, "welcome")  # type: ignore[arg-type]
    await send.submit(client, "a@example.com", "welcome", retries="2")  # type: ignore[arg-type]
    await send.submit(client, "a@example.com", "welcome", bogus=1)  # type: ignore[call-arg]
    send.request("a@example.com")  # type: ignore[call-arg]
    send.submit_sync(client, "a@example.com", "welcome")  # type: ignore[arg-type]
