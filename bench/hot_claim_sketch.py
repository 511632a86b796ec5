"""A sketch, not the product: how many WAL bytes per job a claim that is a HOT update would
write, step by step (issue 43, item 3; docs/decisions/0015).

`python -m bench.hot_claim_sketch [--jobs 20000] [--batch 10] [--wal-dir DIR]`: for each
variant, a fresh database migrated by pgdrain, then changed by the variant's DDL; `--jobs`
jobs enqueued; then one connection completes and claims them in a loop, `--batch` at a time,
each statement completing the jobs the previous one claimed and claiming the next, in its own
transaction, as a run at that batch does (no job function runs). WAL of that database alone
(pg_waldump, as bench/lifecycle.py reads it), per job, with and without full-page images; and
the loop's jobs/s, the server's work per job as one connection sees it (`--repeat N`: the
variants in turn N times, medians, each against today's of the same turn).

The loop's statement is a stripped-down job_complete_and_claim: one queue, no position, no
limits, no pause, no payload bound; the completion moves the row to finished_jobs as the
product's does. The first variant runs it on pgdrain's schema as it is, so each later variant
is read against the same loop ("today"), and the product's own figure (bench/lifecycle.py)
stands beside it in docs/decisions/0015.

Variants, each adding to the one before:

- today: the schema as migrated.
- hot: no index of active_jobs reads a column the claim writes: a generated column `held`
  (waiting or parked) takes status's place in the partial indexes' predicates, status leaves
  the other indexes, the lease index goes (a lease row per claim, `leases`, takes its place:
  inserted by the claim, deleted when the batch is done).
- one_history_btree: finished jobs' done partitions keep one b-tree, (queue, id), and a BRIN
  on id in place of the b-tree on id.
- fillfactor_40: active_jobs' pages filled to 40% (70 today).
- advisory: candidates are taken with pg_try_advisory_xact_lock rather than FOR UPDATE SKIP
  LOCKED (a row lock is a WAL record of its own); the UPDATE rechecks status.

And two that stand alone on today's claim: only_fillfactor_40, only_one_history_btree.

And what a done job kept nowhere would save (as graphile-worker and PgQueuer do: a completion
that deletes the row, no history of done jobs): only_done_deleted on today's claim, and
all_done_deleted on top of fillfactor_40. The product cannot do this as it is: a sequence's
or a dependency's release, a completion's lost-reply recovery (completed_token) and the
dependents' outputs all read the done row (docs/decisions/0015).

And a history of done jobs kept at a lower price per job (docs/decisions/0019): one row per
completion statement, `done_batches`, holding its jobs' columns as arrays (found by a GiST of
its id range, listed by a BRIN on finished_at), in place of a row and two index entries per job:
only_batch_history on today's claim, hot_batch_history on the HOT claim without advisory
locks, all_batch_history on top of fillfactor_40, and all_batch_history_lz4 with the batch row's
columns compressed by lz4 rather than pglz (PostgreSQL compresses a row only from about 2 KB:
at batch 10 neither compresses).

`--lookups` reads done jobs by id from each history instead: a row per job with a b-tree on id,
a row per completion through its range.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from bench.common import Server, log, resolve_server
from bench.lifecycle import wal_lsn, wal_of_database
from pgdrain.api.enqueue import build_job, enqueue_many
from pgdrain.db.migrate import migrate

HOT_DDL = """
ALTER TABLE pgdrain.active_jobs
    ADD COLUMN held boolean GENERATED ALWAYS AS (status IN ('waiting', 'parked')) STORED;
