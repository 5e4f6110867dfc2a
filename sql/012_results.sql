-- 012_results: batches with completion callbacks, and lightweight progress (issue 16).

-- A batch groups runs; its callbacks are runs inserted BLOCKED with the batch and released
-- (BLOCKED -> PENDING, outbox) in the recorder transaction that records the last member
-- reaching a terminal state. The status guard (only a BLOCKED run is released) makes the
-- callback run exactly once, whatever crashes, redeliveries or sweeps happen meanwhile.
CREATE TABLE batches (
    id            uuid PRIMARY KEY,
    name          text,
    on_complete   bigint,   -- released when every member is terminal
    on_success    bigint,   -- released when every member SUCCEEDED, else cancelled
    settled_at    timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- No foreign keys to runs: finished members move to runs_archive (retention) like any run.
CREATE TABLE batch_members (
    run_id    bigint PRIMARY KEY,
    batch_id  uuid NOT NULL REFERENCES batches (id)
);
CREATE INDEX batch_members_batch ON batch_members (batch_id);
-- A callback run finds its batch (ctx.batch_results()).
CREATE INDEX batches_on_complete ON batches (on_complete);
CREATE INDEX batches_on_success ON batches (on_success);

-- Progress is not a checkpoint: the worker coalesces ctx.progress() calls and upserts the
-- latest value of each running attempt about once a second. A separate narrow table keeps
-- these writes off the runs row (no new run version, no event, no index churn on runs).
CREATE TABLE run_progress (
    run_id      bigint PRIMARY KEY,
    attempt     integer NOT NULL,
    done        double precision NOT NULL,
    total       double precision,
    message     text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
