"""The API's endpoints, declared once in ROUTES: Starlette routing and the OpenAPI document
(fencepost.api.openapi, which imports this module; /openapi.json asks the app for it, see
`Api.openapi_document`) are both built from this table, so they cannot disagree.

The handlers live by resource: runs (routes_runs), schedules / workflows / batches (routes_flows),
the fleet and its operators (routes_fleet), the dashboard's operations (routes_ops); the steps every
endpoint runs (`wrap`: authenticate, role, rate limit, body, a Client whose actor names the token)
and the helpers they share are in routing.
"""

from __future__ import annotations

from fencepost.api import schemas as S
from fencepost.api.routes_fleet import (
    add_token,
    audit_log,
    fleet_stats,
    get_dispatch,
    health,
    list_tokens,
    list_workers,
    me,
    metrics,
    openapi_doc,
    queue_stats,
    ready,
    revoke_token_route,
    set_dispatch,
    stop_worker,
)
from fencepost.api.routes_flows import (
    _schedule_paused,
    add_schedule,
    create_batch,
    delete_schedule,
    get_batch,
    get_schedule,
    get_workflow,
    list_schedules,
    list_workflows,
    next_fires,
    retry_workflow,
    run_schedule_now,
    schedule_runs,
    submit_workflow,
    update_schedule,
)
from fencepost.api.routes_runs import (
    _command,
    _queue_command,
    bulk,
    dead_letter,
    fleet_events,
    fleet_events_stream,
    get_run,
    list_queues,
    list_runs,
    resolve,
    review,
    run_attempts,
    run_checkpoint,
    run_events,
    submit,
    submit_batch,
)
from fencepost.api.routing import (
    OPTIONAL_BODY,
    READ,
    Ctx,
    RouteSpec,
    _q_text,
    _row,
    _run_for,
    wrap,
)

__all__ = ["OPTIONAL_BODY", "ROUTES", "Ctx", "RouteSpec", "wrap"]


# -- the table ---------------------------------------------------------------------------------
_LIMIT = ("limit", "integer", 50, "At most this many rows (1-1000)")


_REASON = ("reason", "string", None, "Recorded in the audit log with the token that acted")


_QUEUE = ("queue", "string", None, "Only this queue")


_CURSOR = ("cursor", "string", None, "Where the page starts: the previous page's X-Next-Cursor header")


_RUN = "/v1/runs/{run_id}"


_WINDOW = ("window", "string", "1h", "1h (per minute), 24h (per 15 min) or 7d (per 2 h)")


