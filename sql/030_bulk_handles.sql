-- 030_bulk_handles: the runs a bulk count selected (issue 24 item 1). A count stores each
-- selected run's id, state and version under a random handle bound to the counting token, the
-- queue and the command; the confirm names the handle and acts only on the runs that still match.
-- A handle is short-lived (expires_at) and used once (the confirm deletes it).
CREATE TABLE bulk_handles (
    handle      text PRIMARY KEY CHECK (handle ~ '^[0-9a-f]{32}$'),
    token_id    bigint NOT NULL,
    queue       text NOT NULL,
    command     text NOT NULL,
    selection   jsonb NOT NULL,          -- status, handler, limit, until_id as counted
    matched     bigint NOT NULL,
    ids         bigint[] NOT NULL,
    states      text[] NOT NULL,
    versions    bigint[] NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX bulk_handles_expiry ON bulk_handles (expires_at);
