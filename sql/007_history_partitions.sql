-- 007_history_partitions: history partitioned by month, so retention is a partition drop
-- (`fencepost retention`), never a DELETE; finished runs leave the hot `runs` table for
-- `runs_archive` (scheduler/retention.py, run by the reconciler).
--
-- events (by `at`), attempts (by `started_at`) and runs_archive (by `finished_at`) have one
-- partition per UTC month, named <table>_y2026m11, plus a DEFAULT partition as a safety
-- net for rows of a month nobody created yet. A unique key of a partitioned table must
-- include the partition key:
--   * events: (id, at), and the recorder's (stream, stream_id, at). `at` comes from the
--     stream entry's ts, so a redelivered entry still conflicts and stays a no-op.
--   * attempts: (run_id, attempt, started_at). apply_attempts (queries.sql) closes an
--     attempt by (run_id, attempt), because the closing transition does not carry its start.
-- attempts loses its foreign key to runs: history outlives the run's hot row.
-- runs_archive has the columns of runs in the same order (INSERT .. SELECT * moves rows):
-- a later migration that adds a column to runs must add it to runs_archive too.

-- Advisory lock 0x46505254 ("FPRT") serializes partition maintenance across replicas.
CREATE FUNCTION fencepost_ensure_partitions(from_month date, months_ahead integer) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    parent text;
    col text;
    dflt text;
    part text;
    m date;
    lo timestamptz;
    hi timestamptz;
    strays boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(1179668052);
    FOR parent, col IN VALUES ('events', 'at'), ('attempts', 'started_at'), ('runs_archive', 'finished_at') LOOP
        dflt := parent || '_default';
        IF to_regclass(dflt) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', dflt, parent);
            RETURN NEXT dflt;
        END IF;
        FOR i IN 0..months_ahead LOOP
            m := (date_trunc('month', from_month) + make_interval(months => i))::date;
            part := format('%s_y%sm%s', parent, to_char(m, 'YYYY'), to_char(m, 'MM'));
            CONTINUE WHEN to_regclass(part) IS NOT NULL;
            lo := m::timestamp AT TIME ZONE 'UTC';
            hi := (m + interval '1 month')::timestamp AT TIME ZONE 'UTC';
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= $1 AND %I < $2)', dflt, col, col)
                INTO strays USING lo, hi;
            IF strays THEN
                -- The new month's range must not hold rows in DEFAULT: set DEFAULT aside, create the
                -- month and a new DEFAULT, and route its rows again through the parent. The old
                -- DEFAULT is dropped, not deleted from (events refuse DELETE; DROP is no DELETE).
                EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, dflt);
                EXECUTE format('ALTER TABLE %I RENAME TO %I', dflt, dflt || '_moving');
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', part, parent, lo, hi);
                EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', dflt, parent);
                EXECUTE format('INSERT INTO %I OVERRIDING SYSTEM VALUE SELECT * FROM %I', parent, dflt || '_moving');
                EXECUTE format('DROP TABLE %I', dflt || '_moving');
            ELSE
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', part, parent, lo, hi);
            END IF;
            RETURN NEXT part;
        END LOOP;
    END LOOP;
END $$;

-- Rows of one partition; with `lock_writes`, first a SHARE lock (readers go on, writers wait)
-- so that what retention archives is exactly what it then drops. NULL for a missing one.
CREATE FUNCTION fencepost_partition_rows(part regclass, lock_writes boolean) RETURNS bigint
LANGUAGE plpgsql STRICT AS $$
DECLARE
    n bigint;
BEGIN
    IF lock_writes THEN
        EXECUTE format('LOCK TABLE %s IN SHARE MODE', part);
    END IF;
    EXECUTE format('SELECT count(*) FROM %s', part) INTO n;
    RETURN n;
END $$;

