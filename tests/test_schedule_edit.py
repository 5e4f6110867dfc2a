"""Schedules edited in place (`schedule update`, PATCH) and fired now (`schedule run-now`, POST
.../run-now), audited like every schedule change; bad input changes nothing. Result handles."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core.config import Settings
from fencepost.core.errors import IllegalTransition, InvalidInput
from fencepost.core.schedules import InvalidCron, ScheduleSpec, UnknownSchedule
from fencepost.schedules import Schedules, ScheduleUpdate
from tests.apps import registry as apps
from tests.conftest import record_all
from tests.test_api import Api
from tests.test_api import api as api
from tests.test_cli import fp

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


async def _audit(client: Client, action: str) -> list[dict[str, Any]]:
    rows = await client.stores.db.fetch("audit_list", None, None, None, None, 100, None, None)
    return [dict(r) for r in rows if r["action"] == action]


async def _setup(client: Client, name: str = "nightly", **kw: Any) -> Schedules:
    await client.register(apps)
    store = Schedules(client)
    await store.add(ScheduleSpec(name=name, handler="t.echo", args=("a",), cron="0 3 * * *", queue="tq", **kw),
                    now=T0)
    return store


async def test_update_changes_only_the_fields_given_and_is_audited(client: Client) -> None:
    store = await _setup(client)
    before = await store.get("nightly")
    after = await store.update("nightly", ScheduleUpdate(args=("b",), priority=7), now=T0, reason="new args")
    assert (after["id"], after["cron"], after["next_fire_time"]) == (before["id"], "0 3 * * *",
                                                                     before["next_fire_time"])
    assert (json.loads(after["args_json"])["args"], after["priority"]) == (["b"], 7)
    [row] = await _audit(client, "schedule_updated")
    data = json.loads(row["data"])
    assert (row["target"], row["reason"], row["queue"]) == ("nightly", "new args", "tq")
    assert data["changed"] == {"args": [["a"], ["b"]], "priority": [None, 7]}


async def test_a_new_interval_replaces_cron_and_recomputes_the_next_fire(client: Client) -> None:
    store = await _setup(client)
    later = T0 + timedelta(minutes=10)
    s = await store.update("nightly", ScheduleUpdate(interval_s=60.0), now=later)
    assert (s["cron"], s["interval_s"], s["next_fire_time"]) == (None, 60.0, later)
    s = await store.update("nightly", ScheduleUpdate(cron="30 * * * *", timezone="Europe/Paris"), now=later)
    assert (s["cron"], s["interval_s"], s["timezone"]) == ("30 * * * *", None, "Europe/Paris")
    assert s["next_fire_time"] == datetime(2026, 1, 5, 12, 30, tzinfo=UTC)


@pytest.mark.parametrize("change, error, field", [
    (ScheduleUpdate(cron="61 * * * *"), InvalidCron, None),
    (ScheduleUpdate(timezone="Mars/Olympus"), InvalidInput, None),
    (ScheduleUpdate(handler="no.such.handler"), InvalidInput, None),
    (ScheduleUpdate(interval_s=1.0, cron="* * * * *"), InvalidInput, "cron"),
    (ScheduleUpdate(), InvalidInput, "update"),
    (ScheduleUpdate(queue="bad queue!"), InvalidInput, "queue"),
])
async def test_a_bad_update_is_refused_and_changes_nothing(client: Client, change: ScheduleUpdate, error: type,
                                                           field: str | None) -> None:
    store = await _setup(client)
    before = await store.get("nightly")
    with pytest.raises(error) as e:
        await store.update("nightly", change, now=T0)
    if field is not None:
        assert e.value.field == field
    assert await store.get("nightly") == before
    assert await _audit(client, "schedule_updated") == []
    with pytest.raises(UnknownSchedule):
        await store.update("ghost", ScheduleUpdate(priority=1))


async def test_an_update_lifts_a_quarantine(client: Client) -> None:
    store = await _setup(client)
    await client.stores.db.pool.execute(  # type: ignore[union-attr]
        "UPDATE schedules SET quarantined = 'cannot fire', paused = true WHERE name = 'nightly'")
    s = await store.update("nightly", ScheduleUpdate(cron="0 4 * * *"), now=T0)
    assert (s["quarantined"], s["paused"]) == (None, False)


async def test_run_now_fires_once_without_moving_the_next_fire(client: Client) -> None:
    store = await _setup(client)
    before = await store.get("nightly")
    rid = await store.run_now("nightly", reason="backfill by hand")
    run = await client.get(rid)
    assert (run["schedule_id"], run["handler"], run["queue"], run["status"]) == (before["id"], "t.echo", "tq",
                                                                                 "PENDING")
    s = await store.get("nightly")
    assert (s["next_fire_time"], s["last_run_id"]) == (before["next_fire_time"], rid)
    assert [r["id"] for r in await store.runs("nightly")] == [rid]
    [row] = await _audit(client, "schedule_run_now")
    assert (row["target"], row["reason"], json.loads(row["data"])["run_id"]) == ("nightly", "backfill by hand", rid)
    # the previous run is still active and overlap is off: refused, nothing written
    with pytest.raises(IllegalTransition):
        await store.run_now("nightly")
    assert [r["id"] for r in await store.runs("nightly")] == [rid]
    assert len(await _audit(client, "schedule_run_now")) == 1
    await store.update("nightly", ScheduleUpdate(allow_overlap=True))
    assert await store.run_now("nightly") != rid
    with pytest.raises(UnknownSchedule):
        await store.run_now("ghost")


async def test_the_cli_updates_and_runs_now(client: Client, settings: Settings) -> None:
    store = await _setup(client)
    out = await fp(settings, "schedule", "update", "nightly", "--interval", "120", "--reason", "faster")
    assert out.code == 0 and "updated" in out.stdout, out
    assert (await store.get("nightly"))["interval_s"] == 120
    out = await fp(settings, "schedule", "update", "nightly", "--cron", "not a cron")
    assert out.code == 1 and out.stderr.startswith("error: ") and len(out.stderr.strip().splitlines()) == 1, out
    assert (await store.get("nightly"))["interval_s"] == 120
    out = await fp(settings, "schedule", "run-now", "nightly", "--reason", "now")
    assert out.code == 0 and "fired now as run" in out.stdout, out
    rid = int(out.stdout.split()[-1])
    assert (await client.get(rid))["schedule_id"] == (await store.get("nightly"))["id"]


async def test_the_api_patches_and_runs_now(api: Api) -> None:
    await _setup(api.client)
    r = await api.req("PATCH", "/v1/schedules/nightly", "admin", json={"priority": 9, "reason": "bump"})
    assert r.status_code == 200 and r.json()["priority"] == 9, r.text
    r = await api.req("PATCH", "/v1/schedules/nightly", "admin", json={"cron": "bad"})
    assert r.status_code == 422, r.text
    r = await api.req("PATCH", "/v1/schedules/nightly", "admin", json={"colour": "red"})
    assert r.status_code == 422, r.text
    r = await api.req("PATCH", "/v1/schedules/nightly", "admin", json={"queue": "other"})
    assert r.status_code == 200, r.text
    assert (await api.req("PATCH", "/v1/schedules/nightly", "op_tq", json={"priority": 1})).status_code == 403
    r = await api.req("POST", "/v1/schedules/nightly/run-now", "admin", json={"reason": "by hand"})
    assert r.status_code == 201 and r.json()["queue"] == "other", r.text
    r = await api.req("POST", "/v1/schedules/nightly/run-now", "admin")
    assert r.status_code == 409, r.text


async def test_a_result_handle_waits_and_reports_status(client: Client) -> None:
    await client.register(apps)
    rid = await client.submit("t.echo", "x")
    h = client.handle(rid)
    assert (h.id, int(h)) == (rid, rid)
    assert await h.status() == "PENDING"
    await client.cancel(rid, reason="test")
    assert await h.status() == "CANCELLED", "the live state, before the recorder records it"
    assert (await h.wait(timeout=10)).status == "CANCELLED"
    await record_all(client.stores)
    assert (await h.get())["status"] == "CANCELLED"
