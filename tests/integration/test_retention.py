"""Retention (pgdrain.db.retention.run_once) on a real database: which rows go, that it works
in bounded batches and stops when its budget does, and that a table lock cannot hold it past
its budget (beside the control without the limits)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, wait_for
from helpers.history import day_partition_exists, finish_within_day, make_day_partition
from helpers.lock_waits import named_waits_on_a_lock, on_a_connection_of_its_own, waits_on_a_lock
from pgdrain import enqueue
from pgdrain.budget import Budget
from pgdrain.controls import Controls
from pgdrain.db import retention, sql, store
from pgdrain.db.store import control_plane

Conn = psycopg.Connection[Any]


def _job(conn: Conn, status: str, days_ago: float) -> int:
    """A job in `status` since `days_ago` days (a parked job has no finished_at)."""
    job_id = enqueue(conn, "noop")
    conn.execute(
        "UPDATE pgdrain.jobs SET status = %(status)s, attempts = 1,"
        " finished_at = CASE WHEN %(status)s = 'parked' THEN NULL"
        "                    ELSE now() - %(days)s * interval '1 day' END,"
        " updated_at = now() - %(days)s * interval '1 day'"
        " WHERE id = %(id)s",
        {"status": status, "days": days_ago, "id": job_id},
    )
    return job_id


def _ids(conn: Conn) -> set[int]:
    return {int(r[0]) for r in conn.execute("SELECT id FROM pgdrain.jobs")}


def _plenty() -> Budget:
    return Budget.seconds(3600)


def test_each_status_is_kept_for_its_own_age(conn: Conn) -> None:
    old_done, young_done = _job(conn, "done", 8), _job(conn, "done", 6)
    old_failed, young_failed = _job(conn, "failed", 31), _job(conn, "failed", 8)
    old_cancelled = _job(conn, "cancelled", 31)
    old_parked = _job(conn, "parked", 365)  # waits for a person: never deleted
    queued = enqueue(conn, "noop")

    result = retention.run_once(conn, retain_done_days=7, retain_failed_days=30, budget=_plenty())

    assert result == retention.RetentionResult(done=1, failed=2, complete=True)
    assert _ids(conn) == {young_done, young_failed, old_parked, queued}
    assert not {old_done, old_failed, old_cancelled} & _ids(conn)


def test_kick_rows_nothing_kicked_or_held_for_a_day_go(conn: Conn) -> None:
    """Every run of every queue renews every kick row: rows of queues no longer kicked (a
    tenant gone, names in an event sent by hand) would cost each run for good."""
    conn.execute(
        "INSERT INTO pgdrain.kicks (queue, kicked_at, requested_at, run_until) VALUES"
        " ('tenant_gone', now() - interval '3 days', now() - interval '3 days', NULL),"
        " ('named_by_hand', '-infinity', '-infinity', now() - interval '2 days'),"
        " ('kicked', now() - interval '1 hour', now() - interval '1 hour', NULL),"
        " ('requested', now() - interval '3 days', now() - interval '1 minute', NULL),"
        " ('held', '-infinity', '-infinity', now() + interval '1 minute')"
    )
    retention.run_once(conn, retain_done_days=7, retain_failed_days=30, budget=_plenty())
    left = {str(r[0]) for r in conn.execute("SELECT queue FROM pgdrain.kicks")}
    assert left == {"kicked", "requested", "held"}


def test_it_runs_again_safely(conn: Conn) -> None:
    _job(conn, "done", 8)
    first = retention.run_once(conn, retain_done_days=7, retain_failed_days=30, budget=_plenty())
    second = retention.run_once(conn, retain_done_days=7, retain_failed_days=30, budget=_plenty())
    assert (first.done, second.done, second.complete) == (1, 0, True)


class CountingClock:
    """A clock that moves one second each time the budget reads it: a deterministic stand-in
    for batches taking time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _batches_within(conn: Conn, budget_seconds: float) -> retention.RetentionResult:
    budget = Budget.seconds(budget_seconds, clock=CountingClock())
    return retention.run_once(
        conn,
        retain_done_days=7,
        retain_failed_days=30,
        budget=budget,
        batch=2,
        min_remaining=0.5,
    )


