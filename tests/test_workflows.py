"""DAG workflows: atomic submit, release in the recorder's transaction, upstream_failed
cancellation, workflow retry, and a recorder that dies between completion and release."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fencepost.client import Client
from fencepost.core.errors import InvalidInput
from fencepost.dev.examples import registry as examples
from fencepost.workflows import Node, UnknownDependency, WorkflowCycle
from tests.conftest import ROOT, record_all, spawn, stop, wait_until, worker_env


async def _states(client: Client, wid: Any) -> dict[str, str]:
    return {n["name"]: n["status"] for n in (await client.workflow(wid))["nodes"]}


async def _settled(client: Client, wid: Any) -> dict[str, str] | None:
    st = await _states(client, wid)
    return st if all(s in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT") for s in st.values()) else None


@contextmanager
def _services(settings: Any, tmp_path: Any, *, reconciler: bool = True) -> Iterator[None]:
    procs = [spawn(settings, "worker", "--app", "fencepost.dev.examples:registry", "--queue", "demo",
                   "--processes", "1", log=tmp_path / "worker.log")]
    if reconciler:
        procs.append(spawn(settings, "reconciler", log=tmp_path / "reconciler.log"))
    try:
        yield
    finally:
        stop(procs)


def _add(name: str, *deps: str, **kw: Any) -> Node:
    return Node(name=name, handler="add", args=(1, 2), depends_on=deps, **kw)


# -- validation ----------------------------------------------------------------------------------
async def test_cycle_and_unknown_dependency_are_rejected_naming_the_edge(client: Client) -> None:
    await client.register(examples)
    with pytest.raises(WorkflowCycle) as cyc:
        await client.submit_workflow([_add("a"), _add("b", "a", "d"), _add("c", "b"), _add("d", "c")])
    assert "->" in str(cyc.value) and set(cyc.value.edge) <= {"b", "c", "d"}
    assert cyc.value.cycle[0] == cyc.value.cycle[-1]
    with pytest.raises(UnknownDependency) as unk:
        await client.submit_workflow([_add("a"), _add("b", "a", "ghost")])
    assert unk.value.node == "b" and unk.value.depends_on == "ghost" and "ghost -> b" in str(unk.value)
    with pytest.raises(WorkflowCycle):
        await client.submit_workflow([_add("self", "self")])
    for bad in ("", "a\x1b[2Jb", "x" * 201, "a\u202eb"):  # node names reach terminals and the dashboard
        with pytest.raises(InvalidInput) as inv:
            await client.submit_workflow([_add(bad)])
        assert inv.value.field == "node"
    pool = client.stores.db.pool
    assert await pool.fetchval("SELECT count(*) FROM runs") == 0, "nothing stored"
    assert await pool.fetchval("SELECT count(*) FROM workflows") == 0


async def test_submit_is_atomic_roots_pending_others_blocked_and_not_in_redis(client: Client) -> None:
    await client.register(examples)
    wid = await client.submit_workflow([_add("a"), _add("b", "a"), _add("c", "a"), _add("d", "b", "c")])
    wf = await client.workflow(wid)
    st = {n["name"]: n for n in wf["nodes"]}
    assert {k: v["status"] for k, v in st.items()} == {"a": "PENDING", "b": "BLOCKED", "c": "BLOCKED", "d": "BLOCKED"}
    assert st["d"]["depends_on"] == ["b", "c"]
    keys = client.stores.keys("demo")
    assert await client.stores.redis.zrange(keys.due, 0, -1) == [str(st["a"]["id"]).encode()]
    assert not await client.stores.redis.exists(keys.run(st["b"]["id"])), "BLOCKED runs stay out of Redis"
    assert await client.stores.db.pool.fetchval("SELECT count(*) FROM runs WHERE outbox") == 0
    # a node may name its tenant: its run waits in that tenant's due set
    wid2 = await client.submit_workflow([_add("t", tenant="acme")])
    [t] = (await client.workflow(wid2))["nodes"]
    assert await client.stores.redis.zscore(keys.base + "due:t:acme", str(t["id"])) is not None
    from fencepost.cli.workflow import draw

    text = "\n".join(draw(wf))
    assert "4 nodes" in text and "◀ b, c" in text and "PENDING" in text


async def test_recorder_dies_between_upstream_success_and_release_cannot_strand(client, settings, stores,
                                                                                 tmp_path, monkeypatch) -> None:
    """The hook raises once right after apply_runs: the batch rolls back (the upstream is not
    recorded SUCCEEDED either), is redelivered, and then records both in one commit."""
    from fencepost.core import release as hook
    from fencepost.reconciler.outbox import OutboxRelay
    from fencepost.reconciler.recorder import Recorder

    await client.register(examples)
    wid = await client.submit_workflow([_add("up"), _add("down", "up")])
    ids = {n["name"]: n["id"] for n in (await client.workflow(wid))["nodes"]}
    real = hook.on_recorded
    calls = {"n": 0}

    async def dying(conn: Any, run_ids: Any, statuses: Any) -> None:
        await real(conn, run_ids, statuses)
        if "SUCCEEDED" in statuses and calls["n"] == 0:
            calls["n"] += 1
            raise ConnectionResetError("recorder killed after apply_runs")

    monkeypatch.setattr(hook, "on_recorded", dying)
    rec = Recorder(stores, consumer="t")
    pool = client.stores.db.pool
    with _services(settings, tmp_path, reconciler=False):
        out = await client.wait(ids["up"], timeout=30)
        assert out.status == "SUCCEEDED"
        with pytest.raises(ConnectionResetError):
            for _ in range(50):
                await rec.run_once(block_ms=100)
        assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", ids["up"]) != "SUCCEEDED", "rolled back"
        assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", ids["down"]) == "BLOCKED"
        await rec.run_once(pending=True)  # the restarted recorder replays its pending entries
        row = await pool.fetchrow("SELECT status, outbox FROM runs WHERE id = $1", ids["down"])
        assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", ids["up"]) == "SUCCEEDED"
        assert (row["status"], row["outbox"]) == ("PENDING", True), "released in the same commit"
        assert await OutboxRelay(stores).relay() == 1
        assert (await client.wait(ids["down"], timeout=30)).status == "SUCCEEDED"
        await record_all(stores)
    ev = await pool.fetch("SELECT type, actor FROM events WHERE run_id = $1 ORDER BY id", ids["down"])
    assert [e["type"] for e in ev][:2] == ["submitted", "released"]


@pytest.mark.slow
async def test_diamond_runs_in_dependency_order(client: Client, settings, tmp_path) -> None:
    await client.register(examples)
    wid = await client.submit_workflow([_add("a"), _add("b", "a"), _add("c", "a"), _add("d", "b", "c")])
    async def recorded() -> dict[str, Any] | None:  # the live state is Redis's; the times are the recorder's
        runs = {n["name"]: await client.get(n["id"]) for n in (await client.workflow(wid))["nodes"]}
        return runs if all(r["started_at"] and r["finished_at"] for r in runs.values()) else None

    with _services(settings, tmp_path):
        st = await wait_until(lambda: _settled(client, wid), timeout=60, what="the diamond to finish")
        runs = await wait_until(recorded, timeout=30, what="the diamond's start and finish times recorded")
    assert set(st.values()) == {"SUCCEEDED"}
    assert runs["b"]["started_at"] >= runs["a"]["finished_at"] and runs["c"]["started_at"] >= runs["a"]["finished_at"]
    assert runs["d"]["started_at"] >= max(runs["b"]["finished_at"], runs["c"]["finished_at"])
    out = subprocess.run([sys.executable, "-m", "fencepost.cli", "workflow", "show", str(wid)], cwd=ROOT,
                         env=worker_env(settings), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "4 SUCCEEDED" in out.stdout and "◀ b, c" in out.stdout, out.stderr


@pytest.mark.slow
async def test_fan_out_1000_and_join(client: Client, settings, tmp_path) -> None:
    await client.register(examples)
    nodes = [Node(name="root", handler="noop", queue="demo")]
    nodes += [Node(name=f"n{i:04d}", handler="noop", queue="demo", depends_on=("root",)) for i in range(1000)]
    nodes.append(Node(name="join", handler="noop", queue="demo", depends_on=tuple(f"n{i:04d}" for i in range(1000))))
    wid = await client.submit_workflow(nodes)
    pool = client.stores.db.pool

    async def recorded() -> bool:  # the live state is Redis's; the start and finish times are the recorder's
        return await pool.fetchval("SELECT count(*) FROM runs r JOIN workflow_nodes n ON n.run_id = r.id "
                                   "WHERE n.workflow_id = $1 AND r.finished_at IS NOT NULL", wid) == 1002

    with _services(settings, tmp_path):
        st = await wait_until(lambda: _settled(client, wid), timeout=90, what="the fan-out to finish")
        await wait_until(recorded, timeout=60, what="the fan-out's start and finish times recorded")
    assert len(st) == 1002 and set(st.values()) == {"SUCCEEDED"}
    join = await pool.fetchrow("SELECT r.started_at FROM runs r JOIN workflow_nodes n ON n.run_id = r.id "
                               "WHERE n.name = 'join'")
    last = await pool.fetchval("SELECT max(finished_at) FROM runs r JOIN workflow_nodes n ON n.run_id = r.id "
                               "WHERE n.name LIKE 'n%'")
    assert join["started_at"] >= last
    assert await pool.fetchval("SELECT count(*) FROM events WHERE type = 'released'") == 1001


@pytest.mark.slow
async def test_failure_in_the_middle_cancels_descendants_and_retry_reruns_only_that_subgraph(
        client: Client, settings, tmp_path) -> None:
    await client.register(examples)
    #   a -> b (fails once) -> d -> e        a -> c -> f
    wid = await client.submit_workflow([
        _add("a"), Node(name="b", handler="flaky", kwargs={"succeed_on": 2}, max_retries=0, queue="demo",
                        depends_on=("a",)),
        _add("c", "a"), _add("d", "b"), _add("e", "d"), _add("f", "c")])
    with _services(settings, tmp_path):
        st = await wait_until(lambda: _settled(client, wid), timeout=60, what="the first pass to settle")
        assert st == {"a": "SUCCEEDED", "b": "FAILED", "c": "SUCCEEDED", "d": "CANCELLED", "e": "CANCELLED",
                      "f": "SUCCEEDED"}
        wf = {n["name"]: n for n in (await client.workflow(wid))["nodes"]}
        assert wf["d"]["reason"] == wf["e"]["reason"] == "upstream_failed"
        done = await client.retry_workflow(wid)
        assert done["retried"] == ["b"] and done["reblocked"] == ["d", "e"]
        st = await wait_until(lambda: _settled(client, wid), timeout=60, what="the retry to settle")
        assert set(st.values()) == {"SUCCEEDED"}
        after = {n["name"]: n for n in (await client.workflow(wid))["nodes"]}
        assert {k: after[k]["id"] for k in after} == {k: wf[k]["id"] for k in wf}, "same runs, no new ones"
        assert {k: after[k]["attempt"] for k in after} == {"a": 1, "b": 2, "c": 1, "d": 1, "e": 1, "f": 1}, \
            "only the failed subgraph ran again"
        # recompute a named subgraph: c and f run again as new runs, the rest is kept
        done = await client.retry_workflow(wid, recompute=["c"], reason="bad input file")
        assert done == {"recomputed": ["c", "f"]}
        [row] = [dict(r) for r in await client.stores.db.fetch("audit_list", None, None, None, None, 100, None, None)
                 if r["action"] == "workflow_recomputed"]
        assert (row["target"], row["reason"], row["actor"]) == (str(wid), "bad input file", client.actor), \
            "the operator's reason is kept with the recompute"
        st = await wait_until(lambda: _settled(client, wid), timeout=60, what="the recompute to settle")
        again = {n["name"]: n for n in (await client.workflow(wid))["nodes"]}
        assert set(st.values()) == {"SUCCEEDED"}
        assert {k for k in again if again[k]["id"] != after[k]["id"]} == {"c", "f"}
