"""Statements that must say the same thing say it the same way."""

from pgdrain.sql import query


def _set_clause(statement: str) -> list[str]:
    lines = [line.strip() for line in statement.splitlines()]
    start = lines.index("SET status = 'done',")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("FROM unnest"))
    return lines[start:end]


def test_the_drain_completes_jobs_exactly_as_complete_many_does() -> None:
    assert _set_clause(query("job_complete_and_claim")) == _set_clause(query("job_complete_many"))
