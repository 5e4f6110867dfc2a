-- Named queries: Bulk-action handles: a count stores the runs it selected; the confirm takes the handle once.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: bulk_handle_insert
-- params: handle text, token_id int8, queue text, action text, list text, selection jsonb, matched int8,
-- params: ids int8[], queues text[], states text[], versions int8[], p12 float8
-- returns: expires_at timestamptz
-- Store a counted set (every bulk action: the API's queue bulk and the dashboard's lists, 036):
-- $1 handle, $2 token, $3 queue ('queue' list: its queue; else NULL), $4 action, $5 list, $6 selection
-- (json text), $7 matched, $8 ids, $9 their queues, $10 states, $11 versions, $12 seconds it lives.
-- Expired handles go first.
WITH gone AS (
    DELETE FROM bulk_handles WHERE expires_at < now()
)
INSERT INTO bulk_handles (handle, token_id, queue, action, list, selection, matched, ids, queues, states, versions,
                          expires_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8::bigint[], $9::text[], $10::text[], $11::bigint[],
        now() + make_interval(secs => $12::double precision))
RETURNING expires_at;

-- name: bulk_handle_get
-- params: handle text, token_id int8
-- returns: handle text, queue text, action text, list text, selection text, matched int8, ids int8[],
-- returns: queues text[], states text[], versions int8[], expires_at timestamptz
-- A live handle of this token ($1 handle, $2 token id); no row: unknown, expired, used or another's.
SELECT handle, queue, action, list, selection::text AS selection, matched, ids, queues, states, versions, expires_at
FROM bulk_handles WHERE handle = $1 AND token_id = $2 AND expires_at > now();

-- name: bulk_handle_take
-- params: handle text, token_id int8
-- returns: handle text
-- Use a handle once (in the transaction of the bulk action's audit row): no row when a concurrent
-- confirm took it first or it expired meanwhile.
DELETE FROM bulk_handles WHERE handle = $1 AND token_id = $2 AND expires_at > now() RETURNING handle;
