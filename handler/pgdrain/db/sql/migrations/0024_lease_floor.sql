-- pgdrain 0024: the reclaim, and a run's exit, find running jobs from a floor no running job's
-- lease is below, not from the first entry of jobs_lease_idx (docs/decisions/0017). Behind a
-- snapshot held open elsewhere (a report, a pg_dump, a forgotten session) every job that ran
-- since keeps a dead entry there that no vacuum and no scan can remove, and each fresh run's
-- reclaim walked all of them.
--
-- The protocol (decision 0017, option 4): every statement that writes a running row takes a
-- shared transaction-level advisory lock, then lowers the floor below its leases (the triggers
-- below). Only a transaction holding the same lock exclusively raises it, to the least lease of
-- a running job as a snapshot taken after the lock sees them (lease_floor_raise). A writer
-- either took its lock first (the raise fails its try and moves nothing), or waited for the
-- raise's commit and then reads the raised floor and lowers it. No column or index entry is
-- added to a job, and the lock writes no WAL.
CREATE TABLE pgdrain.lease_floor (
    one boolean     PRIMARY KEY DEFAULT true CONSTRAINT lease_floor_one_row_chk CHECK (one),
    -- No running job's lease is earlier; 'infinity' when none ran at the last raise.
    at  timestamptz NOT NULL
);
-- The first raise walks the whole index once, as every reclaim did before.
INSERT INTO pgdrain.lease_floor (at) VALUES ('-infinity');

-- Lower the floor to the statement's least new lease. SECURITY DEFINER: any role that may write
-- a running row (the dashboard's actions, an operator through the view) needs no grant here.
CREATE FUNCTION pgdrain.lease_floor_lower() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    least_lease timestamptz;
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        least_lease := NEW.lease_expires_at;
    ELSE
        SELECT min(n.lease_expires_at) INTO least_lease
        FROM new_rows AS n WHERE n.status = 'running';
    END IF;
    IF least_lease IS NULL THEN
        RETURN NULL;  -- no running row written: the common case for all but claims and heartbeats
    END IF;
    -- Held until this transaction ends: no raise runs until its rows are visible.
    PERFORM pg_advisory_xact_lock_shared(hashtext('pgdrain.lease_floor'));
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- A statement of its own, so its snapshot is taken after the lock and sees any raise
        -- that committed before it. It writes only a floor that is above: a write would hold
        -- the row until commit, and every claim would wait for the one before.
        UPDATE pgdrain.lease_floor SET at = least_lease WHERE at > least_lease;
    ELSE
        -- The transaction's snapshot predates the lock and may not see a raise since: write
        -- anyway, so that such a raise makes this transaction fail with a serialization error
        -- rather than hide its lease.
        UPDATE pgdrain.lease_floor SET at = least(at, least_lease);
    END IF;
    RETURN NULL;
END
$$;

-- Every update: claims and heartbeats write leases, and a running row may be written by hand.
-- The transition table is the one jobs_queue_limits_count builds already.
CREATE TRIGGER jobs_lease_floor_update
    AFTER UPDATE ON pgdrain.active_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.lease_floor_lower();

-- A row inserted running (by hand, a restore): an enqueue never fires it.
CREATE TRIGGER jobs_lease_floor_insert
    AFTER INSERT ON pgdrain.active_jobs
    FOR EACH ROW WHEN (NEW.status = 'running')
    EXECUTE FUNCTION pgdrain.lease_floor_lower();

-- Raise the floor to the least lease of a running job, walking jobs_lease_idx from the floor:
-- only the entries of the jobs that ran since the last raise. It only tries the lock: a raise
-- waiting for it would queue every writer behind it, and while any writer is in flight the floor
-- stays where it is, still below every lease. Sent as a transaction of its own
-- (runner/reclaim.py): holding the lock, it waits for nothing else. Safe to repeat: it computes
-- the floor again from the jobs as they are.
CREATE FUNCTION pgdrain.lease_floor_raise() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    floor_at timestamptz;
    raised_at timestamptz;
BEGIN
    -- Only READ COMMITTED takes the snapshots of the reads below after the lock.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtext('pgdrain.lease_floor')) THEN RETURN; END IF;
    SELECT f.at INTO floor_at FROM pgdrain.lease_floor AS f;
    SELECT coalesce(min(j.lease_expires_at), 'infinity') INTO raised_at
    FROM pgdrain.active_jobs AS j
    WHERE j.status = 'running' AND j.lease_expires_at >= coalesce(floor_at, '-infinity');
    -- Written only when it moves: behind a held snapshot each version stays, and every read of
    -- the floor passes it.
    IF raised_at IS DISTINCT FROM floor_at THEN
        UPDATE pgdrain.lease_floor SET at = raised_at;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION pgdrain.lease_floor_raise() FROM PUBLIC;

-- The reclaim and a run's exit read the floor, and a run raises it: a worker role granted
-- before this migration would fail every reclaim until worker_role.sql is run again, so the
-- grants are made here too.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_worker') THEN
        GRANT SELECT ON pgdrain.lease_floor TO pgdrain_worker;
        GRANT EXECUTE ON FUNCTION pgdrain.lease_floor_raise() TO pgdrain_worker;
    END IF;
END
$$;
