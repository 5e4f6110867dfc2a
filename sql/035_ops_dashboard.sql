-- 035_ops_dashboard: what the dashboard's operations views need (issue 24, scheduler/api/routes_ops.py).

-- A bulk action acts on exactly the runs it counted: the count stores the ids with the version each
-- had, under a short-lived handle; the confirmation names the handle and acts on those ids only, each
-- by its own compare-and-set on that version (a run that moved meanwhile is skipped and reported).
-- A handle is used once, by the token that counted it, before it expires. The same protocol as the
-- queue bulk of 030 (bulk_handles), over the dashboard's lists, which may span queues.
CREATE TABLE ops_bulk_sets (
    handle      text PRIMARY KEY CHECK (handle ~ '^[0-9a-f]{32}$'),
    token_id    bigint NOT NULL,
    action      text NOT NULL,
    list        text NOT NULL,
    selection   jsonb NOT NULL,          -- the list's filter as counted
    matched     bigint NOT NULL,
    ids         bigint[] NOT NULL,
    queues      text[] NOT NULL,
    states      text[] NOT NULL,
    versions    bigint[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    CHECK (cardinality(ids) = cardinality(versions) AND cardinality(ids) = cardinality(states)
           AND cardinality(ids) = cardinality(queues))
);
CREATE INDEX ops_bulk_sets_expires ON ops_bulk_sets (expires_at);

-- Per-handler charts read the attempts of the chart's window (attempts are appended in about the
-- order they start): a BRIN index finds that window's pages at the cost of a few index tuples per
-- month, where a B-tree would add an insert to every attempt the recorder writes.
CREATE INDEX attempts_started_brin ON attempts USING brin (started_at) WITH (pages_per_range = 32, autosummarize = on);

-- The retries-waiting and scheduled lists page by (run_at, id) over the runs that wait.
CREATE INDEX runs_waiting_run_at ON runs (run_at, id) WHERE status IN ('PENDING', 'RETRY_WAIT');
