-- Named queries: API tokens: create, look up, list, revoke.
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: api_token_insert
-- params: name text, role text, queues text[], secret_sha256 text, created_by text, expires_in_s float8,
-- params: parent_id int8, parent_expires_at timestamptz
-- returns: id int8, name text, role text, queues text[], created_by text, created_at timestamptz,
-- returns: revoked_at timestamptz, last_used_at timestamptz, expires_at timestamptz, parent_id int8
-- $6: expires after this many seconds (NULL: never), $7 the token that made it (NULL: made on PostgreSQL),
-- $8 when that token expires (NULL: never): the new token expires no later.
INSERT INTO api_tokens (name, role, queues, secret_sha256, created_by, expires_at, parent_id)
VALUES ($1, $2, $3::text[], $4, $5, LEAST(now() + make_interval(secs => $6::double precision), $8::timestamptz), $7)
RETURNING id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at, parent_id;

-- name: api_token_by_hash
-- params: secret_sha256 text
-- returns: id int8, name text, role text, queues text[], revoked_at timestamptz, expires_at timestamptz,
-- returns: expired bool, maker_ended bool
-- The token and whether it or any token up its chain of makers (parent_id) is revoked or expired:
-- revoking or expiring a token ends every token it made, transitively.
WITH RECURSIVE t AS (
    SELECT id, name, role, queues, revoked_at, expires_at, parent_id, 0 AS depth
    FROM api_tokens WHERE secret_sha256 = $1
), chain AS (
    SELECT id, parent_id, revoked_at, expires_at, 0 AS depth FROM t
    UNION ALL
    SELECT p.id, p.parent_id, p.revoked_at, p.expires_at, c.depth + 1
    FROM api_tokens p JOIN chain c ON p.id = c.parent_id WHERE c.depth < 64
)
SELECT t.id, t.name, t.role, t.queues, t.revoked_at, t.expires_at,
       (t.expires_at IS NOT NULL AND t.expires_at <= now()) AS expired,
       EXISTS (SELECT 1 FROM chain WHERE depth > 0 AND (revoked_at IS NOT NULL
               OR (expires_at IS NOT NULL AND expires_at <= now()))) AS maker_ended
FROM t;

-- name: api_token_list
-- params: none
-- returns: id int8, name text, role text, queues text[], created_by text, created_at timestamptz,
-- returns: revoked_at timestamptz, last_used_at timestamptz, expires_at timestamptz
SELECT id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at
FROM api_tokens ORDER BY id;

-- name: api_token_revoke
-- params: id int8
-- returns: id int8, name text, role text, queues text[], created_by text, created_at timestamptz,
-- returns: revoked_at timestamptz, last_used_at timestamptz, expires_at timestamptz, descendants int8
-- Revoke the token and every token it made, transitively (their rows say so too; authentication
-- checks the chain anyway). Returns the named token's row.
WITH RECURSIVE tree AS (
    SELECT id FROM api_tokens WHERE id = $1
    UNION
    SELECT c.id FROM api_tokens c JOIN tree ON c.parent_id = tree.id
), done AS (
    UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE id IN (SELECT id FROM tree)
    RETURNING id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at
)
SELECT *, (SELECT count(*) FROM done) - 1 AS descendants FROM done WHERE id = $1;

-- name: api_token_touch
-- params: id int8
-- returns: nothing
UPDATE api_tokens SET last_used_at = now()
WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');

-- name: api_token_list_scoped
-- params: scope text[]
-- returns: id int8, name text, role text, queues text[], created_by text, created_at timestamptz,
-- returns: revoked_at timestamptz, last_used_at timestamptz, expires_at timestamptz
-- Tokens a caller may see: all (NULL), or those scoped within $1's queues.
SELECT id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at
FROM api_tokens
WHERE $1::text[] IS NULL OR (cardinality(queues) > 0 AND queues <@ $1::text[])
ORDER BY id;

-- name: api_token_get
-- params: id int8
-- returns: id int8, name text, role text, queues text[], created_by text, created_at timestamptz,
-- returns: revoked_at timestamptz, last_used_at timestamptz, expires_at timestamptz
SELECT id, name, role, queues, created_by, created_at, revoked_at, last_used_at, expires_at
FROM api_tokens WHERE id = $1;
