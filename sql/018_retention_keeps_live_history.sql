-- 018_retention_keeps_live_history: retention never removes history of a run that is not
-- finished (issue 22 item 10). A month's partition of events or attempts is dropped as a whole
-- once it ends before the cutoff, but a run submitted that month may still be waiting, and a job
-- claimed just before a month boundary may still be running when `--keep 12h` drops that month:
-- it lost its `submitted` event, its claim, its attempt row (and the finish then made a new row
-- with started_at = finished_at, rewriting when the attempt began).
--
-- Now the drop detaches the partition, puts the rows of every run that is not finished ($2: the
-- finished states, fencepost/core/states.py TERMINAL) back through the parent (the month has no
-- partition any more, so they land in DEFAULT, as any late row of that month would), and drops
-- the rest. Returns how many rows it kept. The archive, written before, holds the whole partition.
DROP FUNCTION fencepost_drop_partition(regclass);
CREATE FUNCTION fencepost_drop_partition(part regclass, finished text[]) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    parent regclass;
    cols text;
    kept bigint := 0;
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
    IF parent IN ('events'::regclass, 'attempts'::regclass) THEN  -- runs_archive holds finished runs only
        SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO cols
        FROM pg_attribute WHERE attrelid = parent AND attnum > 0 AND NOT attisdropped;
        EXECUTE format('INSERT INTO %s (%s) %s SELECT %s FROM %s p WHERE p.run_id IN '
                       '(SELECT id FROM runs WHERE status <> ALL ($1))', parent, cols,
                       CASE WHEN parent = 'events'::regclass THEN 'OVERRIDING SYSTEM VALUE' ELSE '' END, cols, part)
            USING finished;
        GET DIAGNOSTICS kept = ROW_COUNT;
    END IF;
    EXECUTE format('DROP TABLE %s', part);
    RETURN kept;
END $$;
