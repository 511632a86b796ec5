"""`pgdrain demo` outside the repository (no template.yaml: it drains with PGDRAIN_JOBS, as from
an installed wheel) with a jobs module it cannot use: one line, exit 2, and nothing written:
no migration, no job. The real command, in a process of its own, from an empty directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from helpers.cli import EXIT_BAD_INPUT, ROOT, Run, count_jobs, only_line, run_pgdrain

Conn = psycopg.Connection[Any]
NOT_FOUND = (
    "pgdrain: error: PGDRAIN_JOBS: module 'no_such_jobs' was not found on the Python path "
    "(which holds the current directory when run by the pgdrain command)"
)


def _demo(url: str, cwd: Path, jobs_module: str) -> Run:
    assert not (cwd / "template.yaml").exists()  # outside the repository
    run = run_pgdrain(
        "demo",
        "--count",
        "20",
        env={
            "DATABASE_URL": url,
            "PYTHONPATH": str(ROOT / "handler"),  # the pgdrain package; no jobs module is named
            "PGDRAIN_JOBS": jobs_module,
        },
        cwd=cwd,
    )
    assert "Traceback" not in run.err, run.err
    return run


def test_a_missing_jobs_module_fails_before_any_job_is_written(
    db_url: str, conn: Conn, tmp_path: Path
) -> None:
    run = _demo(db_url, tmp_path, "no_such_jobs")
    assert run.code == EXIT_BAD_INPUT, run
    assert only_line(run.err) == NOT_FOUND
    assert run.out == ""  # neither "migrate:" nor "enqueued"
    assert count_jobs(conn) == 0


def test_a_missing_jobs_module_migrates_nothing(empty_db_url: str, tmp_path: Path) -> None:
    run = _demo(empty_db_url, tmp_path, "no_such_jobs")
    assert (run.code, only_line(run.err)) == (EXIT_BAD_INPUT, NOT_FOUND)
    with psycopg.connect(empty_db_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgdrain'").fetchone()
    assert row == (0,)


def test_a_jobs_module_without_the_demo_kinds_writes_nothing(
    db_url: str, conn: Conn, tmp_path: Path
) -> None:
    (tmp_path / "few_jobs.py").write_text(
        "from pgdrain import Registry\n"
        "jobs = Registry()\n\n"
        "@jobs.job('noop')\n"
        "def noop(job):\n"
        "    pass\n"
    )
    run = _demo(db_url, tmp_path, "few_jobs")
    assert run.code == EXIT_BAD_INPUT, run
    assert only_line(run.err) == (
        "pgdrain: error: PGDRAIN_JOBS: module 'few_jobs' does not register 'fail', 'flaky', "
        "'greet': the demo enqueues the kinds fail, flaky, greet, noop (unset PGDRAIN_JOBS: the "
        "demo brings its own)"
    )
    assert run.out == ""
    assert count_jobs(conn) == 0
