-- Named queries run by psql, not asyncpg (fencepost.core.record.psql_script): the embedded
-- server's first start creates the database before any pool can connect to it.

-- name: bootstrap_create_database
-- unchecked: a psql script (psql variables and meta-commands), run before any database exists
-- CREATE DATABASE takes no parameters and cannot run inside a function or transaction, so
-- this builds the statement and psql's \gexec runs it; :'dbname' is a psql variable
-- (psql -v dbname=...). Does nothing when the database exists.
SELECT format('CREATE DATABASE %I', :'dbname')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'dbname')\gexec
