-- pgdrain 0047: a limit kept through a resume, as a red team found it.
--
-- A run's sync read from its snapshot that a queue's row existed (a pause without a limit), so
-- it took no lock and only updated the row. A `resume` committed while that update waited for
-- the row deletes it: the update passed over it, no row was left, and the run claimed with no
-- limit at all until the next run's sync. Now the sync reads again after its update, and a row
-- gone by then is created under the table lock, as a missing one always was; the update is
-- undone first (a subtransaction), so that no row lock of it is held while the table lock is
-- asked for. The rows it changes are locked in the claims' order (by queue), as a claim locks
-- them. A sync whose table lock is not granted in time now changes nothing (the next run does
-- it all). One function replaced.

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
        -- Every row is there: change in place those whose limits differ, without the lock.
        BEGIN
            PERFORM 1
            FROM pgdrain.queue_limits AS l
            JOIN unnest(limited, limits, rates, periods)
                 AS w(queue, max_running, rate_limit, rate_seconds) ON w.queue = l.queue
            WHERE (l.max_running, l.rate_limit, l.rate_seconds)
                  IS DISTINCT FROM (w.max_running, w.rate_limit, w.rate_seconds)
            ORDER BY l.queue
            FOR UPDATE OF l;
            UPDATE pgdrain.queue_limits AS l
            SET max_running = w.max_running, rate_limit = w.rate_limit,
                rate_seconds = w.rate_seconds,
                window_start = CASE WHEN l.rate_seconds IS DISTINCT FROM w.rate_seconds
                                    THEN NULL ELSE l.window_start END
            FROM unnest(limited, limits, rates, periods)
                 AS w(queue, max_running, rate_limit, rate_seconds)
            WHERE l.queue = w.queue
              AND (l.max_running, l.rate_limit, l.rate_seconds)
                  IS DISTINCT FROM (w.max_running, w.rate_limit, w.rate_seconds);
            -- Read again: each statement reads a snapshot of its own (READ COMMITTED), and sees
            -- a row deleted while the lock above waited for it.
            missing := EXISTS (
                SELECT 1 FROM unnest(limited) AS w(queue)
                WHERE NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l WHERE l.queue = w.queue)
            );
            IF missing THEN  -- a row went while this waited for it
                RAISE EXCEPTION USING ERRCODE = 'no_data_found';
            END IF;
        EXCEPTION WHEN no_data_found THEN
            NULL;  -- undone, its row locks with it; missing stays true (variables are not undone)
        END;
    END IF;
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
            -- (The subtransaction's lock_timeout is undone with it.)
            RAISE WARNING 'pgdrain: the limits of queues % were not set: the lock on '
                'pgdrain.queue_limits was not granted within % ms; the next run tries again',
                limited, least(wait_ms, nullif(kept_ms, 0));
            RETURN;
        END;
        PERFORM set_config('lock_timeout', kept, true);
    END IF;
    DELETE FROM pgdrain.queue_limits AS l
    WHERE l.queue = ANY(queues) AND l.queue <> ALL(limited) AND l.paused_at IS NULL;
    UPDATE pgdrain.queue_limits AS l
    SET max_running = NULL, rate_limit = NULL, rate_seconds = NULL
    WHERE l.queue = ANY(queues) AND l.queue <> ALL(limited)
      AND (l.max_running IS NOT NULL OR l.rate_limit IS NOT NULL);
    IF missing THEN  -- under the lock: new rows counted exactly, the others changed as above
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
    END IF;
END
$function$;
