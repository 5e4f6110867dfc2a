-- Named queries of a large submit_many (fencepost/client.py): one transaction per call, and the
-- answer to "did it commit?" when the connection is lost during COMMIT (issue 22 item 9).

-- name: batch_txid
-- params: none
-- returns: txid int8
-- The batch's transaction id, taken inside it before any insert.
SELECT txid_current() AS txid;

-- name: batch_txid_status
-- params: p1 int8
-- returns: status text
-- 'committed', 'aborted' or 'in progress' (NULL: too old to say). A transaction in progress when
-- the server crashed reads 'aborted' after the restart.
SELECT txid_status($1::bigint) AS status;
