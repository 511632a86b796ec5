"""Statements that must say the same thing say it the same way."""

from pgdrain.db.sql import query


def _set_and_fence(statement: str) -> list[str]:
    """From `SET status = 'done'` up to RETURNING, comments left out: what a completion writes
    and which attempts it admits."""
    lines = [line.strip() for line in statement.splitlines()]
    start = lines.index("SET status = 'done',")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("RETURNING"))
    return [line for line in lines[start:end] if not line.startswith("--")]


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
