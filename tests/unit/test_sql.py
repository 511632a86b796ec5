"""The statement files (sql/*.sql) as a contract, checked without a database: they parse,
every write after the claim is fenced by attempt_token on a line of its own, every name the
code asks for exists, and no SQL in handler/ is built from strings at run time."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pgdrain.db.sql import migrations, parse_queries, queries_text, query, query_names

HANDLER = Path(__file__).resolve().parents[2] / "handler"
SOURCES = sorted(HANDLER.rglob("*.py"))

# The fence: the attempt token the writer holds must still be the row's. Alone on its line, so
# that tests can derive the unfenced control from the real statement by dropping that line.
# Where the plan must find the rows by primary key, the fence is the token of a running row,
# in a CASE (hot_path.sql, transaction_limits, says why).
FENCE_LINE = re.compile(
    r"^\s*AND (j\.attempt_token"
    r"|CASE WHEN j\.status = 'running' THEN j\.attempt_token END)"
    r" = ([\w.]+|%\(\w+\)[sb]|ANY\(%\(\w+\)[sb]::uuid\[\]\))\s*$"
)
# Given a list of held attempts, the fence spans four lines: a CASE that compares a short list
# in turn and hashes a long one (hot_path.sql, job_complete_and_claim, says why). Joined into
# one line by _fence_lines, it must be exactly this, the tokens and ids its own parameters.
LIST_FENCE = re.compile(
    r"AND CASE WHEN j\.status = 'running' THEN CASE"
    r" WHEN cardinality\((?P<t>%\(\w+\)b)::uuid\[\]\) < \d+"
    r" THEN j\.attempt_token = ANY\((?P=t)::uuid\[\]\)"
    r" ELSE \(j\.id, j\.attempt_token\) IN"
    r" \(SELECT \* FROM unnest\(%\(\w+\)b::bigint\[\], (?P=t)::uuid\[\]\)\)"
    r" END END"
)
# A write of a job: an UPDATE, or (a job that finishes leaves active_jobs) a DELETE.
JOB_UPDATE = re.compile(r"\b(UPDATE|DELETE FROM) pgdrain\.(active_)?jobs\b")
JOB_DELETE = re.compile(r"\bDELETE FROM pgdrain\.(active_)?jobs\b")


def _queries_text() -> str:
    return queries_text()


def _without_comments(statement: str) -> str:
    return "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))


def _update_segments(statement: str) -> list[str]:
    """Each `UPDATE pgdrain.jobs ...` (or active_jobs, or a DELETE of either) of a statement, up
    to the next (a CTE may hold several)."""
    body = _without_comments(statement)
    starts = [m.start() for m in JOB_UPDATE.finditer(body)]
    if not starts:
        return []
    return [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]


def _where(segment: str) -> str:
    """The WHERE clause of one UPDATE segment (up to RETURNING or the end of the CTE)."""
    match = re.search(r"\bWHERE\b(.*?)(\bRETURNING\b|\Z)", segment, re.DOTALL)
    assert match, f"an UPDATE of pgdrain.jobs without WHERE:\n{segment}"
    return match.group(1)


def _fence_lines(where: str) -> list[str]:
    """The WHERE clause's lines that are a fence: a one-line fence, or a list fence's lines
    joined into one."""
    lines: list[str] = []
    block: list[str] = []
    for line in where.splitlines():
        if block or line.strip().startswith("AND CASE WHEN j.status = 'running' THEN CASE"):
            block.append(line.strip())
            if line.strip().startswith("END END"):
                lines.append(" ".join(block))
                block = []
        else:
            lines.append(line)
    return [line for line in lines if FENCE_LINE.match(line) or LIST_FENCE.fullmatch(line)]


def _writes_a_leased_row(where: str) -> bool:
    """Rows held under a lease are `running` ones: a write that admits them must be fenced."""
    return "status = 'running'" in where


def _is_the_claim(statement: str, where: str) -> bool:
    """The claim writes rows its own SKIP LOCKED CTE picked from queued ones: no token exists
    before it (it makes one)."""
    return (
        "FROM ready" in where
        and "FOR UPDATE SKIP LOCKED" in statement
        and "status = 'queued'" in statement
    )


# Test the helpers on a statement that must fail, so the checks below cannot pass vacuously.
NAIVE_COMPLETE = """
UPDATE pgdrain.jobs AS j
SET status = 'done', attempt_token = NULL
WHERE j.id = %(id)s
  AND j.status = 'running'
