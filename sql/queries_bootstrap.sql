-- Named queries: Connection check, and the statement psql runs before any pool can connect (the embedded
-- server's first start creates the database).
-- One file per noun (issue 25); fencepost/core/record.py is the only module that runs
-- SQL and loads these by name; every name is used and every used name exists (tests/test_gateways.py).

-- name: ping
-- params: none
-- returns: ?column? int4
-- Readiness probe of the HTTP API.
SELECT 1;

-- name: bootstrap_create_database
-- unchecked: a psql script (psql variables and meta-commands), run before any database exists
-- CREATE DATABASE takes no parameters and cannot run inside a function or transaction, so
-- this builds the statement and psql's \gexec runs it; :'dbname' is a psql variable
-- (psql -v dbname=...). Does nothing when the database exists.
SELECT format('CREATE DATABASE %I', :'dbname')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'dbname')\gexec
