"""DAG workflows: submit a set of runs with depends_on edges atomically, inspect, retry.

Nodes without dependencies start PENDING, the others BLOCKED (not in Redis at all). The
recorder releases a dependent in the same PostgreSQL transaction that records its last
upstream SUCCEEDED (reconciler/workflows.py), and cancels BLOCKED descendants
(upstream_failed) when an upstream fails for good. A node reads its upstreams' results by
name (ctx.upstream_results()).

Batches reuse the same machinery: their callbacks are BLOCKED runs released once, by the
recorder, when the last member ends. Result handles (client.handle) live here too, the
client layer's home for "what came out of a run".
"""

from __future__ import annotations

import re
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC
from typing import Any, Protocol, cast

import msgspec

from fencepost.core import audit, validate
from fencepost.core.errors import FencepostError, IllegalTransition, InvalidInput, ResumeRefused
from fencepost.core.hot import Drop
from fencepost.core.models import Outcome, RunRow, Submit
from fencepost.core.states import LIVE, UNSUCCESSFUL, Status
from fencepost.core.submit import SubmitPath
from fencepost.core.views import Batch as BatchView
from fencepost.core.views import (
    BatchCallback,
    BatchMember,
    BatchRecord,
    Reply,
    RunRecord,
    Workflow,
    WorkflowNode,
    WorkflowSummary,
    live_nodes,
    view,
)

__all__ = [
    "PURGED",
    "Batch",
    "Node",
    "RunHandle",
    "SyncRunHandle",
    "UnknownBatch",
    "UnknownDependency",
    "UnknownWorkflow",
    "WorkflowCycle",
    "Workflows",
    "layers",
    "one_workflow",
]

_UTC = UTC
PURGED = "PURGED"
"""A batch member's or callback's state in batch_view once its run left the record (neither in runs
nor in runs_archive: a dropped archive partition, a load test's cleanup)."""



class Node(msgspec.Struct, kw_only=True, frozen=True):
    """One node of a workflow: a run of `handler`, started once every node in depends_on SUCCEEDED."""

    name: str
    handler: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    depends_on: tuple[str, ...] = ()
    queue: str | None = None
    priority: int | None = None
    timeout: float | None = None
    max_retries: int | None = None
    tenant: str | None = None
    """Who the node's run is for (fair sharing between a queue's tenants)."""

    @classmethod
    def of(cls, name: str, request: Submit, *, depends_on: Sequence[str] = ()) -> Node:
        """A node from a typed handle's validated request: `Node.of("a", send.request(...))`."""
        return cls(name=name, handler=request.handler, args=request.args, kwargs=request.kwargs,
                   depends_on=tuple(depends_on), queue=request.queue, priority=request.priority,
                   timeout=request.timeout, max_retries=request.max_retries, tenant=request.tenant)


class Batch(msgspec.Struct, kw_only=True, frozen=True):
    """A submitted batch: its id, member run ids (request order) and callback run ids."""

    id: uuid.UUID
    run_ids: list[int]
    on_complete: int | None = None
    """Runs once when every member is terminal (SUCCEEDED, FAILED, TIMED_OUT or CANCELLED)."""
    on_success: int | None = None
    """Runs once when every member SUCCEEDED; cancelled (reason batch_failed) otherwise."""


WORKFLOW_ID_PREFIX = re.compile(r"[0-9a-fA-F-]{4,36}")
"""A workflow id or the start of one: every command takes any unique prefix."""


def one_workflow(prefix: str, found: list[str]) -> str:
    """The one id FOUND for PREFIX: UnknownWorkflow for none, InvalidInput naming two when ambiguous."""
    if not found:
        raise UnknownWorkflow(prefix)
    if len(found) > 1:
        raise InvalidInput(f"{prefix!r} is the start of more than one workflow id ({found[0]}, {found[1]}, ...); "
                           "give more of it", field="workflow_id")
    return found[0]


