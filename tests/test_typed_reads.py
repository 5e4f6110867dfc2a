"""Typed reads (issue 25): the core's views (fencepost.core.views) are what Client, the API clients
and the HTTP API return; one overlay rule decides a run's live state; the recorder's silence is
measured on the Redis server's clock; Client and AsyncApiClient implement one operator protocol."""

from __future__ import annotations

import asyncio
import inspect
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
import yaml

from fencepost.api import schemas as S
from fencepost.apiclient import AsyncApiClient
from fencepost.client import Client
from fencepost.core import views
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, StoreUnavailable
from fencepost.core.hot import RunPeek
from fencepost.core.models import encode_result
from fencepost.core.stores import Stores, resolve
from fencepost.core.views import Attempt, Event, Operator, Reply, Run, RunRecord, RunSummary, overlay
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry as apps
from tests.conftest import ROOT, record_all

RECORDED = Run(id=7, handler="h", queue="tq", status="PENDING", attempt=0, version=1)


def test_overlay_takes_the_live_state_only_when_redis_is_newer() -> None:
    ran = RunPeek(state="SUCCEEDED", version=3, attempt=1, token=42, worker="w1", result=encode_result("sent"))
    live = overlay(RECORDED, ran)
    assert (live.status, live.version, live.attempt, live.token, live.lease_owner) == ("SUCCEEDED", 3, 1, 42, "w1")
    assert live.recorded_status == "PENDING" and live.result == "sent"
    assert RECORDED.status == "PENDING"  # the record itself is left as it was
    behind = overlay(msgspec.structs.replace(RECORDED, version=5), ran)
    assert (behind.status, behind.version) == ("PENDING", 5)  # PostgreSQL already has a newer transition
    assert overlay(RECORDED, None).status == "PENDING"  # hash expired after recording, or lost


def test_views_read_by_name_like_the_dicts_they_replace() -> None:
    row = RunSummary(id=1, handler="h", queue="q", status="FAILED", attempt=2, reason="review")
    assert row["status"] == "FAILED" and row.get("reason") == "review" and row.get("nope", 3) == 3
    assert dict(row)["attempt"] == 2 and "queue" in row
    with pytest.raises(KeyError):
        row["nope"]
    assert Reply("PAUSED") == "PAUSED" and Reply.REQUESTED == "REQUESTED"


def test_the_api_schemas_are_the_core_views() -> None:
    for name in ("RunSummary", "Run", "Attempt", "Event", "Checkpoint", "RunProgress", "QueueStats"):
        assert getattr(S, name) is getattr(views, name), name


def test_client_and_the_api_client_implement_the_operator_protocol() -> None:
    """Each CLI command is written once against Operator; both sides have every method, async, with
    the same parameters."""
    for name, member in inspect.getmembers(Operator, inspect.isfunction):
        if name.startswith("_"):
            continue
        want = list(inspect.signature(member).parameters)
        for cls in (Client, AsyncApiClient):
            got = getattr(cls, name, None)
            assert got is not None and inspect.iscoroutinefunction(got), (cls.__name__, name)
            params = list(inspect.signature(got).parameters)
            assert params[:len(want)] == want, (cls.__name__, name, params, want)


def test_the_silence_threshold_is_the_lag_alerts() -> None:
    rules = yaml.safe_load((ROOT / "docs" / "alerts" / "fencepost.rules.yml").read_text())
    (lag,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "FencepostRecorderLagHigh"]
    assert lag["expr"] == f"max(fencepost_recorder_lag_seconds) > {Settings().recorder_silence_s}"


def test_one_url_without_the_other_is_one_line_naming_what_to_set_where_both_are_needed(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    only_db = Settings(database_url="postgresql://x@127.0.0.1:1/x")
    assert resolve(only_db).settings is only_db  # `fencepost db upgrade` needs no Redis
    with pytest.raises(InvalidInput) as exc:
        Stores(Settings(redis_url="redis://127.0.0.1:1/0"))  # both stores needed: one line naming the other
    assert "FENCEPOST_DATABASE_URL is not set" in str(exc.value) and "\n" not in str(exc.value)
    monkeypatch.setattr("fencepost.core.embedded.available", lambda: False)
    with pytest.raises(StoreUnavailable) as missing:
        resolve(Settings())
    assert "set FENCEPOST_REDIS_URL and FENCEPOST_DATABASE_URL" in str(missing.value)


async def test_client_reads_are_typed_views(client: Client, settings: Settings, stores: Stores) -> None:
    rid = await client.submit("t.echo", 5)
    record = await client.get(rid)
    assert isinstance(record, RunRecord) and record.status == "PENDING" and record["queue"] == "tq"
    worker = Worker(apps, WorkerOptions(queues=["tq"], concurrency=4, processes=1, burst=True), settings=settings)
    await asyncio.wait_for(worker.run(), 60)
    # before the recorder: the record still says PENDING, every read shows the live state
    assert (await client.get(rid)).status == "PENDING"
    live = await client.run(rid)
    assert isinstance(live, Run) and (live.status, live.recorded_status, live.result) == ("SUCCEEDED", "PENDING", 5)
    assert live.args == [5]
    (row,) = [r for r in await client.list_runs(queue="tq") if r.id == rid]
    assert isinstance(row, RunSummary) and (row.status, row.attempt) == ("SUCCEEDED", 1)
    assert (await client.handle(rid).status()) == "SUCCEEDED"
    silence = await client.recorder_silence()
    assert silence is None  # the default threshold, the alert's 60 s, is not reached
    await asyncio.sleep(0.01)
    waiting = await views.recorder_silence(stores, threshold_s=0)
    assert waiting is not None and waiting.queue == "tq" and not waiting.recorder_seen
    assert "no recorder has ever read queue tq's transitions" in waiting.message

    await record_all(stores)
    assert await views.recorder_silence(stores, threshold_s=0) is None  # recorded: nothing waits
    attempts = await client.attempts(rid)
    assert [type(a) for a in attempts] == [Attempt] and attempts[0].outcome == "succeeded"
    events = await client.events(rid)
    assert events and all(type(e) is Event for e in events)
    since = await client.fleet_events(datetime(2000, 1, 1, tzinfo=UTC), None, "tq", 10)
    assert since and all(type(e) is Event for e in since)
    stats = {q.queue: q for q in await client.queues()}
    assert stats["tq"].due == 0 and stats["tq"].finished_last_window >= 1


async def test_control_verbs_return_a_reply(client: Client) -> None:
    rid = await client.submit("t.noop", delay=3600)
    reply = await client.command("pause", rid, reason="typed")
    assert reply is Reply.PAUSED
    assert await client.resume(rid) is Reply.PENDING
    with pytest.raises(InvalidInput):
        await client.command("explode", rid)


def test_views_module_names_no_raw_row() -> None:
    """A guard for the shape: every view the module exports is a View (readable by name)."""
    for name in views.__all__:
        obj = getattr(views, name)
        if isinstance(obj, type) and name not in ("Operator", "Reply", "View"):
            assert issubclass(obj, views.View), name
