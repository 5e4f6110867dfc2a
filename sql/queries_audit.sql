-- Named queries: The audit log of operator actions.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: audit_insert
-- params: actor text, address text, action text, queue text, target text, reason text, data jsonb
-- returns: id int8, at timestamptz
-- $1 actor, $2 address, $3 action, $4 queue, $5 target, $6 reason, $7 data (json text)
INSERT INTO audit_log (actor, address, action, queue, target, reason, data)
VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7::jsonb)
RETURNING id, at;

-- name: audit_list
-- params: actor text, queue text, min_at timestamptz, max_at timestamptz, limit int8, scope text[],
-- params: after_key jsonb
-- returns: source text, id int8, at timestamptz, actor text, address text, action text, queue text,
-- returns: target text, reason text, data text
-- Who did what: configuration changes and queue commands (audit_log) and commands on runs
-- (run events with an operator's actor), newest first. $1 actor (exact, or a prefix ending in ':' / '@'),
-- $2 queue, $3 since, $4 until, $5 limit, $6 queues in scope (NULL: all), $7 the cursor: only rows after
-- the key [at, id, source] (JSON; NULL: from the newest) in the order at, id, source, all descending (a
-- row of the log and an event may share at and id: the source tells them apart, 'run' first).
-- Each side is limited on its own index before they are merged, so the view never reads the events
-- operators did not make. The log is read on audit_log_at_id for every queue, and queue by queue on
-- audit_log_queue_at_id (046) for a queue or a scoped token's queues: one scan of audit_log_at_id read every
-- other queue's entry from the cursor down (issue 24: 38-70 ms deep at 1M). The log's half is read first;
-- when it fills a page, the commands older than its oldest entry cannot be on it, so the commands' half
-- stops there instead of walking every older command. The commands are read on events_operator_at for every
-- queue, and queue by queue on events_operator_queue_at for a queue or a scoped token's queues (047: a command's
-- event row carries its run's queue; before, each command's run was looked up and other queues' commands
-- walked from the cursor down, 55-227 ms deep with 20,000 commands at 1,000,000 runs). A row an older version
-- wrote without its queue and not backfilled (its run gone from both tables) shows its run's queue where known.
WITH cfg AS MATERIALIZED (SELECT * FROM (
    (SELECT 'config' AS source, a.id, a.at, a.actor, a.address, a.action, a.queue, a.target, a.reason,
            a.data::text AS data
     FROM audit_log a
     WHERE $2::text IS NULL AND $6::text[] IS NULL  -- every queue: audit_log_at_id
       AND ($1::text IS NULL OR a.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(a.actor, $1)))
       AND ($3::timestamptz IS NULL OR a.at >= $3) AND ($4::timestamptz IS NULL OR a.at < $4)
       AND ($7::jsonb IS NULL OR (a.at <= ($7->>0)::timestamptz
            AND ((a.at, a.id) < (($7->>0)::timestamptz, ($7->>1)::bigint)
                 OR (a.at = ($7->>0)::timestamptz AND a.id = ($7->>1)::bigint AND $7->>2 = 'run'))))
     ORDER BY a.at DESC, a.id DESC LIMIT $5)
    UNION ALL
    -- a queue, or a scoped token's queues: audit_log_queue_at_id queue by queue, one range of the index from
    -- (queue, the cursor or until) down to (queue, since). The range is two row comparisons and nothing else
    -- on at: with queue = q and the cursor's at <= ..., the planner read audit_log_at_id in time order and
    -- filtered on the queue (it costs a queue's entries as scattered and guesses a queue holds half the log),
    -- reading every other queue's entry. The cursor's key [at, id, source] bounds it as (at, id) < (at, id + 1)
    -- when its source is 'run' (the log's entry of that key is still to come), else < (at, id); until as
    -- (until, lowest id), whichever is lower.
    (SELECT s.* FROM (SELECT DISTINCT unnest(CASE WHEN $2::text IS NOT NULL THEN ARRAY[$2::text] ELSE $6::text[] END)) q(queue)
     CROSS JOIN (SELECT ($7->>0)::timestamptz AS at, CASE WHEN $7->>2 = 'run' THEN LEAST(($7->>1)::bigint, 9223372036854775806) + 1
                                                         ELSE ($7->>1)::bigint END AS id) k
     CROSS JOIN LATERAL (
        SELECT 'config' AS source, a.id, a.at, a.actor, a.address, a.action, a.queue, a.target, a.reason,
               a.data::text AS data
        FROM audit_log a
        WHERE ($6::text[] IS NULL OR q.queue = ANY($6))  -- a queue out of scope: none (on q, not a: see above)
          AND (a.queue, a.at, a.id) >= (q.queue, COALESCE($3::timestamptz, '-infinity'), -9223372036854775808)
          AND (a.queue, a.at, a.id) < (q.queue, LEAST(k.at, $4::timestamptz, 'infinity'),
                                       CASE WHEN $4::timestamptz IS NOT NULL AND (k.at IS NULL OR $4::timestamptz <= k.at)
                                            THEN -9223372036854775808 ELSE COALESCE(k.id, 9223372036854775807) END)
          AND ($1::text IS NULL OR a.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(a.actor, $1)))
        ORDER BY a.queue DESC, a.at DESC, a.id DESC LIMIT $5) s)
) c ORDER BY at DESC, id DESC LIMIT $5
), floor AS (
    SELECT CASE WHEN count(*) >= $5 THEN min(at) END AS at FROM cfg
)
SELECT * FROM (
    SELECT * FROM cfg
    UNION ALL
    (SELECT ev.* FROM floor f CROSS JOIN LATERAL (  -- every queue: events_operator_at
     SELECT 'run' AS source, e.id, e.at, e.actor, NULL::text, e.type, q.queue, e.run_id::text, e.reason,
            json_build_object('from', e.from_status, 'to', e.to_status, 'version', e.version)::text
     FROM events e
     CROSS JOIN LATERAL (SELECT COALESCE(e.queue, (SELECT r.queue FROM runs r WHERE r.id = e.run_id),
                                         (SELECT ra.queue FROM runs_archive ra WHERE ra.id = e.run_id LIMIT 1)) AS queue) q
     WHERE $2::text IS NULL AND $6::text[] IS NULL
       AND e.run_id IS NOT NULL AND e.actor IS NOT NULL AND e.type <> 'submitted'
       AND e.actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger')
       AND e.at >= COALESCE(f.at, $3, '-infinity')
       AND ($1::text IS NULL OR e.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(e.actor, $1)))
       AND ($3::timestamptz IS NULL OR e.at >= $3) AND ($4::timestamptz IS NULL OR e.at < $4)
       AND ($7::jsonb IS NULL OR (e.at <= ($7->>0)::timestamptz
            AND (e.at, e.id) < (($7->>0)::timestamptz, ($7->>1)::bigint)))
     ORDER BY e.at DESC, e.id DESC LIMIT $5) ev)
    UNION ALL
    -- a queue, or a scoped token's queues: events_operator_queue_at (047: a command's row carries its run's
    -- queue) queue by queue, one range from (queue, the cursor or until) down to (queue, the floor or since),
    -- bounded by row comparisons as the log's half is
    (SELECT ev.* FROM floor f
     CROSS JOIN (SELECT DISTINCT unnest(CASE WHEN $2::text IS NOT NULL THEN ARRAY[$2::text] ELSE $6::text[] END)) q(queue)
     CROSS JOIN LATERAL (
        SELECT 'run' AS source, e.id, e.at, e.actor, NULL::text, e.type, e.queue, e.run_id::text, e.reason,
               json_build_object('from', e.from_status, 'to', e.to_status, 'version', e.version)::text
        FROM events e
        WHERE ($6::text[] IS NULL OR q.queue = ANY($6))
          AND e.run_id IS NOT NULL AND e.actor IS NOT NULL AND e.type <> 'submitted'
          AND e.actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger')
          AND (e.queue, e.at, e.id) <= (q.queue, LEAST(($7->>0)::timestamptz, $4::timestamptz, 'infinity'), 9223372036854775807)
          AND (e.queue, e.at, e.id) >= (q.queue, GREATEST(f.at, $3::timestamptz, '-infinity'), -9223372036854775808)
          AND ($1::text IS NULL OR e.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(e.actor, $1)))
          AND ($4::timestamptz IS NULL OR e.at < $4)
          AND ($7::jsonb IS NULL OR (e.at, e.id) < (($7->>0)::timestamptz, ($7->>1)::bigint))
        ORDER BY e.queue DESC, e.at DESC, e.id DESC LIMIT $5) ev)
    UNION ALL
    -- and the commands whose row carries no queue, through their run (events_queue_unknown: about empty)
    (SELECT ev.* FROM floor f CROSS JOIN LATERAL (
        SELECT 'run' AS source, e.id, e.at, e.actor, NULL::text, e.type, q.queue, e.run_id::text, e.reason,
               json_build_object('from', e.from_status, 'to', e.to_status, 'version', e.version)::text
        FROM events e
        CROSS JOIN LATERAL (SELECT COALESCE((SELECT r.queue FROM runs r WHERE r.id = e.run_id),
                                            (SELECT ra.queue FROM runs_archive ra WHERE ra.id = e.run_id LIMIT 1)) AS queue) q
        WHERE ($2::text IS NOT NULL OR $6::text[] IS NOT NULL) AND e.queue IS NULL AND e.run_id IS NOT NULL
          AND e.actor IS NOT NULL AND e.type <> 'submitted' AND e.actor NOT IN ('worker', 'recorder', 'reconciler', 'trigger')
          AND e.at >= COALESCE(f.at, $3, '-infinity')
          AND ($1::text IS NULL OR e.actor = $1 OR (right($1, 1) IN (':', '@') AND starts_with(e.actor, $1)))
          AND ($2::text IS NULL OR q.queue = $2) AND ($6::text[] IS NULL OR q.queue = ANY($6))
          AND ($3::timestamptz IS NULL OR e.at >= $3) AND ($4::timestamptz IS NULL OR e.at < $4)
          AND ($7::jsonb IS NULL OR (e.at <= ($7->>0)::timestamptz
               AND (e.at, e.id) < (($7->>0)::timestamptz, ($7->>1)::bigint)))
        ORDER BY e.at DESC, e.id DESC LIMIT $5) ev)
) x
ORDER BY at DESC, id DESC, source DESC LIMIT $5;
