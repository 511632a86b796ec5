-- pgdrain 0020: pgdrain.queue_limits holds every per-queue setting: a concurrency limit (as
-- before, now optional), a rate limit (at most rate_limit claims per window of rate_seconds,
-- windows aligned to the epoch: docs/decisions/0013), and a pause. A queue with none of them
-- has no row, and the claim reads nothing for it. The table is small (a row per configured
-- queue): the ALTERs lock it for no longer than their catalog change, and pgdrain.jobs is not
-- touched. The claim counts a rate's claims in the window (job_complete_and_claim).
ALTER TABLE pgdrain.queue_limits
    ALTER COLUMN max_running DROP NOT NULL,
    ADD COLUMN rate_limit integer,
    ADD COLUMN rate_seconds integer,
    -- The window the claims counted in window_started were made in (its start).
    ADD COLUMN window_start timestamptz,
    ADD COLUMN window_started integer NOT NULL DEFAULT 0,
    ADD COLUMN paused_at timestamptz,
    ADD CONSTRAINT queue_limits_rate_chk CHECK (
        (rate_limit IS NULL) = (rate_seconds IS NULL)
        AND (rate_limit IS NULL OR (rate_limit >= 1 AND rate_seconds >= 1)));

-- The start of the rate window of `seconds` that now() falls in (epoch-aligned: a period that
-- divides a day starts its windows on the minute, hour or day). Inlined by the planner.
CREATE FUNCTION pgdrain.rate_window(seconds integer) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
RETURN to_timestamp(floor(extract(epoch FROM now()) / seconds) * seconds);

-- Make the limits of `queues` what `limited` says (PGDRAIN_QUEUE_LIMITS): per queue a
-- concurrency limit (`limits`) and a rate (`rates` per `periods` seconds), either NULL. A queue
-- of `queues` not in `limited` loses its limits; its row goes unless the queue is paused (a
-- pause is an operator's, not the setting's). A new row is created as 0012's function creates
-- it (under EXCLUSIVE, its running count exact); a changed period starts a new window.
DROP FUNCTION pgdrain.queue_limits_sync(text[], text[], integer[], integer);
CREATE FUNCTION pgdrain.queue_limits_sync(
    queues text[], limited text[], limits integer[], rates integer[], periods integer[],
    wait_ms integer
) RETURNS void
LANGUAGE plpgsql AS $$
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
               (SELECT count(*) FROM pgdrain.active_jobs AS j
                WHERE j.status = 'running' AND j.queue = w.queue)
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
$$;

-- Pause `queue`: no run claims its jobs from the commit on. Its row is created as a limit's
-- is (its running count exact, under EXCLUSIVE: a pause waits for the claims in flight).
-- Returns when the queue was paused: the first pause's time, also when it was paused already
-- (pausing twice changes nothing).
CREATE FUNCTION pgdrain.queue_pause(queue text) RETURNS timestamptz
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    paused timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgdrain.queue_limits AS l WHERE l.queue = queue_pause.queue) THEN
        LOCK TABLE pgdrain.queue_limits IN EXCLUSIVE MODE;
    END IF;
    INSERT INTO pgdrain.queue_limits AS l (queue, paused_at, running)
    VALUES (queue_pause.queue, now(),
            (SELECT count(*) FROM pgdrain.active_jobs AS j
             WHERE j.status = 'running' AND j.queue = queue_pause.queue))
    ON CONFLICT (queue) DO UPDATE SET paused_at = coalesce(l.paused_at, excluded.paused_at)
    RETURNING l.paused_at INTO paused;
    RETURN paused;
END
$$;

-- Resume `queue`: its jobs are claimed again. Its row goes if it holds no limit. Returns whether
-- it was paused (resuming twice changes nothing the second time).
CREATE FUNCTION pgdrain.queue_resume(queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    was boolean;
BEGIN
    UPDATE pgdrain.queue_limits AS l SET paused_at = NULL
    WHERE l.queue = queue_resume.queue AND l.paused_at IS NOT NULL;
    was := FOUND;
    DELETE FROM pgdrain.queue_limits AS l
    WHERE l.queue = queue_resume.queue AND l.paused_at IS NULL
      AND l.max_running IS NULL AND l.rate_limit IS NULL;
    RETURN was;
END
$$;