RETURNING j.id
"""


def test_queries_sql_parses_into_named_statements() -> None:
    queries = parse_queries(_queries_text())
    assert queries, "no statement found"
    assert sorted(queries) == query_names()
    for name, statement in queries.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        assert _without_comments(statement).strip(), f"{name} is empty"
        assert ";" not in _without_comments(statement), f"{name} holds two statements"
        assert "%s" not in statement, f"{name}: positional parameter; name it %(x)s"
        assert not re.search(r"\{\w*\}", statement), f"{name}: a format placeholder"


def test_a_name_without_its_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a shape"):
        parse_queries("-- name: a\nSELECT 1;\n")
    with pytest.raises(ValueError, match="needs a shape"):
        parse_queries("-- name: a :some\nSELECT 1;\n")


def test_a_name_used_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a :one\nSELECT 1;\n-- name: a :one\nSELECT 2;\n")


def test_every_write_of_a_leased_job_is_fenced_on_its_own_line() -> None:
    fenced = set()
    for name in query_names():
        for segment in _update_segments(query(name)):
            where = _where(segment)
            if _writes_a_leased_row(where):
                lines = _fence_lines(where)
                assert len(lines) == 1, f"{name}: a write of running jobs without its fence line"
                fenced.add(name)
    # The fenced transitions (docs/architecture.md): heartbeat, complete, fail, release, reclaim.
    assert len(fenced) >= 5, fenced
    assert {"job_extend_leases", "job_fail", "job_release_many", "job_reclaim_expired"} <= fenced


def test_every_other_write_of_a_job_holds_no_lease() -> None:
    """An UPDATE of pgdrain.jobs that is not fenced must be the claim (queued rows: the token
    does not exist yet) or touch only rows that hold no lease (`failed`); a DELETE only
    finished rows."""
    for name in query_names():
        statement = query(name)
        for segment in _update_segments(statement):
            where = _where(segment)
            if _writes_a_leased_row(where):
                continue
            if JOB_DELETE.match(segment):
                # A DELETE that admits no running row: only finished rows go.
                assert "status IN ('done', 'failed', 'cancelled')" in where, name
                continue
            if name in REVOCATIONS:
                # It takes the lease away on purpose: the token goes, so the holder's own
                # fenced writes (heartbeat, completion, failure) match nothing from then on.
                assert "attempt_token = NULL" in segment, name
                continue
            no_lease = "status = 'failed'" in where or "status IN ('failed'" in where
            assert _is_the_claim(statement, where) or no_lease, (
                f"{name} writes jobs without a fence and without excluding running ones"
            )


# Operator actions that revoke a running job's lease instead of writing under it.
REVOCATIONS = {"job_cancel", "job_cancel_matching"}


def test_control_the_fence_check_catches_a_missing_fence() -> None:
    [segment] = _update_segments(NAIVE_COMPLETE)
    where = _where(segment)
    assert _writes_a_leased_row(where)
    assert not _fence_lines(where)


def test_the_fence_line_holds_nothing_else() -> None:
    assert FENCE_LINE.match("  AND j.attempt_token = held.token")
    assert FENCE_LINE.match("  AND j.attempt_token = %(token)s")
    by_key = "  AND CASE WHEN j.status = 'running' THEN j.attempt_token END"
    assert FENCE_LINE.match(by_key + " = ANY(%(tokens)s::uuid[])")
    assert FENCE_LINE.match(by_key + " = held.token")
    assert not FENCE_LINE.match(by_key + " = ANY(%(tokens)s::uuid[]) OR true")
    assert not FENCE_LINE.match("  AND j.attempt_token = held.token AND j.id = 1")
    assert not FENCE_LINE.match("    lease_expires_at = NULL, attempt_token = NULL,")


def test_the_list_fence_holds_nothing_else() -> None:
    fence = (
        "WHERE j.id = ANY(%(ids)b::bigint[])\n"
        "  AND CASE WHEN j.status = 'running' THEN CASE\n"
        "      WHEN cardinality(%(tokens)b::uuid[]) < 100"
        " THEN j.attempt_token = ANY(%(tokens)b::uuid[])\n"
        "      ELSE (j.id, j.attempt_token) IN"
        " (SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::uuid[]))\n"
        "  END END"
    )
    assert len(_fence_lines(fence)) == 1
    assert not _fence_lines(fence.replace("END END", "END OR true END"))
    assert not _fence_lines(fence.replace("ANY(%(tokens)b", "ANY(%(other)b"))
    assert not _fence_lines(
        fence.replace("unnest(%(ids)b::bigint[], %(tokens)b", "unnest(%(ids)b::bigint[], %(x)b")
    )


# No SQL built with f-strings, %, + or .format anywhere in handler/.

SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|CREATE|ALTER|DROP|TRUNCATE|WHERE|VALUES)\b"
)
EXECUTE_METHODS = {"execute", "executemany", "copy", "stream"}


def _literal_text(node: ast.AST) -> str:
    """The literal parts of a string expression (an f-string's constant pieces)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_literal_text(v) for v in node.values)
    return ""


def _built_at_run_time(node: ast.AST) -> bool:
    """A string made by formatting: an f-string with placeholders, `a + b`, `a % b`, or
    `"...".format(...)`."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant | ast.JoinedStr)
    )


def _sql_building(tree: ast.AST) -> list[tuple[int, str]]:
    problems = []
    for node in ast.walk(tree):
        # 1. Whatever is passed to execute() must not be made by formatting.
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in EXECUTE_METHODS
            and node.args
            and _built_at_run_time(node.args[0])
        ):
            problems.append((node.lineno, "execute() of a string built at run time"))
        # 2. No formatted string anywhere that reads like SQL.
        if isinstance(node, ast.expr) and _built_at_run_time(node):
            pieces = [_literal_text(node)]
            if isinstance(node, ast.BinOp):
                pieces += [_literal_text(node.left), _literal_text(node.right)]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                pieces.append(_literal_text(node.func.value))
            if any(SQL_WORDS.search(p) for p in pieces):
                problems.append((node.lineno, "SQL text built by formatting"))
    return problems


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(HANDLER)) for p in SOURCES])
def test_no_sql_is_built_from_strings(path: Path) -> None:
    problems = _sql_building(ast.parse(path.read_text(encoding="utf-8")))
    assert not problems, [f"{path.relative_to(HANDLER)}:{line}: {what}" for line, what in problems]


@pytest.mark.parametrize(
    "source",
    [
        "conn.execute(f\"SELECT * FROM pgdrain.jobs WHERE queue = '{q}'\")",
        'sql = "DELETE FROM pgdrain.jobs WHERE id = %s" % job_id',
        "conn.execute(\"UPDATE pgdrain.jobs SET status = 'done' WHERE id = \" + str(i))",
        'text = "SELECT {} FROM pgdrain.jobs".format(column)',
        "conn.execute(prefix + body)",
    ],
)
def test_control_the_scan_catches_sql_built_from_strings(source: str) -> None:
    assert _sql_building(ast.parse(source))


def test_control_the_scan_lets_named_statements_and_messages_pass() -> None:
    source = (
        'conn.execute(query("job_fail"), {"id": 1})\n'
        'print(f"enqueued job {job_id}")\n'
        'raise BadInput(f"delay must not be negative (got {delay})")\n'
    )
    assert _sql_building(ast.parse(source)) == []


def test_migrations_are_plain_files_in_order() -> None:
    found = migrations()
    assert [m.version for m in found] == sorted({m.version for m in found})
    assert all(m.sql.strip() for m in found)
