-- 020_attempt_history: history as one row per attempt (issue 23, DESIGN.md invariant 5).
--
-- An attempt's claim and its closing transition by the worker (succeeded, failed, timed_out, and
-- paused / stopped / cancelled / released at a safe boundary) are columns of its attempts row, not
-- event rows: the recorder writes the row once when the claim and the finish fall in one batch and
-- updates it once otherwise. Everything else stays an event row (submit, operator commands, retries
-- scheduled, lease expiries, repairs). The view `history` shows both as one timeline of event-shaped
-- rows; `run_events` (queries.sql), and so `fencepost events RUN`, GET /v1/runs/{id}/events and the
-- dashboard, read it.
--
-- Existing history carries across as it is: the attempts rows written before this migration have
-- NULL claim_version / finish_type, so `history` derives nothing from them, and their claimed /
-- succeeded / failed event rows stay where they are (events are append-only). An old run's
-- timeline is exactly its old events; a new run's is its events plus its attempts' columns.
--
-- claim_stream_id / finish_stream_id: the stream entries (Redis entry id as one bigint, as
-- events.stream_id) the two transitions came from, so a replayed batch can tell what it already
-- recorded, and a timeline row still names its entry.
ALTER TABLE attempts
    ADD COLUMN claim_version    bigint,
    ADD COLUMN claim_stream_id  bigint,
    ADD COLUMN finish_type      text,
    ADD COLUMN finish_from      text,
    ADD COLUMN finish_to        text,
    ADD COLUMN finish_version   bigint,
    ADD COLUMN finish_stream_id bigint,
    ADD COLUMN reason           text,
    ADD COLUMN recorded_at      timestamptz NOT NULL DEFAULT now();

-- The columns of events, in its order. An attempt's transition has no event id: its id is minus its
-- stream id (event ids are positive), and it has no queue, actor, data or stream name of its own.
CREATE VIEW history AS
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
FROM attempts WHERE finish_type IS NOT NULL;

-- The live fleet event stream (queries_stream.sql) reads both halves of `history` by recorded_at.
CREATE INDEX attempts_recorded_at ON attempts USING brin (recorded_at) WITH (pages_per_range = 32, autosummarize = on);
