"""Statements that must say the same thing say it the same way."""

import re

from pgdrain.db.sql import query


def _set_and_fence(statement: str) -> list[str]:
    """From the DELETE of the finished jobs from active_jobs to the condition of their INSERT
    into finished_jobs, comments and the CTEs' own lines left out: which attempts a completion
    admits and what it writes where."""
    lines = [line.strip() for line in statement.splitlines()]
    start = lines.index("DELETE FROM pgdrain.active_jobs AS j")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("WHERE %(keep_done)s"))
    return [
        line
        for line in lines[start : end + 1]
        if not line.startswith("--") and line not in ("), moved AS (", ")")
    ]


def test_the_drain_completes_jobs_exactly_as_complete_many_does() -> None:
    claim = [
        line.replace("%(done_", "%(") for line in _set_and_fence(query("job_complete_and_claim"))
    ]
    assert claim == _set_and_fence(query("job_complete_many"))


def _from_judged(statement: str) -> str:
    """A retry statement from its `judged` part on: how keys are kept and what is returned."""
    return statement[statement.index("), judged AS (") :]


def test_a_retry_by_filter_keeps_keys_exactly_as_a_retry_by_id() -> None:
    assert _from_judged(query("job_retry_matching")) == _from_judged(query("job_retry"))


def _judging(statement: str, end: str) -> str:
    """A retry by filter's candidates and how it judges them: up to the CTE after `judged`."""
    return statement[statement.index("WITH candidate AS (") : statement.index(end)]


def test_the_dashboards_preview_judges_jobs_exactly_as_the_retry_by_filter() -> None:
    preview = query("job_retry_matching_preview")
    retry = query("job_retry_matching")
    assert _judging(preview, "), counted AS (") == _judging(retry, "), retried AS (")
    assert "UPDATE" not in preview  # it changes nothing


EVERY_QUEUE = "ARRAY(SELECT f.queue FROM pgdrain.queue_floors AS f ORDER BY f.queue)"

# Every statement that takes NULL for "every queue" finds the queues the same way: the queues
# with a floor (migration 0026), never a walk of the queued rows' index; as that list (most),
# or reading the floors themselves (queue_depth).
EVERY_QUEUE_STATEMENTS = (
    "job_complete_and_claim",
    "queue_has_ready",
    "queue_depth",
    "queue_ready_count",
    "queue_ready_elsewhere",
    "run_exit",
)


def test_every_statement_of_every_queue_finds_the_queues_as_the_claim_does() -> None:
    for name in EVERY_QUEUE_STATEMENTS:
        text = " ".join(query(name).split())
        assert text.count(EVERY_QUEUE) == (name != "queue_depth"), name
        assert "FROM pgdrain.queue_floors AS f" in text, name
        assert "WITH RECURSIVE" not in text, name


def _select_list(statement: str) -> str:
    """The columns a list of jobs returns: from its SELECT of rows to its FROM."""
    start = statement.index("SELECT id, queue, kind, status")
    return statement[start : statement.index("FROM pgdrain.jobs", start)]


def test_a_list_of_finished_jobs_returns_what_any_list_does() -> None:
    assert _select_list(query("job_list_finished")) == _select_list(query("job_list"))


# `x IN (SELECT id FROM cte)` over a data-modifying CTE was planned as a subplan that rescanned
# the CTE for every row: a red team's 20,000 jobs cancelled by filter took 10 s (2.8 s joined).
RESCANNED = re.compile(r"\bIN \(SELECT [\w.]+ FROM (?:retried|cancelled)\b")


def test_what_a_retry_or_cancel_did_is_joined_not_rescanned() -> None:
    for name in ("job_retry", "job_retry_matching", "job_cancel", "job_cancel_matching"):
        assert not RESCANNED.search(query(name)), name
        assert "LEFT JOIN" in query(name), name


def test_control_the_rescanned_form_is_found() -> None:
    assert RESCANNED.search("SELECT t.id IN (SELECT c.id FROM cancelled AS c) FROM target AS t")