class Reader(Protocol):
    """What a result handle reads through (a Client)."""

    async def run(self, run_id: int) -> Any: ...

    async def wait(self, run_id: int, timeout: float | None = None) -> Outcome: ...

    async def get(self, run_id: int) -> RunRecord: ...


class Commands(Protocol):
    """The operator commands a workflow retry uses (fencepost.control.Control)."""

    async def resume(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply: ...

    async def restart(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply: ...

    async def retry(self, run_id: int, *, reason: str = "", expected_version: int | None = None) -> Reply: ...


# -- result handles: `client.handle(run_id)` (submit() keeps returning the int id callers store) --
class RunHandle:
    """One submitted run, for async code."""

    __slots__ = ("client", "id")

    def __init__(self, client: Reader, run_id: int) -> None:
        self.client, self.id = client, run_id

    async def status(self) -> str:
        """The live state: Redis's hot copy when it is ahead of what PostgreSQL recorded (core.views.overlay)."""
        status: str = (await self.client.run(self.id)).status
        return status

    async def wait(self, timeout: float | None = None) -> Outcome:
        """Until terminal, PAUSED or STOPPED: the state, decoded result, error and reason."""
        return await self.client.wait(self.id, timeout)

    async def get(self) -> RunRecord:
        """The run as PostgreSQL records it (with its latest `progress`)."""
        return await self.client.get(self.id)

    def __int__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"RunHandle({self.id})"


class SyncRunHandle:
    """The same for SyncClient: each call blocks."""

    __slots__ = ("_call", "_handle", "id")

    def __init__(self, handle: RunHandle, call: Callable[[Callable[..., Coroutine[Any, Any, Any]]], Any]) -> None:
        self._handle, self._call, self.id = handle, call, handle.id

    def status(self) -> str:
        return cast(str, self._call(self._handle.status))

    def wait(self, timeout: float | None = None) -> Outcome:
        return cast(Outcome, self._call(lambda: self._handle.wait(timeout)))

    def get(self) -> RunRecord:
        return cast(RunRecord, self._call(self._handle.get))

    def __int__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"SyncRunHandle({self.id})"


class UnknownBatch(FencepostError, LookupError):
    def __init__(self, batch_id: Any) -> None:
        super().__init__(f"no batch with id {batch_id}")
        self.batch_id = batch_id


class UnknownDependency(InvalidInput):
    def __init__(self, node: str, depends_on: str) -> None:
        super().__init__(f"node {node!r} depends on {depends_on!r}, which is not a node of this workflow "
                         f"(edge {depends_on} -> {node})", field="depends_on")
        self.node, self.depends_on = node, depends_on


class WorkflowCycle(InvalidInput):
    def __init__(self, edge: tuple[str, str], cycle: list[str]) -> None:
        super().__init__(f"workflow has a cycle through edge {edge[0]} -> {edge[1]} "
                         f"({' -> '.join(cycle)})", field="depends_on")
        self.edge, self.cycle = edge, cycle


class UnknownWorkflow(FencepostError, LookupError):
    def __init__(self, workflow_id: Any) -> None:
        super().__init__(f"no workflow with id {workflow_id}")
        self.workflow_id = workflow_id


def _check_graph(nodes: Sequence[Node]) -> list[str]:
    """Validate names, dependencies and acyclicity; return the names in topological order."""
    names = [n.name for n in nodes]
    seen: set[str] = set()
    for n in names:
        validate.text("node", n)  # printed by `workflow show` and the dashboard: no control characters
        if n in seen:
            raise InvalidInput(f"node name {n!r} is used twice", field="node")
        seen.add(n)
    deps = {n.name: list(dict.fromkeys(n.depends_on)) for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            if d not in seen:
                raise UnknownDependency(n, d)
    # Iterative DFS: colour 1 = on the stack; an edge into a grey node closes a cycle.
    colour: dict[str, int] = {}
    order: list[str] = []
    for root in names:
        if root in colour:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        colour[root] = 1
        path.append(root)
        while stack:
            n, i = stack[-1]
            if i < len(deps[n]):
                stack[-1] = (n, i + 1)
                d = deps[n][i]
                c = colour.get(d, 0)
                if c == 1:
                    cyc = [*path[path.index(d):], d]
                    cyc.reverse()  # as upstream -> dependent
                    raise WorkflowCycle((d, n), cyc)
                if c == 0:
                    colour[d] = 1
                    path.append(d)
                    stack.append((d, 0))
            else:
                stack.pop()
                path.pop()
                colour[n] = 2
                order.append(n)
    return order


def layers(nodes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Nodes grouped by depth (longest path from a root), for drawing."""
    by = {n["name"]: n for n in nodes}
    depth: dict[str, int] = {}

    def d(name: str) -> int:
        if name not in depth:
            depth[name] = 0  # guards against a corrupt cyclic graph
            ups = [u for u in by[name]["depends_on"] if u in by]
            depth[name] = 1 + max((d(u) for u in ups), default=-1)
        return depth[name]

    for n in by:
        d(n)
    out: list[list[dict[str, Any]]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for n in nodes:
        out[depth[n["name"]]].append(n)
    return out


def _rerun_plan(nodes: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(roots of a re-run, nodes to block again). Roots: not succeeded, and every upstream succeeded
    (a FAILED node with an unsucceeded upstream, which the DAG itself cannot make, is one too).
    Cancelled nodes whose upstreams have not all succeeded wait again (BLOCKED)."""
    rerun_states = {s.value for s in UNSUCCESSFUL}

    def ups_ok(n: dict[str, Any]) -> bool:
        return all(nodes[u]["status"] == "SUCCEEDED" for u in n["depends_on"])

    roots = [n for n in nodes.values() if n["status"] in rerun_states and ups_ok(n)]
    reblock = [n for n in nodes.values() if n["status"] == "CANCELLED" and not ups_ok(n)]
    roots += [n for n in nodes.values() if n["status"] in rerun_states - {"CANCELLED"} and not ups_ok(n)]
    return roots, reblock


class Workflows:
    """A client's workflows and batches (`client.flows`; Client's methods of the same names delegate
    here): submitted through its submit path, retried through its operator commands."""

    def __init__(self, path: SubmitPath, commands: Commands) -> None:
        self.path = path
        self.stores = path.stores
        self.commands = commands

    @property
    def actor(self) -> str:
        return self.path.actor

    async def submit_workflow(self, nodes: Sequence[Node], *, name: str | None = None,
                              trace: str | None = None) -> uuid.UUID:
        """Insert every node atomically under one workflow id; returns it. Cycles and unknown
        dependencies raise (WorkflowCycle, UnknownDependency) naming the edge; nothing is stored."""
        if not nodes:
            raise InvalidInput("a workflow needs at least one node", field="nodes")
        _check_graph(nodes)
        wid = uuid.uuid4()
        prepared = await self.path.prepare([
            Submit(handler=n.handler, args=tuple(n.args), kwargs=dict(n.kwargs), queue=n.queue, priority=n.priority,
                   timeout=n.timeout, max_retries=n.max_retries, trace=trace, tenant=n.tenant) for n in nodes],
            outbox=True)
        rows = [msgspec.structs.replace(row, workflow_id=wid, outbox=not n.depends_on,  # BLOCKED: out of Redis
                                        status=Status.BLOCKED.value if n.depends_on else Status.PENDING.value)
                for n, row in zip(nodes, prepared, strict=True)]
        async with self.stores.db.transaction() as tx:
            ids, created, new_queues = await self.path.insert(None, rows, tx)
            by_name = dict(zip((n.name for n in nodes), ids))
            e_run, e_dep = [], []
            for n in nodes:
                for d in dict.fromkeys(n.depends_on):
                    e_run.append(by_name[n.name])
                    e_dep.append(by_name[d])
            await tx.execute("wf_insert", wid, name, list(by_name.values()), list(by_name), e_run, e_dep)
        # After commit: roots to Redis now (the outbox relay would do it too).
        await self.path.deliver(ids, [i for i in created if rows[i].status == Status.PENDING.value], rows, new_queues)
        return wid

    async def submit_batch(self, requests: Sequence[Submit], *, on_complete: Submit | None = None,
                           on_success: Submit | None = None, name: str | None = None) -> Batch:
        """Submit runs as one batch whose callbacks run exactly once when all of them are terminal.

        Members, callbacks (stored BLOCKED: out of Redis until released) and the batch commit in
        one transaction. The recorder releases the callbacks in the transaction that records the
        last member's end, so worker crashes, redeliveries and failover cannot fire them twice or
        lose them. A callback reads the members' results with `ctx.batch_results()`."""
        if not requests:
            raise InvalidInput("a batch needs at least one run", field="requests")
        if name is not None:
            validate.text("name", name)  # shown by `batch show` and the API: no control characters
        if on_complete is None and on_success is None:
            raise InvalidInput("a batch needs on_complete or on_success (else use submit_many)", field="on_complete")
        if any(r.idempotency_key is not None for r in requests):
            raise InvalidInput("batch members cannot carry idempotency keys (a member belongs to one batch)",
                               field="idempotency_key")
        for field, c in (("on_complete", on_complete), ("on_success", on_success)):
            if c is not None and (c.run_at is not None or c.delay is not None or c.idempotency_key is not None):
                raise InvalidInput("a batch callback runs when the batch settles: no run_at, delay or "
                                   "idempotency_key", field=field)
        callbacks = [c for c in (on_complete, on_success) if c is not None]
        everything = [*requests, *callbacks]
        rows = await self.path.prepare(requests, outbox=True)
        rows += [msgspec.structs.replace(r, status=Status.BLOCKED.value)
                 for r in await self.path.prepare(callbacks, outbox=False)]
        bid = uuid.uuid4()
        async with self.stores.db.transaction() as tx:
            ids, created, new_queues = await self.path.insert(everything, rows, tx)
            cb = iter(ids[len(requests):])
            complete_id = next(cb) if on_complete is not None else None
            success_id = next(cb) if on_success is not None else None
            await tx.execute("batch_insert", bid, name, complete_id, success_id, ids[:len(requests)])
            queues = sorted({r.queue for r in rows})
            await audit.write(self.stores.db, tx, self.actor, "batch_submitted", queue=queues[0] if len(queues) == 1
                              else None, target=str(bid), data={"name": name, "runs": len(requests), "queues": queues,
                                                                 "on_complete": complete_id, "on_success": success_id})
        await self.path.deliver(ids, [i for i in created if i < len(requests)], rows, new_queues)
        return Batch(id=bid, run_ids=ids[:len(requests)], on_complete=complete_id, on_success=success_id)

    async def batch(self, batch_id: uuid.UUID | str) -> BatchRecord:
        """A batch: callbacks, settled_at (None while members run) and each member's status."""
        bid = _uuid(batch_id, "batch")
        row = await self.stores.db.row("batch_get", bid)  # statuses: NULL for a member that left the record
        if row is None:
            raise UnknownBatch(batch_id)
        members = [BatchMember(run_id=r, status=st) for r, st in zip(row.run_ids or (), row.statuses or (), strict=True)]
        return BatchRecord(id=row.id, name=row.name, created_at=row.created_at, settled_at=row.settled_at,
                           on_complete=row.on_complete, on_success=row.on_success, members=members)

    async def batch_view(self, batch_id: uuid.UUID | str) -> BatchView:
        """A batch as `batch show` and the API show it: its members counted by state (total, counts), when
        it settled, and each callback's run id, status and reason (None: not declared)."""
        batch = await self.batch(batch_id)
        counts: dict[str, int] = {}
        for m in batch.members:
            state = m.status or PURGED
            counts[state] = counts.get(state, 0) + 1
        callbacks: dict[str, BatchCallback | None] = {}
        for kind in ("on_complete", "on_success"):
            cb_id: int | None = batch[kind]
            if cb_id is None:
                callbacks[kind] = None
                continue
            run = await self.stores.db.row("get_run", cb_id)
            callbacks[kind] = BatchCallback(id=cb_id, status=PURGED) if run is None else \
                BatchCallback(id=run.id, status=run.status, reason=run.reason)
        return BatchView(id=batch.id, name=batch.name, created_at=batch.created_at,
                         settled_at=batch.settled_at, total=len(batch.members), counts=counts,
                         on_complete=callbacks["on_complete"], on_success=callbacks["on_success"])

    async def workflow(self, workflow_id: uuid.UUID | str) -> Workflow:
        """The workflow and its current nodes (name, run id, live status, upstream names)."""
        wid = _uuid(workflow_id)
        row = await self.stores.db.row("wf_get", wid)
        if row is None:
            raise UnknownWorkflow(workflow_id)
        nodes = [view(WorkflowNode, r) for r in await self.stores.db.rows("wf_nodes", wid)]
        return Workflow(id=row.id, name=row.name, created_at=row.created_at,
                        nodes=await live_nodes(self.stores, nodes))

    async def workflows(self, *, limit: int = 50) -> list[WorkflowSummary]:
        """Recent workflows, newest first, with their number of nodes."""
        return [view(WorkflowSummary, r) for r in await self.stores.db.rows("api_list_workflows", limit)]

    async def workflow_id(self, prefix: str) -> str:
        """The full id of the one workflow whose id starts with PREFIX (4 to 36 hex digits and dashes);
        anything else is returned as it is (the other calls say what is wrong with it)."""
        if len(prefix) == 36 or not WORKFLOW_ID_PREFIX.fullmatch(prefix):
            return prefix
        rows = await self.stores.db.rows("workflow_ids_by_prefix", prefix.lower())
        return one_workflow(prefix, [str(r.id) for r in rows])

    async def retry_workflow(self, workflow_id: uuid.UUID | str, *, recompute: Sequence[str] = (),
                             reason: str = "") -> dict[str, list[str]]:
        """Re-run what did not succeed, keeping succeeded nodes.

        Failed, timed-out, stopped and cancelled nodes run again (retry / resume of the same
        run); their descendants cancelled as upstream_failed go back to BLOCKED and are released
        as usual. With `recompute`, the named nodes and all their descendants run again as new
        runs, whatever their state (none of them may be active). Returns what was done by node.
        """
        audit.reason(reason)
        wf = await self.workflow(workflow_id)
        nodes = {n["name"]: n for n in wf["nodes"]}
        for r in recompute:
            if r not in nodes:
                raise InvalidInput(f"workflow {wf['id']} has no node {r!r}", field="recompute")
        if recompute:
            return await self._recompute(wf["id"], nodes, recompute, reason)
        roots, reblock = _rerun_plan(nodes)
        done: dict[str, list[str]] = {"retried": [], "resumed": [], "reblocked": [], "refused": []}
        if reblock:
            done["reblocked"] = await self._reblock(reblock)
        # Upstreams after their dependents are BLOCKED again, so their success releases them.
        for n in sorted(roots, key=lambda n: n["name"]):
            await self._rerun(n, reason or "workflow retry", done)
        return done

    async def _reblock(self, reblock: list[dict[str, Any]]) -> list[str]:
        """Cancelled nodes back to BLOCKED (compare-and-set on their versions): the names moved."""
        got = {r.id for r in await self.stores.db.rows(
            "wf_reblock", [n["id"] for n in reblock], [n["version"] for n in reblock], self.actor)}
        # A stale copy in Redis (a cancelled hash) must not answer for the run any more: dropped
        # only at the version just read (compare-and-set; a run that moved since keeps its hash).
        for n in reblock:
            if n["id"] in got:
                keys = self.stores.keys(n["queue"])
                (hot,) = await self.stores.scripts.peek(keys, [n["id"]])
                if hot is not None:
                    version = "" if hot.version is None else hot.version
                    await self.stores.scripts.repair_drop(keys, [Drop(n["id"], "hash", version)])
        return sorted(n["name"] for n in reblock if n["id"] in got)

    async def _rerun(self, n: dict[str, Any], reason: str, done: dict[str, list[str]]) -> None:
        """A STOPPED node resumed (restarted if its resume is refused), any other retried; noted in DONE."""
        try:
            if n["status"] == "STOPPED":
                try:
                    await self.commands.resume(n["id"], reason=reason)
                    done["resumed"].append(n["name"])
                except ResumeRefused:
                    await self.commands.restart(n["id"], reason=reason)
                    done["retried"].append(n["name"])
            else:
                await self.commands.retry(n["id"], reason=reason)
                done["retried"].append(n["name"])
        except IllegalTransition as exc:
            done["refused"].append(f"{n['name']}: {exc}")

    async def _recompute(self, wid: uuid.UUID, nodes: dict[str, dict[str, Any]],
                         names: Sequence[str], reason: str) -> dict[str, list[str]]:
        down: dict[str, list[str]] = defaultdict(list)
        for node in nodes.values():
            for u in node["depends_on"]:
                down[u].append(node["name"])
        sub: set[str] = set()
        todo = list(names)
        while todo:
            n = todo.pop()
            if n not in sub:
                sub.add(n)
                todo += down[n]
        active = {s.value for s in LIVE - {Status.BLOCKED}}
        busy = sorted(n for n in sub if nodes[n]["status"] in active)
        if busy:
            raise IllegalTransition(nodes[busy[0]]["id"], nodes[busy[0]]["status"],
                                    f"recompute node {busy[0]!r} (cancel or wait for it first)")
        old = {r.id: r for r in await self.stores.db.rows("wf_runs_full", [nodes[n]["id"] for n in sub])}
        order = [n for n in _check_graph([Node(name=k, handler="", depends_on=tuple(
            u for u in nodes[k]["depends_on"] if u in sub)) for k in sub])]
        now = await self.path.server_now()  # due now on the server's clock, not this host's (docs/clock.md)
        rows: list[RunRow] = []
        for name in order:
            o = old[nodes[name]["id"]]
            outside_ok = all(nodes[u]["status"] == "SUCCEEDED" for u in nodes[name]["depends_on"] if u not in sub)
            inside = any(u in sub for u in nodes[name]["depends_on"])
            pending = outside_ok and not inside
            rows.append(RunRow(handler=o.handler, queue=o.queue, priority=o.priority, payload=o.payload,
                               run_at=now, max_retries=o.max_retries, timeout_s=o.timeout_s,
                               trace_id=o.trace_id, status="PENDING" if pending else "BLOCKED", workflow_id=wid,
                               outbox=pending, tenant=o.tenant or "", concurrency_key=o.concurrency_key,
                               concurrency_limit=o.concurrency_limit, rate_key=o.rate_key,
                               rate_limit=o.rate_limit))
        async with self.stores.db.transaction() as tx:
            await tx.execute("wf_supersede", [nodes[n]["id"] for n in sub], self.actor)
            ids, created, new_queues = await self.path.insert(None, rows, tx)
            new = dict(zip(order, ids))
            e_run, e_dep = [], []
            for name in order:
                for u in nodes[name]["depends_on"]:
                    e_run.append(new[name])
                    e_dep.append(new.get(u, nodes[u]["id"]))
            await tx.execute("wf_add_nodes", wid, list(new.values()), list(new), e_run, e_dep)
            # the new runs' submits carry no reason: the operator's is kept with the change
            await audit.write(self.stores.db, tx, self.actor, "workflow_recomputed", target=str(wid),
                              reason_=reason, data={"nodes": sorted(sub), "runs": sorted(new.values())})
        await self.path.deliver(ids, [i for i in created if rows[i].status == "PENDING"], rows, new_queues)
        return {"recomputed": sorted(sub)}


def _uuid(v: uuid.UUID | str, what: str = "workflow") -> uuid.UUID:
    if isinstance(v, uuid.UUID):
        return v
    try:
        return uuid.UUID(str(v))
    except ValueError:
        raise InvalidInput(f"{v!r} is not a {what} id (a UUID)", field=f"{what}_id") from None
