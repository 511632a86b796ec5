"""enqueue_many streams: a big enqueue goes to the server in chunks (rows and bytes bounded),
all in one transaction, from an iterator that is consumed lazily."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

from helpers.cli import count_jobs
from pgdrain import enqueue
from pgdrain.api.enqueue import CHUNK_BYTES, CHUNK_ROWS, build_job, enqueue_many
from pgdrain.db import store
from pgdrain.errors import BadInput

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


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HAND_BUILT_BAD = {  # a NewJob made without build_job: enqueue_many checks it as build_job does
    "NaN payload": {"payload": {"x": float("nan")}},
    "NUL in the kind": {"kind": "send\x00email"},
    "NUL in the key": {"idempotency_key": "a\x00b"},
    "lone surrogate in the payload": {"payload": {"a": "\ud800"}},
    "payload nested 3,000 deep": {"payload": _nested(3000)},
}


@pytest.mark.parametrize("fields", HAND_BUILT_BAD.values(), ids=HAND_BUILT_BAD.keys())
def test_a_hand_built_job_is_refused_with_one_line_and_nothing_written(
    conn: Conn, fields: dict[str, Any]
) -> None:
    good = build_job("noop", {})
    bad = dataclasses.replace(good, **fields)
    with pytest.raises(BadInput) as refused:
        enqueue_many(conn, [good, bad])
    assert "\n" not in str(refused.value)
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)


def test_a_payload_over_the_limit_only_as_stored_is_bad_input(conn: Conn) -> None:
    """40,007 bytes of JSON text, which jsonb writes out in full: over 1 MiB in the table."""
    with pytest.raises(BadInput, match="over 1 MiB as stored"):
        enqueue(conn, "noop", {"v": [1e308] * 5000})
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)
