-- 047_history_queue: every history row says its queue, so a queue's history (GET /v1/events?queue=, a
-- scoped token's history, GET /v1/audit?queue=) reads that queue's rows only (issue 24). The recorder
-- wrote event rows and attempt rows without it: a queue filter joined each row to its run and walked the
-- window's rows of every queue (events half of /v1/events?queue=payments at 1,000,000 runs with 20,000
-- operator commands: 343-557 ms). The recorder now writes the queue of the stream an entry came from (the
-- stream is the queue's: no byte added to a stream entry), and every other statement that writes an event
-- row writes its run's queue.
--
-- What each byte costs (issue 23: paid per job):
-- - attempts.queue: the queue's name in each attempt row (the recorder's one row per execution).
-- - attempts_queue_claim_page / attempts_queue_finish_page: 037's page indexes with the queue in front and
--   without the stream id (the claims of one script call share a time: a page sorts that group); they replace
--   037's (dropped below), so an attempt still costs one entry per claim and one per finish. Every queue's
--   history reads them queue by queue (fleet_events_page): at most queues x limit entries a page. Attempts
--   with their indexes, 50,000 written by apply_attempts in 4 interleaved queues: 346.7 bytes a job before
--   (046), 328.5 now, claim and finish in one batch; 504.5 and 525.1 in two. Kept beside 037's instead, with
--   the stream id, these cost 149 bytes a job more than 046 (495.9).
--   Attempts cannot be bounded through `runs` (no index of a queue's runs by start or finish: adding one to
--   `runs` is paid by every transition's update).
-- - events_queue_at: a queue's event rows by time. Event rows are not per job since 020 (claims and
--   finishes are attempt columns, a PENDING submit is its run's row: 021): retries, expiries, commands.
-- - events_operator_queue_at: the audit view's run commands of a queue, the rows of events_operator_at only.
-- - events_queue_unknown, attempts_queue_unknown_claim / _finish: the history rows of a run that carry no queue
--   (an older recorder still running during an upgrade, a writer that does not name it, a row whose run the
--   backfill did not find): a queue's history finds them through their run, as before, without walking the
--   others. Every writer names the queue now, so they stay about empty and cost nothing per job.
-- Each is ascending and read backwards: a queue's rows come in about time order, so its range grows at its
-- right end and B-tree splits there leave full pages (a descending key inserts at the left end of each range,
-- and those splits leave pages half empty).
ALTER TABLE attempts ADD COLUMN queue text;
DROP INDEX IF EXISTS attempts_claim_page;
DROP INDEX IF EXISTS attempts_finish_page;

-- Rows an older version stored: their run's queue (runs, else the archive), in batches of 50,000 ids so no
-- statement joins the whole history at once. Event rows are append-only (001's trigger refuses an update):
-- the trigger is set aside for this backfill only, inside this migration's transaction. Attempt rows read by
-- the history pages only (a claim or finish recorded as their columns, 020) are filled; older ones have no
-- such column to show and stay NULL. A row whose run is in neither table keeps a NULL queue (no queue's
-- history showed it before either: its queue was looked up through the run).
ALTER TABLE events DISABLE TRIGGER events_append_only;
DO $$
DECLARE
    lo bigint;
    hi bigint;
    step constant bigint := 50000;
BEGIN
    SELECT min(id), max(id) INTO lo, hi FROM events WHERE queue IS NULL AND run_id IS NOT NULL;
    WHILE lo IS NOT NULL AND lo <= hi LOOP
        UPDATE events e SET queue = r.queue FROM runs r
        WHERE e.id >= lo AND e.id < lo + step AND e.queue IS NULL AND r.id = e.run_id;
        UPDATE events e SET queue = ra.queue FROM runs_archive ra
        WHERE e.id >= lo AND e.id < lo + step AND e.queue IS NULL AND ra.id = e.run_id;
        lo := lo + step;
    END LOOP;
    SELECT min(run_id), max(run_id) INTO lo, hi FROM attempts
    WHERE queue IS NULL AND (claim_version IS NOT NULL OR finish_type IS NOT NULL);
    WHILE lo IS NOT NULL AND lo <= hi LOOP
        UPDATE attempts a SET queue = r.queue FROM runs r
        WHERE a.run_id >= lo AND a.run_id < lo + step AND a.queue IS NULL
          AND (a.claim_version IS NOT NULL OR a.finish_type IS NOT NULL) AND r.id = a.run_id;
        UPDATE attempts a SET queue = ra.queue FROM runs_archive ra
        WHERE a.run_id >= lo AND a.run_id < lo + step AND a.queue IS NULL
          AND (a.claim_version IS NOT NULL OR a.finish_type IS NOT NULL) AND ra.id = a.run_id;
        lo := lo + step;
    END LOOP;
END $$;
ALTER TABLE events ENABLE TRIGGER events_append_only;

-- The indexes, made once the rows have their queue (an update of each row would write every index again).
CREATE INDEX attempts_queue_claim_page ON attempts (queue, started_at) WHERE claim_version IS NOT NULL;
CREATE INDEX attempts_queue_finish_page ON attempts (queue, finished_at) WHERE finish_type IS NOT NULL;
CREATE INDEX events_queue_at ON events (queue, at, id);
CREATE INDEX events_queue_unknown ON events (at, id) WHERE queue IS NULL AND run_id IS NOT NULL;
CREATE INDEX attempts_queue_unknown_claim ON attempts (started_at, claim_stream_id)
    WHERE queue IS NULL AND claim_version IS NOT NULL;
CREATE INDEX attempts_queue_unknown_finish ON attempts (finished_at, finish_stream_id)
    WHERE queue IS NULL AND finish_type IS NOT NULL;
CREATE INDEX events_operator_queue_at ON events (queue, at, id)
    WHERE run_id IS NOT NULL AND actor IS NOT NULL AND type <> 'submitted'
      AND actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger');

-- The timeline view carries each row's queue where the row has it (attempts' now, a submit's run's).
CREATE OR REPLACE VIEW history AS
SELECT id, run_id, queue, type, from_status, to_status, version, attempt, token, worker_id, actor, reason,
       error_class, error_message, trace_id, data, at, recorded_at, stream, stream_id
FROM events
UNION ALL
SELECT -claim_stream_id, run_id, queue, 'claimed', 'PENDING', 'RUNNING', claim_version, attempt, token, worker_id,
       NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::jsonb, started_at, recorded_at, NULL::text,
       claim_stream_id
FROM attempts WHERE claim_version IS NOT NULL
UNION ALL
SELECT -finish_stream_id, run_id, queue, finish_type, finish_from, finish_to, finish_version, attempt, token, worker_id,
       NULL::text, reason, error_class, error_message, NULL::text, NULL::jsonb, finished_at, recorded_at, NULL::text,
       finish_stream_id
FROM attempts WHERE finish_type IS NOT NULL
UNION ALL
SELECT -id, id, queue, 'submitted', NULL::text, 'PENDING', 0::bigint, NULL::integer, NULL::bigint, NULL::text,
       submitted_by, NULL::text, NULL::text, NULL::text, trace_id, NULL::jsonb, created_at, created_at, NULL::text,
       NULL::bigint
FROM runs WHERE submitted_by IS NOT NULL
UNION ALL
SELECT -id, id, queue, 'submitted', NULL::text, 'PENDING', 0::bigint, NULL::integer, NULL::bigint, NULL::text,
       submitted_by, NULL::text, NULL::text, NULL::text, trace_id, NULL::jsonb, created_at, created_at, NULL::text,
       NULL::bigint
FROM runs_archive WHERE submitted_by IS NOT NULL;
