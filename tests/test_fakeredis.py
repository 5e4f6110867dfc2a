"""Server-free tests (issue 16): fakeredis, with its Lua support, can be the hot store of fencepost.testing
(FENCEPOST_REDIS_URL=fakeredis://...), so a user's tests need PostgreSQL but no Redis server. The proof
that the scripts behave identically there: the state-machine tests of tests/test_state_machine.py (every
guarded triple, the Hypothesis queue machine, every computed edge from every state) run unchanged against
fakeredis; then the harness's drain, clock, retries, workflows and batches on it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import fakeredis
import msgspec
import pytest
import pytest_asyncio
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis.stateful import run_state_machine_as_test

import tests.test_state_machine as sm
from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.hot import SCRIPT_NAMES, render
from fencepost.core.models import Submit
from fencepost.core.states import ACTIVE, Status
from fencepost.core.stores import Stores
from fencepost.testing import Harness, use_fakeredis
from fencepost.workflows import Node
from tests.test_testing import batch, flaky, node, registry

use_fakeredis()


def _url() -> str:
    return f"fakeredis://{uuid.uuid4().hex[:8]}"  # a server of its own


@pytest.fixture
def fake_stores(settings: Settings) -> Iterator[Stores]:
    """Stores whose Redis is a fresh fakeredis server (through the fakeredis:// scheme, as the plugin uses it)."""
    yield Stores(msgspec.structs.replace(settings, redis_url=_url()))


# -- the state machine on fakeredis --------------------------------------------------------------------
async def test_every_triple_through_the_lua_guard(fake_stores: Stores) -> None:
    await sm.test_every_triple_through_the_lua_guard(fake_stores)


class FakeQueueMachine(sm.QueueMachine):
    """tests/test_state_machine.py's queue machine, its scripts run by fakeredis."""

    def __init__(self) -> None:
        super().__init__()
        self.r = fakeredis.FakeRedis(decode_responses=True)
        self.s = {name: self.r.register_script(render(name)) for name in SCRIPT_NAMES}


def test_random_operations_keep_the_state_machine() -> None:
    run_state_machine_as_test(FakeQueueMachine, settings=hsettings(
        max_examples=150, stateful_step_count=30, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


@pytest.mark.parametrize("name", sorted(sm.CONTROL_SCRIPTS))
async def test_control_script_from_every_state(fake_stores: Stores, name: str) -> None:
    await sm.test_control_script_from_every_state(fake_stores, name)


@pytest.mark.parametrize("state", sorted(ACTIVE))
async def test_finish_reap_and_escalate_from_active_states(fake_stores: Stores, state: Status) -> None:
    await sm.test_finish_from_active_states(fake_stores, state)
    await sm.test_reap_and_escalate_from_active_states(Stores(msgspec.structs.replace(fake_stores.settings,
                                                                                       redis_url=_url())), state)


async def test_release_from_every_state(fake_stores: Stores) -> None:
    await sm.test_release_from_every_state(fake_stores)


# -- the harness on fakeredis ----------------------------------------------------------------------------
@pytest_asyncio.fixture
async def fp(settings: Settings) -> AsyncIterator[Harness]:
    fake = msgspec.structs.replace(settings, redis_url=_url())
    client = await Client(settings=fake).connect()
    await client.register(registry)
    harness = Harness(fake, registry, client)
    await harness.stamp()
    yield harness
    await client.close()


async def test_drain_retries_clock_workflows_and_batches_without_a_redis_server(fp: Harness) -> None:
    retried = await flaky.submit(fp.client, 2)
    later = await batch.options(delay=3600).submit(fp.client, ["x"])
    wid = await fp.client.submit_workflow([Node.of("up", flaky.request(0)),
                                           Node.of("down", node.request(10), depends_on=["up"])])
    b = await fp.client.submit_batch([flaky.request(0), flaky.request(0)],
                                     on_complete=Submit(handler="t.batch", args=(["done"],)))
    await fp.drain(skip_delays=False)
    assert await fp.status(later) == "PENDING"
    await fp.drain(skip_delays=True)  # the retries' backoffs skipped; the delayed run too
    out = await fp.client.wait(retried, timeout=10)
    assert (out.status, out.result) == ("SUCCEEDED", 3)
    assert [a["attempt"] for a in await fp.client.attempts(retried)] == [1, 2, 3]
    assert await fp.status(later) == "SUCCEEDED"
    down = next(n["id"] for n in (await fp.client.workflow(wid))["nodes"] if n["name"] == "down")
    assert (await fp.client.wait(down, timeout=10)).result == 10  # its upstream's result (1) times 10
    assert b.on_complete is not None and (await fp.client.wait(b.on_complete, timeout=10)).result == 1