DROP INDEX pgdrain.jobs_lease_idx;
DROP INDEX pgdrain.jobs_finished_idx;
DROP INDEX pgdrain.jobs_finished_queue_idx;
DROP INDEX pgdrain.jobs_ready_idx;
CREATE INDEX jobs_ready_idx ON pgdrain.active_jobs (queue, priority, run_at, id) WHERE NOT held;
DROP INDEX pgdrain.jobs_queued_run_at_idx;
CREATE INDEX jobs_queued_run_at_idx ON pgdrain.active_jobs (queue, run_at) WHERE NOT held;
DROP INDEX pgdrain.jobs_active_key_idx;
CREATE UNIQUE INDEX jobs_active_key_idx ON pgdrain.active_jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX pgdrain.jobs_sequence_idx;
CREATE INDEX jobs_sequence_idx ON pgdrain.active_jobs (sequence, id) WHERE sequence IS NOT NULL;
DROP INDEX pgdrain.jobs_waiting_depends_on_idx;
CREATE INDEX jobs_waiting_depends_on_idx ON pgdrain.active_jobs USING gin (depends_on)
    WHERE held;
DROP INDEX pgdrain.jobs_waiting_queue_idx;
CREATE INDEX jobs_waiting_queue_idx ON pgdrain.active_jobs (queue) WHERE held;
CREATE TABLE pgdrain.leases (
    claim_id uuid PRIMARY KEY,
    expires_at timestamptz NOT NULL,
    ids bigint[] NOT NULL
);
CREATE INDEX leases_expires_idx ON pgdrain.leases (expires_at);
"""

HISTORY_DDL = """
DROP INDEX pgdrain.finished_jobs_id_idx;
DROP INDEX pgdrain.finished_jobs_queue_idx;
CREATE INDEX finished_jobs_failed_id_idx ON pgdrain.finished_jobs_failed (id);
CREATE INDEX finished_jobs_failed_queue_idx ON pgdrain.finished_jobs_failed (queue, status, id);
CREATE INDEX finished_jobs_done_queue_idx ON pgdrain.finished_jobs_done (queue, id);
CREATE INDEX finished_jobs_done_id_brin ON pgdrain.finished_jobs_done USING brin (id);
"""

# The fenced DELETE every completion starts with; RETURNING what the rest reads of each row.
ENDED = """
WITH ended AS (
    DELETE FROM pgdrain.active_jobs AS j
    WHERE j.id = ANY(%(done_ids)s::bigint[])
      AND CASE WHEN j.status = 'running' THEN j.attempt_token = ANY(%(done_tokens)s::uuid[]) END
    RETURNING j.{returning}
)"""

# One history row per completion: what a done job's finished_jobs row holds, column by column,
# as arrays in id order (status is 'done', finished_at and updated_at the row's own).
BATCH_HISTORY_DDL = """
CREATE TABLE pgdrain.done_batches (
    finished_at timestamptz NOT NULL, first_id bigint NOT NULL, last_id bigint NOT NULL,
    id bigint[] NOT NULL, queue text[] NOT NULL, kind text[] NOT NULL, payload jsonb[] NOT NULL,
    priority integer[] NOT NULL, run_at timestamptz[] NOT NULL, attempts integer[] NOT NULL,
    max_attempts integer[] NOT NULL, recovery_policy text[] NOT NULL,
    reclaim_count integer[] NOT NULL, idempotency_key text[] NOT NULL,
    created_at timestamptz[] NOT NULL, completed_token uuid[] NOT NULL, errors jsonb[] NOT NULL,
    output jsonb[] NOT NULL
);
CREATE INDEX done_batches_ids_idx ON pgdrain.done_batches
    USING gist (int8range(first_id, last_id, '[]'));
CREATE INDEX done_batches_finished_brin ON pgdrain.done_batches USING brin (finished_at);
"""

# lz4 in place of pglz for the row's columns. A row is compressed only once it passes about
# 2 KB (TOAST_TUPLE_THRESHOLD; toast_tuple_target does not lower that): at batch 250, not 10.
BATCH_HISTORY_LZ4_DDL = """
ALTER TABLE pgdrain.done_batches
    ALTER COLUMN id SET COMPRESSION lz4, ALTER COLUMN queue SET COMPRESSION lz4,
    ALTER COLUMN kind SET COMPRESSION lz4, ALTER COLUMN payload SET COMPRESSION lz4,
    ALTER COLUMN run_at SET COMPRESSION lz4, ALTER COLUMN created_at SET COMPRESSION lz4,
    ALTER COLUMN completed_token SET COMPRESSION lz4, ALTER COLUMN errors SET COMPRESSION lz4,
    ALTER COLUMN recovery_policy SET COMPRESSION lz4;
