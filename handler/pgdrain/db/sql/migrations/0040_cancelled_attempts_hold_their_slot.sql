-- pgdrain 0040: a job cancelled while it runs keeps its queue's concurrency slot until its
-- lease ends.
--
-- A cancel takes a running job's lease away, not its code, which runs until it ends or sees
-- job.lease_lost() at its next heartbeat. The cancel freed the job's slot of its queue's
-- concurrency limit at once, so another run could start a job of the queue beside it: two
-- running where the limit allows one (found by a red team). A retry (migration 0033) and a
-- sequence (0034, 0038) already wait for such a lease. Now the count a limit keeps
-- (queue_limits.running) is not lowered by a cancel (store.job_cancel marks its transaction,
-- job_cancel_mark) while the cancelled attempt's lease runs; every exact count (a new limit's,
-- a pause's, the recount of a limit that says full while jobs are ready) counts those leases
-- too, so the slot comes back when the lease ends. Catalog changes only.

-- How many jobs of `queue` hold a slot of its limit: those running, and those cancelled while
-- running whose lease has not ended (finished_jobs.cancelled_lease_expires_at, 0033).
CREATE FUNCTION pgdrain.queue_running(queue text) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT ((SELECT count(*) FROM pgdrain.active_jobs AS j
             WHERE j.status = 'running' AND j.queue = queue_running.queue)
          + (SELECT count(*) FROM pgdrain.finished_jobs AS f
             WHERE f.queue = queue_running.queue AND f.status = 'cancelled'
               AND f.cancelled_lease_expires_at > now()))::integer
$$;

CREATE OR REPLACE FUNCTION pgdrain.queue_limits_count()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    LOCK TABLE pgdrain.queue_limits IN ROW SHARE MODE;
    IF NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits) THEN
        RETURN NULL;  -- no limit configured: the common case costs one lookup
    END IF;
    IF TG_OP = 'DELETE' THEN
        WITH d AS (
            SELECT o.queue, -count(*)::int AS delta
            FROM old_rows AS o
            WHERE o.status = 'running'
              -- A cancel's (job_cancel_mark): its attempt holds the slot until its lease ends.
              AND NOT (coalesce(current_setting('pgdrain.cancelling', true), '') = 'on'
                       AND coalesce(o.lease_expires_at > now(), false))
            GROUP BY o.queue
        ), locked AS (
            SELECT l.queue FROM pgdrain.queue_limits AS l
            WHERE l.queue IN (SELECT d.queue FROM d)
            ORDER BY l.queue
            FOR UPDATE OF l
        )
        UPDATE pgdrain.queue_limits AS l
        SET running = greatest(0, l.running + d.delta)
        FROM d
        WHERE l.queue = d.queue AND l.queue IN (SELECT locked.queue FROM locked);
        RETURN NULL;
    END IF;
    WITH d AS (
        SELECT changes.queue, sum(changes.delta)::int AS delta
        FROM (
            SELECT n.queue, 1 AS delta FROM new_rows AS n WHERE n.status = 'running'
            UNION ALL
            SELECT o.queue, -1 FROM old_rows AS o WHERE o.status = 'running'
        ) AS changes
        GROUP BY changes.queue
        HAVING sum(changes.delta) <> 0
    ), locked AS (
        -- In queue order, as the claim locks them: two statements never wait on each other
        -- in opposite orders.
        SELECT l.queue FROM pgdrain.queue_limits AS l
        WHERE l.queue IN (SELECT d.queue FROM d)
        ORDER BY l.queue
        FOR UPDATE OF l
    )
    UPDATE pgdrain.queue_limits AS l
    SET running = greatest(0, l.running + d.delta)
    FROM d
    WHERE l.queue = d.queue AND l.queue IN (SELECT locked.queue FROM locked);
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION pgdrain.queue_limits_recount(queues text[])
 RETURNS TABLE(queue text, was integer, running integer)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY(queues)
    ORDER BY l.queue
    FOR UPDATE OF l;
    RETURN QUERY
    WITH exact AS (
        SELECT l.queue, l.running AS was,
               pgdrain.queue_running(l.queue) AS n
        FROM pgdrain.queue_limits AS l
        WHERE l.queue = ANY(queues)
    )
    UPDATE pgdrain.queue_limits AS l SET running = e.n
    FROM exact AS e
    WHERE l.queue = e.queue AND l.running <> e.n
    RETURNING l.queue, e.was, l.running;