def test_batches_stop_when_the_budget_does(conn: Conn) -> None:
    """Ten old rows, batches of two, a budget whose clock reads 3, 2, 1, 0 seconds left before
    each batch (three batches above the 0.5 s floor): six go, the result says there is more,
    and the next run carries on."""
    for _ in range(10):
        _job(conn, "done", 8)
    result = _batches_within(conn, 4.0)
    assert result == retention.RetentionResult(done=6, failed=0, complete=False)
    assert len(_ids(conn)) == 4
    assert _batches_within(conn, 100.0) == retention.RetentionResult(4, 0, True)


def test_control_a_budget_already_spent_deletes_nothing(conn: Conn) -> None:
    for _ in range(10):
        _job(conn, "done", 8)
    result = _batches_within(conn, 0.0)
    assert result == retention.RetentionResult(done=0, failed=0, complete=False)
    assert len(_ids(conn)) == 10


RETENTION_APP = "pgdrain-retention-test"


def _retention_waiting_on_a_lock(conn: Conn) -> bool:
    return named_waits_on_a_lock(conn, RETENTION_APP)


@pytest.mark.parametrize("limited", [True, False], ids=["limited", "control: unlimited"])
def test_a_retention_run_blocked_on_a_table_lock_returns_within_its_budget_only_with_limits(
    db_url: str, conn: Conn, limited: bool
) -> None:
    """A table lock held by another transaction (a migration): with the limits, the run's
    DELETE gives up at the budget left less the final margin and the run returns, while the
    lock is still held, with nothing deleted and `stopped` saying why. The control (the
    server's limits: none) is still waiting once its budget is over, and finishes only when
    the lock is released."""
    old = {_job(conn, "done", 8) for _ in range(3)}
    budget_seconds = 2.0
    results: list[tuple[retention.RetentionResult, float]] = []
    with psycopg.connect(db_url, autocommit=True, application_name=RETENTION_APP) as own:
        defaults = own.execute(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
        ).fetchone()

        def run() -> None:
            started = time.monotonic()
            result = retention.run_once(
                own,
                retain_done_days=7,
                retain_failed_days=30,
                budget=Budget.seconds(budget_seconds),
                min_remaining=0.5,
                controls=Controls(limit_statements_to_budget=limited),
            )
            results.append((result, time.monotonic() - started))

        thread = threading.Thread(target=run, daemon=True)
        with psycopg.connect(db_url) as locker:
            locker.execute("LOCK TABLE pgdrain.jobs IN ACCESS EXCLUSIVE MODE")
            thread.start()
            if limited:
                thread.join(30)
                # It returned while the lock was still held: its DELETE gave up, not the lock.
                assert not thread.is_alive()
            else:
                wait_for(lambda: _retention_waiting_on_a_lock(conn), what="the DELETE to wait")
                thread.join(budget_seconds + 1)  # bounded: it cannot return while blocked
                assert thread.is_alive() and _retention_waiting_on_a_lock(conn), "still blocked"
            locker.rollback()
        thread.join(30)
        assert not thread.is_alive()
        [(result, elapsed)] = results
        if limited:
            assert elapsed < budget_seconds
            assert (result.done, result.failed, result.complete) == (0, 0, False)
            # Statement and lock limits are equal: whichever the server checks first ends it.
            assert result.stopped is not None and "timeout" in result.stopped
            # The limits were local to the batch's transaction: nothing outlives it.
            settings = own.execute(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
            ).fetchone()
            assert settings == defaults
            assert old <= _ids(conn)  # nothing deleted: the next run carries on
            again = retention.run_once(
                own, retain_done_days=7, retain_failed_days=30, budget=_plenty()
            )
            assert again == retention.RetentionResult(done=3, failed=0, complete=True)
        else:
            assert elapsed > budget_seconds  # past its budget: a Lambda would be killed
            # It deleted once the lock went, its budget long spent (its one batch took both
            # kinds, and came back short: nothing was left); the partitions' step waits for
            # the next run, the budget being spent.
            assert (result.done, result.failed, result.stopped) == (3, 0, None)
        assert not old & _ids(conn)


# -- purge's whole days ---------------------------------------------------------------------------


PURGE_APP = "pgdrain-purge-test"


