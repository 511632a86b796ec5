"""Example job kinds: what your own jobs module looks like. Point PGDRAIN_JOBS at yours.
docs/jobs.md is the job author's guide.

A job function takes a pgdrain.Job. Returning means done; raising means retry with backoff
(or failed once max_attempts is reached); raising pgdrain.RetryIn, Snooze, Discard or Cancel
chooses another outcome. `async def` functions run on an event loop. Delivery is at least
once: a job may run again after a crash, so make its effects idempotent (see `greet`, keyed by
job id)."""

from __future__ import annotations

import asyncio
import os
import time

import psycopg

from pgdrain import Discard, Job, Registry

jobs = Registry()

# The example's own table. Your jobs write wherever your application keeps its data.
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
    """Does nothing: for throughput figures."""


@jobs.job("sleep")
def sleep(job: Job) -> None:
    """Works for payload["seconds"], in small steps, and stops early if the lease is lost
    (another attempt may own the job now) or the budget is about to run out."""
    seconds = float(job.payload.get("seconds", 1.0))
    finish = time.monotonic() + seconds
    while (left := finish - time.monotonic()) > 0:
        if job.lease_lost():
            raise RuntimeError("lease lost: stopping; another attempt owns this job")
        time.sleep(min(0.05, left))


@jobs.job("fail")
def fail(job: Job) -> None:
    """Always raises: retried with backoff, then failed at max_attempts."""
    raise RuntimeError(str(job.payload.get("message", "this job always fails")))


@jobs.job("flaky")
def flaky(job: Job) -> None:
    """Fails its first payload["failures"] attempts, then succeeds."""
    if job.attempt <= int(job.payload.get("failures", 1)):
        raise RuntimeError(f"flaky failure on attempt {job.attempt}")


@jobs.job("greet")
def greet(job: Job) -> None:
    """Writes a visible result, idempotently: a second attempt of the same job changes nothing."""
    name = str(job.payload.get("name", "world"))
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        # Two greet jobs running at once would race in CREATE TABLE IF NOT EXISTS (PostgreSQL
        # raises a unique violation for the loser): take turns while creating it.
        with conn.transaction():
            conn.execute(CREATE_LOCK)
            conn.execute(GREETINGS_TABLE)
        conn.execute(
            INSERT_GREETING,
            {"job_id": job.id, "greeting": f"hello, {name}", "attempt": job.attempt},
        )


@jobs.job("async_sleep", timeout=60)
async def async_sleep(job: Job) -> None:
    """An `async def` job: awaits payload["seconds"] on the worker thread's event loop, and is
    cancelled if it runs past its kind's 60 s timeout."""
    await asyncio.sleep(float(job.payload.get("seconds", 0.1)))


@jobs.job("resize", max_attempts=3, priority=5)
def resize(job: Job) -> None:
    """Per-kind defaults (`jobs.enqueue(conn, "resize", ...)` uses them) and an outcome chosen
    by raising: a payload that can never work is discarded at once, not retried."""
    width = job.payload.get("width")
    if not isinstance(width, int) or width <= 0:
        raise Discard(f"width must be a positive whole number, got {width!r}")
