-- pgdrain 0047: a limit kept through a resume, as a red team found it.
--
-- A run's sync read from its snapshot that a queue's row existed (a pause without a limit), so
-- it took no lock and only updated the row. A `resume` committed while that update waited for
-- the row deletes it: the update passed over it, no row was left, and the run claimed with no
-- limit at all until the next run's sync. Now the sync reads again after its changes, and a
-- row gone by then is created under the table lock, as a missing one always was; the changes
-- are undone first (a subtransaction), so that no row lock of theirs is held while the table
-- lock is asked for.
--
-- The changes to existing rows (pgdrain.queue_limits_change) lock every row they change,
-- delete or clear first, in the claims' order (by queue), as a claim locks them: beside a
-- claim a sync waits, and never deadlocks. A sync whose table lock is not granted in time
-- still makes them; only the new rows wait for the next run.

CREATE FUNCTION pgdrain.queue_limits_change(queues text[], limited text[], limits integer[], rates integer[], periods integer[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM 1
    FROM pgdrain.queue_limits AS l
    LEFT JOIN unnest(limited, limits, rates, periods)
         AS w(queue, max_running, rate_limit, rate_seconds) ON w.queue = l.queue
    WHERE CASE WHEN w.queue IS NOT NULL  -- limited: changed when its limits differ
               THEN (l.max_running, l.rate_limit, l.rate_seconds)
                    IS DISTINCT FROM (w.max_running, w.rate_limit, w.rate_seconds)
               ELSE l.queue = ANY(queues)  -- managed, no longer limited: deleted or cleared
                    AND (l.paused_at IS NULL OR l.max_running IS NOT NULL
                         OR l.rate_limit IS NOT NULL)
          END
    ORDER BY l.queue
    FOR UPDATE OF l;
    UPDATE pgdrain.queue_limits AS l
    SET max_running = w.max_running, rate_limit = w.rate_limit, rate_seconds = w.rate_seconds,
        window_start = CASE WHEN l.rate_seconds IS DISTINCT FROM w.rate_seconds
                            THEN NULL ELSE l.window_start END
    FROM unnest(limited, limits, rates, periods)
         AS w(queue, max_running, rate_limit, rate_seconds)
    WHERE l.queue = w.queue
      AND (l.max_running, l.rate_limit, l.rate_seconds)
          IS DISTINCT FROM (w.max_running, w.rate_limit, w.rate_seconds);
    DELETE FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY(queues) AND l.queue <> ALL(limited) AND l.paused_at IS NULL;
    UPDATE pgdrain.queue_limits AS l
    SET max_running = NULL, rate_limit = NULL, rate_seconds = NULL
    WHERE l.queue = ANY(queues) AND l.queue <> ALL(limited)
      AND (l.max_running IS NOT NULL OR l.rate_limit IS NOT NULL);
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
    IF NOT missing THEN
        -- Every row is there: change them in place, without the table lock.
        BEGIN
            PERFORM pgdrain.queue_limits_change(queues, limited, limits, rates, periods);
            -- Read again: each statement reads a snapshot of its own (READ COMMITTED), and sees
            -- a row deleted while the change waited for it.
            missing := EXISTS (
                SELECT 1 FROM unnest(limited) AS w(queue)
                WHERE NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l WHERE l.queue = w.queue)
            );
            IF missing THEN  -- a row went while this waited for it
                RAISE EXCEPTION USING ERRCODE = 'no_data_found';
            END IF;
            RETURN;
        EXCEPTION WHEN no_data_found THEN
            NULL;  -- undone, its row locks with it; missing stays true (variables are not undone)
        END;
    END IF;
    kept := current_setting('lock_timeout');
    kept_ms := (SELECT s.setting::integer FROM pg_catalog.pg_settings AS s
                WHERE s.name = 'lock_timeout');
    BEGIN
        IF kept_ms = 0 OR kept_ms > wait_ms THEN
            PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
        END IF;
        LOCK TABLE pgdrain.queue_limits IN EXCLUSIVE MODE;
    EXCEPTION WHEN lock_not_available THEN
        -- (The subtransaction's lock_timeout is undone with it.)
        RAISE WARNING 'pgdrain: the limits of queues % were not created: the lock on '
            'pgdrain.queue_limits was not granted within % ms; the next run tries again',
            limited, least(wait_ms, nullif(kept_ms, 0));
        PERFORM pgdrain.queue_limits_change(queues, limited, limits, rates, periods);
        RETURN;
    END;
    PERFORM set_config('lock_timeout', kept, true);
    PERFORM pgdrain.queue_limits_change(queues, limited, limits, rates, periods);
    -- Under the lock: no claim or completion moves a count while a new row is counted.
    INSERT INTO pgdrain.queue_limits (queue, max_running, rate_limit, rate_seconds, running)
    SELECT w.queue, w.max_running, w.rate_limit, w.rate_seconds, pgdrain.queue_running(w.queue)
    FROM unnest(limited, limits, rates, periods)
         AS w(queue, max_running, rate_limit, rate_seconds)
    ON CONFLICT (queue) DO NOTHING;
END
$function$;
