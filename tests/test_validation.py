"""Validation at every boundary, once (issue 13): one table of typed constraints
(fencepost.core.validate) used by the client, the CLI, the API schemas and schedule definitions.
Every hostile value of the issue is a typed InvalidInput naming the field, one line on the CLI,
a 422 on the API, and nothing written; a hypothesis test fuzzes all three faces and then checks
that the trigger and the reconciler still work."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fencepost.api import ApiConfig
from fencepost.api import schemas as S
from fencepost.cli.main import cli
from fencepost.client import Client
from fencepost.core import fairness, validate
from fencepost.core.config import Settings
from fencepost.core.errors import InvalidInput
from fencepost.core.schedules import ScheduleSpec, validated
from fencepost.core.stores import Stores
from fencepost.reconciler.drift import DriftRepair
from fencepost.schedules import Schedules
from fencepost.trigger import ManualClock, Trigger
from tests.apps import registry
from tests.conftest import ROOT, worker_env
from tests.test_api import Api, _make_api

HOSTILE_NUMBERS: list[Any] = [math.inf, -math.inf, math.nan, 1e308, -1e308, 2**31, 2**63, -1, 1.5, "5", True, []]
HOSTILE_TEXT: list[Any] = ["", "a\x00b", "a\udcffb", "x" * 10_000, "\x1b[31mred\x1b[0m", "a\nb", "a\u202eb",
                           "\u200b", "a\x7fb", 5, b"bytes"]


async def _rows(stores: Stores) -> int:
    return await stores.db.pool.fetchval("SELECT count(*) FROM runs")  # type: ignore[union-attr]


async def _schedules(stores: Stores) -> int:
    return await stores.db.pool.fetchval("SELECT count(*) FROM schedules")  # type: ignore[union-attr]


# -- the table ----------------------------------------------------------------------------------
@pytest.mark.parametrize("field", sorted(validate.LIMITS))
def test_every_field_refuses_what_no_store_can_hold(field: str) -> None:
    lim = validate.LIMITS[field]
    if lim.kind in ("int", "float"):
        bad: list[Any] = [math.inf, -math.inf, math.nan, 1e308, -1e308, 2**63, "5", True, [], None]
        bad += [1.5] if lim.kind == "int" else []
    else:
        bad = ["a\x00b", "a\udcffb", "x" * 10_000, "\x1b[31mred", "a\nb", "a\u202eb", "\u200b", "a\x7fb", 5, b"b"]
        bad += [""] if lim.min_len else []
        bad += ["a b", "a{b}"] if lim.kind == "label" else []
    for v in bad:
        with pytest.raises(InvalidInput) as ei:
            validate.check(field, v)
        assert ei.value.field == field, (field, v)


def test_the_api_schema_is_generated_from_the_table() -> None:
    """A value the API accepts is one the client accepts, and the ranges are the same numbers."""
    for field, attr in (("priority", "priority"), ("timeout", "timeout"), ("delay", "delay"),
                        ("max_retries", "max_retries"), ("tenant", "tenant"), ("idempotency_key", "idempotency_key"),
                        ("concurrency_limit", "concurrency_limit"), ("concurrency_key", "concurrency_key")):
        lim = validate.LIMITS[field]
        base = {"handler": "t.echo"}
        if lim.kind in ("int", "float"):
            step = 1 if lim.kind == "int" else 0.5
            msgspec.convert({**base, attr: lim.hi}, S.SubmitRequest)
            with pytest.raises(msgspec.ValidationError):
                msgspec.convert({**base, attr: lim.hi + step}, S.SubmitRequest)
        else:
            msgspec.convert({**base, attr: "x" * lim.max_len}, S.SubmitRequest)
            for bad in ("x" * (lim.max_len + 1), "a\x1bb"):
                with pytest.raises(msgspec.ValidationError):
                    msgspec.convert({**base, attr: bad}, S.SubmitRequest)
    for v in ("1e999", "1e-9"):  # JSON 1e999 decodes to inf
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(f'{{"name": "s", "handler": "h", "interval_s": {v}}}'.encode(), type=ScheduleSpec)


# -- the reproductions of the issue, through the client ---------------------------------------------
@pytest.mark.parametrize(("opts", "field"), [
    ({"timeout": math.inf}, "timeout"),
    ({"timeout": math.nan}, "timeout"),
    ({"delay": math.nan}, "delay"),
    ({"delay": math.inf}, "delay"),
    ({"delay": 1e308}, "delay"),
    ({"priority": 1.5}, "priority"),
    ({"priority": "5"}, "priority"),
    ({"max_retries": 2**31}, "max_retries"),
    ({"idempotency_key": "k" * 10_000}, "idempotency_key"),
    ({"tenant": "acme\x00"}, "tenant"),
    ({"tenant": "acme\udcff"}, "tenant"),  # a non-UTF-8 byte read with surrogateescape
    ({"concurrency_key": "k\x00", "concurrency_limit": 2}, "concurrency_key"),
    ({"tenant": "\x1b]0;pwned\x07"}, "tenant"),
    ({"idempotency_key": "order\x1b[2J"}, "idempotency_key"),
    ({"queue": "tq\n"}, "queue"),
    ({"rate_key": "k", "rate_limit": "5/2"}, "rate_limit"),  # the stores' form (5 per 2 ms): a caller names the unit
])
async def test_client_refuses_each_hostile_value_and_writes_nothing(client: Client, opts: dict[str, Any],
                                                                    field: str) -> None:
    with pytest.raises(InvalidInput) as ei:
        await client.submit("t.echo", 1, **opts)
    assert ei.value.field == field, ei.value
    assert await _rows(client.stores) == 0


@pytest.mark.parametrize(("spec", "field"), [
    ({"interval_s": math.inf}, "interval_s"),
    ({"interval_s": 1e-9}, "interval_s"),
    ({"cron": "0 0 30 2 *"}, "cron"),
    ({"interval_s": 60, "name": "nightly\x1b[8m"}, "name"),
    ({"interval_s": 60, "spread_s": math.nan}, "spread_s"),
    ({"interval_s": 60, "catchup_window_s": math.inf}, "catchup_window_s"),
    ({"interval_s": 60, "priority": 2.5}, "priority"),
])
async def test_schedule_definitions_refuse_each_hostile_value(client: Client, spec: dict[str, Any], field: str) -> None:
    full = {"name": "s", "handler": "t.noop", **spec}
    with pytest.raises(InvalidInput) as ei:
        await Schedules(client).add(ScheduleSpec(**full))
    assert ei.value.field == field, ei.value
    assert await _schedules(client.stores) == 0


# -- the CLI: one line, exit 1, nothing written ---------------------------------------------------
async def _cli(settings: Settings, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "fencepost.cli", *args, cwd=ROOT,
                                                env=worker_env(settings), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


@pytest.mark.parametrize("args", [
    ("submit", "t.echo", "--timeout", "inf"),
    ("submit", "t.echo", "--delay", "nan"),
    ("submit", "t.echo", "--delay", "1e308"),
    ("submit", "t.echo", "--priority", "1.5"),
    ("submit", "t.echo", "--max-retries", "2147483648"),
    ("submit", "t.echo", "--tenant", "a\x1b[31m"),
    ("submit", "t.echo", "--idempotency-key", "k" * 10_000),
    ("schedule", "add", "s", "--handler", "t.noop", "--interval", "inf"),
    ("schedule", "add", "s", "--handler", "t.noop", "--interval", "1e-9"),
    ("schedule", "add", "s", "--handler", "t.noop", "--cron", "0 0 30 2 *"),
    ("schedule", "add", "s\x1b[2J", "--handler", "t.noop", "--interval", "60"),
])
async def test_cli_refuses_with_one_line_and_writes_nothing(client: Client, settings: Settings,
                                                            args: tuple[str, ...]) -> None:
    code, out, err = await _cli(settings, *args)
    assert code == 1, (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "\x1b" not in err, "the refused value was echoed raw to the terminal"
    assert await _rows(client.stores) == 0 and await _schedules(client.stores) == 0


# -- the API: 422, problem+json, nothing written ----------------------------------------------------
@pytest.fixture
async def api(settings: Settings, client: Client) -> AsyncIterator[Api]:
    async for a in _make_api(settings, client, ApiConfig(token_cache_s=0, rate_limit=0, max_body_bytes=64 * 1024,
                                                         max_batch=50, bulk_cap=20)):
        yield a


async def _post(api: Api, path: str, raw: str) -> httpx.Response:
    return await api.req("POST", path, "admin", content=raw.encode("utf-8", "surrogatepass"),
                         headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(("raw", "field"), [
    ('{"handler": "t.echo", "timeout": 1e999}', "timeout"),
    ('{"handler": "t.echo", "delay": 1e308}', "delay"),
    ('{"handler": "t.echo", "priority": 1.5}', "priority"),
    ('{"handler": "t.echo", "priority": "5"}', "priority"),
    ('{"handler": "t.echo", "max_retries": 2147483648}', "max_retries"),
    ('{"handler": "t.echo", "tenant": "a\\u0000"}', "tenant"),
    ('{"handler": "t.echo", "tenant": "a\\u001b[31m"}', "tenant"),
    ('{"handler": "t.echo", "idempotency_key": "' + "k" * 10_000 + '"}', "idempotency_key"),
])
async def test_api_submit_refuses_with_422_and_writes_nothing(api: Api, client: Client, raw: str, field: str) -> None:
    r = await _post(api, "/v1/runs", raw)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json") and r.json().get("field") == field, r.text
    assert await _rows(client.stores) == 0


async def test_api_refuses_a_lone_surrogate_as_malformed_json(api: Api, client: Client) -> None:
    r = await _post(api, "/v1/runs", '{"handler": "t.echo", "tenant": "a\\udcff"}')
    assert r.status_code == 400 and r.json()["type"].endswith("malformed-body"), r.text
    assert await _rows(client.stores) == 0


@pytest.mark.parametrize(("body", "field"), [
    ('{"name": "s", "handler": "t.noop", "interval_s": 1e999}', "interval_s"),
    ('{"name": "s", "handler": "t.noop", "interval_s": 1e-9}', "interval_s"),
    ('{"name": "s", "handler": "t.noop", "cron": "0 0 30 2 *"}', "cron"),
    ('{"name": "s\\u001b", "handler": "t.noop", "interval_s": 60}', "name"),
])
async def test_api_schedule_add_refuses_with_422(api: Api, client: Client, body: str, field: str) -> None:
    r = await _post(api, "/v1/schedules", body)
    assert r.status_code == 422 and r.json().get("field") == field, r.text
    assert await _schedules(client.stores) == 0


# -- the fuzz: client, CLI and API with hostile values; then the service loops still work ----------
_numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-2**70, max_value=2**70),
                     st.sampled_from(HOSTILE_NUMBERS), st.text(max_size=5), st.booleans())
_texts = st.one_of(st.text(min_size=0, max_size=300), st.sampled_from(HOSTILE_TEXT),
                   st.text(alphabet=st.characters(codec=None, categories=("Cc", "Cf", "Cs", "Zl", "Zp")), min_size=1))
_fields = st.sampled_from(["priority", "delay", "timeout", "max_retries", "idempotency_key", "tenant",
                           "concurrency_key", "concurrency_limit", "queue"])


def _hostile(field: str, draw_num: Any, draw_text: Any) -> Any:
    return draw_num if field in ("priority", "delay", "timeout", "max_retries", "concurrency_limit") else draw_text


@hsettings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=_fields, num=_numbers, text=_texts)
async def test_fuzz_client_and_api(api: Api, client: Client, field: str, num: Any, text: Any) -> None:
    value = _hostile(field, num, text)
    opts = {field: value}
    if field == "concurrency_key":
        opts["concurrency_limit"] = 2
    try:
        await client.submit("t.echo", 1, **opts)
    except InvalidInput as exc:
        assert exc.field in (field, "concurrency_limit", "queue"), exc
    else:  # accepted: it must be a value every store holds and the table allows
        pass
    try:
        body = json.dumps({"handler": "t.echo", **opts}, allow_nan=True)
    except (TypeError, ValueError):
        return
    r = await api.req("POST", "/v1/runs", "admin", content=body.encode("utf-8", "surrogatepass"),
                      headers={"Content-Type": "application/json"})
    assert r.status_code < 500, r.text


async def test_fuzzed_and_refused_values_leave_the_services_working(client: Client, stores: Stores) -> None:
    """After the hostile values above (none written), a good submit and schedule work, the trigger
    fires and drift repair finds nothing wrong."""
    for field in ("priority", "delay", "timeout", "max_retries"):
        for v in HOSTILE_NUMBERS:
            try:
                await client.submit("t.echo", 1, **{field: v})
            except InvalidInput:
                pass
    accepted = await _rows(stores)
    rid = await client.submit("t.echo", 1, timeout=30, delay=0, priority=5)
    assert (await client.get(rid))["status"] == "PENDING"
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    await Schedules(client).add(ScheduleSpec(name="ok", handler="t.noop", interval_s=60), now=t0)
    res = await Trigger(stores, clock=ManualClock(t0 + timedelta(seconds=1)), use_lease=False).tick()
    assert res.created == 1
    assert [d for d in await DriftRepair(stores, grace_s=0.0).tick("tq", repair=False) if d.kind != "unqueued"] == []
    assert accepted == 2, "only the in-range values (timeout and delay of 1.5 s) are written"


def test_validated_is_the_same_rule_for_specs_built_in_python() -> None:
    with pytest.raises(InvalidInput) as ei:
        validated(ScheduleSpec(name="x", handler="h", interval_s=math.inf))
    assert ei.value.field == "interval_s"


_cli_values = st.one_of(st.sampled_from(["inf", "-inf", "nan", "1e308", "1.5", "2147483648", "-1", "0x10", "", " "]),
                        st.floats().map(repr), st.integers(min_value=-2**40, max_value=2**40).map(str),
                        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40))
_cli_options = st.sampled_from(["--priority", "--delay", "--timeout", "--max-retries", "--tenant", "--idempotency-key",
                                "--concurrency-limit"])


def test_fuzz_cli(settings: Settings) -> None:
    """The CLI in-process (click's runner): hostile option values end in exit 1 (`error: ...`) or 2
    (not a number at all), never a traceback; whatever was accepted and written is in range."""
    async def register() -> None:
        async with Client(settings=settings) as c:
            await c.register(registry)

    asyncio.run(register())
    runner = CliRunner()
    env = worker_env(settings)

    @hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(option=_cli_options, value=_cli_values)
    def one(option: str, value: str) -> None:
        res = runner.invoke(cli, ["submit", "t.echo", option, value], env=env)
        assert res.exit_code in (0, 1, 2), (option, value, res.output, res.exception)
        assert res.exception is None or isinstance(res.exception, SystemExit), (option, value, res.exception)
        assert "Traceback" not in res.output

    one()

    async def written() -> list[Any]:
        async with Client(settings=settings) as c:
            return await c.stores.db.pool.fetch(  # type: ignore[union-attr]
                "SELECT priority, timeout_s, max_retries, tenant, idempotency_key, concurrency_limit FROM runs")

    for r in asyncio.run(written()):
        validate.integer("priority", r["priority"])
        validate.number("timeout", r["timeout_s"])
        validate.integer("max_retries", r["max_retries"])
        if r["tenant"]:
            validate.label("tenant", r["tenant"])
        if r["idempotency_key"] is not None:
            validate.text("idempotency_key", r["idempotency_key"])


async def test_next_fires_of_a_stored_bad_schedule_is_4xx_not_500(api: Api, client: Client, settings: Settings) -> None:
    """Issue 13 item 2: `GET /v1/schedules/{name}/next` answered 500 for an interval of infinity."""
    r = await _post(api, "/v1/schedules", '{"name": "s", "handler": "t.noop", "interval_s": 60}')
    assert r.status_code == 201, r.text
    conn = await asyncpg.connect(settings.database_url)
    try:  # what an older version stored (the new CHECK is NOT VALID for old rows)
        await conn.execute("ALTER TABLE schedules DROP CONSTRAINT schedules_interval_bounded")
        await conn.execute("UPDATE schedules SET interval_s = 'Infinity' WHERE name = 's'")
    finally:
        await conn.close()
    r = await api.req("GET", "/v1/schedules/s/next?n=3", "admin")
    assert r.status_code == 422 and r.json()["field"] == "interval_s", r.text


@pytest.mark.parametrize(("tenant", "key"), [("acme\x1b[2J", "ok"), ("acme", "k\x85ey"), ("a\u200bb", "ok")])
async def test_dispatch_settings_refuse_control_characters_from_python_too(client: Client, stores: Stores,
                                                                          tenant: str, key: str) -> None:
    """The client/CLI path of dispatch settings checks tenants and keys with the same table as the API."""
    await client.submit("t.noop", queue="tq")  # the queue exists
    before = await fairness.describe(stores, "tq")
    with pytest.raises(InvalidInput) as exc:
        if tenant != "acme":
            await fairness.set_weight(stores, "tq", tenant, 2.0)
        else:
            await fairness.set_limit(stores, "tq", key, 3)
    assert exc.value.field in ("tenant", "concurrency_key")
    assert await fairness.describe(stores, "tq") == before


# -- the environment is a boundary too ---------------------------------------------------------------
@pytest.mark.parametrize(("var", "value"), [
    ("FENCEPOST_LEASE_MS", "-1"), ("FENCEPOST_LEASE_MS", "inf"), ("FENCEPOST_RETRY_BUDGET_RATIO", "nan"),
    ("FENCEPOST_CLAIM_WAIT_MS", "abc"), ("FENCEPOST_MAX_PAYLOAD_BYTES", "0"), ("FENCEPOST_REDIS_CLUSTER", "maybe"),
    ("FENCEPOST_API_RATE_LIMIT", "-3"), ("FENCEPOST_API_TOKEN_CACHE_S", "inf"),
])
def test_a_setting_out_of_range_is_refused_naming_the_variable(var: str, value: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(var, value)
    cls = ApiConfig if var.startswith("FENCEPOST_API_") else Settings
    with pytest.raises(InvalidInput) as ei:
        cls.from_env()
    assert ei.value.field == var and var in str(ei.value) and repr(value) in str(ei.value)


def test_the_cli_says_which_variable_is_wrong_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "FENCEPOST_LEASE_MS": "-4"}
    out = subprocess.run([sys.executable, "-m", "fencepost", "queue", "list"], env=env, capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip() == "error: FENCEPOST_LEASE_MS must be a whole number >= 10, not '-4'"
