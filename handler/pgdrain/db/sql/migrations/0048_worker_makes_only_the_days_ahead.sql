-- pgdrain 0048: the worker makes only the day partitions its runs need, as a red team found.
--
-- pgdrain_worker could call pgdrain.finished_jobs_partition_ensure(day_from, day_to), which
-- runs as the schema's owner, with any range: a job's code (or the function's credentials)
-- made the owner create 730 tables a call, dated centuries ahead, which retention never drops,
-- and `pgdrain stats` went from half a second to a minute. A run asks only for today to the
-- day after tomorrow: pgdrain.finished_jobs_partition_ensure_ahead() takes no range, and is
-- what the worker may call now. The owner keeps the function with a range (`pgdrain
-- migrate`, by hand). Catalog changes only.

CREATE FUNCTION pgdrain.finished_jobs_partition_ensure_ahead() RETURNS integer
LANGUAGE sql
-- As the schema's owner, with its own path, as the function it calls.
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pgdrain.finished_jobs_partition_ensure((now() AT TIME ZONE 'UTC')::date,
                                                  (now() AT TIME ZONE 'UTC')::date + 2)
$$;
REVOKE EXECUTE ON FUNCTION pgdrain.finished_jobs_partition_ensure_ahead() FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_worker') THEN
        GRANT EXECUTE ON FUNCTION pgdrain.finished_jobs_partition_ensure_ahead()
            TO pgdrain_worker;
        REVOKE EXECUTE ON FUNCTION pgdrain.finished_jobs_partition_ensure(date, date)
            FROM pgdrain_worker;
    END IF;
END
$$;
