"""enqueue_many streams: a big enqueue goes to the server in chunks (rows and bytes bounded),
all in one transaction, from an iterator that is consumed lazily."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

from helpers.cli import count_jobs
from pgdrain.api.enqueue import CHUNK_BYTES, CHUNK_ROWS, build_job, enqueue_many
from pgdrain.db import store

Conn = psycopg.Connection[Any]


@pytest.fixture
def chunk_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows of each job_insert_many statement."""
    sizes: list[int] = []
    real = store.job_insert_many

    def spy(
        conn: Conn, jobs: Sequence[store.NewJob], payloads_json: Sequence[str] | None = None
    ) -> list[int]:
        sizes.append(len(jobs))
        return real(conn, jobs, payloads_json)

    monkeypatch.setattr(store, "job_insert_many", spy)
    return sizes


def test_rows_go_in_chunks_from_a_lazy_iterator(conn: Conn, chunk_sizes: list[int]) -> None:
    pulled = 0

    def jobs() -> Iterator[store.NewJob]:
        nonlocal pulled
        job = build_job("noop", {"n": 1})
        for _ in range(2 * CHUNK_ROWS + 7):
            pulled += 1
            # never more than one chunk ahead of what was sent
            assert pulled <= (len(chunk_sizes) + 1) * CHUNK_ROWS + 1
            yield job

    ids = enqueue_many(conn, jobs())
    assert chunk_sizes == [CHUNK_ROWS, CHUNK_ROWS, 7]
    assert len(ids) == len(set(ids)) == count_jobs(conn) == 2 * CHUNK_ROWS + 7


def test_big_payloads_make_smaller_chunks(conn: Conn, chunk_sizes: list[int]) -> None:
    job = build_job("noop", {"blob": "x" * 200_000})  # about 200 KB each
    enqueue_many(conn, itertools.repeat(job, 100))
    per_chunk = CHUNK_BYTES // 200_012
    assert chunk_sizes[0] == per_chunk and sum(chunk_sizes) == 100
    assert count_jobs(conn) == 100


def test_a_failing_chunk_rolls_back_the_chunks_before_it(
    conn: Conn, chunk_sizes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One transaction: the third chunk fails, the first two are not left behind."""
    spy = store.job_insert_many

    def fail_third(
        c: Conn, jobs: Sequence[store.NewJob], payloads_json: Sequence[str] | None = None
    ) -> list[int]:
        if len(chunk_sizes) == 2:
            raise RuntimeError("the server went away")
        return spy(c, jobs, payloads_json)

    monkeypatch.setattr(store, "job_insert_many", fail_third)
    with pytest.raises(RuntimeError):
        enqueue_many(conn, itertools.repeat(build_job("noop"), 3 * CHUNK_ROWS))
    assert chunk_sizes == [CHUNK_ROWS, CHUNK_ROWS]
    assert count_jobs(conn) == 0


def test_each_job_keeps_its_own_payload_across_chunks(conn: Conn) -> None:
    """Payloads are encoded once each, beside the jobs, and sent as text: every row gets its
    own job's payload, repeated objects and chunk boundaries included."""
    shared = {"user": "Zoë ✓", "tags": ["a", "b"]}
    payloads: list[object] = [None, shared, shared, [1, 2.5, None], "text", {"n": 0}]
    jobs = [build_job("noop", payloads[i % len(payloads)]) for i in range(CHUNK_ROWS + 5)]
    ids = enqueue_many(conn, jobs)
    rows = conn.execute(
        "SELECT id, payload FROM pgdrain.jobs WHERE id = ANY(%s) ORDER BY id", [ids]
    ).fetchall()
    expected = [
        {} if p is None else p for p in (payloads[i % len(payloads)] for i in range(len(jobs)))
    ]
    assert [r[0] for r in rows] == ids
    assert [r[1] for r in rows] == expected
