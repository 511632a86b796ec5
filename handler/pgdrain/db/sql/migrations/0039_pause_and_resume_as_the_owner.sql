-- pgdrain 0039: pause and resume run as the schema's owner, so the dashboard's actions role
-- needs no write on pgdrain.queue_limits.
--
-- The actions role paused and resumed a queue through INSERT, UPDATE and DELETE on
-- queue_limits, and a grant does not limit the values written: it could clear any queue's
-- concurrency or rate limit, or set its running count to 0 so that a limit was exceeded (found
-- by a red team). pgdrain.queue_pause and pgdrain.queue_resume (migration 0020) now run as the
-- owner, with their own search_path, and only roles granted EXECUTE may call them
-- (dashboard_role.sql grants it to pgdrain_dashboard_actions, and takes back its writes of the
-- table). A role of your own that paused through table grants needs EXECUTE on them now.
-- Catalog changes only.

ALTER FUNCTION pgdrain.queue_pause(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION pgdrain.queue_resume(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION pgdrain.queue_pause(text), pgdrain.queue_resume(text) FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgdrain_dashboard_actions') THEN
        GRANT EXECUTE ON FUNCTION pgdrain.queue_pause(text), pgdrain.queue_resume(text)
            TO pgdrain_dashboard_actions;
        REVOKE INSERT, UPDATE, DELETE ON pgdrain.queue_limits FROM pgdrain_dashboard_actions;
    END IF;
END
$$;
