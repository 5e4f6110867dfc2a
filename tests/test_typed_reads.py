"""Typed reads (issue 25): the core's views (fencepost.core.views) are what Client, the API clients
and the HTTP API return; one overlay rule decides a run's live state; the recorder's silence is
measured on the Redis server's clock; Client and AsyncApiClient implement one operator protocol."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec
import pytest
import yaml

from fencepost.api import ApiConfig
from fencepost.api import schemas as S
from fencepost.apiclient import AsyncApiClient
from fencepost.client import Client
from fencepost.core import views
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput, StoreUnavailable
from fencepost.core.hot import RunPeek
from fencepost.core.models import Submit, encode_result
from fencepost.core.schedules import ScheduleSpec
from fencepost.core.stores import Stores, resolve
from fencepost.core.views import (
    Attempt,
    Event,
    Operator,
    Reply,
    Run,
    RunRecord,
    RunSummary,
    Schedule,
    ScheduleRun,
    overlay,
)
from fencepost.worker.runtime import Worker, WorkerOptions
from tests.apps import registry as apps
from tests.conftest import ROOT, record_all
from tests.test_api import _make_api

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


# -- schedules, batches and bulk results: typed from the stores and over HTTP alike (issue 25) -------------
@pytest.fixture
async def over_http(settings: Settings, client: Client) -> AsyncIterator[AsyncApiClient]:
    """The API client (admin) of an in-process API on the same stores as `client`."""
    async for api in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0)):
        transport = httpx.ASGITransport(app=api.app, client=("203.0.113.7", 4242))
        async with AsyncApiClient("http://api", api.tokens["admin"][1], transport=transport) as op:
            yield op


async def test_schedule_reads_are_one_struct_from_the_stores_and_over_http(client: Client,
                                                                           over_http: AsyncApiClient) -> None:
    await client.register(apps)
    spec = ScheduleSpec(name="nightly", handler="t.echo", args=("a",), kwargs={"k": 1}, cron="0 3 * * *", queue="tq")
    added = await client.add_schedule(spec)
    assert type(added) is Schedule and added.args_json == {"args": ["a"], "kwargs": {"k": 1}}
    assert added["name"] == "nightly" and added.get("quarantined") is None  # still readable by name
    over = await over_http.add_schedule(msgspec.structs.replace(spec, name="hourly", cron="0 * * * *"))
    assert type(over) is Schedule and over.args_json == added.args_json

    for name in ("nightly", "hourly"):  # the same schedule read both ways: equal, field by field
        direct, api = await client.schedule(name), await over_http.schedule(name)
        assert type(direct) is type(api) is Schedule and direct == api, (direct, api)
    listed, listed_api = await client.schedules(), await over_http.schedules()
    assert [type(s) for s in listed] == [Schedule] * 2 and listed == listed_api, (listed, listed_api)

    edited = await client.update_schedule("nightly", {"priority": 7}, reason="typed")
    edited_api = await over_http.update_schedule("hourly", {"priority": 7}, reason="typed")
    assert type(edited) is type(edited_api) is Schedule and edited.priority == edited_api.priority == 7
    assert edited == await over_http.schedule("nightly") and edited_api == await client.schedule("hourly")

    rid = await client.run_schedule_now("nightly", reason="typed")
    runs, runs_api = await client.schedule_runs("nightly"), await over_http.schedule_runs("nightly")
    assert [type(r) for r in runs] == [ScheduleRun] and runs == runs_api, (runs, runs_api)
    assert (runs[0].id, runs[0].queue, runs[0]["status"]) == (rid, "tq", "PENDING")


async def test_a_bulk_confirm_is_one_struct_from_the_stores_and_over_http(client: Client, stores: Stores,
                                                                          over_http: AsyncApiClient) -> None:
    results = []
    for op in (client, over_http):
        ids = [await client.submit("t.noop", delay=3600) for _ in range(2)]
        await record_all(stores)
        count = await op.bulk_count("pause", queue="tq", status="PENDING")
        assert count.acting == 2, count
        out = await op.bulk_confirm(count, reason="typed")
        assert type(out) is views.BulkResult, (op, out)
        assert (out.matched, out.acted, out.changed, out.results, out.skipped, out.refused) == (
            2, 2, ids, {"PAUSED": 2}, [], {}), out
        assert out["acted"] == 2  # still readable by name
        results.append(out)
    direct, api = results
    assert direct.__struct_fields__ == api.__struct_fields__


async def test_a_batch_record_is_typed(client: Client, over_http: AsyncApiClient) -> None:
    """`Client.batch` (the record: members and callback ids; the API has no such page) and `batch_view`
    (counted: the API's GET /v1/batches/{id}, read both ways)."""
    b = await client.submit_batch([Submit(handler="t.noop"), Submit(handler="t.noop")],
                                  on_complete=Submit(handler="t.noop"))
    record = await client.batch(b.id)
    assert type(record) is views.BatchRecord and [type(m) for m in record.members] == [views.BatchMember] * 2
    assert [m.run_id for m in record.members] == b.run_ids and record.on_complete == b.on_complete
    assert record["settled_at"] is None and [m["status"] for m in record["members"]] == ["PENDING"] * 2
    shown, shown_api = await client.batch_view(b.id), await over_http.batch_view(str(b.id))
    assert type(shown) is type(shown_api) is views.Batch and shown == shown_api, (shown, shown_api)


def test_the_api_schemas_of_schedules_and_bulk_results_are_the_core_views() -> None:
    for name in ("Schedule", "ScheduleRun", "BulkResult", "BulkSkip"):
        assert getattr(S, name) is getattr(views, name), name
