"""A failing job through the Lambda handler (handler/app.py, the example jobs module): its
error history in the database and its traceback in the function's Powertools log line, with
the job's id, kind and attempt and the invocation's correlation id."""

from __future__ import annotations

from typing import Any

import psycopg
from integration.test_lambda_handler import (  # the handler as Lambda runs it
    SCHEDULED_EVENT,
    Function,
    function,
    logs,
)

from helpers.fixtures import job_row
from pgdrain import enqueue

Conn = psycopg.Connection[Any]
__all__ = ["function", "logs"]  # fixtures, used by name


def test_a_failing_job_is_logged_with_its_traceback_and_kept_in_its_history(
    function: Function, conn: Conn
) -> None:
    job_id = enqueue(conn, "fail", {"message": "card declined"})
    result = function.invoke(SCHEDULED_EVENT)
    assert result["ok"] is True and result["result"]["retried"] == 1, result

    [line] = [r for r in function.log_lines() if r["message"] == "job will be retried"]
    assert (line["job_id"], line["kind"], line["attempt"]) == (job_id, "fail", 1)
    assert line["error"] == "RuntimeError: card declined"
    assert "Traceback (most recent call last)" in line["traceback"]
    assert 'raise RuntimeError(str(job.payload.get("message"' in line["traceback"]
    assert line["correlation_id"] == SCHEDULED_EVENT["id"]

    [entry] = job_row(conn, job_id)["errors"]
    assert (entry["attempt"], entry["message"], entry["type"]) == (
        1,
        "card declined",
        "RuntimeError",
    )
    assert entry["traceback"] == line["traceback"]
