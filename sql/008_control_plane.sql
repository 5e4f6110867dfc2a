-- 008_control_plane: idempotency keys with a scope and a request fingerprint, an audit log
-- of configuration changes, token expiry (issue 14).
--
-- Idempotency: a key is unique per scope, the run's queue, or `queue/tenant` when the submit
-- names a tenant (queue names cannot hold '/'). The same key with the same request (its
-- sha256, computed by the client over the request as given) returns the run it created; with
-- a different request it is an IdempotencyConflict. Keys live in their own table, so they are
-- honoured for FENCEPOST_IDEMPOTENCY_WINDOW (default 7d) whether or not the run has been
-- archived; the reconciler prunes older keys. Keys of runs that existed before this migration
-- have an empty fingerprint: any request with them returns their run.
CREATE TABLE idempotency_keys (
    scope           text NOT NULL,
    key             text NOT NULL,
    request_sha256  text NOT NULL,
    run_id          bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

INSERT INTO idempotency_keys (scope, key, request_sha256, run_id, created_at)
SELECT CASE WHEN tenant = '' THEN queue ELSE queue || '/' || tenant END, idempotency_key, '', id, created_at
FROM runs WHERE idempotency_key IS NOT NULL
ON CONFLICT DO NOTHING;

-- The key no longer squats a global namespace: runs keep the key for display only.
DROP INDEX runs_idempotency_key;
CREATE INDEX runs_idempotency_key ON runs (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Configuration changes and queue commands, written in the transaction of the change
-- (run commands are events, written by the recorder from the command's own stream entry).
CREATE TABLE audit_log (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text NOT NULL,
    address     text,
    action      text NOT NULL,
    queue       text,
    target      text,
    reason      text,
    data        jsonb
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_queue ON audit_log (queue, at);
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION events_append_only();

ALTER TABLE api_tokens ADD COLUMN expires_at timestamptz;
