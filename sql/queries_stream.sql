-- Named queries of the live fleet event stream (fencepost.api.stream).

-- name: events_recorded_since
-- The newest $3 events recorded after $1 (NULL: now) minus $2 seconds of look-back (a recorder's
-- transaction that began before the last look but committed after it), newest first, with the run's
-- queue and handler as api_events_scoped gives them. BRIN events_recorded_at (016).
SELECT e.id, e.run_id, COALESCE(r.queue, e.queue) AS queue, e.type, e.from_status, e.to_status, e.version,
       e.attempt, e.worker_id, e.actor, e.reason, e.error_class, e.at, e.recorded_at, r.handler, r.trace_id
FROM events e LEFT JOIN runs r ON r.id = e.run_id
WHERE e.recorded_at > COALESCE($1::timestamptz, now()) - make_interval(secs => $2::double precision)
ORDER BY e.recorded_at DESC, e.id DESC LIMIT $3;