"""

COMPLETE_BATCH = """{ended}, completed AS (
    INSERT INTO pgdrain.done_batches
    SELECT now(), min(j.id), max(j.id), array_agg(j.id ORDER BY j.id),
           array_agg(j.queue ORDER BY j.id), array_agg(j.kind ORDER BY j.id),
           array_agg(j.payload ORDER BY j.id), array_agg(j.priority ORDER BY j.id),
           array_agg(j.run_at ORDER BY j.id), array_agg(j.attempts ORDER BY j.id),
           array_agg(j.max_attempts ORDER BY j.id), array_agg(j.recovery_policy ORDER BY j.id),
           array_agg(j.reclaim_count ORDER BY j.id), array_agg(j.idempotency_key ORDER BY j.id),
           array_agg(j.created_at ORDER BY j.id), array_agg(j.attempt_token ORDER BY j.id),
           array_agg(j.errors ORDER BY j.id), array_agg(j.output ORDER BY j.id)
    FROM ended AS j
    HAVING count(*) > 0
    RETURNING 1
){lease_done}"""

COMPLETE_DELETE = """{ended}{lease_done}"""

COMPLETE = """{ended}, completed AS (
    INSERT INTO pgdrain.finished_jobs
        (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
         recovery_policy, reclaim_count, idempotency_key, last_error, created_at, updated_at,
         finished_at, completed_token, errors, sequence, depends_on, has_dependents, output,
         progress)
    SELECT j.id, j.queue, j.kind, j.payload, 'done', j.priority, j.run_at, j.attempts,
           j.max_attempts, j.recovery_policy, j.reclaim_count, j.idempotency_key, NULL,
           j.created_at, now(), now(), j.attempt_token, j.errors,
           j.sequence, j.depends_on, j.has_dependents, j.output, j.progress
    FROM ended AS j
    RETURNING id
){lease_done}"""

CANDIDATES_LOCKED = """
    SELECT id FROM pgdrain.active_jobs
    WHERE status = 'queued' {ready} AND queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED"""

CANDIDATES_ADVISORY = """
    SELECT id FROM pgdrain.active_jobs
    WHERE status = 'queued' {ready} AND queue = 'default' AND run_at <= now()
      AND pg_try_advisory_xact_lock(1886610802, hashint8(id))
    ORDER BY priority, run_at, id
    LIMIT %(limit)s"""

CLAIM = """, candidates AS ({candidates}
), claimed AS (
    UPDATE pgdrain.active_jobs AS j
    SET status = 'running', attempts = j.attempts + 1, attempt_token = gen_random_uuid(),
        claim_id = %(claim_id)s, leased_by = 'sketch', heartbeat_at = now(),
        lease_expires_at = now() + interval '60 seconds', updated_at = now()
    WHERE j.id = ANY(ARRAY(SELECT id FROM candidates)) AND j.status = 'queued'
    RETURNING j.id, j.attempt_token
){lease_new}
SELECT id, attempt_token FROM claimed
"""

LEASE_DONE = """, lease_done AS (
    DELETE FROM pgdrain.leases WHERE claim_id = %(done_claim)s
)"""

LEASE_NEW = """, lease_new AS (
    INSERT INTO pgdrain.leases (claim_id, expires_at, ids)
    SELECT %(claim_id)s, now() + interval '60 seconds', array_agg(id) FROM claimed
    HAVING count(*) > 0
)"""

FILLFACTOR_40 = "ALTER TABLE pgdrain.active_jobs SET (fillfactor = 40)"
# Every step of decision 0015's HOT claim (the advisory locks are a switch of their own).
HOT_STEPS_DDL = [HOT_DDL, HISTORY_DDL, FILLFACTOR_40]

VARIANTS: dict[str, dict[str, Any]] = {
    "today": {"ddl": [], "hot": False, "advisory": False},
    "hot": {"ddl": [HOT_DDL], "hot": True, "advisory": False},
    "one_history_btree": {"ddl": [HOT_DDL, HISTORY_DDL], "hot": True, "advisory": False},
    "advisory": {"ddl": [HOT_DDL, HISTORY_DDL], "hot": True, "advisory": True},
    # Room on each page for every row's new version: a batch's updates cannot be pruned
    # before it commits, and a version that finds no room on its page is not HOT.
    "fillfactor_40": {
        "ddl": HOT_STEPS_DDL,
        "hot": True,
        "advisory": True,
    },
    # Alone, on today's claim (not HOT): a new row version that finds room on its own page is
    # logged without the prefix and suffix it shares with the old one.
    "only_fillfactor_40": {
        "ddl": [FILLFACTOR_40],
        "hot": False,
        "advisory": False,
    },
    "only_one_history_btree": {"ddl": [HISTORY_DDL], "hot": False, "advisory": False},
    # A done job kept nowhere: the completion deletes the row.
    "only_done_deleted": {"ddl": [], "hot": False, "advisory": False, "keep_done": False},
    "all_done_deleted": {
        "ddl": HOT_STEPS_DDL,
        "hot": True,
        "advisory": True,
        "keep_done": False,
    },
    # Done history kept, one row per completion (decision 0019).
    "only_batch_history": {
        "ddl": [BATCH_HISTORY_DDL],
        "hot": False,
        "advisory": False,
        "history": "batch",
    },
    # Every step but the advisory locks (a row lock record per job stays): see 0015 on the
    # shared lock table advisory locks would fill.
    "hot_batch_history": {
        "ddl": [*HOT_STEPS_DDL, BATCH_HISTORY_DDL],
        "hot": True,
        "advisory": False,
        "history": "batch",
    },
    "all_batch_history": {
        "ddl": [*HOT_STEPS_DDL, BATCH_HISTORY_DDL],
        "hot": True,
        "advisory": True,
        "history": "batch",
    },
    "all_batch_history_lz4": {
        "ddl": [*HOT_STEPS_DDL, BATCH_HISTORY_DDL, BATCH_HISTORY_LZ4_DDL],
        "hot": True,
        "advisory": True,
        "history": "batch",
    },
}


def statement(variant: dict[str, Any]) -> str:
    ready = "AND NOT held" if variant["hot"] else ""
    candidates = CANDIDATES_ADVISORY if variant["advisory"] else CANDIDATES_LOCKED
    if variant.get("history") == "batch":
        complete = COMPLETE_BATCH
    else:
        complete = COMPLETE if variant.get("keep_done", True) else COMPLETE_DELETE
    ended = ENDED.format(returning="id" if complete is COMPLETE_DELETE else "*")
    lease_done = LEASE_DONE if variant["hot"] else ""
    return complete.format(ended=ended, lease_done=lease_done) + CLAIM.format(
        candidates=candidates.format(ready=ready),
        lease_new=LEASE_NEW if variant["hot"] else "",
    )


def measure(
    server: Server, name: str, jobs: int, batch: int, wal_dir: str, waldump: str
) -> dict[str, Any]:
    variant = VARIANTS[name]
    db = server.create()
    url = server.url(db)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        for ddl in variant["ddl"]:
            conn.execute(ddl)
        with conn.transaction():
            enqueue_many(conn, (build_job("noop") for _ in range(jobs)))
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        sql = statement(variant)
        start = wal_lsn(conn)
        began = time.perf_counter()
        done_ids: list[int] = []
        done_tokens: list[uuid.UUID] = []
        done_claim = uuid.uuid4()
        claimed_total = 0
        while True:
            claim_id = uuid.uuid4()
            with conn.transaction():
                rows = conn.execute(
                    sql,
                    {
                        "done_ids": done_ids,
                        "done_tokens": done_tokens,
                        "done_claim": done_claim,
                        "claim_id": claim_id,
                        "limit": batch,
                    },
                ).fetchall()
            if not rows and not done_ids:
                break
            claimed_total += len(rows)
            done_ids = [r[0] for r in rows]
            done_tokens = [r[1] for r in rows]
            done_claim = claim_id
        seconds = time.perf_counter() - began
        end = wal_lsn(conn)
        total, where = wal_of_database(conn, waldump, wal_dir, start, end)
        if variant.get("history") == "batch":
            finished = conn.execute(
                "SELECT coalesce(sum(cardinality(id)), 0) FROM pgdrain.done_batches"
            ).fetchone()
        elif variant.get("keep_done", True):
            finished = conn.execute("SELECT count(*) FROM pgdrain.finished_jobs").fetchone()
        else:  # deleted: every job that left active_jobs
            finished = conn.execute(
                "SELECT %s - count(*) FROM pgdrain.active_jobs", [jobs]
            ).fetchone()
        hot = conn.execute(
            "SELECT n_tup_hot_upd, n_tup_upd FROM pg_stat_user_tables WHERE relname = 'active_jobs'"
        ).fetchone()
        # The history's storage: every table of the schema but active_jobs, with its indexes
        # and TOAST.
        history = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'pgdrain' AND c.relkind = 'r' AND c.relname LIKE ANY"
            " (ARRAY['finished_jobs%', 'done_batches'])"
        ).fetchone()
    server.drop(db)
    assert finished is not None and finished[0] == jobs == claimed_total, (finished, claimed_total)
    fpw = sum(v for k, v in where.items() if " FPW " in k)
    return {
        "variant": name,
        "bytes_per_job": total / jobs,
        "bytes_per_job_no_fpw": (total - fpw) / jobs,
        "hot_updates": hot,
        "jobs_per_s": jobs / seconds,
        "history_bytes_per_job": float(history[0] or 0) / jobs if history else 0.0,
        "where": {k: v / jobs for k, v in where.most_common(14)},
    }


# The claim's new row version as the WAL logs it, by column order (a HOT update on the same page
# logs the new tuple less the prefix and suffix it shares with the old one): today's order; the
# columns the claim writes last; and only status, attempts, lease and token written (the
# worker's name, the claim id, heartbeat_at and updated_at kept on the lease row instead).
FIXED = (
    "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL DEFAULT 'default', "
    "kind text NOT NULL, payload jsonb NOT NULL DEFAULT '{}', priority int NOT NULL DEFAULT 0, "
    "run_at timestamptz NOT NULL DEFAULT now(), max_attempts int NOT NULL DEFAULT 5, "
    "recovery_policy text NOT NULL DEFAULT 'auto', reclaim_count int NOT NULL DEFAULT 0, "
    "idempotency_key text, last_error text, created_at timestamptz NOT NULL DEFAULT now(), "
    "finished_at timestamptz, completed_token uuid, errors jsonb NOT NULL DEFAULT '[]', "
    "sequence text, depends_on bigint[], has_dependents boolean NOT NULL DEFAULT false, "
    "output jsonb, progress jsonb"
)
CLAIMED = (
    "status text NOT NULL DEFAULT 'queued', attempts int NOT NULL DEFAULT 0, "
    "lease_expires_at timestamptz, attempt_token uuid"
)
LAYOUTS = {
    "today's order": (
        "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL DEFAULT "
        "'default', kind text NOT NULL, payload jsonb NOT NULL DEFAULT '{}', status text NOT "
        "NULL DEFAULT 'queued', priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL "
        "DEFAULT now(), attempts int NOT NULL DEFAULT 0, max_attempts int NOT NULL DEFAULT 5, "
        "recovery_policy text NOT NULL DEFAULT 'auto', reclaim_count int NOT NULL DEFAULT 0, "
        "lease_expires_at timestamptz, leased_by text, attempt_token uuid, heartbeat_at "
        "timestamptz, idempotency_key text, last_error text, created_at timestamptz NOT NULL "
        "DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz, "
        "completed_token uuid, errors jsonb NOT NULL DEFAULT '[]', claim_id uuid, sequence "
        "text, depends_on bigint[], has_dependents boolean NOT NULL DEFAULT false, output "
        "jsonb, progress jsonb",
        "status = 'running', attempts = attempts + 1, attempt_token = gen_random_uuid(), "
        "claim_id = gen_random_uuid(), leased_by = 'ip-10-0-0-1:1234', heartbeat_at = now(), "
        "lease_expires_at = now() + interval '60 seconds', updated_at = now()",
    ),
    "claimed columns last": (
        f"{FIXED}, {CLAIMED}, heartbeat_at timestamptz, updated_at timestamptz NOT NULL "
        "DEFAULT now(), claim_id uuid, leased_by text",
        "status = 'running', attempts = attempts + 1, attempt_token = gen_random_uuid(), "
        "claim_id = gen_random_uuid(), leased_by = 'ip-10-0-0-1:1234', heartbeat_at = now(), "
        "lease_expires_at = now() + interval '60 seconds', updated_at = now()",
    ),
    "four claimed columns, last": (
        f"{FIXED}, {CLAIMED}",
        "status = 'running', attempts = attempts + 1, attempt_token = gen_random_uuid(), "
        "lease_expires_at = now() + interval '60 seconds'",
    ),
}


def row_layouts(server: Server, rows: int = 10_000) -> dict[str, float]:
    """WAL bytes per row of one claim-like UPDATE (all HOT: fillfactor 40, no index on what it
    writes), after two passes that took the pages' full-page images."""
    db = server.create()
    out = {}
    with psycopg.connect(server.url(db), autocommit=True) as conn:
        for number, (name, (columns, claim)) in enumerate(LAYOUTS.items()):
            # Constants of this module, composed as SQL (nothing here comes from outside).
            table = sql.Identifier(f"layout_{number}")
            conn.execute(
                sql.SQL("CREATE TABLE {} ({}) WITH (fillfactor = 40)").format(
                    table, sql.SQL(columns)
                )
            )
            conn.execute(
                sql.SQL("INSERT INTO {} (kind) SELECT 'noop' FROM generate_series(1, %s)").format(
                    table
                ),
                [rows],
            )
            for _ in range(2):
                conn.execute(sql.SQL("UPDATE {} SET max_attempts = 5").format(table))
                conn.execute(sql.SQL("VACUUM {}").format(table))
            start = wal_lsn(conn)
            conn.execute(sql.SQL("UPDATE {} SET {}").format(table, sql.SQL(claim)))
            out[name] = (wal_lsn(conn) - start) / rows
    server.drop(db)
    return out


