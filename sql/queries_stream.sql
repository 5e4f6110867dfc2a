-- Named queries of the live fleet event stream (fencepost.api.stream).

-- name: events_recorded_since
-- params: p1 timestamptz, p2 float8, limit int8
-- returns: id int8, run_id int8, queue text, type text, from_status text, to_status text, version int8,
-- returns: attempt int4, worker_id text, actor text, reason text, error_class text, at timestamptz,
-- returns: recorded_at timestamptz, handler text, trace_id text
-- The newest $3 events recorded after $1 (NULL: now) minus $2 seconds of look-back (a recorder's
-- transaction that began before the last look but committed after it), newest first, with the run's
-- queue and handler as api_events_scoped gives them. From `history` (020): the event rows and the
-- attempts' claims and finishes; BRIN events_recorded_at (016) and attempts_recorded_at (020). An
-- attempt row written again (its finish in a later batch) shows its claim again with the new time:
-- a subscriber's look-back window drops the repeat when it is within it.
SELECT e.id, e.run_id, COALESCE(r.queue, e.queue) AS queue, e.type, e.from_status, e.to_status, e.version,
       e.attempt, e.worker_id, e.actor, e.reason, e.error_class, e.at, e.recorded_at, r.handler, r.trace_id
FROM history e LEFT JOIN runs r ON r.id = e.run_id
WHERE e.recorded_at > COALESCE($1::timestamptz, now()) - make_interval(secs => $2::double precision)
ORDER BY e.recorded_at DESC, e.id DESC LIMIT $3;