-- Detach and drop one monthly partition of the history tables (never DEFAULT, never any
-- other table). Plain DETACH: CONCURRENTLY is refused while a DEFAULT partition exists.
CREATE FUNCTION fencepost_drop_partition(part regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    parent regclass;
BEGIN
    SELECT i.inhparent INTO parent
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhrelid = part
      AND i.inhparent IN ('events'::regclass, 'attempts'::regclass, 'runs_archive'::regclass)
      AND pg_get_expr(c.relpartbound, c.oid) <> 'DEFAULT';
    IF parent IS NULL THEN
        RAISE EXCEPTION '% is not a monthly partition of events, attempts or runs_archive', part
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE format('ALTER TABLE %s DETACH PARTITION %s', parent, part);
    EXECUTE format('DROP TABLE %s', part);
END $$;

ALTER TABLE events RENAME TO events_pre007;
ALTER TABLE attempts RENAME TO attempts_pre007;

CREATE TABLE events (
    id              bigint GENERATED ALWAYS AS IDENTITY (CACHE 1000),
    run_id          bigint,
    queue           text,
    type            text NOT NULL,
    from_status     text,
    to_status       text,
    version         bigint,
    attempt         integer,
    token           bigint,
    worker_id       text,
    actor           text,
    reason          text,
    error_class     text,
    error_message   text,
    trace_id        text,
    data            jsonb,
    at              timestamptz NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    stream          text,
    stream_id       bigint,
    CHECK (run_id IS NOT NULL OR queue IS NOT NULL)
) PARTITION BY RANGE (at);

CREATE TABLE attempts (
    run_id          bigint NOT NULL,
    attempt         integer NOT NULL CHECK (attempt > 0),
    token           bigint NOT NULL,
    worker_id       text NOT NULL,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    outcome         text CHECK (outcome IN ('succeeded', 'error', 'fatal', 'timeout', 'crash', 'review', 'policy',
                        'deferred', 'interrupted', 'released', 'paused', 'stopped', 'cancelled')),
    error_class     text,
    error_message   text,
    CHECK ((outcome IS NULL) = (finished_at IS NULL))
) PARTITION BY RANGE (started_at);

-- Columns (and NOT NULLs) of runs, no defaults, identity or CHECKs: rows only ever come
-- from runs, which checked them.
CREATE TABLE runs_archive (LIKE runs) PARTITION BY RANGE (finished_at);
ALTER TABLE runs_archive ALTER COLUMN finished_at SET NOT NULL;

-- Partitions for every month that already has history (or finished runs to archive), up
-- to two months ahead, before the rows are copied in.
SELECT count(*) FROM (
    SELECT fencepost_ensure_partitions(
               lo, (extract(year FROM age(hi, lo)) * 12 + extract(month FROM age(hi, lo)))::integer)
    FROM (SELECT date_trunc('month', LEAST(now(),
                     (SELECT min(at) FROM events_pre007),
                     (SELECT min(started_at) FROM attempts_pre007),
                     (SELECT min(finished_at) FROM runs)) AT TIME ZONE 'UTC')::date AS lo,
                 (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '2 months')::date AS hi) b
) created;

INSERT INTO events OVERRIDING SYSTEM VALUE SELECT * FROM events_pre007;
INSERT INTO attempts SELECT * FROM attempts_pre007;
DROP TABLE events_pre007;
DROP TABLE attempts_pre007;

DO $$
BEGIN
    EXECUTE format('ALTER SEQUENCE %s RENAME TO events_id_seq', pg_get_serial_sequence('events', 'id'));
END $$;
SELECT setval(pg_get_serial_sequence('events', 'id'), COALESCE(max(id), 0) + 1, false) FROM events;

ALTER TABLE events ADD PRIMARY KEY (id, at);
CREATE UNIQUE INDEX events_stream_entry ON events (stream, stream_id, at) WHERE stream_id IS NOT NULL;
CREATE INDEX events_run ON events (run_id, id);
CREATE INDEX events_type_at ON events (type, at);
CREATE INDEX events_submitted_actor ON events (actor, run_id) WHERE type = 'submitted';
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();

ALTER TABLE attempts ADD PRIMARY KEY (run_id, attempt, started_at);

ALTER TABLE runs_archive ADD PRIMARY KEY (id, finished_at);

-- The archiver's scan: oldest finished runs first (finished_at is set iff the run is terminal).
CREATE INDEX runs_finished ON runs (finished_at) WHERE finished_at IS NOT NULL;
