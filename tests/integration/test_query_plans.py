"""The statements that end a run, the claim, queue_depth, queue_stats and reclaim use their
indexes on a table whose history dwarfs its backlog: each plan must name the
index meant for it and hold no sequential scan of pgdrain.jobs.

The table is big enough that the planner's choice is real: the statements these replaced
read every finished row here (a control below shows one doing it), and dropping an index
makes its check fail (a control per check, in a rolled-back transaction). The rewritten
statements also give the answers the old ones gave (the old text is kept here as the oracle).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers.plans import plan_nodes
from pgdrain.db import store
from pgdrain.db.sql import PLACEHOLDER, query

Conn = psycopg.Connection[Any]

QUEUES = ["default", "email", "reports", "webhooks"]
DELAYED_ONLY = "reminders"  # queued jobs, none of them ready: the run's last, empty claim
HISTORY_ONLY = "archive"  # finished jobs and nothing else
RUNNING_ONLY = "solo"  # running jobs and nothing else
FINISHED = 1_000_000
QUEUED = 100_000
STATS_BOUND = 10_000  # queue_stats counts done and failed up to this, per queue

# History first (the oldest rows lead the heap, as in a real table), then the backlog: half of
# it ready, half due tomorrow, three priorities, and queues that hold only one kind of row.
SEED = [
    """INSERT INTO pgdrain.jobs (queue, kind, status, attempts, run_at, finished_at)
        SELECT (%(queues)s::text[])[1 + mod(g, 4)], 'noop',
               CASE WHEN mod(g, 20) = 0 THEN 'failed' ELSE 'done' END, 1,
               now() - interval '3 days' + g * interval '100 ms',
               now() - interval '3 days' + g * interval '100 ms'
        FROM generate_series(1, %(finished)s) AS g""",
    """INSERT INTO pgdrain.jobs (queue, kind, status, attempts, finished_at)
       SELECT 'archive', 'noop', 'done', 1, now() - interval '4 days'
       FROM generate_series(1, 1000) AS g""",
    """INSERT INTO pgdrain.jobs (queue, kind, priority, run_at)
        SELECT (%(queues)s::text[])[1 + mod(g, 4)], 'noop', mod(g / 4, 3),
               CASE WHEN mod(g / 12, 2) = 0 THEN now() - g * interval '1 ms'
                    ELSE now() + interval '1 day' + g * interval '1 s' END
        FROM generate_series(1, %(queued)s) AS g""",
    """INSERT INTO pgdrain.jobs (queue, kind, priority, run_at)
       SELECT 'reminders', 'noop', mod(g, 3), now() + interval '1 day' + g * interval '1 s'
       FROM generate_series(1, 5000) AS g""",
    """INSERT INTO pgdrain.jobs (queue, kind, status, attempts, lease_expires_at, leased_by,
                                attempt_token, heartbeat_at)
       SELECT CASE WHEN g <= 10 THEN 'solo' ELSE 'default' END, 'noop', 'running', 1,
              now() + (g - 20) * interval '1 minute', 'w', gen_random_uuid(), now()
       FROM generate_series(1, 200) AS g""",
]


@pytest.fixture(scope="module")
def big(module_db_url: str) -> Iterator[Conn]:
    with psycopg.connect(module_db_url, autocommit=True) as conn:
        *history_and_backlog, running = SEED
        # Into active_jobs, as the rows a table of migration 0017 held, then moved to
        # finished_jobs as `pgdrain migrate` moves them, each into its day's partition.
        for statement in history_and_backlog:
            conn.execute(
                statement.replace("INSERT INTO pgdrain.jobs", "INSERT INTO pgdrain.active_jobs"),
                {"queues": QUEUES, "finished": FINISHED, "queued": QUEUED},
            )
        conn.execute(
            "SELECT pgdrain.finished_jobs_partition_ensure(current_date - 5, current_date + 2)"
        )
        while store.job_history_move(conn, 50_000) == 50_000:
            pass
        # As autovacuum leaves a table whose history no longer changes: the visibility map set,
        # so that the planner counts finished rows from the index alone (without it, stats'
        # bounded counts are planned as a sequential scan that stops at the bound). Analysed
        # while nothing ran, as an idle queue is: the statistics know of no running row, the
        # case in which a partial index of running rows looks cheapest to the planner.
        conn.execute("VACUUM ANALYZE pgdrain.active_jobs, pgdrain.finished_jobs")
        BIG_RELATIONS.update(
            name
            for (name,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'pgdrain'::regnamespace"
                " AND relkind = 'r' AND reltuples > 100000"
            )
        )
        conn.execute(running.replace("INSERT INTO pgdrain.jobs", "INSERT INTO pgdrain.active_jobs"))
        yield conn


# -- reading a plan ----------------------------------------------------------------------------


# The tables of jobs (the view pgdrain.jobs reads them) that hold many rows here: a sequential
# scan of one of them reads a long history. (An empty partition, a day to come, may be
# scanned: it holds nothing; so may the failed and cancelled jobs, few beside the done ones.)
# Filled in by the `big` fixture.
BIG_RELATIONS = {"jobs", "active_jobs"}

# The running rows are few, and one partial index holds exactly them.
RUNNING_ROWS = "jobs_lease_idx"


def plan_problems(plan: Any, intended: set[str]) -> list[str]:
    """What is wrong with a plan: an intended index it does not use, a sequential scan of
    pgdrain.jobs. Empty when the plan is as meant. An intended entry "a|b" is met by either."""
    nodes = list(plan_nodes(plan))
    used = {n["Index Name"] for n in nodes if "Index Name" in n}
    problems = [
        f"does not use {name}" for name in sorted(intended) if not used & set(name.split("|"))
    ]
    problems += [
        f"{n['Node Type']} of pgdrain.jobs"
        for n in nodes
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG_RELATIONS
    ]
    return problems


def _explain(conn: Conn, statement: str, params: dict[str, Any], analyze: bool = False) -> Any:
    """The plan of one statement; a statement that writes runs (under ANALYZE) in a rolled-back
    transaction."""
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) " if analyze else "EXPLAIN (FORMAT JSON) "
    with conn.transaction(force_rollback=True):
        row = conn.execute(explain + statement, params).fetchone()
    assert row is not None
    return row[0]


def _claim_params(
    queues: list[str] | None,
    done_ids: list[int] | None = None,
    positions: dict[str, store.ClaimPosition] | None = None,
) -> dict[str, Any]:
    at = positions or {}
    return {
        "done_ids": done_ids or [],
        "done_tokens": [None] * len(done_ids or []),
        "queues": queues,
        "limit": 10,
        "worker": "w",
        "lease_seconds": 30.0,
        "cap_seconds": None,
        "claim_id": None,
        "keep_done": True,
        "position_queue": list(at),
        "position_priority": [p.priority for p in at.values()],
        "position_run_at_us": [p.run_at_us for p in at.values()],
        "position_id": [p.id for p in at.values()],
    }


# A position in each queue before all its ready jobs of priority 0 (the run's positions are
# the keys of jobs it claimed; any key bounds the range the same way).
BEFORE_READY = store.ClaimPosition(0, 946_684_800_000_000, 0)  # 2000-01-01
PAST_EVERY_JOB = 253_370_764_800_000_000  # 9999-01-01, microseconds since the epoch


# Ten of the running rows (the seed's last 200) and tokens that are not theirs: a fenced write
# is planned the same whether its fence matches or not.
RUNNING_IDS = list(range(FINISHED + 1000 + QUEUED + 5000 + 191, FINISHED + 1000 + QUEUED + 5201))
OTHER_TOKENS = [uuid.UUID(int=n) for n in range(1, 11)]
HELD = {"ids": RUNNING_IDS, "tokens": OTHER_TOKENS}

EXIT = {
    "run_id": "r",
    "clear_kicks": False,
    "linger_window_s": 1.0,
    "may_stay": False,
    # The exit writes a history line (checked by tests/integration/test_run_history.py).
    **store.RunRecord("schedule", 0, 1.0, "empty", {}).params(),
}

# (case id, statement name, parameters, the indexes its plan must use)
CASES: list[tuple[str, str, dict[str, Any], set[str]]] = [
    ("ready check", "queue_has_ready", {"queues": QUEUES}, {"jobs_queued_run_at_idx"}),
    (
        "ready check, nothing ready",
        "queue_has_ready",
        {"queues": [DELAYED_ONLY]},
        {"jobs_queued_run_at_idx"},
    ),
    (
        "claim",
        "job_complete_and_claim",
        _claim_params(QUEUES),
        {"jobs_ready_idx", "jobs_queued_run_at_idx", "jobs_pkey"},
    ),
    (
        "claim with completions",
        "job_complete_and_claim",
        _claim_params(QUEUES, done_ids=list(range(1, 11))),
        {"jobs_ready_idx", "jobs_queued_run_at_idx", "jobs_pkey"},
    ),
    (
        "last claim, nothing ready",
        "job_complete_and_claim",
        _claim_params([DELAYED_ONLY]),
        {"jobs_queued_run_at_idx"},
    ),
    ("queue depth", "queue_depth", {"queues": QUEUES}, {"jobs_queued_run_at_idx"}),
    # A run's claim from its positions (runner/positions.py): a range of jobs_ready_idx per
    # queue, read from the start only where the range runs out.
    (
        "claim from positions",
        "job_complete_and_claim",
        _claim_params(QUEUES, positions=dict.fromkeys(QUEUES, BEFORE_READY)),
        {"jobs_ready_idx", "jobs_queued_run_at_idx", "jobs_pkey"},
    ),
    # A run of every queue (queues NULL): the queues found by skipping through the index of
    # queued rows, then each served as a named one is.
    (
        "claim, every queue",
        "job_complete_and_claim",
        _claim_params(None),
        {"jobs_ready_idx", "jobs_queued_run_at_idx", "jobs_pkey"},
    ),
    ("ready check, every queue", "queue_has_ready", {"queues": None}, {"jobs_queued_run_at_idx"}),
    ("queue depth, every queue", "queue_depth", {"queues": None}, {"jobs_queued_run_at_idx"}),
    (
        "ready count, every queue",
        "queue_ready_count",
        {"queues": None, "limit": 1000},
        {"jobs_queued_run_at_idx|jobs_ready_idx"},
    ),
    (
        "exit, every queue",
        "run_exit",
        {"queues": None, **EXIT},
        {"jobs_queued_run_at_idx", RUNNING_ROWS},
    ),
    # What a restricted run leaves in the other queues.
    (
        "ready elsewhere",
        "queue_ready_elsewhere",
        {"queues": ["default"], "limit": 10_000},
        {"jobs_queued_run_at_idx"},
    ),
    (
        "stats",
        "queue_stats",
        {},
        {
            "jobs_queued_run_at_idx",
            RUNNING_ROWS,
            "jobs_finished_queue_idx",
            "jobs_waiting_queue_idx",
        },
    ),
    # Expired leases by expiry.
    ("reclaim", "job_reclaim_expired", {"limit": 100}, {RUNNING_ROWS}),
    # What a run decides its exit on: work ready, or when it comes.
    (
        "exit",
        "run_exit",
        {"queues": QUEUES, **EXIT},
        {"jobs_queued_run_at_idx", RUNNING_ROWS},
    ),
    (
        "exit, nothing ready",
        "run_exit",
        {"queues": [DELAYED_ONLY], **EXIT},
        {"jobs_queued_run_at_idx", RUNNING_ROWS},
    ),
    (
        "ready count",
        "queue_ready_count",
        {"queues": QUEUES, "limit": 1000},
        {"jobs_queued_run_at_idx|jobs_ready_idx"},
    ),
    # A scheduled run's retention batch, which finds nothing this old here: by the finished index.
    (
        "retention",
        "job_retention_batch",
        {
            "done_days": 7,
            "done_limit": 1000,
            "failed_days": 30,
            "failed_limit": 1000,
            "runs_limit": 1000,
        },
        {"finished_jobs_failed_finished_idx"},
    ),
    # The fenced writes of the jobs a run holds, by primary key.
    (
        "heartbeat",
        "job_extend_leases",
        {**HELD, "lease_seconds": 30.0, "cap_seconds": None},
        {"jobs_pkey"},
    ),
    ("complete", "job_complete_many", {**HELD, "keep_done": True}, {"jobs_pkey"}),
    ("release", "job_release_many", HELD, {"jobs_pkey"}),
    (
        "fail",
        "job_fail",
        {
            "id": RUNNING_IDS[0],
            "token": OTHER_TOKENS[0],
            "cancelled": False,
            "final": False,
            "spend_attempt": True,
            "delay_seconds": 1.0,
            "error": "boom",
            "error_record": None,
        },
        {"jobs_pkey"},
    ),
    (
        "claim recovery",
        "job_claim_recover",
        {
            "done_ids": RUNNING_IDS,
            "done_tokens": OTHER_TOKENS,
            "claim_id": OTHER_TOKENS[0],
            "keep_done": True,
        },
        {"jobs_pkey", RUNNING_ROWS},
    ),
    # The operator's lists (pgdrain jobs, the dashboard): one status, the newest first.
    (
        "jobs of one status",
        "job_list_finished",
        {"status": "failed", "queue": None, "before": None, "limit": 51, "values": True},
        {"jobs_finished_queue_idx", "jobs_pkey"},
    ),
    (
        "jobs of a status no job has",
        "job_list_finished",
        {"status": "parked", "queue": "email", "before": None, "limit": 51, "values": True},
        {"jobs_finished_queue_idx"},
    ),
    # The dashboard's chart: the newest finished rows, by finished_at, up to its bound.
    (
        "finished per minute",
        "job_finished_per_minute",
        {"since": dt.datetime(2000, 1, 1, tzinfo=dt.UTC), "limit": store.THROUGHPUT_BOUND},
        {"jobs_pkey"},
    ),
]
FENCED = {"heartbeat", "complete", "release", "fail", "claim", "claim with completions"}
IDS = [case[0] for case in CASES]


@pytest.mark.parametrize(("case", "name", "params", "intended"), CASES, ids=IDS)
def test_the_statement_uses_its_indexes_on_a_big_table(
    big: Conn, case: str, name: str, params: dict[str, Any], intended: set[str]
) -> None:
    plan = _explain(big, query(name), params)
    assert plan_problems(plan, intended) == [], plan


def _generic_plan(conn: Conn, statement: str, params: dict[str, Any]) -> Any:
    """The plan PostgreSQL keeps for a prepared statement whatever its parameters, under the
    settings of the drain's connection (store.session_limits: no JIT, no explicit sort where an
    index gives the order): the drain prepares what it runs repeatedly (psycopg, from a
    statement's sixth execution), and after five runs the server may switch to this plan."""
    names = list(dict.fromkeys(PLACEHOLDER.findall(statement)))
    numbered = PLACEHOLDER.sub(lambda m: f"${names.index(m.group(1)) + 1}", statement)
    args: sql.Composable = sql.SQL("")
    if names:
        args = sql.SQL("({})").format(sql.SQL(", ").join(sql.Literal(params[n]) for n in names))
    conn.execute(sql.SQL("PREPARE plan_check AS {}").format(sql.SQL(numbered)))
    try:
        with conn.transaction(force_rollback=True):
            store.session_limits(conn, 60_000)  # undone by the rollback
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            row = conn.execute(
                sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE plan_check{}").format(args)
            ).fetchone()
    finally:
        conn.execute("DEALLOCATE plan_check")
    assert row is not None
    return row[0]


@pytest.mark.parametrize(("case", "name", "params", "intended"), CASES, ids=IDS)
def test_its_generic_plan_uses_its_indexes_too(
    big: Conn, case: str, name: str, params: dict[str, Any], intended: set[str]
) -> None:
    plan = _generic_plan(big, query(name), params)
    assert plan_problems(plan, intended) == [], plan


FENCED_CASES = [c for c in CASES if c[0] in FENCED]


@pytest.mark.parametrize(
    ("case", "name", "params", "intended"), FENCED_CASES, ids=[c[0] for c in FENCED_CASES]
)
@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_a_fenced_write_finds_its_rows_by_primary_key(
    big: Conn, case: str, name: str, params: dict[str, Any], intended: set[str], generic: bool
) -> None:
    """Not by walking a partial index of the running rows: whatever the statistics say about
    them, a run's heartbeat or completion reads its own jobs, not everyone's."""
    statement = query(name)
    plan = _generic_plan(big, statement, params) if generic else _explain(big, statement, params)
    completions = [
        n
        for n in plan_nodes(plan)
        if n.get("Node Type") == "ModifyTable" and n.get("Operation") in ("Update", "Delete")
    ]
    assert completions, plan
    scans = [
        n.get("Index Name", n["Node Type"])
        for update in completions
        for n in plan_nodes(update["Plans"])
        if n.get("Relation Name") == "active_jobs"
    ]
    assert scans and set(scans) <= {"jobs_pkey"}, scans


# job_complete_many as it was: the fence a join on `status = 'running'`.
BEFORE_COMPLETE = """UPDATE pgdrain.active_jobs AS j
SET status = 'done',
    completed_token = held.token,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    last_error = NULL,
    finished_at = now(),
    updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS held(id, token)
WHERE j.id = held.id
  AND j.status = 'running'
  AND j.attempt_token = held.token
RETURNING j.id, held.token"""


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_control_a_fence_joined_on_running_walks_the_running_rows(big: Conn, generic: bool) -> None:
    """The same completion written as a join: on statistics that saw nothing running, the
    planner reads the jobs through a partial index of running rows, all of them."""
    plan = (
        _generic_plan(big, BEFORE_COMPLETE, HELD)
        if generic
        else _explain(big, BEFORE_COMPLETE, HELD)
    )
    used = {
        n.get("Index Name") for n in plan_nodes(plan) if n.get("Relation Name") == "active_jobs"
    }
    assert used & set(RUNNING_ROWS.split("|")), used


@pytest.mark.parametrize(("case", "name", "params", "intended"), CASES, ids=IDS)
def test_control_without_its_index_the_check_fails(
    big: Conn, case: str, name: str, params: dict[str, Any], intended: set[str]
) -> None:
    """The same statement and data with one index gone: the check above must say so. (The
    primary key stays: it is the table's, not this issue's.)"""
    dropped = sorted(intended - {"jobs_pkey"})
    with big.transaction(force_rollback=True):
        for entry in dropped:
            for index in entry.split("|"):
                big.execute(sql.SQL("DROP INDEX pgdrain.{}").format(sql.Identifier(index)))
        row = big.execute("EXPLAIN (FORMAT JSON) " + query(name), params).fetchone()
    assert row is not None
    problems = plan_problems(row[0], intended)
    assert {f"does not use {entry}" for entry in dropped} <= set(problems), problems


# -- the statements these replaced: the reproduction, and the oracle for the answers -----------

BEFORE_HAS_READY = """SELECT EXISTS (
    SELECT 1 FROM pgdrain.jobs
    WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at <= now()
) AS ready"""

BEFORE_STATS = """SELECT queue,
       count(*) FILTER (WHERE status = 'queued')                      AS queued,
       count(*) FILTER (WHERE status = 'queued' AND run_at <= now())  AS ready,
       count(*) FILTER (WHERE status = 'queued' AND run_at > now())   AS delayed,
       count(*) FILTER (WHERE status = 'running')                     AS running,
       count(*) FILTER (WHERE status = 'done')                        AS done,
       count(*) FILTER (WHERE status = 'failed')                      AS failed,
       count(*) FILTER (WHERE status = 'parked')                      AS parked,
       count(*) FILTER (WHERE status = 'cancelled')                   AS cancelled,
       coalesce(extract(epoch FROM now() - min(run_at)
                FILTER (WHERE status = 'queued' AND run_at <= now())), 0)::float8
                                                                      AS oldest_ready_age_s,
       count(*) FILTER (WHERE status = 'running' AND lease_expires_at < now())
                                                                      AS expired_leases
FROM pgdrain.jobs
GROUP BY queue
ORDER BY queue"""

BEFORE_DEPTH = """SELECT count(*) AS ready,
       coalesce(extract(epoch FROM now() - min(run_at)), 0)::float8 AS oldest_ready_age_s
FROM pgdrain.jobs
WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at <= now()"""


def _without_ready_guard(statement: str) -> str:
    """The claim as it was before the empty-queue guard: the guard's lateral join removed."""
    guarded = re.compile(r"\n\s*CROSS JOIN LATERAL \(\n\s*SELECT 1 FROM .*?\) AS has_ready", re.S)
    stripped, count = guarded.subn("", statement)
    assert count == 1, "the claim's empty-queue guard is not where this test expects it"
    return stripped


@pytest.mark.parametrize(
    ("statement", "params"),
    # (The old ready check no longer does: it reads queued rows, and the history has left the
    # table that holds them.)
    [(BEFORE_STATS, {})],
    ids=["stats"],
)
def test_control_the_statements_before_read_every_finished_row(
    big: Conn, statement: str, params: dict[str, Any]
) -> None:
    """On this table the old texts scan pgdrain.jobs: the data is big enough for the checks
    above to mean something.

    The old texts' plans hang on ANALYZE's random sample of 30,000 rows (re-analysed on PG 15,
    2 of 15 samples planned the old ready check through an index), so the control plans them
    from statistics read off every row, in a rolled-back transaction: the same answer each run.
    The statements above do not depend on the sample (their checks hold after every ANALYZE)."""
    with big.transaction(force_rollback=True):
        big.execute("SET LOCAL default_statistics_target = 10000")  # a sample of 3,000,000 rows
        big.execute("ANALYZE pgdrain.active_jobs, pgdrain.finished_jobs")
        row = big.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
    assert row is not None
    assert "Seq Scan of pgdrain.jobs" in plan_problems(row[0], set())


def _ready_index_scans(plan: Any) -> list[int]:
    """How many times each scan of jobs_ready_idx from the start of a queue ran (EXPLAIN
    ANALYZE), which starts at the queue's floor; not the scan from a position, which has none
    here."""
    return [
        n["Actual Loops"]
        for n in plan_nodes(plan)
        if n.get("Index Name") == "jobs_ready_idx"
        and "after_priority" not in n.get("Index Cond", "")
    ]


def test_the_last_empty_claim_does_not_walk_the_delayed_jobs(big: Conn) -> None:
    """Nothing in the queue is ready: the guard answers from one probe, and the priority-
    ordered scan that would walk all 5,000 delayed rows never runs."""
    plan = _explain(big, query("job_complete_and_claim"), _claim_params([DELAYED_ONLY]), True)
    assert _ready_index_scans(plan) == [0]


def test_control_without_the_guard_the_empty_claim_walks_the_queue(big: Conn) -> None:
    statement = _without_ready_guard(query("job_complete_and_claim"))
    plan = _explain(big, statement, _claim_params([DELAYED_ONLY]), True)
    assert _ready_index_scans(plan) == [1]


POSITIONED = _claim_params(QUEUES, positions=dict.fromkeys(QUEUES, BEFORE_READY))


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_a_claim_from_positions_bounds_its_scan_by_them_in_the_index(
    big: Conn, generic: bool
) -> None:
    """The position is where the scan of jobs_ready_idx starts (an index condition), not a
    filter of what it reads: the entries before it are not read at all."""
    statement = query("job_complete_and_claim")
    plan = (
        _generic_plan(big, statement, POSITIONED)
        if generic
        else _explain(big, statement, POSITIONED)
    )
    conditions = [
        n.get("Index Cond", "") for n in plan_nodes(plan) if n.get("Index Name") == "jobs_ready_idx"
    ]
    assert any("ROW(priority, run_at, id) >" in c for c in conditions), conditions


def _two_claims(conn: Conn, queues: list[str] | None, positions: str) -> list[int]:
    """The ids two claims take, the second from the positions the first leaves ("kept"), from
    none ("none"), or from positions past every ready job ("past"); rolled back."""
    with conn.transaction(force_rollback=True):
        store.transaction_limits(conn, 60_000)
        first = store.job_complete_and_claim_statement([], queues, 10, "w", 30.0, None, None).run(
            conn
        )[1]
        after = {
            "kept": {j.queue: store.ClaimPosition(j.priority, j.run_at_us, j.id) for j in first},
            "none": {},
            "past": dict.fromkeys(QUEUES, store.ClaimPosition(0, PAST_EVERY_JOB, 0)),
        }[positions]
        second = store.job_complete_and_claim_statement(
            [], queues, 10, "w", 30.0, None, None, positions=after
        ).run(conn)[1]
    return [j.id for j in first + second]


@pytest.mark.parametrize("queues", [QUEUES, None], ids=["queues named", "every queue"])
@pytest.mark.parametrize("positions", ["kept", "past"], ids=["in the range", "range run out"])
def test_a_claim_from_positions_claims_what_a_claim_from_the_start_does(
    big: Conn, queues: list[str] | None, positions: str
) -> None:
    """Nothing sorts before the positions here (no job came in meanwhile): the claim from them
    takes the jobs a claim from the start takes, and one whose ranges hold nothing reads from
    the start in the same statement."""
    assert _two_claims(big, queues, positions) == _two_claims(big, queues, "none")


def _rows_read_from(plan: Any, index: str) -> int:
    """Index entries a plan read from `index` (EXPLAIN ANALYZE), every loop counted."""
    return sum(
        n["Actual Rows"] * n["Actual Loops"]
        for n in plan_nodes(plan)
        if n.get("Index Name") == index
    )


# run_exit's earliest delayed job as it was: a minimum over every queue at once.
BEFORE_NEXT_DUE = """(SELECT min(run_at) FROM pgdrain.jobs
             WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at > now())"""


@pytest.mark.parametrize("before", [False, True], ids=["per queue", "control: all at once"])
def test_the_exit_finds_the_next_due_job_in_one_probe_per_queue(big: Conn, before: bool) -> None:
    """5,000 delayed jobs and none ready: the exit reads one of them, not all."""
    statement = query("run_exit")
    if before:
        start = statement.index("(SELECT min(next.run_at)")
        end = statement.index(") AS next)", start) + len(") AS next)")
        statement = statement[:start] + BEFORE_NEXT_DUE + statement[end:]
    params = {"queues": [DELAYED_ONLY, "no-such-queue"], **EXIT}
    plan = _explain(big, statement, params, True)
    read = _rows_read_from(plan, "jobs_queued_run_at_idx")
    assert (read >= 5000) if before else (read <= 2), read


def test_the_checks_answer_as_the_statements_before_them(big: Conn) -> None:
    for queues in (QUEUES, [DELAYED_ONLY], [RUNNING_ONLY, "no-such-queue"], ["email"]):
        row = big.execute(BEFORE_HAS_READY, {"queues": queues}).fetchone()
        assert row is not None
        assert store.queue_has_ready(big, queues) is row[0], queues
        with big.transaction():  # one snapshot, one now(): both must agree exactly
            old = big.execute(BEFORE_DEPTH, {"queues": queues}).fetchone()
            new = store.queue_depth(big, queues)
        assert old is not None
        assert (new.ready, new.oldest_ready_age_s) == (old[0], old[1]), queues


ALL_QUEUES = [*QUEUES, DELAYED_ONLY, HISTORY_ONLY, RUNNING_ONLY]


def test_every_queue_answers_as_the_queues_named(big: Conn) -> None:
    """NULL for every queue reads what naming each queue of the table would."""
    with big.transaction():  # one snapshot, one now()
        assert store.queue_depth(big, None) == store.queue_depth(big, ALL_QUEUES)
        assert store.queue_ready_count(big, None, 10**6) == store.queue_ready_count(
            big, ALL_QUEUES, 10**6
        )
        assert store.queue_has_ready(big, None) is True
        elsewhere = store.queue_ready_elsewhere(big, ["default"], STATS_BOUND)
        row = big.execute(
            """SELECT queue, least(count(*), %(bound)s) FROM pgdrain.jobs
               WHERE status = 'queued' AND run_at <= now() AND queue <> 'default'
               GROUP BY queue ORDER BY queue""",
            {"bound": STATS_BOUND},
        ).fetchall()
    assert elsewhere == [(q, int(n)) for q, n in row]
    assert [q for q, _ in elsewhere] == ["email", "reports", "webhooks"]  # none delayed-only


def test_stats_answer_as_before_with_finished_counts_bounded(big: Conn) -> None:
    with big.transaction():  # one snapshot, one now()
        old = big.execute(BEFORE_STATS).fetchall()
        new = store.queue_stats(big)
    expected = [
        store.QueueStats(
            queue=r[0],
            queued=r[1],
            ready=r[2],
            delayed=r[3],
            running=r[4],
            done=min(r[5], STATS_BOUND),
            failed=min(r[6], STATS_BOUND),
            parked=min(r[7], STATS_BOUND),
            cancelled=min(r[8], STATS_BOUND),
            oldest_ready_age_s=r[9],
            expired_leases=r[10],
        )
        for r in old
    ]
    assert new == expected
    by_queue = {s.queue: s for s in new}
    # The bound is reached here (75,000 done per queue), and each kind of queue is listed.
    assert by_queue["default"].done == STATS_BOUND
    assert by_queue[HISTORY_ONLY].done == 1000
    assert (by_queue[RUNNING_ONLY].running, by_queue[RUNNING_ONLY].expired_leases) == (10, 10)
    assert (by_queue[DELAYED_ONLY].queued, by_queue[DELAYED_ONLY].ready) == (5000, 0)


# The operator's lists of one status, as job_list read them before job_list_finished: the table
# walked backwards by id until a page of that status turns up.
LIST_CASES = [
    {"status": "failed", "queue": None, "before": None},
    {"status": "failed", "queue": "default", "before": FINISHED // 2},
    {"status": "done", "queue": None, "before": None},
    {"status": "done", "queue": HISTORY_ONLY, "before": None},
    {"status": "failed", "queue": "email", "before": None},  # none: failures are in default
    {"status": "parked", "queue": None, "before": None},
]


@pytest.mark.parametrize("case", LIST_CASES, ids=lambda c: f"{c['status']}-{c['queue']}")
def test_a_list_of_one_status_answers_as_job_list_read_it(big: Conn, case: dict[str, Any]) -> None:
    old = big.execute(
        query("job_list"),
        {
            "statuses": [case["status"]],
            "limit": 51,
            "kind": None,
            "since": None,
            "values": True,
            **case,
        },
    ).fetchall()
    new = store.job_list(big, [case["status"]], 51, queue=case["queue"], before=case["before"])
    assert [r.id for r in new] == [r[0] for r in old]


def test_job_list_reads_no_other_queues_failures_now_that_the_history_is_partitioned(
    big: Conn,
) -> None:
    """job_list once walked the whole table by id for a status no job of the queue has
    (failures all in another queue): with the history partitioned by status, the failed jobs'
    own index by queue answers it, as job_list_finished's does. Neither reads a row it drops."""
    case = {"status": "failed", "queue": "email", "before": None, "limit": 51, "values": True}
    params = {"statuses": ["failed"], "kind": None, "since": None, **case}
    plan = _explain(big, query("job_list"), params, analyze=True)
    assert sum(n.get("Rows Removed by Filter", 0) for n in plan_nodes(plan)) < 100
    fast = _explain(big, query("job_list_finished"), case, analyze=True)
    assert sum(n.get("Rows Removed by Filter", 0) for n in plan_nodes(fast)) < 100