@pytest.mark.parametrize("limited", [True, False], ids=["limited", "control: unlimited"])
def test_purge_of_whole_days_gives_way_to_a_reader_only_with_its_lock_limit(
    db_url: str, conn: Conn, limited: bool
) -> None:
    """A reader of the history holds its lock (a long dashboard query, a report): dropping a
    day's partition waits for it, and completions would queue behind that wait. With the limit
    the drop gives up after PARTITION_LOCK_MS, while the reader still reads: nothing dropped, 0
    jobs, and purge deletes them by rows. The control, without a limit, is still waiting past
    it, and drops the day only when the reader ends."""
    make_day_partition(conn, -10)
    old = {_job(conn, "done", 0) for _ in range(3)}
    finish_within_day(conn, old, -10)
    went: list[tuple[int, float]] = []
    with psycopg.connect(db_url, autocommit=True, application_name=PURGE_APP) as own:

        def purge() -> None:
            started = time.monotonic()
            jobs = retention.purge_whole_days(
                own, 7, controls=Controls(limit_statements_to_budget=limited)
            )
            went.append((jobs, time.monotonic() - started))

        thread = threading.Thread(target=purge, daemon=True)
        with psycopg.connect(db_url) as reader:
            reader.execute("SELECT count(*) FROM pgdrain.finished_jobs")  # its lock, held open
            thread.start()
            limit_s = retention.PARTITION_LOCK_MS / 1000
            if limited:
                thread.join(30)
                assert not thread.is_alive()  # it returned while the reader still held its lock
            else:
                wait_for(lambda: named_waits_on_a_lock(conn, PURGE_APP), what="the drop to wait")
                thread.join(limit_s + 1)  # bounded: it cannot return while blocked
                assert thread.is_alive() and named_waits_on_a_lock(conn, PURGE_APP), "still blocked"
            reader.rollback()
        thread.join(30)
    assert not thread.is_alive()
    [(jobs, elapsed)] = went
    if limited:
        assert (jobs, day_partition_exists(conn, -10)) == (0, True)
        assert elapsed < limit_s + 5
        assert old <= _ids(conn)  # left for purge's rows
    else:
        assert (jobs, day_partition_exists(conn, -10)) == (3, False)
        assert elapsed > limit_s
        assert not old & _ids(conn)


# A test's mock clock (a schema ahead of pg_catalog on the path): a week after the spring change
# to summer time in Berlin (2026-03-29).
AFTER_THE_CHANGE = """
CREATE SCHEMA clock;
CREATE FUNCTION clock.now() RETURNS timestamptz LANGUAGE sql STABLE
    AS $$ SELECT timestamptz '2026-04-02 12:00+00' $$;
"""