# Done jobs two ways for lookups by id: a row each with a b-tree on id, and a row per completion
# of 10 ids in a row, one row in 100 trading its first id with the row 500 before it (a slow job
# finished with later ones), found by a GiST of the id range.
LOOKUP_DDL = """
CREATE TABLE per_job (id bigint NOT NULL, queue text NOT NULL, kind text NOT NULL,
    payload jsonb NOT NULL, attempts int NOT NULL, created_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL, completed_token uuid);
INSERT INTO per_job
SELECT g, 'default', 'noop', '{}', 1, now(), now(), gen_random_uuid()
FROM generate_series(1, %(batches)s * 10) AS g;
CREATE INDEX per_job_id_idx ON per_job (id);
CREATE TABLE done_batches (finished_at timestamptz NOT NULL, first_id bigint NOT NULL,
    last_id bigint NOT NULL, id bigint[] NOT NULL, queue text[] NOT NULL, kind text[] NOT NULL,
    payload jsonb[] NOT NULL, attempts int[] NOT NULL, created_at timestamptz[] NOT NULL,
    completed_token uuid[] NOT NULL);
INSERT INTO done_batches
SELECT now(), min(x), max(x), array_agg(x ORDER BY x), array_agg('default'::text),
       array_agg('noop'::text), array_agg('{}'::jsonb), array_agg(1), array_agg(now()),
       array_agg(gen_random_uuid())
FROM (SELECT b, CASE WHEN mod(b, 100) = 0 AND k = 0
                     THEN mod(b + %(batches)s - 500, %(batches)s) * 10 + 1
                     ELSE b * 10 + k + 1 END AS x
      FROM generate_series(0, %(batches)s - 1) AS b, generate_series(0, 9) AS k) AS s
GROUP BY b;
CREATE INDEX done_batches_ids_idx ON done_batches USING gist (int8range(first_id, last_id, '[]'));
"""