END
$function$;

CREATE OR REPLACE FUNCTION pgdrain.queue_limits_sync(queues text[], limited text[], limits integer[], rates integer[], periods integer[], wait_ms integer)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    missing boolean;
    kept text;
    kept_ms integer;
BEGIN
    missing := EXISTS (
        SELECT 1 FROM unnest(limited) AS w(queue)
        WHERE NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l WHERE l.queue = w.queue)
    );
    IF missing THEN
        kept := current_setting('lock_timeout');
        kept_ms := (SELECT s.setting::integer FROM pg_catalog.pg_settings AS s
                    WHERE s.name = 'lock_timeout');
        BEGIN
            IF kept_ms = 0 OR kept_ms > wait_ms THEN
                PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            END IF;
            LOCK TABLE pgdrain.queue_limits IN EXCLUSIVE MODE;
        EXCEPTION WHEN lock_not_available THEN
            missing := false;
            RAISE WARNING 'pgdrain: the limits of queues % were not created: the lock on '
                'pgdrain.queue_limits was not granted within % ms; the next run tries again',
                limited, least(wait_ms, nullif(kept_ms, 0));
        END;
        PERFORM set_config('lock_timeout', kept, true);
    END IF;
    DELETE FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY(queues) AND l.queue <> ALL(limited) AND l.paused_at IS NULL;
    UPDATE pgdrain.queue_limits AS l
    SET max_running = NULL, rate_limit = NULL, rate_seconds = NULL
    WHERE l.queue = ANY(queues) AND l.queue <> ALL(limited)
      AND (l.max_running IS NOT NULL OR l.rate_limit IS NOT NULL);
    IF missing THEN
        INSERT INTO pgdrain.queue_limits AS l (queue, max_running, rate_limit, rate_seconds, running)
        SELECT w.queue, w.max_running, w.rate_limit, w.rate_seconds,
               pgdrain.queue_running(w.queue)
        FROM unnest(limited, limits, rates, periods)
             AS w(queue, max_running, rate_limit, rate_seconds)
        ON CONFLICT (queue) DO UPDATE
        SET max_running = excluded.max_running, rate_limit = excluded.rate_limit,
            rate_seconds = excluded.rate_seconds,
            window_start = CASE WHEN l.rate_seconds IS DISTINCT FROM excluded.rate_seconds
                                THEN NULL ELSE l.window_start END
        WHERE (l.max_running, l.rate_limit, l.rate_seconds)
              IS DISTINCT FROM (excluded.max_running, excluded.rate_limit, excluded.rate_seconds);
    ELSE
        -- Without the lock nothing is created: a row dropped meanwhile waits for the next run.
        UPDATE pgdrain.queue_limits AS l
        SET max_running = w.max_running, rate_limit = w.rate_limit, rate_seconds = w.rate_seconds,
            window_start = CASE WHEN l.rate_seconds IS DISTINCT FROM w.rate_seconds
                                THEN NULL ELSE l.window_start END
        FROM unnest(limited, limits, rates, periods)
             AS w(queue, max_running, rate_limit, rate_seconds)
        WHERE l.queue = w.queue
          AND (l.max_running, l.rate_limit, l.rate_seconds)
              IS DISTINCT FROM (w.max_running, w.rate_limit, w.rate_seconds);
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION pgdrain.queue_pause(queue text)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    paused timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l WHERE l.queue = queue_pause.queue) THEN
        LOCK TABLE pgdrain.queue_limits IN EXCLUSIVE MODE;
    END IF;
    INSERT INTO pgdrain.queue_limits AS l (queue, paused_at, running)
    VALUES (queue_pause.queue, now(),
            pgdrain.queue_running(queue_pause.queue))
    ON CONFLICT (queue) DO UPDATE SET paused_at = coalesce(l.paused_at, excluded.paused_at)
    RETURNING l.paused_at INTO paused;
    RETURN paused;
END
$function$;
