"""Compensation runs go through the one submit path (issue 25): the recorder submits a cancelled
run's compensation with SubmitPath's checks, in its own transaction, not with an INSERT of its own."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from prometheus_client import REGISTRY

from fencepost.client import Client
from fencepost.core.errors import InvalidInput
from fencepost.core.hot import ClaimArgs, Finish, FinishArgs
from fencepost.core.models import Submit, encode_payload
from fencepost.core.registry import Registry
from fencepost.core.stores import Stores
from fencepost.core.submit import SubmitPath
from tests.conftest import ROOT, record_all
from tests.test_layers import INSERT_STATEMENTS

registry = Registry()


@registry.job("comp.effects", queue="tq", side_effects=True, compensate="comp.undo", timeout=300)
async def effects(ctx) -> None:
    """Never run here: the test claims and finishes its runs with the scripts."""


@registry.job("comp.undo", queue="tq")
async def undo(ctx, cancelled_run: int) -> int:
    return cancelled_run


@registry.job("comp.effects_badly_undone", queue="tq", side_effects=True, compensate="comp.bad_undo", timeout=300)
async def effects_badly_undone(ctx) -> None:
    """Its compensation cannot take the cancelled run's id alone."""


@registry.job("comp.bad_undo", queue="tq")
async def bad_undo(ctx, cancelled_run: int, second: int) -> int:
    return cancelled_run + second


@pytest.fixture
def client_registry() -> Registry:
    return registry


async def _sql(stores: Stores, query: str, *args: Any) -> list[Any]:
    return await stores.db.pool.fetch(query, *args)  # type: ignore[no-any-return, union-attr]


def _refused() -> float:
    return REGISTRY.get_sample_value("fencepost_quarantined_total", {"loop": "recorder", "kind": "compensation"}) or 0.0


async def _cancel_after_start(client: Client, stores: Stores, handler: str) -> int:
    """A run of HANDLER claimed, cancelled while running, and let go by its (scripted) worker: the
    finish carries the compensation to run; then recorded."""
    rid = await client.submit(handler)
    keys = stores.keys("tq")
    (job,) = await stores.scripts.claim_due(keys, ClaimArgs(10, "w", 60_000, 10))
    assert job.id == rid
    assert await client.cancel(rid, reason="wrong customer") == "STOPPING"
    done = await stores.scripts.finish_runs(keys, FinishArgs(3), [Finish(rid, job.token, "interrupted", "", "", 0)])
    assert [d.state for d in done] == ["CANCELLED"]
    await record_all(stores)
    return rid


def test_only_the_submit_paths_statements_insert_runs() -> None:
    """Every named query that inserts into `runs` is one of the submit path's (test_layers'
    INSERT_STATEMENTS, which only core/submit.py may name): the recorder's own insert_compensations
    was a second submit path the layers test could not see."""
    inserting = set()
    for path in sorted((ROOT / "sql").glob("queries*.sql")):
        for block in re.split(r"(?m)^-- name: ", path.read_text())[1:]:
            if re.search(r"\bINSERT\s+INTO\s+runs\b", block, re.I):
                inserting.add(block.split()[0])
    assert inserting == INSERT_STATEMENTS


async def test_a_compensation_is_submitted_through_the_submit_path(client: Client, stores: Stores) -> None:
    rid = await _cancel_after_start(client, stores, "comp.effects")
    (comp,) = await _sql(stores, "SELECT id, queue, status, payload, outbox, submitted_by, idempotency_key, "
                                    "trace_id FROM runs WHERE handler = 'comp.undo'")
    assert (comp["queue"], comp["status"], comp["outbox"], comp["submitted_by"], comp["idempotency_key"]) == \
        ("tq", "PENDING", True, "recorder", f"compensate:{rid}")
    assert comp["payload"] == encode_payload((rid,), {}), "the compensation runs with the cancelled run's id"
    assert comp["trace_id"], "a submit's traceparent, as every submit gets"
    keys = await _sql(stores, "SELECT scope, run_id FROM idempotency_keys WHERE key = $1", f"compensate:{rid}")
    assert [(k["scope"], k["run_id"]) for k in keys] == [("tq@compensation", comp["id"])], \
        "keyed in a namespace no producer's key can reach"
    assert (await _sql(stores, "SELECT needs_compensation FROM runs WHERE id = $1", rid))[0][0] is True


async def test_a_compensation_the_submit_path_refuses_is_counted_and_the_cancel_recorded(
        client: Client, stores: Stores, caplog: pytest.LogCaptureFixture) -> None:
    """The compensation's arguments (the cancelled run's id) do not fit its handler's declared
    signature: refused with the InvalidInput any producer's submit of it gets (before: inserted
    unchecked, to fail on a worker), counted, and the cancel is recorded all the same."""
    before = _refused()
    with caplog.at_level(logging.ERROR, logger="fencepost.recorder"):
        rid = await _cancel_after_start(client, stores, "comp.effects_badly_undone")
    assert await _sql(stores, "SELECT id FROM runs WHERE handler = 'comp.bad_undo'") == []
    (row,) = await _sql(stores, "SELECT status, needs_compensation FROM runs WHERE id = $1", rid)
    assert (row["status"], row["needs_compensation"]) == ("CANCELLED", True), "flagged for an operator"
    assert _refused() == before + 1
    with pytest.raises(InvalidInput) as refused:  # a producer without the handler's code (the API, the CLI)
        await SubmitPath(stores, actor="api").prepare([Submit(handler="comp.bad_undo", args=(rid,))], outbox=False)
    assert str(refused.value) in caplog.text