LOOKUPS: dict[str, LiteralString] = {
    "a row per job (b-tree on id)": "SELECT id, completed_token FROM per_job WHERE id = %(id)s",
    "a row per completion (GiST on the id range)": (
        "SELECT u.id, u.token FROM done_batches AS b"
        " CROSS JOIN LATERAL unnest(b.id, b.completed_token) AS u(id, token)"
        " WHERE int8range(b.first_id, b.last_id, '[]') @> %(id)s::bigint AND u.id = %(id)s"
    ),
}


def lookups(server: Server, batches: int = 100_000, reads: int = 2000) -> None:
    """A done job read by id (`jobs show`, retry, lost-reply recovery) from each history: the
    median and p99 ms of `reads` random ids, and the buffers one read visits."""
    db = server.create()
    with psycopg.connect(server.url(db), autocommit=True) as conn:
        # Several statements with a parameter: bound on the client (a ClientCursor).
        psycopg.ClientCursor(conn).execute(LOOKUP_DDL, {"batches": batches})
        conn.execute("VACUUM ANALYZE")
        rng = random.Random(7)
        ids = [rng.randint(1, batches * 10) for _ in range(reads)]
        for name, statement in LOOKUPS.items():
            times, found = [], 0
            for job_id in ids:
                began = time.perf_counter()
                found += len(conn.execute(statement, {"id": job_id}, prepare=True).fetchall())
                times.append((time.perf_counter() - began) * 1000)
            plan = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, {"id": ids[0]}
            ).fetchone()
            assert plan is not None and found == reads, (name, found)
            top = plan[0][0]["Plan"]
            times.sort()
            log(
                f"{name}: {reads} reads, median {statistics.median(times):.2f} ms, p99 "
                f"{times[int(reads * 0.99)]:.2f} ms, "
                f"{top['Shared Hit Blocks'] + top['Shared Read Blocks']} buffers"
            )
    server.drop(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--wal-dir", default="/var/lib/postgresql/15/main/pg_wal")
    parser.add_argument("--waldump", default="/usr/lib/postgresql/15/bin/pg_waldump")
    parser.add_argument("--only", nargs="*", default=list(VARIANTS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-layouts", action="store_true")
    parser.add_argument("--lookups", action="store_true", help="only the reads by id")
    args = parser.parse_args()
    admin_url, _ = resolve_server()
    server = Server(admin_url)
    if args.lookups:
        lookups(server)
        return
    if not args.no_layouts:
        for name, per_row in row_layouts(server).items():
            log(f"claim's row version, {name}: {per_row:.0f} B")
    names = ["today", *[n for n in args.only if n != "today"]]
    ratios: dict[str, list[float]] = {name: [] for name in names}
    rates: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(args.repeat):
        today = 0.0
        for name in names:
            out = measure(server, name, args.jobs, args.batch, args.wal_dir, args.waldump)
            today = today or out["jobs_per_s"]
            rates[name].append(out["jobs_per_s"])
            ratios[name].append(out["jobs_per_s"] / today)
            log(
                f"turn {turn + 1}, {name}: {out['jobs_per_s']:,.0f} jobs/s, "
                f"{out['bytes_per_job']:.0f} B/job, {out['bytes_per_job_no_fpw']:.0f} without "
                f"full-page images; HOT/all updates {out['hot_updates']}; history "
                f"{out['history_bytes_per_job']:.0f} B/job stored"
            )
            if turn == 0:
                for key, value in out["where"].items():
                    log(f"    {value:7.1f}  {key}")
    for name in names:
        log(
            f"{name}: {statistics.median(rates[name]):,.0f} jobs/s at batch {args.batch}, "
            f"{statistics.median(ratios[name]):.2f}x today's (median of {args.repeat})"
        )


if __name__ == "__main__":
    main()
