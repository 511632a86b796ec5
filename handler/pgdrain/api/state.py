"""A job's state as the application reads it: status, output, progress, sequence and
dependencies (docs/jobs.md)."""

from __future__ import annotations

import operator
from typing import Any

from pgdrain.api.enqueue import check_connection
from pgdrain.db import store
from pgdrain.errors import BadInput

# A job's id is a bigint (pgdrain.jobs.id).
MAX_JOB_ID = 2**63 - 1


def job_state(conn: store.Connection, job_id: int) -> dict[str, Any] | None:
    """Every field of the job (as `pgdrain jobs show --json` prints it: JSON types, times as
    ISO text), its recorded `output` and `progress` included; None if there is no such job
    (or retention deleted it). A value Python cannot hold (written by plain SQL: nested deeper
    than 64 levels, an integer past 4300 digits) is its JSON text, and `undecoded` maps its
    field to why."""
    check_connection(conn, "job_state", "on another driver, open a psycopg 3 connection for it")
    # "1" would be sent as text and match nothing: a caller passing a request's string would
    # read "no such job" for a job that exists.
    try:  # an int, or an integer type of another library (numpy.int64): not "1", 1.0, True
        if isinstance(job_id, bool):
            raise TypeError
        job_id = operator.index(job_id)
    except TypeError:
        raise BadInput(f"job_id must be a whole number (got {type(job_id).__name__})") from None
    if not 1 <= job_id <= MAX_JOB_ID:
        return None  # no job has such an id
    return store.job_show(conn, job_id)
