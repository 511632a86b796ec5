-- pgdrain 0043: the day partitions of done jobs, as a red team found them.
--
-- - The drop (and the check whether one is due) counted `done_days * interval '1 day'` in the
--   session's TimeZone: across a summer-time change a day is 23 hours, so a partition went an
--   hour before its last jobs reached PGDRAIN_RETAIN_DONE. Now 24-hour days, as the rows'
--   retention (control_plane.sql) and purge count.
-- - A day's partition was made after a check that its done jobs were not in the default
--   partition; a completion not yet committed there passed the check, and the ATTACH then
--   failed the whole call when it found the row: `pgdrain migrate` exited 1 and no day was made.
--   Each day is now made in a subtransaction: such a day is skipped with its NOTICE, as one
--   whose rows were there already, and the days after it are made.
-- Functions only; CREATE OR REPLACE keeps their owner and grants.

CREATE OR REPLACE FUNCTION pgdrain.finished_jobs_partition_ensure(day_from date, day_to date)
RETURNS integer
LANGUAGE plpgsql
-- As the schema's owner (whoever calls it may not create or drop tables), with its own path.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    day date;
    name text;
    made integer := 0;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgdrain.finished_jobs'));
    day := day_from;
    WHILE day <= day_to LOOP
        name := 'finished_jobs_' || pg_catalog.to_char(day, 'YYYYMMDD');
        IF pg_catalog.to_regclass('pgdrain.' || name) IS NULL THEN
            IF EXISTS (SELECT 1 FROM pgdrain.finished_jobs_done_default AS d
                       WHERE d.finished_at >= day::timestamp AT TIME ZONE 'UTC'
                         AND d.finished_at < (day + 1)::timestamp AT TIME ZONE 'UTC') THEN
                RAISE NOTICE 'pgdrain: % not made: its done jobs are in the default partition', name;
            ELSE
                BEGIN
                    EXECUTE pg_catalog.format(
                        'CREATE TABLE pgdrain.%I (LIKE pgdrain.finished_jobs_done INCLUDING DEFAULTS'
                        ' INCLUDING CONSTRAINTS)', name);
                    -- The partition's bound as a CHECK first: ATTACH then needs no scan of it.
                    EXECUTE pg_catalog.format(
                        'ALTER TABLE pgdrain.%I ADD CONSTRAINT %I CHECK (status = ''done'' AND'
                        ' finished_at IS NOT NULL AND finished_at >= %L AND finished_at < %L)',
                        name, name || '_chk', day::timestamp AT TIME ZONE 'UTC',
                        (day + 1)::timestamp AT TIME ZONE 'UTC');
                    -- Scans the default partition once it holds its lock: a row committed
                    -- there since the check above fails it, and the subtransaction goes.
                    EXECUTE pg_catalog.format(
                        'ALTER TABLE pgdrain.finished_jobs_done ATTACH PARTITION pgdrain.%I'
                        ' FOR VALUES FROM (%L) TO (%L)',
                        name, day::timestamp AT TIME ZONE 'UTC',
                        (day + 1)::timestamp AT TIME ZONE 'UTC');
                    made := made + 1;
                EXCEPTION WHEN check_violation THEN
                    RAISE NOTICE 'pgdrain: % not made: its done jobs are in the default partition',
                        name;
                END;
            END IF;
        END IF;
        day := day + 1;
    END LOOP;
    RETURN made;
END
$$;

CREATE OR REPLACE FUNCTION pgdrain.finished_jobs_partition_drop(done_days float8)
RETURNS integer
LANGUAGE plpgsql
-- As the schema's owner (whoever calls it may not create or drop tables), with its own path.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    part record;
    dropped integer := 0;
BEGIN
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pgdrain.finished_jobs'));
    FOR part IN
        SELECT c.relname
        FROM pg_catalog.pg_inherits AS i
        JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'pgdrain.finished_jobs_done'::regclass
          AND c.relname ~ '^finished_jobs_[0-9]{8}$'
          AND (pg_catalog.to_date(pg_catalog.substr(c.relname, 15), 'YYYYMMDD') + 1)::timestamp
                  AT TIME ZONE 'UTC' <= now() - done_days * interval '24 hours'
        ORDER BY c.relname
    LOOP
        EXECUTE pg_catalog.format(
            'ALTER TABLE pgdrain.finished_jobs_done DETACH PARTITION pgdrain.%I', part.relname);
        EXECUTE pg_catalog.format('DROP TABLE pgdrain.%I', part.relname);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$$;

CREATE OR REPLACE FUNCTION pgdrain.finished_jobs_partition_due(done_days float8)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.to_regclass('pgdrain.finished_jobs_'
               || pg_catalog.to_char((now() AT TIME ZONE 'UTC')::date + 2, 'YYYYMMDD')) IS NULL
        OR EXISTS (
            SELECT 1
            FROM pg_catalog.pg_inherits AS i
            JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'pgdrain.finished_jobs_done'::regclass
              AND c.relname ~ '^finished_jobs_[0-9]{8}$'
              AND (pg_catalog.to_date(pg_catalog.substr(c.relname, 15), 'YYYYMMDD') + 1)::timestamp
                      AT TIME ZONE 'UTC' <= now() - done_days * interval '24 hours')
        OR EXISTS (SELECT 1 FROM pgdrain.active_jobs
                   WHERE status IN ('done', 'failed', 'cancelled'))
$$;