@pytest.mark.parametrize("hours", [True, False], ids=["24-hour-days", "control-calendar-days"])
@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin"])
def test_an_age_in_days_is_as_long_in_any_time_zone(
    conn: Conn, zone: str, hours: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's finding: `days * interval '1 day'` counted the session TimeZone's calendar
    days, so a week across the change to summer time was 6 days 23 hours, and a failed job kept
    7 days went an hour early. The control: the statement as it was."""
    if not hours:
        real = sql.query
        calendar = real("job_retention_batch").replace("interval '24 hours'", "interval '1 day'")
        monkeypatch.setattr(
            control_plane,
            "query",
            lambda name: calendar if name == "job_retention_batch" else real(name),
        )
    conn.execute(AFTER_THE_CHANGE)
    conn.execute(
        "INSERT INTO pgdrain.finished_jobs (id, queue, kind, payload, status, priority, run_at,"
        " attempts, max_attempts, recovery_policy, reclaim_count, created_at, updated_at,"
        " finished_at, errors) VALUES (1, 'q', 'k', '{}', 'failed', 0, now(), 1, 1, 'auto', 0,"
        " now(), now(), clock.now() - interval '6 days 23 hours 30 minutes', '[]')"
    )
    conn.execute(f"SET search_path = clock, pg_catalog, public; SET TimeZone = '{zone}'")
    batch = store.job_retention_batch(
        conn, done_days=7, failed_days=7, done_limit=0, failed_limit=100
    )
    early = not hours and zone != "UTC"
    assert batch.failed == (1 if early else 0)


@pytest.mark.parametrize(
    "statement_limited", [False, True], ids=["lock-waits-limited", "control-statement-limited"]
)
def test_a_day_partition_is_made_beside_a_large_default_partition(
    conn: Conn, statement_limited: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's finding: making a day's partition beside a default partition that holds
    rows scans them all (ATTACH checks none belongs to the new day), and the partition step's
    limit on lock waits cut that scan too. Past the limit no day was made again: every new day's
    done jobs went to the default partition, which grew. Now only lock waits are limited so; the
    statement has the budget. The limit is made 1 ms here, and the control limits the statement
    to it as before."""
    monkeypatch.setattr(retention, "PARTITION_LOCK_MS", 1)
    if statement_limited:
        real = store.finished_jobs_partition_limits
        monkeypatch.setattr(
            store,
            "finished_jobs_partition_limits",
            lambda c, lock_ms, _statement_ms: real(c, lock_ms, lock_ms),
        )
    conn.execute(
        "ALTER TABLE pgdrain.finished_jobs_done DETACH PARTITION pgdrain.finished_jobs_"
        + f"{_utc_day(conn, 2)}; DROP TABLE pgdrain.finished_jobs_{_utc_day(conn, 2)}"
    )
    conn.execute(
        "INSERT INTO pgdrain.finished_jobs_done_default (id, queue, kind, payload, status,"
        " priority, run_at, attempts, max_attempts, recovery_policy, reclaim_count, created_at,"
        " updated_at, finished_at, errors)"
        " SELECT g, 'default', 'k', '{}', 'done', 0, t, 1, 5, 'auto', 0, t, t, t, '[]'"
        " FROM generate_series(1, 100000) AS g,"
        " LATERAL (SELECT now() - interval '10 days' - g * interval '1 second' AS t) AS at"
    )
    result = retention.run_once(
        conn, retain_done_days=30, retain_failed_days=30, budget=Budget.seconds(30)
    )
    assert day_partition_exists(conn, 2) is not statement_limited
    assert result.complete is not statement_limited, result


def _utc_day(conn: Conn, days_from_today: int) -> str:
    row = conn.execute(
        "SELECT to_char((now() AT TIME ZONE 'UTC')::date + %s::int, 'YYYYMMDD')",
        (days_from_today,),
    ).fetchone()
    assert row is not None
    return str(row[0])


MIGRATION_0043 = (
    Path(sql.__file__).parent / "migrations" / "0043_partition_days_of_24_hours.sql"
).read_text(encoding="utf-8")


def _summer_time_since_yesterday(conn: Conn) -> str:
    """A POSIX TimeZone (standard time UTC+0) whose summer time began at 00:00 of yesterday
    (UTC), and ends 200 days on: its one change in a few days' window is that start."""
    row = conn.execute(
        "SELECT extract(doy FROM (now() AT TIME ZONE 'UTC')::date - 1)::int - 1"
    ).fetchone()
    assert row is not None
    start = int(row[0])  # the zero-based day of the year, 29 February counted
    return f"XST0XDT,{start}/0,{(start + 200) % 365}/0"


@pytest.mark.parametrize("hours", [True, False], ids=["24-hour-days", "control-calendar-days"])
def test_a_day_partition_is_kept_its_whole_age_across_a_change_to_summer_time(
    conn: Conn, hours: bool
) -> None:
    """A red team's finding: the drop counted `done_days * interval '1 day'` in the session's
    TimeZone, 23 hours for the day summer time begins, so a day went an hour before its last
    jobs reached the age. The day three days ago ended two days ago at 00:00 UTC; the age is
    30 minutes more than its end's: it stays. The control: 0043's function as 0018 had it."""
    if not hours:
        conn.execute(MIGRATION_0043.replace("interval '24 hours'", "interval '1 day'"))
    make_day_partition(conn, -3)
    row = conn.execute(
        "SELECT (extract(epoch FROM now() - ((now() AT TIME ZONE 'UTC')::date - 2)::timestamp"
        " AT TIME ZONE 'UTC') + 1800) / 86400"
    ).fetchone()
    assert row is not None
    conn.execute("SELECT set_config('TimeZone', %s, false)", (_summer_time_since_yesterday(conn),))
    conn.execute("SELECT pgdrain.finished_jobs_partition_drop(%s::float8)", (float(row[0]),))
    assert day_partition_exists(conn, -3) is hours


@pytest.mark.parametrize("caught", [True, False], ids=["day-skipped", "control-uncaught"])
def test_a_completion_into_the_default_partition_meanwhile_skips_only_its_day(
    db_url: str, conn: Conn, other: Conn, caught: bool
) -> None:
    """A red team's finding: today's partition missing, a completion not yet committed in the
    default partition passed the check before the ATTACH, which waited for it, then found its
    row and failed the whole call: `pgdrain migrate` exited 1, and no later day was made either.
    The control: the function without its handler of that failure."""
    if not caught:
        without = re.sub(
            r"EXCEPTION WHEN check_violation THEN.*?name;\n",
            "",
            MIGRATION_0043,
            count=1,
            flags=re.S,
        )
        assert without != MIGRATION_0043
        conn.execute(without)
    for day in (0, 1, 2):
        name = f"pgdrain.finished_jobs_{_utc_day(conn, day)}"
        conn.execute(f"ALTER TABLE pgdrain.finished_jobs_done DETACH PARTITION {name}")
        conn.execute(f"DROP TABLE {name}")
    pids: dict[str, int] = {}
    outcome: list[object] = []
    with other.transaction():  # a completion, not yet committed: into the default partition
        other.execute(
            "INSERT INTO pgdrain.jobs (kind, status, attempts, finished_at)"
            " VALUES ('k', 'done', 1, now())"
        )
        ensure = on_a_connection_of_its_own(
            db_url,
            "ensure",
            lambda c: outcome.append(_ensured_or_error(c)),
            pids,
        )
        wait_for(lambda: waits_on_a_lock(conn, pids.get("ensure", 0)), what="the ATTACH waits")
    ensure.join(10)
    if caught:
        assert outcome == [2]  # tomorrow's and the next day's
        assert [day_partition_exists(conn, d) for d in (0, 1, 2)] == [False, True, True]
    else:
        [error] = outcome
        assert isinstance(error, psycopg.errors.CheckViolation)
        assert [day_partition_exists(conn, d) for d in (0, 1, 2)] == [False, False, False]


def _ensured_or_error(conn: Conn) -> object:
    try:
        row = conn.execute(
            "SELECT pgdrain.finished_jobs_partition_ensure(d, d + 2)"
            " FROM (SELECT (now() AT TIME ZONE 'UTC')::date AS d) AS today"
        ).fetchone()
    except psycopg.Error as exc:
        return exc
    assert row is not None
    return row[0]


LEASE_KEPT = "AND NOT coalesce(cancelled_lease_expires_at > now(), false)"


@pytest.mark.parametrize("kept", [True, False], ids=["kept-while-its-lease-runs", "control-purged"])
def test_a_job_cancelled_while_running_is_not_purged_before_its_lease_ends(
    conn: Conn, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's finding: `pgdrain purge --older-than-days 0` deleted a job cancelled while
    it ran, whose row holds its queue's concurrency slot until the lease ends (migration 0040):
    the next run recounted the slot free and started a second job beside the cancelled one's
    code. The control: the statement without its condition on the lease."""
    if not kept:
        real = sql.query
        purge = real("job_purge_finished").replace(LEASE_KEPT, "")
        assert purge != real("job_purge_finished")
        monkeypatch.setattr(
            store.operator_commands,
            "query",
            lambda name: purge if name == "job_purge_finished" else real(name),
        )
    conn.execute("INSERT INTO pgdrain.queue_limits (queue, max_running) VALUES ('lim', 1)")
    job_id = enqueue(conn, "noop", queue="lim")
    [claimed] = claim_batch(conn, ["lim"], 1, "a-run", 300.0, None)
    assert claimed.id == job_id
    store.job_cancel(conn, [job_id])
    assert store.job_purge_finished(conn, 0.0) == (0 if kept else 1)
    row = conn.execute("SELECT pgdrain.queue_running('lim')").fetchone()
    assert row == ((1,) if kept else (0,))  # the control: the slot free beside the attempt


def test_retention_keeps_a_cancelled_jobs_row_until_its_lease_ends(conn: Conn) -> None:
    """The same condition in the scheduled retention's batch (PGDRAIN_RETAIN_FAILED=0)."""
    job_id = enqueue(conn, "noop")
    claim_batch(conn, ["default"], 1, "a-run", 300.0, None)
    store.job_cancel(conn, [job_id])
    batch = store.job_retention_batch(
        conn, done_days=0, failed_days=0, done_limit=100, failed_limit=100
    )
    assert batch.failed == 0 and job_id in _ids(conn)
    conn.execute(
        "UPDATE pgdrain.finished_jobs SET cancelled_lease_expires_at = now() - interval '1 s'"
    )
    batch = store.job_retention_batch(
        conn, done_days=0, failed_days=0, done_limit=100, failed_limit=100
    )
    assert batch.failed == 1 and job_id not in _ids(conn)
