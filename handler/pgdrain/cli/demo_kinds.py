"""The kinds `pgdrain demo` enqueues, for a demo with no function to invoke (an installed
pgdrain, outside its repository, PGDRAIN_JOBS unset): the same noop, greet, flaky and fail as
the repository's example jobs (handler/jobs.py), which the demo runs through the function
there."""

from __future__ import annotations

import os

import psycopg

from pgdrain.api.registry import Job, Registry

jobs = Registry()

# greet's visible result: a row per job, written once however many attempts it takes.
GREETINGS_TABLE = """
CREATE TABLE IF NOT EXISTS public.pgdrain_demo_greetings (
    job_id     bigint      PRIMARY KEY,
    greeting   text        NOT NULL,
    attempt    integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)"""
CREATE_LOCK = "SELECT pg_advisory_xact_lock(hashtext('pgdrain_demo_greetings'))"
INSERT_GREETING = """
INSERT INTO public.pgdrain_demo_greetings (job_id, greeting, attempt)
VALUES (%(job_id)s, %(greeting)s, %(attempt)s)
ON CONFLICT (job_id) DO NOTHING"""


@jobs.job("noop")
def noop(job: Job) -> None:
    """Does nothing."""


@jobs.job("fail")
def fail(job: Job) -> None:
    """Always raises: failed at its last attempt."""
    raise RuntimeError(str(job.payload.get("message", "this job always fails")))


@jobs.job("flaky")
def flaky(job: Job) -> None:
    """Fails its first payload["failures"] attempts, then succeeds."""
    if job.attempt <= int(job.payload.get("failures", 1)):
        raise RuntimeError(f"flaky failure on attempt {job.attempt}")


@jobs.job("greet")
def greet(job: Job) -> None:
    """Writes a row, idempotently (keyed by the job's id): a second attempt changes nothing."""
    name = str(job.payload.get("name", "world"))
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        with conn.transaction():  # two greets at once would race in CREATE TABLE IF NOT EXISTS
            conn.execute(CREATE_LOCK)
            conn.execute(GREETINGS_TABLE)
        conn.execute(
            INSERT_GREETING,
            {"job_id": job.id, "greeting": f"hello, {name}", "attempt": job.attempt},
        )
