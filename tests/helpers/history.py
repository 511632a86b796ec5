"""The day partitions of done jobs (pgdrain.finished_jobs, migration 0018), as the tests of
retention and purge set them up: a partition for a past UTC day, jobs finished within it, and
whether it is there."""

from __future__ import annotations

from collections.abc import Collection
from importlib import resources
from typing import Any

import psycopg

Conn = psycopg.Connection[Any]


def make_day_partition(conn: Conn, days_from_today: int) -> None:
    """The partition of that UTC day (negative: ago), as retention or migrate would have made
    it then. Needs the schema's owner."""
    conn.execute(
        "SELECT pgdrain.finished_jobs_partition_ensure(d, d)"
        " FROM (SELECT (now() AT TIME ZONE 'UTC')::date + %s::int AS d) AS day",
        (days_from_today,),
    )


def finish_within_day(conn: Conn, ids: Collection[int], days_from_today: int) -> None:
    """Finished jobs moved to noon of that UTC day: into its partition, if it has one."""
    conn.execute(
        "UPDATE pgdrain.jobs SET finished_at ="
        " ((now() AT TIME ZONE 'UTC')::date + %s::int)::timestamp AT TIME ZONE 'UTC'"
        " + interval '12 hours' WHERE id = ANY(%s)",
        (days_from_today, list(ids)),
    )


def day_partition_exists(conn: Conn, days_from_today: int) -> bool:
    row = conn.execute(
        "SELECT to_regclass('pgdrain.finished_jobs_'"
        " || to_char((now() AT TIME ZONE 'UTC')::date + %s::int, 'YYYYMMDD')) IS NOT NULL",
        (days_from_today,),
    ).fetchone()
    return row == (True,)


def view_write_of_0033() -> str:
    """pgdrain.jobs_view_write as migration 0033 made it, before 0044 made a job cancelled
    while running wait for that lease when queued again: the controls' trigger."""
    text = (
        resources.files("pgdrain.db")
        .joinpath("sql/migrations/0033_cancelled_leases_and_dashboard_writes.sql")
        .read_text()
    )
    start = text.index("CREATE OR REPLACE FUNCTION pgdrain.jobs_view_write()")
    return text[start : text.index("$$;", start) + 3]


def enqueued_as_0041(conn: Conn) -> None:
    """jobs_flow_enqueued and its trigger as migration 0041 left them: the controls."""
    text = (
        resources.files("pgdrain.db")
        .joinpath("sql/migrations/0041_retried_sequence_jobs_in_id_order.sql")
        .read_text(encoding="utf-8")
    )
    start = text.index("CREATE OR REPLACE FUNCTION pgdrain.jobs_flow_enqueued()")
    conn.execute(text[start : text.index("$$;", start) + 3].encode())
    conn.execute(
        "DROP TRIGGER jobs_flow_enqueued ON pgdrain.active_jobs;"
        " CREATE TRIGGER jobs_flow_enqueued BEFORE INSERT ON pgdrain.active_jobs FOR EACH ROW"
        " WHEN (NEW.sequence IS NOT NULL OR NEW.depends_on IS NOT NULL)"
        " EXECUTE FUNCTION pgdrain.jobs_flow_enqueued()"
    )
