"""A job's state as the application reads it: status, output, progress, sequence and
dependencies (docs/jobs.md)."""

from __future__ import annotations

from typing import Any

from pgdrain.api.enqueue import check_connection
from pgdrain.db import store


def job_state(conn: store.Connection, job_id: int) -> dict[str, Any] | None:
    """Every field of the job (as `pgdrain jobs show --json` prints it: JSON types, times as
    ISO text), its recorded `output` and `progress` included; None if there is no such job
    (or retention deleted it). A value Python cannot hold (written by plain SQL: nested deeper
    than 64 levels, an integer past 4300 digits) is its JSON text, and `undecoded` maps its
    field to why."""
    check_connection(conn, "job_state", "on another driver, open a psycopg 3 connection for it")
    return store.job_show(conn, job_id)