ROUTES: list[RouteSpec] = [
    RouteSpec("GET", "/healthz", health, "Liveness: the process answers", response=S.Health, tag="health", auth=False),
    RouteSpec("GET", "/readyz", ready, "Readiness: Redis and PostgreSQL reachable (503 otherwise)",
              response=S.Readiness, tag="health", auth=False),
    RouteSpec("GET", "/metrics", metrics,
              "Prometheus metrics of this API process (any token; public with FENCEPOST_API_METRICS_TOKEN=0)",
              response="text", tag="health"),
    RouteSpec("GET", "/openapi.json", openapi_doc, "This document", response="object", tag="health", auth=False),
    RouteSpec("GET", "/v1/me", me, "The calling token", response=S.Me, tag="tokens"),
    RouteSpec("POST", "/v1/runs", submit, "Submit one run (Idempotency-Key header or body field)",
              roles=("producer", "admin"), body=S.SubmitRequest, response=S.Submitted, status=201),
    RouteSpec("POST", "/v1/runs/batch", submit_batch, "Submit a batch atomically (Idempotency-Key: <key>:<index>)",
              roles=("producer", "admin"), body=S.SubmitBatch, response=S.SubmittedBatch, status=201),
    RouteSpec("GET", "/v1/runs", list_runs, "List runs, newest first (producers see their own)",
              response=list[S.RunSummary],
              params=[_QUEUE, ("status", "string", None, "Only this state"), ("handler", "string", None, "Only this handler"),
                      ("since", "string", None, "Created at or after (ISO 8601)"),
                      ("until", "string", None, "Created before (ISO 8601)"), _LIMIT,
                      ("before", "integer", None, "Only ids below this (paging)"),
                      ("id", "integer", None, "Only this run"), ("tenant", "string", None, "Only this tenant"),
                      ("concurrency_key", "string", None, "Only this concurrency key"),
                      ("idempotency_key", "string", None, "Only this idempotency key"),
                      ("arg", "string", None, "A string argument containing this text (among the newest 20,000 runs)"),
                      ("sort", "string", "id", "id, created_at, finished_at, attempt, handler or status"),
                      ("order", "string", "desc", "asc or desc"),
                      ("offset", "integer", 0, "Skip this many (0-10000); X-Total-Count: the matches"),
                      _CURSOR]),
    RouteSpec("GET", _RUN, get_run, "One run (live state from Redis when newer)", response=S.Run),
    RouteSpec("GET", _RUN + "/attempts", run_attempts, "The run's attempts", response=list[S.Attempt]),
    RouteSpec("GET", _RUN + "/events", run_events, "The run's event history, in the order recorded",
              response=list[S.Event], params=[("limit", "integer", 1000, "At most this many (1-1000)"), _CURSOR]),
    RouteSpec("GET", _RUN + "/checkpoint", run_checkpoint, "The run's latest checkpoint (null: none)",
              response=S.Checkpoint | None),
    *[RouteSpec("POST", f"{_RUN}/{verb}", _command(verb), f"{verb.capitalize()} the run", roles=READ,
                body=S.CommandRequest, response=S.CommandResult, tag="commands") for verb in
      ("pause", "stop", "cancel", "resume", "restart", "retry")],
    RouteSpec("POST", _RUN + "/resolve", resolve, "Close a review-queue run (succeeded / failed / retry)", roles=READ,
              body=S.ResolveRequest, response=S.CommandResult, tag="commands"),
    RouteSpec("GET", "/v1/events", fleet_events, "Fleet history", roles=READ, response=list[S.Event],
              params=[("since", "string", None, "ISO 8601 (default: an hour ago)"),
                      ("type", "string", None, "Only this event type"), _QUEUE, _LIMIT, _CURSOR]),
    RouteSpec("GET", "/v1/events/stream", fleet_events_stream,
              "Fleet history as it is recorded (Server-Sent Events; data: an Event, as /v1/events)", roles=READ,
              response="event-stream", params=[("type", "string", None, "Only this event type"), _QUEUE,
                                               ("duration", "integer", 300,
                                                "Seconds until the server ends the stream (0-3600; clients reconnect)")]),
    RouteSpec("GET", "/v1/queues", list_queues, "Queues: depth, oldest age, schedule lag, throughput", roles=READ,
              response=list[S.QueueStats], params=[("window", "integer", 300, "Seconds of history for rates")],
              tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/pause", _queue_command(True), "Pause a queue (nothing new is dispatched)",
              roles=READ, body=S.ConfigCommand, response=S.QueueResult, tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/resume", _queue_command(False), "Resume a queue", roles=READ,
              body=S.ConfigCommand, response=S.QueueResult, tag="queues"),
    RouteSpec("GET", "/v1/queues/{queue}/dispatch", get_dispatch,
              "Dispatch settings (tenant weights, concurrency and rate limits, aging) and tenants / keys now", roles=READ,
              response=S.DispatchSettings, tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/dispatch", set_dispatch,
              "Change one dispatch setting (value null: back to the default)", roles=("admin",),
              body=S.DispatchUpdate, response=S.DispatchSettings, tag="queues"),
    RouteSpec("POST", "/v1/queues/{queue}/bulk", bulk,
              "Count matching runs (428, or 200 with count: true: a handle for the counted set), or confirm a "
              "handle: act on exactly the counted runs that have not moved", roles=("admin",),
              body=S.BulkRequest, response=S.BulkResult, tag="queues"),
    RouteSpec("GET", "/v1/dead-letter", dead_letter, "Dead-letter view (FAILED / TIMED_OUT)", roles=READ,
              response=list[S.RunSummary], params=[_QUEUE, _LIMIT, _CURSOR], tag="queues"),
    RouteSpec("GET", "/v1/review", review, "Review queue (side effects to reconcile)", roles=READ,
              response=list[S.RunSummary], params=[_QUEUE, _LIMIT, _CURSOR], tag="queues"),
    RouteSpec("GET", "/v1/schedules", list_schedules, "List schedules", roles=READ, response=list[S.Schedule],
              params=[("limit", "integer", 100, "At most this many"), _CURSOR], tag="schedules"),
    RouteSpec("POST", "/v1/schedules", add_schedule, "Add a schedule", roles=("admin",), body=S.ScheduleCreate,
              response=S.Schedule, status=201, tag="schedules"),
    RouteSpec("GET", "/v1/schedules/{name}", get_schedule, "One schedule", roles=READ, response=S.Schedule,
              tag="schedules"),
    RouteSpec("DELETE", "/v1/schedules/{name}", delete_schedule, "Remove a schedule", roles=("admin",),
              response=None, status=204, params=[_REASON], tag="schedules"),
    RouteSpec("POST", "/v1/schedules/{name}/pause", _schedule_paused(True), "Pause a schedule", roles=("admin",),
              body=S.ConfigCommand, response=S.Schedule, tag="schedules"),
    RouteSpec("POST", "/v1/schedules/{name}/resume", _schedule_paused(False), "Resume a schedule", roles=("admin",),
              body=S.ConfigCommand, response=S.Schedule, tag="schedules"),
    RouteSpec("PATCH", "/v1/schedules/{name}", update_schedule, "Edit a schedule in place (the fields given)",
              roles=("admin",), body=S.ScheduleEdit, response=S.Schedule, tag="schedules"),
    RouteSpec("POST", "/v1/schedules/{name}/run-now", run_schedule_now,
              "Fire the schedule once now (its next scheduled fire does not move)", roles=("admin",),
              body=S.ConfigCommand, response=S.Submitted, status=201, tag="schedules"),
    RouteSpec("GET", "/v1/schedules/{name}/next", next_fires, "The next fire times", roles=READ,
              response=S.NextFires, params=[("n", "integer", 5, "How many (1-100)")], tag="schedules"),
    RouteSpec("GET", "/v1/schedules/{name}/runs", schedule_runs, "The schedule's latest runs, newest fire first",
              roles=READ, response=list[S.ScheduleRun], params=[("limit", "integer", 10, "At most this many (1-1000)")],
              tag="schedules"),
    RouteSpec("POST", "/v1/workflows", submit_workflow, "Submit a workflow (DAG) atomically",
              roles=("producer", "admin"), body=S.WorkflowSubmit, response=S.WorkflowSubmitted, status=201,
              tag="workflows"),
    RouteSpec("GET", "/v1/workflows", list_workflows, "Recent workflows", roles=READ,
              response=list[S.WorkflowSummary], params=[_LIMIT, _CURSOR], tag="workflows"),
    RouteSpec("GET", "/v1/workflows/{workflow_id}", get_workflow, "A workflow and its nodes", roles=READ,
              response=S.Workflow, tag="workflows"),
    RouteSpec("POST", "/v1/workflows/{workflow_id}/retry", retry_workflow, "Re-run what did not succeed",
              roles=READ, body=S.WorkflowRetry, response=S.WorkflowRetried, tag="workflows"),
    RouteSpec("POST", "/v1/batches", create_batch,
              "Submit runs as one batch with on_complete / on_success callbacks (run once when all are terminal)",
              roles=("producer", "admin"), body=S.BatchCreate, response=S.BatchCreated, status=201, tag="batches"),
    RouteSpec("GET", "/v1/batches/{batch_id}", get_batch, "A batch: its members counted by state, its callbacks",
              roles=READ, response=S.Batch, tag="batches"),
    RouteSpec("GET", "/v1/tokens", list_tokens, "List API tokens (never their secrets)", roles=("admin",),
              response=list[S.Token], tag="tokens"),
    RouteSpec("POST", "/v1/tokens", add_token, "Create a token; the secret is shown once", roles=("admin",),
              body=S.TokenCreate, response=S.TokenCreated, status=201, tag="tokens"),
    RouteSpec("DELETE", "/v1/tokens/{token_id}", revoke_token_route, "Revoke a token", roles=("admin",),
              response=S.Token, params=[_REASON], tag="tokens"),
    RouteSpec("GET", "/v1/queues/{queue}/stats", queue_stats,
              "Started, succeeded, failed, retried per step, start lag and run time percentiles (per-minute rollup)",
              roles=READ, response=S.Stats, params=[_WINDOW], tag="queues"),
    RouteSpec("GET", "/v1/stats", fleet_stats, "The same, summed over every queue in the token's scope", roles=READ,
              response=S.Stats, params=[_WINDOW], tag="queues"),
    RouteSpec("GET", "/v1/workers", list_workers, "Live workers: host, pid, version, queues, concurrency, held runs",
              roles=READ, response=list[S.WorkerInfo], params=[_QUEUE], tag="workers"),
    RouteSpec("POST", "/v1/workers/{worker_id}/stop", stop_worker,
              "Ask a worker to stop claiming, drain and exit (audited)", roles=READ, body=S.ConfigCommand,
              response=S.WorkerStopped, tag="workers"),
    RouteSpec("GET", "/v1/audit", audit_log, "Who did what: configuration changes and commands, newest first",
              roles=READ, response=list[S.AuditEntry],
              params=[("actor", "string", None, "Only this actor (or a prefix ending in ':' or '@', e.g. token:7@)"),
                      _QUEUE, ("since", "string", None, "At or after (ISO 8601)"),
                      ("until", "string", None, "Before (ISO 8601)"), ("limit", "integer", 100, "At most this many (1-1000)"),
                      ("before", "string", None, "Only entries before this time"), _CURSOR],
              tag="audit"),
]


# The dashboard's operations routes (fencepost.api.routes_ops), made with RouteSpec and the helpers above.
from fencepost.api import routes_ops  # noqa: E402

ROUTES += routes_ops.routes(RouteSpec, run_for=_run_for, row=_row, q_text=_q_text)
