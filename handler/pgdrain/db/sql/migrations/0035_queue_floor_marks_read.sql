-- pgdrain 0035: the roles that read the queues' floors read their marks too.
--
-- The claim, queue_has_ready, queue_ready_count and queue_ready_elsewhere read each queue's
-- floor by probing pgdrain.queue_floor_marks in its index, one queue at a time: joined with
-- the view pgdrain.queue_floors, the view was built whole for each queue (a red team stalled a
-- run of 20,000 queues on it, a claim taking minutes). A role granted the view before now is
-- granted its table as well; worker_role.sql and dashboard_role.sql grant both. The marks say
-- only where each queue's queued jobs start. Catalog change only; safe to run again.

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_worker') THEN
        GRANT SELECT ON pgdrain.queue_floor_marks TO pgdrain_worker;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard') THEN
        GRANT SELECT ON pgdrain.queue_floor_marks TO pgdrain_dashboard;
    END IF;
END
$$;
