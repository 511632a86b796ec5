-- The statements of kicks by NOTIFY, for `pgdrain worker` (db/store/worker.py): the
-- application's kick and the worker's LISTEN.
-- Statements pgdrain runs against the queue, each under a `-- name: NAME :SHAPE` line.
-- NAME is also the name of the pgdrain.db.store function that runs it (noun first, verb last, as
-- River names its queries). SHAPE is what the statement gives back: :one (at most one row),
-- :many (rows), :rowcount (only how many rows it changed), :exec (nothing).
-- Loaded once by pgdrain.db.sql; executed only by pgdrain.db.store.
-- Parameters are always bound (%(name)s); nothing here is ever formatted into a string.
-- The channel is written out (LISTEN takes no parameter): both statements name pgdrain_kick.

-- name: kick_notify :one
-- Wake the workers: NOTIFY pgdrain_kick with the kicked queues (%(payload)s, comma-separated;
-- empty: every queue), delivered when this statement's transaction commits. Returns whether a
-- worker is connected to this database to hear it: its listening connection's
-- application_name is %(listener)s, which pg_stat_activity shows to every role. A kick that
-- nobody hears is then said, not silent. Safe to repeat: a second kick only wakes a worker
-- that finds nothing more.
SELECT EXISTS (
    SELECT 1 FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = %(listener)s
) AS heard
FROM (SELECT pg_notify('pgdrain_kick', %(payload)s)) AS notified;

-- name: kick_listen :exec
-- The worker's listening connection: kicks are delivered to it from now on, also while the
-- worker drains (they wait on the connection until it reads them).
LISTEN pgdrain_kick;
