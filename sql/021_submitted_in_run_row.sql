-- 021_submitted_in_run_row: the run row is the submitted record (issue 23 item 3). A run submitted
-- PENDING through insert_runs / insert_runs_fresh / insert_runs_keyed gets no 'submitted' event row:
-- who submitted it is `submitted_by` in its row, when is `created_at`, and the view `history` shows
-- the 'submitted' transition from the row (to PENDING, version 0). A run submitted in another state
-- (BLOCKED behind its workflow or batch, PAUSED) and the submits of other paths (workflows, batches,
-- compensations) keep their event row; their submitted_by stays NULL, so nothing shows twice.
-- Existing runs keep their 'submitted' event rows (submitted_by NULL): their timeline is unchanged.
ALTER TABLE runs ADD COLUMN submitted_by text;
ALTER TABLE runs_archive ADD COLUMN submitted_by text;

-- The live fleet event stream reads `history` by recorded_at: a submit's is its run's created_at.
-- Runs are inserted in created_at order, so a BRIN index finds the newest pages without an insert
-- into a B-tree per run (and created_at never changes: no update of a run touches it).
CREATE INDEX runs_created_brin ON runs USING brin (created_at) WITH (pages_per_range = 32, autosummarize = on);
CREATE INDEX runs_archive_created_brin ON runs_archive USING brin (created_at);

CREATE OR REPLACE VIEW history AS
SELECT id, run_id, queue, type, from_status, to_status, version, attempt, token, worker_id, actor, reason,
       error_class, error_message, trace_id, data, at, recorded_at, stream, stream_id
FROM events
UNION ALL
SELECT -claim_stream_id, run_id, NULL::text, 'claimed', 'PENDING', 'RUNNING', claim_version, attempt, token, worker_id,
       NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::jsonb, started_at, recorded_at, NULL::text,
       claim_stream_id
FROM attempts WHERE claim_version IS NOT NULL
UNION ALL
SELECT -finish_stream_id, run_id, NULL::text, finish_type, finish_from, finish_to, finish_version, attempt, token, worker_id,
       NULL::text, reason, error_class, error_message, NULL::text, NULL::jsonb, finished_at, recorded_at, NULL::text,
       finish_stream_id
FROM attempts WHERE finish_type IS NOT NULL
UNION ALL
-- a submit recorded in its run's row: id minus the run's id (event ids are positive; the attempts'
-- transitions are minus a stream id, far below any run id's negation)
SELECT -id, id, NULL::text, 'submitted', NULL::text, 'PENDING', 0::bigint, NULL::integer, NULL::bigint, NULL::text,
       submitted_by, NULL::text, NULL::text, NULL::text, trace_id, NULL::jsonb, created_at, created_at, NULL::text,
       NULL::bigint
FROM runs WHERE submitted_by IS NOT NULL
UNION ALL
SELECT -id, id, NULL::text, 'submitted', NULL::text, 'PENDING', 0::bigint, NULL::integer, NULL::bigint, NULL::text,
       submitted_by, NULL::text, NULL::text, NULL::text, trace_id, NULL::jsonb, created_at, created_at, NULL::text,
       NULL::bigint
FROM runs_archive WHERE submitted_by IS NOT NULL;
